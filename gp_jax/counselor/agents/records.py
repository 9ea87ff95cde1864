"""What a Graph Counselor run records: agent steps, LLM calls, trials, results.

Every LLM call of a run is a CallRecord (agent kind, GraphPlanner role, model, tokens, $ cost,
latency, error), so a router can be trained on them; AgentStep is what a router sees before the
call; the model choice comes from one callable, `select_llm(step) -> model name`.
"""
from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Awaitable, Callable, Mapping, Sequence, Union

from gp_jax import errors

# Agent kinds and the GraphPlanner role each maps to (paper-notes section 3): Planning -> Planner,
# Thought -> Thinker, Execution -> Executor, Evaluation / Reflection -> Verifier. 'answer' is the
# single call of the one-shot baselines.
AGENT_ROLES = {
    "plan": "planner",
    "thought": "thinker",
    "action": "executor",
    "judge": "verifier",
    "reflect": "verifier",
    "answer": "executor",
}
AGENT_KINDS = tuple(AGENT_ROLES)


@dataclasses.dataclass(frozen=True)
class CallRecord:
  """One LLM call of a run."""
  kind: str            # agent kind (AGENT_KINDS)
  role: str            # GraphPlanner role
  model: str
  trial: int           # 0-based trial
  step: int            # 1-based step within the trial; 0 for judge / reflect / answer
  input_tokens: int
  output_tokens: int
  cost_usd: float
  latency_s: float
  error: str | None
  prompt_tokens_est: int  # the loop's own estimate of the prompt size (budget accounting)
  output: str             # the raw completion text
  prompt: str = ""        # the last user message (kept when the run records prompts)

  def to_json(self) -> dict:
    return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class AgentStep:
  """What the LLM selector sees before each call.

  Attributes:
    kind: agent kind ('plan', 'thought', 'action', 'judge', 'reflect', 'answer').
    role: the GraphPlanner role of that kind ('planner', 'thinker', 'executor', 'verifier').
    qid: question id.
    question: question text.
    trial: 0-based trial number.
    step: 1-based step within the trial (0 for judge / reflect / answer calls).
    messages: the chat messages about to be sent.
    calls_so_far: the calls already made for this question (the workflow memory).
  """
  kind: str
  role: str
  qid: str
  question: str
  trial: int
  step: int
  messages: tuple[Mapping[str, str], ...]
  calls_so_far: tuple[CallRecord, ...] = ()

  @property
  def prompt(self) -> str:
    """The user message content (the part of the prompt that changes from step to step)."""
    return self.messages[-1]["content"] if self.messages else ""


LLMSelector = Callable[[AgentStep], Union[str, Awaitable[str]]]


def fixed_selector(models: str | Mapping[str, str]) -> LLMSelector:
  """The default selector: one model for every agent kind, or a dict {agent kind: model}.

  A dict may hold a 'default' entry for kinds it does not name.

  Raises:
    ConfigError: unknown agent kinds, or kinds left without a model.
  """
  if isinstance(models, str):
    table = dict.fromkeys(AGENT_KINDS, models)
  else:
    unknown = set(models) - set(AGENT_KINDS) - {"default"}
    if unknown:
      raise errors.unknown_name("agent kind", sorted(unknown)[0], AGENT_KINDS + ("default",))
    default = models.get("default")
    table = {k: models.get(k, default) for k in AGENT_KINDS}
    missing = [k for k, v in table.items() if not v]
    if missing:
      raise errors.ConfigError(f"no model for agent kind(s) {missing}; give them or a 'default'")

  def select(step: AgentStep) -> str:
    return table[step.kind]
  select.table = table  # type: ignore[attr-defined]
  return select


async def resolve_model(select_llm: LLMSelector, step: AgentStep) -> str:
  """Calls the selector, awaiting it when it is asynchronous."""
  model = select_llm(step)
  if inspect.isawaitable(model):
    model = await model
  if not isinstance(model, str) or not model:
    raise errors.ConfigError(f"the LLM selector returned {model!r} for a {step.kind} step; "
                             "expected a model name")
  return model


@dataclasses.dataclass
class StepRecord:
  step: int
  plan: str
  thought: str
  action: str
  observation: str
  finished: bool


@dataclasses.dataclass
class TrialResult:
  """One trial of the agents loop (plus its judgment and reflection when there were any)."""
  trial: int
  answer: str | None
  end_reason: str          # 'finish' | 'max_steps' | 'token_budget' | 'llm_error' | 'single_call'
  steps: list[StepRecord]
  scratchpad: str
  verdict: bool | None = None   # judge's verdict; None when not judged
  judgment: str = ""            # judge's raw text
  reflection: str | None = None  # written after this trial, read by the next

  def to_json(self) -> dict:
    return dataclasses.asdict(self)


@dataclasses.dataclass
class CounselorResult:
  """The outcome of one question under one method: trials, all calls, first and final answers."""
  qid: str
  question: str
  method: str
  trials: list[TrialResult]
  calls: list[CallRecord]
  first_answer: str | None   # the first trial's answer (the "without self-reflection" ablation)
  final_answer: str | None   # the answer after reflection (latest trial that gave one)
  wall_s: float = 0.0
  extra: dict[str, Any] = dataclasses.field(default_factory=dict)

  @property
  def n_calls(self) -> int:
    return len(self.calls)

  @property
  def cost_usd(self) -> float:
    return float(sum(c.cost_usd for c in self.calls))

  @property
  def llm_latency_s(self) -> float:
    return float(sum(c.latency_s for c in self.calls))

  @property
  def n_steps(self) -> int:
    return sum(len(t.steps) for t in self.trials)

  def to_json(self, *, with_prompts: bool = False) -> dict:
    calls = [c.to_json() for c in self.calls]
    if not with_prompts:
      for c in calls:
        c.pop("prompt", None)
    return {"qid": self.qid, "question": self.question, "method": self.method,
            "first_answer": self.first_answer, "final_answer": self.final_answer,
            "n_calls": self.n_calls, "cost_usd": self.cost_usd, "llm_latency_s": self.llm_latency_s,
            "wall_s": self.wall_s, "trials": [t.to_json() for t in self.trials], "calls": calls,
            **({"extra": self.extra} if self.extra else {})}


def calls_by_kind(calls: Sequence[CallRecord]) -> dict[str, int]:
  out: dict[str, int] = {}
  for c in calls:
    out[c.kind] = out.get(c.kind, 0) + 1
  return out
