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
  POST /v1/router/rollback   {"version": id}: serve that accepted version again (admin)
  GET  /health               liveness and counters
  GET  /metrics              Prometheus text format (metrics.py)

Every request first passes the gate (guard.py): Host header, Content-Type of POST bodies, API key
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
`rate_limit_exceeded` or a full wait queue 429 `server_overloaded` (both with Retry-After), a
request the backbones could not answer 502, one past the deadline 504; after a stream opened, an
SSE error event. An unexpected error is a 500 that names the request id only; its details go to
the server log. No error body carries exception text or file paths. A client that disconnects
cancels its chat completion (handler cancellation); other requests finish.
"""
from __future__ import annotations

import asyncio
import dataclasses
import gc
import json
import logging
import math
import os
import re
import signal
import time
import uuid

from aiohttp import web

from gp_jax import errors
from gp_jax.llm import base
from gp_jax.runs.serving import auth
from gp_jax.runs.serving import conversation as conversation_lib
from gp_jax.runs.serving import guard as guard_lib
from gp_jax.runs.serving import metrics as metrics_lib
from gp_jax.runs.serving import ratelimit
from gp_jax.runs.serving import session as session_lib

RequestError = session_lib.RequestError
SESSION_KEY = web.AppKey("session", session_lib.RouterSession)
DEADLINE_KEY = web.AppKey("deadline_s", float)
MAX_BODY_KEY = web.AppKey("max_body_bytes", int)
GUARD_KEY = web.AppKey("guard", guard_lib.Guard)
METRICS_KEY = web.AppKey("metrics", metrics_lib.Metrics)
PRINCIPAL = web.RequestKey("principal", object)   # the auth.Principal the gate let in (or None)
MAX_ROUTES_PAGE = 1000       # most records of one /v1/routes page (a larger limit is capped)
STREAM_PIECE_CHARS = 24     # characters of the answer per SSE chunk
KEEPALIVE_KEY = web.AppKey("keepalive_s", float)
REQUEST_ID_KEY = web.RequestKey("request_id", str)
KEEPALIVE = b": keep-alive\n\n"   # an SSE comment: clients skip it, proxies see traffic
_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 403: "permission_error",
          404: "not_found_error", 405: "invalid_request_error", 409: "conflict_error",
          413: "invalid_request_error", 415: "invalid_request_error",
          421: "invalid_request_error", 429: "rate_limit_error", 500: "server_error",
          502: "backbone_error", 503: "server_error", 504: "timeout_error"}
_CLIENT_REQUEST_ID = re.compile(r"[\x21-\x7e]{1,128}")   # printable ASCII, no spaces
CHAT_PATH = "/v1/chat/completions"


def _error_body(status: int, message: str, code: str | None, param: str | None) -> dict:
  return {"error": {"message": message, "type": _TYPES.get(status, "server_error"),
                    "param": param, "code": code}}


def error_response(status: int, message: str, code: str | None = None,
                   param: str | None = None, headers: dict | None = None) -> web.Response:
  return web.json_response(_error_body(status, message, code, param), status=status,
                           headers=headers)


def _request_id(request: web.Request) -> str:
  """The request's x-request-id (request_ids set it; a new one if the request never got there)."""
  return request.get(REQUEST_ID_KEY) or "req-" + uuid.uuid4().hex


@web.middleware
async def finish_despite_disconnect(request: web.Request, handler):
  """A client that disconnects cancels its chat completion (the server runs with aiohttp's
  handler_cancellation); every other request (feedback, reads) runs to its end regardless, so a
  write that was started is finished and logged."""
  if request.path == CHAT_PATH:
    return await handler(request)
  return await asyncio.shield(handler(request))


