"""The history memory: rows of past training episodes, for GARNet's history graph.

Rows arrive in order (arrival index = position in the buffer); a decision sees the rows that had
arrived before it (`snapshot()` = the row count then). Rows are only evicted between training
iterations, after the PPO update, so every transition of an iteration can be given its exact
snapshot: `update_inputs` sorts the rows by (hub, arrival) and returns, per transition and hub, the
[lo, hi) range of that hub's rows it saw; the update sums transformed rows over those ranges with
a segmented prefix sum (encode the history once per minibatch, not once per transition).
Decisions use per-hub sums kept incrementally while the parameters stay fixed.
Array shapes are padded to power-of-two buckets so jitted code compiles once per bucket.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from gp_jax import errors

MIN_BUCKET = 512
GROWTH = 8


def bucket(n: int) -> int:
  """Padded row count: MIN_BUCKET * GROWTH**j >= n (few sizes, so few compilations)."""
  b = MIN_BUCKET
  while b < n:
    b *= GROWTH
  return b


@dataclasses.dataclass
class HistoryMemory:
  """Rows [n, F], their hub (action) ids [n]; capacity bounds what is kept between iterations."""
  row_dim: int
  num_hubs: int
  capacity: int
  rows: np.ndarray = None
  hubs: np.ndarray = None

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

  def evict(self) -> int:
    """Drops the oldest rows beyond capacity (call only between iterations). Returns how many."""
    extra = len(self.rows) - self.capacity
    if extra > 0:
      self.rows, self.hubs = self.rows[extra:], self.hubs[extra:]
      return extra
    return 0

  def padded(self) -> tuple[np.ndarray, np.ndarray]:
    """Rows and hubs padded to the bucket size; padding rows have hub id num_hubs."""
    n = bucket(len(self.rows))
    rows = np.zeros((n, self.row_dim), np.float32)
    rows[:len(self.rows)] = self.rows
    hubs = np.full(n, self.num_hubs, np.int32)
    hubs[:len(self.hubs)] = self.hubs
    return rows, hubs

  def update_inputs(self, snapshots: np.ndarray) -> dict:
    """Everything the update needs to rebuild each transition's per-hub history sums.

    Args:
      snapshots: [T] row count each transition saw (<= len(self)).
    Returns:
      rows [N, F] padded and sorted by (hub, arrival); seg_start [N] bool (first row of a hub run);
      lo [A] first sorted position of each hub; hi [T, A] end position of the rows each transition
      saw (hi == lo: none).
    """
    snapshots = np.asarray(snapshots)
    if len(snapshots) and snapshots.max() > len(self):
      raise ValueError("a snapshot refers to evicted or future rows")
    rows, hubs = self.padded()
    order = np.lexsort((np.arange(len(hubs)), hubs))   # by hub, then arrival
    sorted_hubs = hubs[order]
    A = self.num_hubs
    lo = np.searchsorted(sorted_hubs, np.arange(A), side="left").astype(np.int32)
    # Per transition: rows of hub a that arrived before its snapshot, counted incrementally.
    T = len(snapshots)
    hi = np.zeros((T, A), np.int32)
    by_time = np.argsort(snapshots, kind="stable")
    counts = np.zeros(A, np.int64)
    seen = 0
    for t in by_time:
      s = int(snapshots[t])
      if s > seen:
        counts += np.bincount(self.hubs[seen:s], minlength=A)[:A]
        seen = s
      hi[t] = lo + counts
    seg_start = np.ones(len(sorted_hubs), bool)
    seg_start[1:] = sorted_hubs[1:] != sorted_hubs[:-1]
    return dict(rows=rows[order], seg_start=seg_start, lo=lo, hi=hi)

  def state_dict(self) -> dict:
    return dict(rows=self.rows, hubs=self.hubs)

  def load_state_dict(self, d: dict) -> None:
    self.rows = np.asarray(d["rows"], np.float32).reshape(-1, self.row_dim)
    self.hubs = np.asarray(d["hubs"], np.int32).reshape(-1)
