"""LLMRouter-style KNN-multiround router: decompose (planner P) -> route each sub-question by KNN
-> merge (G), with P and G chosen per alpha from the pipeline labels (package docstring)."""
from __future__ import annotations

import asyncio
import copy
import dataclasses

import numpy as np

from gp_jax import errors
from gp_jax.baselines import regressors
from gp_jax.baselines.multi_round import base
from gp_jax.types import Query
from gp_jax.util import aio
from gp_jax.workflow import mdp
from gp_jax.workflow import reward as reward_lib


@dataclasses.dataclass(frozen=True)
class SubQuestionLabels:
  """Labels of the sub-questions one planner wrote for the training queries.

  x: [S, D] float32 embeddings; utility, cost: [S, M] float32 (LLM m executing sub-question s)."""
  x: np.ndarray
  utility: np.ndarray
  cost: np.ndarray


@dataclasses.dataclass(frozen=True)
class PipelineLabels:
  """Alpha-independent training data of the decompose-route-merge pipelines.

  llms: the M LLM names (action-space order).
  utility, cost: [M, N, M] float32; [p, n, m] = utility / cost units of the pipeline in which
    planner p plans training query n and LLM m does everything else.
  subs: per planner p, the labels of its sub-questions.
  """
  llms: tuple[str, ...]
  utility: np.ndarray
  cost: np.ndarray
  subs: tuple[SubQuestionLabels, ...]

  def best_pipeline(self, alpha: float) -> tuple[int, int]:
    """(planner index, merge LLM index) with the best mean training reward at alpha."""
    r = (self.utility - alpha * self.cost).mean(1)          # [P, M]
    p, m = np.unravel_index(int(np.argmax(r)), r.shape)
    return int(p), int(m)


def collect_pipeline_labels(system, queries: list[Query], *, seed: int = 0,
                            concurrency: int = 64) -> PipelineLabels:
  """Runs the M^2 pipelines per training query (planner call shared) and returns their labels."""
  space, llms = system.space, tuple(system.space.llms)
  env = system.env(0.0)          # utility and cost are recorded separately
  sem = asyncio.Semaphore(concurrency)

  async def finish(state, q, m, s_seed):
    while not state.done:
      a = base.pipeline_action(space, state, env.mask(state), planner=m, merger=m, executor=m)
      await env.step(state, q, a, seed=s_seed)
    return state

  async def one(p: str, n: int, q: Query):
    async with sem:
      state, s_seed = env.reset(q), seed * 100003 + n
      mask = env.mask(state)
      if not (mask & space.kind_mask(["planner"])).any():
        raise errors.ConfigError("the KNN multi-round router needs a planner role and "
                                 "config.mdp.p_max >= 1")
      await env.step(state, q, base.pick_action(space, mask, "planner", p), seed=s_seed)
      return await asyncio.gather(*(finish(copy.deepcopy(state), q, m, s_seed) for m in llms))

  async def all_runs():
    return await asyncio.gather(*(one(p, n, q) for p in llms for n, q in enumerate(queries)))

  runs = aio.run(all_runs())
  M, N = len(llms), len(queries)
  utility = np.zeros((M, N, M), np.float32)
  cost = np.zeros_like(utility)
  subs = []
  for p in range(M):
    texts, su, sc = [], [], []
    for n, q in enumerate(queries):
      states = runs[p * N + n]
      for m, s in enumerate(states):
        utility[p, n, m] = base.episode_utility(system, env, s, q)
        cost[p, n, m] = env.cost_units(s)
      for c in states[0].nodes[0].children:
        texts.append(states[0].nodes[c].text)
        su.append([_sub_utility(system, s, c, utility[p, n, m]) for m, s in enumerate(states)])
        sc.append([_sub_cost(s, c) for s in states])
    x = (np.asarray(system.encoder.encode(texts), np.float32) if texts
         else np.zeros((0, system.encoder.dim), np.float32))
    subs.append(SubQuestionLabels(x, np.asarray(su, np.float32).reshape(-1, M),
                                  np.asarray(sc, np.float32).reshape(-1, M)))
  return PipelineLabels(llms, utility, cost, tuple(subs))


def _sub_call(state: mdp.WorkflowState, node_id: int) -> mdp.Call | None:
  return next((c for c in state.calls if c.node == node_id and c.kind == "executor"), None)


def _sub_utility(system, state, node_id: int, pipeline_utility: float) -> float:
  call = _sub_call(state, node_id)
  if call is None or call.error is not None:
    return 0.0
  if not system.simulated:
    return float(pipeline_utility)
  info = system.world.lookup(state.nodes[node_id].text)
  return system.world.exec_probability(info, call.llm) if info is not None else 0.0


def _sub_cost(state, node_id: int) -> float:
  call = _sub_call(state, node_id)
  return reward_lib.cost_units(call.cost_usd) if call is not None else 0.0


class KNNMultiRound(base.MultiRoundRouter):
  """Decompose (planner P) -> route each sub-question by KNN -> merge (G), P and G per alpha."""

  def __init__(self, *, k: int = 10):
    if k < 1:
      raise errors.ConfigError(f"knn k must be >= 1, got {k}")
    self.k = k

  def fit(self, system, queries, *, seed):
    self.space, self.encoder = system.space, system.encoder
    self.labels = collect_pipeline_labels(system, queries, seed=seed)
    return self

  def route(self, subs: SubQuestionLabels, x: np.ndarray, alpha: float) -> np.ndarray:
    """[B, D] sub-question embeddings -> [B] LLM indices, argmax of KNN utility - alpha * cost."""
    u, c = regressors.knn_predict(subs.x, subs.utility, subs.cost, x, k=self.k)
    return np.argmax(u - alpha * c, axis=1)

  def policy(self, alpha):
    p, g = self.labels.best_pipeline(alpha)
    llms, subs = self.labels.llms, self.labels.subs[p]
    cache: dict[str, str] = {}

    def act(query, state, mask, rng):
      a = base.pipeline_action(self.space, state, mask, planner=llms[p], merger=llms[g],
                               executor=None)
      if isinstance(a, int):
        return a
      text = a[1]
      if text not in cache:
        if len(subs.x) == 0:         # the planner never produced sub-questions in training
          cache[text] = llms[g]
        else:
          cache[text] = llms[int(self.route(subs, self.encoder.encode([text]), alpha)[0])]
      return base.pick_action(self.space, mask, "executor", cache[text])
    return act

