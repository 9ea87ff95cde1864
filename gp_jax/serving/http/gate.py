"""The gate every request of a router server passes before its handler, in this order:

  1. Host header: the bound host, loopback names or --allowed_hosts, else 421 (DNS rebinding:
     a web page whose name resolves to this server sends its own name);
  2. Content-Type: a POST body must be application/json, else 415 (a web page may post a
     cross-origin `text/plain` form without asking the server first; JSON it cannot);
  3. key: `Authorization: Bearer <key>` of the keys file, else 401 (no keys file: everyone is
     the anonymous admin, on loopback only);
  4. role: admin-only endpoints refuse clients with 403 (auth.ACCESS), and so does feedback
     from a key whose entry says `"feedback": false`;
  5. rate limits: the caller's request bucket, and for feedback its feedback bucket, else 429
     with Retry-After.
/health passes 1 and takes any key or none (its details are for admins: auth.health_details);
/metrics is admin-only like /v1/routes.

The keys in force are the gate's: `follow_keys` re-reads the keys file on SIGHUP and when a
poll sees the file changed (every KEYS_POLL_S seconds). A reload takes effect for every request
whose key is checked after it (a request already past the gate finishes); a file that does not
load keeps the keys in force and logs one error line.
"""
from __future__ import annotations

import asyncio
import logging
import signal

from aiohttp import web

from gp_jax import errors
from gp_jax.serving.http import auth
from gp_jax.serving.http import limits
from gp_jax.serving.http import metrics as metrics_lib

FEEDBACK_PATH = "/v1/feedback"
_UNLIMITED = ("/health", "/metrics")   # probes and scrapes are not counted against a caller
KEYS_POLL_S = 2.0                      # how often follow_keys looks for a changed keys file
_log = logging.getLogger(__name__)


class Refused(Exception):
  """A request the gate refuses: an OpenAI-format error with `status`, `code` and `headers`."""

  def __init__(self, status: int, message: str, code: str, headers: dict | None = None):
    super().__init__(message)
    self.status, self.message, self.code = status, message, code
    self.headers = headers or {}


class Gate:
  """The gate of one app (module docstring).

  Args:
    keys: the keys file's keys (None: no keys file).
    hosts: the Host headers answered (without keys: loopback names only, else ConfigError).
    requests, feedback: token buckets per caller (rate 0: off).
    metrics: counts the 429s.
  """

  def __init__(self, keys: auth.KeyRing | None, hosts: auth.HostCheck,
               requests: limits.TokenBuckets, feedback: limits.TokenBuckets,
               metrics: metrics_lib.Metrics | None = None):
    if keys is None:
      auth.check_bind(hosts.bound, None, hosts.allowed)
    self.keys, self.hosts = keys, hosts
    self.requests, self.feedback, self.metrics = requests, feedback, metrics
    self._tried = keys.stamp if keys is not None else None   # the keys file last read
    self._poll: asyncio.Task | None = None

  def check(self, request: web.Request) -> auth.Principal | None:
    """The request's principal (None: /health without a valid key). Raises Refused."""
    if not self.hosts.ok(request.headers.get("Host")):
      raise Refused(421, "this server does not answer for that Host; add the name to "
                    "--allowed_hosts if it is meant to", "invalid_host")
    if request.method == "POST" and request.content_type != "application/json":
      raise Refused(415, "a request body must be JSON, sent with Content-Type: "
                    "application/json", "unsupported_media_type")
    rule = auth.access(request.path)
    who = self._principal(request)
    if who is None:
      if rule == auth.OPEN:
        return None
      raise Refused(401, "a valid API key is required (Authorization: Bearer <key>)",
                    "invalid_api_key", {"WWW-Authenticate": 'Bearer realm="graphplanner"'})
    if rule == auth.ADMIN_ONLY and not who.is_admin:
      raise Refused(403, f"{request.path} needs an admin key", "permission_denied")
    if rule == auth.FEEDBACK and not who.feedback:
      raise Refused(403, "this API key may chat but not send feedback", "permission_denied")
    if request.path not in _UNLIMITED:
      caller = who.name if who.name is not None else f"addr:{request.remote}"
      self._take(self.requests, caller, "requests")
      if request.path == FEEDBACK_PATH:
        self._take(self.feedback, caller, "feedback")
    return who

  def follow_keys(self, loop: asyncio.AbstractEventLoop, poll_s: float = KEYS_POLL_S) -> None:
    """Re-reads the keys file on SIGHUP and, every `poll_s` seconds (0: SIGHUP only), when it
    changed (auth.file_stamp). Nothing without a keys file (SIGHUP keeps its default action)."""
    if self.keys is None or self.keys.path is None:
      return
    loop.add_signal_handler(signal.SIGHUP, self.reload_keys)
    if poll_s > 0:
      self._poll = loop.create_task(self._watch(poll_s))

  async def _watch(self, poll_s: float) -> None:
    while True:
      await asyncio.sleep(poll_s)
      if auth.file_stamp(self.keys.path) != self._tried:
        self.reload_keys()

  def reload_keys(self) -> bool:
    """Reads the keys file again and puts its keys in force; whether it did. A file that does
    not load (malformed, a bad entry, gone, unreadable) keeps the keys in force and logs one
    error line; nothing here raises."""
    path = self.keys.path
    self._tried = auth.file_stamp(path)
    try:
      ring = auth.load(path)
    except Exception as e:   # the server keeps serving with the keys it has, whatever the file
      why = str(e) if isinstance(e, errors.GpJaxError) else f"{path}: {type(e).__name__}: {e}"
      _log.error("keys file not reloaded, the %d keys in force stay: %s", len(self.keys.names),
                 " ".join(why.split()))
      return False
    self.keys = ring
    _log.warning("keys file reloaded: %d keys in force (%s)", len(ring.names),
                 ", ".join(ring.names))
    return True

  def _principal(self, request: web.Request) -> auth.Principal | None:
    if self.keys is None:
      return auth.ANONYMOUS
    return self.keys.authenticate(request.headers.get("Authorization"))

  def _take(self, buckets: limits.TokenBuckets, caller: str, limit: str) -> None:
    wait = buckets.take(caller)
    if wait > 0:
      if self.metrics is not None:
        self.metrics.rate_limited.labels(limit).inc()
      per = "feedback" if limit == "feedback" else "request"
      raise Refused(429, f"{per} rate limit of {buckets.rate:g}/s (burst {buckets.burst}) "
                    "exceeded; retry after the Retry-After seconds", "rate_limit_exceeded",
                    {"Retry-After": limits.retry_after(wait)})