@web.middleware
async def request_ids(request: web.Request, handler):
  """Every response carries `x-request-id`: the client's (printable ASCII, at most 128
  characters) or, when absent or unsafe, a new one."""
  given = request.headers.get("x-request-id")
  xrid = given if given is not None and _CLIENT_REQUEST_ID.fullmatch(given) else (
      "req-" + uuid.uuid4().hex)
  request[REQUEST_ID_KEY] = xrid
  try:
    resp = await handler(request)
  except web.HTTPException as e:
    e.headers["x-request-id"] = xrid
    raise
  if not resp.prepared:   # a stream sent its headers itself
    resp.headers["x-request-id"] = xrid
  return resp


@web.middleware
async def openai_errors(request: web.Request, handler):
  """Every failure as an OpenAI-format error; the server stays up."""
  try:
    return await handler(request)
  except RequestError as e:
    return error_response(e.status, e.message, e.code, e.param, e.headers)
  except guard_lib.Refused as e:
    return error_response(e.status, e.message, e.code, headers=e.headers)
  except web.HTTPRequestEntityTooLarge:
    return error_response(413, f"request body too large (limit "
                          f"{request.app[MAX_BODY_KEY]} bytes)", "body_too_large")
  except web.HTTPException as e:
    if e.status < 400:
      raise
    return error_response(e.status, e.reason, e.reason.lower().replace(" ", "_"))
  except (asyncio.CancelledError, KeyboardInterrupt):
    raise
  except Exception:   # a bug must not take the server down: log it, answer 500
    rid = _request_id(request)
    logging.getLogger(__name__).exception("request %s (%s %s) failed", rid, request.method,
                                          request.path)
    return error_response(500, f"internal error (request id {rid}; the details are in the "
                          "server log)", "internal_error", headers={"x-request-id": rid})


def _endpoint(request: web.Request) -> str:
  """The metrics label of a request: its route's path pattern, "other" for paths not served."""
  route = request.match_info.route
  resource = route.resource if route is not None else None
  if resource is None or isinstance(request.match_info.http_exception, web.HTTPException):
    return "other"
  return resource.canonical


@web.middleware
async def observe(request: web.Request, handler):
  """Counts every answered request by endpoint and status, with its latency (outermost)."""
  m = request.app[METRICS_KEY]
  t0 = time.perf_counter()
  status = 499   # the client went away before an answer (the handler was cancelled)
  try:
    resp = await handler(request)
    status = resp.status
    return resp
  except web.HTTPException as e:
    status = e.status
    raise
  finally:
    m.request(_endpoint(request), status, time.perf_counter() - t0)


@web.middleware
async def gate(request: web.Request, handler):
  """Host, Content-Type, key, role and rate limits (guard.py) before any handler."""
  request[PRINCIPAL] = request.app[GUARD_KEY].check(request)
  return await handler(request)


def _key_name(request: web.Request) -> str | None:
  who = request.get(PRINCIPAL)
  return who.name if who is not None else None


def _no_paths(value):
  """`value` with every absolute path reduced to its last part (no server layout in answers)."""
  if isinstance(value, dict):
    return {k: _no_paths(v) for k, v in value.items()}
  if isinstance(value, list):
    return [_no_paths(v) for v in value]
  if isinstance(value, str) and os.path.isabs(value):
    return os.path.basename(value.rstrip("/")) or "/"
  return value


