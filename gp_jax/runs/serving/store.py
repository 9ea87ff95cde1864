"""What a router server keeps on disk: its history memory and its route log.

Memory (`--memory_path`): a base snapshot plus an append-only journal.
  <path>          .npz: history rows [n, F] float32, hub (action) ids [n] int32 and a JSON header
                  (row width, hub count, capacity, the completion ids whose feedback it holds,
                  `seq`: the last journal record folded in). Always replaced whole: written to a
                  temporary file in the same folder, fsynced, renamed over the old one (os.replace
                  is atomic on POSIX), folder fsynced.
  <path>.journal  one record per feedback: [magic, seq, length, crc32] + the rows, hubs and id;
                  appended and fsynced before the feedback is acknowledged.
Restoring = the base, then the journal records with seq > base seq, then eviction to capacity
(the oldest rows first, as when serving). A record torn by a crash fails its length or crc32
check; it and anything after it are dropped (and cut off the file). When the journal holds more
rows than `compact_rows`, a new base is written and the journal emptied; a crash between the two
leaves records the base already holds, which their seq skips. So a process killed at any moment
(kill -9 included) restores every acknowledged feedback, and never a half-written one. A feedback
costs one small append instead of rewriting the whole memory (about a second at 100,000 rows of
259 floats on the 2-core machine).

Route log (JSONL): one line per served request ("route": the query, the answer, every call of
the workflow with its role, LLM, texts, tokens, $ cost and latency) and one line per feedback
("feedback": id, score). Each line is written with one append; a torn last line (the process
killed mid-write) is skipped on reading. `llmrouter_rows` turns the log into LLMRouter's routing
rows (one per call).
"""
from __future__ import annotations

import collections
import io
import json
import os
import pathlib
import struct
import zlib
from typing import Iterable, Iterator

import numpy as np

from gp_jax import errors

MEMORY_VERSION = 1
FEEDBACK_IDS_KEPT = 200_000   # ids whose feedback is in the memory, to refuse a second one
# LLMRouter's routing schema: one row per (query, LLM) call.
LLMROUTER_FIELDS = ("task_name", "query", "ground_truth", "metric", "model_name", "response",
                    "performance", "token_num")


def _fsync_dir(path: pathlib.Path) -> None:
  fd = os.open(path, os.O_RDONLY)
  try:
    os.fsync(fd)
  finally:
    os.close(fd)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
  """Replaces `path` by `data`: temporary file + fsync + os.replace + fsync of the folder."""
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
  with open(tmp, "wb") as f:
    f.write(data)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)
  _fsync_dir(path.parent)


def save_memory(path, rows: np.ndarray, hubs: np.ndarray, header: dict) -> None:
  """Writes the memory file atomically.

  Args:
    rows: [n, F] history rows. hubs: [n] their action ids.
    header: JSON-serialisable facts (row_dim, num_hubs, capacity, feedback_ids, ...).
  """
  buf = io.BytesIO()
  head = dict(header, version=MEMORY_VERSION, rows=int(len(rows)))
  np.savez(buf, rows=np.asarray(rows, np.float32), hubs=np.asarray(hubs, np.int32),
           header=np.array(json.dumps(head, sort_keys=True)))
  atomic_write_bytes(path, buf.getvalue())


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
  if header.get("version") != MEMORY_VERSION or not isinstance(header, dict):
    raise errors.DataError(f"{path}: unknown memory file version {header.get('version')!r}")
  if rows.ndim != 2 or rows.shape[1] != row_dim or hubs.shape != (len(rows),):
    raise errors.DataError(f"{path}: memory rows of shape {rows.shape} do not fit this router "
                           f"(row width {row_dim}); it was made by a router with other features")
  if int(header.get("num_hubs", -1)) != num_hubs or (len(hubs) and (hubs.min() < 0 or
                                                                    hubs.max() >= num_hubs)):
    raise errors.DataError(f"{path}: memory made for {header.get('num_hubs')} (role, LLM) hubs, "
                           f"this router has {num_hubs}")
  return rows, hubs, header


_MAGIC = b"GPJ1"
_HEAD = struct.Struct("<4sQII")   # magic, seq, payload length, crc32 of the payload


