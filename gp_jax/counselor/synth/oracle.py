"""The oracle backend: a deterministic stand-in LLM that follows the gold plans of generated questions.

A sanity check of the whole Graph Counselor machinery, not a model. It reads the agent kind from
the system prompt and the question and scratchpad from the user message, and:
- execution agent: issues the next action of the question's gold plan, reading the values of
  earlier observations back from the scratchpad; once all are observed, computes the answer from
  them with the plan's reducers and writes Finish["answer"];
- planning / thought agents: say which action comes next;
- evaluation agent: [Yes] when the proposed answer equals the answer the plan derives from the
  trial's observations, else [No];
- reflection agent: a short fixed reflection;
- metric judge: [Yes] when prediction and reference match exactly (metrics.exact_match);
- one-shot baseline prompts (LLM-only, RAG): "unknown" (the oracle reads no context).

With correct graph functions, parser and observation rendering, every generated question is
answered exactly; any disagreement points at a bug. Token counts are the approximate counts of
agents/prompts.count_tokens; $ cost comes from the catalog prices.
"""
from __future__ import annotations

import json
import re
import time
from typing import Mapping, Sequence

from gp_jax.counselor.agents import prompts
from gp_jax.counselor.eval import metrics
from gp_jax.counselor.kg import data as data_lib
from gp_jax.counselor.kg import interpreter
from gp_jax.counselor.synth import plans
from gp_jax.llm import base
from gp_jax.llm import catalog as catalog_lib

_LINE = re.compile(r"^(Question|Plan|Thought|Action|Observation|Reflection) ?(\d*): ?(.*)$")
_FIELD = re.compile(r"^(Question|Reference answer|Predicted answer|Proposed answer): (.*)$",
                    re.MULTILINE)


def read_pad(user: str) -> tuple[str, list[tuple[str, str]]]:
  """(question, [(label, text), ...]) from a user message.

  Lines starting with '- ' continue the entry before them (multi-call observations); any other
  line ends it.
  """
  question = ""
  entries: list[list[str]] = []
  open_entry = False
  for line in user.splitlines():
    m = _LINE.match(line)
    if m:
      label, _, text = m.groups()
      open_entry = False
      if label == "Question" and not question:
        question = text.strip()
      elif label in ("Plan", "Thought", "Action", "Observation"):
        entries.append([label, text])
        open_entry = True
    elif open_entry and line.startswith("- "):
      entries[-1][1] += "\n" + line
    else:
      open_entry = False
  return question, [(l, t) for l, t in entries]


class OraclePool(base.LLMPool):
  """Follows gold plans; see the module docstring."""

  def __init__(self, catalog: catalog_lib.Catalog, plans_by_question: Mapping[str, dict]):
    """Args:
      catalog: the LLM catalog (model names and prices).
      plans_by_question: question text -> gold plan (plans.py format).
    """
    super().__init__(catalog)
    self.plans = dict(plans_by_question)
    self.n_calls = 0
    self.unknown_questions = 0

  @classmethod
  def from_questions(cls, catalog: catalog_lib.Catalog,
                     questions: Sequence[data_lib.GraphQuestion]) -> "OraclePool":
    return cls(catalog, {q.question: q.plan for q in questions if q.plan is not None})

  async def chat(self, model: str, messages: Sequence[base.Message],
                 params: base.SamplingParams = base.SamplingParams()) -> base.Completion:
    spec = self.catalog[model]  # unknown model: ConfigError (misconfiguration)
    t0 = time.perf_counter()
    text = self._respond(messages)
    self.n_calls += 1
    n_in = prompts.messages_tokens(messages)
    n_out = prompts.count_tokens(text)
    return base.Completion(model=model, text=text, input_tokens=n_in, output_tokens=n_out,
                           cost_usd=spec.cost_usd(n_in, n_out),
                           latency_s=time.perf_counter() - t0)

  def stats(self) -> dict:
    return {"calls": self.n_calls, "unknown_questions": self.unknown_questions}

  # ---------------------------------------------------------------- behaviour per agent kind
  def _respond(self, messages: Sequence[base.Message]) -> str:
    kind = prompts.agent_kind_of(messages)
    user = messages[-1]["content"] if messages else ""
    if kind == "metric_judge":
      fields = dict(_FIELD.findall(user))
      ok = metrics.exact_match(fields.get("Predicted answer", ""),
                               fields.get("Reference answer", "")) == 1.0
      return "[Yes]" if ok else "[No]"
    if kind in (None, "answer"):
      return "unknown"
    question, entries = read_pad(user)
    plan = self.plans.get(question)
    if plan is None:
      self.unknown_questions += 1
      return {"plan": "I have no plan for this question.", "thought": "I cannot answer this.",
              "action": "Finish[unknown]", "judge": "Judgment: [No]",
              "reflect": "No strategy is known for this question."}[kind]
    move = self._next_move(plan, entries)
    if kind == "judge":
      proposed = next((v for k, v in _FIELD.findall(user) if k == "Proposed answer"), "")
      return judge_text(judge_is_yes(move, proposed))
    if kind == "reflect":
      return REFLECTION
    return move_text(kind, move)

  @staticmethod
  def _next_move(plan: dict, entries: list[tuple[str, str]]) -> tuple[str, object]:
    return replay(plan, entries)