async def _json_body(request: web.Request) -> dict:
  raw = await request.read()   # over client_max_size: HTTPRequestEntityTooLarge (413)
  try:
    body = json.loads(raw)
  except json.JSONDecodeError as e:
    raise RequestError(400, f"request body is not valid JSON (line {e.lineno}, column "
                       f"{e.colno})", "invalid_json") from None
  except UnicodeDecodeError:
    raise RequestError(400, "request body is not valid JSON (not UTF-8)", "invalid_json") from None
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
  """The messages as {role, content text}; roles system, developer, user and assistant."""
  msgs = body.get("messages")
  if not isinstance(msgs, list) or not msgs:
    raise RequestError(400, "messages must be a non-empty list", "invalid_messages", "messages")
  out = []
  for i, m in enumerate(msgs):
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
      raise RequestError(400, f"messages[{i}] must be an object with a role",
                         "invalid_messages", f"messages[{i}]")
    role = m["role"]
    if role in ("tool", "function") or m.get("tool_calls") or m.get("function_call"):
      raise RequestError(400, f"messages[{i}]: tool and function calls are not supported by "
                         "this server", "unsupported_parameter", f"messages[{i}]")
    if role not in conversation_lib.LABELS:
      raise RequestError(400, f"messages[{i}].role must be one of "
                         f"{', '.join(conversation_lib.LABELS)}, got {role[:40]!r}",
                         "invalid_messages", f"messages[{i}].role")
    text = _text_of(m.get("content"))
    if text is None:
      if role == "assistant" and m.get("content") is None:
        text = ""   # e.g. a refusal turn: no text to keep
      else:
        raise RequestError(400, f"messages[{i}].content must be a string or text parts",
                           "invalid_messages", f"messages[{i}].content")
    out.append({"role": role, "content": text})
  users = [m for m in out if m["role"] == "user"]
  if not users or not users[-1]["content"].strip():
    raise RequestError(400, "no user message: the last user message is the query, and it must "
                       "not be empty", "no_user_message", "messages")
  return out


# Fields of OpenAI's chat API this server cannot honour: a value other than the accepted ones is
# refused (400 unsupported_parameter naming the field) instead of being silently ignored.
_UNSUPPORTED = {
    "tools": (None, []), "tool_choice": (None, "none"), "functions": (None, []),
    "function_call": (None, "none"), "logprobs": (None, False), "top_logprobs": (None, 0),
    "n": (None, 1), "audio": (None,), "modalities": (None, ["text"]), "prediction": (None,),
    "logit_bias": (None, {}), "presence_penalty": (None, 0), "frequency_penalty": (None, 0),
    "web_search_options": (None,), "reasoning_effort": (None,),
}


def _accepted(v, accepted: tuple) -> bool:
  for a in accepted:
    if a is None or isinstance(a, bool):
      ok = v is a
    elif isinstance(a, (int, float)):
      ok = isinstance(v, (int, float)) and not isinstance(v, bool) and v == a
    else:
      ok = v == a
    if ok:
      return True
  return False


def _refuse_unsupported(body: dict) -> None:
  for key, accepted in _UNSUPPORTED.items():
    if not _accepted(body.get(key), accepted):
      raise RequestError(400, f"{key} is not supported by this server (accepted: "
                         f"{' or '.join(json.dumps(a) for a in accepted)})",
                         "unsupported_parameter", key)
  fmt = body.get("response_format")
  if fmt is not None and fmt != {"type": "text"}:
    raise RequestError(400, "response_format is not supported by this server (accepted: "
                       '{"type": "text"})', "unsupported_parameter", "response_format")


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
  """The request's sampling (the served config's values where it gives none)."""
  stop = body.get("stop")
  if isinstance(stop, str):
    stop = (stop,)
  elif stop is None:
    stop = ()
  elif (isinstance(stop, list) and len(stop) <= 4
        and all(isinstance(x, str) and x for x in stop)):
    stop = tuple(stop)
  else:
    raise RequestError(400, "stop must be a string or a list of at most 4 non-empty strings",
                       "invalid_parameter", "stop")
  t = _number(body, "temperature", 0.0, 2.0)
  top_p = _number(body, "top_p", 0.0, 1.0)
  mt = _number(body, "max_completion_tokens", 1, 1 << 20, True) or _number(
      body, "max_tokens", 1, 1 << 20, True)
  seed = _number(body, "seed", -(1 << 63), (1 << 63) - 1, True)
  return base.SamplingParams(temperature=default.temperature if t is None else t,
                             max_tokens=default.max_tokens if mt is None else mt,
                             top_p=default.top_p if top_p is None else top_p,
                             seed=default.seed if seed is None else seed,
                             stop=stop or default.stop)


