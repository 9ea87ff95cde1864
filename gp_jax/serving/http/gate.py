"""The gate every request of a router server passes before its handler, in this order:

  1. Host header: the bound host, loopback names or --allowed_hosts, else 421 (DNS rebinding:
     a web page whose name resolves to this server sends its own name);
  2. Content-Type: a POST body must be application/json, else 415 (a web page may post a
     cross-origin `text/plain` form without asking the server first; JSON it cannot);
  3. key: `Authorization: Bearer <key>` of the keys file, else 401 (no keys file: everyone is
     the anonymous admin, on loopback only);
  4. role: admin-only endpoints refuse clients with 403 (auth.ACCESS);
  5. rate limits: the caller's request bucket, and for feedback its feedback bucket, else 429
     with Retry-After.
/health passes 1 and takes any key or none; /metrics is admin-only like /v1/routes.
"""
from __future__ import annotations

from aiohttp import web

from gp_jax.serving.http import auth
from gp_jax.serving.http import limits
from gp_jax.serving.http import metrics as metrics_lib

FEEDBACK_PATH = "/v1/feedback"
_UNLIMITED = ("/health", "/metrics")   # probes and scrapes are not counted against a caller


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
    hosts: the Host headers answered.
    requests, feedback: token buckets per caller (rate 0: off).
    metrics: counts the 429s.
  """

  def __init__(self, keys: auth.KeyRing | None, hosts: auth.HostCheck,
               requests: limits.TokenBuckets, feedback: limits.TokenBuckets,
               metrics: metrics_lib.Metrics | None = None):
    self.keys, self.hosts = keys, hosts
    self.requests, self.feedback, self.metrics = requests, feedback, metrics

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
    if request.path not in _UNLIMITED:
      caller = who.name if who.name is not None else f"addr:{request.remote}"
      self._take(self.requests, caller, "requests")
      if request.path == FEEDBACK_PATH:
        self._take(self.feedback, caller, "feedback")
    return who

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
