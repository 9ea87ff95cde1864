"""Admission: which requests run their workflows now, which wait, which are refused at once.

At most `max_concurrency` requests run their workflows at once; up to `max_queue` more wait for
a slot; one more is refused at once (OVERLOADED, with the seconds after which a place likely
frees), never after a wait.
"""
from __future__ import annotations

import asyncio
import collections
import math
import time

from gp_jax import errors
from gp_jax.serving.engine import errors as errors_lib


class Admission:
  """A request's place from `Admissions.admit`: `async with` waits for a workflow slot and holds
  it; `cancel` gives back a place never used."""

  def __init__(self, control: "Admissions"):
    self._c = control
    self._state = "waiting"
    self._t0 = 0.0

  async def __aenter__(self) -> "Admission":
    c = self._c
    try:
      await c.slot().acquire()
    finally:
      c.waiting -= 1
      self._state = "done"
    self._state = "running"
    c.in_flight += 1
    self._t0 = time.perf_counter()
    return self

  async def __aexit__(self, *exc) -> None:
    if self._state == "running":
      c = self._c
      self._state = "done"
      c.in_flight -= 1
      c.slot().release()
      c.held_s = 0.9 * c.held_s + 0.1 * (time.perf_counter() - self._t0)

  def cancel(self) -> None:
    if self._state == "waiting":
      self._state = "done"
      self._c.waiting -= 1


class Admissions:
  """The workflow slots and the waiting places of one server.

  Args:
    max_concurrency: requests whose workflows run at once (>= 1).
    max_queue: requests that may wait for a slot (None: 4 x max_concurrency).
    counters: the server's counters (`overloaded` counts the refusals).
  """

  def __init__(self, max_concurrency: int, max_queue: int | None,
               counters: collections.Counter):
    if max_concurrency < 1:
      raise errors.ConfigError(f"--max_concurrency must be >= 1, got {max_concurrency}")
    if max_queue is not None and max_queue < 0:
      raise errors.ConfigError(f"--max_queue must be >= 0, got {max_queue}")
    self.max_concurrency = int(max_concurrency)
    self.max_queue = 4 * self.max_concurrency if max_queue is None else int(max_queue)
    self.counters = counters
    self.in_flight = 0
    self.waiting = 0        # admitted requests waiting for a workflow slot
    self.held_s = 1.0       # running mean of how long a request holds its slot (Retry-After)
    self._slots: asyncio.Semaphore | None = None

  def slot(self) -> asyncio.Semaphore:
    if self._slots is None:   # made on the running loop, at the first request
      self._slots = asyncio.Semaphore(self.max_concurrency)
    return self._slots

  def admit(self) -> Admission:
    """A place for one request: a workflow slot, or one of `max_queue` places waiting for one.

    Raises:
      Refusal OVERLOADED (`server_overloaded`, with retry_after_s) when every slot is taken
        and max_queue requests already wait (answered at once, never after a wait).
    """
    if self.in_flight + self.waiting >= self.max_concurrency + self.max_queue:
      self.counters["overloaded"] += 1
      retry = self.retry_after_s()
      raise errors_lib.Refusal(
          errors_lib.OVERLOADED, f"the server is at capacity ({self.in_flight} requests "
          f"running, {self.waiting} waiting); retry after {retry} s", "server_overloaded",
          retry_after_s=retry)
    self.waiting += 1
    return Admission(self)

  def retry_after_s(self) -> int:
    """Seconds until a queue place likely frees: the mean time a request holds its slot, times
    the rounds of max_concurrency that the waiting requests take (1 to 60)."""
    rounds = (self.waiting + 1) / self.max_concurrency
    return int(min(60, max(1, math.ceil(self.held_s * rounds))))
