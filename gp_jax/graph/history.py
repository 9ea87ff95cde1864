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
from scipy import signal as scipy_signal

from gp_jax import errors
from gp_jax.util import buckets as buckets_lib

MIN_BUCKET = 4096
GROWTH = 2
ALIGN = 512


def bucket(n: int, limit: int | None = None) -> int:
  """Padded row count: the smallest MIN_BUCKET * GROWTH**j >= n, or `limit` rounded up to ALIGN
  when that is smaller and still >= n (the memory never holds more than limit rows)."""
  sizes = buckets_lib.geometric(MIN_BUCKET, GROWTH, n)
  if limit is not None and n <= limit:
    cap = max(ALIGN, -(-limit // ALIGN) * ALIGN)
    sizes = tuple(s for s in sizes if s < cap) + (cap,)
  return buckets_lib.bucket(n, sizes)


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

  def padded_sizes(self) -> tuple[int, ...]:
    """Every padded size the memory can take from its current row count as it grows up to
    capacity + headroom (the shapes jitted code over it meets: a server compiles them first)."""
    limit, n, out = self.capacity + self.headroom, len(self.rows), []
    while True:
      out.append(bucket(n, limit))
      if out[-1] >= limit:
        return tuple(out)
      n = out[-1] + 1

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


# ---- per-hub statistics (row layout 2) ----------------------------------------------------------
# What the policy and the value network read of each hub's history rows besides the transformed
# rows' mean (docs/memory.md, "Rows that carry the signal"): [A, STAT_DIM] float32, per hub
#   confidence  n / (n + CONFIDENCE_ROWS), n the hub's rows (0 for an empty hub)
#   empty       1 when the hub has no rows (an empty hub is not a bad one: its means are 0 too)
#   utility     recency-weighted mean of the rows' utility column
#   cost        log(1 + recency-weighted mean of the rows' cost column) (milli-dollars)
#   failure     recency-weighted mean of the rows' failed column (the failure rate)
# Recency weights: a row's weight is RECENCY ** (number of the same hub's rows that arrived after
# it), so the newest row weighs 1 and a row 13 calls older about half (RECENCY = 0.95). The
# weighted sums update exactly when rows join at the new end or leave at the old end (`add`,
# `remove`), so decisions keep them incrementally as they keep the hub sums.
STAT_NAMES = ("confidence", "empty", "utility", "cost", "failure")
STAT_DIM = len(STAT_NAMES)
CONFIDENCE_ROWS = 10.0
RECENCY = 0.95


def within_hub_position(hubs: np.ndarray) -> np.ndarray:
  """[n] 0-based position of each row among the rows of its hub (in the given order)."""
  hubs = np.asarray(hubs, np.int64)
  order = np.argsort(hubs, kind="stable")
  srt = hubs[order]
  pos = np.empty(len(hubs), np.int64)
  pos[order] = np.arange(len(hubs)) - np.searchsorted(srt, srt, side="left")
  return pos


class HubStats:
  """Recency-weighted per-hub statistics of a history memory's rows (module notes above).

  Columns of a row [F]: utility at F - 3, cost at F - 2, failed at F - 1 (features.memory_row_table).
  """

  def __init__(self, num_hubs: int, recency: float = RECENCY):
    if not 0.0 < recency <= 1.0:
      raise ValueError(f"recency must lie in (0, 1], got {recency}")
    self.num_hubs, self.recency = int(num_hubs), float(recency)
    self.n = np.zeros(self.num_hubs, np.float64)
    self.sums = np.zeros((self.num_hubs, 4), np.float64)   # weight, utility, cost, failed

  @classmethod
  def of(cls, rows: np.ndarray, hubs: np.ndarray, num_hubs: int,
         recency: float = RECENCY) -> "HubStats":
    """The statistics of rows [n, F] (arrival order) of hubs [n]."""
    s = cls(num_hubs, recency)
    s.add(rows, hubs)
    return s

  def _terms(self, rows, hubs, rank_from_end):
    x = np.asarray(rows, np.float64)
    w = self.recency ** rank_from_end
    vals = np.stack([np.ones(len(x)), x[:, -3], x[:, -2], x[:, -1]], 1) * w[:, None]
    out = np.zeros((self.num_hubs, 4))
    for j in range(4):
      out[:, j] = np.bincount(hubs, weights=vals[:, j], minlength=self.num_hubs)[:self.num_hubs]
    return out

  def _real(self, rows, hubs):
    """The rows and hubs of real hubs (padding hubs >= A dropped) and each hub's count of them."""
    hubs = np.asarray(hubs, np.int64)
    keep = hubs < self.num_hubs
    hubs = hubs[keep]
    return np.asarray(rows)[keep], hubs, np.bincount(hubs, minlength=self.num_hubs)[:self.num_hubs]

  def add(self, rows: np.ndarray, hubs: np.ndarray) -> None:
    """Rows [m, F] of hubs [m] join at the new end (in this order); padding hubs (>= A) skipped."""
    rows, hubs, m = self._real(rows, hubs)
    if not len(hubs):
      return
    rank = m[hubs] - 1 - within_hub_position(hubs)
    self.sums = self.sums * (self.recency ** m)[:, None] + self._terms(rows, hubs, rank)
    self.n += m

  def remove(self, rows: np.ndarray, hubs: np.ndarray) -> None:
    """Rows [m, F] of hubs [m] leave at the old end: they are each hub's oldest rows, in order."""
    rows, hubs, m = self._real(rows, hubs)
    if not len(hubs):
      return
    if np.any(m > self.n):
      raise ValueError("removing more rows of a hub than it holds")
    rank = self.n[hubs].astype(np.int64) - 1 - within_hub_position(hubs)
    self.sums = self.sums - self._terms(rows, hubs, rank)
    self.n -= m
    self.sums[self.n == 0] = 0.0   # exact for an emptied hub

  def table(self) -> np.ndarray:
    """[A, STAT_DIM] float32 (STAT_NAMES)."""
    return stats_table(self.n, self.sums)


def stats_table(n: np.ndarray, sums: np.ndarray) -> np.ndarray:
  """[K, STAT_DIM] float32 statistics (STAT_NAMES) from row counts n [K] and recency-weighted
  sums [K, 4] (weight, utility, cost, failed), one entry per hub (or per predictor pair)."""
  n = np.asarray(n, np.float64)
  has = n > 0
  w = np.where(has, np.maximum(sums[:, 0], 1e-30), 1.0)
  mean = np.where(has[:, None], sums[:, 1:] / w[:, None], 0.0)
  out = np.stack([n / (n + CONFIDENCE_ROWS), (~has).astype(np.float64), mean[:, 0],
                  np.log1p(np.maximum(mean[:, 1], 0.0)), mean[:, 2]], 1)
  return out.astype(np.float32)


# ---- the memory predictor's supervised pairs (model.memory_predictor) ----------------------------
# Each history row is one example of "a hub's next call, given what the memory said of the hub
# before it": input = the statistics of the same hub's earlier rows in the memory (stats_table of
# the rows that arrived before it, as HubStats would give after adding exactly those rows);
# target = the utility the call brought: its credit. Only answered calls are examples: the
# predictor learns what a hub's call brings when it answers; how often it fails, and what a
# failure costs, GARNet takes from the hub's statistics with a fixed sign (garnet.py,
# predict_reward), as it takes the cost (a failure-rate response learned from the few failed rows
# of a training memory took the wrong sign: docs/memory.md, Q). The memory is a window, so the
# first rows of each hub in it are examples with little or no evidence, as a decision on a new or
# long-unused hub has.

def predictor_pairs(rows: np.ndarray, hubs: np.ndarray, num_hubs: int, size: int,
                    recency: float = RECENCY) -> dict:
  """The predictor's examples from rows [n, F] of hubs [n] (arrival order), padded to `size`.

  Returns pred_stats [size, STAT_DIM], pred_target [size], pred_weight [size] (1 for an answered
  row of a real hub, 0 for failed rows, padding and rows of padding hubs), row i's example at
  index i (aligned with HistoryMemory.padded()).
  """
  rows, hubs = np.asarray(rows, np.float64), np.asarray(hubs, np.int64)
  n = len(hubs)
  if size < n:
    raise ValueError(f"{n} rows exceed the padded size {size}")
  stats = np.zeros((size, STAT_DIM), np.float32)
  target = np.zeros(size, np.float32)
  weight = np.zeros(size, np.float32)
  stats[:, STAT_NAMES.index("empty")] = 1.0
  for a in range(int(num_hubs)):
    idx = np.flatnonzero(hubs == a)
    if not len(idx):
      continue
    x = np.stack([np.ones(len(idx)), rows[idx, -3], rows[idx, -2], rows[idx, -1]], 1)
    # inclusive recency-weighted sums S_k = recency * S_{k-1} + x_k; a row reads S_{k-1}
    inclusive = scipy_signal.lfilter([1.0], [1.0, -recency], x, axis=0)
    before = np.concatenate([np.zeros((1, 4)), inclusive[:-1]], 0)
    stats[idx] = stats_table(np.arange(len(idx)), before)
    target[idx] = rows[idx, -3]
    weight[idx] = rows[idx, -1] == 0
  return dict(pred_stats=stats, pred_target=target, pred_weight=weight)
