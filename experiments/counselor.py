r"""Graph Counselor runner: generate a GRBench-format dataset, or run a method on a graph.

  # a generated dataset (graph.json + questions.jsonl with gold answers and plans)
  python experiments/counselor.py --mode=generate --out_dir=/tmp/kg \
      --config.generate.domain=academic --config.generate.size=tiny

  # Graph Counselor on real backbones served by OpenAI-compatible servers
  python experiments/counselor.py --graph=/tmp/kg/graph.json --questions=/tmp/kg/questions.jsonl \
      --config.endpoints_file=endpoints.json --config.model=qwen2.5-7b-instruct \
      --config.models=reflect=llama3-chatqa-1.5-70b --out=/tmp/kg/preds.jsonl

  # sanity check of the machinery with the oracle backend (follows the gold plans)
  python experiments/counselor.py --config=experiments/configs/counselor.py:oracle \
      --graph=/tmp/kg/graph.json --questions=/tmp/kg/questions.jsonl

Settings (method, backend, models, agent limits, generator): experiments/configs/counselor.py,
overridden with --config.<field>=...; the flags below name the files read and written.
"""
from absl import app
from absl import flags

from experiments import common
from gp_jax import errors

_CONFIG = common.define_config("experiments/configs/counselor.py", "Graph Counselor config.")
_MODE = flags.DEFINE_enum("mode", "run", ["run", "generate"], "Run a method, or write a dataset.")
_GRAPH = flags.DEFINE_string("graph", "", "run: GRBench graph.json.")
_QUESTIONS = flags.DEFINE_string("questions", "", "run: JSONL questions {qid, question, answer}.")
_OUT = flags.DEFINE_string("out", "", "run: predictions JSONL ('' = not written).")
_OUT_DIR = flags.DEFINE_string("out_dir", "", "generate: folder of graph.json, questions.jsonl.")


@common.user_errors_exit_2
def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  from gp_jax.runs import counselor  # after flag parsing: keeps --help fast
  if _MODE.value == "generate":
    if not _OUT_DIR.value:
      raise errors.ConfigError("--mode=generate needs --out_dir")
    counselor.generate_from_config(_CONFIG.value, _OUT_DIR.value)
    return 0
  if not _GRAPH.value or not _QUESTIONS.value:
    raise errors.ConfigError("--mode=run needs --graph and --questions")
  counselor.run_from_config(_CONFIG.value, graph_path=_GRAPH.value,
                            questions_path=_QUESTIONS.value, out_path=_OUT.value)
  return 0


if __name__ == "__main__":
  common.run(main)
