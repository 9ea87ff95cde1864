"""The OpenAI-compatible HTTP API of a router server (aiohttp, the project's async HTTP stack).

  GET  /v1/models            "graphplanner" (the trained router) and every backbone LLM
  POST /v1/chat/completions  model "graphplanner": the learned workflow answers; a backbone name:
                             one pass-through call. `stream: true` sends OpenAI SSE chunks ending
                             with `data: [DONE]`. Optional `metadata: {"task": ...}` picks the
                             task prompt family.
  POST /v1/feedback          {"id": completion id, "score": 0..1}: the request's outcome joins
                             the router's history memory
  GET  /v1/routes?after=SEQ  served requests with seq > SEQ, oldest first (&limit=N, at most
                             1000): page by passing the response's `last` as the next `after`.
                             `since=T` (created after unix time T) is kept, but not for paging
  GET  /v1/memory            the history memory: rows, capacity, rows per (role, LLM) hub
  GET  /health               liveness and counters

Extension fields of a completion (the OpenAI fields are unchanged): `graphplanner` holds the
route (one entry per LLM call: step, role, llm, node, input/output tokens, cost_usd, latency_s,
error), `cost_usd` (the sum over the route), `history_rows` (history memory rows the decisions
read), `task` and `timing` (seconds: total_s; backbone_s awaiting LLM calls; router_s = total_s -
backbone_s, the router's overhead including waiting for the event loop; compute_s, the router's
own work: features, its share of the batched policy calls; decisions); the `x-gp-route` header gives the
route compactly ("role:llm,role:llm,...") and `x-gp-cost-usd` the total $ cost. `usage` sums the
tokens of every call.

Errors use OpenAI's format, {"error": {"message", "type", "param", "code"}}: malformed JSON or
missing user message 400, unknown model or id 404, body over the size limit 413, a request the
backbones could not answer 502, one past the deadline 504.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import signal

from aiohttp import web

from gp_jax.llm import base
from gp_jax.runs.serving import session as session_lib

RequestError = session_lib.RequestError
SESSION_KEY = web.AppKey("session", session_lib.RouterSession)
DEADLINE_KEY = web.AppKey("deadline_s", float)
MAX_BODY_KEY = web.AppKey("max_body_bytes", int)
STREAM_PIECE_CHARS = 24     # characters of the answer per SSE chunk
ROUTES_PAGE_MAX = 1000      # the most route records one /v1/routes page returns
_TYPES = {400: "invalid_request_error", 404: "not_found_error", 405: "invalid_request_error",
          409: "conflict_error", 413: "invalid_request_error", 502: "backbone_error",
          503: "server_error", 504: "timeout_error"}


def error_response(status: int, message: str, code: str | None = None,
                   param: str | None = None) -> web.Response:
  body = {"error": {"message": message, "type": _TYPES.get(status, "server_error"),
                    "param": param, "code": code}}
  return web.json_response(body, status=status)


@web.middleware
async def openai_errors(request: web.Request, handler):
  """Every failure as an OpenAI-format error; the server stays up."""
  try:
    return await handler(request)
  except RequestError as e:
    return error_response(e.status, e.message, e.code, e.param)
  except web.HTTPRequestEntityTooLarge:
    return error_response(413, f"request body too large (limit "
                          f"{request.app[MAX_BODY_KEY]} bytes)", "body_too_large")
  except web.HTTPException as e:
    if e.status < 400:
      raise
    return error_response(e.status, e.reason, e.reason.lower().replace(" ", "_"))
  except (asyncio.CancelledError, KeyboardInterrupt):
    raise
  except Exception as e:   # a bug must not take the server down: log it, answer 500
    logging.getLogger(__name__).exception("request failed")
    return error_response(500, f"internal error: {type(e).__name__}: {e}", "internal_error")


async def _json_body(request: web.Request) -> dict:
  raw = await request.read()   # over client_max_size: HTTPRequestEntityTooLarge (413)
  try:
    body = json.loads(raw)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise RequestError(400, f"request body is not valid JSON ({e})", "invalid_json") from None
  if not isinstance(body, dict):
    raise RequestError(400, "request body must be a JSON object", "invalid_json")
  return body


def _text_of(content) -> str | None:
  """A message's text: a string, or the text parts of a content list."""
  if isinstance(content, str):
    return content
  if isinstance(content, list):
    parts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
    if parts and all(isinstance(p, str) for p in parts):
      return "\n".join(parts)
  return None