def _extension(record: dict) -> dict:
  route = [{k: c[k] for k in ("step", "role", "llm", "node", "input_tokens", "output_tokens",
                              "cost_usd", "latency_s", "error")} for c in record["calls"]]
  return dict(route=route, cost_usd=record["cost_usd"], task=record["task"],
              history_rows=record["history_rows"], alpha=record["alpha"],
              timing=record["timing"], version=record.get("router_version"),
              explored=record.get("explored", False))


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
  messages: list          # {role, content text}
  query: str              # the last user message
  conversation: str       # the other messages as workflow context (conversation.render)
  stream: bool
  include_usage: bool
  task: str | None
  params: base.SamplingParams
  seed: int | None


async def chat_completions(request: web.Request) -> web.StreamResponse:
  s = request.app[SESSION_KEY]
  req = _chat_request(await _json_body(request), s)
  rid = session_lib.new_id()
  admission = s.admit()   # 429 now, before any wait, when the queue is full
  if req.stream:
    return await _stream(request, s, req, rid, admission)
  served = await _serve(request, s, req, rid, admission)
  rec = served.record
  request.app[METRICS_KEY].served(rec)
  out = {"id": rid, "object": "chat.completion", "created": int(rec["created"]),
         "model": req.model,
         "choices": [{"index": 0, "message": {"role": "assistant", "content": served.answer},
                      "finish_reason": rec["finish_reason"], "logprobs": None}],
         "usage": rec["usage"], "graphplanner": _extension(rec)}
  return web.json_response(out, headers=_headers(rec))


def _chat_request(body: dict, s: session_lib.RouterSession) -> _ChatRequest:
  """The body's fields, checked in order (the first bad one is the 400 or 404)."""
  model = body.get("model")
  if not isinstance(model, str) or not model:
    raise RequestError(400, "model is required", "invalid_parameter", "model")
  if model != session_lib.ROUTER_MODEL and model not in s.backbones:
    raise RequestError(404, f"model {model[:100]!r} not found; served: "
                       f"{', '.join((session_lib.ROUTER_MODEL,) + s.backbones)}",
                       "model_not_found", "model")
  _refuse_unsupported(body)
  messages = _messages(body)
  stream = body.get("stream", False)
  if not isinstance(stream, bool):
    raise RequestError(400, "stream must be a boolean", "invalid_parameter", "stream")
  stream_options = body.get("stream_options") or {}
  if not isinstance(stream_options, dict):
    raise RequestError(400, "stream_options must be an object", "invalid_parameter",
                       "stream_options")
  task = _task_hint(body)
  s.check_task(task)
  params = _sampling(body, s.system.sampling)
  seed = body.get("seed") if isinstance(body.get("seed"), int) else None
  # Backbones take the four roles; "developer" is OpenAI's newer name for "system".
  messages = [dict(m, role="system") if m["role"] == "developer" else m for m in messages]
  return _ChatRequest(model, messages, session_lib.last_user_text(messages),
                      conversation_lib.render(messages), stream,
                      bool(stream_options.get("include_usage")), task, params, seed)


def _run(s: session_lib.RouterSession, req: _ChatRequest, rid: str, xrid: str,
         admission: session_lib.Admission, on_delta=None, key: str | None = None):
  """The coroutine answering `req`: the router's workflow, or one backbone call. key: the name
  of the API key that asked (None without keys)."""
  if req.model == session_lib.ROUTER_MODEL:
    return s.complete(req.query, task=req.task, rid=rid, seed=req.seed, params=req.params,
                      conversation=req.conversation, on_delta=on_delta, admission=admission,
                      request_id=xrid, key=key)
  return s.passthrough(req.model, req.messages, req.params, task=req.task, rid=rid,
                       on_delta=on_delta, admission=admission, request_id=xrid, key=key)


