"""Retrieve's index: exact inner-product top-k against a numpy reference, exact-text preference,
bucketed jit compilation, and the index cache."""
import numpy as np
import pytest

from gp_jax.counselor.kg import graph_store
from gp_jax.counselor.kg import retrieval
from gp_jax.text import encoder as encoder_lib


def _graph(texts):
  return graph_store.from_json_dict(
      {"doc_nodes": {f"d{i}": {"features": {"name": t}, "neighbors": {}} for i, t in enumerate(texts)}})


class CountingEncoder(encoder_lib.TextEncoder):
  def __init__(self, inner):
    self.inner_enc = inner
    self.name = "counting-" + inner.name
    self.dim = inner.dim
    self.texts = 0

  def encode(self, texts):
    self.texts += len(texts)
    return self.inner_enc.encode(texts)


def test_top_k_matches_numpy_reference():
  rng = np.random.default_rng(0)
  m = rng.standard_normal((300, 16)).astype(np.float32)
  q = rng.standard_normal((5, 16)).astype(np.float32)
  scores, idx = retrieval.top_k_inner_product(m.T, q, 4)
  ref = q @ m.T
  ref_idx = np.argsort(-ref, axis=1, kind="stable")[:, :4]
  np.testing.assert_array_equal(np.asarray(idx), ref_idx)
  np.testing.assert_allclose(np.asarray(scores), np.take_along_axis(ref, ref_idx, 1), rtol=1e-5)


def test_ties_go_to_the_lower_index():
  m = np.ones((6, 4), np.float32) / 2
  _, idx = retrieval.top_k_inner_product(m.T, m[:1], 3)
  assert np.asarray(idx).tolist() == [[0, 1, 2]]


def test_search_returns_best_node_and_batches_any_size():
  texts = ["graph neural networks", "protein folding", "deep reinforcement learning",
           "knowledge graph question answering", "image segmentation"]
  index = retrieval.NodeIndex(_graph(texts), encoder_lib.HashingEncoder(dim=64).encode(texts),
                              encoder_lib.HashingEncoder(dim=64), k=3)
  assert index.search(["protein folding"]) == ["d1"]
  assert index.search(["question answering over a knowledge graph"]) == ["d3"]
  many = [texts[i % 5] for i in range(300)]  # > MAX_QUERY_BUCKET: searched in chunks
  assert index.search(many) == [f"d{i % 5}" for i in range(300)]
  assert index.search([]) == []


def test_search_memo():
  texts = ["red apple", "green pear", "blue plum"]
  enc = CountingEncoder(encoder_lib.HashingEncoder(dim=64))
  index = retrieval.NodeIndex(_graph(texts), enc.encode(texts), enc, k=2)
  enc.texts = 0
  assert index.search(["green pear", "red apple", "green pear"]) == ["d1", "d0", "d1"]
  assert enc.texts == 2  # duplicates in one batch are searched once
  assert index.search(["red apple", "blue plum"]) == ["d0", "d2"] and enc.texts == 3
  assert index.search(["red apple"], memo=False) == ["d0"] and enc.texts == 4
  index.clear_memo()
  assert index.search(["red apple"]) == ["d0"] and enc.texts == 5


def test_exact_text_wins_among_candidates():
  # Two texts with the same embedding (a deliberate collision): the exact text must win.
  texts = ["alpha beta", "Alpha, Beta!", "gamma"]
  enc = encoder_lib.HashingEncoder(dim=32)
  emb = enc.encode(texts)
  emb[0] = emb[1]  # d0 and d1 now tie; d0 has the lower index
  index = retrieval.NodeIndex(_graph(texts), emb, enc, k=2)
  assert index.search(["alpha beta"]) == ["d0"]
  emb2 = emb.copy()
  emb2[[0, 1]] = emb2[[1, 0]]
  index2 = retrieval.NodeIndex(_graph(["Alpha, Beta!", "alpha beta", "gamma"]), emb2, enc, k=2)
  assert index2.search(["alpha beta!!"]) == ["d0"]  # normalised texts are equal: first wins


def test_query_batches_compile_once_per_bucket():
  texts = [f"node number {i}" for i in range(50)]
  enc = encoder_lib.HashingEncoder(dim=48)
  index = retrieval.NodeIndex(_graph(texts), enc.encode(texts), enc, k=4)
  index.search(texts[:5], memo=False)  # bucket 8
  before = retrieval.top_k_inner_product._cache_size()
  for b in (5, 6, 7, 8):
    index.search(texts[:b], memo=False)
  assert retrieval.top_k_inner_product._cache_size() == before
  index.search(texts[:9], memo=False)  # bucket 16: one more compilation
  assert retrieval.top_k_inner_product._cache_size() == before + 1


def test_index_is_cached_in_memory_and_on_disk(tmp_path):
  retrieval.clear_cache()
  texts = [f"cached text {i}" for i in range(20)]
  enc = CountingEncoder(encoder_lib.HashingEncoder(dim=32))
  g = _graph(texts)
  a = retrieval.build_index(g, enc, cache_dir=tmp_path)
  assert enc.texts == 20
  b = retrieval.build_index(_graph(texts), enc, cache_dir=tmp_path)  # same data, new object
  assert b is a and enc.texts == 20
  assert len(list(tmp_path.glob("node-index-*.npy"))) == 1
  retrieval.clear_cache()
  c = retrieval.build_index(g, enc, cache_dir=tmp_path)  # from disk, no re-encoding
  assert c is not a and enc.texts == 20
  np.testing.assert_array_equal(c.embeddings, a.embeddings)
  other = retrieval.build_index(_graph(texts[:-1] + ["changed"]), enc, cache_dir=tmp_path)
  assert other is not c and enc.texts == 40


def test_mismatched_embeddings_are_rejected():
  from gp_jax import errors
  enc = encoder_lib.HashingEncoder(dim=8)
  with pytest.raises(errors.ConfigError, match="shape"):
    retrieval.NodeIndex(_graph(["a b", "c d"]), np.zeros((3, 8), np.float32), enc)
