"""Graph Counselor runner: generate a GRBench-format dataset, or run a method on a graph.

  # a generated dataset (graph.json + questions.jsonl with gold answers and plans)
  python experiments/counselor.py --mode=generate --domain=academic --size=tiny --out_dir=/tmp/kg

  # Graph Counselor on real backbones served by OpenAI-compatible servers
  python experiments/counselor.py --graph=/tmp/kg/graph.json --questions=/tmp/kg/questions.jsonl \
      --method=counselor --pool=endpoints --endpoints_file=endpoints.json \
      --model=qwen2.5-7b-instruct --models=reflect=llama3-chatqa-1.5-70b --out=/tmp/kg/preds.jsonl

  # sanity check of the machinery with the oracle backend (follows the gold plans)
  python experiments/counselor.py --graph=/tmp/kg/graph.json --questions=/tmp/kg/questions.jsonl \
      --pool=oracle
"""
import sys

from absl import app
from absl import flags
from absl import logging

from experiments import common
from gp_jax import errors

_MODE = flags.DEFINE_enum("mode", "run", ["run", "generate"], "Run a method, or write a dataset.")
# run
_GRAPH = flags.DEFINE_string("graph", "", "GRBench graph.json.")
_QUESTIONS = flags.DEFINE_string("questions", "", "JSONL questions {qid, question, answer}.")
_METHOD = flags.DEFINE_string(
    "method", "counselor",
    "counselor | graph_cot | llm_only | text_rag | graphrag_1hop | graphrag_2hop.")
_POOL = flags.DEFINE_string("pool", "endpoints",
                            "endpoints (OpenAI-compatible servers) | oracle (follows gold plans).")
_ENDPOINTS = flags.DEFINE_string("endpoints_file", "", "Endpoints file for --pool=endpoints.")
_CATALOG = flags.DEFINE_string("catalog", "", "LLM catalog JSON (default data/llm_pool.json).")
_MODEL = flags.DEFINE_string("model", "", "Model for every agent kind (default: first in catalog).")
_MODELS = flags.DEFINE_string("models", "",
                              "Per agent kind: plan=...,thought=...,action=...,judge=...,"
                              "reflect=...,answer=...")
_JUDGE_MODEL = flags.DEFINE_string("judge_model", "", "Model of the LLM-judge metric.")
_LLM_JUDGE = flags.DEFINE_bool("llm_judge", True, "Compute the LLM-judge metric.")
_ENCODER = flags.DEFINE_string("encoder", "hashing", "Text encoder for Retrieve (hashing, minilm).")
_ENCODER_CACHE = flags.DEFINE_string("encoder_cache", "", "SQLite cache of query embeddings.")
_INDEX_CACHE = flags.DEFINE_string("index_cache_dir", "", "Folder caching node embeddings.")
_TEXT_KEYS = flags.DEFINE_string("text_keys", "", "Main text feature per type: paper=title,...")
_DROP_DANGLING = flags.DEFINE_bool("drop_dangling", False,
                                   "Drop neighbour ids that name no node instead of failing.")
_LIMIT = flags.DEFINE_integer("limit", 0, "Only the first N questions (0 = all).")
_CONCURRENCY = flags.DEFINE_integer("concurrency", 8, "Questions in flight at once.")
_MAX_STEPS = flags.DEFINE_integer("max_steps", 10, "Steps per trial.")
_MAX_REFLECT = flags.DEFINE_integer("max_reflect", 2, "Reflections (trials = max_reflect + 1).")
_TOKEN_BUDGET = flags.DEFINE_integer("prompt_token_budget", 6000, "Largest agent prompt (tokens).")
_CONTEXT_BUDGET = flags.DEFINE_integer("context_token_budget", 2000, "GraphRAG context (tokens).")
_OUT = flags.DEFINE_string("out", "", "Predictions JSONL.")
# generate
_DOMAIN = flags.DEFINE_string("domain", "academic", "academic | ecommerce | biomedical.")
_SIZE = flags.DEFINE_string("size", "tiny", "tiny | small | 10k | 100k | a node count.")
_SEED = flags.DEFINE_integer("seed", 0, "Generator seed.")
_PER_TEMPLATE = flags.DEFINE_integer("per_template", 5, "Questions per template.")
_OUT_DIR = flags.DEFINE_string("out_dir", "", "Folder for graph.json and questions.jsonl.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.WARNING)  # keeps library info lines out of the score table
  from gp_jax.runs import counselor as experiment  # after flag parsing: keeps --help fast
  try:
    if _MODE.value == "generate":
      if not _OUT_DIR.value:
        raise errors.ConfigError("--mode=generate needs --out_dir")
      experiment.generate(domain=_DOMAIN.value, size=_SIZE.value, seed=_SEED.value,
                          per_template=_PER_TEMPLATE.value, out_dir=_OUT_DIR.value)
      return 0
    if not _GRAPH.value or not _QUESTIONS.value:
      raise errors.ConfigError("--mode=run needs --graph and --questions")
    experiment.run_experiment(
        graph_path=_GRAPH.value, questions_path=_QUESTIONS.value, method=_METHOD.value,
        pool=_POOL.value, endpoints_file=_ENDPOINTS.value, catalog_path=_CATALOG.value,
        model=_MODEL.value, models=_MODELS.value, judge_model=_JUDGE_MODEL.value,
        llm_judge=_LLM_JUDGE.value, encoder=_ENCODER.value, encoder_cache=_ENCODER_CACHE.value,
        index_cache_dir=_INDEX_CACHE.value, text_keys=_TEXT_KEYS.value,
        on_dangling="drop" if _DROP_DANGLING.value else "error", limit=_LIMIT.value,
        concurrency=_CONCURRENCY.value, out_path=_OUT.value,
        settings={"max_steps": _MAX_STEPS.value, "max_reflect": _MAX_REFLECT.value,
                  "prompt_token_budget": _TOKEN_BUDGET.value,
                  "context_token_budget": _CONTEXT_BUDGET.value})
  except errors.GpJaxError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  common.run(main)
