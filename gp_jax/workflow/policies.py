"""Fixed (non-learned) routing policies: uniformly random valid action, single-LLM executor.

Each policy maps (query, workflow state, mask, rng) to an action; `run_policy` runs one over
queries with many episodes in flight.
"""
from __future__ import annotations

import asyncio
from typing import Callable, Protocol

from gp_jax.util import aio

import numpy as np

from gp_jax.types import Query
from gp_jax.workflow import env as env_lib
from gp_jax.workflow import mdp


class Policy(Protocol):
  def __call__(self, query: Query, state: mdp.WorkflowState, mask: np.ndarray,
               rng: np.random.Generator) -> int: ...


def random_policy(query, state, mask, rng) -> int:
  """Uniform over the valid actions."""
  return int(rng.choice(np.flatnonzero(mask)))


def single_llm_policy(space: mdp.ActionSpace, llm: str) -> Policy:
  """Answers every query directly with one LLM (Executor only); at a forced non-executor
  step (Phase 1) it uses the same LLM in whatever role is allowed."""
  k = list(space.llms).index(llm)

  def act(query, state, mask, rng):
    executor = space.kind_mask(["executor"])
    for a in np.flatnonzero(mask & executor):
      if a % space.num_llms == k:
        return int(a)
    for a in np.flatnonzero(mask):
      if a % space.num_llms == k:
        return int(a)
    # The LLM is not in the pool here (before a join event): another LLM's executor answers.
    answer = np.flatnonzero(mask & executor)
    return int(answer[0] if len(answer) else np.flatnonzero(mask)[0])
  return act


def oracle_policy(oracle) -> Policy:
  return lambda query, state, mask, rng: oracle.act(query, state)


async def _run(env: env_lib.WorkflowEnv, policy: Policy, queries: list[Query], seed: int,
               concurrency: int) -> list[mdp.WorkflowState]:
  sem = asyncio.Semaphore(concurrency)

  async def one(i: int, q: Query) -> mdp.WorkflowState:
    async with sem:
      rng = np.random.default_rng([seed, i])
      state = env.reset(q)
      while not state.done:
        await env.step(state, q, policy(q, state, env.mask(state), rng), seed=seed * 100003 + i)
      return state

  return await asyncio.gather(*[one(i, q) for i, q in enumerate(queries)])


def run_policy(env: env_lib.WorkflowEnv, policy: Policy, queries: list[Query], *, seed: int = 0,
               concurrency: int = 64) -> list[mdp.WorkflowState]:
  """Finished workflow states, one per query, in order."""
  return aio.run(_run(env, policy, queries, seed, concurrency))
