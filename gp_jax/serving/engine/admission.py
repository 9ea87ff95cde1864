"""Admission: which requests run their workflows now, which wait, which are refused at once.

At most `max_concurrency` requests run their workflows at once; up to `max_queue` more wait for
a slot; one more is refused at once (OVERLOADED, with the seconds after which a place likely
frees), never after a wait.

Per key: one API key may hold at most `max_key_concurrency` places (running or waiting) at once;
one more from it is refused at once (OVERLOADED, code `key_concurrency_exceeded`), so one key
cannot take the slots and waiting places of the others. A freed slot goes to the waiting requests
round robin by key (the oldest waiting request of the next key in turn), not first come first
served over all keys. Requests without a key (the HTTP layer passes none for admin keys and on a
server without API keys) share one turn and are not capped.
"""
from __future__ import annotations

import asyncio
import collections
import math
import time

from gp_jax import errors
from gp_jax.serving.engine import errors as errors_lib

KEY_CODE = "key_concurrency_exceeded"   # the refusal code of a key over its cap


class Admission:
  """A request's place from `Admissions.admit`: `async with` waits for a workflow slot and holds
  it; `cancel` gives back a place never used. key: the client key it counts against."""

  def __init__(self, control: "Admissions", key: str | None = None):
    self._c = control
    self._state = "waiting"
    self._t0 = 0.0
    self.key = key

  async def __aenter__(self) -> "Admission":
    c = self._c
    try:
      await c.slot(self.key)
    except BaseException:
      if self._state == "waiting":
        self._state = "done"
        c.drop_key(self.key)
      raise
    finally:
      c.waiting -= 1
    self._state = "running"
    c.in_flight += 1
    self._t0 = time.perf_counter()
    return self

  async def __aexit__(self, *exc) -> None:
    if self._state == "running":
      c = self._c
      self._state = "done"
      c.in_flight -= 1
      c.drop_key(self.key)
      c.release()
      c.held_s = 0.9 * c.held_s + 0.1 * (time.perf_counter() - self._t0)

  def cancel(self) -> None:
    if self._state == "waiting":
      self._state = "done"
      self._c.waiting -= 1
      self._c.drop_key(self.key)


class Admissions:
  """The workflow slots and the waiting places of one server.

  Args:
    max_concurrency: requests whose workflows run at once (>= 1).
    max_queue: requests that may wait for a slot (None: 4 x max_concurrency).
    counters: the server's counters (`overloaded` counts the refusals, `key_overloaded` those
      of a key over its cap).
    max_key_concurrency: places one API key may hold at once (None: a quarter of
      max_concurrency, at least 1; 0: no cap).
  """

  def __init__(self, max_concurrency: int, max_queue: int | None,
               counters: collections.Counter, max_key_concurrency: int | None = None):
    if max_concurrency < 1:
      raise errors.ConfigError(f"--max_concurrency must be >= 1, got {max_concurrency}")
    if max_queue is not None and max_queue < 0:
      raise errors.ConfigError(f"--max_queue must be >= 0, got {max_queue}")
    if max_key_concurrency is not None and max_key_concurrency < 0:
      raise errors.ConfigError(f"--max_key_concurrency must be >= 0, got {max_key_concurrency}")
    self.max_concurrency = int(max_concurrency)
    self.max_queue = 4 * self.max_concurrency if max_queue is None else int(max_queue)
    self.max_key_concurrency = (max(1, self.max_concurrency // 4) if max_key_concurrency is None
                                else int(max_key_concurrency))
    self.counters = counters
    self.in_flight = 0
    self.waiting = 0        # admitted requests waiting for a workflow slot
    self.held_s = 1.0       # running mean of how long a request holds its slot (Retry-After)
    self.per_key: collections.Counter = collections.Counter()   # places held by each key
    self._free = self.max_concurrency
    # The requests waiting for a slot, by key, keys in turn order (the next first).
    self._turns: collections.OrderedDict = collections.OrderedDict()

  def admit(self, key: str | None = None) -> Admission:
    """A place for one request: a workflow slot, or one of `max_queue` places waiting for one.
    key: the name of the API key that asks (None: no keys, no per-key cap).

    Raises:
      Refusal OVERLOADED (`server_overloaded`, with retry_after_s) when every slot is taken
        and max_queue requests already wait, or (`key_concurrency_exceeded`) when `key` already
        holds max_key_concurrency places (answered at once, never after a wait).
    """
    if self.in_flight + self.waiting >= self.max_concurrency + self.max_queue:
      self.counters["overloaded"] += 1
      retry = self.retry_after_s()
      raise errors_lib.Refusal(
          errors_lib.OVERLOADED, f"the server is at capacity ({self.in_flight} requests "
          f"running, {self.waiting} waiting); retry after {retry} s", "server_overloaded",
          retry_after_s=retry)
    self.take_key(key)
    self.waiting += 1
    return Admission(self, key)

  def take_key(self, key: str | None) -> None:
    """Counts one more place of `key`; an OVERLOADED Refusal when it holds its cap already."""
    if key is None:
      return
    cap = self.max_key_concurrency
    if cap and self.per_key[key] >= cap:
      self.counters["key_overloaded"] += 1
      retry = int(min(60, max(1, math.ceil(self.held_s))))
      raise errors_lib.Refusal(
          errors_lib.OVERLOADED, f"this API key already has {self.per_key[key]} requests "
          f"running or waiting, its limit (--max_key_concurrency); retry after {retry} s",
          KEY_CODE, retry_after_s=retry)
    self.per_key[key] += 1

  def drop_key(self, key: str | None) -> None:
    if key is not None:
      self.per_key[key] -= 1
      if self.per_key[key] <= 0:
        del self.per_key[key]

  async def slot(self, key: str | None) -> None:
    """Waits for a workflow slot: at once when one is free and nobody waits, else in `key`'s
    line until `release` hands it one (round robin by key)."""
    if self._free > 0 and not self._turns:
      self._free -= 1
      return
    waiter = asyncio.get_running_loop().create_future()
    self._turns.setdefault(key, collections.deque()).append(waiter)
    try:
      await waiter
    except asyncio.CancelledError:
      if waiter.done() and not waiter.cancelled():   # handed a slot as it was cancelled
        self.release()
      else:
        line = self._turns.get(key)
        if line is not None and waiter in line:
          line.remove(waiter)
          if not line:
            del self._turns[key]
      raise

  def release(self) -> None:
    """A slot is free: to the oldest waiting request of the next key in turn (that key then
    goes last), or back to the free slots when nobody waits."""
    while self._turns:
      key, line = next(iter(self._turns.items()))
      waiter = line.popleft()
      if line:
        self._turns.move_to_end(key)
      else:
        del self._turns[key]
      if not waiter.done():
        waiter.set_result(None)
        return
    self._free += 1

  def retry_after_s(self) -> int:
    """Seconds until a queue place likely frees: the mean time a request holds its slot, times
    the rounds of max_concurrency that the waiting requests take (1 to 60)."""
    rounds = (self.waiting + 1) / self.max_concurrency
    return int(min(60, max(1, math.ceil(self.held_s * rounds))))
