"""rl/decisions.DecisionBatcher: concurrent decisions scored together in padded batches, each
decision with its own result, errors to every waiter (the routed counselor's decisions against
unbatched ones: tests/counselor/routing/test_router.py)."""
import asyncio
import concurrent.futures
import threading

import jax
import numpy as np
import pytest

from gp_jax.rl import decisions


class FakeRunner:
  """act_each double: action = the decision's first id, logp = -id, value = the obs's x."""

  def __init__(self, fail_first: bool = False):
    self.sizes, self.fail_first, self.inputs, self.threads = [], fail_first, [], []

  def decision_inputs(self):
    return ("snapshot", len(self.sizes))

  def act_each(self, obs, key, ids, greedy, inputs=None):
    self.sizes.append(len(ids))
    self.inputs.append(inputs)
    self.threads.append(threading.get_ident())
    if self.fail_first and len(self.sizes) == 1:
      raise RuntimeError("policy failed")
    return ids[:, 0].astype(np.int64), -ids[:, 0].astype(np.float32), obs["x"][:, 0]


def _obs(i):
  return {"x": np.full(1, float(i), np.float32)}


def test_concurrent_decisions_share_padded_batches():
  runner = FakeRunner()
  batcher = decisions.DecisionBatcher(runner, (4, 2), greedy=True)

  async def main():
    return await asyncio.gather(*(batcher.decide(_obs(i), ids=(i,)) for i in range(5)))
  got = asyncio.run(main())
  assert [d.action for d in got] == list(range(5))
  assert [d.logp for d in got] == [-float(i) for i in range(5)]
  assert [d.value for d in got] == [float(i) for i in range(5)]
  assert runner.sizes == [4, 2]   # 4 at once, the fifth alone padded to the smallest bucket
  assert (batcher.calls, batcher.decisions) == (2, 5)


def test_in_a_worker_thread_on_a_copy_of_the_inputs():
  runner = FakeRunner()
  prepared = []

  def prepare(obs, extras):   # on the loop, with each decision's extra
    prepared.append((threading.get_ident(), list(extras)))
    return obs
  with concurrent.futures.ThreadPoolExecutor(1) as pool:
    batcher = decisions.DecisionBatcher(runner, (4,), executor=pool, prepare=prepare)

    async def main():
      return threading.get_ident(), await asyncio.gather(
          *(batcher.decide(_obs(i), ids=(i,), extra=f"q{i}") for i in range(3)))
    loop_thread, got = asyncio.run(main())
  assert [d.action for d in got] == [0, 1, 2]
  assert prepared == [(loop_thread, ["q0", "q1", "q2"])]
  assert runner.inputs == [("snapshot", 0)] and runner.threads[0] != loop_thread


def test_an_error_reaches_every_waiter_and_the_batcher_goes_on():
  runner = FakeRunner(fail_first=True)
  batcher = decisions.DecisionBatcher(runner, (8,), greedy=True)

  async def main():
    first = await asyncio.gather(*(batcher.decide(_obs(i), ids=(i,)) for i in range(3)),
                                 return_exceptions=True)
    return first, await batcher.decide(_obs(7), ids=(7,))
  first, later = asyncio.run(main())
  assert all(isinstance(e, RuntimeError) for e in first)
  assert later.action == 7


def test_bad_arguments():
  with pytest.raises(ValueError, match="need a key"):
    decisions.DecisionBatcher(FakeRunner(), (4,), greedy=False)
  with pytest.raises(ValueError, match=">= 1"):
    decisions.DecisionBatcher(FakeRunner(), (0, 4))
  batcher = decisions.DecisionBatcher(FakeRunner(), (4,), key=jax.random.PRNGKey(0),
                                      greedy=False, num_ids=2)

  async def main():
    return await batcher.decide(_obs(0), ids=(1,))
  with pytest.raises(ValueError, match="takes 2 ids"):
    asyncio.run(main())


def test_greedy_and_sampled_decisions_share_one_call():
  """Each decision says greedy or sampled; both kinds go in one padded call, the choice per row
  (the padding repeats the last row's); a sampled decision needs the batcher's key."""
  runner = FakeRunner()
  seen = []
  act_each = runner.act_each

  def spy(obs, key, ids, greedy, inputs=None):
    seen.append(np.asarray(greedy).tolist())
    return act_each(obs, key, ids, greedy, inputs)
  runner.act_each = spy
  batcher = decisions.DecisionBatcher(runner, (4,), key=jax.random.PRNGKey(1), greedy=True)

  async def main():
    return await asyncio.gather(*(batcher.decide(_obs(i), ids=(i,), greedy=i != 1)
                                  for i in range(3)))
  got = asyncio.run(main())
  assert [d.action for d in got] == [0, 1, 2]
  assert seen == [[True, False, True, True]] and batcher.calls == 1
  keyless = decisions.DecisionBatcher(FakeRunner(), (4,), greedy=True)

  async def sampled():
    return await keyless.decide(_obs(0), greedy=False)
  with pytest.raises(ValueError, match="need a key"):
    asyncio.run(sampled())


def test_a_real_policy_mixes_greedy_and_sampled_rows_as_separate_calls_would():
  """On GARNet's batched policy: a call with per-row greedy flags gives each row what an
  all-greedy or all-sampled call of the same rows gives it."""
  from experiments.configs import test as test_config
  from gp_jax.graph import features as features_lib
  from gp_jax.rl import loop as loop_lib
  from gp_jax.rl import rollout
  from gp_jax.runs import ppo_config
  from gp_jax.runs import system as system_lib
  from gp_jax.runs import train as training
  cfg = test_config.get_config()
  sysm = system_lib.build(cfg)
  feat = sysm.featurizer
  model = training.make_model(cfg, feat.spec)
  params = loop_lib.init_state(model, feat, ppo_config.make_optimizer(cfg), 0).params
  runner = rollout.PolicyRunner(model, feat.hub_features, 8, featurizer=feat)
  runner.set_params(params, None)
  env = sysm.env(cfg.alpha, reward="auto")
  obs = []
  for q in sysm.train_queries[:8]:
    t_emb, q_emb = feat.encoder.encode([system_lib.sim_describe(q)[0], q.query])
    state = env.reset(q)
    obs.append(feat.observe(state, t_emb, q_emb, np.zeros((0, feat.spec.row_dim), np.float32),
                            env.mask(state)))
  batch = features_lib.stack(obs, pad_to=8)
  key, ids = jax.random.PRNGKey(3), (np.arange(8, dtype=np.uint32)[:, None] + 1) * 7919
  greedy = runner.act_each(batch, key, ids, np.ones(8, bool))
  sampled = runner.act_each(batch, key, ids, np.zeros(8, bool))
  assert (greedy[0] != sampled[0]).any()        # the two kinds differ on these rows
  mask = np.array([True, False] * 4)
  mixed = runner.act_each(batch, key, ids, mask)
  for got, g, s in zip(mixed, greedy, sampled):
    np.testing.assert_array_equal(got, np.where(mask, g, s))