class MemoryFile:
  """The memory's base snapshot and journal (module docstring).

  Args:
    path: the base file; the journal is path + ".journal".
    row_dim, num_hubs: what this router's rows look like (a file of another router is refused).
    compact_rows: journal rows above which the next write folds the journal into a new base.
  """

  def __init__(self, path, *, row_dim: int, num_hubs: int, compact_rows: int = 4096):
    self.path = pathlib.Path(path)
    self.journal_path = self.path.with_name(self.path.name + ".journal")
    self.row_dim, self.num_hubs, self.compact_rows = row_dim, num_hubs, compact_rows
    self.journal_rows = 0
    self.compactions = 0

  def exists(self) -> bool:
    return self.path.exists()

  def load(self) -> tuple[np.ndarray, np.ndarray, dict, list] | None:
    """(base rows, base hubs, base header, journal records [(seq, rows, hubs, id)] past the base);
    None when there is no base. Cuts a torn journal tail off the file."""
    base = load_memory(self.path, row_dim=self.row_dim, num_hubs=self.num_hubs)
    if base is None:
      return None
    rows, hubs, header = base
    seq0 = int(header.get("seq", 0))
    records, good_end = [], 0
    if self.journal_path.exists():
      data = self.journal_path.read_bytes()
      pos = 0
      while pos + _HEAD.size <= len(data):
        magic, seq, n, crc = _HEAD.unpack_from(data, pos)
        payload = data[pos + _HEAD.size:pos + _HEAD.size + n]
        if magic != _MAGIC or len(payload) != n or zlib.crc32(payload) != crc:
          break
        try:
          with np.load(io.BytesIO(payload), allow_pickle=False) as z:
            r, h, rid = np.asarray(z["rows"], np.float32), np.asarray(z["hubs"], np.int32), str(z["id"])
        except (OSError, ValueError, KeyError):
          break
        if r.ndim != 2 or r.shape[1] != self.row_dim or h.shape != (len(r),) or (
            len(h) and (h.min() < 0 or h.max() >= self.num_hubs)):
          raise errors.DataError(f"{self.journal_path}: record {seq} does not fit this router")
        pos += _HEAD.size + n
        good_end = pos
        if seq > seq0:
          records.append((int(seq), r, h, rid))
      if good_end < len(data):   # a torn tail: drop it so later appends follow a whole record
        with open(self.journal_path, "r+b") as f:
          f.truncate(good_end)
          f.flush()
          os.fsync(f.fileno())
    self.journal_rows = sum(len(r) for _, r, _, _ in records)
    return rows, hubs, header, records

  def append(self, records: list[tuple[int, np.ndarray, np.ndarray, str]]) -> None:
    """Appends feedback records [(seq, rows, hubs, id)] to the journal and fsyncs it."""
    chunks = []
    for seq, rows, hubs, rid in records:
      buf = io.BytesIO()
      np.savez(buf, rows=np.asarray(rows, np.float32), hubs=np.asarray(hubs, np.int32),
               id=np.array(rid))
      payload = buf.getvalue()
      chunks.append(_HEAD.pack(_MAGIC, seq, len(payload), zlib.crc32(payload)) + payload)
      self.journal_rows += len(rows)
    self.journal_path.parent.mkdir(parents=True, exist_ok=True)
    new = not self.journal_path.exists()
    with open(self.journal_path, "ab") as f:
      f.write(b"".join(chunks))
      f.flush()
      os.fsync(f.fileno())
    if new:
      _fsync_dir(self.journal_path.parent)

  def needs_compaction(self) -> bool:
    return self.journal_rows > self.compact_rows

  def write_base(self, rows: np.ndarray, hubs: np.ndarray, header: dict, seq: int) -> None:
    """A new base holding everything up to journal record `seq`; then the journal is emptied."""
    save_memory(self.path, rows, hubs, dict(header, seq=int(seq)))
    if self.journal_path.exists():
      with open(self.journal_path, "r+b") as f:
        f.truncate(0)
        f.flush()
        os.fsync(f.fileno())
    self.journal_rows = 0
    self.compactions += 1


class RouteLog:
  """Served requests and their feedback: an append-only JSONL file plus the newest records in RAM.

  Args:
    path: the JSONL file (None: in memory only).
    keep: records kept in RAM (for /v1/routes and feedback lookups); older ones stay on disk.
  """

  def __init__(self, path: str | os.PathLike | None, keep: int = 100_000):
    self.path = pathlib.Path(path) if path else None
    self.records: collections.OrderedDict[str, dict] = collections.OrderedDict()
    self.keep = keep
    self.skipped_lines = 0
    if self.path is not None:
      self.path.parent.mkdir(parents=True, exist_ok=True)
      if self.path.exists():
        for rec in read_log(self.path, self):
          self._remember(rec)
      self._file = open(self.path, "a", encoding="utf-8")
    else:
      self._file = None

  def _remember(self, rec: dict) -> None:
    if rec.get("type") == "route":
      self.records[rec["id"]] = rec
      while len(self.records) > self.keep:
        self.records.popitem(last=False)
    elif rec.get("type") == "feedback" and rec.get("id") in self.records:
      self.records[rec["id"]]["feedback"] = rec["score"]

  def append(self, rec: dict) -> None:
    self._remember(rec)
    if self._file is not None:
      # One write per line: a crash can tear only the last line, which readers skip.
      self._file.write(json.dumps(rec, sort_keys=True) + "\n")
      self._file.flush()

  def get(self, rid: str) -> dict | None:
    return self.records.get(rid)

  def since(self, t: float, limit: int) -> list[dict]:
    """Records created strictly after unix time `t`, oldest first, at most `limit`."""
    out = [r for r in self.records.values() if r["created"] > t]
    return out[:limit]

  def close(self) -> None:
    if self._file is not None:
      self._file.close()
      self._file = None


def read_log(path, counter=None) -> Iterator[dict]:
  """The records of a route log in order; malformed lines (a torn last line) are skipped and
  counted in `counter.skipped_lines` when given."""
  with open(path, encoding="utf-8", errors="replace") as f:
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
        yield rec


def write_rows(path, rows: Iterable[dict]) -> int:
  """Writes LLMRouter rows as JSONL (or CSV when `path` ends in .csv), atomically; returns the
  number of rows."""
  rows = list(rows)
  path = pathlib.Path(path)
  if path.suffix == ".csv":
    import csv
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=LLMROUTER_FIELDS, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    text = buf.getvalue()
  else:
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
  atomic_write_bytes(path, text.encode("utf-8"))
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
