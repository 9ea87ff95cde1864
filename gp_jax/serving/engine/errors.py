"""What the engine refuses, in its own terms: the HTTP layer maps each kind to a status code
(gp_jax/serving/http/errors.py); the engine knows no HTTP."""
from __future__ import annotations

# Why a request or an operation is refused.
INVALID = "invalid"            # the caller's input is wrong (unknown task, score outside [0, 1])
NOT_FOUND = "not_found"        # no such completion, version, or the feature is off
CONFLICT = "conflict"          # the completion already has feedback (or it is being written)
OVERLOADED = "overloaded"      # every workflow slot and waiting place is taken: retry later
BACKBONE = "backbone"          # the LLM calls failed: no answer to give
UNAVAILABLE = "unavailable"    # the store could not make it durable: nothing was recorded
KINDS = (INVALID, NOT_FOUND, CONFLICT, OVERLOADED, BACKBONE, UNAVAILABLE)


class Refusal(Exception):
  """A request or operation the engine refuses.

  Attributes:
    kind: one of KINDS.
    message: for the caller. code: a short machine-readable reason ("unknown_id").
    param: the request field it concerns, or None.
    retry_after_s: when to come back (OVERLOADED), or None.
    details: facts about the partly done request to hand back (its id and cost), {} if none.
  """

  def __init__(self, kind: str, message: str, code: str, param: str | None = None, *,
               retry_after_s: int | None = None, details: dict | None = None):
    if kind not in KINDS:
      raise ValueError(f"unknown refusal kind {kind!r}")
    super().__init__(message)
    self.kind, self.message, self.code, self.param = kind, message, code, param
    self.retry_after_s = retry_after_s
    self.details = dict(details or {})
