"""Served records and their feedback: what the engine writes to the store and reads back.

Every answered request's route record goes to the store's route log before the answer is given
out (an answer whose feedback would find no route is refused instead). Feedback turns a served
request's calls into history rows with utility = score; the store makes them durable first, and
only then does the memory apply them (durable, then visible). The memory's base is rewritten in
the background once enough feedback has piled up since the last one, and on a shared store
(PostgreSQL replicas) other replicas' feedback is applied every `sync_interval_s`.

The store's blocking calls run on their own threads: a slow disk or database never holds up the
router's compute thread, and concurrent feedback can share one write.
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import types

import numpy as np

from gp_jax.serving.engine import errors as errors_lib
from gp_jax.serving.state import memory as memory_lib
from gp_jax.serving.state import store_api
from gp_jax.util import aio

_log = logging.getLogger(__name__)
STORE_THREADS = 16               # threads for the store's blocking calls (one feedback write each)


class ServedRecords:
  """The route log and the feedback of one server, over its store and its served memory.

  Args:
    store: the opened store (gp_jax/serving/state/store_api.ServedStore).
    memory: the served memory over the router's history (state/memory.ServedMemory).
    featurizer: turns a route's calls into history rows.
    counters: the server's counters.
    sync_interval_s: how often a shared store's feedback from other replicas is applied.
    compact_rows: feedback rows after which the memory is written as a new base.
    snapshot: () -> the memory as the store's write_base takes it.
    executor: the store's threads.
  """

  def __init__(self, store, memory: memory_lib.ServedMemory, featurizer, *,
               counters: collections.Counter, sync_interval_s: float, compact_rows: int,
               snapshot, executor: concurrent.futures.ThreadPoolExecutor):
    self.store, self.memory, self.featurizer = store, memory, featurizer
    self.counters = counters
    self.sync_interval_s = float(sync_interval_s)
    self.compact_rows = int(compact_rows)
    self._snapshot = snapshot
    self._io = executor
    self._compacting: asyncio.Task | None = None
    self._sync_task: asyncio.Task | None = None
    self._claimed: set[str] = set()   # ids whose feedback is being written
    self._route_batch: list[tuple[dict, asyncio.Future]] = []   # this tick's route records

  async def _stored(self, fn, *args):
    """fn(*args) on the store's threads."""
    return await asyncio.get_running_loop().run_in_executor(self._io, fn, *args)

  # ---- route records ---------------------------------------------------------------------------
  async def log_route(self, record: dict) -> int:
    """Appends a served request's record to the store's route log; sets and returns its seq.
    The records of one loop tick go to the store together (one thread hop, one write). Raises an
    UNAVAILABLE Refusal when it cannot be written (the answer is not given out unlogged: its
    feedback would find no route)."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    if not self._route_batch:
      loop.call_soon(self._write_routes)
    self._route_batch.append((record, done))
    try:
      seq = await done
    except OSError as e:
      self.counters["route_not_stored"] += 1
      _log.error("route %s not logged: %s", record.get("id"), e)
      raise errors_lib.Refusal(errors_lib.UNAVAILABLE, "the request could not be logged (retry "
                               "later)", "storage_unavailable") from None
    record["seq"] = seq
    return seq

  def _write_routes(self) -> None:
    """Sends this tick's route records to the store's threads as one batch."""
    batch, self._route_batch = self._route_batch, []
    written = asyncio.ensure_future(self._stored(self.store.append_routes, [r for r, _ in batch]))

    def settle(task: asyncio.Future) -> None:
      error = None if task.cancelled() else task.exception()
      for i, (_, done) in enumerate(batch):
        if done.done():
          continue
        if task.cancelled():
          done.cancel()
        elif error is not None:
          done.set_exception(error)
        else:
          done.set_result(task.result()[i])
    written.add_done_callback(settle)

  async def route(self, rid: str) -> dict | None:
    """The route record of completion `rid` (with its `seq`, and `key` when the HTTP layer set
    one); None when unknown."""
    return await self._stored(self.store.route, rid)

  async def routes_after(self, seq: int, limit: int) -> list[dict]:
    """Route records with seq > `seq`, in seq order, at most `limit`."""
    return await self._stored(self.store.routes_after, seq, limit)

  async def routes_since(self, t: float, limit: int) -> list[dict]:
    """Route records created after unix time `t` (not for paging: records are numbered when
    they finish, so a slow request can be created before one already listed)."""
    out, after = [], 0
    while len(out) < limit:
      page = await self.routes_after(after, 1000)
      if not page:
        break
      out += [r for r in page if r["created"] > t]
      after = page[-1]["seq"]
    return out[:limit]

  # ---- feedback --------------------------------------------------------------------------------
  async def feedback(self, rid: str, score: float, *, key: str | None, record: dict | None,
                     row_layout) -> tuple[dict, store_api.Feedback]:
    """Adds a served request's calls to the history memory with utility `score`, once the store
    holds them durably. Returns (the memory's result: rows_added, rows_evicted; the stored
    feedback with its seq).

    Raises:
      Refusal: score outside [0, 1] (INVALID), unknown id (NOT_FOUND), feedback already given
        or being written (CONFLICT), the store could not write it (UNAVAILABLE: nothing stored,
        the id stays unused, a retry may succeed).
    """
    if not 0.0 <= score <= 1.0:
      raise errors_lib.Refusal(errors_lib.INVALID, f"score must be a number in [0, 1], got "
                               f"{score}", "invalid_score", "score")
    rec = record if record is not None else await self.route(rid)
    if rec is None:
      raise errors_lib.Refusal(errors_lib.NOT_FOUND, f"no served completion with id {rid!r}",
                               "unknown_id", "id")
    duplicate = errors_lib.Refusal(errors_lib.CONFLICT, f"completion {rid!r} already has "
                                   "feedback", "duplicate_feedback", "id")
    if rid in self._claimed or self.memory.has(rid):
      raise duplicate
    self._claimed.add(rid)
    try:
      # The calls as the memory stores them (the rows read texts, cost and failure), in the
      # model's row layout (the one function for rows joining a history).
      calls = [types.SimpleNamespace(**c) for c in rec["calls"]]
      rows = self.featurizer.episode_rows(calls, float(score), row_layout)
      hubs = np.array([c["action"] for c in rec["calls"]], np.int32)
      fb = store_api.Feedback(seq=0, rid=rid, key=key, score=float(score), rows=rows, hubs=hubs)
      try:
        fb = await self._stored(self.store.add_feedback, fb)
      except store_api.DuplicateFeedback:
        raise duplicate from None
      except OSError as e:   # StorageError included: nothing was stored
        self.counters["feedback_not_stored"] += 1
        _log.error("feedback %s not stored: %s", rid, e)
        raise errors_lib.Refusal(errors_lib.UNAVAILABLE, "the feedback could not be stored "
                                 "(nothing was recorded; retry later)",
                                 "storage_unavailable") from None
      try:   # applies it (and anything before it) in the store's order
        await self.memory.sync()
      except Exception:   # stored (acknowledged below); the next sync applies it
        self.counters["sync_errors"] += 1
        _log.exception("memory sync failed after feedback %s", rid)
    finally:
      self._claimed.discard(rid)
    self.counters["feedback"] += 1
    self.maybe_compact()
    out = self.memory.result(rid) or dict(rows_added=len(rows), rows_evicted=0)
    return out, fb

  # ---- background work -------------------------------------------------------------------------
  async def start(self) -> None:
    """On a shared store, applies other replicas' feedback every sync_interval_s (the bound on
    how stale a replica's memory is)."""
    if getattr(self.store, "shared", True) and self._sync_task is None:
      self._sync_task = asyncio.get_running_loop().create_task(self._follow())

  async def _follow(self) -> None:
    while True:
      await asyncio.sleep(self.sync_interval_s)
      try:
        self.counters["synced_feedback"] += await self.memory.sync()
      except Exception:   # a store outage: keep serving the memory as it is, try again
        self.counters["sync_errors"] += 1
        _log.exception("memory sync failed")
      self.maybe_compact()

  def maybe_compact(self) -> None:
    """Folds the feedback since the last base into a new one, in the background, once it holds
    more than compact_rows rows."""
    if self.memory.rows_since_base > self.compact_rows and (
        self._compacting is None or self._compacting.done()):
      self._compacting = asyncio.get_running_loop().create_task(self.compact())

  async def rebase(self) -> None:
    """Writes the memory now as the store's new base, after any compaction under way and never
    beside one (a rollback's restored memory); raises OSError, unlike `compact`."""
    if self._compacting is not None and not self._compacting.done():
      await self._compacting
    folded = self.memory.rows_since_base
    self._compacting = asyncio.get_running_loop().create_task(
        self._stored(self.store.write_base, *self._snapshot()))
    await self._compacting
    self.memory.rows_since_base = max(0, self.memory.rows_since_base - folded)

  async def compact(self) -> None:
    """Writes the memory as the store's new base (arrays are replaced, never changed in place,
    so the snapshot is safe to hand to a thread)."""
    snap = self._snapshot()
    folded = self.memory.rows_since_base
    try:
      await self._stored(self.store.write_base, *snap)
    except OSError as e:   # the journal still holds everything: only the restart gets slower
      _log.error("memory base not written: %s", e)
      self.counters["compaction_errors"] += 1
      return
    self.memory.rows_since_base = max(0, self.memory.rows_since_base - folded)

  async def aclose(self) -> None:
    """Stops the sync, finishes a running compaction and folds what is left into a base."""
    await aio.cancel_and_wait(self._sync_task)
    if self._compacting is not None:
      await self._compacting
    if self.memory.rows_since_base:
      await self.compact()
