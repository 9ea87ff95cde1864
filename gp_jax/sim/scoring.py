"""Scores of finished episodes, per domain: accuracy, $ cost, reward, LLM calls per query and
the split rate (share of queries with at least one Planner call).

On the simulator (`system.simulated`) an episode's reward is the expected reward of its actual
decisions, E[U | calls] - alpha * cost, which removes the simulator's sampling noise; accuracy is
the realised one. Real backends get the sampled reward of their scored answers. `system` is any
object with `simulated`, `world`, `space`, `mdp_cfg` and `describe` (the run layer's System).
"""
from __future__ import annotations

import collections
import dataclasses

import numpy as np

from gp_jax.sim import optimal
from gp_jax.sim import simulator as sim
from gp_jax.types import Query
from gp_jax.workflow import env as env_lib
from gp_jax.workflow import mdp
from gp_jax.workflow import policies


@dataclasses.dataclass
class Row:
  policy: str
  domain: str
  n: int
  accuracy: float
  cost: float       # mean cost units (milli-dollars) per query
  reward: float     # mean (expected, on the simulator) reward per query
  calls: float
  split_rate: float | None = None        # share of queries with >= 1 Planner call
  # The router's splits against the optimum's (gp_jax/runs/evaluate.py; None where there is no
  # optimum, for other policies, or where the share's denominator is 0).
  split_recall: float | None = None      # of the queries the optimum splits, share it splits too
  split_precision: float | None = None   # of the queries it splits, share the optimum splits too


def episode_stats(system, env: env_lib.WorkflowEnv, q: Query,
                  state: mdp.WorkflowState) -> tuple[float, float, float, int]:
  """(realised utility, cost units, reward, calls) of one finished episode."""
  u = env.utility(state, q)
  cost = env.cost_units(state)
  expected_u = sim.expected_utility(system.world, state) if system.simulated else u
  return u, cost, expected_u - env.alpha * cost, len(state.calls)


def split(state: mdp.WorkflowState) -> bool:
  """Whether an episode made at least one Planner call."""
  return state.planner_calls > 0


def summarize(name: str, system, env, queries: list[Query], states) -> list[Row]:
  by = collections.defaultdict(list)
  for q, s in zip(queries, states):
    st = episode_stats(system, env, q, s) + (split(s),)
    by[q.domain].append(st)
    by["all"].append(st)
  rows = []
  for domain in sorted(by, key=lambda d: (d == "all", d)):
    a = np.array(by[domain], float)
    rows.append(Row(name, domain, len(a), *a[:, :3].mean(0), a[:, 3].mean(),
                    split_rate=float(a[:, 4].mean())))
  return rows


def optimum_rows(name: str, system, env, queries: list[Query], *, seed: int,
                 **restrictions) -> list[Row]:
  """Rows `name` of the exact DP optimum (simulator only) followed through the MDP; restrictions
  (planners, mergers, max_plan_depth) narrow it to a smaller policy class (optimal.OptimalSolver)."""
  solver = optimal.OptimalSolver(system.world, system.space, system.mdp_cfg, env.alpha,
                                 system.describe, **restrictions)
  return summarize(name, system, env, queries,
                   policies.run_policy(env, policies.oracle_policy(optimal.OraclePolicy(solver)),
                                       queries, seed=seed))
