"""The embedded served-state store (`FileStore`): a router server's memory and route log in files.

`FileStore` implements store_api.ServedStore in one folder that one process holds at a time
(`fcntl.flock` on `<folder>/.serve_router.lock`; a second server on the same files is refused
with one `error:` line). `open_store` picks it, or PostgreSQL for `--memory_url=postgresql://`.

Memory (`--memory_path`): a base snapshot plus an append-only journal.
  <path>          .npz: history rows [n, F] float32, hub (action) ids [n] int32 and a JSON header
                  (row width, hub count, capacity, the completion ids whose feedback it holds,
                  the API key of each served row, `seq`: the last feedback folded in). Replaced
                  whole with files.write_atomic(durable=True): temporary file, fsync, rename,
                  fsync of the folder.
  <path>.journal  one record per feedback: a 24-byte head [magic "GPJ2", seq, payload length,
                  crc32 of the payload, crc32 of the head] + the payload (rows, hubs, id, key,
                  score); appended and fsynced before the feedback is acknowledged.
Restoring = the base, then the journal records with seq > base seq. Reading the journal tells a
torn tail from damage:
  - torn tail (a crash mid-append): the last record is incomplete, or is the last thing in the
    file and fails its check, or the rest of the file is zeros. It was never acknowledged; it is
    cut off the file before anything is appended.
  - damage: a record that fails its check (magic, head crc, payload crc) with more data after
    it. Start-up stops with one error naming the file, the record and its byte offset (a silent
    cut would drop every later acknowledged record). `recover=True` (`--memory_recover`) copies
    the journal to `<journal>.damaged-<unix time>` and starts from the records before the
    damaged one.
A failed append (fsync error, disk full) cuts the journal back to its previous size, so the
feedback is not stored and its id stays unused (the client's retry succeeds); if even that cut
fails, the store refuses every later feedback (StorageError) rather than risk acknowledging one
behind an unknown tail. When the journal holds many rows, the caller writes a new base
(`write_base`); the journal then keeps only the records after the base's seq (a crash between
the two leaves records the base holds, which their seq skips).

Route log (JSONL, `--route_log`): one line per served request ("route": the query, the answer,
every call with role, LLM, texts, tokens, $ cost, latency) and one per feedback ("feedback": id,
score), each with `seq`, the store's line number, which `routes_after` pages by. Each line is one
append; a torn last line (a crash mid-write) is cut off the file at start. At `segment_bytes`
the log rolls over to a new segment (routes.jsonl, routes.2.jsonl, routes.3.jsonl, ...); all
segments are read back at start and by `read_log`. `llmrouter_rows` turns the log into
LLMRouter's routing rows (one per call).
"""
from __future__ import annotations

import collections
import dataclasses
import fcntl
import io
import json
import logging
import os
import pathlib
import re
import shutil
import struct
import threading
import time
import zlib
from typing import Iterable, Iterator, Sequence

import numpy as np

from gp_jax import errors
from gp_jax import files
from gp_jax.runs.serving import store_api
from gp_jax.runs.serving.store_api import Feedback, Restored

MEMORY_VERSION = 1
FEEDBACK_IDS_KEPT = 200_000   # ids whose feedback is in the memory, to refuse a second one
SEGMENT_BYTES = 256 << 20      # default route-log segment size
LOCK_NAME = ".serve_router.lock"
# LLMRouter's routing schema: one row per (query, LLM) call.
LLMROUTER_FIELDS = ("task_name", "query", "ground_truth", "metric", "model_name", "response",
                    "performance", "token_num")

_log = logging.getLogger(__name__)


# ---- the memory base ---------------------------------------------------------------------------
def save_memory(path, rows: np.ndarray, hubs: np.ndarray, header: dict) -> None:
  """Writes the memory base durably and atomically.

  Args:
    rows: [n, F] history rows. hubs: [n] their action ids.
    header: JSON-serialisable facts (row_dim, num_hubs, capacity, feedback_ids, ...).
  """
  buf = io.BytesIO()
  head = dict(header, version=MEMORY_VERSION, rows=int(len(rows)))
  np.savez(buf, rows=np.asarray(rows, np.float32), hubs=np.asarray(hubs, np.int32),
           header=np.array(json.dumps(head, sort_keys=True)))
  files.write_atomic(path, buf.getvalue(), "the router memory", parents=True, durable=True)


