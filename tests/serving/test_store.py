"""The file store and the served memory in process: journal damage vs. a torn tail, failed writes,
the folder lock, route-log seq, torn lines and rotation, and the per-key memory share."""
import asyncio
import io
import json
import os
import threading
import time
import types
import zlib

import numpy as np
import pytest

from gp_jax import errors
from gp_jax.graph import history as history_lib
from gp_jax.serving.state import journal as journal_lib
from gp_jax.serving.state import memory as memory_lib
from gp_jax.serving.state import route_log as route_log_lib
from gp_jax.serving.state import store
from gp_jax.serving.state import store_api

F, A = 5, 4


def _fb(i, n=2, key=None, rid=None):
  return store_api.Feedback(seq=0, rid=rid or f"id{i}", key=key, score=0.5,
                            rows=np.full((n, F), i, np.float32),
                            hubs=(np.arange(n, dtype=np.int32) + i) % A)


def _open(tmp_path, **kw) -> store.FileStore:
  return store.FileStore(tmp_path / "memory.npz", tmp_path / "routes.jsonl", row_dim=F,
                         num_hubs=A, **kw)


def _seeded(tmp_path, n_feedback=3) -> store.FileStore:
  st = _open(tmp_path)
  assert st.load() is None
  st.write_base(np.zeros((2, F), np.float32), np.array([0, 1], np.int32),
                dict(row_dim=F, num_hubs=A), 0)
  for i in range(1, n_feedback + 1):
    assert st.add_feedback(_fb(i)).seq == i
  return st


def test_feedback_is_numbered_durable_and_refused_twice(tmp_path):
  st = _seeded(tmp_path)
  with pytest.raises(store_api.DuplicateFeedback):
    st.add_feedback(_fb(2))
  assert [fb.seq for fb in st.feedback_after(1)] == [2, 3]
  st.close()
  st = _open(tmp_path)
  got = st.load()
  assert [(fb.seq, fb.rid, fb.score) for fb in got.feedback] == [(i, f"id{i}", 0.5)
                                                                  for i in (1, 2, 3)]
  assert st.has_feedback("id3") and not st.has_feedback("id4")
  with pytest.raises(store_api.DuplicateFeedback):   # across restarts too
    st.add_feedback(_fb(1))
  assert st.add_feedback(_fb(4)).seq == 4
  st.close()


def test_a_second_store_on_the_same_folder_is_refused(tmp_path):
  st = _seeded(tmp_path, 0)
  with pytest.raises(errors.ConfigError, match=f"in use by another router server .pid "
                     f"{os.getpid()}"):
    _open(tmp_path)
  st.close()
  _open(tmp_path).close()   # released on close


def test_a_damaged_record_in_the_middle_is_an_error_naming_it_never_a_cut(tmp_path):
  st = _seeded(tmp_path)
  st.close()
  journal = tmp_path / "memory.npz.journal"
  data = bytearray(journal.read_bytes())
  head = journal_lib._HEAD
  second = head.size + head.unpack_from(data)[2]   # offset of record 2
  for where in (second + 2, second + 10, second + head.size + 40):   # magic, len, payload
    bad = bytearray(data)
    bad[where] ^= 0x40
    journal.write_bytes(bytes(bad))
    st = _open(tmp_path)
    with pytest.raises(errors.DataError) as e:
      st.load()
    st.close()
    msg = str(e.value)
    assert str(journal) in msg and "record 2" in msg and f"byte offset {second}" in msg
    assert "--memory_recover" in msg
    assert journal.read_bytes() == bytes(bad)   # nothing cut
  # Recovery: the damaged journal is kept aside, the store starts from the records before it.
  st = _open(tmp_path, recover=True)
  got = st.load()
  assert [fb.rid for fb in got.feedback] == ["id1"]
  aside = list(tmp_path.glob("memory.npz.journal.damaged-*"))
  assert len(aside) == 1 and aside[0].read_bytes() == bytes(bad)
  assert st.add_feedback(_fb(9)).seq == 2
  st.close()
  assert [fb.rid for fb in _open(tmp_path).load().feedback] == ["id1", "id9"]


