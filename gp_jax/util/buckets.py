"""Padded sizes ("buckets"): jitted code compiles once per array shape, so a batch of n items is
padded to the smallest of a few fixed sizes that holds it.

`bucket` is that choice for every batch that is padded so: the PPO update's transitions
(rl/loop), the decision batcher's decisions (rl/decisions), the MiniLM encoder's token lengths
(text/minilm), the knowledge-graph search's queries (counselor/kg/retrieval) and the history
memory's rows (graph/history). The size lists differ per use (`powers_of_two`, `geometric`,
rl/batch.padding_buckets); the choice does not.
"""
from __future__ import annotations

from typing import Sequence


def bucket(n: int, sizes: Sequence[int]) -> int:
  """The smallest of `sizes` (ascending) that holds n items.

  Raises:
    ValueError: n exceeds the largest size.
  """
  for size in sizes:
    if size >= n:
      return size
  raise ValueError(f"{n} items exceed the largest padded size {sizes[-1] if sizes else 0}")


def geometric(first: int, growth: int, largest: int) -> tuple[int, ...]:
  """first, first * growth, first * growth**2, ... up to the first size >= largest."""
  if first < 1 or growth < 2:
    raise ValueError(f"geometric sizes need first >= 1 and growth >= 2, got {first}, {growth}")
  sizes = [first]
  while sizes[-1] < largest:
    sizes.append(growth * sizes[-1])
  return tuple(sizes)


def powers_of_two(largest: int) -> tuple[int, ...]:
  """1, 2, 4, ... up to the first power of two >= largest."""
  return geometric(1, 2, largest)
