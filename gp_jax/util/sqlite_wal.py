"""Opening an SQLite file in WAL mode that several processes may open at the same moment.

sqlite3's busy timeout covers ordinary lock waits, but not all of them: while one connection is
switching a fresh file to WAL or building its shared-memory index, another connection's
`PRAGMA journal_mode=WAL` can fail at once with "database is locked" (seen with 3-4 processes
opening a new file together, about one open in ten). `open_wal` retries those transient errors,
with a short sleep, until the same timeout runs out.

A damaged file (truncated, overwritten, not a database) is a DataError naming it (`check_intact`
at open, `damaged` for errors while reading or writing), never a traceback and never a cache that
quietly starts over without its rows.
"""
from __future__ import annotations

import os
import sqlite3
import time
from typing import Sequence

from gp_jax import errors

_TRANSIENT = ("database is locked", "database is busy", "database table is locked")


def is_transient(e: sqlite3.OperationalError) -> bool:
  """Whether an error is another connection holding a lock (worth retrying)."""
  return any(s in str(e) for s in _TRANSIENT)


def open_wal(path: str | os.PathLike, statements: Sequence[str] = (), *, timeout_s: float = 60.0,
             retry_sleep_s: float = 0.01) -> sqlite3.Connection:
  """Connects read-write, switches to WAL, runs `statements` (e.g. CREATE TABLE IF NOT EXISTS).

  Transient lock errors are retried until `timeout_s` has passed; after that the last one is
  raised. Any other sqlite3.DatabaseError (e.g. the file is not a database) is raised at once.
  The connection allows use from several threads (check_same_thread=False); callers lock.
  """
  deadline = time.monotonic() + timeout_s
  db = sqlite3.connect(str(path), check_same_thread=False, timeout=timeout_s)
  try:
    while True:
      try:
        db.execute("PRAGMA journal_mode=WAL")
        for s in statements:
          db.execute(s)
        db.commit()
        return db
      except sqlite3.OperationalError as e:
        if not is_transient(e) or time.monotonic() >= deadline:
          raise
        db.rollback()
        time.sleep(retry_sleep_s)
  except BaseException:
    db.close()
    raise


def damaged(path: str | os.PathLike, what: str, e: sqlite3.DatabaseError, remedy: str
            ) -> errors.DataError:
  """The DataError for an SQLite file that cannot be read: "<path>: <what> is damaged (...)"."""
  if isinstance(e, sqlite3.OperationalError) and is_transient(e):
    return errors.DataError(f"{path}: {what} stayed locked by another process ({e})")
  return errors.DataError(f"{path}: {what} is damaged or not an SQLite database ({e}); {remedy}")


def check_intact(db: sqlite3.Connection, path: str | os.PathLike, what: str, remedy: str) -> None:
  """Runs SQLite's quick_check (every page read once, ~1 s per few hundred MB), so that a damaged
  file is refused when it is opened rather than failing, or losing rows, in the middle of a run.

  Raises:
    DataError: the file is damaged; names it, what it holds and `remedy`.
  """
  try:
    rows = db.execute("PRAGMA quick_check").fetchall()
  except sqlite3.DatabaseError as e:
    raise damaged(path, what, e, remedy) from None
  if rows != [("ok",)]:
    first = rows[0][0] if rows else "no answer"
    raise errors.DataError(f"{path}: {what} is damaged (SQLite quick_check: {first}); {remedy}")