def test_a_torn_or_garbled_last_record_is_cut(tmp_path):
  st = _seeded(tmp_path)
  st.close()
  journal = tmp_path / "memory.npz.journal"
  data = journal.read_bytes()
  for tail in (data[:-5], data[:-5] + b"\0" * 5, data[:-1] + bytes([data[-1] ^ 1]),
               data + b"\0" * 100, data + b"GP"):
    journal.write_bytes(tail)
    st = _open(tmp_path)
    got = st.load()
    whole = 3 if tail.startswith(data) else 2
    assert [fb.seq for fb in got.feedback] == list(range(1, whole + 1))
    st.close()


def test_a_failed_write_stores_nothing_and_the_retry_succeeds(tmp_path, monkeypatch):
  st = _seeded(tmp_path)
  size = (tmp_path / "memory.npz.journal").stat().st_size
  real, fails = os.fsync, [1]

  def fsync(fd):   # fails once: the append's fsync (the cut back then succeeds)
    if fails:
      fails.pop()
      raise OSError(5, "Input/output error")
    return real(fd)

  monkeypatch.setattr(os, "fsync", fsync)
  with pytest.raises(errors.StorageError, match="Input/output error"):
    st.add_feedback(_fb(4))
  assert (tmp_path / "memory.npz.journal").stat().st_size == size   # the bytes were cut back
  assert not st.has_feedback("id4") and st.feedback_after(3) == []
  assert st.add_feedback(_fb(4)).seq == 4
  # When even the cut back fails, the journal's tail is unknown: no later feedback is accepted.
  monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(5, "I/O error")))
  for i in (5, 6):
    with pytest.raises(errors.StorageError):
      st.add_feedback(_fb(i))
  monkeypatch.setattr(os, "fsync", real)
  with pytest.raises(errors.StorageError, match="could not be undone"):
    st.add_feedback(_fb(7))
  st.close()
  st = _open(tmp_path)
  assert [fb.rid for fb in st.load().feedback] == ["id1", "id2", "id3", "id4"]
  st.close()


def test_journals_of_the_previous_format_are_read(tmp_path):
  st = _seeded(tmp_path, 0)
  st.close()
  buf = io.BytesIO()
  np.savez(buf, rows=np.ones((2, F), np.float32), hubs=np.array([1, 2], np.int32),
           id=np.array("old1"))
  payload = buf.getvalue()
  (tmp_path / "memory.npz.journal").write_bytes(
      journal_lib._HEAD_V1.pack(b"GPJ1", 1, len(payload), zlib.crc32(payload)) + payload)
  st = _open(tmp_path)
  got = st.load().feedback
  assert [(fb.seq, fb.rid, fb.key) for fb in got] == [(1, "old1", None)]
  assert st.add_feedback(_fb(2)).seq == 2
  st.close()
  st = _open(tmp_path)
  assert [fb.rid for fb in st.load().feedback] == ["old1", "id2"]
  st.close()


def test_concurrent_feedback_shares_writes_and_a_failed_write_fails_only_its_group(
    tmp_path, monkeypatch):
  st = _seeded(tmp_path, 0)
  real, calls, fail = os.fsync, [], threading.Event()

  def fsync(fd):   # a slow disk: feedback arriving meanwhile queues for the next write
    calls.append(fd)
    time.sleep(0.02)
    if fail.is_set():
      fail.clear()
      raise OSError(28, "No space left on device")
    return real(fd)

  monkeypatch.setattr(os, "fsync", fsync)

  def add_all(ids):
    out = {}

    def one(i):
      try:
        out[i] = st.add_feedback(_fb(i)).seq
      except errors.StorageError as e:
        out[i] = e
    threads = [threading.Thread(target=one, args=(i,)) for i in ids]
    for t in threads:
      t.start()
    for t in threads:
      t.join()
    return out

  got = add_all(range(1, 17))
  assert sorted(got.values()) == list(range(1, 17))
  assert len(calls) < 16   # fewer fsyncs than feedback: writes were shared
  fail.set()
  got = add_all(range(17, 33))
  failed = [i for i, v in got.items() if isinstance(v, Exception)]
  stored = sorted(v for v in got.values() if not isinstance(v, Exception))
  assert failed and stored == list(range(17, 17 + len(stored)))   # no gap in seq
  assert not any(st.has_feedback(f"id{i}") for i in failed)
  monkeypatch.setattr(os, "fsync", real)
  st.close()
  st = _open(tmp_path)
  assert sorted(int(fb.rid[2:]) for fb in st.load().feedback) == sorted(
      set(range(1, 33)) - set(failed))
  st.close()


