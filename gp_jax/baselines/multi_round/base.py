"""The shared base of the multi-round routers: the router interface, the lock-step runner and the
action helpers of the decompose-route-merge workflow (gp_jax/baselines/multi_round/__init__.py)."""
from __future__ import annotations

import abc
import asyncio
from typing import Awaitable, Callable, Sequence

import numpy as np

from gp_jax import errors
from gp_jax.llm import catalog as catalog_lib
from gp_jax.sim import simulator as sim
from gp_jax.types import Query
from gp_jax.util import aio
from gp_jax.workflow import env as env_lib
from gp_jax.workflow import mdp
from gp_jax.workflow import policies


def default_router_llm(catalog: catalog_lib.Catalog, llms: Sequence[str]) -> str:
  """The router LLM when none is configured: the cheapest LLM of the pool (first in pool order).

  On the shipped pools this is qwen2.5-7b-instruct, a 7B Qwen2.5 like Router-R1's router."""
  prices = [catalog[m].price_in + catalog[m].price_out for m in llms]
  return llms[int(np.argmin(prices))]


def resolve_router_llm(system, name: str) -> str:
  llms = list(system.space.llms)
  if not name:
    return default_router_llm(system.catalog, llms)
  if name not in llms:
    raise errors.unknown_name("router LLM", name, llms)
  return name


def pick_action(space: mdp.ActionSpace, mask: np.ndarray, kind: str, llm: str) -> int:
  """Action (first role of `kind`, `llm`) if valid; else a valid action of `llm` in any role, else a
  valid action of `kind` with any LLM, else the first valid action (forced steps, e.g. Phase 1)."""
  col = np.arange(space.size) % space.num_llms == list(space.llms).index(llm)
  of_kind = space.kind_mask([kind])
  for cand in (mask & of_kind & col, mask & col, mask & of_kind, mask):
    nz = np.flatnonzero(cand)
    if nz.size:
      return int(nz[0])
  raise ValueError("no valid action: the episode is finished")


def pipeline_action(space: mdp.ActionSpace, state: mdp.WorkflowState, mask: np.ndarray, *,
                    planner: str, merger: str, executor: str | None) -> tuple[str, str] | int:
  """The decompose-route-merge workflow: Planner(planner) at the root, Executor per sub-question,
  Summarizer(merger), final Executor(merger). Returns an action, or ("executor", node text) when the
  current node's Executor must be routed (`executor` None). A root that cannot be planned (no
  planner role, p_max = 0, or a plan with no sub-questions) is answered directly by a routed
  Executor."""
  node = state.node
  if state.at_final_answer:
    return pick_action(space, mask, "executor", merger)
  if node.status == mdp.PLANNING:
    return pick_action(space, mask, "summarizer", merger)
  if node.id == 0 and not node.plan_failed and (mask & space.kind_mask(["planner"])).any():
    return pick_action(space, mask, "planner", planner)
  if executor is not None:
    return pick_action(space, mask, "executor", executor)
  return ("executor", node.text)


# decide(indices of the unfinished episodes, their states, their masks) -> their actions
Decide = Callable[[list[int], list[mdp.WorkflowState], list[np.ndarray]], Awaitable[list[int]]]


async def lockstep(env: env_lib.WorkflowEnv, queries: list[Query], decide: Decide, *,
                    seed_base: int) -> list[mdp.WorkflowState]:
  """Runs all episodes together: each round, `decide` picks the actions of every unfinished episode
  at once (one batched network call, or concurrent routing prompts), then their LLM calls are made
  concurrently. Episode i samples with seed seed_base + i."""
  states = [env.reset(q) for q in queries]
  while True:
    active = [i for i, s in enumerate(states) if not s.done]
    if not active:
      return states
    masks = [env.mask(states[i]) for i in active]
    actions = await decide(active, [states[i] for i in active], masks)
    await asyncio.gather(*(env.step(states[i], queries[i], int(a), seed=seed_base + i)
                           for i, a in zip(active, actions)))


def episode_utility(system, env: env_lib.WorkflowEnv, state: mdp.WorkflowState, q: Query) -> float:
  """E[U | calls] on the simulator, the realised score elsewhere (as the evaluation reports)."""
  if not system.simulated:
    return env.utility(state, q)
  return sim.expected_utility(system.world, state)


class MultiRoundRouter(abc.ABC):
  """fit(system, train_queries, seed) once; run(system, alpha, queries, seed) -> finished states."""

  @abc.abstractmethod
  def fit(self, system, queries: list[Query], *, seed: int) -> "MultiRoundRouter":
    """Fits the router on the training queries; returns self."""

  @abc.abstractmethod
  def policy(self, alpha: float) -> policies.Policy:
    """A synchronous policy for gp_jax.workflow.policies.run_policy (tests, single queries)."""

  def run(self, system, alpha: float, queries: list[Query], *, seed: int
          ) -> list[mdp.WorkflowState]:
    env = system.env(alpha)
    act = self.policy(alpha)

    async def decide(active, states, masks):
      return [act(queries[i], s, m, None) for i, s, m in zip(active, states, masks)]
    return aio.run(lockstep(env, queries, decide, seed_base=seed * 100003))
