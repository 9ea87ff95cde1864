"""open_wal: transient lock errors while switching to WAL are retried; real errors are not."""
import multiprocessing
import sqlite3

import pytest

from gp_jax.util import sqlite_wal


class _LockedAtFirst(sqlite3.Connection):
  """A connection whose first `fails` PRAGMA journal_mode calls report a lock, as a race does."""
  fails = 0

  def execute(self, sql, *args):
    if sql.startswith("PRAGMA journal_mode") and type(self).fails > 0:
      type(self).fails -= 1
      raise sqlite3.OperationalError("database is locked")
    return super().execute(sql, *args)


@pytest.fixture
def flaky_connect(monkeypatch):
  real = sqlite3.connect
  monkeypatch.setattr(sqlite_wal.sqlite3, "connect",
                      lambda *a, **kw: real(*a, factory=_LockedAtFirst, **kw))
  return _LockedAtFirst


def test_transient_lock_is_retried(flaky_connect, tmp_path):
  flaky_connect.fails = 3
  db = sqlite_wal.open_wal(tmp_path / "a.sqlite", ["CREATE TABLE IF NOT EXISTS t (x)"],
                           timeout_s=5, retry_sleep_s=0.001)
  assert flaky_connect.fails == 0
  assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
  assert db.execute("SELECT COUNT(*) FROM t").fetchone()[0] == 0


def test_lock_past_the_timeout_is_raised(flaky_connect, tmp_path):
  flaky_connect.fails = 10**9
  with pytest.raises(sqlite3.OperationalError, match="locked"):
    sqlite_wal.open_wal(tmp_path / "b.sqlite", timeout_s=0.05, retry_sleep_s=0.001)


def test_not_a_database_is_raised_at_once(tmp_path):
  path = tmp_path / "junk.sqlite"
  path.write_bytes(b"this is not an sqlite file, it is just text\n" * 100)
  with pytest.raises(sqlite3.DatabaseError):
    sqlite_wal.open_wal(path, ["CREATE TABLE IF NOT EXISTS t (x)"], timeout_s=30)


def _open_at_once(path, barrier):
  barrier.wait(30)
  db = sqlite_wal.open_wal(path, ["CREATE TABLE IF NOT EXISTS t (x PRIMARY KEY)"], timeout_s=30)
  with db:
    db.execute("INSERT OR IGNORE INTO t VALUES (1)")
  db.close()
  return True


def test_many_processes_open_a_new_file_together(tmp_path):
  """Four processes open each of 25 fresh files at the same moment (the race CI once hit)."""
  ctx = multiprocessing.get_context("spawn")
  with ctx.Manager() as manager, ctx.Pool(4) as procs:
    for trial in range(25):
      barrier = manager.Barrier(4)
      path = tmp_path / f"race{trial}.sqlite"
      assert procs.starmap(_open_at_once, [(path, barrier)] * 4) == [True] * 4
      assert sqlite3.connect(path).execute("SELECT COUNT(*) FROM t").fetchone()[0] == 1