def test_a_new_base_keeps_records_appended_after_its_snapshot(tmp_path):
  st = _seeded(tmp_path)
  st.write_base(np.zeros((8, F), np.float32), np.zeros(8, np.int32),
                dict(row_dim=F, num_hubs=A, feedback_ids=["id1", "id2"]), 2)
  assert st.journal_rows == 2   # record 3 stays in the journal
  st.close()
  got = _open(tmp_path).load()
  assert got.base_seq == 2 and len(got.rows) == 8 and [fb.seq for fb in got.feedback] == [3]


def _route(i):
  return dict(type="route", id=f"r{i}", created=1000.0 - i, calls=[], task="t")


def test_route_log_seq_torn_line_and_rotation(tmp_path):
  log = tmp_path / "routes.jsonl"
  rl = route_log_lib.RouteLog(log, segment_bytes=400)
  seqs = [rl.append(_route(i)) for i in range(10)]
  assert seqs == list(range(1, 11))
  rl.append(dict(type="feedback", id="r3", score=1.0, created=0.0))
  rl.close()
  segments = route_log_lib.log_segments(log)
  assert len(segments) > 2 and all(p.stat().st_size <= 400 for p in segments)
  # A crash mid-append leaves half a line at the end: cut at the next start, so the next record
  # is whole (it used to be glued to the torn line and lost).
  with open(segments[-1], "a") as f:
    f.write('{"type": "route", "id": "torn", "cre')
  rl = route_log_lib.RouteLog(log, segment_bytes=400)
  assert rl.cut_lines == 1 and rl.seq == 11
  assert rl.append(_route(99)) == 12
  rl.close()
  recs = list(route_log_lib.read_log(log))
  assert [r["seq"] for r in recs] == list(range(1, 13)) and recs[-1]["id"] == "r99"
  # Pages by seq, from RAM and (for records RAM no longer holds) from the files.
  rl = route_log_lib.RouteLog(log, keep=3, segment_bytes=400)
  for after in (0, 5):
    page = rl.after(after, 4)
    assert [r["seq"] for r in page] == [s for s in range(after + 1, 13) if s != 11][:4]
  assert rl.after(0, 100)[3]["feedback"] == 1.0   # r3 with its score
  assert [r["id"] for r in rl.after(10, 100)] == ["r99"]
  rl.close()


def test_route_log_batches_keep_references_in_ram_and_read_back(tmp_path):
  log = tmp_path / "routes.jsonl"
  rl = route_log_lib.RouteLog(log, segment_bytes=400)
  assert rl.append_many([_route(i) for i in range(6)]) == list(range(1, 7))
  rl.append(dict(type="feedback", id="r2", score=0.25, created=0.0))
  assert all(isinstance(r, route_log_lib._Ref) for r in rl.records.values())   # not the records
  got = rl.get("r2")
  assert got["id"] == "r2" and got["seq"] == 3 and got["feedback"] == 0.25 and got["task"] == "t"
  assert [r["seq"] for r in rl.after(2, 3)] == [3, 4, 5]
  assert len(route_log_lib.log_segments(log)) > 1   # the batch crossed a rollover
  rl.close()
  assert [r["id"] for r in route_log_lib.read_log(log)][:6] == [f"r{i}" for i in range(6)]


def test_a_route_log_without_files_keeps_a_bounded_amount_of_text(monkeypatch):
  monkeypatch.setattr(route_log_lib, "RAM_ONLY_BYTES", 100_000)
  rl = route_log_lib.RouteLog(None)
  for i in range(50):   # 50 records of 10 kB of text each: about 500 kB
    rl.append(dict(_route(i), query="q" * 10_000))
  assert 8 <= len(rl.records) <= 10 and rl.ram_bytes <= 100_000
  assert rl.get("r0") is None and rl.get("r49")["query"] == "q" * 10_000
  assert [r["id"] for r in rl.after(0, 100)] == [f"r{i}" for i in range(50 - len(rl.records), 50)]


