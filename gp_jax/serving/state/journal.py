"""The router memory's files (`MemoryFile`): a base snapshot and its checksummed journal.

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
"""
from __future__ import annotations

import dataclasses
import io
import json
import logging
import os
import pathlib
import shutil
import struct
import threading
import time
import zlib

import numpy as np

from gp_jax import errors
from gp_jax import files
from gp_jax.serving.state import store_api
from gp_jax.serving.state.store_api import Feedback

MEMORY_VERSION = 1

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
