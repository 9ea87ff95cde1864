"""Padded sizes ("buckets"): jitted code compiles once per array shape, so a batch of n items is
padded to the smallest of a few fixed sizes that holds it.

`bucket` is that choice for every batch that is padded so: the PPO update's transitions
(rl/loop), the decision batcher's decisions (rl/decisions), the MiniLM encoder's token lengths
(text/minilm) and the knowledge-graph search's queries (counselor/kg/retrieval).
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


def powers_of_two(largest: int) -> tuple[int, ...]:
  """1, 2, 4, ... up to the first power of two >= largest."""
  sizes = [1]
  while sizes[-1] < largest:
    sizes.append(2 * sizes[-1])
  return tuple(sizes)
