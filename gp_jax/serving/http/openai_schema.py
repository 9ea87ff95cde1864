"""The OpenAI chat request a router server takes: the body's JSON, its messages, the fields it
refuses (unsupported_parameter) and the sampling it asks for, checked into a ChatRequest (the
first bad field is the 400 or 404). A `max_tokens` (or `max_completion_tokens`) above the served
config's sampling.max_tokens is clamped to it (docs/serving.md, Bounds)."""
from __future__ import annotations

import dataclasses
import json
import math

from aiohttp import web

from gp_jax.llm import base
from gp_jax.serving.engine import conversation as conversation_lib
from gp_jax.serving.engine import requests as requests_lib
from gp_jax.serving.engine import session as session_lib
from gp_jax.serving.http import errors as http_errors


async def json_body(request: web.Request) -> dict:
  raw = await request.read()   # over client_max_size: HTTPRequestEntityTooLarge (413)
  try:
    body = json.loads(raw)
  except json.JSONDecodeError as e:
    raise http_errors.RequestError(400, f"request body is not valid JSON (line {e.lineno}, "
                                   f"column {e.colno})", "invalid_json") from None
  except UnicodeDecodeError:
    raise http_errors.RequestError(400, "request body is not valid JSON (not UTF-8)",
                                   "invalid_json") from None
  if not isinstance(body, dict):
    raise http_errors.RequestError(400, "request body must be a JSON object", "invalid_json")
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
    raise http_errors.RequestError(400, "messages must be a non-empty list", "invalid_messages",
                                   "messages")
  out = []
  for i, m in enumerate(msgs):
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
      raise http_errors.RequestError(400, f"messages[{i}] must be an object with a role",
                                     "invalid_messages", f"messages[{i}]")
    role = m["role"]
    if role in ("tool", "function") or m.get("tool_calls") or m.get("function_call"):
      raise http_errors.RequestError(400, f"messages[{i}]: tool and function calls are not "
                                     "supported by this server", "unsupported_parameter",
                                     f"messages[{i}]")
    if role not in conversation_lib.LABELS:
      raise http_errors.RequestError(400, f"messages[{i}].role must be one of "
                                     f"{', '.join(conversation_lib.LABELS)}, got {role[:40]!r}",
                                     "invalid_messages", f"messages[{i}].role")
    text = _text_of(m.get("content"))
    if text is None:
      if role == "assistant" and m.get("content") is None:
        text = ""   # e.g. a refusal turn: no text to keep
      else:
        raise http_errors.RequestError(400, f"messages[{i}].content must be a string or text "
                                       "parts", "invalid_messages", f"messages[{i}].content")
    out.append({"role": role, "content": text})
  users = [m for m in out if m["role"] == "user"]
  if not users or not users[-1]["content"].strip():
    raise http_errors.RequestError(400, "no user message: the last user message is the query, "
                                   "and it must not be empty", "no_user_message", "messages")
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
      raise http_errors.RequestError(400, f"{key} is not supported by this server (accepted: "
                                     f"{' or '.join(json.dumps(a) for a in accepted)})",
                                     "unsupported_parameter", key)
  fmt = body.get("response_format")
  if fmt is not None and fmt != {"type": "text"}:
    raise http_errors.RequestError(400, "response_format is not supported by this server "
                                   '(accepted: {"type": "text"})', "unsupported_parameter",
                                   "response_format")


def _number(body: dict, key: str, lo: float, hi: float, integer: bool = False):
  v = body.get(key)
  if v is None:
    return None
  ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
  if not ok or not lo <= v <= hi or (integer and int(v) != v):
    raise http_errors.RequestError(400, f"{key} must be a{'n integer' if integer else ' number'}"
                                   f" in [{lo}, {hi}], got {v!r}", "invalid_parameter", key)
  return int(v) if integer else float(v)


def _task_hint(body: dict) -> str | None:
  meta = body.get("metadata")
  if meta is None:
    return None
  if not isinstance(meta, dict):
    raise http_errors.RequestError(400, "metadata must be an object", "invalid_parameter",
                                   "metadata")
  task = meta.get("task")
  if task is not None and not isinstance(task, str):
    raise http_errors.RequestError(400, "metadata.task must be a string", "invalid_parameter",
                                   "metadata.task")
  return task


def _sampling(body: dict, default: base.SamplingParams) -> base.SamplingParams:
  """The request's sampling (the served config's values where it gives none). Its token cap is
  at most the served config's: a larger one is clamped to it, so one request cannot hold a slot
  and the stream's buffers for more tokens than the operator set."""
  stop = body.get("stop")
  if isinstance(stop, str):
    stop = (stop,)
  elif stop is None:
    stop = ()
  elif (isinstance(stop, list) and len(stop) <= 4
        and all(isinstance(x, str) and x for x in stop)):
    stop = tuple(stop)
  else:
    raise http_errors.RequestError(400, "stop must be a string or a list of at most 4 non-empty "
                                   "strings", "invalid_parameter", "stop")
  t = _number(body, "temperature", 0.0, 2.0)
  top_p = _number(body, "top_p", 0.0, 1.0)
  mt = _number(body, "max_completion_tokens", 1, 1 << 20, True) or _number(
      body, "max_tokens", 1, 1 << 20, True)
  seed = _number(body, "seed", -(1 << 63), (1 << 63) - 1, True)
  return base.SamplingParams(temperature=default.temperature if t is None else t,
                             max_tokens=default.max_tokens if mt is None else min(
                                 mt, default.max_tokens),
                             top_p=default.top_p if top_p is None else top_p,
                             seed=default.seed if seed is None else seed,
                             stop=stop or default.stop)


@dataclasses.dataclass(frozen=True)
class ChatRequest:
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


def chat_request(body: dict, s: session_lib.RouterSession) -> ChatRequest:
  """The body's fields, checked in order (the first bad one is the 400 or 404)."""
  model = body.get("model")
  if not isinstance(model, str) or not model:
    raise http_errors.RequestError(400, "model is required", "invalid_parameter", "model")
  if model != requests_lib.ROUTER_MODEL and model not in s.backbones:
    raise http_errors.RequestError(404, f"model {model[:100]!r} not found; served: "
                                   f"{', '.join((requests_lib.ROUTER_MODEL,) + s.backbones)}",
                                   "model_not_found", "model")
  _refuse_unsupported(body)
  messages = _messages(body)
  stream = body.get("stream", False)
  if not isinstance(stream, bool):
    raise http_errors.RequestError(400, "stream must be a boolean", "invalid_parameter", "stream")
  stream_options = body.get("stream_options") or {}
  if not isinstance(stream_options, dict):
    raise http_errors.RequestError(400, "stream_options must be an object", "invalid_parameter",
                                   "stream_options")
  task = _task_hint(body)
  s.check_task(task)
  params = _sampling(body, s.system.sampling)
  seed = body.get("seed") if isinstance(body.get("seed"), int) else None
  # Backbones take the four roles; "developer" is OpenAI's newer name for "system".
  messages = [dict(m, role="system") if m["role"] == "developer" else m for m in messages]
  return ChatRequest(model, messages, requests_lib.last_user_text(messages),
                     conversation_lib.render(messages), stream,
                     bool(stream_options.get("include_usage")), task, params, seed)
