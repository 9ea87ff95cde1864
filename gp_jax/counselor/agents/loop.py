"""The Graph Counselor agents loop (AGIEM) with self-reflection.

One trial: for n = 1..max_steps, the planning agent writes Plan n, the thought agent Thought n, the
execution agent Action n (three separate LLM calls), and the graph functions produce Observation n.
The trial ends at Finish[answer], at max_steps, when the prompt no longer fits the token budget
after the oldest observations were truncated, or after repeated failed LLM calls.

Self-reflection: after a trial, the evaluation agent judges the answer ([Yes]/[No], parsed
case-insensitively; no verdict counts as No). On No, while reflections remain, the reflection agent
writes a multi-perspective reflection that the next trial reads. A trial without an answer is
judged No without a call. The final trial is not judged unless `judge_final_trial` (its verdict
could change nothing).

Every LLM call takes its model from `select_llm(AgentStep)`, so a router can pick the backbone of
each step; every call is recorded (CallRecord) in the result.
"""
from __future__ import annotations

import asyncio
import re
import time
from typing import Mapping

from gp_jax import errors
from gp_jax.counselor.agents import prompts
from gp_jax.counselor.agents import records
from gp_jax.counselor.kg import functions as functions_lib
from gp_jax.counselor.kg import interpreter as interpreter_lib
from gp_jax.counselor.kg import parser as parser_lib
from gp_jax.llm import base

DEFAULT_SAMPLING = {
    "plan": base.SamplingParams(temperature=0.0, max_tokens=160),
    "thought": base.SamplingParams(temperature=0.0, max_tokens=160),
    "action": base.SamplingParams(temperature=0.0, max_tokens=160),
    "judge": base.SamplingParams(temperature=0.0, max_tokens=96),
    "reflect": base.SamplingParams(temperature=0.0, max_tokens=512),
    "answer": base.SamplingParams(temperature=0.0, max_tokens=128),
}

_BRACKET_VERDICT = re.compile(r"\[\s*(yes|no)\s*\]", re.IGNORECASE)
_PLAIN_VERDICT = re.compile(r"^\W*(?:judge?ment\s*:\s*)?(yes|no)\b", re.IGNORECASE)


def parse_verdict(text: str) -> bool:
  """True for a [Yes] verdict. The first bracketed [yes]/[no] decides (any case); without one, a
  leading 'yes'/'no' (optionally after 'Judgment:') decides; no verdict at all counts as No."""
  m = _BRACKET_VERDICT.search(text or "")
  if m is None:
    m = _PLAIN_VERDICT.search((text or "").strip())
  return bool(m) and m.group(1).lower() == "yes"


class CallSession:
  """The LLM calls made for one question: model selection, timeout, recording."""

  def __init__(self, *, pool: base.LLMPool, select_llm: records.LLMSelector, qid: str,
               question: str, sampling: Mapping[str, base.SamplingParams] | None = None,
               call_timeout_s: float = 600.0, record_prompts: bool = False):
    self.pool = pool
    self.select_llm = select_llm
    self.qid = qid
    self.question = question
    self.sampling = {**DEFAULT_SAMPLING, **(sampling or {})}
    self.call_timeout_s = call_timeout_s
    self.record_prompts = record_prompts
    self.calls: list[records.CallRecord] = []

  async def call(self, kind: str, trial: int, step: int, messages: list[dict]) -> base.Completion:
    """One LLM call; failures come back as a Completion with `error` set (never raised)."""
    st = records.AgentStep(kind=kind, role=records.AGENT_ROLES[kind], qid=self.qid,
                           question=self.question, trial=trial, step=step,
                           messages=tuple(messages), calls_so_far=tuple(self.calls))
    model = await records.resolve_model(self.select_llm, st)
    t0 = time.perf_counter()
    try:
      c = await asyncio.wait_for(self.pool.chat(model, messages, self.sampling[kind]),
                                 self.call_timeout_s)
    except asyncio.TimeoutError:
      c = base.failed(model, "timeout", time.perf_counter() - t0)
    except errors.GpJaxError:
      raise  # misconfiguration (unknown model): the run cannot go on
    except Exception as e:  # a backend fault that escaped the pool: record it, keep the run alive
      c = base.failed(model, f"exception:{type(e).__name__}", time.perf_counter() - t0)
    self.calls.append(records.CallRecord(
        kind=kind, role=records.AGENT_ROLES[kind], model=model, trial=trial, step=step,
        input_tokens=c.input_tokens, output_tokens=c.output_tokens, cost_usd=c.cost_usd,
        latency_s=c.latency_s, error=c.error,
        prompt_tokens_est=prompts.messages_tokens(messages), output=c.text or "",
        prompt=messages[-1]["content"] if self.record_prompts else ""))
    return c


