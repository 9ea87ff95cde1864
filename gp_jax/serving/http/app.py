"""The OpenAI-compatible HTTP API of a router server (aiohttp, the project's async HTTP stack).

  GET  /v1/models            "graphplanner" (the trained router) and every backbone LLM
  POST /v1/chat/completions  model "graphplanner": the learned workflow answers the last user
                             message (the other messages are context: conversation.py); a
                             backbone name: one pass-through call. `stream: true` opens an OpenAI
                             SSE stream at once (role chunk, keep-alive comments while the
                             workflow runs, the final call's tokens as the pool streams them,
                             `data: [DONE]`). Optional `metadata: {"task": ...}` picks the task
                             prompt family. temperature, top_p, max_tokens, stop reach the final
                             call, seed every call; fields the server cannot honour get 400.
  POST /v1/feedback          {"id": completion id, "score": 0..1}: the request's outcome joins
                             the router's history memory
  GET  /v1/routes?after=SEQ  served requests with seq > SEQ, oldest first (&limit=N, at most
                             1000): page by passing the response's `last` as the next `after`.
                             `since=T` (created after unix time T) is kept, but not for paging
  GET  /v1/memory            the history memory: rows, capacity, rows per (role, LLM) hub
  GET  /v1/router/versions   a learning server's (--learn) accepted router versions with their
                             provenance, the serving one and recent rejections (admin)
  POST /v1/router/rollback   {"version": id}: serve that accepted version again, with the memory
                             it began to serve with; learning pauses (admin)
  POST /v1/router/resume     {}: learning starts again after a rollback's pause (admin)
  GET  /health               up or down (down also when the store cannot keep feedback;
                             details for admins)
  GET  /metrics              Prometheus text format (metrics.py)

Every request first passes the gate (gate.py): Host header, Content-Type of POST bodies, API key
(auth.py: `--api_keys_file`, `Authorization: Bearer <key>`), role, per-caller rate limits.

Extension fields of a completion (the OpenAI fields are unchanged): `graphplanner` holds the
route (one entry per LLM call: step, role, llm, node, input/output tokens, cost_usd, latency_s,
error), `cost_usd` (the sum over the route), `history_rows` (history memory rows the decisions
read), `task` and `timing` (seconds: total_s; backbone_s awaiting LLM calls; router_s = total_s -
backbone_s, the router's overhead including waiting for the event loop; compute_s, the router's
own work: features, its share of the batched policy calls; decisions), `version` (the router
version that decided, on a learning server; None otherwise) and `explored` (its decisions were
sampled, a learning server's exploring share); the `x-gp-route` header gives the
route compactly ("role:llm,role:llm,...") and `x-gp-cost-usd` the total $ cost (not on streams,
whose headers go out first). `usage` sums the tokens of every call. Every response carries
`x-request-id` (the client's when safe, else a new one).

Errors use OpenAI's format, {"error": {"message", "type", "param", "code"}}: malformed JSON or
missing user message 400, an unsupported field 400 `unsupported_parameter`, no valid key 401, a
role that may not 403, unknown model or id 404 (also feedback on another key's completion), body
over the size limit 413, a body that is not JSON 415, a Host not served 421, a rate limit 429
`rate_limit_exceeded`, a full wait queue 429 `server_overloaded` or a key at its concurrency cap
429 `key_concurrency_exceeded` (all with Retry-After), a request the backbones could not answer
502, one past the deadline 504; after a stream opened, an SSE error event (a stream whose client
does not read is cut off after the write deadline). An unexpected error is a 500 that names the
request id only; its details go to the server log. No error body carries exception text or file
paths. A client that disconnects cancels its chat completion (handler cancellation); other
requests finish.

This module builds the app (its middlewares, make_app) and serves it; the endpoints are
handlers.py, the chat request's checks openai_schema.py, its answer completion.py and its stream
sse.py, the error bodies and the engine refusals' statuses errors.py, the shared keys app_keys.py.
"""
from __future__ import annotations

import asyncio
import gc
import logging
import re
import signal
import time
import uuid

from aiohttp import web

from gp_jax import errors
from gp_jax.serving.engine import errors as engine_errors
from gp_jax.serving.engine import requests as requests_lib
from gp_jax.serving.engine import session as session_lib
from gp_jax.serving.http import app_keys
from gp_jax.serving.http import auth
from gp_jax.serving.http import errors as http_errors
from gp_jax.serving.http import gate as gate_lib
from gp_jax.serving.http import handlers
from gp_jax.serving.http import limits
from gp_jax.serving.http import metrics as metrics_lib

