"""util.buckets: the one choice of a padded size."""
import numpy as np
import pytest

from gp_jax.util import buckets


def test_bucket_is_the_smallest_size_that_holds_n():
  sizes = (16, 32, 64)
  assert [buckets.bucket(n, sizes) for n in (0, 1, 16, 17, 32, 33, 64)] == [16, 16, 16, 32, 32,
                                                                             64, 64]


def test_bucket_refuses_more_than_the_largest():
  with pytest.raises(ValueError, match="65 items exceed the largest padded size 64"):
    buckets.bucket(65, (16, 32, 64))
  with pytest.raises(ValueError):
    buckets.bucket(1, ())


def test_powers_of_two_reach_the_largest():
  assert buckets.powers_of_two(1) == (1,)
  assert buckets.powers_of_two(256) == (1, 2, 4, 8, 16, 32, 64, 128, 256)
  assert buckets.powers_of_two(5) == (1, 2, 4, 8)
  # The knowledge-graph search's old rule: the next power of two of a chunk of <= 256 queries.
  sizes = buckets.powers_of_two(256)
  assert all(buckets.bucket(n, sizes) == 1 << (n - 1).bit_length() for n in range(1, 257))


def test_geometric_sizes_and_the_history_rule_on_them():
  assert buckets.geometric(4096, 2, 1) == (4096,)
  assert buckets.geometric(4096, 2, 4097) == (4096, 8192)
  assert buckets.geometric(3, 3, 28) == (3, 9, 27, 81)
  with pytest.raises(ValueError, match="growth"):
    buckets.geometric(1, 1, 10)
  # graph/history's padded rows: a geometric size, cut at the capacity rounded up to ALIGN
  from gp_jax.graph import history as history_lib
  B, A = history_lib.MIN_BUCKET, history_lib.ALIGN
  assert history_lib.bucket(B + 1) == 2 * B
  assert history_lib.bucket(B + 1, limit=B + 1) == B + A
  assert history_lib.bucket(100, limit=100) == A


def test_a_history_lists_every_padded_size_it_can_grow_to():
  from gp_jax.graph import history as history_lib
  B, A = history_lib.MIN_BUCKET, history_lib.ALIGN
  h = history_lib.HistoryMemory(3, 2, capacity=100_000, headroom=64)
  h.add(np.zeros((5000, 3), np.float32), np.zeros(5000, np.int32))
  limit = h.capacity + h.headroom
  sizes = h.padded_sizes()
  assert sizes == (2 * B, 4 * B, 8 * B, 16 * B, -(-limit // A) * A)
  # brute force: every row count from now to capacity + headroom pads to one of them
  assert {history_lib.bucket(n, limit) for n in range(len(h), limit + 1)} == set(sizes)
  small = history_lib.HistoryMemory(3, 2, capacity=400)
  assert small.padded_sizes() == (A,)
