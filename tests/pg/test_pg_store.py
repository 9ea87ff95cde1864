"""pg_store.PostgresStore against a real PostgreSQL server (tests/pg/conftest.py starts one):
round trip, duplicates across store objects, concurrent writers never make a follower skip a seq,
another router's namespace refused, unreachable servers, kill -9 after an acknowledged write,
lost connections, damaged rows."""
from __future__ import annotations

import pathlib
import signal
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import psycopg
import pytest

from gp_jax import errors
from gp_jax import paths
from gp_jax.serving.state import postgres
from gp_jax.serving.state import postgres_conn
from gp_jax.serving.state import store_api

pytestmark = pytest.mark.pg

ROW_DIM, NUM_HUBS = 6, 4   # as tests/pg/pg_writer.py
WRITER = pathlib.Path(__file__).with_name("pg_writer.py")


def _store(url, namespace, **kw) -> postgres.PostgresStore:
  return postgres.PostgresStore(url, row_dim=kw.pop("row_dim", ROW_DIM),
                                num_hubs=kw.pop("num_hubs", NUM_HUBS), namespace=namespace, **kw)


def _fb(rid: str, n: int = 2, value: float = 1.0, key: str | None = None,
        score: float = 0.5) -> store_api.Feedback:
  rows = (np.arange(n * ROW_DIM, dtype=np.float32).reshape(n, ROW_DIM) + value) / 7.0
  return store_api.Feedback(0, rid, key, score, rows, np.arange(n, dtype=np.int32) % NUM_HUBS)