_CLIENT_REQUEST_ID = re.compile(r"[\x21-\x7e]{1,128}")   # printable ASCII, no spaces
CHAT_PATH = "/v1/chat/completions"


@web.middleware
async def front(request: web.Request, handler):
  """The one middleware: every request, in this order, is
    1. counted by endpoint and status, with its latency (status 499 when the client went away
       before an answer: the handler was cancelled);
    2. given `x-request-id` on its response: the client's (printable ASCII, at most 128
       characters) or, when absent or unsafe, a new one;
    3. answered with an OpenAI-format error for any failure (the server stays up);
    4. checked by the gate (gate.py: Host, Content-Type, key, role, rate limits) before its
       handler.
  A client that disconnects cancels its chat completion (the server runs with aiohttp's
  handler_cancellation); every other request (feedback, reads) runs to its end regardless, so a
  write that was started is finished and logged."""
  if request.path == CHAT_PATH:
    return await _observed(request, handler)
  return await asyncio.shield(_observed(request, handler))


async def _observed(request: web.Request, handler):
  """Steps 1 and 2 of `front` around `_answered`."""
  t0 = time.perf_counter()
  given = request.headers.get("x-request-id")
  xrid = given if given is not None and _CLIENT_REQUEST_ID.fullmatch(given) else (
      "req-" + uuid.uuid4().hex)
  request[app_keys.REQUEST_ID_KEY] = xrid
  status = 499   # the client went away before an answer (the handler was cancelled)
  try:
    resp = await _answered(request, handler)
    status = resp.status
  except web.HTTPException as e:   # below 400 (_answered turns the rest into error bodies)
    status = e.status
    e.headers["x-request-id"] = xrid
    raise
  finally:
    request.app[app_keys.METRICS_KEY].request(_endpoint(request), status,
                                              time.perf_counter() - t0)
  if not resp.prepared:   # a stream sent its headers itself
    resp.headers["x-request-id"] = xrid
  return resp


async def _answered(request: web.Request, handler):
  """Steps 3 and 4 of `front`: the gate, the handler, every failure as an OpenAI-format error."""
  try:
    request[app_keys.PRINCIPAL] = request.app[app_keys.GATE_KEY].check(request)
    return await handler(request)
  except (http_errors.RequestError, engine_errors.Refusal) as e:
    err = http_errors.as_request_error(e)
    return http_errors.error_response(err.status, err.message, err.code, err.param, err.headers)
  except gate_lib.Refused as e:
    return http_errors.error_response(e.status, e.message, e.code, headers=e.headers)
  except web.HTTPRequestEntityTooLarge:
    return http_errors.error_response(413, f"request body too large (limit "
                                      f"{request.app[app_keys.MAX_BODY_KEY]} bytes)",
                                      "body_too_large")
  except web.HTTPException as e:
    if e.status < 400:
      raise
    return http_errors.error_response(e.status, e.reason, e.reason.lower().replace(" ", "_"))
  except (asyncio.CancelledError, KeyboardInterrupt):
    raise
  except Exception:   # a bug must not take the server down: log it, answer 500
    rid = app_keys.request_id(request)
    logging.getLogger(__name__).exception("request %s (%s %s) failed", rid, request.method,
                                          request.path)
    return http_errors.error_response(500, f"internal error (request id {rid}; the details are "
                                      "in the server log)", "internal_error",
                                      headers={"x-request-id": rid})


def _endpoint(request: web.Request) -> str:
  """The metrics label of a request: its route's path pattern, "other" for paths not served."""
  route = request.match_info.route
  resource = route.resource if route is not None else None
  if resource is None or isinstance(request.match_info.http_exception, web.HTTPException):
    return "other"
  return resource.canonical


