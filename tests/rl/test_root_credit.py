"""Root credit (gp_jax/rl/root_credit.py): the root floor's behaviour mixture and its recorded
log-probabilities; the paired greedy continuations of root_rollout and the advantages they
replace, exactly at the root decisions of those queries; both in a whole training run."""
import asyncio
import json

import jax
import numpy as np
import pytest

from gp_jax import errors
from gp_jax.rl import batch as batch_lib
from gp_jax.rl import root_credit
from gp_jax.rl import rollout
from gp_jax.runs import ppo_config
from gp_jax.runs import train as training
from tests.util import tiny

FLOOR = 0.3


@pytest.fixture(scope="module")
def setup():
  cfg = tiny.tiny_config(episodes=24)
  p = tiny.fresh_policy(cfg)
  return dict(cfg=cfg, sysm=p.sysm, feat=p.feat, runner=p.runner, env=p.env, space=p.space,
              queries=p.sysm.train_queries[:12])


def _run(s, greedy=False, **kw):
  return asyncio.run(rollout.run_episodes(
      s["env"], s["feat"], s["runner"], s["queries"], key=jax.random.PRNGKey(5), greedy=greedy,
      history=None, grow_history=False, seed_salt=("rc", 0), **kw))


def _kind(space, a):
  return space.decode(int(a))[0].kind


def test_behaviour_mixture_sums_to_one_over_the_valid_actions():
  probs = np.array([0.5, 0.0, 0.3, 0.2, 0.0])
  mask = np.array([True, False, True, True, False])
  b = root_credit.behaviour_probs(probs, mask, 0.2)
  np.testing.assert_allclose(b, [0.8 * 0.5 + 0.2 / 3, 0, 0.8 * 0.3 + 0.2 / 3,
                                 0.8 * 0.2 + 0.2 / 3, 0])
  assert b.sum() == pytest.approx(1.0)
  # the floor's draws: about e of the actions replaced by uniform ones among the valid
  picks = [root_credit.floor_root(np.eye(5)[0], mask, 0, 0.2, seed)[0] for seed in range(4000)]
  assert set(picks) <= {0, 2, 3}
  assert np.mean(np.array(picks) != 0) == pytest.approx(0.2 * 2 / 3, abs=0.025)
  with pytest.raises(ValueError, match="root_floor"):
    root_credit.floor_root(probs, mask, 0, 1.0, 0)