def load_memory(path, *, row_dim: int, num_hubs: int) -> tuple[np.ndarray, np.ndarray, dict] | None:
  """(rows, hubs, header) of a memory file; None when it does not exist.

  Raises:
    DataError: the file is not a memory file, or was made by a router with other features
      (row width or number of (role, LLM) hubs).
  """
  path = pathlib.Path(path)
  if not path.exists():
    return None
  try:
    with np.load(path, allow_pickle=False) as z:
      rows, hubs = np.asarray(z["rows"], np.float32), np.asarray(z["hubs"], np.int32)
      header = json.loads(str(z["header"]))
  except (OSError, ValueError, KeyError) as e:
    raise errors.DataError(f"{path}: not a router memory file ({type(e).__name__}: {e})") from None
  if not isinstance(header, dict) or header.get("version") != MEMORY_VERSION:
    raise errors.DataError(f"{path}: unknown memory file version")
  store_api.check_rows(rows, hubs, row_dim=row_dim, num_hubs=num_hubs, where=str(path))
  if int(header.get("num_hubs", -1)) != num_hubs:
    raise errors.DataError(f"{path}: memory made for {header.get('num_hubs')} (role, LLM) hubs, "
                           f"this router has {num_hubs}")
  return rows, hubs, header


# ---- the journal -------------------------------------------------------------------------------
_MAGIC = b"GPJ2"
_HEAD = struct.Struct("<4sQIII")    # magic, seq, payload length, crc32(payload), crc32(head[:20])
_MAGIC_V1 = b"GPJ1"                 # older journals: no head checksum, payload without key/score
_HEAD_V1 = struct.Struct("<4sQII")


def _encode(fb: Feedback) -> bytes:
  buf = io.BytesIO()
  meta = json.dumps(dict(id=fb.rid, key=fb.key, score=float(fb.score)))
  np.savez(buf, rows=np.asarray(fb.rows, np.float32), hubs=np.asarray(fb.hubs, np.int32),
           meta=np.array(meta))
  payload = buf.getvalue()
  head = _HEAD_V1.pack(_MAGIC, fb.seq, len(payload), zlib.crc32(payload))   # the first 20 bytes
  return head + struct.pack("<I", zlib.crc32(head)) + payload


def _decode(seq: int, payload: bytes, legacy: bool) -> Feedback:
  with np.load(io.BytesIO(payload), allow_pickle=False) as z:
    rows, hubs = np.asarray(z["rows"], np.float32), np.asarray(z["hubs"], np.int32)
    if legacy:
      meta = dict(id=str(z["id"]), key=None, score=float("nan"))
    else:
      meta = json.loads(str(z["meta"]))
  return Feedback(seq=int(seq), rid=str(meta["id"]), key=meta.get("key"),
                  score=float(meta["score"]), rows=rows, hubs=hubs)


@dataclasses.dataclass
class _Scan:
  records: list            # [(Feedback, start offset, end offset)]
  good_end: int            # bytes up to the end of the last whole record
  damage: str | None       # why the record at good_end is damaged (None: a torn tail or clean)