def _messages(body: dict) -> list[dict]:
  msgs = body.get("messages")
  if not isinstance(msgs, list) or not msgs:
    raise RequestError(400, "messages must be a non-empty list", "invalid_messages", "messages")
  out = []
  for i, m in enumerate(msgs):
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
      raise RequestError(400, f"messages[{i}] must be an object with a role",
                         "invalid_messages", f"messages[{i}]")
    text = _text_of(m.get("content"))
    if text is None:
      if m["role"] == "assistant":
        text = ""   # e.g. a tool-call turn: no text to keep
      else:
        raise RequestError(400, f"messages[{i}].content must be a string or text parts",
                           "invalid_messages", f"messages[{i}].content")
    out.append({"role": m["role"], "content": text})
  users = [m for m in out if m["role"] == "user"]
  if not users or not users[-1]["content"].strip():
    raise RequestError(400, "no user message: the last user message is the query, and it must "
                       "not be empty", "no_user_message", "messages")
  return out


def _number(body: dict, key: str, lo: float, hi: float, integer: bool = False):
  v = body.get(key)
  if v is None:
    return None
  ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
  if not ok or not lo <= v <= hi or (integer and int(v) != v):
    raise RequestError(400, f"{key} must be a{'n integer' if integer else ' number'} in "
                       f"[{lo}, {hi}], got {v!r}", "invalid_parameter", key)
  return int(v) if integer else float(v)


def _task_hint(body: dict) -> str | None:
  meta = body.get("metadata")
  if meta is None:
    return None
  if not isinstance(meta, dict):
    raise RequestError(400, "metadata must be an object", "invalid_parameter", "metadata")
  task = meta.get("task")
  if task is not None and not isinstance(task, str):
    raise RequestError(400, "metadata.task must be a string", "invalid_parameter", "metadata.task")
  return task


def _sampling(body: dict, default: base.SamplingParams) -> base.SamplingParams:
  stop = body.get("stop")
  if isinstance(stop, str):
    stop = (stop,)
  elif stop is None:
    stop = ()
  elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
    stop = tuple(stop)
  else:
    raise RequestError(400, "stop must be a string or a list of strings", "invalid_parameter",
                       "stop")
  t = _number(body, "temperature", 0.0, 2.0)
  top_p = _number(body, "top_p", 0.0, 1.0)
  mt = _number(body, "max_completion_tokens", 1, 1 << 20, True) or _number(
      body, "max_tokens", 1, 1 << 20, True)
  seed = _number(body, "seed", -(1 << 63), (1 << 63) - 1, True)
  return base.SamplingParams(temperature=default.temperature if t is None else t,
                             max_tokens=default.max_tokens if mt is None else mt,
                             top_p=1.0 if top_p is None else top_p,
                             seed=0 if seed is None else seed, stop=stop)


def _extension(record: dict) -> dict:
  route = [{k: c[k] for k in ("step", "role", "llm", "node", "input_tokens", "output_tokens",
                              "cost_usd", "latency_s", "error")} for c in record["calls"]]
  return dict(route=route, cost_usd=record["cost_usd"], task=record["task"],
              history_rows=record["history_rows"], alpha=record["alpha"],
              timing=record["timing"])


def _headers(record: dict) -> dict:
  route = ",".join(f"{c['role']}:{c['llm']}" for c in record["calls"])
  return {"x-gp-route": route, "x-gp-cost-usd": f"{record['cost_usd']:.10g}",
          "x-gp-request-id": record["id"]}


async def list_models(request: web.Request) -> web.Response:
  s = request.app[SESSION_KEY]
  created = int(s.workdir.stat().st_mtime) if s.workdir.exists() else 0
  data = [dict(id=session_lib.ROUTER_MODEL, object="model", created=created, owned_by="gp_jax",
               alpha=s.alpha, kind="router")]
  data += [dict(id=m, object="model", created=created, owned_by="gp_jax", kind="backbone")
           for m in s.backbones]
  return web.json_response({"object": "list", "data": data})


