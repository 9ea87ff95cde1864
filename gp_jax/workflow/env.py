"""The workflow environment: the routing MDP wired to an LLM pool, a task scorer and the reward.

Host-side and asynchronous: `step` awaits one LLM call. Many episodes run at once by awaiting
their steps together (gp_jax/rl/rollout.py).
"""
from __future__ import annotations

import dataclasses
import time
from typing import Callable

import numpy as np

from gp_jax import errors
from gp_jax.llm import base
from gp_jax.types import Query
from gp_jax.workflow import mdp
from gp_jax.workflow import prompts
from gp_jax.workflow import reward as reward_lib

Describe = Callable[[Query], tuple[str, str]]          # query -> (task description, answer format)
Scorer = Callable[[str | None, Query], float]           # (final answer, query) -> utility in [0, 1]
ExpectedUtility = Callable[[mdp.WorkflowState], float]  # finished state -> E[utility | its calls]
LLMMask = Callable[[mdp.WorkflowState], np.ndarray]     # state -> LLMs in the pool, bool [num_llms]


@dataclasses.dataclass(frozen=True)
class StepResult:
  reward: float
  done: bool
  call: mdp.Call
  finish_reason: str | None = None   # the backend's ('length': cut by the token cap)


class WorkflowEnv:
  """reset/mask/step over one query at a time; holds no per-episode state itself."""

  def __init__(self, space: mdp.ActionSpace, cfg: mdp.MDPConfig, pool: base.LLMPool, *,
               alpha: float, describe: Describe, scorer: Scorer,
               sampling: base.SamplingParams = base.SamplingParams(),
               expected_utility: ExpectedUtility | None = None, llm_mask: LLMMask | None = None):
    """expected_utility: when given (simulator only), the terminal reward uses E[U | the calls made]
    instead of the scored answer: the same objective in expectation, without the sampling noise.
    llm_mask: the LLMs of the space present in the pool at an episode's query (the simulator's
    join events); the actions of the others are masked. None: every LLM, always."""
    cfg.validate()
    if alpha < 0:
      raise errors.ConfigError(f"alpha must be >= 0, got {alpha}")
    for m in space.llms:
      pool.catalog[m]
    self.space, self.cfg, self.pool = space, cfg, pool
    self.alpha, self.describe, self.scorer, self.sampling = alpha, describe, scorer, sampling
    self.expected_utility = expected_utility
    self.llm_mask = llm_mask

  def reset(self, query: Query) -> mdp.WorkflowState:
    return mdp.new_state(query.query)

  def mask(self, state: mdp.WorkflowState) -> np.ndarray:
    m = mdp.action_mask(state, self.space, self.cfg)
    if self.llm_mask is not None:   # index = role_idx * num_llms + llm_idx
      m &= np.tile(np.asarray(self.llm_mask(state), bool), len(self.space.roles))
    return m

  async def step(self, state: mdp.WorkflowState, query: Query, action: int, seed: int, *,
                 params: base.SamplingParams | None = None, conversation: str = "",
                 on_delta: Callable[[str], None] | None = None) -> StepResult:
    """Makes the LLM call of `action`, applies the transition, returns the reward.

    params: this call's sampling (default: the env's), with `seed`. conversation: a block the
    call's user message starts with (prompts.build_messages). on_delta: the pool streams the
    call's text to it (LLMPool.chat_stream)."""
    if state.done:
      raise RuntimeError("step on a finished episode")
    if not self.mask(state)[action]:
      raise ValueError(f"action {action} ({self.space.decode(action)[0].name}) is masked here")
    role, llm = self.space.decode(action)
    desc, fmt = self.describe(query)
    messages = prompts.build_messages(role, state, self.cfg, desc, fmt, conversation=conversation)
    params = dataclasses.replace(params or self.sampling, seed=seed)
    t0 = time.perf_counter()
    if on_delta is None:
      out = await self.pool.chat(llm, messages, params)
    else:
      out = await self.pool.chat_stream(llm, messages, params, on_delta)
    call = mdp.Call(step=state.steps, action=action, role=role.name, kind=role.kind, llm=llm,
                    node=state.current, input_text=state.node.text, output_text=out.text,
                    input_tokens=out.input_tokens, output_tokens=out.output_tokens,
                    cost_usd=out.cost_usd, latency_s=out.latency_s or time.perf_counter() - t0,
                    error=out.error)
    mdp.apply(state, call, self.cfg)
    r = reward_lib.step_reward(out.cost_usd, self.alpha)
    if state.done:
      r += self.reward_utility(state, query)
    return StepResult(reward=r, done=state.done, call=call, finish_reason=out.finish_reason)

  def utility(self, state: mdp.WorkflowState, query: Query) -> float:
    u = float(self.scorer(state.final_answer, query)) if state.final_answer is not None else 0.0
    if not 0.0 <= u <= 1.0:
      raise ValueError(f"scorer returned {u} outside [0, 1] for {query.qid}")
    return u

  def reward_utility(self, state: mdp.WorkflowState, query: Query) -> float:
    """The utility the terminal reward (and the history memory) uses."""
    if self.expected_utility is None:
      return self.utility(state, query)
    return float(self.expected_utility(state)) if state.final_answer is not None else 0.0

  def cost_units(self, state: mdp.WorkflowState) -> float:
    return reward_lib.cost_units(sum(c.cost_usd for c in state.calls))
