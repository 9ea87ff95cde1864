"""Online memory at test time: evaluated episodes join the history as they finish, in a fixed
order, within the history's capacity; the weights stay frozen."""
import asyncio

import jax
import numpy as np
import pytest

from experiments.configs import test as test_config
from gp_jax import errors
from gp_jax.graph import history as history_lib
from gp_jax.rl import rollout
from gp_jax.rl import loop as loop_lib
from gp_jax.runs import ppo_config
from gp_jax.runs import evaluate as evaluation
from gp_jax.runs import system as system_lib
from gp_jax.runs import train as training

N = 6


@pytest.fixture(scope="module")
def parts():
  cfg = test_config.get_config()
  sysm = system_lib.build(cfg)
  routers = {}

  def router(mode):
    """(model, params, runner) of an untrained router of history mode `mode`, built once."""
    if mode not in routers:
      c = test_config.get_config()
      c.model.history = mode
      model = training.make_model(c, sysm.featurizer.spec)
      params = loop_lib.init_state(model, sysm.featurizer, ppo_config.make_optimizer(c), 0).params
      runner = rollout.PolicyRunner(model, sysm.featurizer.hub_features, 2,
                                    featurizer=sysm.featurizer)
      routers[mode] = (model, params, runner)
    return routers[mode]
  return cfg, sysm, router


def _run(parts, *, online, capacity=10_000, mode="transductive", queries=None):
  """Episodes of the test queries (default the first N), two in flight, from an empty memory of
  `capacity` rows."""
  cfg, sysm, router = parts
  _, params, runner = router(mode)
  feat = sysm.featurizer
  history = history_lib.HistoryMemory(feat.spec.row_dim, sysm.space.size, capacity=capacity)
  runner.set_params(params, history)
  eps = asyncio.run(rollout.run_episodes(
      sysm.env(cfg.alpha), feat, runner, queries or sysm.test_queries[:N],
      key=jax.random.PRNGKey(0), greedy=True, history=history, grow_history=online,
      seed_salt=("eval", 0), online=online))
  return eps, history, runner


def _schedule(lengths, slots=2):
  """(start, end) lock-steps of each episode (one call per lock-step; a query starts at the
  lock-step its slot frees, slots refilled in slot order) and whether two episodes that finish
  together sit in slots against their query order."""
  n = len(lengths)
  slot, start, end, nxt, crossed = list(range(slots)), [0] * n, list(lengths), slots, False
  while any(q is not None for q in slot):
    t = min(end[q] for q in slot if q is not None)
    fin = [(s, q) for s, q in enumerate(slot) if q is not None and end[q] == t]
    crossed |= [q for _, q in fin] != sorted(q for _, q in fin)
    for s, _ in fin:
      slot[s] = nxt if nxt < n else None
      if nxt < n:
        start[nxt], end[nxt] = t, t + lengths[nxt]
      nxt += 1
  return start, end, crossed


def test_finished_episodes_are_visible_to_later_decisions_in_a_fixed_order(parts):
  """Episodes finishing at one lock-step join after it, in query order (also when their slots
  hold them the other way round); every later decision reads them (its log-probabilities differ
  from the frozen-memory run's), no earlier one does."""
  queries = parts[1].test_queries
  for r in range(len(queries)):   # a stream where finishing together crosses the slot order
    stream = queries[r:] + queries[:r]
    eps, history, _ = _run(parts, online=True, queries=stream)
    finish = [len(e.state.calls) for e in eps]
    start, end, crossed = _schedule(finish)
    if crossed:
      break
  assert crossed
  order = sorted(range(len(eps)), key=lambda i: (end[i], i))
  np.testing.assert_array_equal(
      history.hubs, np.concatenate([[c.action for c in eps[i].state.calls] for i in order]))
  frozen, empty, _ = _run(parts, online=False, queries=stream)
  assert len(empty) == 0
  for i in range(len(eps)):
    seen = sum(finish[j] for j in range(len(eps)) if end[j] <= start[i])
    assert eps[i].snapshots[0] == seen
    assert (eps[i].logp[0] != frozen[i].logp[0]) == (seen > 0)
  again, history2, _ = _run(parts, online=True, queries=stream)
  np.testing.assert_array_equal(history.rows, history2.rows)          # deterministic
  assert [e.logp for e in eps] == [e.logp for e in again]


