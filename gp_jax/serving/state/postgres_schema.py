"""The tables of the PostgreSQL store (postgres.PostgresStore) and their creation.

Tables (created on connect when missing; one database holds any number of namespaces):
  gp_jax_namespace  (name, row_dim, num_hubs): what rows of this namespace look like; a router
                    with another row width or hub count is refused (DataError).
  gp_jax_counter    (namespace, kind, value): the last seq handed out, per kind
                    ('feedback', 'route').
  gp_jax_base       (namespace, seq, nrows, rows, hubs, header): the newest memory base.
  gp_jax_feedback   (namespace, seq, rid, key, score, nrows, rows, hubs, token, created);
                    UNIQUE (namespace, rid): a second feedback for one completion is refused,
                    whichever replica sends it.
  gp_jax_route      (namespace, seq, rid, record, token, created): the route log.
Rows are float32 little-endian bytes (bytea), hubs int32; their shapes are checked on read.
"""
from __future__ import annotations

from gp_jax import errors

SCHEMA_VERSION = 1
SCHEMA_LOCK = 7263510429   # pg_advisory_xact_lock key: one replica creates the tables at a time
SCHEMA = """
CREATE TABLE IF NOT EXISTS gp_jax_meta (key text PRIMARY KEY, value text NOT NULL);
CREATE TABLE IF NOT EXISTS gp_jax_namespace (
  name text PRIMARY KEY, row_dim integer NOT NULL, num_hubs integer NOT NULL,
  created timestamptz NOT NULL DEFAULT now());
CREATE TABLE IF NOT EXISTS gp_jax_counter (
  namespace text NOT NULL REFERENCES gp_jax_namespace (name), kind text NOT NULL,
  value bigint NOT NULL DEFAULT 0, PRIMARY KEY (namespace, kind));
CREATE TABLE IF NOT EXISTS gp_jax_base (
  namespace text PRIMARY KEY REFERENCES gp_jax_namespace (name), seq bigint NOT NULL,
  nrows integer NOT NULL, rows bytea NOT NULL, hubs bytea NOT NULL, header text NOT NULL,
  written timestamptz NOT NULL DEFAULT now());
CREATE TABLE IF NOT EXISTS gp_jax_feedback (
  namespace text NOT NULL REFERENCES gp_jax_namespace (name), seq bigint NOT NULL,
  rid text NOT NULL, key text, score double precision NOT NULL, nrows integer NOT NULL,
  rows bytea, hubs bytea, token uuid NOT NULL, created timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (namespace, seq), CONSTRAINT gp_jax_feedback_once UNIQUE (namespace, rid));
CREATE TABLE IF NOT EXISTS gp_jax_route (
  namespace text NOT NULL REFERENCES gp_jax_namespace (name), seq bigint NOT NULL,
  rid text NOT NULL, record text NOT NULL, token uuid NOT NULL,
  created timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (namespace, seq));
CREATE INDEX IF NOT EXISTS gp_jax_route_rid ON gp_jax_route (namespace, rid);
CREATE INDEX IF NOT EXISTS gp_jax_feedback_token ON gp_jax_feedback (token);
CREATE INDEX IF NOT EXISTS gp_jax_route_token ON gp_jax_route (token);
"""


def create_schema(conn, where) -> None:
  """Creates the tables that are missing, in one transaction of `conn`, one replica at a time.

  Raises:
    DataError: the tables were made for another schema version (`where` names the server).
  """
  conn.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
  conn.execute(SCHEMA)
  conn.execute("INSERT INTO gp_jax_meta (key, value) VALUES ('schema_version', %s) "
               "ON CONFLICT (key) DO NOTHING", (str(SCHEMA_VERSION),))
  (version,) = conn.execute("SELECT value FROM gp_jax_meta WHERE key = 'schema_version'"
                            ).fetchone()
  if version != str(SCHEMA_VERSION):
    raise errors.DataError(f"{where}: the gp_jax tables have schema version {version}; "
                           f"this code reads version {SCHEMA_VERSION}")