def test_root_floor_records_the_mixture_at_the_root_and_the_policy_below(setup):
  s = setup
  floored, plain = _run(s, root_floor=FLOOR), _run(s)
  replaced = 0
  for ep, ep0 in zip(floored, plain):
    logits, _ = s["runner"].scores(rollout.features_lib.stack(ep.obs))
    logp = np.asarray(jax.nn.log_softmax(logits))
    mask = ep.obs[0]["mask"]
    probs = np.asarray(jax.nn.softmax(logits[0]))
    want = np.log(root_credit.behaviour_probs(probs, mask, FLOOR)[ep.actions[0]])
    assert ep.logp[0] == pytest.approx(want, abs=1e-5)
    assert ep.logp[0] != pytest.approx(logp[0, ep.actions[0]], abs=1e-4)
    # below the root: the policy's own log-probabilities
    np.testing.assert_allclose(ep.logp[1:], logp[np.arange(1, len(ep.actions)), ep.actions[1:]],
                               atol=2e-4)
    replaced += ep.actions[0] != ep0.actions[0]
    if ep.actions[0] == ep0.actions[0]:   # same root action: the rest of the episode is the same
      assert ep.actions == ep0.actions and ep.logp[1:] == pytest.approx(ep0.logp[1:])
  assert replaced >= 1   # 12 episodes at e = 0.3: some root actions come from the uniform part
  # The PPO batch reads these log-probabilities as old_logp, so the root's ratio is against b.
  n = sum(len(e.actions) for e in floored)
  batch, _ = batch_lib.build_batch(floored, None, batch_size=-(-n // 8) * 8,
                                   num_episodes=len(floored),
                                   max_calls=ppo_config.max_calls(s["sysm"]),
                                   num_hubs=s["space"].size)
  np.testing.assert_allclose(batch.transitions["old_logp"][:n],
                             [l for e in floored for l in e.logp], rtol=1e-6)


def test_greedy_rollouts_ignore_the_floor(setup):
  for a, b in zip(_run(setup, greedy=True, root_floor=0.5), _run(setup, greedy=True)):
    assert a.actions == b.actions and a.logp == pytest.approx(b.logp)


def test_paired_continuations_differ_only_in_the_root_action(setup):
  s = setup
  seen = []

  async def recording(*args, **kwargs):
    eps = await rollout.run_episodes(*args, **kwargs)
    seen.append(eps)
    return eps
  r_direct, r_split = asyncio.run(root_credit.paired_returns(
      recording, s["env"], s["feat"], s["runner"], s["queries"][:6], key=jax.random.PRNGKey(0),
      history=None, seed_salt=("pair", 1)))
  direct, split = seen
  for d, p, rd, rs in zip(direct, split, r_direct, r_split):
    assert d.query.qid == p.query.qid and d.seed == p.seed
    assert _kind(s["space"], d.actions[0]) == "executor"
    assert _kind(s["space"], p.actions[0]) == "planner"
    assert rd == pytest.approx(d.episode_return) and rs == pytest.approx(p.episode_return)
  # greedy continuations: the same pair again gives the same returns
  again = asyncio.run(root_credit.paired_returns(
      rollout.run_episodes, s["env"], s["feat"], s["runner"], s["queries"][:6], key=jax.random.PRNGKey(9),
      history=None, seed_salt=("pair", 1)))
  np.testing.assert_allclose(again[0], r_direct)
  np.testing.assert_allclose(again[1], r_split)


def test_overrides_take_the_sign_of_the_sampled_root_action(setup):
  space = setup["space"]
  root = setup["env"].mask(setup["env"].reset(setup["queries"][0]))
  planner = int(np.flatnonzero(root & space.kind_mask(["planner"]))[0])
  executor = int(np.flatnonzero(root & space.kind_mask(["executor"]))[0])
  only_exec = root & space.kind_mask(["executor"])
  out = root_credit.root_overrides([planner, executor, executor], [root, root, only_exec],
                                   np.array([0.1, 0.1, 0.1]), np.array([0.4, 0.4, 0.4]), space)
  assert out == {0: pytest.approx(0.3), 1: pytest.approx(-0.3)}   # episode 2: nothing to compare


def test_overrides_replace_exactly_the_root_advantages(setup):
  s = setup
  eps = _run(s)
  n = sum(len(e.actions) for e in eps)
  kw = dict(batch_size=-(-n // 8) * 8, num_episodes=len(eps),
            max_calls=ppo_config.max_calls(s["sysm"]), num_hubs=s["space"].size)
  plain, _ = batch_lib.build_batch(eps, None, **kw)
  over, _ = batch_lib.build_batch(eps, None, root_advantages={0: 0.7, 3: -0.25}, **kw)
  a0, r0 = (np.asarray(x) for x in batch_lib.advantages(plain, 1.0, 0.95))
  a1, r1 = (np.asarray(x) for x in batch_lib.advantages(over, 1.0, 0.95))
  starts = np.cumsum([0] + [len(e.actions) for e in eps])[:-1]
  changed = np.flatnonzero(~np.isclose(a0, a1))
  assert changed.tolist() == sorted([starts[0], starts[3]])
  assert a1[starts[0]] == pytest.approx(0.7) and a1[starts[3]] == pytest.approx(-0.25)
  np.testing.assert_allclose(r1, r0)   # the value targets stay GAE's


def test_a_training_run_with_both_options(tmp_path):
  cfg = tiny.tiny_config(episodes=24)
  cfg.ppo.gamma = 1.0
  cfg.train.root_floor = 0.2
  cfg.train.root_rollout = 3
  training.train(cfg, tmp_path / "run", verbose=False)
  recs = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
  assert len(recs) == 3
  for r in recs:
    assert 0 <= r["root_rollout/replaced"] <= 3
    assert np.isfinite(r["root_rollout/split_minus_direct"])
  assert sum(r["root_rollout/replaced"] for r in recs) >= 1
  # off by default: the records carry no root_rollout fields
  cfg = tiny.tiny_config(episodes=8)
  training.train(cfg, tmp_path / "off", verbose=False)
  rec = json.loads((tmp_path / "off" / "metrics.jsonl").read_text().splitlines()[0])
  assert not any(k.startswith("root_rollout") for k in rec)


@pytest.mark.parametrize("field,value", [("root_floor", 1.0), ("root_floor", -0.1),
                                         ("root_rollout", -1), ("root_rollout", 9)])
def test_out_of_range_settings_are_config_errors(field, value):
  cfg = tiny.tiny_config(episodes=24)
  setattr(cfg.train, field, value)
  with pytest.raises(errors.ConfigError, match=f"train.{field}"):
    training.validate(cfg)
