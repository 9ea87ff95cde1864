"""Retrieve's index: exact inner-product search over node embeddings, batched and jitted in JAX.

Every node's main text is embedded once (L2-normalised rows, so inner product = cosine); a query
batch is scored against the whole matrix in one jitted matmul + top-k. Query batches are padded to
power-of-two buckets so the search compiles once per bucket, not once per batch size.

Top-1 follows the paper (highest similarity). Among the k best candidates, a node whose normalised
text equals the normalised keyword wins: with any sensible encoder it is already the top-1, and it
keeps feature-hashing collisions (distinct texts with identical vectors) from swapping nodes.

Indexes are cached in memory, keyed by (graph fingerprint, encoder name), and optionally on disk as
.npy files in `cache_dir`.
"""
from __future__ import annotations

import functools
import pathlib
import re
import threading

import jax
import jax.numpy as jnp
import numpy as np

from gp_jax import errors
from gp_jax import files
from gp_jax.counselor.kg import graph_store
from gp_jax.text import encoder as encoder_lib
from gp_jax.util import buckets as buckets_lib

_WORDS = re.compile(r"[a-z0-9]+")
MAX_QUERY_BUCKET = 256  # larger query batches are searched in chunks of this size
QUERY_BUCKETS = buckets_lib.powers_of_two(MAX_QUERY_BUCKET)   # padded query batch sizes
MEMO_SIZE = 65536       # keywords whose top-1 node is remembered per index


def normalize_text(text: str) -> str:
  """Lower-cased alphanumeric words joined by single spaces (the exact-match key)."""
  return " ".join(_WORDS.findall(text.lower()))


@functools.partial(jax.jit, static_argnames=("k",))
def top_k_inner_product(matrix_t: jax.Array, queries: jax.Array, k: int):
  """Exact top-k by inner product.

  Args:
    matrix_t: float32 [dim, n] node embeddings, transposed: a query's scores then stream through
      the matrix row by row, which is what bounds a single-query search on CPU (memory traffic).
    queries: float32 [b, dim] query embeddings.
    k: candidates per query (k <= n).

  Returns:
    (scores float32 [b, k], indices int32 [b, k]), best first; ties go to the lower index.
  """
  scores = jnp.matmul(queries, matrix_t, precision=jax.lax.Precision.HIGHEST)
  return jax.lax.top_k(scores, k)