async def run_trial(session: CallSession, interp: interpreter_lib.Interpreter, *, schema: str,
                    question: str, reflections: list[str], trial: int, max_steps: int,
                    prompt_token_budget: int, use_plan: bool, max_list_items: int,
                    max_consecutive_failures: int) -> tuple[records.TrialResult, prompts.Scratchpad]:
  """Runs one trial of Plan/Thought/Action/Observation steps."""
  pad = prompts.Scratchpad()
  steps: list[records.StepRecord] = []
  failures = 0
  kinds = (("plan",) if use_plan else ()) + ("thought", "action")

  def end(answer, reason):
    return records.TrialResult(trial=trial, answer=answer, end_reason=reason, steps=steps,
                               scratchpad=pad.render()), pad

  for n in range(1, max_steps + 1):
    texts: dict[str, str] = {}
    action_error = None
    for kind in kinds:
      msgs = prompts.agent_messages(kind, schema=schema, question=question,
                                    reflections=reflections, scratchpad=pad, step=n)
      while prompts.messages_tokens(msgs) > prompt_token_budget:
        if not pad.truncate_oldest_observation():
          return end(None, "token_budget")
        msgs = prompts.agent_messages(kind, schema=schema, question=question,
                                      reflections=reflections, scratchpad=pad, step=n)
      c = await session.call(kind, trial, n, msgs)
      if c.ok:
        failures = 0
        texts[kind] = parser_lib.strip_label(c.text, prompts.LABELS[kind])
      else:
        failures += 1
        texts[kind] = ""
        if kind == "action":
          action_error = c.error
        if failures >= max_consecutive_failures:
          return end(None, "llm_error")
      pad.add(prompts.LABELS[kind], n, texts[kind] or "(no output)")
    if action_error is not None:
      result = None
      obs = f"No action was taken: the model call failed ({action_error})."
    else:
      result = interp.execute(texts["action"])
      obs = result.observation(max_list_items)
    pad.add("Observation", n, obs)
    finished = bool(result and result.finished)
    steps.append(records.StepRecord(step=n, plan=texts.get("plan", ""), thought=texts["thought"],
                                    action=texts["action"], observation=obs, finished=finished))
    if finished:
      return end(result.answer, "finish")
  return end(None, "max_steps")


async def run_counselor(question: str, *, funcs: functions_lib.GraphFunctions, pool: base.LLMPool,
                        select_llm: records.LLMSelector, qid: str = "", max_steps: int = 10,
                        max_reflect: int = 2, use_plan: bool = True, use_reflection: bool = True,
                        prompt_token_budget: int = 6000, max_list_items: int = 50,
                        sampling: Mapping[str, base.SamplingParams] | None = None,
                        call_timeout_s: float = 600.0, max_consecutive_failures: int = 3,
                        judge_final_trial: bool = False, record_prompts: bool = False,
                        method: str = "counselor") -> records.CounselorResult:
  """Answers one question with the Graph Counselor agents (Graph-CoT when use_plan and
  use_reflection are both off).

  Args:
    question: the question text.
    funcs: graph functions over the knowledge graph.
    pool: the LLM pool.
    select_llm: AgentStep -> model name (sync or async); `records.fixed_selector` for one model
      per agent kind.
    qid: question id (passed to the selector and recorded).
    max_steps: steps per trial (paper: 10).
    max_reflect: reflections, i.e. up to max_reflect + 1 trials (paper: 2).
    use_plan: call the planning agent each step.
    use_reflection: judge and reflect between trials.
    prompt_token_budget: largest prompt (approximate tokens) before truncation / halting.
    max_list_items: list elements shown per list in observations.
    sampling: per agent kind SamplingParams overriding DEFAULT_SAMPLING.
    call_timeout_s: limit on one LLM call, on top of the pool's own timeouts.
    max_consecutive_failures: failed LLM calls in a row that end a trial.
    judge_final_trial: also judge the last trial (one more call; the verdict is only recorded).
    record_prompts: keep each call's user message in its CallRecord.
    method: label stored in the result.

  Returns:
    CounselorResult with every trial, every call, the first-trial and the final answers.
  """
  if max_steps < 1 or max_reflect < 0 or prompt_token_budget < 1:
    raise errors.ConfigError(f"need max_steps >= 1, max_reflect >= 0, prompt_token_budget >= 1; "
                             f"got {max_steps}, {max_reflect}, {prompt_token_budget}")
  t0 = time.perf_counter()
  session = CallSession(pool=pool, select_llm=select_llm, qid=qid, question=question,
                        sampling=sampling, call_timeout_s=call_timeout_s,
                        record_prompts=record_prompts)
  interp = interpreter_lib.Interpreter(funcs)
  schema = funcs.describe_graph()
  n_trials = max_reflect + 1 if use_reflection else 1
  reflections: list[str] = []
  trials: list[records.TrialResult] = []
  for trial in range(n_trials):
    tr, pad = await run_trial(session, interp, schema=schema, question=question,
                              reflections=reflections, trial=trial, max_steps=max_steps,
                              prompt_token_budget=prompt_token_budget, use_plan=use_plan,
                              max_list_items=max_list_items,
                              max_consecutive_failures=max_consecutive_failures)
    trials.append(tr)
    last = trial == n_trials - 1
    if not use_reflection or (last and not judge_final_trial):
      break
    if tr.answer is None:
      tr.verdict, tr.judgment = False, f"No answer was given (the trial ended: {tr.end_reason})."
    else:
      msgs = prompts.judge_messages(schema=schema, question=question, scratchpad=pad,
                                    answer=tr.answer)
      c = await session.call("judge", trial, 0, msgs)
      tr.judgment = c.text if c.ok else f"(the evaluation call failed: {c.error})"
      tr.verdict = parse_verdict(c.text) if c.ok else False
    if tr.verdict or last:
      break
    msgs = prompts.reflect_messages(schema=schema, question=question, scratchpad=pad,
                                    answer=tr.answer, judgment=tr.judgment)
    c = await session.call("reflect", trial, 0, msgs)
    tr.reflection = c.text.strip() if c.ok else ""
    if tr.reflection:
      reflections.append(tr.reflection)
  answers = [t.answer for t in trials if t.answer is not None]
  return records.CounselorResult(
      qid=qid, question=question, method=method, trials=trials, calls=session.calls,
      first_answer=trials[0].answer, final_answer=answers[-1] if answers else None,
      wall_s=time.perf_counter() - t0)


async def run_graph_cot(question: str, **kwargs) -> records.CounselorResult:
  """The Graph-CoT baseline: Thought/Action/Observation steps, no plan, no reflection."""
  kwargs.update(use_plan=False, use_reflection=False, method=kwargs.get("method", "graph_cot"))
  return await run_counselor(question, **kwargs)