REFLECTION = ("Recap: the attempt did not reach the right answer. Improved strategy: run the plan's "
              "graph calls one at a time and derive the answer from their observations.")


def move_text(kind: str, move: tuple[str, object]) -> str:
  """The oracle's line for a plan / thought / action agent given the plan's next move:
  ('act', action text), ('finish', answer value) or ('error', reason)."""
  if move[0] == "error":
    return {"plan": "The steps so far do not follow the plan; give up.",
            "thought": "I cannot continue.", "action": "Finish[unknown]"}[kind]
  if move[0] == "act":
    return {"plan": f"Next, call {move[1]} to get the missing information.",
            "thought": f"The next action is {move[1]}.", "action": move[1]}[kind]
  answer = interpreter.format_answer(move[1])
  return {"plan": "The observations answer the question; give the answer now.",
          "thought": f"The observations give the answer {answer}.",
          "action": f"Finish[{plans.quote(answer)}]"}[kind]


def judge_is_yes(move: tuple[str, object], proposed: str) -> bool:
  """The oracle's verdict: the plan is complete and the proposed answer is the one it derives."""
  return move[0] == "finish" and interpreter.format_answer(move[1]) == proposed.strip()


def judge_text(yes: bool) -> str:
  return "Judgment: [Yes]" if yes else "Judgment: [No] the answer does not follow the steps."


def replay(plan: dict, entries: list[tuple[str, str]], *, skip_off_plan: bool = False
           ) -> tuple[str, object]:
  """The plan's next move after replaying the scratchpad's (Action, Observation) pairs.

  Strict (default): every pair must be the plan's next act, else ('error', reason).
  skip_off_plan: pairs whose action is not the plan's next act (or whose observation is not a
  value) are ignored, as wasted steps; the simulated pool (sim_pool.py) recovers from them.
  """
  observed = []
  action = None
  for label, text in entries:
    if label == "Action":
      # Finish ends a trial; its observation echoes the answer and is no plan act.
      action = None if text.strip().lower().startswith("finish[") else text.strip()
    elif label == "Observation" and action is not None:
      prefix = action + " = "
      if skip_off_plan:
        try:
          expected = plans.next_move(plan, observed)
        except plans.PlanError as e:
          return "error", str(e)
        if expected != ("act", action) or not text.startswith(prefix):
          action = None
          continue
      elif not text.startswith(prefix):
        return "error", f"unexpected observation {text[:80]!r}"
      try:
        observed.append(json.loads(text[len(prefix):]))
      except json.JSONDecodeError:
        if not skip_off_plan:
          return "error", "unreadable observation"
      action = None
  try:
    return plans.next_move(plan, observed)
  except plans.PlanError as e:
    return "error", str(e)
