"""The route log (`RouteLog`): the served requests and their feedback, in JSONL segments.

Route log (JSONL, `--route_log`): one line per served request ("route": the query, the answer,
every call with role, LLM, texts, tokens, $ cost, latency) and one per feedback ("feedback": id,
score), each with `seq`, the store's line number, which `routes_after` pages by. Each line is one
append; a torn last line (a crash mid-write) is cut off the file at start. At `segment_bytes`
the log rolls over to a new segment (routes.jsonl, routes.2.jsonl, routes.3.jsonl, ...); all
segments are read back at start and by `read_log`.
"""
from __future__ import annotations

import collections
import json
import os
import pathlib
import re
import threading
from typing import Iterator

from gp_jax import errors

SEGMENT_BYTES = 256 << 20   # default route-log segment size


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

