"""The simulator's DP optimum against brute-force enumeration, and the oracle in the real env."""
import asyncio
import copy
import dataclasses

import numpy as np
import pytest

from gp_jax.baselines.multi_round import router_r1
from gp_jax.runs import system as system_lib
from gp_jax.sim import optimal
from gp_jax.sim import simulator as sim
from gp_jax.workflow import env as env_lib
from gp_jax.workflow import mdp
from gp_jax.workflow import roles as roles_lib


def brute_force(env, world, query, alpha, mask=None):
  """Max over every valid action sequence of E[U | calls] - alpha * cost (mask: state -> the
  valid actions, default the MDP's)."""
  mask = mask or env.mask
  best = -np.inf

  async def rec(state):
    nonlocal best
    if state.done:
      best = max(best, sim.expected_utility(world, state) - alpha * env.cost_units(state))
      return
    for a in np.flatnonzero(mask(state)):
      s2 = copy.deepcopy(state)
      await env.step(s2, query, int(a), seed=0)
      await rec(s2)

  asyncio.run(rec(env.reset(query)))
  return best


def make(tiny_world, roles, cfg, alpha):
  roles_set = roles_lib.load_roles().select(roles)
  space = mdp.ActionSpace(roles_set, tuple(tiny_world["names"]))
  pool = sim.SimulatorPool(tiny_world["catalog"], roles_set, tiny_world["world"])
  env = env_lib.WorkflowEnv(space, cfg, pool, alpha=alpha, describe=system_lib.sim_describe,
                            scorer=sim.sim_score)
  solver = optimal.OptimalSolver(tiny_world["world"], space, cfg, alpha, system_lib.sim_describe)
  return env, solver


@pytest.mark.parametrize("alpha", [0.0, 0.5])
@pytest.mark.parametrize("cfg", [
    mdp.MDPConfig(p_max=1, max_width=2, max_depth=2, step_cap=16),
    mdp.MDPConfig(p_max=2, max_width=2, max_depth=2, step_cap=16),
    mdp.MDPConfig(phase1_depth=1, phase1_width=2, step_cap=16),
])
def test_dp_matches_brute_force(tiny_world, cfg, alpha):
  env, solver = make(tiny_world, ["planner", "executor", "summarizer"], cfg, alpha)
  for q in tiny_world["world"].sample_queries(3, seed=1, split="bf"):
    assert solver.value(q) == pytest.approx(brute_force(env, tiny_world["world"], q, alpha), abs=1e-9)


def test_dp_matches_brute_force_with_thinker_and_verifier(tiny_world):
  cfg = mdp.MDPConfig(p_max=1, max_width=2, max_depth=1, step_cap=16)
  env, solver = make(tiny_world, ["planner", "executor", "summarizer", "thinker", "verifier"], cfg, 0.3)
  for q in tiny_world["world"].sample_queries(2, seed=2, split="bf"):
    assert solver.value(q) == pytest.approx(brute_force(env, tiny_world["world"], q, 0.3), abs=1e-9)


@pytest.mark.parametrize("alpha", [0.0, 0.5])
def test_restricted_dp_matches_brute_force_under_router_r1_mask(tiny_world, alpha):
  """planners = mergers = (router LLM,), max_plan_depth = 1: the optimum within Router-R1's mask."""
  cfg = mdp.MDPConfig(p_max=2, max_width=2, max_depth=2, step_cap=16)
  env, full = make(tiny_world, ["planner", "executor", "summarizer"], cfg, alpha)
  router = tiny_world["names"][0]
  solver = optimal.OptimalSolver(tiny_world["world"], env.space, cfg, alpha, system_lib.sim_describe,
                                 planners=[router], mergers=[router], max_plan_depth=1)
  r1 = lambda state: router_r1.r1_mask(env.space, router, state, env.mask(state))
  oracle = optimal.OraclePolicy(solver)
  for q in tiny_world["world"].sample_queries(3, seed=1, split="bf"):
    value = solver.value(q)
    assert value == pytest.approx(brute_force(env, tiny_world["world"], q, alpha, mask=r1), abs=1e-9)
    assert value <= full.value(q) + 1e-12
    state = env.reset(q)                    # its oracle stays inside the mask

    async def run():
      while not state.done:
        a = oracle.act(q, state)
        assert r1(state)[a]
        await env.step(state, q, a, seed=5)
    asyncio.run(run())
  with pytest.raises(ValueError, match="planners must be a non-empty subset"):
    optimal.OptimalSolver(tiny_world["world"], env.space, cfg, alpha, system_lib.sim_describe,
                          planners=["nope"])


