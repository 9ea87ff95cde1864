"""Answering a checked chat request (openai_schema.ChatRequest): the router's workflow or one
backbone call (`run`), within the server's deadline (`serve`), and what a completion adds to
OpenAI's fields (the `graphplanner` extension and the x-gp-* headers)."""
from __future__ import annotations

import asyncio

from aiohttp import web

from gp_jax.serving.engine import admission as admission_lib
from gp_jax.serving.engine import requests as requests_lib
from gp_jax.serving.engine import session as session_lib
from gp_jax.serving.http import app_keys
from gp_jax.serving.http import errors as http_errors
from gp_jax.serving.http import openai_schema


def extension(record: dict) -> dict:
  """The completion's `graphplanner` field: its route, cost, task, timing, router version."""
  route = [{k: c[k] for k in ("step", "role", "llm", "node", "input_tokens", "output_tokens",
                              "cost_usd", "latency_s", "error")} for c in record["calls"]]
  return dict(route=route, cost_usd=record["cost_usd"], task=record["task"],
              history_rows=record["history_rows"], alpha=record["alpha"],
              timing=record["timing"], version=record.get("router_version"),
              explored=record.get("explored", False))


def headers(record: dict) -> dict:
  """A served completion's x-gp-route ("role:llm,..."), x-gp-cost-usd and x-gp-request-id."""
  route = ",".join(f"{c['role']}:{c['llm']}" for c in record["calls"])
  return {"x-gp-route": route, "x-gp-cost-usd": f"{record['cost_usd']:.10g}",
          "x-gp-request-id": record["id"]}


def capped_key(request: web.Request) -> str | None:
  """The name of the client key whose concurrency cap a request counts against (None: an admin
  key, or a server without keys: not capped)."""
  who = request.get(app_keys.PRINCIPAL)
  return None if who is None or who.is_admin else who.name


def run(s: session_lib.RouterSession, req: openai_schema.ChatRequest, rid: str, xrid: str,
        admission: admission_lib.Admission, on_delta=None, key: str | None = None):
  """The coroutine answering `req`: the router's workflow, or one backbone call. key: the name
  of the API key that asked (None without keys)."""
  if req.model == requests_lib.ROUTER_MODEL:
    return s.complete(req.query, task=req.task, rid=rid, seed=req.seed, params=req.params,
                      conversation=req.conversation, on_delta=on_delta, admission=admission,
                      request_id=xrid, key=key)
  return s.passthrough(req.model, req.messages, req.params, task=req.task, rid=rid,
                       on_delta=on_delta, admission=admission, request_id=xrid, key=key)


async def serve(request: web.Request, s: session_lib.RouterSession,
                req: openai_schema.ChatRequest, rid: str,
                admission: admission_lib.Admission) -> requests_lib.Served:
  """The answer within the deadline; a client that disconnects cancels it (handler
  cancellation)."""
  deadline = request.app[app_keys.DEADLINE_KEY]
  try:
    async with asyncio.timeout(deadline):
      return await run(s, req, rid, request[app_keys.REQUEST_ID_KEY], admission,
                       key=app_keys.key_name(request))
  except TimeoutError:
    s.counters["timeout"] += 1
    raise http_errors.RequestError(504, f"no answer within the server's deadline of "
                                   f"{deadline:g} s", "timeout") from None
  except asyncio.CancelledError:
    s.counters["client_gone"] += 1
    raise
  finally:
    admission.cancel()   # a place never used (no-op once the request held its slot)
