"""Per-caller rate limits of a router server: token buckets for requests and for feedback.

A bucket holds up to `burst` tokens and gains `rate` tokens a second; a request takes one token
or, when none is left, is refused with 429 and `Retry-After` = the whole seconds until a token
is back. The caller is the API key's name, or the client address when the server has no keys.
A rate of 0 turns a limit off.
"""
from __future__ import annotations

import math
import time

from gp_jax import errors

MAX_CALLERS = 10_000    # buckets kept; beyond this, full (idle) buckets are dropped


class TokenBuckets:
  """One token bucket per caller, all with the same rate and burst.

  Args:
    rate: tokens per second (0: unlimited).
    burst: the bucket size (the most requests at once after an idle while), >= 1.
    clock: seconds, monotonic (tests pass a fake one).
    what: the limit's name in errors (its flag).
  """

  def __init__(self, rate: float, burst: int, clock=time.monotonic, *,
               what: str = "the rate limit"):
    if not (math.isfinite(rate) and rate >= 0):
      raise errors.ConfigError(f"{what} must be a number >= 0 (0 = off), got {rate}")
    if burst < 1:
      raise errors.ConfigError(f"--rate_limit_burst must be >= 1, got {burst}")
    self.rate, self.burst, self.clock = float(rate), int(burst), clock
    self._buckets: dict[str, tuple[float, float]] = {}   # caller -> (tokens, at)

  @property
  def enabled(self) -> bool:
    return self.rate > 0

  def _tokens(self, caller: str, now: float) -> float:
    tokens, at = self._buckets.get(caller, (float(self.burst), now))
    return min(float(self.burst), tokens + (now - at) * self.rate)

  def take(self, caller: str) -> float:
    """Takes one token of `caller`'s bucket. Returns 0.0 when taken, else the seconds until
    one is back (nothing taken)."""
    if not self.enabled:
      return 0.0
    now = self.clock()
    tokens = self._tokens(caller, now)
    if tokens < 1.0:
      self._buckets[caller] = (tokens, now)
      return (1.0 - tokens) / self.rate
    self._buckets[caller] = (tokens - 1.0, now)
    if len(self._buckets) > MAX_CALLERS:
      self._forget_idle(now)
    return 0.0

  def _forget_idle(self, now: float) -> None:
    """Drops buckets that are full again: forgetting them changes nothing."""
    for c in [c for c in self._buckets if self._tokens(c, now) >= self.burst]:
      del self._buckets[c]


def retry_after(wait_s: float) -> str:
  """The Retry-After header value (whole seconds, at least 1) for a wait of `wait_s`."""
  return str(max(1, math.ceil(wait_s)))