def _scan(data: bytes) -> _Scan:
  """The whole records of a journal, and whether what follows them is a torn tail or damage."""
  records, pos = [], 0
  while pos < len(data):
    rest = data[pos:]
    if not rest.strip(b"\0"):
      return _Scan(records, pos, None)   # zeros to the end: a tail whose data never landed
    magic = rest[:4]
    if magic == _MAGIC:
      if len(rest) < _HEAD.size:
        return _Scan(records, pos, None)
      _, seq, n, crc, hcrc = _HEAD.unpack_from(rest)
      if zlib.crc32(rest[:_HEAD_V1.size]) != hcrc:
        return _Scan(records, pos, "bad head checksum")
      head, legacy = _HEAD.size, False
    elif magic == _MAGIC_V1:
      if len(rest) < _HEAD_V1.size:
        return _Scan(records, pos, None)
      _, seq, n, crc = _HEAD_V1.unpack_from(rest)
      head, legacy = _HEAD_V1.size, True
    elif len(rest) < 4 and _MAGIC.startswith(rest):
      return _Scan(records, pos, None)
    else:
      return _Scan(records, pos, "bad magic" if len(rest) >= _HEAD.size else None)
    end = pos + head + n
    if end > len(data):
      # A record running past the end of the file: torn, unless its length was damaged and
      # whole records follow it (a v2 head checksum catches that; v1 records cannot tell).
      return _Scan(records, pos, None)
    payload = data[pos + head:end]
    why = None
    if zlib.crc32(payload) != crc:
      why = "bad payload checksum"
    else:
      try:
        fb = _decode(seq, payload, legacy)
      except (OSError, ValueError, KeyError, TypeError) as e:
        why = f"unreadable payload ({type(e).__name__})"
    if why is not None:
      return _Scan(records, pos, why if end < len(data) else None)
    records.append((fb, pos, end))
    pos = end
  return _Scan(records, pos, None)


