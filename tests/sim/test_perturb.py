"""Pool perturbations for training (gp_jax/sim/perturb.py): seeded, one LLM always kept, the
training split only, and the exact optimum follows the perturbed pool (brute force)."""
import numpy as np
import pytest

from gp_jax import errors
from gp_jax.runs import system as system_lib
from gp_jax.sim import events as sim_events
from gp_jax.sim import optimal
from gp_jax.sim import perturb
from gp_jax.sim import simulator as sim
from gp_jax.workflow import env as env_lib
from gp_jax.workflow import mdp
from test_optimal import brute_force

LLMS = ["qwen2.5-7b-instruct", "llama3-chatqa-1.5-70b"]
DOMAINS = perturb.simulated_domains()


def test_phases_are_seeded_and_follow_the_distribution():
  s = perturb.PerturbSettings(seed=3)
  a = [perturb.phase_events(s, k, LLMS, DOMAINS) for k in range(200)]
  assert a == [perturb.phase_events(s, k, LLMS, DOMAINS) for k in range(200)]   # same seed
  other = [perturb.phase_events(perturb.PerturbSettings(seed=4), k, LLMS, DOMAINS)
           for k in range(200)]
  assert a != other
  assert len({tuple(e) for e in a}) > 50      # phases differ
  n = 200 * len(LLMS)
  for kind, p in (("quality", s.skill_prob), ("price", s.price_prob), ("fail", s.fail_prob),
                  ("join", s.absent_prob)):
    freq = sum(e.kind == kind for ev in a for e in ev) / n
    assert abs(freq - p) < 4 * np.sqrt(p * (1 - p) / n) + 0.01, (kind, freq, p)
  for ev in a:
    for e in ev:
      if e.kind == "quality":
        assert s.delta_low <= e.delta <= s.delta_high and e.domains
      if e.kind == "price":
        assert e.scale in perturb.PRICE_SCALES


def test_one_llm_stays_present_and_working():
  s = perturb.PerturbSettings(fail_prob=1.0, absent_prob=1.0)
  for k in range(10):
    ev = perturb.phase_events(s, k, LLMS, DOMAINS)
    assert not any(e.llm == LLMS[0] and e.kind in ("fail", "join") for e in ev)
    assert any(e.llm == LLMS[1] and e.kind in ("fail", "join") for e in ev)


def test_bad_settings_are_config_errors():
  for bad in (dict(every=0), dict(fail_prob=1.5), dict(delta_low=1.0, delta_high=0.0)):
    with pytest.raises(errors.ConfigError):
      perturb.PerturbedPool(perturb.PerturbSettings(**bad), LLMS, DOMAINS)


def test_the_training_split_follows_the_phase_other_splits_the_base_pool():
  s = perturb.PerturbSettings(every=2, fail_prob=1.0, skill_prob=0, price_prob=0, absent_prob=0)
  base = sim_events.PoolEvents([sim_events.PoolEvent("price", LLMS[0], 0, scale=3.0)], ("test",))
  p = perturb.PerturbedPool(s, LLMS, DOMAINS, base)
  assert p.failed(LLMS[1], "train-0-5") and not p.failed(LLMS[0], "train-0-5")
  assert not p.failed(LLMS[1], "test-0-5") and p.price_scale(LLMS[0], "test-0-5") == 3.0
  assert p.price_scale(LLMS[0], "train-0-5") == 1.0
  p.set_iteration(3)
  assert p.phase == 1
  assert p.has_joins() and p.present_mask(LLMS, "test-0-1").all()


CFG = mdp.MDPConfig(p_max=1, max_width=2, max_depth=1, step_cap=6)


def test_the_optimum_follows_the_perturbed_pool(tiny_world):
  """In every phase the DP optimum of each training query equals the brute-force optimum of the
  pool as perturbed in that phase; the perturbations change it."""
  alpha = 0.5
  s = perturb.PerturbSettings(every=1, skill_prob=0.7, price_prob=0.5, fail_prob=0.3,
                              absent_prob=0.3, seed=1)
  pool_events = perturb.PerturbedPool(s, LLMS, DOMAINS)
  world = sim.SimWorld(tiny_world["world"].profiles, events=pool_events)
  roles_set = tiny_world["roles"]
  space = mdp.ActionSpace(roles_set, tuple(LLMS))
  pool = sim.SimulatorPool(tiny_world["catalog"], roles_set, world)
  llm_mask = lambda st: pool_events.present_mask(space.llms, world.lookup(st.nodes[0].text).key)
  env = env_lib.WorkflowEnv(space, CFG, pool, alpha=alpha, describe=system_lib.sim_describe,
                            scorer=sim.sim_score, llm_mask=llm_mask)
  queries = world.sample_queries(3, seed=7, split="train")
  values = {}
  for phase in range(4):
    pool_events.set_iteration(phase)
    solver = optimal.OptimalSolver(world, space, CFG, alpha, system_lib.sim_describe)
    for i, q in enumerate(queries):
      v = solver.value(q)
      assert v == pytest.approx(brute_force(env, world, q, alpha), abs=1e-9)
      values[phase, i] = v
  assert len({round(v, 9) for v in values.values()}) > len(queries)   # the optimum moved
