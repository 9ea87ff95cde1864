"""A reader of TensorBoard event files for the tests, written apart from gp_jax/util/tb_events.py:
its own CRC32C (bit by bit, no table) and its own protobuf decoding, so a mistake of the writer
is not repeated here.

`read_events(path)` checks every record's framing (both masked CRC32C values) and decodes each
Event into a dict: wall_time, step, and file_version, values {tag: simple_value} or
session_status (SessionLog.status: 1 = START).
"""
import pathlib
import struct


def crc32c(data: bytes) -> int:
  """CRC32C (Castagnoli, reflected polynomial 0x82F63B78), one bit at a time."""
  c = 0xFFFFFFFF
  for b in data:
    c ^= b
    for _ in range(8):
      c = (c >> 1) ^ (0x82F63B78 * (c & 1))
  return c ^ 0xFFFFFFFF


def masked(c: int) -> int:
  return ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def records(blob: bytes) -> list[bytes]:
  """The data of every record; AssertionError on a bad CRC or a truncated record."""
  out, pos = [], 0
  while pos < len(blob):
    assert pos + 12 <= len(blob), "truncated record header"
    header = blob[pos:pos + 8]
    (n,) = struct.unpack("<Q", header)
    (header_crc,) = struct.unpack("<I", blob[pos + 8:pos + 12])
    assert header_crc == masked(crc32c(header)), "length CRC"
    data = blob[pos + 12:pos + 12 + n]
    assert len(data) == n and pos + 16 + n <= len(blob), "truncated record"
    (data_crc,) = struct.unpack("<I", blob[pos + 12 + n:pos + 16 + n])
    assert data_crc == masked(crc32c(data)), "data CRC"
    out.append(data)
    pos += 16 + n
  return out


def fields(msg: bytes) -> list[tuple[int, int, object]]:
  """(field number, wire type, value) of a protobuf message: varints as unsigned ints, fixed64
  and fixed32 as raw bytes, length-delimited as bytes."""
  out, pos = [], 0

  def varint():
    nonlocal pos
    shift = value = 0
    while True:
      b = msg[pos]
      pos += 1
      value |= (b & 0x7F) << shift
      shift += 7
      if not b & 0x80:
        return value

  while pos < len(msg):
    key = varint()
    number, wire = key >> 3, key & 7
    if wire == 0:
      value = varint()
    elif wire == 1:
      value, pos = msg[pos:pos + 8], pos + 8
    elif wire == 5:
      value, pos = msg[pos:pos + 4], pos + 4
    elif wire == 2:
      n = varint()
      value, pos = msg[pos:pos + n], pos + n
    else:
      raise AssertionError(f"wire type {wire}")
    out.append((number, wire, value))
  return out


def event(data: bytes) -> dict:
  """An Event: wall_time (1, double), step (2, int64), file_version (3), summary (5) of
  Value{tag 1, simple_value 2 (float)} or session_log (7) SessionLog{status 1}."""
  ev = {"step": 0}
  for number, wire, value in fields(data):
    if number == 1:
      assert wire == 1
      ev["wall_time"] = struct.unpack("<d", value)[0]
    elif number == 2:
      assert wire == 0
      ev["step"] = value - (1 << 64) if value >= 1 << 63 else value
    elif number == 3:
      assert wire == 2
      ev["file_version"] = value.decode()
    elif number == 5:
      assert wire == 2
      values = {}
      for vn, vw, v in fields(value):
        assert (vn, vw) == (1, 2)
        parts = dict((n, (w, x)) for n, w, x in fields(v))
        assert parts[1][0] == 2 and parts[2][0] == 5
        values[parts[1][1].decode()] = struct.unpack("<f", parts[2][1])[0]
      ev["values"] = values
    elif number == 7:
      assert wire == 2
      ((sn, sw, status),) = fields(value)
      assert (sn, sw) == (1, 0)
      ev["session_status"] = status
    else:
      raise AssertionError(f"unexpected Event field {number}")
  return ev


def read_events(path) -> list[dict]:
  return [event(r) for r in records(pathlib.Path(path).read_bytes())]


def event_files(folder) -> list[pathlib.Path]:
  """The folder's event files in TensorBoard's order (by name)."""
  return sorted(p for p in pathlib.Path(folder).iterdir() if "tfevents" in p.name)
