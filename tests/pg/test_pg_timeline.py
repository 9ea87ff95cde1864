"""The PostgreSQL store's epochs (gp_jax/serving/state/postgres_timeline.py) and connection limits
(postgres_conn.py), store objects against a real server: a feedback counter that goes backwards
(lowered by hand, or a promoted standby that lost the last rows) is detected, no seq a replica
has passed is handed out again, and a follower that applies what `feedback_after` hands it, as
the served memory does, ends with every stored feedback; a session of the store that sits idle
in a transaction holding the counter row is ended by the server within its limit."""
from __future__ import annotations

import logging
import time

import numpy as np
import psycopg
import pytest

from gp_jax.serving.state import postgres
from gp_jax.serving.state import postgres_conn
from gp_jax.serving.state import postgres_timeline
from gp_jax.serving.state import store_api

pytestmark = pytest.mark.pg

ROW_DIM, NUM_HUBS = 6, 4
EPOCH_1 = 1 << postgres_timeline.EPOCH_BITS


def _store(url, namespace) -> postgres.PostgresStore:
  return postgres.PostgresStore(url, row_dim=ROW_DIM, num_hubs=NUM_HUBS, namespace=namespace)


def _fb(rid: str) -> store_api.Feedback:
  rows = np.full((2, ROW_DIM), len(rid), np.float32)
  return store_api.Feedback(0, rid, None, 0.5, rows, np.arange(2, dtype=np.int32))


def _sql(url, query, params=()):
  with psycopg.connect(url, autocommit=True) as conn:
    cur = conn.execute(query, params)
    return cur.fetchall() if cur.description else None


class Follower:
  """What memory.ServedMemory.sync and apply do with `feedback_after`: rows with a seq above the
  last applied, ids applied once."""

  def __init__(self, store):
    self.store, self.last_seq, self.applied = store, 0, []

  def sync(self) -> None:
    for fb in self.store.feedback_after(self.last_seq):
      if fb.seq > self.last_seq:
        self.last_seq = fb.seq
        if fb.rid not in self.applied:
          self.applied.append(fb.rid)


def _counter(url, ns, kind):
  return _sql(url, "SELECT value FROM gp_jax_counter WHERE namespace = %s AND kind = %s",
              (ns, kind))[0][0]


def test_counter_lowered_by_hand_starts_a_new_epoch(pg_url, namespace, caplog):
  caplog.set_level(logging.WARNING, logger="gp_jax.serving.state.postgres")
  with _store(pg_url, namespace) as a, _store(pg_url, namespace) as b:
    fa, fb_ = Follower(a), Follower(b)
    for i in range(5):
      (a if i % 2 else b).add_feedback(_fb(f"old-{i}"))
    fa.sync(), fb_.sync()
    assert fa.last_seq == fb_.last_seq == 5
    _sql(pg_url, "UPDATE gp_jax_counter SET value = 2 WHERE namespace = %s AND kind = "
                 "'feedback'", (namespace,))
    # A's next write would get seq 3, which both have passed (and which a row holds).
    new = a.add_feedback(_fb("new-0"))
    assert new.seq > EPOCH_1 and _counter(pg_url, namespace, "epoch") == 1
    assert len(caplog.records) == 1 and "started epoch 1 (was 0)" in caplog.records[0].message
    assert "the feedback counter is at 2" in caplog.records[0].message or \
        "a new seq" in caplog.records[0].message
    fa.sync(), fb_.sync()
    assert "another replica started epoch 1" in caplog.records[-1].message
    b.add_feedback(_fb("new-1"))
    fa.sync(), fb_.sync()
    want = [f"old-{i}" for i in range(5)] + ["new-0", "new-1"]
    assert fa.applied == want and fb_.applied == want
    seqs = [r[0] for r in _sql(pg_url, "SELECT seq FROM gp_jax_feedback WHERE namespace = %s "
                                       "ORDER BY seq", (namespace,))]   # no seq twice
    assert len(seqs) == len(set(seqs)) == 7 and min(seqs[5:]) > EPOCH_1
    # The epoch replaced by hand: an event too, and nothing is skipped after it.
    _sql(pg_url, "UPDATE gp_jax_counter SET value = 77 WHERE namespace = %s AND kind = 'epoch'",
         (namespace,))
    a.add_feedback(_fb("new-2"))
    fa.sync(), fb_.sync()
    assert fa.applied == fb_.applied == want + ["new-2"]
    assert a._timeline.epoch == b._timeline.epoch == 77


