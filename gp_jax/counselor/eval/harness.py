"""Runs a method over a question set, scores it, and summarises per difficulty level.

Methods (METHODS): counselor, graph_cot, llm_only, text_rag, graphrag_1hop, graphrag_2hop. Each is
an async function (question, *, funcs, pool, select_llm, qid, **settings) -> CounselorResult, so a
router plugs in through `select_llm` alone.
"""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import json
import math
from typing import Any, Callable, Mapping, Sequence

from gp_jax import errors
from gp_jax import files
from gp_jax.counselor.agents import baselines
from gp_jax.counselor.agents import loop as agents
from gp_jax.counselor.agents import records
from gp_jax.counselor.eval import metrics
from gp_jax.counselor.kg import data as data_lib
from gp_jax.counselor.kg import functions as functions_lib
from gp_jax.llm import base

METHODS: dict[str, Callable[..., Any]] = {
    "counselor": agents.run_counselor,
    "graph_cot": agents.run_graph_cot,
    "llm_only": baselines.run_llm_only,
    "text_rag": baselines.run_text_rag,
    "graphrag_1hop": functools.partial(baselines.run_graphrag, hops=1),
    "graphrag_2hop": functools.partial(baselines.run_graphrag, hops=2),
}
# Settings the agent loop takes (run_graph_cot forwards them to run_counselor).
_AGENT_SETTINGS = set(inspect.signature(agents.run_counselor).parameters) - {
    "question", "funcs", "pool", "select_llm", "qid", "use_plan", "use_reflection", "method"}


def method_settings(method: str, settings: Mapping[str, Any]) -> dict[str, Any]:
  """The subset of `settings` that `method` takes (others, e.g. max_steps for llm_only, are
  dropped)."""
  if method not in METHODS:
    raise errors.unknown_name("method", method, METHODS)
  if method in ("counselor", "graph_cot"):
    accepted = _AGENT_SETTINGS
  else:
    fn = METHODS[method]
    fn = fn.func if isinstance(fn, functools.partial) else fn
    accepted = set(inspect.signature(fn).parameters)
  return {k: v for k, v in settings.items() if k in accepted}


async def run_method(method: str, question: str, *, funcs: functions_lib.GraphFunctions,
                     pool: base.LLMPool, select_llm: records.LLMSelector, qid: str = "",
                     **settings) -> records.CounselorResult:
  """Answers one question with a named method (settings it does not take are ignored)."""
  return await METHODS[method](question, funcs=funcs, pool=pool, select_llm=select_llm, qid=qid,
                               **method_settings(method, settings))


@dataclasses.dataclass
class Prediction:
  """A scored answer: the question, the method's result, and its metrics."""
  question: data_lib.GraphQuestion
  result: records.CounselorResult
  scores: dict[str, float]
  judge_call: records.CallRecord | None = None

  def to_json(self) -> dict:
    q = self.question
    return {"qid": q.qid, "level": q.level, "template": q.template, "question": q.question,
            "gold": q.answer, "prediction": self.result.final_answer,
            "first_answer": self.result.first_answer, **self.scores,
            "judge_cost_usd": self.judge_call.cost_usd if self.judge_call else 0.0,
            "result": self.result.to_json()}


async def score(q: data_lib.GraphQuestion, result: records.CounselorResult, *,
                pool: base.LLMPool | None, judge_model: str | None) -> Prediction:
  """EM, Rouge-L, BLEU of the final answer (and EM / Rouge-L of the first-trial answer), plus the
  LLM-judge score when a judge model is given (NaN otherwise)."""
  s = metrics.text_scores(result.final_answer, q.answer)
  s["first_em"] = metrics.exact_match(result.first_answer, q.answer)
  s["first_rouge_l"] = metrics.rouge_l(result.first_answer, q.answer)
  call = None
  if judge_model and pool is not None:
    s["judge"], call = await metrics.llm_judge(pool, judge_model, question=q.question,
                                               gold=q.answer, prediction=result.final_answer)
  else:
    s["judge"] = math.nan
  return Prediction(q, result, s, call)


