"""The route log (`RouteLog`): the served requests and their feedback, in JSONL segments.

Route log (JSONL, `--route_log`): one line per served request ("route": the query, the answer,
every call with role, LLM, texts, tokens, $ cost, latency) and one per feedback ("feedback": id,
score), each with `seq`, the store's line number, which `routes_after` pages by.

- **Writes.** `append_many` writes a batch of records (the engine's route records of one loop
  tick) as one write and one flush. A crash can tear only the last line; it is cut off at the
  next start.
- **Segments.** At `segment_bytes` the log rolls over to a new segment (routes.jsonl,
  routes.2.jsonl, routes.3.jsonl, ...). Whatever segments exist are read back at start and by
  `read_log`; a removed segment (by hand or by retention) loses only its own records.
- **Durability.** `sync()` fsyncs what was written; the store calls it before it acknowledges
  feedback, so an acknowledged feedback never names a route line a power loss can remove. A
  closed segment is fsynced at rollover.
- **Numbering.** `<stem>.seq` beside the log holds the newest seq and segment number, written at
  rollover and at close; a restart continues after max(that, the files' newest seq), so removing
  segments of a stopped server never makes the log reuse a seq or a segment name. (After a
  crash, removing the active segment can reuse the seqs written since the last rollover.)
- **Retention** (`retention`, "--route_retention"): "" keeps everything; "7d", "12h", "10GiB",
  "500MiB" or both ("7d,10GiB") remove the oldest closed segments at rollover and at start while
  the oldest segment's last write is older than the age, or all segments together are larger
  than the size. The active segment is never removed.
- **RAM.** For a log in files, RAM holds a small reference per recent route (its segment, offset
  and length, and its feedback score): records are read back from the files when asked for. A
  log without a path keeps its newest records in RAM, at most `keep` of them and at most
  RAM_ONLY_BYTES of their texts (feedback for an older one gets 404, as for an unknown id).
"""
from __future__ import annotations

import collections
import json
import logging
import os
import pathlib
import re
import threading
import time
from typing import Iterator

from gp_jax import errors

_log = logging.getLogger(__name__)

