"""The served history memory: what decisions read, kept in step with the durable store.

`ServedMemory` holds the router's HistoryMemory and everything that must agree with it:
  - the batched policy's per-hub sums (rl/rollout.PolicyRunner): new rows are added and evicted
    rows subtracted as they go, with a full recompute once per `capacity` evicted rows (bounds
    float32 drift) and always in the summary mode;
  - the completion ids whose feedback it holds, and the API key of every served row;
  - `last_seq`, the store's sequence number of the last feedback applied.

Feedback reaches it only from the store, in the store's order (`sync`: `feedback_after(last_seq)`,
skipping ids already applied), after the store has made it durable: a failed write leaves
nothing in RAM. A server applies its own feedback and, on a shared store, what other replicas
added, so every replica's memory is the same sequence of feedback.

Eviction: the oldest rows beyond the capacity go first. With API keys, one key's served rows may
hold at most `max_key_share` of the capacity: a key over its share loses its own oldest served
rows first, so a flood from one key churns its own rows and cannot flush the training history or
other keys' rows. Training rows and feedback without a key (no keys configured) are not capped.
The same rule replays at restore, so a restarted memory is the memory that was served.
"""
from __future__ import annotations

import asyncio
import collections
import logging
from typing import Callable

import numpy as np

from gp_jax import errors
from gp_jax.graph import history as history_lib
from gp_jax.serving.state import store_api

_log = logging.getLogger(__name__)

FEEDBACK_IDS_KEPT = 200_000   # ids whose feedback is in the memory, to refuse a second one
RESULTS_KEPT = 4096           # recent apply results, for the acknowledgement of their feedback
NO_KEY = -1                   # owner of training rows and of feedback sent without a key