async def evaluate(questions: Sequence[data_lib.GraphQuestion], *, method: str,
                   funcs: functions_lib.GraphFunctions, pool: base.LLMPool,
                   select_llm: records.LLMSelector, judge_model: str | None = None,
                   concurrency: int = 8, settings: Mapping[str, Any] | None = None,
                   on_done: Callable[[Prediction], None] | None = None) -> list[Prediction]:
  """Runs `method` on every question (at most `concurrency` at a time) and scores it.

  Returns:
    Predictions in question order.
  """
  if concurrency < 1:
    raise errors.ConfigError(f"concurrency must be >= 1, got {concurrency}")
  kwargs = method_settings(method, settings or {})
  sem = asyncio.Semaphore(concurrency)

  async def one(q: data_lib.GraphQuestion) -> Prediction:
    async with sem:
      res = await METHODS[method](q.question, funcs=funcs, pool=pool, select_llm=select_llm,
                                  qid=q.qid, **kwargs)
      pred = await score(q, res, pool=pool, judge_model=judge_model)
    if on_done is not None:
      on_done(pred)
    return pred
  return list(await asyncio.gather(*(one(q) for q in questions)))


def _mean(xs: list[float]) -> float:
  xs = [x for x in xs if not math.isnan(x)]
  return sum(xs) / len(xs) if xs else math.nan


def summarize(preds: Sequence[Prediction]) -> dict[str, dict[str, float]]:
  """Per level (easy / medium / hard / unknown, those present) and 'all': n, means of the metrics,
  LLM calls per question, $ cost of the method's calls and of the judge's calls."""
  groups: dict[str, list[Prediction]] = {}
  for p in preds:
    groups.setdefault(p.question.level, []).append(p)
  order = [l for l in data_lib.LEVELS + ("unknown",) if l in groups]
  out = {}
  for name, ps in [(l, groups[l]) for l in order] + [("all", list(preds))]:
    if not ps:
      continue
    row = {"n": len(ps)}
    for k in ("rouge_l", "em", "bleu", "judge", "first_em", "first_rouge_l"):
      row[k] = _mean([p.scores[k] for p in ps])
    row["calls_per_q"] = sum(p.result.n_calls for p in ps) / len(ps)
    row["failed_calls"] = sum(1 for p in ps for c in p.result.calls if c.error)
    row["cost_usd"] = sum(p.result.cost_usd for p in ps)
    row["judge_cost_usd"] = sum(p.judge_call.cost_usd for p in ps if p.judge_call)
    out[name] = row
  return out


def format_summary(summary: Mapping[str, Mapping[str, float]]) -> str:
  """A fixed-width table (metrics in percent)."""
  head = (f"{'level':<8}{'n':>5}{'Rouge-L':>9}{'EM':>7}{'BLEU':>7}{'judge':>7}{'EM@1':>7}"
          f"{'calls/q':>9}{'failed':>8}{'cost $':>11}{'judge $':>10}")
  lines = [head, "-" * len(head)]

  def pct(x):
    return "    -" if math.isnan(x) else f"{100 * x:5.1f}"
  for name, r in summary.items():
    lines.append(f"{name:<8}{r['n']:>5}{pct(r['rouge_l']):>9}{pct(r['em']):>7}{pct(r['bleu']):>7}"
                 f"{pct(r['judge']):>7}{pct(r['first_em']):>7}{r['calls_per_q']:>9.1f}"
                 f"{r['failed_calls']:>8}{r['cost_usd']:>11.5f}{r['judge_cost_usd']:>10.5f}")
  return "\n".join(lines)


def write_predictions(preds: Sequence[Prediction], path) -> None:
  """Predictions as JSON lines, written atomically."""
  def default(o):
    return None if isinstance(o, float) and math.isnan(o) else str(o)
  lines = []
  for p in preds:
    row = p.to_json()
    row = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}
    lines.append(json.dumps(row, ensure_ascii=False, default=default))
  files.write_lines(path, lines, "the predictions")
