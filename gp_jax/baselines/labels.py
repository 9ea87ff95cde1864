"""Training labels of the single-round routers: utility and cost of every LLM on every query.

Each LLM answers each query directly (Executor only) through the workflow environment, exactly as
`gp_jax.workflow.policies.single_llm_policy` does at evaluation time. On the simulator the utility
label is the analytic E[U | calls] (no sampling noise); on other backends it is the realised score.
Costs are in the reward's cost units (milli-dollars).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from gp_jax.sim import simulator as sim
from gp_jax.types import Query
from gp_jax.workflow import policies


@dataclasses.dataclass(frozen=True)
class RoutingData:
  """Per-(query, LLM) labels.

  Attributes:
    x: [N, D] float32 query text embeddings (the System's encoder).
    utility: [N, M] float32 utility of LLM m answering query n, in [0, 1].
    cost: [N, M] float32 cost units of that call.
    llms: the M LLM names, in the action space's order.
    tasks: the N queries' task names (graph routers link queries through task nodes).
    llm_x: [M, D] float32 embeddings of the LLMs' catalog descriptions (graph routers' LLM nodes).
  """
  x: np.ndarray
  utility: np.ndarray
  cost: np.ndarray
  llms: tuple[str, ...]
  tasks: tuple[str, ...] = ()
  llm_x: np.ndarray | None = None

  def save(self, path) -> None:
    extra = {} if self.llm_x is None else dict(llm_x=self.llm_x)
    np.savez(path, x=self.x, utility=self.utility, cost=self.cost, llms=np.array(self.llms),
             tasks=np.array(self.tasks, dtype=str), **extra)

  @classmethod
  def load(cls, path) -> "RoutingData":
    with np.load(path) as z:
      return cls(z["x"], z["utility"], z["cost"], tuple(str(s) for s in z["llms"]),
                 tuple(str(s) for s in z["tasks"]) if "tasks" in z else (),
                 z["llm_x"] if "llm_x" in z else None)


def embed(system, queries: list[Query]) -> np.ndarray:
  """[N, D] float32 embeddings of the queries' texts."""
  return np.asarray(system.encoder.encode([q.query for q in queries]), np.float32)


def collect(system, queries: list[Query], *, seed: int = 0, concurrency: int = 64) -> RoutingData:
  """Runs every LLM of the pool as a direct executor on every query; returns the labels.

  Args:
    system: a gp_jax.runs.system.System (pool, action space, scorer, encoder).
    queries: the N training queries.
    seed: sampling seed of the calls.
    concurrency: episodes in flight per LLM.
  """
  env = system.env(0.0)     # alpha does not matter: utility and cost are recorded separately
  llms = tuple(system.space.llms)
  utility = np.zeros((len(queries), len(llms)), np.float32)
  cost = np.zeros_like(utility)
  for j, llm in enumerate(llms):
    states = policies.run_policy(env, policies.single_llm_policy(system.space, llm), queries,
                                 seed=seed, concurrency=concurrency)
    for i, (q, s) in enumerate(zip(queries, states)):
      utility[i, j] = (sim.expected_utility(system.world, s) if system.simulated
                       else env.utility(s, q))
      cost[i, j] = env.cost_units(s)
  llm_x = np.asarray(system.encoder.encode([system.catalog[m].description for m in llms]), np.float32)
  return RoutingData(embed(system, queries), utility, cost, llms,
                     tuple(q.task_name for q in queries), llm_x)