class ServedMemory:
  """The history memory of a serving router (module docstring).

  Args:
    history: the router's HistoryMemory (its capacity set).
    space: the action space (names the (role, LLM) hubs in `memory_info`).
    store: the ServedStore feedback is read from.
    max_key_share: the fraction of the capacity one API key's served rows may hold (None or
      >= 1: no cap).
    reads_memory: whether decisions read the memory (False in the inductive mode: no sums).
    executor: a concurrent.futures executor for the store's blocking reads (None: the loop's
      default).
  """

  def __init__(self, history: history_lib.HistoryMemory, space, store, *,
               max_key_share: float | None = None, reads_memory: bool = True,
               executor=None):
    if max_key_share is not None and not 0.0 <= max_key_share <= 1.0:
      raise errors.ConfigError(f"--max_key_share must be in [0, 1], got {max_key_share}")
    self.history, self.space, self.store = history, space, store
    self.max_key_share = max_key_share
    self.reads_memory = reads_memory
    self.executor = executor      # where the store's blocking reads run (None: the default)
    self.owners = np.full(len(history), NO_KEY, np.int32)   # key index of every row
    self.key_names: list[str] = []
    self._key_index: dict[str, int] = {}
    self.feedback_ids: collections.OrderedDict[str, None] = collections.OrderedDict()
    self.served_rows = 0
    self.last_seq = 0
    self.rows_since_base = 0      # feedback rows applied since the store's base
    self.restored = False
    self.runner = None
    self.params = None
    self.on_evict: Callable[[], None] | None = None
    self._evicted_since_sync = 0
    self._results: collections.OrderedDict[str, dict] = collections.OrderedDict()
    self._store_events = getattr(store, "epoch_events", 0)   # the store's epoch events seen

  # ---- set-up ----------------------------------------------------------------------------------
  def restore(self, restored: store_api.Restored | None) -> None:
    """The stored memory (base, then its feedback in order); None keeps the checkpoint's history
    (the caller then writes it as the store's first base)."""
    self._store_events = getattr(self.store, "epoch_events", 0)
    if restored is None:
      return
    self.history.load_state_dict({"rows": restored.rows, "hubs": restored.hubs})
    h = restored.header
    self.owners = _owners_from_header(h.get("row_keys"), len(self.history), self._index_of)
    self.feedback_ids.update((i, None) for i in h.get("feedback_ids", []))
    self.served_rows = int(h.get("served_rows", 0))
    self.last_seq = int(restored.base_seq)
    for fb in restored.feedback:
      self.apply(fb)
    self._evict(np.zeros(len(self.history), bool))   # a smaller capacity than before
    self.rows_since_base = sum(len(fb.rows) for fb in restored.feedback)
    self.restored = True

  def reload(self, restored: store_api.Restored | None) -> None:
    """The store's memory in place of this one (ids, rows, owners, seq), the decisions' sums
    recomputed once; None (the store holds no base) keeps this one."""
    self._store_events = getattr(self.store, "epoch_events", 0)
    if restored is None:
      return
    runner, self.runner = self.runner, None   # no incremental sums while the rows are replaced
    self.feedback_ids.clear()
    try:
      self.restore(restored)
    finally:
      self.runner = runner
    _log.warning("served memory reloaded from the store after its numbering went backwards: "
                 "%d rows, last seq %d", len(self.history), self.last_seq)
    self._recompute()

  def set_rows(self, rows: np.ndarray, hubs: np.ndarray, header: dict) -> None:
    """Serves the rows of a memory snapshot (a rollback: a version's memory as it was when it
    began to serve; `header` as `snapshot` wrote it). The feedback ids, the seq and the counts
    stay: feedback already given stays given, and the store's later feedback applies on top.
    The decisions' sums are recomputed over the new rows."""
    self.history.load_state_dict({"rows": rows, "hubs": hubs})
    self.owners = _owners_from_header(header.get("row_keys"), len(self.history), self._index_of)
    self._evict(np.zeros(len(self.history), bool))   # a smaller capacity than the snapshot's
    self._recompute()

  def _recompute(self) -> None:
    """The decisions' sums over the rows now (the rows were replaced, not added)."""
    if self.runner is not None and self.reads_memory:
      self.runner.set_params(self.params, self.history)
      self._evicted_since_sync = 0
    if self.on_evict is not None:
      self.on_evict()

  def attach(self, runner, params, on_evict: Callable[[], None] | None = None) -> None:
    """The batched policy whose per-hub sums follow the memory from now on (set_params has
    just computed them from it)."""
    self.runner, self.params, self.on_evict = runner, params, on_evict
    self._evicted_since_sync = 0

  def _index_of(self, key: str | None) -> int:
    if key is None:
      return NO_KEY
    if key not in self._key_index:
      self._key_index[key] = len(self.key_names)
      self.key_names.append(key)
    return self._key_index[key]

  # ---- feedback --------------------------------------------------------------------------------
  def has(self, rid: str) -> bool:
    return rid in self.feedback_ids

  def result(self, rid: str) -> dict | None:
    """What applying feedback `rid` did (rows_added, rows_evicted), while it is recent."""
    return self._results.get(rid)

  def apply(self, fb: store_api.Feedback) -> dict | None:
    """Adds one stored feedback's rows (no-op for an id already applied). Synchronous: the
    memory and the decisions' sums agree again when it returns."""
    self.last_seq = max(self.last_seq, fb.seq)
    if fb.rid in self.feedback_ids:
      return None
    rows = np.asarray(fb.rows, np.float32)
    hubs = np.asarray(fb.hubs, np.int32)
    owner = self._index_of(fb.key)
    h = self.history
    h.add(rows, hubs)
    self.owners = np.concatenate([self.owners, np.full(len(rows), owner, np.int32)])
    drop = np.zeros(len(h), bool)
    cap = self.key_cap()
    if owner != NO_KEY and cap is not None:
      mine = np.flatnonzero(self.owners == owner)
      if len(mine) > cap:
        drop[mine[:len(mine) - cap]] = True   # the key's own oldest served rows
    gone_rows, gone_hubs = self._evict(drop)
    self._follow(rows, hubs, gone_rows, gone_hubs)
    self.served_rows += len(rows)
    self.rows_since_base += len(rows)
    self.feedback_ids[fb.rid] = None
    while len(self.feedback_ids) > FEEDBACK_IDS_KEPT:
      self.feedback_ids.popitem(last=False)
    out = dict(rows_added=len(rows), rows_evicted=len(gone_rows))
    self._results[fb.rid] = out
    while len(self._results) > RESULTS_KEPT:
      self._results.popitem(last=False)
    return out

  def key_cap(self) -> int | None:
    """Served rows one API key may hold (None: no cap)."""
    if self.max_key_share is None or self.max_key_share >= 1.0:
      return None
    return int(self.max_key_share * self.history.capacity)

  def _evict(self, drop: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Removes the rows marked in `drop`, then the oldest rows beyond the capacity; returns the
    removed rows and hubs. Arrays are replaced, never changed in place (snapshots stay valid)."""
    h = self.history
    extra = len(h) - int(drop.sum()) - h.capacity
    if extra > 0:
      drop = drop.copy()
      drop[np.flatnonzero(~drop)[:extra]] = True
    n = int(drop.sum())
    if n == 0:
      return h.rows[:0], h.hubs[:0]
    if drop[:n].all():   # the oldest rows only: slices, no copy
      gone = h.rows[:n], h.hubs[:n]
      h.rows, h.hubs, self.owners = h.rows[n:], h.hubs[n:], self.owners[n:]
    else:
      keep = ~drop
      gone = h.rows[drop], h.hubs[drop]
      h.rows, h.hubs, self.owners = h.rows[keep], h.hubs[keep], self.owners[keep]
    return gone

  def _follow(self, rows, hubs, gone_rows, gone_hubs) -> None:
    """The decisions' per-hub sums after adding `rows` and removing `gone_rows`."""
    if self.runner is None or not self.reads_memory:
      return
    self._evicted_since_sync += len(gone_rows)
    if self.runner.summary or self._evicted_since_sync > self.history.capacity:
      # Full recompute: the summary mode always; the sums once per capacity evicted rows,
      # which bounds the float32 drift of subtracting (amortised: one row pass per row).
      self.runner.set_params(self.params, self.history)
      self._evicted_since_sync = 0
    else:
      # Incremental: a full memory evicts on every feedback, and recomputing all 100,000 rows
      # of a default-size memory each time would cost more than the decisions.
      self.runner.add_history(rows, hubs)
      if len(gone_rows):
        self.runner.add_history(gone_rows, gone_hubs, sign=-1.0)
    if len(gone_rows) and self.on_evict is not None:
      self.on_evict()

  async def sync(self) -> int:
    """Applies the store's feedback after `last_seq` (this server's and, on a shared store, other
    replicas'), in seq order; returns how many were new here. After an epoch event of the store
    (its numbering went backwards: postgres_timeline.py) the memory is reloaded from it instead,
    so it holds what the database holds (feedback a promoted standby lost leaves it too)."""
    loop = asyncio.get_running_loop()
    fbs = await loop.run_in_executor(self.executor, self.store.feedback_after, self.last_seq)
    if getattr(self.store, "epoch_events", 0) != self._store_events:
      restored = await loop.run_in_executor(self.executor, self.store.load)
      self.reload(restored)
      return len(fbs)
    n = 0
    for fb in fbs:   # no await in this loop: a concurrent sync sees last_seq move past these
      if fb.seq > self.last_seq:
        n += self.apply(fb) is not None
    return n

  # ---- snapshots and reports -------------------------------------------------------------------
  def snapshot(self, **extra) -> tuple[np.ndarray, np.ndarray, dict, int]:
    """(rows, hubs, header, seq) of the memory now, for the store's `write_base`."""
    header = dict(row_dim=self.history.row_dim, num_hubs=self.history.num_hubs,
                  capacity=self.history.capacity, served_rows=self.served_rows,
                  feedback_ids=list(self.feedback_ids),
                  row_keys=_owners_to_header(self.owners, self.key_names), **extra)
    return self.history.rows, self.history.hubs, header, self.last_seq

  def per_key(self) -> dict[str, int]:
    counts = np.bincount(self.owners[self.owners >= 0], minlength=len(self.key_names))
    return {name: int(n) for name, n in zip(self.key_names, counts) if n}

  def memory_info(self) -> dict:
    counts = np.bincount(self.history.hubs, minlength=self.space.size)[:self.space.size]
    per_hub = {}
    for a, n in enumerate(counts):
      if n:
        role, llm = self.space.decode(a)
        per_hub[f"{role.name}/{llm}"] = int(n)
    return dict(rows=len(self.history), capacity=self.history.capacity,
                served_rows=self.served_rows, feedback=len(self.feedback_ids),
                journal_rows=self.rows_since_base, seq=self.last_seq,
                max_key_share=self.max_key_share, per_key=self.per_key(),
                read_by_decisions=self.reads_memory, restored=self.restored, per_hub=per_hub)


def _owners_to_header(owners: np.ndarray, names: list[str]) -> list:
  """Run-length form [[key or None, rows], ...] of the rows' keys, oldest first."""
  if not len(owners):
    return []
  cuts = np.flatnonzero(np.diff(owners)) + 1
  starts = np.concatenate([[0], cuts])
  ends = np.concatenate([cuts, [len(owners)]])
  return [[names[o] if o >= 0 else None, int(e - s)]
          for o, s, e in zip(owners[starts].tolist(), starts, ends)]


def _owners_from_header(runs, n: int, index_of) -> np.ndarray:
  if not runs:
    return np.full(n, NO_KEY, np.int32)
  owners = np.concatenate([np.full(int(k), index_of(name), np.int32) for name, k in runs])
  if len(owners) != n:
    raise errors.DataError(f"memory header: row keys cover {len(owners)} rows, the base has {n}")
  return owners
