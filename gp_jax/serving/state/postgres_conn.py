"""Connections of the PostgreSQL store (postgres.PostgresStore): the URL, how a server is named in
messages, and the limits every connection runs under.

Limits (`SessionLimits`, set on each connection when it is opened). They bound what a replica
that stalls (a stopped or starved process, a lost network, a host that went away) can do to the
others: every replica takes the same counter row lock for each write, so a session that sits
in a transaction holding it would otherwise stop every replica's completions.
  - idle_in_transaction_session_timeout (0.5 s): the server ends a session of this store that
    waits for its client inside a transaction, which releases its locks. The store's own
    transactions are a few statements sent back to back (milliseconds); the bulk ones (load,
    write_base) allow themselves `bulk_idle_s` (60 s) with SET LOCAL.
  - lock_timeout (5 s): the longest a statement waits for a lock (a session that is not this
    store's, and so not bound by the timeout above, can still hold the counter row); the write
    then fails with nothing stored (503, retry).
  - statement_timeout (60 s): the longest one statement runs.
  - TCP keepalives, both ways: the client (libpq) and the server each probe an idle connection
    after 10 s, every 5 s, and give it up after 3 unanswered probes, so a peer that vanished
    without closing its socket is noticed in about 25 s; the server also checks every 5 s
    whether the client of a running statement is still there.
"""
from __future__ import annotations

import dataclasses
import math
import re
import threading
import time
import urllib.parse

import psycopg
from psycopg import errors as pg_errors

from gp_jax import errors

# What a lost connection raises: the network or server went away, or the server ended an idle
# transaction's session (see the idle limit).
LOST = (psycopg.OperationalError, pg_errors.IdleInTransactionSessionTimeout)


@dataclasses.dataclass(frozen=True)
class Where:
  """The server as messages name it: host:port/dbname (never the password)."""
  host: str
  port: str
  dbname: str

  def __str__(self) -> str:
    return f"PostgreSQL at {self.host}:{self.port}/{self.dbname}"


@dataclasses.dataclass(frozen=True)
class SessionLimits:
  """What every connection of the store runs under (module docstring); seconds."""
  connect_timeout_s: float = 10.0
  statement_timeout_s: float = 60.0
  lock_timeout_s: float = 5.0
  idle_in_transaction_s: float = 0.5
  bulk_idle_s: float = 60.0
  keepalive_idle_s: int = 10
  keepalive_interval_s: int = 5
  keepalive_count: int = 3
  client_check_s: float = 5.0


def parse_url(url: str) -> tuple[Where, str]:
  """(where, password) of a postgresql:// URL; ConfigError when it is not one."""
  if not isinstance(url, str) or not re.match(r"^postgres(ql)?://", url):
    raise errors.ConfigError("--memory_url must be a postgresql://USER:PASSWORD@HOST:PORT/DB URL, "
                             f"got {redact_url(str(url))!r}")
  try:
    info = psycopg.conninfo.conninfo_to_dict(url)
  except psycopg.ProgrammingError:
    raise errors.ConfigError(f"--memory_url {redact_url(url)!r} is not a valid PostgreSQL URL") \
        from None
  host = info.get("host") or "localhost"
  if str(host).startswith("/"):
    raise errors.ConfigError("--memory_url must name a TCP host (HOST:PORT), not a Unix socket")
  port = str(info.get("port") or 5432)
  if not port.isdigit() or not 0 < int(port) < 65536:
    raise errors.ConfigError(f"--memory_url {redact_url(url)!r}: port {port!r} is not a number "
                             "in 1..65535")
  return (Where(str(host), port, str(info.get("dbname") or info.get("user") or "")),
          str(info.get("password") or ""))


def redact_url(url: str) -> str:
  try:
    parts = urllib.parse.urlsplit(url)
    if parts.password:
      netloc = parts.netloc.replace(":" + parts.password + "@", ":***@", 1)
      return urllib.parse.urlunsplit(parts._replace(netloc=netloc))
  except ValueError:
    return "<unparsable URL>"
  return url


def reason(e: BaseException) -> str:
  """The server's or libpq's own words, first line only (no internals, no traceback)."""
  text = str(e).strip() or type(e).__name__
  return text.splitlines()[0]


def connect(url: str, where: Where, limits: SessionLimits, clean) -> psycopg.Connection:
  """A new autocommit connection with `limits` in force; StorageError (its text passed through
  `clean`, which hides the password) when it cannot be opened."""
  t0 = time.monotonic()
  try:
    conn = psycopg.connect(url, autocommit=True,
                           connect_timeout=max(2, math.ceil(limits.connect_timeout_s)),
                           application_name="gp_jax serve_router", keepalives=1,
                           keepalives_idle=limits.keepalive_idle_s,
                           keepalives_interval=limits.keepalive_interval_s,
                           keepalives_count=limits.keepalive_count)
  except psycopg.Error as e:
    raise errors.StorageError(f"{where} cannot be reached after {time.monotonic() - t0:.1f} s: "
                              f"{clean(reason(e))}") from None
  ms = lambda s: int(s * 1000)   # noqa: E731
  try:
    conn.execute(
        "SET synchronous_commit TO on; "
        f"SET statement_timeout TO {ms(limits.statement_timeout_s)}; "
        f"SET lock_timeout TO {ms(limits.lock_timeout_s)}; "
        f"SET idle_in_transaction_session_timeout TO {ms(limits.idle_in_transaction_s)}; "
        f"SET tcp_keepalives_idle TO {int(limits.keepalive_idle_s)}; "
        f"SET tcp_keepalives_interval TO {int(limits.keepalive_interval_s)}; "
        f"SET tcp_keepalives_count TO {int(limits.keepalive_count)}; "
        f"SET client_connection_check_interval TO {ms(limits.client_check_s)}")
  except psycopg.Error as e:
    conn.close()
    raise errors.StorageError(f"{where}: {clean(reason(e))}") from None
  return conn


def is_lost(conn, e: BaseException) -> bool:
  """Whether `e` (one of LOST) left `conn` unusable: nothing of its transaction was stored."""
  return conn.broken or conn.closed or isinstance(e, pg_errors.IdleInTransactionSessionTimeout)


def allow_bulk_idle(conn, limits: SessionLimits) -> None:
  """Inside a bulk transaction (a base of up to ~100 MB is encoded or decoded between its
  statements): the idle limit of this transaction only."""
  conn.execute(f"SET LOCAL idle_in_transaction_session_timeout TO "
               f"{int(limits.bulk_idle_s * 1000)}")


class Line:
  """One connection and the lock that keeps it to one transaction at a time."""

  def __init__(self):
    self.lock = threading.RLock()
    self.conn: psycopg.Connection | None = None