class MemoryFile:
  """The memory's base snapshot and journal (module docstring).

  Args:
    path: the base file; the journal is path + ".journal".
    row_dim, num_hubs: what this router's rows look like (a file of another router is refused).
  """

  def __init__(self, path, *, row_dim: int, num_hubs: int):
    self.path = pathlib.Path(path)
    self.journal_path = self.path.with_name(self.path.name + ".journal")
    self.row_dim, self.num_hubs = row_dim, num_hubs
    self.journal_rows = 0        # rows in the journal records past the base
    self.compactions = 0
    self._offsets: list[tuple[int, int, int]] = []   # (seq, start offset, rows) past the base
    self._size = 0               # bytes of whole records in the journal
    self._mu = threading.Lock()  # appends vs. the journal rewrite after a new base

  def exists(self) -> bool:
    return self.path.exists()

  def load(self, *, recover: bool = False) -> tuple[np.ndarray, np.ndarray, dict,
                                                    list[Feedback]] | None:
    """(base rows, base hubs, base header, journal feedback past the base, ascending); None when
    there is no base. Cuts a torn journal tail off the file.

    Raises:
      DataError: a damaged journal record with data after it (unless `recover`: the journal is
        copied aside and cut before that record), or records that do not fit this router.
    """
    base = load_memory(self.path, row_dim=self.row_dim, num_hubs=self.num_hubs)
    if base is None:
      return None
    rows, hubs, header = base
    seq0 = int(header.get("seq", 0))
    data = self.journal_path.read_bytes() if self.journal_path.exists() else b""
    scan = _scan(data)
    if scan.damage is not None:
      where = (f"{self.journal_path}: journal record {len(scan.records) + 1} at byte offset "
               f"{scan.good_end} is damaged ({scan.damage}), and {len(data) - scan.good_end} "
               f"bytes follow it")
      if not recover:
        raise errors.DataError(
            f"{where}. Nothing was changed. Records after it may hold acknowledged feedback; to "
            f"start from the base and the {len(scan.records)} records before it, restart with "
            f"--memory_recover (the damaged journal is kept as "
            f"{self.journal_path.name}.damaged-<unix time>)")
      aside = self.journal_path.with_name(f"{self.journal_path.name}.damaged-{int(time.time())}")
      shutil.copyfile(self.journal_path, aside)
      with open(aside, "rb") as f:
        os.fsync(f.fileno())
      _log.warning("%s; kept as %s, starting from the %d records before it", where, aside,
                   len(scan.records))
    if scan.good_end < len(data):   # a torn tail (or recovered damage): cut before appending
      with open(self.journal_path, "r+b") as f:
        f.truncate(scan.good_end)
        f.flush()
        os.fsync(f.fileno())
    feedback = []
    for fb, _, _ in scan.records:
      store_api.check_rows(fb.rows, fb.hubs, row_dim=self.row_dim, num_hubs=self.num_hubs,
                           where=f"{self.journal_path}: record {fb.seq}")
      if fb.seq > seq0:
        feedback.append(fb)
    self._offsets = [(fb.seq, start, len(fb.rows)) for fb, start, _ in scan.records
                     if fb.seq > seq0]
    self._size = scan.good_end
    self.journal_rows = sum(len(fb.rows) for fb in feedback)
    return rows, hubs, header, feedback

  def append(self, records: list[Feedback]) -> None:
    """Appends feedback records (with their seq) to the journal and fsyncs it. On any failure the
    journal is cut back to its previous size and the error raised (nothing appended)."""
    chunks = [_encode(fb) for fb in records]
    data = b"".join(chunks)
    with self._mu:
      self.journal_path.parent.mkdir(parents=True, exist_ok=True)
      new = not self.journal_path.exists()
      fd = os.open(self.journal_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
      try:
        try:
          if os.write(fd, data) != len(data):
            raise OSError(28, "short write (no space left on device?)")
          os.fsync(fd)
          if new:
            files.fsync_folder(self.journal_path.parent)
        except BaseException:
          try:   # the bytes may sit in the page cache and reach the disk later: remove them
            os.ftruncate(fd, self._size)
            os.fsync(fd)
          except OSError as e:
            raise JournalBroken(f"{self.journal_path}: a failed append could not be undone "
                                f"({files.describe_os_error(e)})") from None
          raise
      finally:
        os.close(fd)
      for fb, chunk in zip(records, chunks):
        self._offsets.append((fb.seq, self._size, len(fb.rows)))
        self._size += len(chunk)
        self.journal_rows += len(fb.rows)

  def write_base(self, rows: np.ndarray, hubs: np.ndarray, header: dict, seq: int) -> None:
    """A new base holding everything up to feedback `seq`; then the journal keeps only the
    records after it (appended while the base was written)."""
    save_memory(self.path, rows, hubs, dict(header, seq=int(seq)))
    with self._mu:
      keep = [o for o in self._offsets if o[0] > seq]
      if keep and self.journal_path.exists():
        start = keep[0][1]
        with open(self.journal_path, "rb") as f:
          f.seek(start)
          tail = f.read(self._size - start)
        files.write_atomic(self.journal_path, tail, "the router memory journal", durable=True)
        self._offsets = [(s, off - start, n) for s, off, n in keep]
        self._size = len(tail)
      else:
        if self.journal_path.exists():
          with open(self.journal_path, "r+b") as f:
            f.truncate(0)
            f.flush()
            os.fsync(f.fileno())
        self._offsets, self._size = [], 0
      self.journal_rows = sum(n for _, _, n in self._offsets)
      self.compactions += 1


class JournalBroken(errors.StorageError):
  """A failed journal append could not be undone: no later feedback may be acknowledged."""


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


# ---- the route log -----------------------------------------------------------------------------
def _numbered_segments(path: pathlib.Path) -> list[tuple[int, pathlib.Path]]:
  pattern = re.compile(re.escape(path.stem) + r"\.(\d+)" + re.escape(path.suffix) + "$")
  numbered = [(1, path)]
  if path.parent.exists():
    for p in path.parent.iterdir():
      m = pattern.match(p.name)
      if m and int(m.group(1)) >= 2:
        numbered.append((int(m.group(1)), p))
  return sorted(numbered)


def log_segments(path) -> list[pathlib.Path]:
  """The segments of a route log, oldest first: `path`, then <stem>.2<suffix>, <stem>.3<suffix>,
  ..."""
  return [p for _, p in _numbered_segments(pathlib.Path(path))]


def _segment(path: pathlib.Path, k: int) -> pathlib.Path:
  return path if k == 1 else path.with_name(f"{path.stem}.{k}{path.suffix}")


def _cut_torn_line(path: pathlib.Path) -> bool:
  """Cuts an unfinished last line off the file (a crash mid-append); True when it cut one."""
  size = path.stat().st_size
  if size == 0:
    return False
  with open(path, "r+b") as f:
    f.seek(size - 1)
    if f.read(1) == b"\n":
      return False
    step, end = 1 << 16, size
    while end > 0:   # the last newline, reading backwards
      start = max(0, end - step)
      f.seek(start)
      i = f.read(end - start).rfind(b"\n")
      if i >= 0:
        end = start + i + 1
        break
      end = start
    f.truncate(end)
    f.flush()
    os.fsync(f.fileno())
  return True


class RouteLog:
  """Served requests and their feedback: append-only JSONL segments plus the newest records in
  RAM. Thread-safe.

  Args:
    path: the first segment (None: in memory only).
    keep: route records kept in RAM (for feedback lookups and recent pages); the files keep
      everything and older pages are read from them.
    segment_bytes: the active segment rolls over before it would grow past this.
  """

  def __init__(self, path: str | os.PathLike | None, keep: int = 100_000,
               segment_bytes: int = SEGMENT_BYTES):
    if segment_bytes < 1:
      raise errors.ConfigError(f"--route_log_segment_bytes must be >= 1, got {segment_bytes}")
    self.path = pathlib.Path(path) if path else None
    self.records: collections.OrderedDict[str, dict] = collections.OrderedDict()
    self.keep, self.segment_bytes = keep, segment_bytes
    self.skipped_lines = 0
    self.cut_lines = 0
    self.seq = 0
    self.dropped_seq = 0          # the newest route seq no longer in RAM (0: RAM has them all)
    self._mu = threading.Lock()
    self._file = None
    if self.path is not None:
      self.path.parent.mkdir(parents=True, exist_ok=True)
      self._k, last = _numbered_segments(self.path)[-1]
      if last.exists():
        self.cut_lines = int(_cut_torn_line(last))
      if self.path.exists():
        for rec in read_log(self.path, self):
          self.seq = max(self.seq, int(rec["seq"]))
          self._remember(rec)
      self._open()

  def _open(self) -> None:
    self._file = open(_segment(self.path, self._k), "a", encoding="utf-8")

  def _remember(self, rec: dict) -> None:
    if rec.get("type") == "route":
      self.records[rec["id"]] = rec
      while len(self.records) > self.keep:
        _, old = self.records.popitem(last=False)
        self.dropped_seq = max(self.dropped_seq, int(old["seq"]))
    elif rec.get("type") == "feedback" and rec.get("id") in self.records:
      self.records[rec["id"]]["feedback"] = rec["score"]

  def append(self, rec: dict) -> int:
    """Writes one record with the next seq (set on `rec` too); returns the seq."""
    with self._mu:
      self.seq += 1
      rec["seq"] = self.seq
      if self._file is not None:
        line = json.dumps(rec, sort_keys=True) + "\n"
        if self._file.tell() and self._file.tell() + len(line.encode()) > self.segment_bytes:
          self._file.close()
          self._k += 1
          self._open()
        # One write per line: a crash can tear only the last line, cut off at the next start.
        self._file.write(line)
        self._file.flush()
      self._remember(rec)
      return self.seq

  def get(self, rid: str) -> dict | None:
    with self._mu:
      return self.records.get(rid)

  def after(self, seq: int, limit: int) -> list[dict]:
    """Route records with seq > `seq`, oldest first, at most `limit` (from RAM, or from the files
    when older records than RAM holds are asked for)."""
    with self._mu:
      if seq >= self.dropped_seq or self.path is None:
        out = []
        for r in self.records.values():
          if r["seq"] > seq:
            out.append(r)
            if len(out) >= limit:
              break
        return out
      self._file.flush()
    scores, out = {}, []
    for rec in read_log(self.path):
      if rec["type"] == "feedback":
        scores[rec["id"]] = rec["score"]
      elif rec["seq"] > seq and len(out) < limit:
        out.append(rec)
    return [dict(r, feedback=scores[r["id"]]) if r["id"] in scores else r for r in out]

  def close(self) -> None:
    with self._mu:
      if self._file is not None:
        self._file.close()
        self._file = None


def read_log(path, counter=None) -> Iterator[dict]:
  """The records of a route log (all its segments) in order, each with `seq` (older logs without
  it are numbered by line); malformed lines (a torn line) are skipped and counted in
  `counter.skipped_lines` when given."""
  seq = 0
  for seg in log_segments(path):
    if not seg.exists():
      if seg == pathlib.Path(path):
        raise FileNotFoundError(str(seg))
      continue
    with open(seg, encoding="utf-8", errors="replace") as f:
      for line in f:
        line = line.strip()
        if not line:
          continue
        try:
          rec = json.loads(line)
        except json.JSONDecodeError:
          if counter is not None:
            counter.skipped_lines += 1
          continue
        if isinstance(rec, dict) and rec.get("type") in ("route", "feedback") and "id" in rec:
          seq = int(rec["seq"]) if isinstance(rec.get("seq"), int) else seq + 1
          rec["seq"] = seq
          yield rec


# ---- the store ---------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class StoreConfig:
  """Where a server keeps its state (the runner's flags).

  memory_path: the memory base (None: RAM only). route_log: the route log (None: RAM only).
  memory_url: postgresql://... (then the PostgreSQL store, and the paths are unused).
  namespace: the name under which replicas of one router share PostgreSQL rows.
  segment_bytes: route-log segment size. recover: start past a damaged journal record.
  """
  memory_path: str | None = None
  route_log: str | None = None
  memory_url: str = ""
  namespace: str = "default"
  segment_bytes: int = SEGMENT_BYTES
  recover: bool = False


class FileStore:
  """store_api.ServedStore in files (module docstring); memory_path/route_log None keep that
  part in RAM (nothing outlives the process)."""

  shared = False   # one process: nothing to follow from other replicas

  def __init__(self, memory_path, route_log, *, row_dim: int, num_hubs: int,
               segment_bytes: int = SEGMENT_BYTES, recover: bool = False):
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
      self.memfile = (MemoryFile(self.memory_path, row_dim=row_dim, num_hubs=num_hubs)
                      if self.memory_path else None)
      self.routes = RouteLog(route_log, segment_bytes=segment_bytes)
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
    own record is durable, or raises (then nothing of its group is stored)."""
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
    except JournalBroken as e:
      return e
    except OSError as e:
      return errors.StorageError(f"{self.memfile.journal_path}: cannot write the feedback "
                                 f"({files.describe_os_error(e)}); it was not stored")
    return None

  def _finish(self, batch: list["_Pending"], error: Exception | None) -> None:
    """Under the lock: the batch's outcome, for its callers and the store's state."""
    if isinstance(error, JournalBroken):
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
    from gp_jax.runs.serving import pg_store
    return pg_store.PostgresStore(cfg.memory_url, row_dim=row_dim, num_hubs=num_hubs,
                                  namespace=cfg.namespace)
  return FileStore(cfg.memory_path, cfg.route_log, row_dim=row_dim, num_hubs=num_hubs,
                   segment_bytes=cfg.segment_bytes, recover=cfg.recover)


# ---- exports -----------------------------------------------------------------------------------
def write_rows(path, rows: Iterable[dict], fields: Sequence[str] = LLMROUTER_FIELDS) -> int:
  """Writes LLMRouter rows as JSONL (or CSV with columns `fields` when `path` ends in .csv),
  atomically; returns the number of rows."""
  rows = list(rows)
  path = pathlib.Path(path)
  if path.suffix == ".csv":
    import csv
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    text = buf.getvalue()
  else:
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
  files.write_atomic(path, text, "the exported routes", parents=True)
  return len(rows)


def llmrouter_rows(records: Iterable[dict], *, scored_only: bool = True) -> Iterator[dict]:
  """LLMRouter routing rows (LLMROUTER_FIELDS), one per LLM call of each served request.

  performance is the request's feedback score (the workflow's outcome, shared by its calls);
  ground_truth is empty (a served query has none) and metric is "feedback". Requests without
  feedback are skipped unless scored_only is False (then performance is None).
  """
  feedback: dict[str, float] = {}
  routes: list[dict] = []
  for rec in records:
    if rec["type"] == "feedback":
      feedback[rec["id"]] = float(rec["score"])
    else:
      routes.append(rec)
  for rec in routes:
    score = feedback.get(rec["id"], rec.get("feedback"))   # /v1/routes records carry it
    if score is None and scored_only:
      continue
    for call in rec["calls"]:
      yield dict(task_name=rec["task"], query=call["input_text"], ground_truth="",
                 metric="feedback", model_name=call["llm"], response=call["output_text"],
                 performance=score, token_num=int(call["input_tokens"] + call["output_tokens"]))
