"""The embedded served-state store (`FileStore`): a router server's memory and route log in files.

`FileStore` implements store_api.ServedStore in one folder that one process holds at a time
(`fcntl.flock` on `<folder>/.serve_router.lock`; a second server on the same files is refused
with one `error:` line). `open_store` picks it, or PostgreSQL for `--memory_url=postgresql://`.

The memory (`--memory_path`) is a base snapshot plus a checksummed journal (journal.MemoryFile);
the route log (`--route_log`) is JSONL segments (route_log.RouteLog).
"""
from __future__ import annotations

import collections
import dataclasses
import fcntl
import logging
import os
import pathlib
import threading
import time
from typing import Iterable

import numpy as np

from gp_jax import errors
from gp_jax import files
from gp_jax.serving.state import journal as journal_lib
from gp_jax.serving.state import route_log as route_log_lib
from gp_jax.serving.state import store_api
from gp_jax.serving.state.store_api import Feedback, Restored

FEEDBACK_IDS_KEPT = 200_000   # ids whose feedback is in the memory, to refuse a second one
LOCK_NAME = ".serve_router.lock"

_log = logging.getLogger(__name__)


# ---- the lock ----------------------------------------------------------------------------------
def lock_folder(folder: pathlib.Path) -> int:
  """Takes the exclusive lock of a served-state folder; returns its file descriptor (held until
  closed). Raises ConfigError naming the holder when another process has it."""
  folder.mkdir(parents=True, exist_ok=True)
  path = folder / LOCK_NAME
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
    os.close(fd)
    raise errors.ConfigError(
        f"{folder} is in use by another router server (pid {holder}): two servers on one "
        "memory would lose each other's feedback. Give this one its own --memory_path (and "
        "--route_log), or share a PostgreSQL store between replicas with --memory_url") from None
  os.ftruncate(fd, 0)
  os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
  return fd


# ---- the store ---------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class StoreConfig:
  """Where a server keeps its state (the runner's flags).

  memory_path: the memory base (None: RAM only). route_log: the route log (None: RAM only).
  memory_url: postgresql://... (then the PostgreSQL store, and the paths are unused).
  namespace: the name under which replicas of one router share PostgreSQL rows.
  segment_bytes: route-log segment size. route_retention: which route-log segments are kept
  (route_log.parse_retention; "" keeps all). recover: start past a damaged journal record.
  """
  memory_path: str | None = None
  route_log: str | None = None
  memory_url: str = ""
  namespace: str = "default"
  segment_bytes: int = route_log_lib.SEGMENT_BYTES
  route_retention: str = ""
  recover: bool = False