def _writer(url, namespace, prefix, n, hold_s=0.0) -> subprocess.Popen:
  return subprocess.Popen([sys.executable, str(WRITER), url, namespace, prefix, str(n),
                           str(hold_s)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, cwd=paths.REPO_ROOT)


def _sql(url, query, params=()):
  with psycopg.connect(url, autocommit=True) as conn:
    cur = conn.execute(query, params)
    return cur.fetchall() if cur.description else None


def test_round_trip(pg_url, namespace):
  with _store(pg_url, namespace) as s:
    assert s.load() is None   # a new namespace: the caller seeds it
    base_rows = np.random.default_rng(0).normal(size=(5, ROW_DIM)).astype(np.float32)
    base_hubs = np.array([0, 1, 2, 3, 0], np.int32)
    header = {"capacity": 100, "served_rows": 0, "workdir": "/runs/x", "feedback_ids": []}
    s.write_base(base_rows, base_hubs, header, seq=0)
    acked = [s.add_feedback(_fb(f"c{i}", n=1 + i, value=i, key="alice" if i else None,
                                score=i / 4)) for i in range(3)]
    assert [f.seq for f in acked] == [1, 2, 3]
    seqs = [s.append_route({"type": "route", "id": f"c{i}", "answer": f"a{i}\x00",
                            "cost_usd": 0.25 * i}) for i in range(4)]
    assert seqs == [1, 2, 3, 4]
  with _store(pg_url, namespace) as s:   # a new connection, as after a restart
    got = s.load()
    np.testing.assert_array_equal(got.rows, base_rows)
    np.testing.assert_array_equal(got.hubs, base_hubs)
    assert got.rows.dtype == np.float32 and got.hubs.dtype == np.int32
    assert got.header == header and got.base_seq == 0
    assert [(f.seq, f.rid, f.key, f.score) for f in got.feedback] == [
        (1, "c0", None, 0.0), (2, "c1", "alice", 0.25), (3, "c2", "alice", 0.5)]
    for f, a in zip(got.feedback, acked):
      np.testing.assert_array_equal(f.rows, a.rows)
      np.testing.assert_array_equal(f.hubs, a.hubs)
    assert [f.seq for f in s.feedback_after(1)] == [2, 3] and s.feedback_after(3) == []
    assert s.has_feedback("c1") and not s.has_feedback("c3")
    r = s.route("c1")
    assert r["seq"] == 2 and r["answer"] == "a1\x00" and r["feedback"] == 0.25
    assert "feedback" not in s.route("c3") and s.route("nope") is None
    assert [r["seq"] for r in s.routes_after(0, 2)] == [1, 2]
    assert [r["id"] for r in s.routes_after(2, 10)] == ["c2", "c3"]
    assert s.routes_after(4, 10) == []
    # Compaction: a base at seq 2 holds c0, c1; load returns only the feedback after it.
    s.write_base(base_rows[:2], base_hubs[:2], dict(header, served_rows=3), seq=2)
    got = s.load()
    assert got.base_seq == 2 and len(got.rows) == 2 and [f.seq for f in got.feedback] == [3]
    # A replica that is behind cannot put an older base back.
    s.write_base(base_rows, base_hubs, header, seq=1)
    assert s.load().base_seq == 2


def test_compaction_keeps_folded_rows_for_followers_then_drops_them(pg_url, namespace):
  empty = np.zeros((0, ROW_DIM), np.float32), np.zeros(0, np.int32)
  with _store(pg_url, namespace) as s, _store(pg_url, namespace, keep_folded_rows_s=0.5) as t:
    s.write_base(*empty, {}, seq=0)
    for i in range(4):
      s.add_feedback(_fb(f"c{i}"))
    s.write_base(*empty, {}, seq=2)   # rows kept an hour: a follower behind the base reads them
    t.write_base(*empty, {}, seq=3)   # another replica's newer base, its rows kept 0.5 s
    assert [f.seq for f in s.feedback_after(0)] == [1, 2, 3, 4]
    time.sleep(1.0)
    t.write_base(*empty, {}, seq=4)
    assert s.feedback_after(4) == [] and s.load().base_seq == 4
    with pytest.raises(errors.DataError, match="feedback 1 was folded into a newer memory base.*restart it"):
      s.feedback_after(0)
    assert s.has_feedback("c0")   # the ids stay: a second feedback is still refused
    with pytest.raises(store_api.DuplicateFeedback):
      s.add_feedback(_fb("c0"))


def test_duplicate_refused_across_store_objects(pg_url, namespace):
  a, b = _store(pg_url, namespace), _store(pg_url, namespace)
  try:
    assert a.add_feedback(_fb("x")).seq == 1
    assert b.has_feedback("x")
    with pytest.raises(store_api.DuplicateFeedback, match="'x' already has feedback"):
      b.add_feedback(_fb("x", value=9))
    # At the same moment from two replicas: exactly one wins.
    results = {}
    barrier = threading.Barrier(2)

    def send(name, store):
      barrier.wait()
      try:
        results[name] = store.add_feedback(_fb("y")).seq
      except store_api.DuplicateFeedback:
        results[name] = "duplicate"
    threads = [threading.Thread(target=send, args=(n, s)) for n, s in (("a", a), ("b", b))]
    for t in threads:
      t.start()
    for t in threads:
      t.join(30)
    assert sorted(map(str, results.values())) == ["2", "duplicate"]
    # A refused duplicate takes no seq: the next feedback follows without a gap.
    assert b.add_feedback(_fb("z")).seq == 3
    assert [f.rid for f in a.feedback_after(0)] == ["x", "y", "z"]
    np.testing.assert_array_equal(a.feedback_after(0)[0].rows, _fb("x").rows)   # the first one
  finally:
    a.close()
    b.close()


def test_concurrent_writers_never_make_a_follower_skip(pg_url, namespace):
  """Two processes add feedback and routes at once, each holding its transaction open after its
  seq is taken; a follower polling `seq > last` sees every seq, in order, with no gap."""
  n = 12
  with _store(pg_url, namespace) as follower:
    procs = [_writer(pg_url, namespace, p, n, hold_s=0.03) for p in ("a", "b")]
    seen, route_seen, last, last_route = [], [], 0, 0
    deadline = time.monotonic() + 120
    while len(seen) < 2 * n or len(route_seen) < 2 * n:
      assert time.monotonic() < deadline, [p.poll() for p in procs]
      new = follower.feedback_after(last)
      # Every poll continues exactly where the last ended: no seq committed later than a
      # larger one.
      assert [f.seq for f in new] == list(range(last + 1, last + 1 + len(new)))
      seen += new
      last = seen[-1].seq if seen else 0
      routes = follower.routes_after(last_route, 1000)
      assert [r["seq"] for r in routes] == list(range(last_route + 1, last_route + 1 + len(routes)))
      route_seen += routes
      last_route = route_seen[-1]["seq"] if route_seen else 0
      time.sleep(0.005)
    outs = []
    for p in procs:
      out, err = p.communicate(timeout=60)
      assert p.returncode == 0, err
      outs.append(out)
  acked = {tuple(line.split()[1:]) for out in outs for line in out.splitlines()
           if line.startswith("feedback ")}
  assert {(f.rid, str(f.seq)) for f in seen} == acked and len(acked) == 2 * n
  assert {r["id"] for r in route_seen} == {f.rid for f in seen}


def test_store_of_another_router_refused(pg_url, namespace):
  _store(pg_url, namespace).close()
  with pytest.raises(errors.DataError, match=rf"namespace '{namespace}' holds the memory of a "
                                             rf"router with row width {ROW_DIM}"):
    _store(pg_url, namespace, row_dim=ROW_DIM + 1)
  with pytest.raises(errors.DataError, match=f"{NUM_HUBS} \\(role, LLM\\) hubs"):
    _store(pg_url, namespace, num_hubs=NUM_HUBS + 2)
  _store(pg_url, namespace + "-other", row_dim=ROW_DIM + 1).close()   # its own namespace: fine


def test_two_replicas_start_at_once_on_a_new_database(pg_server, namespace):
  """The schema is created once even when replicas connect together (no 'already exists')."""
  url = pg_server[0]
  _sql(url, "CREATE DATABASE fresh_" + namespace.replace("-", "_"))
  fresh = url.rsplit("/", 1)[0] + "/fresh_" + namespace.replace("-", "_")
  errs, stores = [], []
  barrier = threading.Barrier(4)

  def start():
    barrier.wait()
    try:
      stores.append(_store(fresh, namespace))
    except Exception as e:   # noqa: BLE001 - the test reports whatever went wrong
      errs.append(e)
  threads = [threading.Thread(target=start) for _ in range(4)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(60)
  assert not errs and len(stores) == 4
  assert [s.add_feedback(_fb(f"r{i}")).seq for i, s in enumerate(stores)] == [1, 2, 3, 4]
  for s in stores:
    s.close()


def test_bad_rows_refused_and_nothing_stored(pg_url, namespace):
  with _store(pg_url, namespace) as s:
    bad = store_api.Feedback(0, "w", None, 0.5, np.zeros((2, ROW_DIM + 1), np.float32),
                             np.zeros(2, np.int32))
    with pytest.raises(errors.DataError, match="do not fit this router"):
      s.add_feedback(bad)
    with pytest.raises(errors.DataError, match="hubs outside"):
      s.add_feedback(store_api.Feedback(0, "w", None, 0.5, np.zeros((1, ROW_DIM), np.float32),
                                        np.array([NUM_HUBS], np.int32)))
    assert not s.has_feedback("w")
    assert s.add_feedback(_fb("w")).seq == 1


def test_damaged_rows_are_a_data_error(pg_url, namespace):
  with _store(pg_url, namespace) as s:
    s.write_base(np.zeros((1, ROW_DIM), np.float32), np.zeros(1, np.int32), {}, seq=0)
    s.add_feedback(_fb("ok"))
    s.add_feedback(_fb("torn"))
  _sql(pg_url, "UPDATE gp_jax_feedback SET rows = substring(rows from 1 for 10) "
               "WHERE namespace = %s AND rid = 'torn'", (namespace,))
  with _store(pg_url, namespace) as s:
    with pytest.raises(errors.DataError, match="feedback 2: 10 row bytes"):
      s.load()
    with pytest.raises(errors.DataError, match="feedback 2"):
      s.feedback_after(1)
  _sql(pg_url, "UPDATE gp_jax_base SET hubs = %s WHERE namespace = %s",
       (np.array([NUM_HUBS + 5], "<i4").tobytes(), namespace))
  with _store(pg_url, namespace) as s:
    with pytest.raises(errors.DataError, match="memory base.*hubs outside"):
      s.load()


def test_unreachable_server_is_one_quick_error(pg_url):
  secret = "s3cr3t-pw"
  with socket.socket() as closed:   # a port nothing listens on
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
  t0 = time.monotonic()
  with pytest.raises(errors.StorageError) as e:
    _store(f"postgresql://gp_jax:{secret}@127.0.0.1:{port}/gp_jax", "x", connect_timeout_s=2)
  assert time.monotonic() - t0 < 5
  assert f"127.0.0.1:{port}" in str(e.value) and secret not in str(e.value)
  # A server that accepts the connection and never answers: the connect timeout ends it.
  with socket.socket() as silent:
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)
    port = silent.getsockname()[1]
    t0 = time.monotonic()
    with pytest.raises(errors.StorageError, match=f"127.0.0.1:{port}.*timeout") as e:
      _store(f"postgresql://gp_jax:{secret}@127.0.0.1:{port}/gp_jax", "x", connect_timeout_s=2)
    assert 1.5 < time.monotonic() - t0 < 8 and secret not in str(e.value)
  # A wrong password: the server's words, not the password.
  wrong = pg_url.replace("gp_jax:", f"gp_jax:{secret}", 1)
  with pytest.raises(errors.StorageError, match="password authentication failed") as e:
    _store(wrong, "x", connect_timeout_s=2)
  assert secret not in str(e.value)
  for bad in (f"mysql://u:{secret}@127.0.0.1/db", f"postgresql://u:{secret}@127.0.0.1:http/db"):
    with pytest.raises(errors.ConfigError) as e:
      _store(bad, "x")
    assert secret not in str(e.value)
  with pytest.raises(errors.ConfigError, match="--memory_namespace"):
    _store(pg_url, "no spaces please")


def test_kill_9_after_acknowledged_writes_loses_nothing(pg_url, namespace):
  proc = _writer(pg_url, namespace, "k", 10_000)
  acked = {"route": {}, "feedback": {}}
  try:
    assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
    while len(acked["feedback"]) < 25:
      kind, rid, seq = proc.stdout.readline().split()
      acked[kind][rid] = int(seq)
  finally:
    proc.send_signal(signal.SIGKILL)   # right after an acknowledged add, mid-way through the next
    proc.wait(30)
  with _store(pg_url, namespace) as s:
    got = {f.rid: f.seq for f in s.feedback_after(0)}
    assert acked["feedback"].items() <= got.items()
    assert sorted(got.values()) == list(range(1, len(got) + 1))
    for rid, seq in acked["route"].items():
      assert s.route(rid)["seq"] == seq
    i = len(acked["feedback"]) - 1
    f = next(f for f in s.feedback_after(0) if f.rid == f"k-{i}")
    np.testing.assert_array_equal(f.rows, np.full((1 + i % 3, ROW_DIM), i, np.float32))


def test_lost_connection_reconnects_and_stores_once(pg_url, namespace):
  """The server ends the store's connection (a restart, a failover): an idle one is replaced on
  the next call; one lost mid-write is resolved by the write's token (stored once, not twice).
  The write holds its transaction open for 1 s, so its idle limit is raised above that."""
  limits = postgres_conn.SessionLimits(idle_in_transaction_s=5.0)
  with _store(pg_url, namespace, limits=limits) as s:
    assert s.add_feedback(_fb("before")).seq == 1

    def kill_backends():
      _sql(pg_url, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                   "application_name = 'gp_jax serve_router' AND pid <> pg_backend_pid()")
    kill_backends()   # idle connection gone
    assert s.add_feedback(_fb("after-idle")).seq == 2
    s._hold_before_commit_s = 1.0   # the write holds its transaction open; end it meanwhile
    killer = threading.Timer(0.4, kill_backends)
    killer.start()
    fb = s.add_feedback(_fb("mid-write"))
    killer.join()
    s._hold_before_commit_s = 0.0
    assert fb.seq == 3   # retried on a new connection, with the seq the lost one gave back
    assert [f.rid for f in s.feedback_after(0)] == ["before", "after-idle", "mid-write"]
    assert s.append_route({"id": "r"}) == 1


def test_connection_lost_during_the_commit_is_resolved_by_the_token(pg_url, namespace,
                                                                     monkeypatch):
  """The server commits, then the connection drops before the client hears it: the store finds
  its write by the token and acknowledges it, instead of writing it again or calling it lost."""
  with _store(pg_url, namespace) as s:
    real_exit = psycopg.Transaction.__exit__
    drops = []

    def exit_then_drop(self, exc_type, exc, tb):
      out = real_exit(self, exc_type, exc, tb)
      if exc_type is None and not drops:   # committed; the reply "never arrives"
        drops.append(1)
        self._conn.close()
        raise psycopg.OperationalError("server closed the connection unexpectedly")
      return out
    monkeypatch.setattr(psycopg.Transaction, "__exit__", exit_then_drop)
    fb = s.add_feedback(_fb("once"))
    seq = s.append_route({"id": "once"})
    monkeypatch.undo()
    assert drops == [1] and fb.seq == 1 and seq == 1
    assert [(f.seq, f.rid) for f in s.feedback_after(0)] == [(1, "once")]
    assert [r["seq"] for r in s.routes_after(0, 10)] == [1]
