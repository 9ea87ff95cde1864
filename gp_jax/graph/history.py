"""The history memory: rows of past training episodes, for GARNet's history graph.

Rows arrive in order (arrival index = position in the buffer); a decision sees the rows that had
arrived before it (`snapshot()` = the row count then). Rows are only evicted between training
iterations, after the PPO update, so every transition of an iteration can be given its exact
snapshot: `update_inputs` cuts the rows into chunks at the transitions' snapshot values; the update
encodes all rows once per minibatch, sums them per (chunk, hub) and takes prefix sums over chunks
(encode the history once per minibatch, not once per transition).
Decisions use per-hub sums kept incrementally while the parameters stay fixed.
Array shapes are padded to buckets (MIN_BUCKET * 2**j rows, the last one cut at capacity +
headroom) so jitted code compiles once per bucket and never pads more than 2x.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from gp_jax import errors

MIN_BUCKET = 4096
GROWTH = 2
ALIGN = 512


def bucket(n: int, limit: int | None = None) -> int:
  """Padded row count: the smallest MIN_BUCKET * GROWTH**j >= n, or `limit` rounded up to ALIGN
  when that is smaller and still >= n (the memory never holds more than limit rows)."""
  b = MIN_BUCKET
  while b < n:
    b *= GROWTH
  if limit is not None and n <= limit:
    b = min(b, max(ALIGN, -(-limit // ALIGN) * ALIGN))
  return b


@dataclasses.dataclass
class HistoryMemory:
  """Rows [n, F], their hub (action) ids [n]; capacity bounds what is kept between iterations,
  headroom what one iteration may add on top of it (it sets the largest padded size)."""
  row_dim: int
  num_hubs: int
  capacity: int
  rows: np.ndarray = None
  hubs: np.ndarray = None
  headroom: int = 0

  def __post_init__(self):
    if self.capacity < 0:
      raise errors.ConfigError(f"history capacity must be >= 0, got {self.capacity}")
    if self.rows is None:
      self.rows = np.zeros((0, self.row_dim), np.float32)
      self.hubs = np.zeros((0,), np.int32)

  def __len__(self) -> int:
    return len(self.rows)

  def snapshot(self) -> int:
    return len(self.rows)

  def add(self, rows: np.ndarray, hubs: np.ndarray) -> None:
    if len(rows):
      self.rows = np.concatenate([self.rows, rows.astype(np.float32)])
      self.hubs = np.concatenate([self.hubs, hubs.astype(np.int32)])

  def view(self) -> "HistoryMemory":
    """The memory as it is now, sharing its arrays: `add` and `evict` rebind them (nothing is
    changed in place), so the view stays as it is while this memory grows."""
    return dataclasses.replace(self)

  def evict(self) -> int:
    """Drops the oldest rows beyond capacity (call only between iterations). Returns how many."""
    extra = len(self.rows) - self.capacity
    if extra > 0:
      self.rows, self.hubs = self.rows[extra:], self.hubs[extra:]
      return extra
    return 0

  def padded_size(self) -> int:
    """Rows of `padded()`: the bucket of the current row count (the shape jitted code sees)."""
    return bucket(len(self.rows), self.capacity + self.headroom)

  def padded(self) -> tuple[np.ndarray, np.ndarray]:
    """Rows and hubs padded to the bucket size; padding rows have hub id num_hubs."""
    n = self.padded_size()
    rows = np.zeros((n, self.row_dim), np.float32)
    rows[:len(self.rows)] = self.rows
    hubs = np.full(n, self.num_hubs, np.int32)
    hubs[:len(self.hubs)] = self.hubs
    return rows, hubs

  def update_inputs(self, snapshots: np.ndarray, num_chunks: int) -> dict:
    """Everything the update needs to rebuild each transition's per-hub history sums.

    The distinct snapshot values u_1 < ... < u_m cut the rows (in arrival order) into chunks:
    chunk(i) = #{j : u_j <= i}. A transition whose snapshot is u_j saw exactly the rows of chunks
    0..j-1, so its per-hub sums are an exclusive prefix sum over chunks of per-(chunk, hub) sums --
    sums of one hub's rows only, never differences of large totals, so they are as exact as the
    incremental sums the decision used.

    Args:
      snapshots: [T] row count each transition saw (<= len(self)).
      num_chunks: static chunk budget (> number of distinct snapshots).
    Returns:
      rows [N, F] padded, arrival order; segment [N] = chunk * A + hub (num_chunks * A for
      padding rows and rows no transition saw); chunk [T] index j of each transition's snapshot;
      count [T, A] rows per hub each transition saw.
    """
    snapshots = np.asarray(snapshots, np.int64)
    if len(snapshots) and snapshots.max() > len(self):
      raise ValueError("a snapshot refers to evicted or future rows")
    uniq = np.unique(snapshots)
    if len(uniq) + 1 > num_chunks:
      raise ValueError(f"{len(uniq)} distinct snapshots exceed the chunk budget {num_chunks}")
    rows, hubs = self.padded()
    A = self.num_hubs
    arrival = np.arange(len(hubs))
    chunk_of_row = np.searchsorted(uniq, arrival, side="right")
    seen = (arrival < (uniq[-1] if len(uniq) else 0)) & (hubs < A)
    segment = np.where(seen, chunk_of_row * A + hubs, num_chunks * A).astype(np.int32)
    chunk = (np.searchsorted(uniq, snapshots, side="left") + 1).astype(np.int32)
    count = np.zeros((len(snapshots), A), np.float32)
    order = np.argsort(snapshots, kind="stable")
    counts, done = np.zeros(A, np.int64), 0
    for t in order:
      s = int(snapshots[t])
      if s > done:
        counts += np.bincount(self.hubs[done:s], minlength=A)[:A]
        done = s
      count[t] = counts
    return dict(rows=rows, segment=segment, chunk=chunk, count=count)

  def state_dict(self) -> dict:
    return dict(rows=self.rows, hubs=self.hubs)

  def load_state_dict(self, d: dict) -> None:
    self.rows = np.asarray(d["rows"], np.float32).reshape(-1, self.row_dim)
    self.hubs = np.asarray(d["hubs"], np.int32).reshape(-1)
