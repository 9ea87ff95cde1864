"""The handlers of a router server's endpoints (the list in app.py's docstring): each reads the
app's session (app_keys) and answers JSON; a chat completion also streams (sse.py)."""
from __future__ import annotations

import logging
import math
import os

from aiohttp import web

from gp_jax.serving.engine import requests as requests_lib
from gp_jax.serving.http import app_keys
from gp_jax.serving.http import auth
from gp_jax.serving.http import completion as completion_lib
from gp_jax.serving.http import errors as http_errors
from gp_jax.serving.http import metrics as metrics_lib
from gp_jax.serving.http import openai_schema
from gp_jax.serving.http import sse

MAX_ROUTES_PAGE = 1000       # most records of one /v1/routes page (a larger limit is capped)


def _no_paths(value):
  """`value` with every absolute path reduced to its last part (no server layout in answers)."""
  if isinstance(value, dict):
    return {k: _no_paths(v) for k, v in value.items()}
  if isinstance(value, list):
    return [_no_paths(v) for v in value]
  if isinstance(value, str) and os.path.isabs(value):
    return os.path.basename(value.rstrip("/")) or "/"
  return value


async def list_models(request: web.Request) -> web.Response:
  s = request.app[app_keys.SESSION_KEY]
  created = int(s.workdir.stat().st_mtime) if s.workdir.exists() else 0
  data = [dict(id=requests_lib.ROUTER_MODEL, object="model", created=created, owned_by="gp_jax",
               alpha=s.alpha, kind="router")]
  data += [dict(id=m, object="model", created=created, owned_by="gp_jax", kind="backbone")
           for m in s.backbones]
  return web.json_response({"object": "list", "data": data})


async def chat_completions(request: web.Request) -> web.StreamResponse:
  s = request.app[app_keys.SESSION_KEY]
  req = openai_schema.chat_request(await openai_schema.json_body(request), s)
  rid = requests_lib.new_id()
  # 429 now, before any wait, when the queue is full or the client key holds its cap
  admission = s.admit(completion_lib.capped_key(request))
  if req.stream:
    return await sse.stream(request, s, req, rid, admission)
  served = await completion_lib.serve(request, s, req, rid, admission)
  rec = served.record
  request.app[app_keys.METRICS_KEY].served(rec)
  out = {"id": rid, "object": "chat.completion", "created": int(rec["created"]),
         "model": req.model,
         "choices": [{"index": 0, "message": {"role": "assistant", "content": served.answer},
                      "finish_reason": rec["finish_reason"], "logprobs": None}],
         "usage": rec["usage"], "graphplanner": completion_lib.extension(rec)}
  return web.json_response(out, headers=completion_lib.headers(rec))


async def feedback(request: web.Request) -> web.Response:
  s = request.app[app_keys.SESSION_KEY]
  body = await openai_schema.json_body(request)
  rid = body.get("id")
  if not isinstance(rid, str) or not rid:
    raise http_errors.RequestError(400, "id (the completion's id) is required",
                                   "invalid_parameter", "id")
  score = body.get("score")
  if (not isinstance(score, (int, float)) or isinstance(score, bool) or not math.isfinite(score)
      or not 0.0 <= score <= 1.0):
    raise http_errors.RequestError(400, f"score must be a number in [0, 1], got {score!r}",
                                   "invalid_score", "score")
  who = request.get(app_keys.PRINCIPAL) or auth.ANONYMOUS
  rec = await s.route(rid)
  if rec is not None and not auth.may_feedback(who, rec):
    # Exactly the unknown-id answer: a client cannot tell another key's id from a made-up one.
    raise http_errors.RequestError(404, f"no served completion with id {rid!r}", "unknown_id",
                                   "id")
  out = await s.feedback(rid, float(score), key=who.name, record=rec)
  return web.json_response(dict(out, object="feedback"))


async def routes(request: web.Request) -> web.Response:
  """A page of the route log: `after=SEQ` (records are numbered by the store as they finish, so
  pages by seq never skip one), or `since=T` (created after unix time T: a request created
  before T' but finished after a page was read would be skipped, so not for paging)."""
  s = request.app[app_keys.SESSION_KEY]
  q = request.query
  try:
    limit = min(int(q.get("limit", str(MAX_ROUTES_PAGE))), MAX_ROUTES_PAGE)
    after = int(q.get("after", "0"))
    since = float(q["since"]) if "since" in q else None
  except ValueError:
    raise http_errors.RequestError(400, "after must be an integer seq, since a unix time and "
                                   "limit an integer", "invalid_parameter", "after") from None
  if limit < 1 or after < 0 or (since is not None and not math.isfinite(since)):
    raise http_errors.RequestError(400, "limit must be >= 1, after >= 0 and since a finite unix "
                                   "time", "invalid_parameter", "limit")
  if since is not None:
    data = await s.routes_since(since, limit)
    return web.json_response({"object": "list", "data": data,
                              "last": data[-1]["created"] if data else since})
  data = await s.routes_after(after, limit)
  return web.json_response({"object": "list", "data": data,
                            "last": data[-1]["seq"] if data else after})


async def memory(request: web.Request) -> web.Response:
  return web.json_response(_no_paths(request.app[app_keys.SESSION_KEY].memory_info()))


async def router_versions(request: web.Request) -> web.Response:
  return web.json_response(request.app[app_keys.SESSION_KEY].router_versions())


async def rollback(request: web.Request) -> web.Response:
  body = await openai_schema.json_body(request)
  version = body.get("version")
  if not isinstance(version, str) or not version or set(body) - {"version"}:
    raise http_errors.RequestError(400, 'the body must be {"version": "<a version id of '
                                   '/v1/router/versions>"}', "invalid_parameter", "version")
  return web.json_response(await request.app[app_keys.SESSION_KEY].rollback(version))


async def resume(request: web.Request) -> web.Response:
  """Ends the pause of learning that a rollback began (the body is {})."""
  body = await openai_schema.json_body(request)
  if body:
    raise http_errors.RequestError(400, "the body must be {}", "invalid_parameter",
                                   sorted(body)[0])
  return web.json_response(await request.app[app_keys.SESSION_KEY].resume())


async def health(request: web.Request) -> web.Response:
  """Up or down for everyone: 200 {"status": "ok"}, or 503 {"status": "down"} when the session
  says it cannot serve (a status other than "ok", e.g. a store that cannot keep feedback, or no
  health at all). Only an admin
  (auth.health_details) reads the details: counters, memory, learner, traffic."""
  try:
    h = request.app[app_keys.SESSION_KEY].health()
  except Exception:   # a probe must get an answer: the session cannot say it is fine, so down
    logging.getLogger(__name__).exception("/health: the session's health failed")
    h = dict(status="down")
  up = h.get("status") == "ok"
  body = (_no_paths(dict(h, status="ok" if up else "down"))
          if auth.health_details(request.get(app_keys.PRINCIPAL)) else
          {"status": "ok" if up else "down"})
  return web.json_response(body, status=200 if up else 503)


async def prometheus(request: web.Request) -> web.Response:
  body = request.app[app_keys.METRICS_KEY].render()
  return web.Response(body=body, headers={"Content-Type": metrics_lib.CONTENT_TYPE})
