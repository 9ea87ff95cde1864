"""A served router's durable state in PostgreSQL, shared by replicas (`--memory_url=postgresql://`).

`PostgresStore` implements store_api.ServedStore. Several routers ("replicas") that open the same
database and namespace share one history memory, one set of feedback ids and one route log.

The tables (one database holds any number of namespaces) and their creation are in
postgres_schema.py.

Sequence numbers: a write takes the next seq by updating its namespace's counter row in the same
transaction as the insert. The row lock is held to commit, so the writes of one kind commit one
after another in seq order, and a seq is never skipped (an aborted write, a duplicate say, rolls
its counter update back too). A follower that has seen seq N and later reads `seq > N` therefore
never misses a row: every row with a smaller seq was committed before. (A BIGSERIAL would hand out
seqs at insert and could commit 8 before 7; a follower reading between them would skip 7.)

Durability: every write is one transaction committed with synchronous_commit=on, so a method
returns only after the server has flushed it to its write-ahead log. When the connection fails
while a write is under way, the store reconnects and looks the write up by a token it carried:
written -> the call succeeds; not written -> one retry, then StorageError with nothing stored.

Compaction: `write_base(seq)` replaces the base only with a newer one (replicas compact on their
own, and one that is behind cannot put an older base back). It drops the row data of feedback the
new base holds once that feedback is older than `keep_folded_rows_s` (an hour by default; the ids
stay, for duplicates), so a follower that falls behind by a few sync intervals, or by a
compaction that another replica wrote, still reads every row. One that is behind by more than
that gets a DataError from `feedback_after` and must reload (restart).
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
import threading
import time
import urllib.parse
import uuid

import numpy as np
import psycopg
from psycopg import errors as pg_errors

from gp_jax import errors
from gp_jax.serving.state import postgres_schema
from gp_jax.serving.state import store_api

_NAMESPACE = re.compile(r"^[A-Za-z0-9_.:-]{1,200}$")


@dataclasses.dataclass(frozen=True)
class _Where:
  """The server as messages name it: host:port/dbname (never the password)."""
  host: str
  port: str
  dbname: str

  def __str__(self) -> str:
    return f"PostgreSQL at {self.host}:{self.port}/{self.dbname}"


def _parse_url(url: str) -> tuple[_Where, str]:
  """(where, password) of a postgresql:// URL; ConfigError when it is not one."""
  if not isinstance(url, str) or not re.match(r"^postgres(ql)?://", url):
    raise errors.ConfigError("--memory_url must be a postgresql://USER:PASSWORD@HOST:PORT/DB URL, "
                             f"got {_redact_url(str(url))!r}")
  try:
    info = psycopg.conninfo.conninfo_to_dict(url)
  except psycopg.ProgrammingError:
    raise errors.ConfigError(f"--memory_url {_redact_url(url)!r} is not a valid PostgreSQL URL") \
        from None
  host = info.get("host") or "localhost"
  if str(host).startswith("/"):
    raise errors.ConfigError("--memory_url must name a TCP host (HOST:PORT), not a Unix socket")
  port = str(info.get("port") or 5432)
  if not port.isdigit() or not 0 < int(port) < 65536:
    raise errors.ConfigError(f"--memory_url {_redact_url(url)!r}: port {port!r} is not a number "
                             "in 1..65535")
  return (_Where(str(host), port, str(info.get("dbname") or
                                                               info.get("user") or "")),
          str(info.get("password") or ""))


def _redact_url(url: str) -> str:
  try:
    parts = urllib.parse.urlsplit(url)
    if parts.password:
      netloc = parts.netloc.replace(":" + parts.password + "@", ":***@", 1)
      return urllib.parse.urlunsplit(parts._replace(netloc=netloc))
  except ValueError:
    return "<unparsable URL>"
  return url


def _encode(rows: np.ndarray, hubs: np.ndarray) -> tuple[bytes, bytes]:
  return (np.ascontiguousarray(rows, dtype="<f4").tobytes(),
          np.ascontiguousarray(hubs, dtype="<i4").tobytes())