@dataclasses.dataclass(frozen=True)
class _ChatRequest:
  """A checked /v1/chat/completions body."""
  model: str
  messages: list
  stream: bool
  include_usage: bool
  task: str | None
  params: base.SamplingParams
  seed: int | None


async def chat_completions(request: web.Request) -> web.StreamResponse:
  s = request.app[SESSION_KEY]
  req = _chat_request(await _json_body(request), s)
  rid = session_lib.new_id()
  served = await _serve(request, s, req, rid)
  rec = served.record
  if not req.stream:
    out = {"id": rid, "object": "chat.completion", "created": int(rec["created"]),
           "model": req.model,
           "choices": [{"index": 0, "message": {"role": "assistant", "content": served.answer},
                        "finish_reason": "stop", "logprobs": None}],
           "usage": rec["usage"], "graphplanner": _extension(rec)}
    return web.json_response(out, headers=_headers(rec))
  return await _stream(request, s, req, rid, served)


def _chat_request(body: dict, s: session_lib.RouterSession) -> _ChatRequest:
  """The body's fields, checked in order (the first bad one is the 400 or 404)."""
  model = body.get("model")
  if not isinstance(model, str) or not model:
    raise RequestError(400, "model is required", "invalid_parameter", "model")
  if model != session_lib.ROUTER_MODEL and model not in s.backbones:
    raise RequestError(404, f"model {model!r} not found; served: "
                       f"{', '.join((session_lib.ROUTER_MODEL,) + s.backbones)}",
                       "model_not_found", "model")
  messages = _messages(body)
  stream = body.get("stream", False)
  if not isinstance(stream, bool):
    raise RequestError(400, "stream must be a boolean", "invalid_parameter", "stream")
  if body.get("n", 1) != 1:
    raise RequestError(400, "only n = 1 is supported", "invalid_parameter", "n")
  stream_options = body.get("stream_options") or {}
  if not isinstance(stream_options, dict):
    raise RequestError(400, "stream_options must be an object", "invalid_parameter",
                       "stream_options")
  task = _task_hint(body)
  s.check_task(task)
  params = _sampling(body, s.system.sampling)
  seed = body.get("seed") if isinstance(body.get("seed"), int) else None
  return _ChatRequest(model, messages, stream, bool(stream_options.get("include_usage")), task,
                      params, seed)


async def _serve(request: web.Request, s: session_lib.RouterSession, req: _ChatRequest,
                 rid: str) -> session_lib.Served:
  """The router's answer (model "graphplanner") or one backbone's, within the deadline."""
  deadline = request.app[DEADLINE_KEY]
  try:
    if req.model == session_lib.ROUTER_MODEL:
      coro = s.complete(session_lib.last_user_text(req.messages), task=req.task, rid=rid,
                        seed=req.seed)
    else:
      coro = s.passthrough(req.model, req.messages, req.params, task=req.task, rid=rid)
    return await asyncio.wait_for(coro, deadline)
  except asyncio.TimeoutError:
    s.counters["timeout"] += 1
    raise RequestError(504, f"no answer within the server's deadline of {deadline:g} s",
                       "timeout") from None


async def _stream(request: web.Request, s: session_lib.RouterSession, req: _ChatRequest,
                  rid: str, served: session_lib.Served) -> web.StreamResponse:
  """The answer as OpenAI SSE chunks: the role, the text in pieces, the stop with the route,
  the usage when asked, then [DONE]."""
  rec = served.record
  created = int(rec["created"])
  resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                     "Cache-Control": "no-cache", **_headers(rec)})
  await resp.prepare(request)

  def chunk(delta: dict, finish=None, **extra) -> bytes:
    obj = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": req.model,
           "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
           **extra}
    return f"data: {json.dumps(obj)}\n\n".encode()

  try:
    await resp.write(chunk({"role": "assistant", "content": ""}))
    text = served.answer
    for i in range(0, len(text), STREAM_PIECE_CHARS):
      await resp.write(chunk({"content": text[i:i + STREAM_PIECE_CHARS]}))
    await resp.write(chunk({}, "stop", graphplanner=_extension(rec)))
    if req.include_usage:
      obj = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": req.model,
             "choices": [], "usage": rec["usage"]}
      await resp.write(f"data: {json.dumps(obj)}\n\n".encode())
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
  except ConnectionResetError:   # the client left mid-stream; the request is served and logged
    s.counters["client_gone"] += 1
  return resp