@pytest.mark.parametrize("mode", ["transductive", "retrieval", "summary"])
def test_capacity_bounds_the_online_memory(parts, mode):
  cap = 7
  eps, history, runner = _run(parts, online=True, capacity=cap, mode=mode)
  assert len(history) == cap
  assert all(s <= cap for e in eps for s in e.snapshots)
  if mode == "transductive":   # the decision sums follow the evictions: a fresh computation's
    hub_sum, hub_count = runner.hub_sum.copy(), runner.hub_count.copy()
    runner.set_params(runner.params, history)
    np.testing.assert_array_equal(hub_count, runner.hub_count)
    np.testing.assert_allclose(hub_sum, runner.hub_sum, rtol=1e-4, atol=1e-5)
  elif mode == "summary":
    assert runner.hub_count.sum() == cap and sum(
        int(t.split(": ")[1].split(" ")[0]) for t in runner.summary_texts
        if "no past calls" not in t) == cap


def test_evaluation_mode(parts):
  cfg, sysm, router = parts
  model, params, _ = router("transductive")
  feat = sysm.featurizer
  trained = history_lib.HistoryMemory(feat.spec.row_dim, sysm.space.size, capacity=400)
  rows = evaluation.evaluate(sysm, cfg.alpha, router=(model, params, trained), baselines=False,
                             optimum=False, parallel=2, online_history=True)
  assert {r.policy for r in rows} == {"GraphPlanner (online memory)"}
  assert len(trained) == 0     # the caller's memory is not changed
  assert evaluation.verdict(rows)["router_reward"] == evaluation.overall(rows)[
      "GraphPlanner (online memory)"].reward
  with pytest.raises(errors.ConfigError, match="online_history needs a router that reads"):
    evaluation.evaluate(sysm, cfg.alpha, router=(model, params, None), baselines=False,
                        optimum=False, online_history=True)
  with pytest.raises(ValueError, match="online memory needs"):
    asyncio.run(rollout.run_episodes(sysm.env(cfg.alpha), feat, None, [], key=None, greedy=True,
                                     history=None, grow_history=False, seed_salt=0, online=True))


def test_recency_window(parts):
  """eval.online_recent_rows: the online copy starts with the newest rows and keeps that many;
  the run equals an online run from a memory holding just those rows with that capacity."""
  cfg, sysm, router = parts
  model, params, _ = router("transductive")
  feat = sysm.featurizer
  eps, grown, _ = _run(parts, online=True)           # a memory of real rows, in arrival order
  assert len(grown) > 5
  window = evaluation.recent_window(grown, 5)
  assert window.capacity == 5 and len(grown) > 5
  np.testing.assert_array_equal(window.rows, grown.rows[-5:])
  np.testing.assert_array_equal(window.hubs, grown.hubs[-5:])
  env = sysm.env(cfg.alpha)
  queries = sysm.test_queries[N:N + 4]
  before = grown.rows.copy()
  got = evaluation.run_router(sysm, env, model, params, grown, queries, parallel=2, seed=0,
                              online=True, recent_rows=5)
  np.testing.assert_array_equal(grown.rows, before)   # the caller's memory is not changed
  want = evaluation.run_router(sysm, env, model, params, evaluation.recent_window(grown, 5),
                               queries, parallel=2, seed=0, online=True)
  assert [[c.action for c in s.calls] for s in got] == [[c.action for c in s.calls] for s in want]
  with pytest.raises(errors.ConfigError, match="online_recent_rows"):
    evaluation.run_router(sysm, env, model, params, grown, queries, parallel=2, seed=0,
                          recent_rows=5)
  bad = test_config.get_config()
  bad.eval.online_recent_rows = 3
  with pytest.raises(errors.ConfigError, match="eval.online_history=True"):
    training.validate(bad)
