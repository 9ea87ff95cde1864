"""Errors in OpenAI's format, {"error": {"message", "type", "param", "code"}}: RequestError for
what the HTTP layer refuses itself (a body that does not parse, a request past the deadline ...),
the one mapping from the engine's refusals (engine/errors.py) to HTTP statuses and headers, and
the error body and response."""
from __future__ import annotations

from aiohttp import web

from gp_jax.serving.engine import errors as engine_errors

_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 403: "permission_error",
          404: "not_found_error", 405: "invalid_request_error", 409: "conflict_error",
          413: "invalid_request_error", 415: "invalid_request_error",
          421: "invalid_request_error", 429: "rate_limit_error", 500: "server_error",
          502: "backbone_error", 503: "server_error", 504: "timeout_error"}
_STATUS = {engine_errors.INVALID: 400, engine_errors.NOT_FOUND: 404,
           engine_errors.CONFLICT: 409, engine_errors.OVERLOADED: 429,
           engine_errors.BACKBONE: 502, engine_errors.UNAVAILABLE: 503}


class RequestError(Exception):
  """A request the server answers with an OpenAI-format error (HTTP status, message, code, and
  extra response headers such as Retry-After)."""

  def __init__(self, status: int, message: str, code: str, param: str | None = None,
               headers: dict | None = None):
    super().__init__(message)
    self.status, self.message, self.code, self.param = status, message, code, param
    self.headers = dict(headers or {})


def from_refusal(refusal: engine_errors.Refusal) -> RequestError:
  """The HTTP answer to an engine refusal: its kind's status; Retry-After when it says when to
  come back (overloaded); the completion id (x-gp-request-id) and the $ cost spent
  (x-gp-cost-usd) when a failed request was logged all the same (backbone)."""
  headers = {}
  if refusal.retry_after_s is not None:
    headers["Retry-After"] = str(refusal.retry_after_s)
  details = refusal.details
  if "request_id" in details and "cost_usd" in details:
    headers["x-gp-request-id"] = details["request_id"]
    headers["x-gp-cost-usd"] = f"{details['cost_usd']:.10g}"
  return RequestError(_STATUS[refusal.kind], refusal.message, refusal.code, refusal.param,
                      headers)


def as_request_error(e: Exception) -> RequestError | None:
  """`e` as the RequestError it is answered with (an engine refusal mapped by `from_refusal`);
  None for any other exception (a bug: the caller answers 500)."""
  if isinstance(e, engine_errors.Refusal):
    return from_refusal(e)
  return e if isinstance(e, RequestError) else None


def error_body(status: int, message: str, code: str | None, param: str | None) -> dict:
  return {"error": {"message": message, "type": _TYPES.get(status, "server_error"),
                    "param": param, "code": code}}


def error_response(status: int, message: str, code: str | None = None,
                   param: str | None = None, headers: dict | None = None) -> web.Response:
  return web.json_response(error_body(status, message, code, param), status=status,
                           headers=headers)
