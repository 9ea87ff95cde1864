"""Rollback and resume of the online learner (learner.OnlineLearner's part; docs/serving.md,
"Learning while serving").

A rollback to version T serves T's weights with T's memory: the memory as it was when T began to
serve (versions.py keeps a snapshot of it for each version). The memory just before the
rollback is written aside (router_versions/memory/aside-<n>.npz, named in the rollback's entry),
so the rows that entered after T (the span's feedback) are kept, and rolling forward to a later
version serves that version's own memory again. The store then gets the new memory as its base,
so a restart serves it too. With the memory and the weights, the learner:
  - discards an update in progress (not committed) and drops the episodes waiting (the span's);
  - does not learn from feedback on requests that versions off T's lineage decided;
  - moves the canary's anchor back to T's (the best accepted version up to T);
  - pauses: no update starts until an admin resumes it (POST /v1/router/resume). The pause is
    kept in the versions index, so it outlives a restart.
The answer comes once the set-aside memory, the new base and the index are written; a failed
write answers an error and the rollback may be repeated.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable

import jax

from gp_jax import errors
from gp_jax.serving.state import versions as versions_lib

_log = logging.getLogger(__name__)


class MemoryMissing(errors.GpJaxError):
  """A rollback's version has no memory snapshot kept (versions.MEMORY_KEPT)."""


class Rollbacks:
  """OnlineLearner's rollback and resume (it holds versions, memory, pending, counters, state,
  version, anchor, paused, rollbacks, swap, _thread, _task, _halt, _rolling, _discarded)."""

  async def _keep_memory(self, version: str) -> None:
    """Writes the memory as `version` begins to serve (taken now, on the loop; written in the
    learner thread). A failed write is logged: a rollback to that version is then refused."""
    if self.memory is None:
      return
    snap = self.memory.snapshot(router_version=version, saved=time.time())
    try:
      await asyncio.get_running_loop().run_in_executor(self._thread, self.versions.write_memory,
                                                       version, snap)
    except OSError as e:
      _log.error("memory snapshot of router version %s not written: %s", version, e)

  async def rollback(self, version: str, rebase: Callable | None = None) -> dict:
    """Serves `version` again with its memory (module docstring) and pauses learning; returns
    its record with the rollback's entry. `rebase`: an async () that writes the memory now as
    the store's new base (so a restart serves it). Raises KeyError (unknown version),
    MemoryMissing (its memory snapshot is not kept), OSError (a file could not be written)."""
    if self.versions.get(version) is None:
      raise KeyError(version)
    if self.memory is not None and not self.versions.has_memory(version):
      raise MemoryMissing(version)
    async with self._rolling:
      self._halt = True   # the update in progress is discarded, none starts
      try:
        return await self._roll(version, rebase)
      finally:
        self._halt = False

  async def _roll(self, version: str, rebase: Callable | None) -> dict:
    waited = self._task is not None and not self._task.done()   # an update was running
    while self._task is not None and not self._task.done():
      await asyncio.shield(self._task)
    loop = asyncio.get_running_loop()
    run = lambda fn, *args: loop.run_in_executor(self._thread, fn, *args)
    record = self.versions.get(version)
    lineage = self.versions.lineage(version)
    anchor = record.get("anchor") if record.get("anchor") in lineage else version
    state = jax.device_get(await run(self.versions.load, version, self._abstract))
    anchor_params = (None if anchor == version else
                     jax.device_get((await run(self.versions.load, anchor,
                                               self._abstract)).params))
    memory = await run(self.versions.load_memory, version) if self.memory is not None else None
    # On the loop, no await until the swap: the version's weights and memory together.
    n = self.counters["rollbacks"] + 1
    entry = dict(rollback=n, to=version, came_from=self.version, created=time.time(),
                 pending_dropped=len(self.pending), waited_for_update=waited, memory=None)
    aside = None
    if memory is not None:
      aside = self.memory.snapshot(rollback=n, came_from=self.version, saved=time.time())
      self.memory.set_rows(*memory)
      span = set(aside[2]["feedback_ids"]) - set(memory[2].get("feedback_ids", []))
      entry["memory"] = dict(restored=f"{versions_lib.MEMORY}/{version}.npz",
                             rows=len(memory[0]), feedback_set_aside=len(span),
                             rows_before=len(aside[0]))
    self.state, self.version = state, version
    self.swap(self.state.params, version)
    self.counters["dropped_rollback"] += len(self.pending)
    self.pending = []
    self._discarded = {v["version"] for v in self.versions.versions()} - set(lineage)
    self.anchor, self._anchor_params = anchor, anchor_params
    self.counters["rollbacks"] = n
    self.paused = dict(since=entry["created"], rollback=n, version=version)
    self.rollbacks = (self.rollbacks + [entry])[-20:]
    if aside is not None:   # kept first; the new base then drops the span from the store
      entry["memory"]["set_aside"] = await run(self.versions.write_memory, f"aside-{n}", aside)
      if rebase is not None:
        await rebase()
    await run(self.versions.set_serving, version, self._learner_state())
    _log.warning("rolled back to router version %s (from %s); learning paused until "
                 "POST /v1/router/resume", version, entry["came_from"])
    return dict(record, rollback=entry)

  async def resume(self) -> dict:
    """Ends a rollback's pause: updates start again (from feedback that arrived since)."""
    was = self.paused
    if was is not None:
      self.paused = None
      try:
        await asyncio.get_running_loop().run_in_executor(self._thread, self.versions.set_learner,
                                                         self._learner_state())
      except OSError:
        self.paused = was
        raise
      self.counters["resumes"] += 1
      self._maybe_start()
    return dict(resumed=was is not None, was_paused=was, version=self.version,
                pending=len(self.pending))