def test_oracle_policy_realises_dp_value(tiny_world):
  cfg = mdp.MDPConfig()
  env, solver = make(tiny_world, ["planner", "executor", "summarizer"], cfg, 0.1)
  oracle = optimal.OraclePolicy(solver)
  for q in tiny_world["world"].sample_queries(6, seed=3, split="or"):
    state = env.reset(q)

    async def run():
      while not state.done:
        await env.step(state, q, oracle.act(q, state), seed=5)
    asyncio.run(run())
    realised = sim.expected_utility(tiny_world["world"], state) - 0.1 * env.cost_units(state)
    assert realised == pytest.approx(solver.value(q), abs=1e-9)


def test_simulated_utility_matches_expected_in_mean(tiny_world):
  """Sampled utilities average to the analytic E[U | calls] (the simulator is unbiased)."""
  cfg = mdp.MDPConfig()
  env, solver = make(tiny_world, ["planner", "executor", "summarizer"], cfg, 0.0)
  q = tiny_world["world"].sample_queries(1, seed=4, split="mc")[0]
  oracle = optimal.OraclePolicy(solver)
  us, expected = [], None

  async def run(seed):
    state = env.reset(q)
    while not state.done:
      await env.step(state, q, oracle.act(q, state), seed=seed)
    return state
  for seed in range(400):
    st = asyncio.run(run(seed))
    us.append(env.utility(st, q))
    expected = sim.expected_utility(tiny_world["world"], st)
  assert np.mean(us) == pytest.approx(expected, abs=4 * np.sqrt(expected * (1 - expected) / 400) + 1e-3)


def test_expected_reward_env_sums_to_expected_return(tiny_world):
  """With expected_utility, an episode's rewards add up to E[U | calls] - alpha * cost exactly."""
  cfg = mdp.MDPConfig()
  env, solver = make(tiny_world, ["planner", "executor", "summarizer"], cfg, 0.5)
  world = tiny_world["world"]
  env_e = env_lib.WorkflowEnv(env.space, cfg, env.pool, alpha=0.5, describe=system_lib.sim_describe,
                              scorer=sim.sim_score,
                              expected_utility=lambda s: sim.expected_utility(world, s))
  oracle = optimal.OraclePolicy(solver)
  for q in world.sample_queries(4, seed=6, split="er"):
    state, total = env_e.reset(q), 0.0

    async def run():
      nonlocal total
      while not state.done:
        total += (await env_e.step(state, q, oracle.act(q, state), seed=1)).reward
    asyncio.run(run())
    assert total == pytest.approx(solver.value(q), abs=1e-9)
    assert env_e.reward_utility(state, q) == pytest.approx(sim.expected_utility(world, state))
    assert env_e.utility(state, q) in (0.0, 1.0)   # the scored answer is still available


def test_reward_mode_validation():
  from experiments.configs import test as test_config
  from gp_jax import errors
  c = test_config.get_config()
  system = system_lib.build(c)
  assert system.env(0.1, reward="auto").expected_utility is not None   # simulator: expected
  assert system.env(0.1).expected_utility is None                      # default: sampled
  with pytest.raises(errors.ConfigError, match="reward must be"):
    system.env(0.1, reward="mean")
  from gp_jax.llm import base
  class OtherPool(base.LLMPool):     # e.g. a real server answering the simulated queries
    async def chat(self, model, messages, params=base.SamplingParams()):
      raise AssertionError("not called")
  other_pool = dataclasses.replace(system, pool=OtherPool(system.catalog))
  assert other_pool.env(0.1, reward="auto").expected_utility is None
  with pytest.raises(errors.ConfigError, match="needs the simulator"):
    other_pool.env(0.1, reward="expected")
  no_world = dataclasses.replace(system, world=None)
  assert no_world.env(0.1, reward="auto").expected_utility is None
  with pytest.raises(errors.ConfigError, match="needs the simulator"):
    no_world.env(0.1, reward="expected")
