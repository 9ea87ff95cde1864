"""Executes parsed actions on the graph functions and writes the Observation text.

Semantics:
- Calls run left to right; nested calls first (innermost first), so results are deterministic.
- Element-wise application: a function given a list where it expects one value is applied to every
  element, in order, and returns a list of the same shape (nested lists for lists of lists). A
  function with two list arguments runs over every combination, first argument outermost.
  Retrieve over a list is one batched search.
- Finish[answer] ends the action: calls after it on the same line are not run. Its text is the
  answer as written; when the text is exactly one call (Finish[Feature[x, title]]), a quoted string
  or a list literal, that is evaluated instead (never with Python's eval).
- Every call that fails, and every malformed piece of the line, gets one observation line that
  says why; the other calls still run.

Observation format, one line per call ("source = value", values in JSON):

  Feature[Retrieve["Deep nets"], year] = 2019
  Degree[p7, autor] -> error: node p7 (paper) has no neighbour type 'autor'; ...
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any

from gp_jax.counselor.kg import functions as functions_lib
from gp_jax.counselor.kg import parser as parser_lib

MAX_LIST_ITEMS = 50       # list elements shown per list in an observation
MAX_ELEMENT_CALLS = 20_000  # element-wise evaluations per top-level call


class _CallError(Exception):
  pass


@dataclasses.dataclass(frozen=True)
class CallResult:
  """One top-level call (or a malformed piece of the line) and its value or error."""
  source: str
  value: Any = None
  error: str | None = None

  @property
  def ok(self) -> bool:
    return self.error is None


@dataclasses.dataclass(frozen=True)
class ActionResult:
  results: tuple[CallResult, ...]
  finished: bool
  answer: str | None        # set when Finish ran
  answer_value: Any = None  # the evaluated Finish value (list, number, ...) before formatting

  def observation(self, max_list_items: int = MAX_LIST_ITEMS) -> str:
    if not self.results:
      return ("No function call found. Write calls such as Retrieve[keyword] or "
              "Feature[node_id, feature_name], or Finish[answer].")
    lines = [_render_result(r, max_list_items) for r in self.results]
    return lines[0] if len(lines) == 1 else "\n".join(f"- {l}" for l in lines)


def _render_result(r: CallResult, max_items: int) -> str:
  if r.error is not None:
    return f"{r.source} -> error: {r.error}" if r.source else f"error: {r.error}"
  return f"{r.source} = {render_value(r.value, max_items)}"


def render_value(value: Any, max_items: int = MAX_LIST_ITEMS) -> str:
  """JSON text of a value; lists longer than max_items show their first items and a count."""
  if isinstance(value, list):
    shown = ", ".join(render_value(v, max_items) for v in value[:max_items])
    more = f", ... {len(value) - max_items} more" if len(value) > max_items else ""
    return f"[{shown}{more}]"
  try:
    return json.dumps(value, ensure_ascii=False)
  except (TypeError, ValueError):
    return json.dumps(str(value), ensure_ascii=False)


def flatten(value: Any) -> list:
  """Leaves of nested lists, in order."""
  if not isinstance(value, list):
    return [value]
  out = []
  for v in value:
    out.extend(flatten(v))
  return out


def format_answer(value: Any) -> str:
  """The answer string of a value: lists joined by ', ', integral floats without '.0'."""
  if value is None:
    return ""
  if isinstance(value, bool):
    return "yes" if value else "no"
  if isinstance(value, float):
    if value != value or value in (float("inf"), float("-inf")):
      return str(value)
    return str(int(value)) if value.is_integer() else repr(round(value, 6))
  if isinstance(value, int):
    return str(value)
  if isinstance(value, list):
    return ", ".join(format_answer(v) for v in flatten(value))
  if isinstance(value, dict):
    return json.dumps(value, ensure_ascii=False, sort_keys=True)
  return str(value).strip()


class Interpreter:
  """Runs action lines against GraphFunctions."""

  def __init__(self, funcs: functions_lib.GraphFunctions, *,
               max_element_calls: int = MAX_ELEMENT_CALLS):
    self.funcs = funcs
    self.max_element_calls = max_element_calls
    self._budget = 0

  def execute(self, action: str) -> ActionResult:
    """Parses and runs one action line."""
    results: list[CallResult] = []
    for item in parser_lib.parse_action(action):
      if isinstance(item, parser_lib.Issue):
        results.append(CallResult(item.source, error=item.message))
        continue
      if isinstance(item, parser_lib.Finish):
        try:
          value = self._finish_value(item)
        except _CallError as e:
          results.append(CallResult(item.source, error=str(e)))
          continue
        answer = format_answer(value)
        results.append(CallResult(item.source, value=value))
        return ActionResult(tuple(results), finished=True, answer=answer, answer_value=value)
      try:
        self._budget = self.max_element_calls
        results.append(CallResult(item.source, value=self._eval(item)))
      except _CallError as e:
        results.append(CallResult(item.source, error=str(e)))
    return ActionResult(tuple(results), finished=False, answer=None)

  def _finish_value(self, item: parser_lib.Finish) -> Any:
    if item.expr is None:
      if not item.raw.strip():
        raise _CallError("Finish needs an answer inside the brackets")
      return item.raw.strip()
    self._budget = self.max_element_calls
    return self._eval(item.expr)

  def _eval(self, expr: parser_lib.Expr) -> Any:
    if isinstance(expr, parser_lib.Literal):
      return expr.value
    if isinstance(expr, parser_lib.ListExpr):
      return [self._eval(e) for e in expr.items]
    key = expr.name.lower()
    spec = functions_lib.SPEC_BY_KEY.get(key)
    if spec is None or key == "finish":
      valid = ", ".join(s.name for s in functions_lib.SPECS if s.name != "Finish")
      where = " (only as the whole action)" if key == "finish" else ""
      raise _CallError(f"unknown function {expr.name!r}{where}; functions: {valid}, Finish")
    if len(expr.args) != len(spec.params):
      raise _CallError(f"{spec.name} takes {len(spec.params)} argument(s) "
                       f"({', '.join(spec.params)}), got {len(expr.args)}")
    args = []
    for a in expr.args:
      try:
        args.append(self._eval(a))
      except _CallError as e:
        if isinstance(a, parser_lib.Call) and not str(e).startswith("in "):
          raise _CallError(f"in {a.source}: {e}") from None
        raise
    if key == "retrieve":
      return self._retrieve(args[0])
    return self._broadcast(self.funcs.scalar_function(key), args, spec.name)

  def _retrieve(self, keywords: Any) -> Any:
    leaves = flatten(keywords)
    self._spend(len(leaves))
    try:
      ids = iter(self.funcs.retrieve(leaves))
    except functions_lib.FunctionError as e:
      raise _CallError(str(e)) from None

    def rebuild(v):
      return [rebuild(x) for x in v] if isinstance(v, list) else next(ids)
    return rebuild(keywords)

  def _broadcast(self, fn, args: list, name: str) -> Any:
    for i, a in enumerate(args):
      if isinstance(a, list):
        return [self._broadcast(fn, args[:i] + [e] + args[i + 1:], name) for e in a]
    self._spend(1)
    try:
      return fn(*args)
    except functions_lib.FunctionError as e:
      raise _CallError(str(e)) from None

  def _spend(self, n: int) -> None:
    self._budget -= n
    if self._budget < 0:
      raise _CallError(f"more than {self.max_element_calls} element-wise evaluations in one call; "
                       "narrow the call down")