async def feedback(request: web.Request) -> web.Response:
  s = request.app[SESSION_KEY]
  body = await _json_body(request)
  rid = body.get("id")
  if not isinstance(rid, str) or not rid:
    raise RequestError(400, "id (the completion's id) is required", "invalid_parameter", "id")
  score = body.get("score")
  if (not isinstance(score, (int, float)) or isinstance(score, bool) or not math.isfinite(score)
      or not 0.0 <= score <= 1.0):
    raise RequestError(400, f"score must be a number in [0, 1], got {score!r}", "invalid_score",
                       "score")
  out = await s.feedback(rid, float(score))
  return web.json_response(dict(out, object="feedback"))


async def routes(request: web.Request) -> web.Response:
  """A page of the route log: `after=SEQ` (records are numbered by the store as they finish, so
  pages by seq never skip one), or `since=T` (created after unix time T: a request created
  before T' but finished after a page was read would be skipped, so not for paging)."""
  s = request.app[SESSION_KEY]
  q = request.query
  try:
    limit = min(int(q.get("limit", str(ROUTES_PAGE_MAX))), ROUTES_PAGE_MAX)
    after = int(q.get("after", "0"))
    since = float(q["since"]) if "since" in q else None
  except ValueError:
    raise RequestError(400, "after must be an integer seq, since a unix time and limit an "
                       "integer", "invalid_parameter", "after") from None
  if limit < 1 or after < 0 or (since is not None and not math.isfinite(since)):
    raise RequestError(400, "limit must be >= 1, after >= 0 and since a finite unix time",
                       "invalid_parameter", "limit")
  if since is not None:
    data = await s.routes_since(since, limit)
    return web.json_response({"object": "list", "data": data,
                              "last": data[-1]["created"] if data else since})
  data = await s.routes_after(after, limit)
  return web.json_response({"object": "list", "data": data,
                            "last": data[-1]["seq"] if data else after})


async def memory(request: web.Request) -> web.Response:
  return web.json_response(request.app[SESSION_KEY].memory_info())


async def health(request: web.Request) -> web.Response:
  return web.json_response(request.app[SESSION_KEY].health())


def make_app(session: session_lib.RouterSession, *, max_body_bytes: int = 1 << 20,
             deadline_s: float = 600.0) -> web.Application:
  """The aiohttp application serving `session`.

  Args:
    max_body_bytes: larger request bodies get 413.
    deadline_s: a request unanswered after this many seconds gets 504 (its workflow is
      cancelled).
  """
  app = web.Application(client_max_size=max_body_bytes, middlewares=[openai_errors])
  app[SESSION_KEY] = session
  app[DEADLINE_KEY] = float(deadline_s)
  app[MAX_BODY_KEY] = int(max_body_bytes)
  app.router.add_get("/v1/models", list_models)
  app.router.add_post("/v1/chat/completions", chat_completions)
  app.router.add_post("/v1/feedback", feedback)
  app.router.add_get("/v1/routes", routes)
  app.router.add_get("/v1/memory", memory)
  app.router.add_get("/health", health)

  async def start(app):
    await session.start()

  async def close(app):
    await session.aclose()
  app.on_startup.append(start)
  app.on_cleanup.append(close)
  return app


def serve(session: session_lib.RouterSession, *, host: str, port: int, max_body_bytes: int,
          deadline_s: float, print_fn=print) -> None:
  """Serves until SIGINT or SIGTERM, then flushes the memory and closes the backends.

  Prints one line "serving graphplanner ... on http://HOST:PORT/v1" once it accepts connections
  (port 0 picks a free port; the line names it)."""
  app = make_app(session, max_body_bytes=max_body_bytes, deadline_s=deadline_s)

  async def main():
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1] if runner.addresses else port
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
      loop.add_signal_handler(sig, stop.set)
    print_fn(f"serving {session_lib.ROUTER_MODEL} (alpha {session.alpha:g}, backbones "
             f"{', '.join(session.backbones)}) on http://{host}:{bound}/v1", flush=True)
    try:
      await stop.wait()
    finally:
      await runner.cleanup()   # stops accepting, finishes handlers, runs on_cleanup (flush)

  asyncio.run(main())