async def _serve(request: web.Request, s: session_lib.RouterSession, req: _ChatRequest,
                 rid: str, admission: session_lib.Admission) -> session_lib.Served:
  """The answer within the deadline; a client that disconnects cancels it (handler
  cancellation)."""
  deadline = request.app[DEADLINE_KEY]
  try:
    async with asyncio.timeout(deadline):
      return await _run(s, req, rid, request[REQUEST_ID_KEY], admission,
                        key=_key_name(request))
  except TimeoutError:
    s.counters["timeout"] += 1
    raise RequestError(504, f"no answer within the server's deadline of {deadline:g} s",
                       "timeout") from None
  except asyncio.CancelledError:
    s.counters["client_gone"] += 1
    raise
  finally:
    admission.cancel()   # a place never used (no-op once the request held its slot)


def _sse(obj) -> bytes:
  return f"data: {json.dumps(obj)}\n\n".encode()


class _Stream:
  """One streamed chat completion: the SSE response and the task running the workflow."""

  def __init__(self, request: web.Request, s: session_lib.RouterSession, req: _ChatRequest,
               rid: str, admission: session_lib.Admission):
    self.request, self.s, self.req, self.rid, self.admission = request, s, req, rid, admission
    self.created = int(time.time())
    self.deadline_s = request.app[DEADLINE_KEY]
    self.ends = time.monotonic() + self.deadline_s
    self.events: asyncio.Queue = asyncio.Queue()
    self.work: asyncio.Task | None = None
    self.resp = web.StreamResponse(headers={
        "Content-Type": "text/event-stream", "Cache-Control": "no-cache",
        "x-request-id": request[REQUEST_ID_KEY], "x-gp-request-id": rid})

  def chunk(self, delta: dict, finish=None, **extra) -> bytes:
    return _sse({"id": self.rid, "object": "chat.completion.chunk", "created": self.created,
                 "model": self.req.model, "choices": [{"index": 0, "delta": delta,
                                                       "finish_reason": finish,
                                                       "logprobs": None}], **extra})

  async def open(self) -> None:
    """Headers and the role chunk, before the workflow runs; then the workflow's task."""
    try:
      await self.resp.prepare(self.request)
      await self.resp.write(self.chunk({"role": "assistant", "content": ""}))
    except BaseException:
      self.admission.cancel()
      raise
    self.work = asyncio.get_running_loop().create_task(_run(
        self.s, self.req, self.rid, self.request[REQUEST_ID_KEY], self.admission,
        on_delta=self.events.put_nowait, key=_key_name(self.request)))
    self.work.add_done_callback(self._finished)

  def _finished(self, t: asyncio.Task) -> None:
    self.admission.cancel()   # a task cancelled before it started never took its place
    if not t.cancelled():
      t.exception()           # retrieved here; read again in `answer`
    self.events.put_nowait(self)   # the end marker

  async def relay(self) -> bool:
    """Forwards the final call's pieces as they come, with a keep-alive comment every
    keepalive_s, until the workflow ends; whether any piece came. RequestError 504 (after
    cancelling the workflow) past the deadline."""
    keepalive = self.request.app[KEEPALIVE_KEY]
    streamed = False
    while True:
      try:
        item = await asyncio.wait_for(
            self.events.get(), max(0.0, min(keepalive, self.ends - time.monotonic())))
      except TimeoutError:
        if time.monotonic() >= self.ends:
          self.work.cancel()
          await asyncio.wait({self.work})   # its spent calls are logged before the client hears
          self.s.counters["timeout"] += 1
          raise RequestError(504, f"no answer within the server's deadline of "
                             f"{self.deadline_s:g} s", "timeout") from None
        await self.resp.write(KEEPALIVE)
        continue
      if item is self:
        return streamed
      streamed = True
      await self.resp.write(self.chunk({"content": item}))

  async def answer(self, streamed: bool) -> None:
    """The rest of the answer: its text if no piece came, the finish chunk with the route, the
    usage chunk when asked. Raises the workflow's RequestError."""
    served = self.work.result()
    rec = served.record
    self.request.app[METRICS_KEY].served(rec)
    if not streamed:   # nothing came through on_delta (e.g. an empty answer): the answer here
      text = served.answer
      for i in range(0, len(text), STREAM_PIECE_CHARS):
        await self.resp.write(self.chunk({"content": text[i:i + STREAM_PIECE_CHARS]}))
    await self.resp.write(self.chunk({}, rec["finish_reason"], graphplanner=_extension(rec)))
    if self.req.include_usage:
      await self.resp.write(_sse({"id": self.rid, "object": "chat.completion.chunk",
                                  "created": self.created, "model": self.req.model,
                                  "choices": [], "usage": rec["usage"]}))

  async def error(self, e: Exception) -> None:
    """A failure after the headers went out: one SSE error event."""
    if not isinstance(e, RequestError):
      logging.getLogger(__name__).exception("streamed request failed", exc_info=e)
      e = RequestError(500, f"internal error (request id {_request_id(self.request)}; the details "
                       "are in the server log)", "internal_error")
    await self.resp.write(b"event: error\n" + _sse(_error_body(e.status, e.message, e.code,
                                                                 e.param)))

  async def close(self) -> None:
    await self.resp.write(b"data: [DONE]\n\n")
    await self.resp.write_eof()