def test_route_log_restarts_after_segments_are_removed(tmp_path):
  """Removing a stopped server's oldest segment loses only its records; removing the active one
  never makes the log reuse a seq or a segment name."""
  log = tmp_path / "routes.jsonl"
  rl = route_log_lib.RouteLog(log, segment_bytes=400)
  for i in range(12):
    rl.append(_route(i))
  rl.close()
  segments = route_log_lib.log_segments(log)
  first_ids = {rec["id"] for rec, _, _ in route_log_lib.read_segment(segments[0])}
  segments[0].unlink()
  rl = route_log_lib.RouteLog(log, segment_bytes=400)
  assert rl.seq == 12
  assert all(rl.get(f"r{i}") is None for i in range(12) if f"r{i}" in first_ids)
  assert rl.get("r11")["seq"] == 12   # the rest is still found (feedback finds its route)
  assert rl.append(_route(12)) == 13
  rl.close()
  last = route_log_lib.log_segments(log)[-1]
  last_name = last.name
  last.unlink()   # the active segment, while stopped
  rl = route_log_lib.RouteLog(log, segment_bytes=400)
  assert rl.append(_route(13)) == 14   # after the removed records' seqs, not a reuse
  rl.close()
  newest = route_log_lib.log_segments(log)[-1]
  assert newest.name != last_name and [r["id"] for r in route_log_lib.read_log(newest)] == ["r13"]
  for seg in route_log_lib.log_segments(log):   # every segment removed: still no reuse
    seg.unlink(missing_ok=True)
  rl = route_log_lib.RouteLog(log, segment_bytes=400)
  assert rl.append(_route(14)) == 15
  rl.close()


def test_route_log_retention_by_size_and_by_age(tmp_path):
  log = tmp_path / "routes.jsonl"
  rl = route_log_lib.RouteLog(log, segment_bytes=400, retention="1KiB")
  for i in range(40):
    rl.append(_route(i))
  segments = [p for p in route_log_lib.log_segments(log) if p.exists()]
  assert rl.removed_segments > 0 and sum(p.stat().st_size for p in segments) <= 1024 + 400
  kept = [r["id"] for r in route_log_lib.read_log(log)]
  assert kept[-1] == "r39" and "r0" not in kept
  assert rl.get("r0") is None and rl.get("r39")["seq"] == 40   # RAM follows the files
  assert [r["id"] for r in rl.after(0, 100)] == kept
  rl.close()
  for p in route_log_lib.log_segments(log):   # every closed segment written two days ago
    if p.exists():
      os.utime(p, (time.time() - 2 * 86400,) * 2)
  rl = route_log_lib.RouteLog(log, segment_bytes=400, retention="1d")
  left = [p for p in route_log_lib.log_segments(log) if p.exists()]
  assert len(left) == 1 and rl.append(_route(40)) == 41   # the active one is never removed
  rl.close()


@pytest.mark.parametrize("text,want", [("", (None, None)), ("7d", (7 * 86400.0, None)),
                                       ("10GiB", (None, 10 << 30)),
                                       ("12h, 500MiB", (12 * 3600.0, 500 << 20))])
def test_route_retention_parses(text, want):
  assert route_log_lib.parse_retention(text) == want


@pytest.mark.parametrize("text", ["7", "7 days", "10GB", "0d", "7d,8d", "-1h"])
def test_route_retention_refuses_what_it_cannot_read(text):
  with pytest.raises(errors.ConfigError, match="--route_retention"):
    route_log_lib.parse_retention(text)


def test_feedback_is_acknowledged_only_after_its_route_line_is_fsynced(tmp_path, monkeypatch):
  st = _seeded(tmp_path, n_feedback=0)
  st.append_routes([_route(1)])
  synced, real = [], os.fsync

  def fsync(fd):
    synced.append(os.readlink(f"/proc/self/fd/{fd}"))
    return real(fd)

  monkeypatch.setattr(os, "fsync", fsync)
  st.add_feedback(_fb(1, rid="r1"))
  assert synced[0].endswith("routes.jsonl")   # the route log first, then the journal
  assert any(p.endswith(".journal") for p in synced[1:])
  synced.clear()
  st.add_feedback(_fb(2, rid="r1x"))   # no route line written since: no route-log fsync
  assert not any(p.endswith("routes.jsonl") for p in synced)
  st.close()