def test_standby_that_lost_the_last_rows(pg_url, namespace, caplog):
  """What a promoted async standby holds: the last rows and the counter behind. A replica that
  was behind writes at once (it does not know); the replicas that were ahead find the rows at
  the seqs they applied changed and still apply the new feedback."""
  caplog.set_level(logging.WARNING, logger="gp_jax.serving.state.postgres")
  with _store(pg_url, namespace) as a, _store(pg_url, namespace) as b, \
       _store(pg_url, namespace) as late:
    fa, fb_ = Follower(a), Follower(b)
    for i in range(6):
      a.add_feedback(_fb(f"old-{i}"))
    fa.sync(), fb_.sync()
    assert fb_.last_seq == 6
    # The failover: rows 5 and 6 lost, the counter at 4.
    _sql(pg_url, "DELETE FROM gp_jax_feedback WHERE namespace = %s AND seq > 4", (namespace,))
    _sql(pg_url, "UPDATE gp_jax_counter SET value = 4 WHERE namespace = %s AND kind = "
                 "'feedback'", (namespace,))
    # `late` has seen nothing: its writes take 5 and 6 again, the counter is back at 6.
    assert [late.add_feedback(_fb(f"new-{i}")).seq for i in range(2)] == [5, 6]
    fb_.sync()   # B applied old-5 as 5 and old-5 is gone: an event
    assert "this replica applied it as the feedback for 'old-5'" in caplog.text
    assert fb_.applied[-2:] == ["new-0", "new-1"]
    after = late.add_feedback(_fb("new-2"))
    assert after.seq > EPOCH_1   # past everything any replica has passed
    fa.sync(), fb_.sync()
    for f in (fa, fb_):
      assert f.applied == [f"old-{i}" for i in range(6)] + ["new-0", "new-1", "new-2"]
    # A replica restarted now loads exactly what the database holds.
    with _store(pg_url, namespace) as fresh:
      fresh.write_base(np.zeros((0, ROW_DIM), np.float32), np.zeros(0, np.int32), {}, 0)
      got = fresh.load()
      assert [f.rid for f in got.feedback] == ([f"old-{i}" for i in range(4)]
                                               + ["new-0", "new-1", "new-2"])


def test_write_base_past_the_counter_is_not_written(pg_url, namespace):
  with _store(pg_url, namespace) as a:
    for i in range(3):
      a.add_feedback(_fb(f"f-{i}"))
    empty = (np.zeros((0, ROW_DIM), np.float32), np.zeros(0, np.int32), {})
    a.write_base(*empty, 9)   # a memory ahead of the database's counter
    assert _sql(pg_url, "SELECT count(*) FROM gp_jax_base WHERE namespace = %s",
                (namespace,))[0][0] == 0
    a.write_base(*empty, 3)
    assert _sql(pg_url, "SELECT seq FROM gp_jax_base WHERE namespace = %s",
                (namespace,))[0][0] == 3


def test_session_idle_in_a_transaction_is_ended_and_releases_the_counter(pg_url, namespace):
  """A replica's connection (the store's limits) stalls inside a transaction holding the counter
  row: the server ends it after the idle limit, and another replica's write goes through."""
  with _store(pg_url, namespace) as a, _store(pg_url, namespace) as b:
    held = postgres_conn.connect(pg_url, a.where, a.limits, str)
    held.execute("BEGIN")
    held.execute("SELECT value FROM gp_jax_counter WHERE namespace = %s FOR UPDATE",
                 (namespace,))
    t0 = time.monotonic()
    seq = b.append_route({"id": "r"})
    took = time.monotonic() - t0
    assert seq == 1 and took < a.limits.idle_in_transaction_s + 0.4, took
    with pytest.raises(postgres_conn.LOST):   # the server ended it
      held.execute("SELECT 1")
    held.close()
    settings = dict(a._connect(a._small).execute(
        "SELECT name, setting FROM pg_settings WHERE name IN ('idle_in_transaction_session_"
        "timeout', 'lock_timeout', 'statement_timeout', 'tcp_keepalives_idle')").fetchall())
    assert settings == {"idle_in_transaction_session_timeout": "500", "lock_timeout": "5000",
                        "statement_timeout": "60000", "tcp_keepalives_idle": "10"}


def test_served_memories_reload_what_the_database_holds(pg_url, namespace, caplog):
  """A promoted standby that lost the last two feedback rows: both replicas' served memories
  (memory.ServedMemory, as a server runs them) end holding exactly what the database holds, the
  lost feedback gone from them too, and follow the feedback written after the event."""
  import asyncio
  from gp_jax.graph import history as history_lib
  from gp_jax.serving.state import memory as memory_lib
  caplog.set_level(logging.WARNING)

  def served(store):
    mem = memory_lib.ServedMemory(history_lib.HistoryMemory(ROW_DIM, NUM_HUBS, capacity=1000),
                                  None, store)
    mem.restore(store.load())
    return mem
  with _store(pg_url, namespace) as a, _store(pg_url, namespace) as b:
    first = served(a)
    a.write_base(*first.snapshot())   # as a server does when the store holds no memory yet
    ma, mb = served(a), served(b)
    for i in range(6):
      ma.apply(a.add_feedback(_fb(f"fb-{i}")))
    asyncio.run(mb.sync())
    assert len(ma.history) == len(mb.history) == 12 and list(mb.feedback_ids) == list(ma.feedback_ids)
    _sql(pg_url, "DELETE FROM gp_jax_feedback WHERE namespace = %s AND seq > 4", (namespace,))
    _sql(pg_url, "UPDATE gp_jax_counter SET value = 4 WHERE namespace = %s AND kind = "
                 "'feedback'", (namespace,))
    asyncio.run(ma.sync())
    asyncio.run(mb.sync())
    held = [f"fb-{i}" for i in range(4)]
    for mem in (ma, mb):
      assert list(mem.feedback_ids) == held and len(mem.history) == 8
    assert sum("served memory reloaded" in r.message for r in caplog.records) == 2
    mb.apply(b.add_feedback(_fb("after")))
    asyncio.run(ma.sync())
    assert list(ma.feedback_ids) == held + ["after"] and len(ma.history) == 10
    np.testing.assert_array_equal(ma.history.rows, mb.history.rows)