SEGMENT_BYTES = 256 << 20   # default route-log segment size
RAM_ONLY_BYTES = 64 << 20   # texts a route log without files keeps in RAM (about)
_UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_UNITS_B = {"b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def parse_retention(text: str) -> tuple[float | None, int | None]:
  """(max age in seconds, max total bytes) from "7d", "10GiB", "7d,10GiB" or "" (None: no
  bound). Raises ConfigError on anything else."""
  age = size = None
  for part in (p.strip().lower() for p in (text or "").split(",")):
    if not part:
      continue
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([a-z]+)", part)
    if m and m.group(2) in _UNITS_S and age is None:
      age = float(m.group(1)) * _UNITS_S[m.group(2)]
    elif m and m.group(2) in _UNITS_B and size is None:
      size = int(float(m.group(1)) * _UNITS_B[m.group(2)])
    else:
      raise errors.ConfigError(
          f"--route_retention: cannot read {part!r}; give an age (e.g. 7d, 12h, 30m), a size "
          f"(e.g. 10GiB, 500MiB) or both, comma-separated, or nothing to keep everything")
    if (age is not None and age <= 0) or (size is not None and size <= 0):
      raise errors.ConfigError(f"--route_retention: {part!r} must be positive")
  return age, size


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
  ... (the first may be absent when retention or an operator removed it)."""
  return [p for _, p in _numbered_segments(pathlib.Path(path))]


def _segment(path: pathlib.Path, k: int) -> pathlib.Path:
  return path if k == 1 else path.with_name(f"{path.stem}.{k}{path.suffix}")


def _seq_file(path: pathlib.Path) -> pathlib.Path:
  return path.with_name(f"{path.stem}.seq")


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


class _Ref:
  """Where a route record lies in the files, and its feedback score."""
  __slots__ = ("k", "offset", "length", "seq", "score")

  def __init__(self, k: int, offset: int, length: int, seq: int):
    self.k, self.offset, self.length, self.seq, self.score = k, offset, length, seq, None


class RouteLog:
  """Served requests and their feedback: append-only JSONL segments plus references to the
  newest records in RAM (module docstring). Thread-safe.

  Args:
    path: the first segment (None: in memory only).
    keep: route records (or references to them) kept in RAM, for feedback lookups and recent
      pages; older pages are read from the files.
    segment_bytes: the active segment rolls over before it would grow past this.
    retention: "--route_retention" (parse_retention); "" keeps every segment.
  """

  def __init__(self, path: str | os.PathLike | None, keep: int = 100_000,
               segment_bytes: int = SEGMENT_BYTES, retention: str = ""):
    if segment_bytes < 1:
      raise errors.ConfigError(f"--route_log_segment_bytes must be >= 1, got {segment_bytes}")
    self.max_age_s, self.max_bytes = parse_retention(retention)
    self.path = pathlib.Path(path) if path else None
    self.records: collections.OrderedDict[str, dict | _Ref] = collections.OrderedDict()
    self.keep, self.segment_bytes = keep, segment_bytes
    self.ram_bytes, self.ram_limit = 0, RAM_ONLY_BYTES   # texts of records held whole
    self.skipped_lines = self.cut_lines = self.removed_segments = 0
    self.seq = self.synced_seq = self.route_seq = 0
    self.dropped_seq = 0          # the newest route seq no longer in RAM (0: RAM has them all)
    self._mu = threading.Lock()
    self._file = None
    if self.path is not None:
      self.path.parent.mkdir(parents=True, exist_ok=True)
      floor_seq, floor_k = self._read_seq_file()
      existing = [(k, p) for k, p in _numbered_segments(self.path) if p.exists()]
      self._k = max([k for k, _ in existing] + [floor_k, 1])
      if existing and existing[-1][0] == self._k:
        self.cut_lines = int(_cut_torn_line(existing[-1][1]))
      elif floor_k == self._k:
        self._k += 1   # the active segment was removed: never reuse its name
      for k, seg in existing:
        for rec, offset, length in read_segment(seg, self, self.seq):
          self.seq = max(self.seq, int(rec["seq"]))
          self._remember(rec, _Ref(k, offset, length, int(rec["seq"])))
      self.seq = self.synced_seq = max(self.seq, floor_seq)
      self._open()
      self._prune()

  # ---- files -------------------------------------------------------------------------------
  def _read_seq_file(self) -> tuple[int, int]:
    try:
      got = json.loads(_seq_file(self.path).read_text())
      return int(got["seq"]), int(got["segment"])
    except (OSError, ValueError, KeyError, TypeError):
      return 0, 0

  def _write_seq_file(self) -> None:
    target = _seq_file(self.path)
    tmp = target.with_name(target.name + ".tmp")
    with open(tmp, "w") as f:
      json.dump(dict(seq=self.seq, segment=self._k), f)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, target)

  def _open(self) -> None:
    self._file = open(_segment(self.path, self._k), "ab")

  def _roll(self) -> None:
    self._file.flush()
    os.fsync(self._file.fileno())
    self._file.close()
    self._k += 1
    self._open()
    self._write_seq_file()
    self._prune()

  def _prune(self) -> None:
    """Removes the oldest closed segments that retention no longer keeps (under the lock)."""
    if self.max_age_s is None and self.max_bytes is None:
      return
    closed = [(k, p, p.stat()) for k, p in _numbered_segments(self.path)
              if p.exists() and k < self._k]
    total = sum(st.st_size for _, _, st in closed) + self._file.tell()
    now = time.time()
    gone = 0
    for k, p, st in closed:
      too_old = self.max_age_s is not None and now - st.st_mtime > self.max_age_s
      too_big = self.max_bytes is not None and total > self.max_bytes
      if not (too_old or too_big):
        break
      p.unlink()
      total -= st.st_size
      gone = k
      self.removed_segments += 1
    if gone:
      for rid in [rid for rid, r in self.records.items() if r.k <= gone]:
        self.dropped_seq = max(self.dropped_seq, self.records.pop(rid).seq)

  def _read_refs(self, refs: list[_Ref]) -> list[dict]:
    """The records `refs` point to, in their order, each segment opened once; a record whose
    segment retention removed meanwhile is left out."""
    out, f, k = [], None, None
    try:
      for ref in refs:
        if ref.k != k:
          if f is not None:
            f.close()
          k, f = ref.k, None
          try:
            f = open(_segment(self.path, k), "rb")
          except OSError:
            continue
        if f is None:
          continue
        try:
          rec = json.loads(os.pread(f.fileno(), ref.length, ref.offset))
        except (OSError, ValueError):
          continue
        rec["seq"] = ref.seq
        if ref.score is not None:
          rec["feedback"] = ref.score
        out.append(rec)
    finally:
      if f is not None:
        f.close()
    return out

  # ---- RAM ---------------------------------------------------------------------------------
  def _remember(self, rec: dict, ref: _Ref | None) -> None:
    if rec.get("type") == "route":
      self.records[rec["id"]] = ref if ref is not None else rec
      if ref is None:
        self.ram_bytes += _text_bytes(rec)
      while len(self.records) > self.keep or (self.ram_bytes > self.ram_limit
                                              and len(self.records) > 1):
        _, old = self.records.popitem(last=False)
        if not isinstance(old, _Ref):
          self.ram_bytes -= _text_bytes(old)
        self.dropped_seq = max(self.dropped_seq,
                               old.seq if isinstance(old, _Ref) else int(old["seq"]))
    elif rec.get("type") == "feedback" and rec.get("id") in self.records:
      held = self.records[rec["id"]]
      if isinstance(held, _Ref):
        held.score = rec["score"]
      else:
        held["feedback"] = rec["score"]

  # ---- the interface -----------------------------------------------------------------------
  def append(self, rec: dict) -> int:
    """Writes one record with the next seq (set on `rec` too); returns the seq."""
    return self.append_many([rec])[0]

  def append_many(self, recs: list[dict]) -> list[int]:
    """Writes records with the next seqs (set on each), as one write where no rollover falls
    between them; returns the seqs."""
    with self._mu:
      first = self.seq + 1
      for i, rec in enumerate(recs):
        rec["seq"] = first + i
      if self._file is not None:
        chunk, refs = [], []
        size = self._file.tell()
        for rec in recs:
          line = (json.dumps(rec) + "\n").encode()
          if size and size + len(line) > self.segment_bytes:
            self._file.write(b"".join(chunk))
            chunk = []
            self._roll()
            size = 0
          refs.append(_Ref(self._k, size, len(line) - 1, rec["seq"]))
          chunk.append(line)
          size += len(line)
        self._file.write(b"".join(chunk))
        self._file.flush()
      else:
        refs = [None] * len(recs)
      self.seq += len(recs)
      for rec, ref in zip(recs, refs):
        self._remember(rec, ref)
        if rec.get("type") == "route":
          self.route_seq = rec["seq"]
      return list(range(first, self.seq + 1))

  def sync(self) -> None:
    """Makes every line written so far durable (fsync) when a route line is not yet (feedback
    lines alone are the journal's, for exports: they do not call for an fsync). The fsync runs
    outside the lock: lookups and appends go on meanwhile."""
    with self._mu:
      if self._file is None or self.synced_seq >= self.route_seq:
        return
      self._file.flush()
      fd, target = os.dup(self._file.fileno()), self.route_seq
    try:
      os.fsync(fd)   # a rollover meanwhile fsynced the segment it closed
    finally:
      os.close(fd)
    with self._mu:
      self.synced_seq = max(self.synced_seq, target)

  def get(self, rid: str) -> dict | None:
    with self._mu:
      held = self.records.get(rid)
    if held is None or isinstance(held, dict):
      return held
    got = self._read_refs([held])
    return got[0] if got else None

  def after(self, seq: int, limit: int) -> list[dict]:
    """Route records with seq > `seq`, oldest first, at most `limit` (from RAM, or from the files
    when older records than RAM holds are asked for)."""
    with self._mu:
      if seq >= self.dropped_seq or self.path is None:
        held = []
        for r in self.records.values():
          if (r.seq if isinstance(r, _Ref) else r["seq"]) > seq:
            held.append(r)
            if len(held) >= limit:
              break
      else:
        held = None
        self._file.flush()
    if held is not None:
      return held if self.path is None else self._read_refs(held)
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
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self._file = None
        self.synced_seq = self.seq
        try:
          self._write_seq_file()
        except OSError as e:
          _log.error("%s: the route log's numbering was not saved (%s); a restart continues "
                     "after the newest seq in the files", _seq_file(self.path), e)


def _text_bytes(rec: dict) -> int:
  """About what a route record held whole in RAM weighs: its texts, plus a fixed part."""
  calls = rec.get("calls") or ()
  return 512 + len(rec.get("query") or "") + len(rec.get("answer") or "") + sum(
      256 + len(c.get("input_text") or "") + len(c.get("output_text") or "") for c in calls)


def read_segment(seg: pathlib.Path, counter=None, seq: int = 0
                  ) -> Iterator[tuple[dict, int, int]]:
  """(record, byte offset, length without the newline) for each record of one segment; records
  without `seq` (older logs) are numbered on from `seq`."""
  with open(seg, "rb") as f:
    offset = 0
    for raw in f:
      start, offset = offset, offset + len(raw)
      line = raw.strip()
      if not line:
        continue
      try:
        rec = json.loads(line)
      except ValueError:
        if counter is not None:
          counter.skipped_lines += 1
        continue
      if isinstance(rec, dict) and rec.get("type") in ("route", "feedback") and "id" in rec:
        seq = int(rec["seq"]) if isinstance(rec.get("seq"), int) else seq + 1
        rec["seq"] = seq
        yield rec, start, len(raw.rstrip(b"\n"))


def read_log(path, counter=None) -> Iterator[dict]:
  """The records of a route log (all its segments that exist) in order, each with `seq` (older
  logs without it are numbered by line); malformed lines (a torn line) are skipped and counted
  in `counter.skipped_lines` when given. Raises FileNotFoundError when no segment exists."""
  existing = [p for p in log_segments(path) if p.exists()]
  if not existing:
    raise FileNotFoundError(str(path))
  seq = 0
  for seg in existing:
    for rec, _, _ in read_segment(seg, counter, seq):
      seq = rec["seq"]
      yield rec
