"""Trains LLMRouter routers on exported files and routes queries with them; run by the LLMRouter
venv's python (scripts/setup_llmrouter.sh), not by pytest (test_llmrouter_train.py runs it):

  "$PY" tests/llmrouter/llmrouter_train.py --train=train.jsonl --rows=rows.jsonl \
      --embeddings=emb.pt --llm_data=llms.json --queries=queries.json --workdir=DIR --out=routes.json

For each router (knnrouter, mlprouter, hybrid_llm) it writes a router YAML (data_path, hparam,
model_path) into --workdir, builds the router and its trainer with LLMRouter's own
`llmrouter.cli.router_train.load_router_and_trainer` (what `llmrouter train` runs), trains, and
routes each query of --queries with the router's `route_single`. LLMRouter embeds a query to route
with Longformer (`get_longformer_embedding`, weights from the network); the routers here were
trained on gp_jax's embeddings, so that function is replaced by a look-up of the query's exported
embedding (the query's embedding_id in --rows, its row in --embeddings). --out gets
{router: [model_name of each query]}.
"""
import argparse
import json
import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")   # no network fetch at import
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import yaml  # noqa: E402
from llmrouter.cli import router_train  # noqa: E402
from llmrouter.models.hybrid_llm import router as hybrid_module  # noqa: E402
from llmrouter.models.knnrouter import router as knn_module  # noqa: E402
from llmrouter.models.mlprouter import router as mlp_module  # noqa: E402

HPARAMS = {
    "knnrouter": dict(n_neighbors=3, metric="cosine"),
    "mlprouter": dict(hidden_layer_sizes=[32], activation="relu", lr=0.01, epochs=60,
                      batch_size=8, alpha=0.0001),
    "hybrid_llm": dict(hidden_layer_sizes=[16], max_iter=500, random_state=0),
}


def _lookup(rows_path: str, embeddings: torch.Tensor):
  """query text -> its exported embedding (a 1-D tensor), as get_longformer_embedding returns."""
  ids = {}
  with open(rows_path, encoding="utf-8") as f:
    for line in f:
      row = json.loads(line)
      ids[row["query"]] = int(row["embedding_id"])

  def embed(text: str) -> torch.Tensor:
    return embeddings[ids[text]]
  return embed


def _config(name: str, args) -> str:
  """The router's YAML, with absolute paths (LLMRouter joins relative ones to its package)."""
  model = os.path.join(args.workdir, f"{name}.pkl")
  cfg = dict(data_path=dict(routing_data_train=args.train, query_embedding_data=args.embeddings,
                            llm_data=args.llm_data),
             hparam=HPARAMS[name], model_path=dict(ini_model_path="", save_model_path=model,
                                                   load_model_path=model))
  if name == "hybrid_llm":
    cfg.update(router_mode="deterministic", router_threshold=0.5)
  path = os.path.join(args.workdir, f"{name}.yaml")
  with open(path, "w", encoding="utf-8") as f:
    yaml.safe_dump(cfg, f)
  return path


def main():
  parser = argparse.ArgumentParser()
  for flag in ("train", "rows", "embeddings", "llm_data", "queries", "workdir", "out"):
    parser.add_argument(f"--{flag}", required=True)
  args = parser.parse_args()
  embed = _lookup(args.rows, torch.load(args.embeddings))
  for module in (knn_module, mlp_module, hybrid_module):
    module.get_longformer_embedding = embed
  with open(args.queries, encoding="utf-8") as f:
    queries = json.load(f)
  routed = {}
  for name in HPARAMS:
    router, trainer = router_train.load_router_and_trainer(name, _config(name, args), "cpu")
    trainer.train()
    routed[name] = [router.route_single({"query": q})["model_name"] for q in queries]
  with open(args.out, "w", encoding="utf-8") as f:
    json.dump(routed, f)


if __name__ == "__main__":
  main()