class NodeIndex:
  """Embeddings of every node's main text, with batched top-1 search."""

  def __init__(self, graph: graph_store.KnowledgeGraph, embeddings: np.ndarray,
               encoder: encoder_lib.TextEncoder, *, k: int = 8):
    """Builds the index from precomputed embeddings.

    Args:
      graph: the graph whose nodes (in position order) the rows embed.
      embeddings: float32 [len(graph), encoder.dim], L2-normalised rows.
      encoder: embeds the query keywords (the same encoder as the rows).
      k: candidates checked for an exact text match before falling back to the top-1.
    """
    if embeddings.shape != (len(graph), encoder.dim):
      raise errors.ConfigError(f"index embeddings have shape {embeddings.shape}, expected "
                               f"({len(graph)}, {encoder.dim})")
    self.graph = graph
    self.encoder = encoder
    self.k = max(1, min(k, len(graph)))
    self.matrix_t = jnp.asarray(np.ascontiguousarray(embeddings.T), jnp.float32)  # [dim, n]
    self._norm_texts = [normalize_text(t) for t in graph.texts()]
    self._memo: dict[str, str] = {}

  @property
  def embeddings(self) -> np.ndarray:
    """float32 [n, dim] node embeddings (a host copy)."""
    return np.asarray(self.matrix_t).T

  def search_vectors(self, queries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Top-k over the matrix for already-embedded queries.

    Args:
      queries: float32 [b, dim].

    Returns:
      (scores float32 [b, k], positions int64 [b, k]).
    """
    b = queries.shape[0]
    scores = np.zeros((b, self.k), np.float32)
    idx = np.zeros((b, self.k), np.int64)
    for lo in range(0, b, MAX_QUERY_BUCKET):
      chunk = queries[lo:lo + MAX_QUERY_BUCKET]
      padded = np.zeros((buckets_lib.bucket(len(chunk), QUERY_BUCKETS), chunk.shape[1]),
                        np.float32)
      padded[:len(chunk)] = chunk
      s, i = top_k_inner_product(self.matrix_t, jnp.asarray(padded), self.k)
      scores[lo:lo + len(chunk)] = np.asarray(s)[:len(chunk)]
      idx[lo:lo + len(chunk)] = np.asarray(i)[:len(chunk)]
    return scores, idx

  def clear_memo(self) -> None:
    self._memo.clear()

  def search(self, keywords: list[str], *, memo: bool = True) -> list[str]:
    """Top-1 node id per keyword (exact text match among the top-k preferred).

    Results are memoised per keyword (memo=False bypasses the memo): agents repeat the same
    Retrieve inside nested calls from step to step, and each search streams the whole matrix.
    """
    known = self._memo if memo else {}
    todo = list(dict.fromkeys(kw for kw in keywords if kw not in known))
    fresh: dict[str, str] = {}
    if todo:
      vecs = np.asarray(self.encoder.encode(todo), np.float32)
      _, idx = self.search_vectors(vecs)
      for kw, cand in zip(todo, idx):
        key = normalize_text(kw)
        pick = next((int(c) for c in cand if self._norm_texts[c] == key), int(cand[0]))
        fresh[kw] = self.graph.ids[pick]
    out = [fresh[kw] if kw in fresh else known[kw] for kw in keywords]
    if memo:
      for kw, nid in fresh.items():
        if len(self._memo) >= MEMO_SIZE:
          self._memo.pop(next(iter(self._memo)))  # oldest first
        self._memo[kw] = nid
    return out


_CACHE: dict[tuple[str, str], NodeIndex] = {}
_CACHE_LOCK = threading.Lock()


def _node_encoder(encoder: encoder_lib.TextEncoder) -> encoder_lib.TextEncoder:
  # Node texts are embedded once per index (and cached with it); keeping them out of the query
  # encoder's memo table avoids holding a second copy of the matrix.
  return getattr(encoder, "inner", encoder)


def build_index(graph: graph_store.KnowledgeGraph, encoder: encoder_lib.TextEncoder, *,
                cache_dir: str | pathlib.Path | None = None, batch_size: int = 4096,
                k: int = 8) -> NodeIndex:
  """The NodeIndex of `graph` under `encoder`, from the cache when built before.

  Args:
    graph: the knowledge graph.
    encoder: text encoder for node texts and query keywords.
    cache_dir: where to keep node-embedding .npy files across processes (None: memory only).
    batch_size: node texts embedded per encoder call.
    k: exact-match candidates (see NodeIndex).
  """
  key = (graph.fingerprint, encoder.name)
  with _CACHE_LOCK:
    hit = _CACHE.get(key)
  # Same fingerprint = same ids in the same order with the same texts; same encoder name = same
  # vectors. So a hit serves any graph object loaded from the same data.
  if hit is not None and hit.k == max(1, min(k, len(graph))):
    return hit
  emb = None
  path = None
  if cache_dir is not None:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", encoder.name)
    path = pathlib.Path(cache_dir) / f"node-index-{graph.fingerprint[:20]}-{safe}.npy"
    if path.exists():
      loaded = np.load(path)
      if loaded.shape == (len(graph), encoder.dim):
        emb = loaded
  if emb is None and hit is not None:
    emb = hit.embeddings
  if emb is None:
    texts = graph.texts()
    enc = _node_encoder(encoder)
    emb = np.zeros((len(texts), encoder.dim), np.float32)
    for lo in range(0, len(texts), batch_size):
      emb[lo:lo + batch_size] = enc.encode(texts[lo:lo + batch_size])
    if path is not None:
      with files.atomic_file(path, "the node embeddings", parents=True) as f:
        np.save(f, emb)
  index = NodeIndex(graph, emb, encoder, k=k)
  with _CACHE_LOCK:
    _CACHE[key] = index
  return index


def clear_cache() -> None:
  with _CACHE_LOCK:
    _CACHE.clear()
