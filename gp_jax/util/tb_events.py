"""TensorBoard event files of scalar metrics, written without TensorFlow or TensorBoard.

`EventWriter(folder)` appends one event per call of `scalars(step, values)` to a new event file
in `folder` (a run's metrics); `replace_report(folder, name, step, values)` replaces the one
event file of a report (an evaluation's numbers) by a new one. TensorBoard shows every folder
under its --logdir that holds event files as one run, so `tensorboard --logdir workdirs` puts the
runs of a workdirs tree side by side.

The format, as TensorBoard's published sources define it (tensorboard/compat/proto/event.proto,
tensorboard/compat/proto/summary.proto, tensorboard/summary/writer/record_writer.py):
  - A file is a sequence of records (TFRecord framing). A record is the data's length as a
    little-endian uint64, the masked CRC32C of those 8 bytes (uint32, little-endian), the data,
    and the masked CRC32C of the data. CRC32C is the Castagnoli CRC (reflected polynomial
    0x82F63B78, initial value and final XOR 0xFFFFFFFF); masking is
    ((crc >> 15) | (crc << 17)) + 0xA282EAD8, modulo 2**32.
  - Each record's data is a serialized `Event` protobuf: wall_time (double, field 1), step (int64,
    field 2) and one of file_version (string, field 3; the first record of a file holds
    "brain.Event:2"), summary (Summary, field 5) or session_log (SessionLog, field 7).
  - Summary: repeated Value value = 1; Value: string tag = 1, float simple_value = 2 (a scalar).
  - SessionLog: status = 1, an enum whose START is 1.
  - TensorBoard reads the files of a run folder whose names contain "tfevents", in name order;
    the names written here are events.out.tfevents.<unix seconds, 10 digits>.<host>.<pid>
    (a run's metrics) and events.out.tfevents.<unix seconds>.<host>.report.<name> (a report).
A resumed run opens a new file (names sort by their start time) and writes again the steps it
redoes. Each metrics file starts with a SessionLog START event at the step of its first point:
TensorBoard's Python loader then drops the points read before it (the earlier files') at steps
>= that step (tensorboard/backend/event_processing/event_accumulator.py,
_CheckForRestartAndMaybePurge), and its Rust data server drops a tag's points at steps >= s when
a point at step s follows them (tensorboard/data/server/run.rs, a preempted run), so either way
the redone points replace those written before the run was stopped. (Checked with tensorboard
2.21: both loaders show a resumed run's redone steps once, with the new values.)

The protobuf messages are encoded here by hand (varints, 64-bit, length-delimited and 32-bit
fields); numbers become float32 values, other values (strings, bools, None) are skipped.
A file that cannot be written is a StorageError naming it (gp_jax/files.py), as for metrics.jsonl.
"""
from __future__ import annotations

import glob
import math
import numbers as numbers_lib
import os
import pathlib
import socket
import struct
import time

import numpy as np

from gp_jax import files

FILE_VERSION = "brain.Event:2"
PREFIX = "events.out.tfevents."
WHAT = "the TensorBoard events"


def _crc32c_table() -> tuple[int, ...]:
  """The byte-wise table of the reflected Castagnoli CRC."""
  table = []
  for n in range(256):
    c = n
    for _ in range(8):
      c = ((c >> 1) ^ 0x82F63B78) if c & 1 else c >> 1
    table.append(c)
  return tuple(table)


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
  """The CRC32C (Castagnoli) of `data`."""
  c = 0xFFFFFFFF
  for b in data:
    c = _TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
  return c ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
  """The masked CRC32C that TFRecord framing stores."""
  c = crc32c(data)
  return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def record(data: bytes) -> bytes:
  """One TFRecord: length, its masked CRC, the data, its masked CRC."""
  length = struct.pack("<Q", len(data))
  return (length + struct.pack("<I", masked_crc32c(length)) + data
          + struct.pack("<I", masked_crc32c(data)))


def _varint(n: int) -> bytes:
  """Protobuf varint of n (a negative int64 as its 64-bit two's complement)."""
  n &= 0xFFFFFFFFFFFFFFFF
  out = bytearray()
  while True:
    b = n & 0x7F
    n >>= 7
    if n:
      out.append(b | 0x80)
    else:
      out.append(b)
      return bytes(out)


def _key(field: int, wire_type: int) -> bytes:
  return _varint(field << 3 | wire_type)


def _bytes_field(field: int, data: bytes) -> bytes:
  """A length-delimited field (wire type 2): strings, embedded messages."""
  return _key(field, 2) + _varint(len(data)) + data