def make_app(session: session_lib.RouterSession, *, max_body_bytes: int = 1 << 20,
             deadline_s: float = 600.0, keys: auth.KeyRing | None = None,
             host: str = "127.0.0.1", allowed_hosts=(), rate_limit_rps: float = 0.0,
             rate_limit_burst: int = 20, feedback_rps: float = 0.0,
             keepalive_s: float = 5.0,
             stream_write_timeout_s: float = 30.0) -> web.Application:
  """The aiohttp application serving `session`. Run it with handler_cancellation=True (as
  `serve` does) so that a client that disconnects cancels its chat completion.

  Args:
    max_body_bytes: larger request bodies get 413.
    deadline_s: a request unanswered after this many seconds gets 504 (its workflow is
      cancelled).
    keys: the API keys (None: no keys, every caller is the anonymous admin).
    host: the bound host; with `allowed_hosts` and the loopback names, the Host headers served.
    rate_limit_rps, rate_limit_burst, feedback_rps: per-caller token buckets (0: off).
    keepalive_s: a stream sends an SSE comment this often while the workflow runs.
    stream_write_timeout_s: a stream whose client does not take its bytes within this many
      seconds is cut off (sse.py; its workflow is cancelled).
  """
  if keepalive_s <= 0:
    raise errors.ConfigError(f"--keepalive_s must be > 0, got {keepalive_s}")
  if not stream_write_timeout_s > 0:
    raise errors.ConfigError(f"--stream_write_timeout_s must be > 0, got "
                             f"{stream_write_timeout_s}")
  app = web.Application(client_max_size=max_body_bytes, middlewares=[front])
  app[app_keys.SESSION_KEY] = session
  app[app_keys.DEADLINE_KEY] = float(deadline_s)
  app[app_keys.MAX_BODY_KEY] = int(max_body_bytes)
  app[app_keys.KEEPALIVE_KEY] = float(keepalive_s)
  app[app_keys.WRITE_TIMEOUT_KEY] = float(stream_write_timeout_s)
  app[app_keys.METRICS_KEY] = metrics = metrics_lib.Metrics(session)
  app[app_keys.GATE_KEY] = gate_lib.Gate(
      keys, auth.HostCheck(host, allowed_hosts),
      limits.TokenBuckets(rate_limit_rps, rate_limit_burst),
      limits.TokenBuckets(feedback_rps, rate_limit_burst), metrics)
  app.router.add_get("/v1/models", handlers.list_models)
  app.router.add_post("/v1/chat/completions", handlers.chat_completions)
  app.router.add_post("/v1/feedback", handlers.feedback)
  app.router.add_get("/v1/routes", handlers.routes)
  app.router.add_get("/v1/memory", handlers.memory)
  app.router.add_get("/v1/router/versions", handlers.router_versions)
  app.router.add_post("/v1/router/rollback", handlers.rollback)
  app.router.add_post("/v1/router/resume", handlers.resume)
  app.router.add_get("/health", handlers.health)
  app.router.add_get("/metrics", handlers.prometheus)

  async def start(app):
    await session.start()

  async def close(app):
    await session.aclose()
  app.on_startup.append(start)
  app.on_cleanup.append(close)
  return app


def serve(session: session_lib.RouterSession, *, host: str, port: int, max_body_bytes: int,
          deadline_s: float, keys: auth.KeyRing | None = None, allowed_hosts=(),
          rate_limit_rps: float = 0.0, rate_limit_burst: int = 20, feedback_rps: float = 0.0,
          keepalive_s: float = 5.0, stream_write_timeout_s: float = 30.0,
          print_fn=print) -> None:
  """Serves until SIGINT or SIGTERM, then flushes the memory and closes the backends.

  Prints one line "serving graphplanner ... on http://HOST:PORT/v1" once it accepts connections
  (port 0 picks a free port; the line names it). Refuses (ConfigError) a non-loopback `host`
  without `keys`."""
  auth.check_bind(host, keys)
  app = make_app(session, max_body_bytes=max_body_bytes, deadline_s=deadline_s, keys=keys,
                 host=host, allowed_hosts=allowed_hosts, rate_limit_rps=rate_limit_rps,
                 rate_limit_burst=rate_limit_burst, feedback_rps=feedback_rps,
                 keepalive_s=keepalive_s, stream_write_timeout_s=stream_write_timeout_s)

  async def main():
    # handler_cancellation: aiohttp (3.7+) leaves a handler running when its client disconnects
    # unless asked; a chat completion is then cancelled (`front` keeps the rest running).
    runner = web.AppRunner(app, access_log=None, handle_signals=False, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1] if runner.addresses else port
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
      loop.add_signal_handler(sig, stop.set)
    app[app_keys.GATE_KEY].follow_keys(loop)   # SIGHUP or a changed keys file: keys reloaded
    # The heap built at start (JAX, the model, the memory) is moved out of the collector's
    # reach: a full collection scanned it on the event loop for 77 to 138 ms, stalling every
    # decision in flight (docs/serving.md, the fifth overhead look). Later objects are collected
    # as before.
    gc.collect()
    gc.freeze()
    print_fn(f"serving {requests_lib.ROUTER_MODEL} (alpha {session.alpha:g}, backbones "
             f"{', '.join(session.backbones)}) on http://{host}:{bound}/v1", flush=True)
    try:
      await stop.wait()
    finally:
      await runner.cleanup()   # stops accepting, finishes handlers, runs on_cleanup (flush)

  asyncio.run(main())
