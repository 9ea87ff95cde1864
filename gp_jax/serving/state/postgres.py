"""A served router's durable state in PostgreSQL, shared by replicas (`--memory_url=postgresql://`).

`PostgresStore` implements store_api.ServedStore. Several routers ("replicas") that open the same
database and namespace share one history memory, one set of feedback ids and one route log.

The tables (one database holds any number of namespaces) and their creation are in
postgres_schema.py.

Sequence numbers: a write takes the next seq by updating its namespace's counter row in the same
transaction as the insert, the row lock held to commit, so writes of one kind commit in seq order
and no seq is skipped (an aborted write rolls its counter update back too): a follower that has
seen N and reads `seq > N` misses no row. (A BIGSERIAL could commit 8 before 7.) Every sync also
checks the numbering's epoch (postgres_timeline.py): a counter that went back below what this
replica has seen (a failover to a standby that was behind) starts a new epoch whose numbers are
above every older one; `epoch_events` counts them, and the served memory then reloads.
Every connection runs under limits (postgres_conn.SessionLimits) that end a stalled replica's
transaction, and with it its hold on the counter row, after 0.5 s.

Durability: every write is one transaction committed with synchronous_commit=on (flushed to the
write-ahead log before a method returns). A connection lost during a write: the store reconnects
and looks the write up by its token; not written -> one retry, then StorageError, nothing stored.

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
import logging
import math
import re
import time
import uuid

import numpy as np
import psycopg
from psycopg import errors as pg_errors

from gp_jax import errors
from gp_jax.serving.state import postgres_conn
from gp_jax.serving.state import postgres_schema
from gp_jax.serving.state import postgres_timeline as timeline
from gp_jax.serving.state import store_api

_log = logging.getLogger(__name__)
_reason = postgres_conn.reason

_NAMESPACE = re.compile(r"^[A-Za-z0-9_.:-]{1,200}$")


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
    limits: every connection's limits (postgres_conn.SessionLimits; replaces the two above).
  Raises:
    ConfigError: a malformed URL or namespace.
    StorageError: the server cannot be reached or refuses the login (named host:port/db).
    DataError: the namespace was made by a router with another row width or hub count.
  """

  shared = True
  kind = "postgresql"

  def __init__(self, url: str, *, row_dim: int, num_hubs: int, namespace: str,
               connect_timeout_s: float = 10.0, statement_timeout_s: float = 60.0,
               keep_folded_rows_s: float = 3600.0,
               limits: postgres_conn.SessionLimits | None = None):
    self.where, self._password = postgres_conn.parse_url(url)
    if not isinstance(namespace, str) or not _NAMESPACE.match(namespace):
      raise errors.ConfigError(f"--memory_namespace must be 1-200 characters of letters, digits "
                               f"and _.:-, got {namespace!r}")
    self.url, self.namespace = url, namespace
    self.row_dim, self.num_hubs = int(row_dim), int(num_hubs)
    self.limits = limits or postgres_conn.SessionLimits(connect_timeout_s=connect_timeout_s,
                                                        statement_timeout_s=statement_timeout_s)
    self.keep_folded_rows_s = float(keep_folded_rows_s)
    # Two connections, one transaction at a time on each: small reads and writes, and the bulk
    # ones (a base of up to ~100 MB), which would otherwise hold up every feedback meanwhile.
    self._small, self._bulk = postgres_conn.Line(), postgres_conn.Line()
    self._hold_before_commit_s = 0.0   # tests: widens the window between seq and commit
    self._timeline = timeline.Timeline()   # guarded by self._small.lock
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

  def _connect(self, line: postgres_conn.Line) -> psycopg.Connection:
    if line.conn is not None and not line.conn.closed and not line.conn.broken:
      return line.conn
    self._drop(line)
    line.conn = postgres_conn.connect(self.url, self.where, self.limits, self._clean)
    return line.conn

  @staticmethod
  def _drop(line: postgres_conn.Line) -> None:
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
        except postgres_conn.LOST as e:
          if postgres_conn.is_lost(conn, e):
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
        except postgres_conn.LOST as e:
          lost = postgres_conn.is_lost(conn, e)
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
                 "(%s, 'route'), (%s, 'epoch') ON CONFLICT DO NOTHING", (self.namespace,) * 3)
    self._timeline.epoch = timeline.counters(conn, self.namespace).get("epoch", 0)

  def _next_seq(self, conn, kind: str) -> int:
    # The row lock on the counter is held until commit: writes of one kind commit in seq order.
    (seq,) = conn.execute("UPDATE gp_jax_counter SET value = value + 1 WHERE namespace = %s "
                          "AND kind = %s RETURNING value", (self.namespace, kind)).fetchone()
    if seq <= self._timeline.seen[kind]:   # a number this replica has passed (rolled back)
      raise timeline.Regressed()
    return int(seq)

  def _insert(self, conn, sql: str, args: tuple) -> None:
    """An insert that takes a new seq: a row already holding it means the counter went back."""
    try:
      conn.execute(sql, args)
    except pg_errors.UniqueViolation as e:
      name = getattr(e.diag, "constraint_name", None)
      if name == "gp_jax_feedback_once":
        raise _Duplicate() from None
      if name in ("gp_jax_feedback_pkey", "gp_jax_route_pkey"):
        raise timeline.Regressed() from None
      raise

  def _written(self, what: str, table: str, fn, *args) -> int:
    """_write, once more after an epoch advance when the write found the counter behind."""
    try:
      return int(self._write(what, table, fn, *args))
    except timeline.Regressed:
      with self._small.lock:
        event = self._run("check the counters", timeline.check, self.namespace, self._timeline)
        self._advance(event or ("a new seq is one this replica has seen", True), 0)
      try:
        return int(self._write(what, table, fn, *args))
      except timeline.Regressed:
        raise errors.StorageError(f"{self.where}: could not {what}: the counter is still behind "
                                  "after a new epoch; nothing was stored") from None

  def _advance(self, event: tuple[str, bool], after: int) -> None:
    """An epoch event in its own transaction, then the Timeline moves on (postgres_timeline)."""
    adv = self._run("handle a counter that went backwards", timeline.advance, self.namespace,
                    self._timeline, *event, after, _FEEDBACK_SELECT)
    timeline.adopt(self._timeline, adv)
    _log.warning("%s", timeline.message(self.where, self.namespace, adv))

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
      postgres_conn.allow_bulk_idle(conn, self.limits)
      epoch = timeline.counters(conn, self.namespace).get("epoch", 0)
      with conn.cursor(binary=True) as cur:
        base = cur.execute("SELECT seq, nrows, rows, hubs, header FROM gp_jax_base "
                           "WHERE namespace = %s", (self.namespace,)).fetchone()
        if base is None:
          return epoch, None
        seq, nrows, rows, hubs, header = base
        fbs = cur.execute(_FEEDBACK_SELECT + " AND seq > %s ORDER BY seq",
                          (self.namespace, seq)).fetchall()
      return epoch, (seq, nrows, bytes(rows), bytes(hubs), header, fbs)
    epoch, got = self._run("load the memory", read, bulk=True)
    with self._small.lock:   # a fresh start of the numbering this replica has seen
      self._timeline = timeline.Timeline(epoch=epoch)
      if got is not None:
        self._timeline.saw("feedback", int(got[0]))
        for f in got[5]:
          self._timeline.saw("feedback", int(f[0]), f[1])
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
      postgres_conn.allow_bulk_idle(conn, self.limits)
      old = conn.execute("SELECT seq FROM gp_jax_base WHERE namespace = %s FOR UPDATE",
                         (self.namespace,)).fetchone()
      if old is not None and int(old[0]) >= int(seq):
        return   # another replica already wrote this base or a newer one
      if int(seq) > timeline.counters(conn, self.namespace).get("feedback", 0):
        return   # the counter went back below this memory: the next sync's epoch event first
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
      self._insert(conn, "INSERT INTO gp_jax_feedback (namespace, seq, rid, key, score, nrows, "
                   "rows, hubs, token) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                   (self.namespace, seq, fb.rid, fb.key, float(fb.score), len(rows), rb, hb,
                    token))
      return seq
    try:
      seq = self._written(f"store the feedback for {fb.rid!r}", "gp_jax_feedback", write)
    except _Duplicate:
      raise store_api.DuplicateFeedback(f"completion {fb.rid!r} already has feedback") from None
    with self._small.lock:
      self._timeline.saw("feedback", seq, fb.rid)
    return dataclasses.replace(fb, seq=int(seq), rows=rows, hubs=hubs)

  def feedback_after(self, seq: int) -> list[store_api.Feedback]:
    """Also the epoch check (postgres_timeline): after an event, a caller behind the event's
    cut gets the feedback the database holds after its base, numbered up to the cut."""
    seq = int(seq)
    with self._small.lock:
      tl = self._timeline
      event = self._run("check the feedback counter", timeline.check, self.namespace, tl)
      if event is not None:
        self._advance(event, seq)

      def read(conn):
        with conn.cursor(binary=True) as cur:
          return cur.execute(_FEEDBACK_SELECT + " AND seq > %s ORDER BY seq",
                             (self.namespace, max(seq, tl.cut))).fetchall()
      rows = self._run("read new feedback", read)
      out = []
      if seq < tl.cut:
        out = [dataclasses.replace(self._feedback(r), seq=s) for s, r in tl.replay if s > seq]
      else:
        tl.replay = []   # the caller is past the cut
      out += [self._feedback(f) for f in rows]
      for f in rows:
        tl.saw("feedback", int(f[0]), f[1])
      tl.saw("feedback", seq)
    return out

  def has_feedback(self, rid: str) -> bool:
    return self._run("look up feedback", lambda conn: conn.execute(
        "SELECT 1 FROM gp_jax_feedback WHERE namespace = %s AND rid = %s",
        (self.namespace, rid)).fetchone() is not None)

  def append_route(self, record: dict) -> int:
    text = json.dumps(record, sort_keys=True)
    rid = str(record.get("id", ""))

    def write(conn, token):
      seq = self._next_seq(conn, "route")
      self._insert(conn, "INSERT INTO gp_jax_route (namespace, seq, rid, record, token) "
                   "VALUES (%s, %s, %s, %s, %s)", (self.namespace, seq, rid, text, token))
      return seq
    seq = self._written(f"store the route record of {rid!r}", "gp_jax_route", write)
    with self._small.lock:
      self._timeline.saw("route", seq)
    return seq

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

  epoch_events = property(lambda self: self._timeline.events,
                          doc="Epoch events handled since the last `load` (ServedMemory reloads).")

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


class _Duplicate(Exception):
  """Internal: the feedback insert hit the one-feedback-per-completion constraint."""


def _seq_of_token(conn, table: str, token) -> int | None:
  row = conn.execute(f"SELECT seq FROM {table} WHERE token = %s", (token,)).fetchone()
  return None if row is None else int(row[0])
