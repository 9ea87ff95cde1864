"""TensorBoard event files (gp_jax/util/tb_events.py), read back by the tests' own reader."""
import errno
import math
import pathlib

import pytest

from gp_jax import errors
from gp_jax.util import tb_events
from tests.util import tb_reader


@pytest.mark.parametrize("crc", [tb_events.crc32c, tb_reader.crc32c])
def test_crc32c_known_vectors(crc):
  assert crc(b"123456789") == 0xE3069283   # the CRC catalogue's check value
  assert crc(b"") == 0
  assert crc(bytes(32)) == 0x8A9136AA        # RFC 3720, B.4: 32 bytes of zeros
  assert crc(b"\xff" * 32) == 0x62A8AB43     # ... 32 bytes of 0xff
  assert crc(bytes(range(32))) == 0x46DD794E  # ... 32 incrementing bytes


def test_a_record_is_framed_with_both_masked_crcs():
  data = b"some event bytes"
  rec = tb_events.record(data)
  assert len(rec) == 8 + 4 + len(data) + 4
  assert tb_reader.records(rec) == [data]
  bad = bytearray(rec)
  bad[14] ^= 1
  with pytest.raises(AssertionError, match="data CRC"):
    tb_reader.records(bytes(bad))


def test_scalars_round_trip(tmp_path):
  w = tb_events.EventWriter(tmp_path)
  assert w.path is None and not list(tmp_path.iterdir())   # nothing written: no file
  assert w.scalars(48, {"loss": 0.25, "episodes": 48, "name": "skipped", "flag": True,
                        "none": None, "big": 1e300, "nan": float("nan")},
                   wall_time=1700000000.5) == 4
  assert w.scalars(-3, {"loss": -1.5}, prefix="x/") == 1
  assert w.scalars(7, {"text": "only strings"}) == 0
  (path,) = tb_reader.event_files(tmp_path)
  assert path == w.path and path.name.startswith("events.out.tfevents.")
  first, start, second, third = tb_reader.read_events(path)
  assert first["file_version"] == "brain.Event:2" and "values" not in first
  # A resumed run's file drops the points of earlier files from its first step on.
  assert start["session_status"] == 1 and start["step"] == 48 and "values" not in start
  assert second["step"] == 48 and second["wall_time"] == 1700000000.5
  v = second["values"]
  assert set(v) == {"loss", "episodes", "big", "nan"}
  assert v["loss"] == 0.25 and v["episodes"] == 48.0
  assert v["big"] == math.inf and math.isnan(v["nan"])   # beyond float32: infinity
  assert third["step"] == -3 and third["values"] == {"x/loss": -1.5}


def test_every_writer_opens_a_file_of_its_own(tmp_path):
  a, b = tb_events.EventWriter(tmp_path), tb_events.EventWriter(tmp_path)
  a.scalars(1, {"v": 1.0}, wall_time=100.0)
  b.scalars(2, {"v": 2.0}, wall_time=100.0)   # same second, same process
  files = tb_reader.event_files(tmp_path)
  assert len(files) == 2 and a.path != b.path
  assert [tb_reader.read_events(p)[2]["values"]["v"] for p in files] == [1.0, 2.0]


def test_a_report_file_replaces_the_previous_one(tmp_path):
  run = tb_events.EventWriter(tmp_path)
  run.scalars(8, {"loss": 1.0})
  first = tb_events.replace_report(tmp_path, "eval", 0, {"reward": 0.5, "name": "x"},
                                   prefix="eval/", wall_time=100.0)
  assert first.name.endswith(".report.eval")
  assert tb_events.replace_report(tmp_path, "eval", 0, {"name": "no numbers"}) is None
  second = tb_events.replace_report(tmp_path, "eval", 0, {"reward": 0.75}, prefix="eval/")
  other = tb_events.replace_report(tmp_path, "eval2", 0, {"reward": 0.25})
  assert set(tb_reader.event_files(tmp_path)) == {run.path, second, other}
  version, ev = tb_reader.read_events(second)        # no START: it drops no run's points
  assert version["file_version"] == "brain.Event:2" and ev == dict(
      step=0, wall_time=ev["wall_time"], values={"eval/reward": 0.75})
  assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_a_write_error_is_a_storage_error_naming_the_file(tmp_path, monkeypatch):
  w = tb_events.EventWriter(tmp_path)
  w.scalars(0, {"v": 1.0})

  def full(self, *args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")
  monkeypatch.setattr(pathlib.Path, "open", full)
  with pytest.raises(errors.StorageError, match=r"tfevents.*cannot write the TensorBoard events "
                                                r"\(No space left on device\)"):
    w.scalars(1, {"v": 2.0})
  with pytest.raises(errors.StorageError, match="TensorBoard events"):
    tb_events.EventWriter(tmp_path / "missing").scalars(0, {"v": 1.0})