async def _stream(request: web.Request, s: session_lib.RouterSession, req: _ChatRequest,
                  rid: str, admission: session_lib.Admission) -> web.StreamResponse:
  """The answer as OpenAI SSE chunks. The stream opens at once (headers and the role chunk),
  then a keep-alive comment every keepalive_s while the workflow runs; the final call's text as
  the pool streams it (all at once from a pool that cannot stream); the chunk with the
  finish_reason and the route; the usage when asked; [DONE]. A failure after the stream opened
  is one SSE error event (OpenAI's error object), then [DONE]. A client that leaves cancels the
  workflow."""
  st = _Stream(request, s, req, rid, admission)
  await st.open()
  try:
    try:
      await st.answer(await st.relay())
    except (ConnectionResetError, asyncio.CancelledError):
      raise
    except Exception as e:   # RequestError, or a bug: an event of the stream
      await st.error(e)
    finally:
      if not st.work.done():
        st.work.cancel()
    await st.close()
  except ConnectionResetError:   # the client left
    s.counters["client_gone"] += 1
  except asyncio.CancelledError:   # the client left (handler cancellation)
    s.counters["client_gone"] += 1
    raise
  return st.resp


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
  who = request.get(PRINCIPAL) or auth.ANONYMOUS
  rec = await s.route(rid)
  if rec is not None and not auth.may_feedback(who, rec):
    # Exactly the unknown-id answer: a client cannot tell another key's id from a made-up one.
    raise RequestError(404, f"no served completion with id {rid!r}", "unknown_id", "id")
  out = await s.feedback(rid, float(score), key=who.name, record=rec)
  return web.json_response(dict(out, object="feedback"))


async def routes(request: web.Request) -> web.Response:
  """A page of the route log: `after=SEQ` (records are numbered by the store as they finish, so
  pages by seq never skip one), or `since=T` (created after unix time T: a request created
  before T' but finished after a page was read would be skipped, so not for paging)."""
  s = request.app[SESSION_KEY]
  q = request.query
  try:
    limit = min(int(q.get("limit", str(MAX_ROUTES_PAGE))), MAX_ROUTES_PAGE)
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
  return web.json_response(_no_paths(request.app[SESSION_KEY].memory_info()))


async def router_versions(request: web.Request) -> web.Response:
  return web.json_response(request.app[SESSION_KEY].router_versions())


async def rollback(request: web.Request) -> web.Response:
  body = await _json_body(request)
  version = body.get("version")
  if not isinstance(version, str) or not version or set(body) - {"version"}:
    raise RequestError(400, 'the body must be {"version": "<a version id of '
                       '/v1/router/versions>"}', "invalid_parameter", "version")
  return web.json_response(await request.app[SESSION_KEY].rollback(version))


