"""Gold tool-call plans of generated questions, and the reducers that turn observations into answers.

A plan is JSON, stored with each generated question:

  {"steps": [{"act": "Neighbor[Retrieve[\\"Ann Lee\\"], paper]"},
             {"act": "Feature[Neighbor[Retrieve[\\"Ann Lee\\"], paper], citations]"},
             {"let": "p", "expr": {"op": "argmax", "args": [{"obs": 1}, {"obs": 2}]}},
             {"act": "Feature[{p}, title]"}],
   "answer": {"obs": 3}}

'act' steps are actions, numbered 1, 2, ... in order; '{name}' in an action is replaced by the value
of an earlier 'let'. Expressions: {"obs": k} (value observed for act k), {"var": name},
{"lit": value}, {"op": name, "args": [expr, ...]}.

The generator computes each gold answer directly from the graph with the same reducers (OPS), and
the oracle backend computes its answer from the observations the graph functions returned, so a
correct agent run reproduces the gold answer exactly only when functions, parser, observation
rendering and the generator agree.
"""
from __future__ import annotations

import collections
import json
import re
from typing import Any, Callable, Mapping, Sequence

from gp_jax.counselor.kg import interpreter

_PLACEHOLDER = re.compile(r"\{([A-Za-z_]\w*)\}")


class PlanError(Exception):
  """A plan cannot be evaluated (bad structure, tie where a unique answer is needed, ...)."""


def _unique(xs: Sequence) -> list:
  seen, out = set(), []
  for x in interpreter.flatten(list(xs) if not isinstance(xs, list) else xs):
    key = json.dumps(x, sort_keys=True)
    if key not in seen:
      seen.add(key)
      out.append(x)
  return out


def _num(x: Any) -> float | int:
  if isinstance(x, bool) or not isinstance(x, (int, float)):
    try:
      return float(x)
    except (TypeError, ValueError):
      raise PlanError(f"not a number: {x!r}") from None
  return x


def _sum(x):
  vals = [_num(v) for v in interpreter.flatten(x)]
  total = sum(vals)
  return total if all(isinstance(v, int) for v in vals) else round(total, 6)


def _mean2(x):
  vals = [_num(v) for v in interpreter.flatten(x)]
  if not vals:
    raise PlanError("mean of an empty list")
  return round(sum(vals) / len(vals), 2)


def _argmax(keys, values):
  keys, values = interpreter.flatten(keys), [_num(v) for v in interpreter.flatten(values)]
  if len(keys) != len(values) or not keys:
    raise PlanError(f"argmax needs equally long non-empty lists, got {len(keys)} and {len(values)}")
  best = max(values)
  winners = [k for k, v in zip(keys, values) if v == best]
  if len(set(map(str, winners))) != 1:
    raise PlanError("argmax is tied")
  return winners[0]


def _mode(x):
  items = interpreter.flatten(x)
  if not items:
    raise PlanError("mode of an empty list")
  counts = collections.Counter(json.dumps(v, sort_keys=True) for v in items)
  top = counts.most_common()
  if len(top) > 1 and top[0][1] == top[1][1]:
    raise PlanError("mode is tied")
  return json.loads(top[0][0])


def _intersect(a, b):
  pool = {json.dumps(v, sort_keys=True) for v in interpreter.flatten(b)}
  return [v for v in _unique(a) if json.dumps(v, sort_keys=True) in pool]


def _minus(a, b):
  drop = {json.dumps(v, sort_keys=True) for v in interpreter.flatten(b)}
  return [v for v in _unique(a) if json.dumps(v, sort_keys=True) not in drop]


def _filter_any(keys, lists, pool):
  """keys[i] whose lists[i] shares an element with pool (lists aligned with keys)."""
  keys = interpreter.flatten(keys)
  if not isinstance(lists, list) or len(lists) != len(keys):
    raise PlanError("filter_any needs one list per key")
  p = {json.dumps(v, sort_keys=True) for v in interpreter.flatten(pool)}
  return [k for k, l in zip(keys, lists)
          if any(json.dumps(v, sort_keys=True) in p for v in interpreter.flatten(l))]


def _first(x):
  items = interpreter.flatten(x)
  if not items:
    raise PlanError("first of an empty list")
  return items[0]


OPS: dict[str, Callable[..., Any]] = {
    "flat": lambda x: interpreter.flatten(x),
    "unique": _unique,
    "count": lambda x: len(_unique(x)),
    "size": lambda x: len(interpreter.flatten(x)),
    "sum": _sum,
    "mean2": _mean2,
    "argmax": _argmax,
    "mode": _mode,
    "intersect": _intersect,
    "minus": _minus,
    "filter_any": _filter_any,
    "sorted": lambda x: sorted(_unique(x), key=str),
    "first": _first,
}


def apply_op(name: str, *args: Any) -> Any:
  if name not in OPS:
    raise PlanError(f"unknown plan op {name!r}")
  return OPS[name](*args)


def evaluate(expr: Any, observations: Sequence[Any], variables: Mapping[str, Any]) -> Any:
  """Evaluates a plan expression given the act observations (1-based) and variables."""
  if not isinstance(expr, dict) or len(expr) not in (1, 2):
    raise PlanError(f"malformed plan expression {expr!r}")
  if "obs" in expr:
    k = expr["obs"]
    if not isinstance(k, int) or not 1 <= k <= len(observations):
      raise PlanError(f"observation {k!r} is not available")
    return observations[k - 1]
  if "var" in expr:
    if expr["var"] not in variables:
      raise PlanError(f"unknown plan variable {expr['var']!r}")
    return variables[expr["var"]]
  if "lit" in expr:
    return expr["lit"]
  if "op" in expr:
    args = [evaluate(a, observations, variables) for a in expr.get("args", [])]
    return apply_op(expr["op"], *args)
  raise PlanError(f"malformed plan expression {expr!r}")


def fill(action: str, variables: Mapping[str, Any]) -> str:
  """An act's action text with {name} placeholders replaced by variable values."""
  def sub(m):
    if m.group(1) not in variables:
      raise PlanError(f"unknown plan variable {m.group(1)!r}")
    return interpreter.format_answer(variables[m.group(1)])
  return _PLACEHOLDER.sub(sub, action)


def num_acts(plan: Mapping[str, Any]) -> int:
  return sum(1 for s in plan["steps"] if "act" in s)


def next_move(plan: Mapping[str, Any], observations: Sequence[Any]) -> tuple[str, Any]:
  """What an agent following the plan does next, given the values observed so far.

  Returns:
    ('act', action text) for the next action, or ('finish', answer value) once every act has
    been observed.

  Raises:
    PlanError: when the plan cannot be followed (e.g. a tie the plan does not expect).
  """
  variables: dict[str, Any] = {}
  acts_seen = 0
  for step in plan["steps"]:
    if "act" in step:
      if acts_seen == len(observations):
        return "act", fill(step["act"], variables)
      acts_seen += 1
    elif "let" in step:
      variables[step["let"]] = evaluate(step["expr"], observations[:acts_seen], variables)
    else:
      raise PlanError(f"malformed plan step {step!r}")
  return "finish", evaluate(plan["answer"], observations, variables)


def quote(text: str) -> str:
  """A quoted action argument (the parser reads backslash escapes)."""
  return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
