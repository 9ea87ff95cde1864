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
into the .pt. The rows come from `store.llmrouter_rows`.
"""
from __future__ import annotations

import io
from typing import Iterable, Sequence

import numpy as np

from gp_jax import errors
from gp_jax import files
from gp_jax.llm import catalog as catalog_lib
from gp_jax.runs.serving import store
from gp_jax.text import encoder as encoder_lib

FIELDS = store.LLMROUTER_FIELDS + ("embedding_id",)


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
