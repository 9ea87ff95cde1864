"""The keys under which a router server's app (make_app) and its requests (the middlewares) hold
what the handlers read, and the request's id and caller read from them."""
from __future__ import annotations

import uuid

from aiohttp import web

from gp_jax.serving.engine import session as session_lib
from gp_jax.serving.http import gate as gate_lib
from gp_jax.serving.http import metrics as metrics_lib

SESSION_KEY = web.AppKey("session", session_lib.RouterSession)
DEADLINE_KEY = web.AppKey("deadline_s", float)
MAX_BODY_KEY = web.AppKey("max_body_bytes", int)
GATE_KEY = web.AppKey("gate", gate_lib.Gate)
METRICS_KEY = web.AppKey("metrics", metrics_lib.Metrics)
PRINCIPAL = web.RequestKey("principal", object)   # the auth.Principal the gate let in (or None)
KEEPALIVE_KEY = web.AppKey("keepalive_s", float)
WRITE_TIMEOUT_KEY = web.AppKey("stream_write_timeout_s", float)
REQUEST_ID_KEY = web.RequestKey("request_id", str)


def request_id(request: web.Request) -> str:
  """The request's x-request-id (`front` set it; a new one if the request never got there)."""
  return request.get(REQUEST_ID_KEY) or "req-" + uuid.uuid4().hex


def key_name(request: web.Request) -> str | None:
  who = request.get(PRINCIPAL)
  return who.name if who is not None else None
