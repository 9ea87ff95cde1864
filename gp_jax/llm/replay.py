"""The replay cache: records every chat call of a pool in SQLite and answers repeats from it.

Key: sha256 of the canonical JSON of (catalog model name, messages, sampling params incl. seed).
The stored value is the whole Completion (text, tokens, $ cost, latency, error), so a run in
read-only mode gets exactly the answers, costs and latencies of the recorded run.

Modes:
  off         pass every call to the inner pool; nothing is read or written.
  read-write  answer from the cache when a successful answer is stored; otherwise call the inner
              pool and store what it returned (a stored failure is retried and replaced).
  read-only   answer only from the cache; a miss raises ReplayMissError (the run was not recorded
              with these prompts or params: a misconfiguration, not a backend fault). No inner pool
              is needed.

Safe with several writer processes: WAL journal (opened with retries, gp_jax/util/sqlite_wal.py), a
busy timeout, and insert-if-absent, after which the stored row (whichever process wrote it first)
is what every caller gets. Concurrent identical calls in one process share one inner call.
"""
from __future__ import annotations

import asyncio
import collections
import hashlib
import json
import os
import pathlib
import sqlite3
import threading
import time
from typing import Sequence

from gp_jax import errors
from gp_jax.llm import base
from gp_jax.util import sqlite_wal

MODES = ("off", "read-write", "read-only")
_SCHEMA = """CREATE TABLE IF NOT EXISTS completions (
  key TEXT PRIMARY KEY, model TEXT NOT NULL, request TEXT NOT NULL, completion TEXT NOT NULL,
  ok INTEGER NOT NULL, created REAL NOT NULL)"""


# What to do about a damaged replay file (the message of its DataError ends with this).
_REMEDY = ("restore it from a copy, or move it away to record the calls again (mode "
           "'read-write'; an offline read-only rerun needs the original file)")


class ReplayMissError(errors.ConfigError):
  """A read-only replay was asked for a call that was never recorded."""