def _float32(value: float) -> bytes:
  """value as a little-endian float32 (beyond its range: an infinity of the same sign)."""
  try:
    return struct.pack("<f", value)
  except OverflowError:
    return struct.pack("<f", math.copysign(math.inf, value))


def scalar_value(tag: str, value: float) -> bytes:
  """A Summary.Value message: tag (field 1) and simple_value (field 2, float32)."""
  return _bytes_field(1, tag.encode("utf-8")) + _key(2, 5) + _float32(value)


SESSION_START = 1   # SessionLog.SessionStatus START


def event(wall_time: float, step: int, *, file_version: str | None = None,
          values: dict[str, float] | None = None, session_status: int | None = None) -> bytes:
  """An Event message: wall_time (field 1, double), step (field 2, int64), and file_version
  (field 3), a summary (field 5) of scalar values or a session_log (field 7) of that status."""
  out = _key(1, 1) + struct.pack("<d", wall_time) + _key(2, 0) + _varint(int(step))
  if file_version is not None:
    out += _bytes_field(3, file_version.encode("utf-8"))
  if values is not None:
    summary = b"".join(_bytes_field(1, scalar_value(t, v)) for t, v in values.items())
    out += _bytes_field(5, summary)
  if session_status is not None:
    out += _bytes_field(7, _key(1, 0) + _varint(session_status))
  return out


def _host() -> str:
  return socket.gethostname() or "localhost"


def numbers(values: dict, prefix: str = "") -> dict[str, float]:
  """The numeric entries of `values` (real numbers, numpy's too; bools left out) as floats, keys
  prefixed."""
  return {prefix + k: float(v) for k, v in values.items()
          if isinstance(v, numbers_lib.Real) and not isinstance(v, (bool, np.bool_))}


class EventWriter:
  """Scalar events appended to one event file of `folder`, made at the first write (a run with
  nothing to write leaves no file behind)."""

  def __init__(self, folder: str | os.PathLike):
    self.folder = pathlib.Path(folder)
    self.path: pathlib.Path | None = None

  def _open(self, now: float, step: int) -> pathlib.Path:
    """Creates the event file (a name of its own: never one an earlier writer made) with its
    file_version record and a SessionLog START at `step`, the step of its first point (module
    docstring)."""
    base = f"{PREFIX}{int(now):010d}.{_host()}.{os.getpid()}"
    head = (record(event(now, 0, file_version=FILE_VERSION))
            + record(event(now, step, session_status=SESSION_START)))
    with files.storage_errors(self.folder / base, WHAT):
      for n in range(1000):
        path = self.folder / (base if n == 0 else f"{base}.{n}")
        try:
          with path.open("xb") as f:
            f.write(head)
          return path
        except FileExistsError:
          continue
      raise FileExistsError(f"{base}: every name is taken")

  def scalars(self, step: int, values: dict, *, prefix: str = "",
              wall_time: float | None = None) -> int:
    """Appends one event at `step` holding the numeric entries of `values` (tags: prefix + key);
    returns how many it holds (0: nothing written)."""
    scalars = numbers(values, prefix)
    if not scalars:
      return 0
    now = time.time() if wall_time is None else float(wall_time)
    if self.path is None:
      self.path = self._open(now, step)
    data = record(event(now, step, values=scalars))
    with files.storage_errors(self.path, WHAT), self.path.open("ab") as f:
      f.write(data)
    return len(scalars)


REPORT = ".report."


def replace_report(folder: str | os.PathLike, name: str, step: int, values: dict, *,
                   prefix: str = "", wall_time: float | None = None) -> pathlib.Path | None:
  """Writes the numeric entries of `values` (tags: prefix + key) as the one event file of report
  `name` in `folder`, in one rename (files.atomic_file), and then removes the files of the same
  report written before (on any host): TensorBoard shows the report's last numbers. No START
  event: a report's points drop no other points. Returns the file's path (None: no numbers, and
  nothing changed)."""
  if not name or "/" in name:
    raise ValueError(f"a report name is a plain file name part, got {name!r}")
  scalars = numbers(values, prefix)
  if not scalars:
    return None
  folder = pathlib.Path(folder)
  now = time.time() if wall_time is None else float(wall_time)
  path = folder / f"{PREFIX}{int(now):010d}.{_host()}{REPORT}{name}"
  with files.atomic_file(path, WHAT) as f:
    f.write(record(event(now, 0, file_version=FILE_VERSION))
            + record(event(now, step, values=scalars)))
  with files.storage_errors(folder, WHAT):
    for old in folder.glob(f"{PREFIX}*{REPORT}{glob.escape(name)}"):
      if old != path:
        old.unlink(missing_ok=True)
  return path
