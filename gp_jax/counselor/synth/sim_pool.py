r"""A simulated Graph Counselor backend: the oracle, wrong with a calibrated probability.

Each call of LLM m as agent kind k on question q succeeds -- answers exactly as the oracle backend
(oracle.py) would -- with probability

    p(m, k, q, ctx) = sigmoid(s * theta[m, d] + b_k - h_q + c_k(ctx))

and otherwise writes a plausible wrong line of the same format. The terms:

  theta[m, d]  the simulator's skill logit of LLM m on domain d (data/simulator.json, the same
               calibration as gp_jax/sim/simulator.py; d = 'knowledge_reasoning' by default), s a
               scale (SKILL_SCALE) that sets how much the backbone matters.
  b_k          a per-kind offset (KIND_OFFSET): writing a plan line is easier than choosing the
               exact graph call.
  h_q          question difficulty: LEVEL_DIFFICULTY[level] + ACT_DIFFICULTY * (acts of the gold
               plan - 1).
  c_k(ctx)     what the prompt already holds:
                 thought: + PLAN_BONUS      when this step's Plan line is the oracle's;
                 action:  + PLAN_BONUS      when this step's Plan line is the oracle's,
                          + THOUGHT_BONUS   when this step's Thought line is the oracle's;
                 plan / thought / action: + REFLECT_BONUS per helpful reflection in the prompt.

Wrong outputs (parseable, so the loop's own machinery decides what they cost):
  plan / thought  name a wrong next call (the gold call with its last argument swapped for another
                  feature / neighbour-type name of the schema), or at the end a wrong answer;
  action          with probability PREMATURE_FINISH a Finish[wrong answer] before the plan is
                  done, else the wrong call, which the graph functions execute and the replay
                  treats as a wasted step (oracle.replay with skip_off_plan); when the plan is done,
                  Finish[wrong answer];
  judge           the flipped verdict (a wrong answer passes, a right one is sent to reflection);
  reflect         an unhelpful reflection (no REFLECT_BONUS in later trials).
A wrong answer is a near miss of the right one: an integer +- 1..3, a float off by 5-20%, a list
missing one item, or another entity name taken from the question set's gold answers.

Randomness: u = U[0, 1) from a hash of (seed, model, kind, messages); success iff u < p. Runs are
deterministic given the seed; a new seed (`with_seed`) gives fresh draws for the same prompts.
Tokens: input = prompts.messages_tokens(messages) (as the oracle); output =
round(v_m * (tokens of the line + HIDDEN_TOKENS[k])), v_m the simulator's verbosity of m and
HIDDEN_TOKENS the reasoning a real model writes around its one line. $ = catalog prices x tokens.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
import re
import time
from typing import Mapping, Sequence

import numpy as np

from gp_jax import errors
from gp_jax.counselor.agents import prompts
from gp_jax.counselor.eval import metrics
from gp_jax.counselor.kg import data as data_lib
from gp_jax.counselor.kg import interpreter
from gp_jax.counselor.synth import oracle as oracle_lib
from gp_jax.counselor.synth import plans
from gp_jax.llm import base
from gp_jax.llm import catalog as catalog_lib
from gp_jax.sim import simulator

SIM_KINDS = ("plan", "thought", "action", "judge", "reflect")
SKILL_DOMAIN = "knowledge_reasoning"
SKILL_SCALE = 2.0
KIND_OFFSET = {"plan": 1.5, "thought": 1.0, "action": 0.5, "judge": 1.0, "reflect": 0.5}
LEVEL_DIFFICULTY = {"easy": 0.0, "medium": 0.5, "hard": 1.0, "unknown": 0.5}
ACT_DIFFICULTY = 0.25
PLAN_BONUS = 1.0
THOUGHT_BONUS = 1.0
REFLECT_BONUS = 0.5
PREMATURE_FINISH = 0.25
HIDDEN_TOKENS = {"plan": 40, "thought": 60, "action": 10, "judge": 30, "reflect": 150}
UNHELPFUL_REFLECTION = ("Recap: the attempt gave an answer that was judged wrong. Improved strategy: "
                        "repeat the same graph calls and read the last observation more carefully.")

_NAMES_LINE = re.compile(r"features \[([^\]]*)\]; neighbour types \[([^\]]*)\]")
_LAST_ARG = re.compile(r", ([A-Za-z_]\w*)\]$")
_RETRIEVE_ONLY = re.compile(r'^Retrieve\["(.*)"\]$')
_INT = re.compile(r"-?\d+")
_PROPOSED = re.compile(r"^Proposed answer: (.*)$", re.MULTILINE)


def sigmoid(x: float) -> float:
  return 1.0 / (1.0 + math.exp(-x))


def _uniform(*keys) -> float:
  digest = hashlib.blake2b(repr(keys).encode(), digest_size=8).digest()
  return int.from_bytes(digest, "little") / 2.0 ** 64


@dataclasses.dataclass(frozen=True)
class QuestionFacts:
  """What the simulator knows of a question: its gold plan, answer and difficulty h_q."""
  plan: dict
  answer: str
  difficulty: float


def question_difficulty(q: data_lib.GraphQuestion) -> float:
  """h_q = LEVEL_DIFFICULTY[level] + ACT_DIFFICULTY * (acts of the gold plan - 1)."""
  acts = plans.num_acts(q.plan) if q.plan else 1
  return LEVEL_DIFFICULTY.get(q.level, LEVEL_DIFFICULTY["unknown"]) + ACT_DIFFICULTY * (acts - 1)


def success_probability(skill: float, kind: str, difficulty: float, bonus: float = 0.0, *,
                        skill_scale: float = SKILL_SCALE) -> float:
  """p = sigmoid(skill_scale * theta + b_kind - h + bonus) (module docstring)."""
  return sigmoid(skill_scale * skill + KIND_OFFSET[kind] - difficulty + bonus)


class SimCounselorPool(base.LLMPool):
  """The oracle with calibrated mistakes; see the module docstring.

  stats(): calls, and per agent kind the number of draws, successes, the sum of p and of p(1-p)
  (so a test can check successes against their expectation).
  """

  def __init__(self, catalog: catalog_lib.Catalog, questions: Sequence[data_lib.GraphQuestion], *,
               seed: int = 0, skill_domain: str = SKILL_DOMAIN, skill_scale: float = SKILL_SCALE,
               p_override: float | None = None, profiles: Mapping | None = None):
    """Args:
      catalog: the LLM catalog (names, prices); every LLM needs a simulator calibration.
      questions: generated questions (they carry gold plans); others are answered 'unknown'.
      seed: the draws' seed.
      skill_domain: which simulator domain's skill theta[m, d] is used.
      skill_scale: s in the success logit.
      p_override: a fixed success probability for every call (tests; 1.0 = the oracle).
      profiles: simulator profiles by LLM name (default: loaded for the catalog).
    """
    super().__init__(catalog)
    self.profiles = dict(profiles) if profiles is not None else simulator.load_profiles(catalog)
    for name in catalog.names:
      if name not in self.profiles:
        raise errors.ConfigError(f"the simulator has no calibration for LLM {name!r}")
      if skill_domain not in self.profiles[name].theta:
        raise errors.unknown_name("simulator domain", skill_domain, self.profiles[name].theta)
    if p_override is not None and not 0.0 <= p_override <= 1.0:
      raise errors.ConfigError(f"p_override must be in [0, 1], got {p_override}")
    missing = [q.qid for q in questions if q.plan is None]
    if missing:
      raise errors.ConfigError(f"the simulated pool follows gold plans, but {len(missing)} "
                               f"question(s) have none (e.g. {missing[0]!r}); use generated questions")
    self.facts = {q.question: QuestionFacts(q.plan, q.answer, question_difficulty(q))
                  for q in questions}
    self._names = sorted({q.answer for q in questions
                          if q.answer and ", " not in q.answer and _as_float(q.answer) is None})
    self.seed = seed
    self.skill_domain = skill_domain
    self.skill_scale = skill_scale
    self.p_override = p_override
    self._oracle = oracle_lib.OraclePool(catalog, {k: f.plan for k, f in self.facts.items()})
    self._schema_names: dict[str, list[str]] = {}
    self.reset_stats()

  def with_seed(self, seed: int) -> "SimCounselorPool":
    """The same pool with another seed (fresh, independent draws); shares the question tables."""
    other = object.__new__(SimCounselorPool)
    other.__dict__.update(self.__dict__)
    other.seed = seed
    other.reset_stats()
    return other

  def reset_stats(self) -> None:
    self.n_calls = 0
    self.draws = {k: {"n": 0, "ok": 0, "sum_p": 0.0, "sum_var": 0.0} for k in SIM_KINDS}

  def stats(self) -> dict:
    return {"calls": self.n_calls, "draws": {k: dict(v) for k, v in self.draws.items()}}

  def skill(self, model: str) -> float:
    return float(self.profiles[model].theta[self.skill_domain])

  async def chat(self, model: str, messages: Sequence[base.Message],
                 params: base.SamplingParams = base.SamplingParams()) -> base.Completion:
    spec = self.catalog[model]  # unknown model: ConfigError (misconfiguration)
    t0 = time.perf_counter()
    kind = prompts.agent_kind_of(messages)
    text = self._respond(model, kind, messages)
    self.n_calls += 1
    n_in = prompts.messages_tokens(messages)
    hidden = HIDDEN_TOKENS.get(kind, 0)
    n_out = max(1, int(round(self.profiles[model].verbosity * (prompts.count_tokens(text) + hidden))))
    return base.Completion(model=model, text=text, input_tokens=n_in, output_tokens=n_out,
                           cost_usd=spec.cost_usd(n_in, n_out), latency_s=time.perf_counter() - t0)

  # ----------------------------------------------------------------------------- one call
  def _respond(self, model: str, kind: str | None, messages: Sequence[base.Message]) -> str:
    user = messages[-1]["content"] if messages else ""
    question, entries = oracle_lib.read_pad(user)
    facts = self.facts.get(question)
    if kind not in SIM_KINDS or facts is None:
      return self._oracle._respond(messages)  # metric judge, one-shot baselines, unknown questions
    move = oracle_lib.replay(facts.plan, entries, skip_off_plan=True)
    if move[0] == "error" and kind in ("plan", "thought", "action"):
      return oracle_lib.move_text(kind, move)
    bonus = 0.0
    if kind in ("plan", "thought", "action"):
      bonus += REFLECT_BONUS * user.count(oracle_lib.REFLECTION)
      plan_line, thought_line = _this_step(entries)
      if kind in ("thought", "action") and plan_line == oracle_lib.move_text("plan", move):
        bonus += PLAN_BONUS
      if kind == "action" and thought_line == oracle_lib.move_text("thought", move):
        bonus += THOUGHT_BONUS
    if self.p_override is not None:
      p = self.p_override
    else:
      p = success_probability(self.skill(model), kind, facts.difficulty, bonus,
                              skill_scale=self.skill_scale)
    u = _uniform("sim-counselor", self.seed, model, kind, tuple(
        (m["role"], m["content"]) for m in messages))
    ok = u < p
    d = self.draws[kind]
    d["n"] += 1
    d["ok"] += int(ok)
    d["sum_p"] += p
    d["sum_var"] += p * (1.0 - p)
    rng = np.random.default_rng(int(u * 2 ** 53))  # the wrong output's own draws
    if kind == "judge":
      proposed = next(iter(_PROPOSED.findall(user)), "")
      yes = oracle_lib.judge_is_yes(move, proposed)
      return oracle_lib.judge_text(yes if ok else not yes)
    if kind == "reflect":
      return oracle_lib.REFLECTION if ok else UNHELPFUL_REFLECTION
    if ok:
      return oracle_lib.move_text(kind, move)
    return self._wrong_line(kind, move, entries, messages, facts, rng)

  def _wrong_line(self, kind, move, entries, messages, facts, rng) -> str:
    names = self._schema(messages[0]["content"])
    if move[0] == "finish":
      wrong = self.wrong_answer(interpreter.format_answer(move[1]), rng)
      if kind == "plan":
        last = next((t for l, t in reversed(entries) if l == "Action"), "")
        return oracle_lib.move_text("plan", ("act", last or wrong_call("", names, rng)))
      return oracle_lib.move_text(kind, ("finish", wrong))
    if kind == "action" and rng.random() < PREMATURE_FINISH:
      return oracle_lib.move_text("action", ("finish", self.wrong_answer(facts.answer, rng)))
    return oracle_lib.move_text(kind, ("act", wrong_call(str(move[1]), names, rng)))

  def _schema(self, system: str) -> list[str]:
    if system not in self._schema_names:
      found = []
      for feats, nbrs in _NAMES_LINE.findall(system):
        found += [x.strip() for x in (feats + "," + nbrs).split(",") if x.strip()]
      self._schema_names[system] = sorted(set(found))
    return self._schema_names[system]

  def wrong_answer(self, answer: str, rng: np.random.Generator) -> str:
    """A near miss of `answer` (module docstring); never equal to it under exact match."""
    for _ in range(8):
      guess = self._near_miss(answer, rng)
      if metrics.exact_match(guess, answer) == 0.0:
        return guess
    return answer + " (unverified)"

  def _near_miss(self, answer: str, rng: np.random.Generator) -> str:
    text = answer.strip()
    if _INT.fullmatch(text):
      v = int(text)
      delta = int(rng.integers(1, 4)) * (1 if v < 3 or rng.random() < 0.5 else -1)
      return str(v + delta)
    x = _as_float(text)
    if x is not None:
      decimals = len(text.split(".")[1]) if "." in text else 0
      factor = 1.0 + float(rng.uniform(0.05, 0.2)) * (1 if rng.random() < 0.5 else -1)
      return interpreter.format_answer(round(x * factor, decimals))
    items = [s for s in text.split(", ") if s]
    if len(items) > 1:
      del items[int(rng.integers(len(items)))]
      return ", ".join(items)
    others = [n for n in self._names if n != text]
    if others:
      return others[int(rng.integers(len(others)))]
    return " ".join(reversed(text.split())) if " " in text else "unknown"


def wrong_call(action: str, schema_names: Sequence[str], rng: np.random.Generator) -> str:
  """A parseable graph call that is not `action`: its last name argument swapped for another
  schema name, or a Retrieve of a shortened keyword."""
  m = _LAST_ARG.search(action)
  if m:
    others = [n for n in schema_names if n != m.group(1)] or [m.group(1) + "_count"]
    return action[:m.start(1)] + others[int(rng.integers(len(others)))] + "]"
  m = _RETRIEVE_ONLY.match(action)
  keyword = m.group(1) if m else ""
  words = keyword.split()
  short = " ".join(words[:-1]) if len(words) > 1 else (keyword + " review").strip()
  return f"Retrieve[{plans.quote(short)}]"


def _this_step(entries: list[tuple[str, str]]) -> tuple[str | None, str | None]:
  """The Plan and Thought lines written since the last Observation (this step's)."""
  plan_line = thought_line = None
  for label, text in reversed(entries):
    if label in ("Observation", "Action"):
      break
    if label == "Plan" and plan_line is None:
      plan_line = text.strip()
    elif label == "Thought" and thought_line is None:
      thought_line = text.strip()
  return plan_line, thought_line


def _as_float(text: str) -> float | None:
  try:
    return float(text)
  except ValueError:
    return None
