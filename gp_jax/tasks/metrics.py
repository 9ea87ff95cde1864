"""Metrics: pure functions (prediction, gold) -> score in [0, 1], and `score(prediction, query)`.

`score` dispatches on the task's registered metric (for a known task name) or on the row's metric
name (ours or LLMRouter's). Code tasks run their tests in the sandbox; `score_many` batches them so
that programs run in parallel.
"""
from __future__ import annotations

import dataclasses
import fractions
import re
from typing import Sequence

from gp_jax import errors
from gp_jax import types
from gp_jax.tasks import code_eval
from gp_jax.tasks import extract
from gp_jax.tasks import math_equiv
from gp_jax.tasks import registry
from gp_jax.tasks import schema
from gp_jax.tasks import text_match

# Words that may surround a LogicGrid house number ("house 3", "the 3rd house", "No. 3").
_LOGIC_FILLER = ("house", "number", "no", "no.", "is", "in", "lives", "th", "nd", "rd", "st")


def gold_number(ground_truth: str) -> fractions.Fraction | None:
  """The reference number of a GSM8K/MGSM row ("... #### 20,000", "\\boxed{28}" or "28")."""
  if "####" in ground_truth:
    nums = extract.find_numbers(ground_truth.rsplit("####", 1)[1])
    return nums[0] if nums else None
  box = extract.last_boxed(ground_truth)
  if box is not None:
    nums = extract.find_numbers(box)
    return nums[-1] if nums else None
  return extract.parse_number(ground_truth)


def numeric_score(prediction: str, ground_truth: str) -> float:
  """1.0 when the prediction's final number equals the reference exactly (as rationals).

  "18.0", "$18", "18 dollars" and "\\boxed{18}" all equal 18; "180" and "1.8" do not.
  """
  gold = gold_number(ground_truth)
  if gold is None:
    raise errors.DataError(f"no number in ground truth {ground_truth[:60]!r}")
  pred = extract.final_number(prediction)
  return float(pred is not None and pred == gold)


def gold_math_answer(ground_truth: str) -> str:
  """The reference answer of a MATH/AIME row: its last \\boxed{} or the whole string."""
  box = extract.last_boxed(ground_truth)
  return box if box is not None else ground_truth.strip()


_STATED_RE = re.compile(r"(?:final\s+answer|the\s+answer|answer)\s*(?:is|:|=)\s*:?\s*([^\n]+)",
                        re.IGNORECASE)


def stated_math_answer(prediction: str) -> str | None:
  """The answer a reply states: its last \\boxed{}, else an "answer is ..." line, else None."""
  box = extract.last_boxed(prediction)
  if box is not None:
    return box
  found = _STATED_RE.findall(prediction.replace("**", ""))
  if found:
    return found[-1].strip().rstrip(".").strip().strip("$").strip()
  text = prediction.strip()
  if text and "\n" not in text and len(text) <= 40:
    return text.strip("$").strip()
  return None


def math_score(prediction: str, ground_truth: str) -> float:
  """1.0 when the stated answer is mathematically equivalent to the reference (see math_equiv)."""
  return float(math_equiv.answers_equivalent(stated_math_answer(prediction),
                                             gold_math_answer(ground_truth)))


def choice_score(prediction: str, labels: Sequence[str], gold: str,
                 texts: Sequence[str] | None = None, filler_words=()) -> float:
  """1.0 when the reply's chosen option label is `gold` (see extract.extract_choice)."""
  chosen = extract.extract_choice(prediction, labels, texts, filler_words)
  return float(chosen is not None and chosen.upper() == str(gold).upper())


def logic_grid_score(prediction: str, labels: Sequence[str], gold: str,
                     texts: Sequence[str]) -> float:
  """LogicGrid: the chosen label, or the house number (an option text) the reply states."""
  return choice_score(prediction, labels, gold, texts, _LOGIC_FILLER)


def cem_score(prediction: str, aliases: Sequence[str]) -> float:
  """Cover-exact-match against any gold alias (see text_match.cover_exact_match)."""
  return text_match.cover_exact_match(prediction, aliases)


def coverage_score(prediction: str, concepts) -> float:
  """CommonGen: fraction of the concepts used (see text_match.concept_coverage)."""
  return text_match.concept_coverage(prediction, concepts)


def metric_of(query: types.Query) -> str:
  """The metric that scores `query`: the task's own for known tasks, else the row's."""
  if registry.is_known_task(query.task_name):
    return registry.get_task(query.task_name).metric
  return registry.canonical_metric(query.metric)


def _task_name(query: types.Query) -> str:
  if registry.is_known_task(query.task_name):
    return registry.get_task(query.task_name).name
  return query.task_name


def score(prediction: str, query: types.Query) -> float:
  """Scores one prediction on one row; a float in [0, 1].

  Args:
    prediction: the model's final reply text.
    query: the benchmark row (gp_jax.types.Query).

  Raises:
    ConfigError: unknown metric; DataError: the row lacks what its metric needs.
  """
  return score_many([prediction], [query])[0]


def score_many(predictions: Sequence[str], queries: Sequence[types.Query], *,
               sandbox=None, code_wall_s: float = 10.0) -> list[float]:
  """Scores predictions on their rows; code rows run together in the sandbox.

  Args:
    predictions: model replies, parallel to `queries`.
    queries: benchmark rows.
    sandbox: gp_jax.tasks.sandbox.Sandbox for code rows (default: the process-wide one).
    code_wall_s: wall-clock limit per code program.
  """
  if len(predictions) != len(queries):
    raise errors.ConfigError("predictions and queries differ in length")
  out: list[float | None] = [None] * len(queries)
  code_idx = []
  for i, (pred, q) in enumerate(zip(predictions, queries)):
    pred = "" if pred is None else str(pred)
    metric = metric_of(q)
    if metric == registry.CODE_PASS:
      code_idx.append(i)
    else:
      out[i] = _score_text(pred, q, metric)
  if code_idx:
    rows = [_with_canonical_task(queries[i]) for i in code_idx]
    scores = code_eval.code_pass_many([str(predictions[i] or "") for i in code_idx], rows,
                                      sandbox=sandbox, wall_s=code_wall_s)
    for i, s in zip(code_idx, scores):
      out[i] = s
  return [float(s) for s in out]


def _with_canonical_task(query: types.Query) -> types.Query:
  """The row with its task name made canonical (code_eval dispatches on it)."""
  name = _task_name(query)
  return query if name == query.task_name else dataclasses.replace(query, task_name=name)


def _score_text(pred: str, q: types.Query, metric: str) -> float:
  if metric == registry.NUMERIC:
    return numeric_score(pred, q.ground_truth)
  if metric == registry.MATH_EQUIV:
    return math_score(pred, q.ground_truth)
  if metric in (registry.CHOICE, registry.LOGIC_GRID):
    labels, texts = schema.parse_choices(q.choices, where=f"query {q.qid}")
    if metric == registry.LOGIC_GRID:
      return logic_grid_score(pred, labels, q.ground_truth, texts)
    return choice_score(pred, labels, q.ground_truth, texts)
  if metric == registry.CEM:
    aliases = [q.ground_truth] + [str(a) for a in q.meta.get("aliases", ())]
    return cem_score(pred, aliases)
  if metric == registry.COVERAGE:
    return coverage_score(pred, q.meta.get("concepts") or q.ground_truth)
  raise errors.unknown_name("metric", metric, registry.METRICS)