# ---- the memory --------------------------------------------------------------------------------
class _Runner:
  """The policy's per-hub sums, as rollout.PolicyRunner keeps them (sum of rows per hub)."""
  summary = False

  def __init__(self):
    self.hub_sum, self.hub_count = np.zeros((A, F)), np.zeros(A)
    self.recomputes = 0

  def set_params(self, params, history):
    self.recomputes += 1
    self.hub_sum[:], self.hub_count[:] = 0, 0
    self.add_history(history.rows, history.hubs)

  def add_history(self, rows, hubs, sign=1.0):
    np.add.at(self.hub_sum, hubs, sign * rows.astype(np.float64))
    np.add.at(self.hub_count, hubs, sign)


def _memory(capacity=40, share=0.25, training=40):
  hist = history_lib.HistoryMemory(F, A, capacity)
  hist.add(np.full((training, F), -1, np.float32), np.arange(training) % A)
  space = types.SimpleNamespace(size=A, decode=lambda a: (types.SimpleNamespace(name="r"), f"l{a}"))
  mem = memory_lib.ServedMemory(hist, space, store=None, max_key_share=share)
  runner = _Runner()
  runner.set_params(None, hist)
  mem.attach(runner, None)
  return mem, runner


def _check_sums(mem, runner):
  want = _Runner()
  want.set_params(None, mem.history)
  np.testing.assert_allclose(runner.hub_sum, want.hub_sum)
  np.testing.assert_allclose(runner.hub_count, want.hub_count)


def test_a_flooding_key_churns_only_its_own_rows():
  mem, runner = _memory()
  for i in range(3):
    mem.apply(_fb(100 + i, n=2, key="bob"))          # 6 of bob's rows
  for i in range(50):
    mem.apply(_fb(i, n=3, key="mallory"))             # a flood: 150 rows
  per_key = mem.per_key()
  assert per_key == {"bob": 6, "mallory": 10}          # 10 = 0.25 * 40: capped
  assert len(mem.history) == 40
  training = int((mem.owners == memory_lib.NO_KEY).sum())
  assert training == 40 - 16                           # evicted only to make room for the cap
  # mallory keeps her newest rows
  kept = mem.history.rows[mem.owners == mem._key_index["mallory"]][:, 0]
  assert sorted(set(kept.tolist())) == [46.0, 47.0, 48.0, 49.0]
  _check_sums(mem, runner)
  assert runner.recomputes == 1 + 3                    # 150 evicted rows > capacity: recomputes
  assert mem.served_rows == 6 + 150


def test_without_keys_eviction_is_oldest_first_as_before():
  mem, runner = _memory(share=0.25)
  for i in range(30):
    out = mem.apply(_fb(i, n=2))
  assert out == dict(rows_added=2, rows_evicted=2)
  assert len(mem.history) == 40 and (mem.owners == memory_lib.NO_KEY).all()
  np.testing.assert_array_equal(mem.history.rows[:, 0], np.repeat(np.arange(10, 30), 2))
  _check_sums(mem, runner)


def test_the_key_share_replays_the_same_at_restore(tmp_path):
  st = _seeded(tmp_path, 0)
  mem, _ = _memory()
  mem.store = st
  base = mem.snapshot()
  st.write_base(*base)
  for i in range(20):
    st.add_feedback(_fb(i, n=3, key="k1" if i % 3 else "k2"))
  asyncio.run(mem.sync())
  st.close()
  st = _open(tmp_path)
  again, _ = _memory(training=0)
  again.restore(st.load())
  np.testing.assert_array_equal(again.history.rows, mem.history.rows)
  np.testing.assert_array_equal(again.history.hubs, mem.history.hubs)
  assert again.per_key() == mem.per_key() and again.last_seq == 20
  # A base written now holds the keys of its rows.
  st.write_base(*again.snapshot())
  st.close()
  third, _ = _memory(training=0)
  st = _open(tmp_path)
  third.restore(st.load())
  st.close()
  assert third.per_key() == mem.per_key()
  assert json.dumps(third.snapshot()[2]["row_keys"])
