"""Catalog, roles data and the hashing encoder."""
import numpy as np
import pytest

from gp_jax import errors
from gp_jax.llm import catalog as catalog_lib
from gp_jax.text import encoder as encoder_lib


def test_catalog_has_paper_pool():
  cat = catalog_lib.load_catalog()
  assert len(cat) == 12
  assert sorted(m.name for m in cat.llms if m.held_out) == [
      "mistral-nemo-12b-instruct", "mixtral-8x22b-instruct-v0.1", "mixtral-8x7b-instruct-v0.1"]
  assert cat.cost_usd("mixtral-8x22b-instruct-v0.1", 1_000_000, 500_000) == pytest.approx(1.8)


def test_catalog_unknown_name():
  cat = catalog_lib.load_catalog()
  with pytest.raises(errors.ConfigError, match="unknown LLM 'gpt-9'"):
    cat["gpt-9"]


def test_catalog_bad_file(tmp_path):
  p = tmp_path / "c.json"
  p.write_text('{"llms": [{"name": "a", "size_b": 1, "price_in": -1, "price_out": 0, "description": ""}]}')
  with pytest.raises(errors.DataError, match="price_in"):
    catalog_lib.load_catalog(p)
  p.write_text('{"llms": [')
  with pytest.raises(errors.DataError, match="line 1"):
    catalog_lib.load_catalog(p)


def test_hashing_encoder_deterministic_and_normalised():
  enc = encoder_lib.HashingEncoder(dim=64)
  a = enc.encode(["solve the equation", "solve the equation", "write a python function"])
  np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, rtol=1e-5)
  np.testing.assert_array_equal(a[0], a[1])
  assert a[0] @ a[1] > a[0] @ a[2]


def test_cached_encoder_disk_roundtrip(tmp_path):
  path = tmp_path / "emb.sqlite"
  enc = encoder_lib.make_encoder("hashing", cache_path=path, dim=32)
  v = enc.encode(["hello world", "hello world"])
  assert enc.misses == 2 and enc.hits == 0
  enc2 = encoder_lib.make_encoder("hashing", cache_path=path, dim=32)
  np.testing.assert_array_equal(enc2.encode(["hello world"]), v[:1])
  assert enc2.hits == 1 and enc2.misses == 0


def test_unknown_encoder():
  with pytest.raises(errors.ConfigError, match="unknown text encoder"):
    encoder_lib.make_encoder("no-such-encoder")