class PostgresStore:
  """store_api.ServedStore in PostgreSQL (module docstring). `shared`: other processes add
  feedback too, so a server follows `feedback_after`; `kind`: what /v1/memory reports.

  Args:
    url: postgresql://USER:PASSWORD@HOST:PORT/DB.
    row_dim, num_hubs: what this router's history rows look like.
    namespace: the shared state's name; replicas of one router use the same one.
    connect_timeout_s: how long a connection attempt may take before StorageError.
    statement_timeout_s: the longest one statement (a lock wait included) may run.
    keep_folded_rows_s: how long the rows of feedback that a base holds stay readable by
      `feedback_after` (followers behind the base).
  Raises:
    ConfigError: a malformed URL or namespace.
    StorageError: the server cannot be reached or refuses the login (named host:port/db).
    DataError: the namespace was made by a router with another row width or hub count.
  """

  shared = True
  kind = "postgresql"

  def __init__(self, url: str, *, row_dim: int, num_hubs: int, namespace: str,
               connect_timeout_s: float = 10.0, statement_timeout_s: float = 60.0,
               keep_folded_rows_s: float = 3600.0):
    self.where, self._password = _parse_url(url)
    if not isinstance(namespace, str) or not _NAMESPACE.match(namespace):
      raise errors.ConfigError(f"--memory_namespace must be 1-200 characters of letters, digits "
                               f"and _.:-, got {namespace!r}")
    self.url, self.namespace = url, namespace
    self.row_dim, self.num_hubs = int(row_dim), int(num_hubs)
    self.connect_timeout_s, self.statement_timeout_s = connect_timeout_s, statement_timeout_s
    self.keep_folded_rows_s = float(keep_folded_rows_s)
    # Two connections, one transaction at a time on each: small reads and writes, and the bulk
    # ones (a base of up to ~100 MB), which would otherwise hold up every feedback meanwhile.
    self._small, self._bulk = _Line(), _Line()
    self._hold_before_commit_s = 0.0   # tests: widens the window between seq and commit
    with self._small.lock:
      self._connect(self._small)
    self._run("create the schema", postgres_schema.create_schema, self.where)
    self._run("register the namespace", self._register_namespace)

  # ---- connection ----------------------------------------------------------------------------------
  def _clean(self, text: str) -> str:
    text = " ".join(str(text).split())
    if self._password:
      text = text.replace(self._password, "***")
    return text

  def _connect(self, line: "_Line") -> psycopg.Connection:
    if line.conn is not None and not line.conn.closed and not line.conn.broken:
      return line.conn
    self._drop(line)
    t0 = time.monotonic()
    try:
      conn = psycopg.connect(self.url, autocommit=True,
                             connect_timeout=max(2, math.ceil(self.connect_timeout_s)),
                             application_name="gp_jax serve_router")
    except psycopg.Error as e:
      raise errors.StorageError(
          f"{self.where} cannot be reached after {time.monotonic() - t0:.1f} s: "
          f"{self._clean(_reason(e))}") from None
    try:
      conn.execute("SET synchronous_commit TO on")
      conn.execute(f"SET statement_timeout TO {int(self.statement_timeout_s * 1000)}")
    except psycopg.Error as e:
      conn.close()
      raise errors.StorageError(f"{self.where}: {self._clean(_reason(e))}") from None
    line.conn = conn
    return conn

  @staticmethod
  def _drop(line: "_Line") -> None:
    if line.conn is not None:
      try:
        line.conn.close()
      except psycopg.Error:
        pass
      line.conn = None

  def _run(self, what: str, fn, *args, bulk: bool = False):
    """fn(conn, *args) in one transaction; a broken connection is replaced and the call retried
    once (reads and the idempotent steps only; writes that must not repeat use _write)."""
    line = self._bulk if bulk else self._small
    with line.lock:
      for attempt in (0, 1):
        conn = self._connect(line)
        try:
          with conn.transaction():
            return fn(conn, *args)
        except psycopg.OperationalError as e:
          if conn.broken or conn.closed:
            self._drop(line)
            if attempt == 0:
              continue
          raise errors.StorageError(f"{self.where}: could not {what}: "
                                    f"{self._clean(_reason(e))}") from None
        except psycopg.Error as e:   # the server refused the statement (nothing was written)
          raise errors.StorageError(f"{self.where}: could not {what}: "
                                    f"{self._clean(_reason(e))}") from None

  def _write(self, what: str, table: str, fn, *args):
    """A write fn(conn, token, *args) -> result in one transaction, acknowledged only once
    committed. A connection lost before the commit was sent: nothing was stored, one retry on a
    new connection. Lost during the commit: the write's token tells whether it was stored (yes:
    its result; no: one retry). Otherwise StorageError, and nothing was stored."""
    line = self._small
    with line.lock:
      for attempt in (0, 1):
        token = uuid.uuid4()
        conn = self._connect(line)
        committing = False
        try:
          with conn.transaction():
            out = fn(conn, token, *args)
            if self._hold_before_commit_s:
              time.sleep(self._hold_before_commit_s)
            committing = True
          return out
        except psycopg.OperationalError as e:
          lost = conn.broken or conn.closed
          if lost:
            self._drop(line)
          if lost and committing:   # the server may have committed before the connection went
            try:
              seq = self._run("check a write", _seq_of_token, table, token)
            except errors.StorageError as e2:
              raise errors.StorageError(
                  f"{self.where}: could not {what}: the connection was lost during the commit "
                  f"({self._clean(_reason(e))}) and whether it was stored cannot be checked: "
                  f"{e2}") from None
            if seq is not None:
              return seq
          if lost and attempt == 0:
            continue
          raise errors.StorageError(f"{self.where}: could not {what}: "
                                    f"{self._clean(_reason(e))}; nothing was stored") from None
        except psycopg.Error as e:   # refused by the server: the transaction was rolled back
          raise errors.StorageError(f"{self.where}: could not {what}: "
                                    f"{self._clean(_reason(e))}; nothing was stored") from None

  def _register_namespace(self, conn) -> None:
    conn.execute("INSERT INTO gp_jax_namespace (name, row_dim, num_hubs) VALUES (%s, %s, %s) "
                 "ON CONFLICT (name) DO NOTHING", (self.namespace, self.row_dim, self.num_hubs))
    row_dim, num_hubs = conn.execute(
        "SELECT row_dim, num_hubs FROM gp_jax_namespace WHERE name = %s",
        (self.namespace,)).fetchone()
    if (row_dim, num_hubs) != (self.row_dim, self.num_hubs):
      raise errors.DataError(
          f"{self.where}: namespace {self.namespace!r} holds the memory of a router with row "
          f"width {row_dim} and {num_hubs} (role, LLM) hubs; this router has row width "
          f"{self.row_dim} and {self.num_hubs} hubs (use another --memory_namespace)")
    conn.execute("INSERT INTO gp_jax_counter (namespace, kind) VALUES (%s, 'feedback'), "
                 "(%s, 'route') ON CONFLICT DO NOTHING", (self.namespace, self.namespace))

  def _next_seq(self, conn, kind: str) -> int:
    # The row lock on the counter is held until commit: writes of one kind commit in seq order.
    (seq,) = conn.execute("UPDATE gp_jax_counter SET value = value + 1 WHERE namespace = %s "
                          "AND kind = %s RETURNING value", (self.namespace, kind)).fetchone()
    return int(seq)

  # ---- decoding --------------------------------------------------------------------------------------
  def _decode(self, nrows: int, rows: bytes, hubs: bytes, where: str):
    if len(rows) != nrows * self.row_dim * 4 or len(hubs) != nrows * 4:
      raise errors.DataError(
          f"{self.where}: {where}: {len(rows)} row bytes and {len(hubs)} hub bytes do not hold "
          f"{nrows} rows of width {self.row_dim}")
    r = np.frombuffer(rows, dtype="<f4").reshape(nrows, self.row_dim).astype(np.float32)
    h = np.frombuffer(hubs, dtype="<i4").astype(np.int32)
    store_api.check_rows(r, h, row_dim=self.row_dim, num_hubs=self.num_hubs,
                         where=f"{self.where}: {where}")
    return r, h

  def _feedback(self, row) -> store_api.Feedback:
    seq, rid, key, score, nrows, rows, hubs = row
    if rows is None or hubs is None:
      raise errors.DataError(
          f"{self.where}: namespace {self.namespace!r}: feedback {seq} was folded into a newer "
          f"memory base and its rows dropped: this replica fell further behind than folded rows "
          f"are kept (restart it to reload the memory)")
    r, h = self._decode(int(nrows), bytes(rows), bytes(hubs), f"feedback {seq}")
    return store_api.Feedback(seq=int(seq), rid=rid, key=key, score=float(score), rows=r, hubs=h)

  # ---- ServedStore -------------------------------------------------------------------------------------
  def load(self) -> store_api.Restored | None:
    def read(conn):
      conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
      with conn.cursor(binary=True) as cur:
        base = cur.execute("SELECT seq, nrows, rows, hubs, header FROM gp_jax_base "
                           "WHERE namespace = %s", (self.namespace,)).fetchone()
        if base is None:
          return None
        seq, nrows, rows, hubs, header = base
        fbs = cur.execute(_FEEDBACK_SELECT + " AND seq > %s ORDER BY seq",
                          (self.namespace, seq)).fetchall()
      return seq, nrows, bytes(rows), bytes(hubs), header, fbs
    got = self._run("load the memory", read, bulk=True)
    if got is None:
      return None
    seq, nrows, rows, hubs, header, fbs = got
    r, h = self._decode(int(nrows), rows, hubs, "memory base")
    try:
      head = json.loads(header)
      if not isinstance(head, dict):
        raise ValueError("not an object")
    except ValueError as e:
      raise errors.DataError(f"{self.where}: memory base header is not a JSON object ({e})") \
          from None
    return store_api.Restored(rows=r, hubs=h, header=head, base_seq=int(seq),
                              feedback=[self._feedback(f) for f in fbs])

  def write_base(self, rows: np.ndarray, hubs: np.ndarray, header: dict, seq: int) -> None:
    rows, hubs = np.asarray(rows, np.float32), np.asarray(hubs, np.int32)
    store_api.check_rows(rows, hubs, row_dim=self.row_dim, num_hubs=self.num_hubs,
                         where="new memory base")
    text = json.dumps(header, sort_keys=True)
    rb, hb = _encode(rows, hubs)

    def write(conn):
      old = conn.execute("SELECT seq FROM gp_jax_base WHERE namespace = %s FOR UPDATE",
                         (self.namespace,)).fetchone()
      if old is not None and int(old[0]) >= int(seq):
        return   # another replica already wrote this base or a newer one
      conn.execute("INSERT INTO gp_jax_base (namespace, seq, nrows, rows, hubs, header) "
                   "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (namespace) DO UPDATE SET "
                   "seq = EXCLUDED.seq, nrows = EXCLUDED.nrows, rows = EXCLUDED.rows, "
                   "hubs = EXCLUDED.hubs, header = EXCLUDED.header, written = now()",
                   (self.namespace, int(seq), len(rows), rb, hb, text))
      # Feedback the new base holds, old enough that no follower still reads it: ids only.
      conn.execute("UPDATE gp_jax_feedback SET rows = NULL, hubs = NULL WHERE namespace = %s "
                   "AND seq <= %s AND rows IS NOT NULL AND created < now() - %s * interval "
                   "'1 second'", (self.namespace, int(seq), self.keep_folded_rows_s))
    # Idempotent (a newer-only replace), so a retry after a lost connection is safe.
    self._run("write the memory base", write, bulk=True)

  def add_feedback(self, fb: store_api.Feedback) -> store_api.Feedback:
    rows, hubs = np.asarray(fb.rows, np.float32), np.asarray(fb.hubs, np.int32)
    store_api.check_rows(rows, hubs, row_dim=self.row_dim, num_hubs=self.num_hubs,
                         where=f"feedback for {fb.rid!r}")
    if not (isinstance(fb.score, (int, float)) and math.isfinite(fb.score)):
      raise errors.DataError(f"feedback for {fb.rid!r}: score {fb.score!r} is not a number")
    rb, hb = _encode(rows, hubs)

    def write(conn, token):
      seq = self._next_seq(conn, "feedback")
      try:
        conn.execute("INSERT INTO gp_jax_feedback (namespace, seq, rid, key, score, nrows, rows, "
                     "hubs, token) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                     (self.namespace, seq, fb.rid, fb.key, float(fb.score), len(rows), rb, hb,
                      token))
      except pg_errors.UniqueViolation as e:
        if getattr(e.diag, "constraint_name", None) == "gp_jax_feedback_once":
          raise _Duplicate() from None
        raise
      return seq
    try:
      seq = self._write(f"store the feedback for {fb.rid!r}", "gp_jax_feedback", write)
    except _Duplicate:
      raise store_api.DuplicateFeedback(f"completion {fb.rid!r} already has feedback") from None
    return dataclasses.replace(fb, seq=int(seq), rows=rows, hubs=hubs)

  def feedback_after(self, seq: int) -> list[store_api.Feedback]:
    def read(conn):
      with conn.cursor(binary=True) as cur:
        return cur.execute(_FEEDBACK_SELECT + " AND seq > %s ORDER BY seq",
                           (self.namespace, int(seq))).fetchall()
    return [self._feedback(f) for f in self._run("read new feedback", read)]

  def has_feedback(self, rid: str) -> bool:
    return self._run("look up feedback", lambda conn: conn.execute(
        "SELECT 1 FROM gp_jax_feedback WHERE namespace = %s AND rid = %s",
        (self.namespace, rid)).fetchone() is not None)

  def append_route(self, record: dict) -> int:
    text = json.dumps(record, sort_keys=True)
    rid = str(record.get("id", ""))

    def write(conn, token):
      seq = self._next_seq(conn, "route")
      conn.execute("INSERT INTO gp_jax_route (namespace, seq, rid, record, token) "
                   "VALUES (%s, %s, %s, %s, %s)", (self.namespace, seq, rid, text, token))
      return seq
    return int(self._write(f"store the route record of {rid!r}", "gp_jax_route", write))

  def append_routes(self, records: list[dict]) -> list[int]:
    return [self.append_route(r) for r in records]   # one transaction each, as append_route

  def _route_record(self, row) -> dict:
    seq, text, score = row
    rec = json.loads(text)
    rec["seq"] = int(seq)
    if score is not None:
      rec["feedback"] = float(score)
    return rec

  def route(self, rid: str) -> dict | None:
    row = self._run("look up a route", lambda conn: conn.execute(
        _ROUTE_SELECT + " AND r.rid = %s ORDER BY r.seq DESC LIMIT 1",
        (self.namespace, self.namespace, rid)).fetchone())
    return None if row is None else self._route_record(row)

  def routes_after(self, seq: int, limit: int) -> list[dict]:
    rows = self._run("read routes", lambda conn: conn.execute(
        _ROUTE_SELECT + " AND r.seq > %s ORDER BY r.seq LIMIT %s",
        (self.namespace, self.namespace, int(seq), max(0, int(limit)))).fetchall())
    return [self._route_record(r) for r in rows]

  def close(self) -> None:
    for line in (self._small, self._bulk):
      with line.lock:
        self._drop(line)

  def __enter__(self) -> "PostgresStore":
    return self

  def __exit__(self, *exc) -> None:
    self.close()


_FEEDBACK_SELECT = ("SELECT seq, rid, key, score, nrows, rows, hubs FROM gp_jax_feedback "
                    "WHERE namespace = %s")
_ROUTE_SELECT = ("SELECT r.seq, r.record, f.score FROM gp_jax_route r LEFT JOIN gp_jax_feedback f "
                 "ON f.namespace = %s AND f.rid = r.rid WHERE r.namespace = %s")


class _Line:
  """One connection and the lock that keeps it to one transaction at a time."""

  def __init__(self):
    self.lock = threading.RLock()
    self.conn: psycopg.Connection | None = None


class _Duplicate(Exception):
  """Internal: the feedback insert hit the one-feedback-per-completion constraint."""


def _seq_of_token(conn, table: str, token) -> int | None:
  row = conn.execute(f"SELECT seq FROM {table} WHERE token = %s", (token,)).fetchone()
  return None if row is None else int(row[0])


def _reason(e: BaseException) -> str:
  """The server's or libpq's own words, first line only (no internals, no traceback)."""
  text = str(e).strip() or type(e).__name__
  return text.splitlines()[0]
