"""Orbax checkpoints of a training run: latest (for resuming) and best (by running reward).

A checkpoint holds the TrainingState (params, optimizer state, PRNG key, update count), the history
memory (padded rows, hub ids, row count) and JSON metadata (iteration, counters, running reward).

What survives what:
- A kill at any moment: orbax writes into a temporary folder and renames it when complete, so the
  previous checkpoint stays intact; leftover temporary folders are removed at the next start.
- A checkpoint newer than the state a run resumes from (a "best" saved after the last "latest"
  before a kill, or a damaged step skipped on restore) is deleted on resume
  (`discard_after`): the resumed run writes that step again, and a stale one would either collide
  with it (orbax refuses to save an existing step) or be evaluated in its place.
- Damaged files: after each save, every file of the step is listed with its size and SHA-256 in
  `INTEGRITY_FILE`; restore checks them and falls back to the previous intact "latest" step,
  saying so in one line, or raises one DataError naming the file when no step is intact.
- Disk full or an unwritable folder while saving: a StorageError naming the folder; the
  half-written step is removed and the previous checkpoint stays intact.

Background writes (train.background_checkpoints): a write runs in a thread from host copies while
the run goes on; a kill during it is a kill during a write (above); the next write, or the end of
the run, waits for it and raises its StorageError. The process's stderr is held during a write
(see _held_stderr), so lines the run prints meanwhile appear when it ends.

"best" keeps the newest best step and the best as of each retained "latest" step (at most three):
a run resumed from latest step L continues with L's best so far, and must find it on disk even if
a newer best, saved after L, is discarded.
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import hashlib
import json
import logging
import os
import pathlib
import shutil
import sys
import tempfile
import threading
import time
import warnings
from typing import Any, Callable

import jax
import numpy as np
import orbax.checkpoint as ocp

from gp_jax import errors
from gp_jax import files
from gp_jax.graph import history as history_lib

INTEGRITY_FILE = "gp_jax_files.json"   # {relative path: [size, sha256]} of a finished step
_KEEP_LATEST = 2


@dataclasses.dataclass(frozen=True)
class Write:
  """One checkpoint to write: step `step` (the iteration) of "latest", or of "best".

  Attributes:
    step: the iteration the checkpoint holds.
    state: the TrainingState (any pytree of arrays).
    history: the history memory as of that iteration.
    meta: the JSON metadata; "best_iteration" is required (which best a latest step needs).
    best: a "best" step (else "latest").
  """
  step: int
  state: Any
  history: history_lib.HistoryMemory
  meta: dict
  best: bool = False


@dataclasses.dataclass(frozen=True)
class Restored:
  """What `Checkpointer.restore` read: the state, and the step's JSON metadata (with
  "history_rows", the rows restored into the history memory)."""
  state: Any
  meta: dict


def _manager(path: pathlib.Path, keep: int | None, read_only: bool) -> ocp.CheckpointManager:
  # read_only: nothing created or cleaned up here, and Checkpointer never saves or deletes (orbax's
  # own read_only option would warn on every open).
  return ocp.CheckpointManager(
      path.resolve(), options=ocp.CheckpointManagerOptions(
          max_to_keep=keep, create=not read_only, cleanup_tmp_directories=not read_only,
          enable_async_checkpointing=False))


def _sha256(path: pathlib.Path) -> str:
  h = hashlib.sha256()
  with path.open("rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      h.update(block)
  return h.hexdigest()


def _files(step_dir: pathlib.Path) -> list[pathlib.Path]:
  return sorted(p for p in step_dir.rglob("*") if p.is_file() and p.name != INTEGRITY_FILE)


def write_integrity(step_dir: pathlib.Path) -> None:
  """Records size and SHA-256 of every file of a finished step (files.write_atomic)."""
  table = {str(p.relative_to(step_dir)): [p.stat().st_size, _sha256(p)] for p in _files(step_dir)}
  files.write_atomic(step_dir / INTEGRITY_FILE, json.dumps(table, indent=0, sort_keys=True),
                     "the checkpoint's integrity record")


def check_integrity(step_dir: pathlib.Path) -> str | None:
  """None when every recorded file of the step is present and unchanged, else "<file>: <what>".

  A step without the record (written before it existed, or killed between orbax's final rename
  and the record) is not checked here; its restore is the check."""
  record = step_dir / INTEGRITY_FILE
  if not record.exists():
    return None
  try:
    table = json.loads(record.read_text())
  except (json.JSONDecodeError, UnicodeDecodeError):
    return f"{record}: not valid JSON"
  for rel, (size, digest) in sorted(table.items()):
    p = step_dir / rel
    if not p.is_file():
      return f"{p}: missing"
    actual = p.stat().st_size
    if actual != size:
      return f"{p}: {actual} bytes, {size} when written (truncated or overwritten)"
    if _sha256(p) != digest:
      return f"{p}: contents changed since written"
  return None


def _first_line(e: BaseException) -> str:
  text = str(e).strip().splitlines()
  return f"{type(e).__name__}: {text[0][:300] if text else ''}"


def _stderr(line: str) -> None:
  print(line, file=sys.stderr)


class Checkpointer:
  """The "latest" and "best" checkpoints of one run, under `directory`.

  Args:
    directory: <workdir>/checkpoints.
    read_only: open for restoring only (evaluation): no folder is created, nothing deleted.
    log: where the one-line notices (a damaged step skipped) go; stderr by default.
  """

  def __init__(self, directory: str | pathlib.Path, *, read_only: bool = False,
               background: bool = False, log: Callable[[str], None] = _stderr):
    self.directory = pathlib.Path(directory)
    self.read_only = read_only
    # Writes run in a thread while the caller goes on (one process only: orbax's multi-process
    # saves end in barriers that must not interleave with the caller's collectives).
    self.background = background and jax.process_count() == 1
    self._writer: threading.Thread | None = None
    self._error: BaseException | None = None
    self.log = log
    self.latest = _manager(self.directory / "latest", _KEEP_LATEST, read_only)
    self.best = _manager(self.directory / "best", None, read_only)   # pruned by _prune_best
    self._best_of: dict[int, int] = {}   # latest step -> the best iteration as of that step

  @staticmethod
  def _args(state, history: history_lib.HistoryMemory, meta: dict):
    rows, hubs = history.padded()
    return ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        history=ocp.args.StandardSave({"rows": rows, "hubs": hubs}),
        meta=ocp.args.JsonSave(dict(meta, history_rows=len(history))))

  def _step_dir(self, mngr: ocp.CheckpointManager, step: int) -> pathlib.Path:
    return pathlib.Path(mngr.directory) / str(step)

  def save(self, write: Write) -> None:
    """Writes one step of "latest" or "best", then its integrity record."""
    self.save_all([write])

  def save_all(self, writes: list[Write]) -> None:
    """Writes `writes` one after the other, in order.

    With background writes the call returns once the previous writes are done and host copies
    of the states are taken (the caller may then donate or change its arrays; the history's
    arrays are never changed in place, see HistoryMemory.view); the writes go on in a thread.
    `wait`, the next save, `discard_after`, `restore` and `close` wait for them, and raise
    their error.

    Raises:
      StorageError: the disk is full or the folder not writable (a background write: raised by
        the next call that waits); the previous steps are intact.
    """
    assert not self.read_only, "a read-only Checkpointer does not save"
    self.wait()
    if not self.background:
      for w in writes:
        self._write(w)
      return
    writes = [dataclasses.replace(w, state=jax.device_get(w.state), history=w.history.view(),
                                  meta=dict(w.meta)) for w in writes]

    def run():
      try:
        for w in writes:
          self._write(w)
      except BaseException as e:   # handed to the caller's thread by wait()
        self._error = e
    self._writer = threading.Thread(target=run, name="gp_jax-checkpoint")
    self._writer.start()

  def wait(self) -> None:
    """Waits for the background writes; raises the error one of them met."""
    if self._writer is not None:
      self._writer.join()
      self._writer = None
    if self._error is not None:
      error, self._error = self._error, None
      raise error

  def _write(self, w: Write) -> None:
    step = w.step
    mngr = self.best if w.best else self.latest
    _install_log_filter()
    try:
      with _held_stderr():
        mngr.save(step, args=self._args(w.state, w.history, w.meta), force=True)
        mngr.wait_until_finished()
      if jax.process_index() == 0:   # one writer of the shared step folder (several processes)
        write_integrity(self._step_dir(mngr, step))
    except Exception as e:   # OSError, or tensorstore's ValueError wrapping one
      reason = _storage_reason(e)
      if reason is None:
        raise
      self._remove_partial(mngr, step)
      raise errors.StorageError(f"cannot write checkpoint step {step} in {mngr.directory}: "
                                f"{reason}; the previous checkpoints are intact") from None
    if not w.best:
      self._best_of[step] = int(w.meta["best_iteration"])
    self._prune_best()

  def _remove_partial(self, mngr: ocp.CheckpointManager, step: int) -> None:
    """Deletes what a failed save left of `step` (its temporary folder, or the finished folder
    without an integrity record), so that the next start neither restores nor collides with it."""
    root = pathlib.Path(mngr.directory)
    for p in root.glob(f"{step}.orbax-checkpoint-tmp*"):
      shutil.rmtree(p, ignore_errors=True)
    step_dir = root / str(step)
    if step_dir.exists() and not (step_dir / INTEGRITY_FILE).exists():
      shutil.rmtree(step_dir, ignore_errors=True)
    mngr.reload()

  def _best_iteration_of(self, step: int) -> int | None:
    """best_iteration in the metadata of latest step `step` (None when unreadable)."""
    if step not in self._best_of:
      try:
        out = self.latest.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        self._best_of[step] = int(out["meta"]["best_iteration"])
      except Exception:   # a damaged step keeps every best step (pruning is only housekeeping)
        return None
    return self._best_of[step]

  def _prune_best(self) -> None:
    """Deletes the best steps that neither are the newest nor the best of a retained latest."""
    best_steps = self.best.all_steps()
    if not best_steps:
      return
    needed = {self._best_iteration_of(s) for s in self.latest.all_steps()}
    if None in needed:
      return
    needed.add(max(best_steps))
    for s in best_steps:
      if s not in needed:
        self.best.delete(s)

  def discard_after(self, step: int) -> None:
    """Deletes every latest and best step newer than `step` (the state a run resumes from)."""
    assert not self.read_only, "a read-only Checkpointer does not delete"
    self.wait()
    for mngr in (self.latest, self.best):
      for s in mngr.all_steps():
        if s > step:
          mngr.delete(s)

  def restore(self, abstract_state, history: history_lib.HistoryMemory, *,
              best: bool = False) -> Restored | None:
    """Reads the state and metadata and fills `history`; None when there is no checkpoint.

    "latest": the newest intact step; a damaged newer one is reported in one line and skipped.
    "best": the newest best step, which has no stand-in (an older best is another model).

    Raises:
      DataError: no intact step; names the damaged file.
    """
    self.wait()
    mngr = self.best if best else self.latest
    damaged = []
    for step in sorted(mngr.all_steps(), reverse=True):
      step_dir = self._step_dir(mngr, step)
      problem = check_integrity(step_dir)
      if problem is None:
        try:
          out = self._restore_step(mngr, step, abstract_state)
        except Exception as e:   # unreadable despite the record, or a step without one
          problem = f"{step_dir}: cannot be restored ({_first_line(e)})"
      if problem is not None:
        damaged.append(problem)
        if best:
          break
        continue
      if damaged:
        self.log(f"warning: damaged checkpoint {damaged[0]}; using step {step} instead")
      meta = dict(out["meta"])
      n = int(meta["history_rows"])
      h = jax.tree_util.tree_map(np.asarray, out["history"])
      history.load_state_dict({"rows": h["rows"][:n], "hubs": h["hubs"][:n]})
      return Restored(state=out["state"], meta=meta)
    if not damaged:
      return None
    if best:
      raise errors.DataError(f"the best checkpoint is damaged: {damaged[0]}; restore it from a "
                             f"copy, or delete {mngr.directory} to evaluate the latest checkpoint")
    raise errors.DataError(f"no intact checkpoint in {mngr.directory}: {damaged[-1]}" +
                           (f" (and {len(damaged) - 1} newer step(s) damaged)"
                            if len(damaged) > 1 else "") +
                           f"; restore it from a copy, or delete {self.directory} to train from scratch")

  @staticmethod
  def _restore_step(mngr: ocp.CheckpointManager, step: int, abstract_state) -> dict:
    with _held_stderr():
      return mngr.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract_state),
          history=ocp.args.StandardRestore(),
          meta=ocp.args.JsonRestore()))

  def close(self) -> None:
    """Waits for the background writes (raising their error), then closes."""
    try:
      self.wait()
    finally:
      self.latest.close()
      self.best.close()


_STORAGE_PHRASES = ("No space left on device", "Disk quota exceeded", "Read-only file system",
                    "Permission denied")
_STORAGE_MARKERS = tuple(p.lower() for p in _STORAGE_PHRASES) + ("resource_exhausted",)


@contextlib.contextmanager
def _held_stderr(settle_s: float = 0.5):
  """Holds what is written to the stderr file descriptor during the block; passes it on when the
  block succeeds and drops it when it raises.

  When an orbax save or restore fails (a full disk, an unreadable file), the array reads and
  writes still pending complete on orbax's closed event loop and print one traceback each
  ("Event loop is closed", "cannot schedule new futures after shutdown", never-awaited
  coroutines): hundreds of lines that say nothing the one error line does not. After a failure
  they are given `settle_s` and a garbage collection to arrive while held, and the warnings of
  the failed save's coroutines that are collected later still (at exit, on a busy machine) are
  ignored from then on.
  """
  with tempfile.TemporaryFile() as held:
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(held.fileno(), 2)
    ok = False
    try:
      yield
      ok = True
    finally:
      if not ok:
        warnings.filterwarnings("ignore", category=RuntimeWarning,
                                message=r"coroutine '.*' was never awaited")
        time.sleep(settle_s)
        gc.collect()
      sys.stderr.flush()
      os.dup2(saved, 2)
      os.close(saved)
      if ok:
        held.seek(0)
        sys.stderr.write(held.read().decode(errors="replace"))
        sys.stderr.flush()


class _StorageFailureFilter(logging.Filter):
  """Drops log records about a failed write (orbax's worker threads and asyncio's "Task
  exception was never retrieved" report each failed array write, ~100 tracebacks per failed
  save); the StorageError that `save` raises says it once."""

  def filter(self, record: logging.LogRecord) -> bool:
    text = record.getMessage()
    if record.exc_info and record.exc_info[1] is not None:
      text += " " + str(record.exc_info[1])
    text = text.lower()
    return not any(m in text for m in _STORAGE_MARKERS)


_FILTER = _StorageFailureFilter()


def _install_log_filter() -> None:
  """Adds the filter to the root handlers (absl's among them) and the loggers that report."""
  targets = list(logging.getLogger().handlers)
  targets += [logging.getLogger(n) for n in ("absl", "asyncio")]
  for t in targets:
    if _FILTER not in t.filters:
      t.addFilter(_FILTER)


def _storage_reason(e: BaseException) -> str | None:
  """What went wrong with the storage ("No space left on device"...) when `e` is, or was caused
  by, an OSError (tensorstore raises ValueError with the OS message inside); None otherwise."""
  while e is not None:
    if isinstance(e, OSError):
      return e.strerror or str(e)
    text = str(e)
    for phrase in _STORAGE_PHRASES:
      if phrase.lower() in text.lower():
        return phrase
    if "resource_exhausted" in text.lower():
      return _first_line(e)
    e = e.__cause__ or e.__context__
  return None