def request_json(model: str, messages: Sequence[base.Message], params: base.SamplingParams) -> str:
  """The canonical form of a request (sorted keys, no whitespace): what the key hashes."""
  req = {"model": model, "messages": [dict(m) for m in messages], "params": params.as_dict()}
  req["params"]["stop"] = list(req["params"]["stop"])
  return json.dumps(req, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def request_key(model: str, messages: Sequence[base.Message], params: base.SamplingParams) -> str:
  return hashlib.sha256(request_json(model, messages, params).encode()).hexdigest()


def _completion_json(c: base.Completion) -> str:
  return json.dumps({"model": c.model, "text": c.text, "input_tokens": c.input_tokens,
                     "output_tokens": c.output_tokens, "cost_usd": c.cost_usd,
                     "latency_s": c.latency_s, "error": c.error}, sort_keys=True)


def _completion_from_json(s: str) -> base.Completion:
  return base.Completion(**json.loads(s))


class ReplayPool(base.LLMPool):
  """Wraps an LLMPool with the replay cache (see the module docstring)."""

  def __init__(self, inner: base.LLMPool | None, path: str | os.PathLike, mode: str = "read-write",
               *, catalog=None, busy_timeout_s: float = 60.0):
    """Opens the cache.

    Args:
      inner: the pool that answers misses; may be None in read-only mode.
      path: the SQLite file (created in read-write mode).
      mode: 'off', 'read-write' or 'read-only'.
      catalog: the catalog, when there is no inner pool to take it from.
      busy_timeout_s: how long a writer waits for another process's write lock.

    Raises:
      ConfigError: unknown mode, missing inner pool or catalog, or (read-only) no cache file.
    """
    if mode not in MODES:
      raise errors.ConfigError(f"unknown replay mode {mode!r}; known modes: {', '.join(MODES)}")
    if inner is None and mode != "read-only":
      raise errors.ConfigError(f"replay mode {mode!r} needs an inner pool to answer misses")
    catalog = catalog if catalog is not None else getattr(inner, "catalog", None)
    if catalog is None:
      raise errors.ConfigError("ReplayPool needs a catalog when there is no inner pool")
    super().__init__(catalog)
    self.inner = inner
    self.mode = mode
    self.path = pathlib.Path(path)
    self._lock = threading.Lock()
    self._pending: dict[str, asyncio.Future] = {}
    self._stats: collections.Counter = collections.Counter()
    self._db: sqlite3.Connection | None = None
    if mode == "off":
      return
    try:
      if mode == "read-only":
        if not self.path.is_file():
          raise errors.ConfigError(f"replay cache {self.path} not found (record it with mode "
                                   "'read-write' first)")
        self._db = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, check_same_thread=False,
                                   timeout=busy_timeout_s)
      else:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite_wal.open_wal(self.path, [_SCHEMA], timeout_s=busy_timeout_s)
      sqlite_wal.check_intact(self._db, self.path, "the replay cache", _REMEDY)
      self._db.execute("SELECT key, completion, ok FROM completions LIMIT 1").fetchall()
    except sqlite3.DatabaseError as e:
      if self._db is not None:
        self._db.close()
      if "not a database" in str(e):   # some other file given as the cache
        raise errors.ConfigError(f"replay cache {self.path} is not a replay database ({e})"
                                 ) from None
      raise sqlite_wal.damaged(self.path, "the replay cache", e, _REMEDY) from None
    except errors.DataError:
      if self._db is not None:
        self._db.close()
      raise

  def _lookup(self, key: str) -> base.Completion | None:
    try:
      with self._lock:
        row = self._db.execute("SELECT completion FROM completions WHERE key=?",
                               (key,)).fetchone()
    except sqlite3.DatabaseError as e:
      raise sqlite_wal.damaged(self.path, "the replay cache", e, _REMEDY) from None
    return None if row is None else self._decode(key, row[0])

  def _decode(self, key: str, text: str) -> base.Completion:
    try:
      return _completion_from_json(text)
    except (ValueError, TypeError, KeyError) as e:
      raise errors.DataError(f"{self.path}: the replay cache's row {key[:12]} is damaged "
                             f"({type(e).__name__}: {e}); {_REMEDY}") from None

  def _store(self, key: str, model: str, req: str, c: base.Completion) -> base.Completion:
    """Inserts unless a successful answer is already stored; returns the stored answer."""
    try:
      with self._lock:
        with self._db:  # one transaction; sqlite3 waits up to busy_timeout for other writers
          self._db.execute(
              "INSERT INTO completions VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(key) DO UPDATE SET "
              "completion=excluded.completion, ok=excluded.ok, created=excluded.created "
              "WHERE completions.ok = 0",
              (key, model, req, _completion_json(c), int(c.ok), time.time()))
          row = self._db.execute("SELECT completion FROM completions WHERE key=?",
                                 (key,)).fetchone()
    except sqlite3.DatabaseError as e:
      raise sqlite_wal.damaged(self.path, "the replay cache", e, _REMEDY) from None
    return self._decode(key, row[0])

  async def chat(self, model: str, messages: Sequence[base.Message],
                 params: base.SamplingParams = base.SamplingParams()) -> base.Completion:
    if self.mode == "off":
      return await self.inner.chat(model, messages, params)
    self.catalog[model]  # unknown names raise ConfigError in every mode
    req = request_json(model, messages, params)
    key = hashlib.sha256(req.encode()).hexdigest()
    cached = self._lookup(key)
    if self.mode == "read-only":
      if cached is None:
        self._stats["replay/misses"] += 1
        raise ReplayMissError(
            f"replay cache {self.path} has no recorded answer for LLM {model!r} (request key "
            f"{key[:12]}); the run was recorded with other prompts, LLMs or sampling params, or "
            "not at all: record it with replay mode 'read-write'")
      self._stats["replay/hits"] += 1
      return cached
    if cached is not None and cached.ok:
      self._stats["replay/hits"] += 1
      return cached
    pending = self._pending.get(key)
    if pending is not None:
      self._stats["replay/shared"] += 1
      return await asyncio.shield(pending)
    fut = asyncio.get_running_loop().create_future()
    self._pending[key] = fut
    try:
      self._stats["replay/misses"] += 1
      fresh = await self.inner.chat(model, messages, params)
      stored = await asyncio.to_thread(self._store, key, model, req, fresh)
      self._stats["replay/writes"] += 1
      fut.set_result(stored)
      return stored
    except BaseException as e:
      fut.set_exception(e)
      fut.exception()  # marks it retrieved when nobody else waits on it
      raise
    finally:
      del self._pending[key]

  def __len__(self) -> int:
    """Number of recorded calls."""
    if self._db is None:
      return 0
    with self._lock:
      return self._db.execute("SELECT COUNT(*) FROM completions").fetchone()[0]

  def stats(self) -> dict:
    out = dict(self.inner.stats()) if self.inner is not None else {}
    out.update({"replay/hits": 0, "replay/misses": 0, "replay/writes": 0})
    out.update(self._stats)
    return out

  async def aclose(self) -> None:
    if self.inner is not None:
      await self.inner.aclose()

  def close(self) -> None:
    if self._db is not None:
      with self._lock:
        self._db.close()
      self._db = None