class FileStore:
  """store_api.ServedStore in files (module docstring); memory_path/route_log None keep that
  part in RAM (nothing outlives the process)."""

  shared = False   # one process: nothing to follow from other replicas

  def __init__(self, memory_path, route_log, *, row_dim: int, num_hubs: int,
               segment_bytes: int = route_log_lib.SEGMENT_BYTES, route_retention: str = "",
               recover: bool = False):
    self.memory_path = pathlib.Path(memory_path) if memory_path else None
    route_log = pathlib.Path(route_log) if route_log else None
    self._locks = []
    for folder in sorted({p.parent.resolve() for p in (self.memory_path, route_log) if p}):
      try:
        self._locks.append(lock_folder(folder))
      except BaseException:
        self.close()
        raise
    try:
      self.memfile = (journal_lib.MemoryFile(self.memory_path, row_dim=row_dim, num_hubs=num_hubs)
                      if self.memory_path else None)
      self.routes = route_log_lib.RouteLog(route_log, segment_bytes=segment_bytes,
                                           retention=route_retention)
    except BaseException:
      self.close()
      raise
    self.recover = recover
    self._mu = threading.Lock()
    self._cond = threading.Condition(self._mu)
    self._queue: list[_Pending] = []      # feedback waiting for the next write
    self._queued_ids: set[str] = set()
    self._writing = False
    self._seq = 0
    self._ids: collections.OrderedDict[str, None] = collections.OrderedDict()
    self._unread: list[Feedback] = []
    self._broken: str | None = None

  @property
  def journal_rows(self) -> int:
    return self.memfile.journal_rows if self.memfile else 0

  @property
  def kind(self) -> str:
    """What /v1/memory reports as the store: "file", or "memory" (RAM only)."""
    return "file" if self.memfile else "memory"

  def problem(self) -> str | None:
    """Why this store cannot keep feedback now, or None when it can (/health says "down" while
    it cannot): a journal whose failed append could not be undone, or a folder, base, journal
    or lock file gone or not writable (a removed folder would be made again by the next append,
    without the base and the earlier records). Names files, never their paths."""
    with self._mu:
      if self._broken:
        return "the memory journal is broken: a failed append could not be undone"
    folders = {p.parent for p in (self.memory_path, self.routes.path) if p is not None}
    for folder in sorted(folders):
      if not folder.is_dir():
        return f"the served-state folder {folder.name} is gone"
      if not os.access(folder, os.W_OK | os.X_OK):
        return f"the served-state folder {folder.name} is not writable"
      if not (folder / LOCK_NAME).exists():
        return f"the lock file of {folder.name} is gone (another server could open it)"
    if self.memfile is not None:
      if not self.memory_path.exists():
        return f"the memory base {self.memory_path.name} is gone"
      journal = self.memfile.journal_path
      if journal.exists() and not os.access(journal, os.W_OK):
        return f"the memory journal {journal.name} is not writable"
    return None

  def load(self) -> Restored | None:
    if self.memfile is None:
      return None
    got = self.memfile.load(recover=self.recover)
    if got is None:
      return None
    rows, hubs, header, feedback = got
    base_seq = int(header.get("seq", 0))
    with self._mu:
      self._remember_ids(header.get("feedback_ids", []))
      self._remember_ids(fb.rid for fb in feedback)
      self._seq = max([base_seq] + [fb.seq for fb in feedback])
    return Restored(rows=rows, hubs=hubs, header=header, base_seq=base_seq, feedback=feedback)

  def _remember_ids(self, ids: Iterable[str]) -> None:
    for rid in ids:
      self._ids[rid] = None
    while len(self._ids) > FEEDBACK_IDS_KEPT:
      self._ids.popitem(last=False)

  def write_base(self, rows: np.ndarray, hubs: np.ndarray, header: dict, seq: int) -> None:
    if self.memfile is not None:
      self.memfile.write_base(rows, hubs, header, seq)

  def add_feedback(self, fb: Feedback) -> Feedback:
    """Group commit: feedback from concurrent callers that arrives while a write is under way is
    written together by the next write (one append, one fsync); each caller returns once its
    own record is durable, or raises (then nothing of its group is stored). The route log is
    made durable first, so an acknowledged feedback never names a route line a power loss
    could remove."""
    try:
      self.routes.sync()
    except OSError as e:
      raise errors.StorageError(f"the route log cannot be made durable "
                                f"({files.describe_os_error(e)}); the feedback was not stored")
    with self._cond:
      if self._broken:
        raise errors.StorageError(self._broken)
      if fb.rid in self._ids or fb.rid in self._queued_ids:
        raise store_api.DuplicateFeedback(f"completion {fb.rid!r} already has feedback")
      slot = _Pending(fb)
      self._queue.append(slot)
      self._queued_ids.add(fb.rid)
      while not slot.done:
        if self._writing:
          self._cond.wait()
          continue
        batch, self._queue = self._queue, []
        first_seq = self._seq + 1
        self._writing = True   # this caller writes; later arrivals queue for the next write
        self._cond.release()
        try:
          error = self._write([p.fb for p in batch], first_seq)
        except BaseException as e:   # every caller of the batch must hear how it ended
          error = e
        finally:
          self._cond.acquire()
          self._writing = False
        self._finish(batch, error)
        self._cond.notify_all()
      if slot.error is not None:
        raise slot.error
      fb = slot.fb
    try:   # durable now; the route log's feedback line is for exports only
      self.routes.append(dict(type="feedback", id=fb.rid, score=float(fb.score),
                              created=time.time(), key=fb.key))
    except OSError as e:
      _log.error("route log: feedback %s not logged (%s); the memory holds it", fb.rid, e)
    return fb

  def _write(self, fbs: list[Feedback], first_seq: int) -> Exception | None:
    """Appends a batch numbered from first_seq (called without the lock; one writer at a time).
    Returns the error instead of raising it."""
    if self.memfile is None:
      return None
    numbered = [dataclasses.replace(fb, seq=first_seq + i) for i, fb in enumerate(fbs)]
    try:
      self.memfile.append(numbered)
    except journal_lib.JournalBroken as e:
      return e
    except OSError as e:
      return errors.StorageError(f"{self.memfile.journal_path}: cannot write the feedback "
                                 f"({files.describe_os_error(e)}); it was not stored")
    return None

  def _finish(self, batch: list["_Pending"], error: Exception | None) -> None:
    """Under the lock: the batch's outcome, for its callers and the store's state."""
    if isinstance(error, journal_lib.JournalBroken):
      self._broken = str(error)
    for p in batch:
      self._queued_ids.discard(p.fb.rid)
      if error is None:
        self._seq += 1
        p.fb = dataclasses.replace(p.fb, seq=self._seq)
        self._remember_ids([p.fb.rid])
        self._unread.append(p.fb)
      else:
        p.error = error
      p.done = True

  def feedback_after(self, seq: int) -> list[Feedback]:
    """This process's own feedback with seq > `seq`; what the caller has read (seq <= `seq`) is
    dropped (one process reads it)."""
    with self._mu:
      self._unread = [fb for fb in self._unread if fb.seq > seq]
      return list(self._unread)

  def has_feedback(self, rid: str) -> bool:
    with self._mu:
      return rid in self._ids

  def append_route(self, record: dict) -> int:
    return self.routes.append(record)

  def append_routes(self, records: list[dict]) -> list[int]:
    return self.routes.append_many(records)

  def route(self, rid: str) -> dict | None:
    return self.routes.get(rid)

  def routes_after(self, seq: int, limit: int) -> list[dict]:
    return self.routes.after(seq, limit)

  def close(self) -> None:
    routes = getattr(self, "routes", None)
    if routes is not None:
      routes.close()
    for fd in self._locks:
      os.close(fd)   # releases the flock
    self._locks = []


@dataclasses.dataclass
class _Pending:
  """One caller's feedback in the group-commit queue."""
  fb: Feedback
  done: bool = False
  error: Exception | None = None


def open_store(cfg: StoreConfig, *, row_dim: int, num_hubs: int):
  """The store `cfg` names: PostgreSQL for a postgresql:// memory_url, else a FileStore."""
  if cfg.memory_url:
    if not cfg.memory_url.startswith(("postgresql://", "postgres://")):
      raise errors.ConfigError(f"--memory_url must be a postgresql:// URL (got a "
                               f"{cfg.memory_url.split(':', 1)[0]!r} URL)")
    from gp_jax.serving.state import postgres
    return postgres.PostgresStore(cfg.memory_url, row_dim=row_dim, num_hubs=num_hubs,
                                  namespace=cfg.namespace)
  return FileStore(cfg.memory_path, cfg.route_log, row_dim=row_dim, num_hubs=num_hubs,
                   segment_bytes=cfg.segment_bytes, route_retention=cfg.route_retention,
                   recover=cfg.recover)