async def health(request: web.Request) -> web.Response:
  if request.get(PRINCIPAL) is None:   # no valid key (keys are set): liveness only
    return web.json_response({"status": "ok"})
  return web.json_response(_no_paths(request.app[SESSION_KEY].health()))


async def prometheus(request: web.Request) -> web.Response:
  body = request.app[METRICS_KEY].render()
  return web.Response(body=body, headers={"Content-Type": metrics_lib.CONTENT_TYPE})


def make_app(session: session_lib.RouterSession, *, max_body_bytes: int = 1 << 20,
             deadline_s: float = 600.0, keys: auth.KeyRing | None = None,
             host: str = "127.0.0.1", allowed_hosts=(), rate_limit_rps: float = 0.0,
             rate_limit_burst: int = 20, feedback_rps: float = 0.0,
             keepalive_s: float = 5.0) -> web.Application:
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
  """
  if keepalive_s <= 0:
    raise errors.ConfigError(f"--keepalive_s must be > 0, got {keepalive_s}")
  app = web.Application(client_max_size=max_body_bytes,
                        middlewares=[finish_despite_disconnect, observe, request_ids,
                                     openai_errors, gate])
  app[SESSION_KEY] = session
  app[DEADLINE_KEY] = float(deadline_s)
  app[MAX_BODY_KEY] = int(max_body_bytes)
  app[KEEPALIVE_KEY] = float(keepalive_s)
  app[METRICS_KEY] = metrics = metrics_lib.Metrics(session)
  app[GUARD_KEY] = guard_lib.Guard(
      keys, auth.HostCheck(host, allowed_hosts),
      ratelimit.TokenBuckets(rate_limit_rps, rate_limit_burst),
      ratelimit.TokenBuckets(feedback_rps, rate_limit_burst), metrics)
  app.router.add_get("/v1/models", list_models)
  app.router.add_post("/v1/chat/completions", chat_completions)
  app.router.add_post("/v1/feedback", feedback)
  app.router.add_get("/v1/routes", routes)
  app.router.add_get("/v1/memory", memory)
  app.router.add_get("/v1/router/versions", router_versions)
  app.router.add_post("/v1/router/rollback", rollback)
  app.router.add_get("/health", health)
  app.router.add_get("/metrics", prometheus)

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
          keepalive_s: float = 5.0, print_fn=print) -> None:
  """Serves until SIGINT or SIGTERM, then flushes the memory and closes the backends.

  Prints one line "serving graphplanner ... on http://HOST:PORT/v1" once it accepts connections
  (port 0 picks a free port; the line names it). Refuses (ConfigError) a non-loopback `host`
  without `keys`."""
  auth.check_bind(host, keys)
  app = make_app(session, max_body_bytes=max_body_bytes, deadline_s=deadline_s, keys=keys,
                 host=host, allowed_hosts=allowed_hosts, rate_limit_rps=rate_limit_rps,
                 rate_limit_burst=rate_limit_burst, feedback_rps=feedback_rps,
                 keepalive_s=keepalive_s)

  async def main():
    # handler_cancellation: aiohttp (3.7+) leaves a handler running when its client disconnects
    # unless asked; a chat completion is then cancelled (finish_despite_disconnect keeps the rest).
    runner = web.AppRunner(app, access_log=None, handle_signals=False, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1] if runner.addresses else port
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
      loop.add_signal_handler(sig, stop.set)
    # The heap built at start (JAX, the model, the memory) is moved out of the collector's
    # reach: a full collection scanned it on the event loop for 77 to 138 ms, stalling every
    # decision in flight (docs/serving.md, the fifth overhead look). Later objects are collected
    # as before.
    gc.collect()
    gc.freeze()
    print_fn(f"serving {session_lib.ROUTER_MODEL} (alpha {session.alpha:g}, backbones "
             f"{', '.join(session.backbones)}) on http://{host}:{bound}/v1", flush=True)
    try:
      await stop.wait()
    finally:
      await runner.cleanup()   # stops accepting, finishes handlers, runs on_cleanup (flush)

  asyncio.run(main())
