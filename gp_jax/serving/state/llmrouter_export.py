"""The files LLMRouter trains its routers on, made from a router server's route log.

LLMRouter (PyPI: llmrouter-lib) trains its embedding routers (KNN, SVM, MLP, hybrid, graph) from
the files a router YAML names under `data_path`:
  routing_data_train    JSONL routing rows, one per (query, LLM) call (`FIELDS`); a row's
                        `embedding_id` is the row of its query in the embeddings.
  query_embedding_data  a torch .pt tensor [N, d]; row i embeds the query of embedding_id i.
  llm_data              JSON {model_name: {size, feature, input_price, output_price, model}};
                        of the trainable routers only the hybrid one reads it (it routes between
                        the smallest and the largest LLM, by `size`).
Ids are dense, 0..N-1 in the order queries are first seen, and equal query texts share one id.
gp_jax never imports torch, so the embeddings are written as a float32 .npy matrix;
scripts/llmrouter_convert.py, run by the LLMRouter venv (scripts/setup_llmrouter.sh), turns it
into the .pt. `llmrouter_rows` turns a route log into LLMRouter's routing rows (one per call),
`write_rows` writes them.
"""
from __future__ import annotations

import io
import json
import pathlib
from typing import Iterable, Iterator, Sequence

import numpy as np

from gp_jax import errors
from gp_jax import files
from gp_jax.llm import catalog as catalog_lib
from gp_jax.text import encoder as encoder_lib

# LLMRouter's routing schema: one row per (query, LLM) call.
LLMROUTER_FIELDS = ("task_name", "query", "ground_truth", "metric", "model_name", "response",
                    "performance", "token_num")
FIELDS = LLMROUTER_FIELDS + ("embedding_id",)


def with_embedding_ids(rows: Iterable[dict]) -> tuple[list[dict], list[str]]:
  """Numbers the distinct query texts of `rows`.

  Returns:
    (rows, queries): each row with `embedding_id` added, and the query texts in id order
    (queries[i] is the text of embedding_id i).
  """
  ids: dict[str, int] = {}
  out = [dict(r, embedding_id=ids.setdefault(r["query"], len(ids))) for r in rows]
  return out, list(ids)


def embed(queries: Sequence[str], encoder: encoder_lib.TextEncoder) -> np.ndarray:
  """float32 [len(queries), encoder.dim]: row i is `encoder`'s embedding of queries[i]."""
  if not queries:
    return np.zeros((0, encoder.dim), np.float32)
  return np.asarray(encoder.encode(list(queries)), np.float32)


def write_embeddings(path, matrix: np.ndarray) -> None:
  """Writes the embeddings matrix as a float32 .npy file, atomically."""
  buf = io.BytesIO()
  np.save(buf, np.asarray(matrix, np.float32), allow_pickle=False)
  files.write_atomic(path, buf.getvalue(), "the query embeddings", parents=True)


def llm_data(catalog: catalog_lib.Catalog, names: Iterable[str], where: str) -> dict:
  """LLMRouter's LLM descriptions of the LLMs `names`, from `catalog` (read from `where`).

  Raises:
    DataError: a name is not in the catalog.
  """
  out = {}
  for name in dict.fromkeys(names):
    if name not in catalog.names:
      raise errors.DataError(f"LLM {name!r} of the route log is not in the catalog {where}; "
                             f"give the server's catalog with --llm_catalog")
    m = catalog[name]
    out[name] = dict(size=f"{m.size_b:g}B", feature=m.description, input_price=m.price_in,
                     output_price=m.price_out, model=m.api_model or m.name)
  return out


def write_rows(path, rows: Iterable[dict], fields: Sequence[str] = LLMROUTER_FIELDS) -> int:
  """Writes LLMRouter rows as JSONL (or CSV with columns `fields` when `path` ends in .csv),
  atomically; returns the number of rows."""
  rows = list(rows)
  path = pathlib.Path(path)
  if path.suffix == ".csv":
    import csv
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    text = buf.getvalue()
  else:
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
  files.write_atomic(path, text, "the exported routes", parents=True)
  return len(rows)


def llmrouter_rows(records: Iterable[dict], *, scored_only: bool = True) -> Iterator[dict]:
  """LLMRouter routing rows (LLMROUTER_FIELDS), one per LLM call of each served request.

  performance is the request's feedback score (the workflow's outcome, shared by its calls);
  ground_truth is empty (a served query has none) and metric is "feedback". Requests without
  feedback are skipped unless scored_only is False (then performance is None).
  """
  feedback: dict[str, float] = {}
  routes: list[dict] = []
  for rec in records:
    if rec["type"] == "feedback":
      feedback[rec["id"]] = float(rec["score"])
    else:
      routes.append(rec)
  for rec in routes:
    score = feedback.get(rec["id"], rec.get("feedback"))   # /v1/routes records carry it
    if score is None and scored_only:
      continue
    for call in rec["calls"]:
      yield dict(task_name=rec["task"], query=call["input_text"], ground_truth="",
                 metric="feedback", model_name=call["llm"], response=call["output_text"],
                 performance=score, token_num=int(call["input_tokens"] + call["output_tokens"]))
