"""The text encoders' bounds: a text is read up to MAX_TEXT_CHARS characters (shorter texts encode
exactly as they did before the bound), and the embedding cache keeps at most `capacity` vectors
in RAM, the least recently used going first (its SQLite file still holds them all)."""
import time

import numpy as np
import pytest

from gp_jax import errors
from gp_jax.text import encoder as encoder_lib

LIMIT = encoder_lib.MAX_TEXT_CHARS


class _Recording(encoder_lib.TextEncoder):
  """A hashing encoder that records every text it is given."""

  def __init__(self):
    self.inner = encoder_lib.HashingEncoder(dim=16)
    self.name, self.dim, self.seen = "recording", 16, []

  def encode(self, texts):
    self.seen.extend(texts)
    return self.inner.encode(texts)


def _words(n: int, seed: int = 0) -> str:
  rng = np.random.default_rng(seed)
  return " ".join(f"w{int(i)}" for i in rng.integers(0, 5000, n))


def test_clip_keeps_short_texts_and_cuts_long_ones():
  short = _words(50)
  assert encoder_lib.clip(short) is short
  exact = "x" * LIMIT
  assert encoder_lib.clip(exact) is exact
  long = _words(300_000)
  assert len(long) > 100 * LIMIT and encoder_lib.clip(long) == long[:LIMIT]


def test_hashing_reads_the_first_characters_only_and_short_texts_encode_as_before(monkeypatch):
  enc = encoder_lib.HashingEncoder(dim=64)
  short = [_words(n, seed=n) for n in (1, 20, 400)] + ["", "What is 2 + 2?"]
  long = _words(300_000, seed=7)
  bounded = enc.encode(short + [long, long[:LIMIT]])
  np.testing.assert_array_equal(bounded[-2], bounded[-1])   # nothing past the limit is read
  # A 1.3 MB text costs what the first MAX_TEXT_CHARS cost (0.7 s unbounded on one core).
  cached = encoder_lib.make_encoder("hashing", dim=64)
  t0 = time.perf_counter()
  cached.encode([long * 3])
  assert time.perf_counter() - t0 < 0.1
  monkeypatch.setattr(encoder_lib, "MAX_TEXT_CHARS", 1 << 40)   # as before the bound
  unbounded = enc.encode(short + [long])
  np.testing.assert_array_equal(bounded[:len(short)], unbounded[:len(short)])
  assert not np.array_equal(bounded[-2], unbounded[-1])   # the long text was cut


def test_the_cache_clips_before_its_key_and_the_wrapped_encoder_gets_the_clipped_text():
  inner = _Recording()
  enc = encoder_lib.CachedEncoder(inner)
  long = _words(100_000)
  a = enc.encode([long])
  b = enc.encode([long[:LIMIT], long + " more words past the limit"])
  assert [len(t) for t in inner.seen] == [LIMIT]   # one miss, the clipped text
  assert (enc.misses, enc.hits) == (1, 2) and len(enc) == 1
  np.testing.assert_array_equal(a[0], b[0])
  np.testing.assert_array_equal(a[0], b[1])


def test_the_cache_is_a_bounded_lru():
  inner = _Recording()
  enc = encoder_lib.CachedEncoder(inner, capacity=3)
  texts = [f"text number {i}" for i in range(5)]
  enc.encode(texts[:3])
  enc.encode([texts[0]])                 # used again: now the most recent
  enc.encode([texts[3]])                 # evicts texts[1], the least recently used
  assert len(enc) == 3 and enc.misses == 4 and enc.hits == 1
  enc.encode([texts[0], texts[2], texts[3]])
  assert enc.misses == 4 and enc.hits == 4   # all still held
  enc.encode([texts[1]])                 # evicted: computed again
  assert enc.misses == 5 and inner.seen.count(texts[1]) == 2
  for i in range(100):
    enc.encode([f"flood {i}"])
  assert len(enc) == 3
  # One call with more texts than the capacity still answers every row.
  many = [f"batch {i}" for i in range(10)]
  np.testing.assert_array_equal(enc.encode(many), inner.inner.encode(many))
  assert len(enc) == 3
  with pytest.raises(errors.ConfigError, match="capacity"):
    encoder_lib.CachedEncoder(inner, capacity=0)


def test_vectors_evicted_from_ram_come_back_from_the_disk_cache(tmp_path):
  inner = _Recording()
  enc = encoder_lib.CachedEncoder(inner, tmp_path / "emb.sqlite", capacity=2)
  texts = [f"stored text {i}" for i in range(6)]
  want = enc.encode(texts)
  assert len(enc) == 2 and enc.misses == 6
  got = enc.encode(texts)
  np.testing.assert_array_equal(got, want)
  assert enc.misses == 6 and enc.hits == 6 and len(inner.seen) == 6 and len(enc) == 2
