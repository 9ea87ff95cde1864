"""The PPO options on the choice of role (gp_jax/rl/ppo.py, gp_jax/rl/batch.py): the role-entropy
bonus (ppo.role_entropy_coef), advantages standardised per decision type (ppo.advantage_norm),
undiscounted returns (ppo.gamma = 1); and the Phase-1 warm start (train.phase1_episodes)."""
import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.configs import test as test_config
from gp_jax import errors
from gp_jax.graph import garnet
from gp_jax.rl import batch as batch_lib
from gp_jax.rl import ppo
from gp_jax.rl import rollout
from gp_jax.runs import ppo_config
from gp_jax.runs import system as system_lib
from gp_jax.runs import train as training
from gp_jax.workflow import mdp
from gp_jax.workflow import roles as roles_lib
from tests.util import tiny

LOSS_KW = dict(clip_eps=0.2, value_coef=0.5, entropy_coef=0.01)


def _loss_inputs(rng, B=4, A=6):
  mask = np.ones((B, A), bool)
  mask[1, 4:] = False
  mask[2, :3] = False
  logits = np.where(mask, rng.normal(size=(B, A)) * 2, garnet.NEG_INF).astype(np.float32)
  actions = np.array([0, 1, 3, 5], np.int32)
  def normal(shift=0.0):
    return jnp.asarray(rng.normal(size=B) + shift, jnp.float32)
  # logits, values, actions, old_logp, advantages, returns, mask, weights (the last row padding)
  return (jnp.asarray(logits), normal(), jnp.asarray(actions), normal(-2.0), normal(), normal(),
          jnp.asarray(mask), jnp.array([1.0, 1.0, 1.0, 0.0]))


def test_role_entropy_bonus_changes_the_loss_by_coef_times_the_role_entropy():
  rng = np.random.default_rng(0)
  args = _loss_inputs(rng)
  roles = np.array([0, 0, 0, 1, 1, 2], np.int32)
  base, m0 = ppo.ppo_loss(*args, **LOSS_KW)
  # by hand: p(role) = sum of p over the role's actions, entropy weighted over the real rows
  logits, weights = np.asarray(args[0], np.float64), np.asarray(args[-1])
  p = np.exp(logits - logits.max(1, keepdims=True))
  p /= p.sum(1, keepdims=True)
  pr = np.stack([p[:, roles == r].sum(1) for r in range(3)], 1)
  h = -np.sum(np.where(pr > 0, pr * np.log(np.where(pr > 0, pr, 1)), 0), 1)
  h_role = np.sum(h * weights) / weights.sum()
  coef = 0.37
  loss, m = ppo.ppo_loss(*args, **LOSS_KW, role_entropy_coef=coef, action_roles=roles)
  np.testing.assert_allclose(float(base - loss), coef * h_role, rtol=1e-5)
  np.testing.assert_allclose(float(m["role_entropy"]), h_role, rtol=1e-5)
  # 0: the plain loss, bit for bit, and the same metrics
  zero, mz = ppo.ppo_loss(*args, **LOSS_KW, role_entropy_coef=0.0)
  assert float(zero) == float(base) and set(mz) == set(m0)
  with pytest.raises(ValueError, match="action_roles"):
    ppo.ppo_loss(*args, **LOSS_KW, role_entropy_coef=0.1)


def test_settings_of_the_options():
  s = ppo_config.ppo_settings(test_config.get_config())
  assert (s.role_entropy_coef, s.advantage_norm, s.reads_space) == (0.0, "batch", False)
  assert dataclasses.replace(s, role_entropy_coef=0.1).reads_space
  assert dataclasses.replace(s, advantage_norm="per_type").reads_space
  with pytest.raises(errors.ConfigError, match="advantage_norm"):
    dataclasses.replace(s, advantage_norm="episode")
  with pytest.raises(errors.ConfigError, match="role_entropy_coef"):
    dataclasses.replace(s, role_entropy_coef=-1.0)
  with pytest.raises(ValueError, match="space"):
    ppo.make_update_fn(None, None, dataclasses.replace(s, advantage_norm="per_type"))


def _space(llms=("a", "b")):
  roles = roles_lib.load_roles().select(["planner", "executor", "summarizer", "thinker",
                                         "verifier"])
  return mdp.ActionSpace(roles, tuple(llms))


def test_decision_types_from_mask_and_step():
  space = _space()
  kinds = batch_lib.action_kinds(space)
  assert kinds[:4] == ("planner", "planner", "executor", "executor")
  km = space.kind_mask
  masks = np.stack([km(["planner", "executor", "thinker"]),     # step 0: root
                    km(["planner", "executor", "thinker"]),     # a sub-query that may split
                    km(["executor", "thinker"]),                # cannot split any more
                    km(["summarizer", "verifier"]),             # its children are answered
                    km(["summarizer"]),
                    km(["executor"])])                          # the final answer
  step = np.array([0, 1, 2, 4, 5, 6])
  types = np.asarray(batch_lib.decision_types(masks, step, kinds))
  names = [batch_lib.DECISION_TYPES[t] for t in types]
  assert names == ["root", "pending", "other", "summarize", "summarize", "other"]
  # the rollout's decision statistics type these decisions alike, where it has them
  if hasattr(rollout, "decision_type"):
    assert [rollout.decision_type(int(s), m, space) for s, m in zip(step, masks)] == names


def _batch(rng, space, episodes):
  """A packed Batch of episodes [(masks of its steps)], random rewards and values."""
  masks = [m for e in episodes for m in e]
  n = len(masks)
  tr = dict(obs=dict(mask=np.stack(masks)), actions=np.zeros(n, np.int32),
            old_logp=np.zeros(n, np.float32))
  rewards = [list(rng.normal(size=len(e))) for e in episodes]
  values = [list(rng.normal(size=len(e))) for e in episodes]
  size = n + 3
  return batch_lib.build(tr, rewards, values, size=size, num_episodes=len(episodes),
                         num_steps=max(map(len, episodes)))


def test_per_type_advantages_are_standardised_within_each_type():
  rng = np.random.default_rng(1)
  space = _space()
  km = space.kind_mask
  pend, exe, summ = km(["planner", "executor"]), km(["executor"]), km(["summarizer"])
  episodes = [[pend, pend, exe, exe, summ, exe], [pend, exe], [pend, pend, exe, summ, exe],
              [pend, exe, exe, exe, summ, exe]]
  batch = batch_lib.with_decision_types(_batch(rng, space, episodes), batch_lib.action_kinds(space))
  tr = batch.transitions
  adv, _ = batch_lib.advantages(batch, 0.99, 0.95)
  adv = np.asarray(adv) * 3 + 2          # a scale and shift for the standardisation to remove
  settings = dataclasses.replace(ppo_config.ppo_settings(test_config.get_config()),
                                 advantage_norm="per_type")
  out = np.asarray(ppo.standardized_advantages(jnp.asarray(adv), tr, settings))
  real = tr["weights"] > 0
  types = np.asarray(tr["decision_type"])
  for t, name in enumerate(batch_lib.DECISION_TYPES):
    sel = real & (types == t)
    assert sel.sum() >= 2, name
    np.testing.assert_allclose(out[sel].mean(), 0.0, atol=1e-5)
    np.testing.assert_allclose(out[sel].std(), 1.0, rtol=1e-4)
  # "batch" (the default): today's normalisation over all real transitions, unchanged
  batch_settings = ppo_config.ppo_settings(test_config.get_config())
  np.testing.assert_array_equal(
      np.asarray(ppo.standardized_advantages(jnp.asarray(adv), tr, batch_settings)),
      np.asarray(ppo.normalize_advantages(jnp.asarray(adv), jnp.asarray(tr["weights"]))))
  with pytest.raises(ValueError, match="decision type"):
    untyped = {k: v for k, v in tr.items() if k != "decision_type"}
    ppo.standardized_advantages(jnp.asarray(adv), untyped, settings)


def test_gamma_one_lambda_one_gives_undiscounted_reward_to_go_minus_value():
  rewards = [[0.0, -0.1, 0.7], [0.5], [-0.2, 1.0]]
  values = [[0.3, 0.1, 0.4], [0.2], [0.6, -0.5]]
  tr = dict(actions=np.zeros(6, np.int32), old_logp=np.zeros(6, np.float32))
  batch = batch_lib.build(tr, rewards, values, size=8, num_episodes=4, num_steps=3)
  adv, ret = (np.asarray(x) for x in batch_lib.advantages(batch, 1.0, 1.0))
  to_go = np.concatenate([np.cumsum(r[::-1])[::-1] for r in rewards])
  v = np.concatenate(values)
  np.testing.assert_allclose(ret[:6], to_go, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(adv[:6], to_go - v, rtol=1e-6, atol=1e-7)
  assert np.all(adv[6:] == 0) and np.all(ret[6:] == 0)


# ---- GraphPlanner's update with the options; the Phase-1 warm start ---------------------------

def _config():
  return tiny.tiny_config(episodes=16)


def test_update_with_every_option_on_compiles_once_and_reports_the_role_entropy(tmp_path,
                                                                              monkeypatch):
  cfg = _config()
  cfg.model.policy_head = "factored"
  cfg.ppo.role_entropy_coef = 0.05
  cfg.ppo.advantage_norm = "per_type"
  cfg.ppo.gamma = 1.0
  updates = []
  real = ppo.make_update_fn

  def spy(*args, **kwargs):
    update = real(*args, **kwargs)
    updates.append(update)
    return update
  monkeypatch.setattr(ppo, "make_update_fn", spy)
  summary = training.train(cfg, tmp_path, verbose=False)
  assert summary["episodes"] == 16
  records = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert len(records) == 2 and all(np.isfinite(r["role_entropy"]) for r in records)
  assert ppo.compile_count(updates[0]) == 1
  model = training.load_router(cfg, tmp_path, system_lib.build(cfg))[0]
  assert (model.policy_head, model.num_llms) == ("factored", 3)


def test_phase1_warm_start_runs_the_fixed_workflow_first(tmp_path, monkeypatch):
  """N = 5 with 8 episodes per iteration: iteration 0 (all of it) runs Phase 1 depth 1 width 2,
  the next ones Phase 2 (the switch is a function of the iteration index, so a resumed run
  switches where the uninterrupted one did)."""
  cfg = _config()
  cfg.train.episodes = 24
  cfg.train.phase1_episodes = 5
  cfg.train.phase1_width = 2
  real = rollout.run_episodes
  seen = []   # (env MDP's phase1, episodes) per iteration

  def recording(env, *args, **kwargs):
    async def record():
      eps = await real(env, *args, **kwargs)
      seen.append((env.cfg.phase1, eps))
      return eps
    return record()
  monkeypatch.setattr(rollout, "run_episodes", recording)
  training.train(cfg, tmp_path, verbose=False)
  assert [p for p, _ in seen] == [True, False, False]
  space = system_lib.build(cfg).space
  for ep in seen[0][1]:   # plan into 2, answer both, summarise, answer: 5 calls, every one
    kinds = [space.decode(a)[0].kind for a in ep.actions]
    assert kinds == ["planner", "executor", "executor", "summarizer", "executor"], kinds
  # validation: a warm start of a Phase 1 run, or one the step cap cannot hold
  bad = _config()
  bad.train.phase1_episodes = 8
  bad.mdp.phase1_depth, bad.mdp.phase1_width = 1, 3
  with pytest.raises(errors.ConfigError, match="warms up a Phase 2 run"):
    training.validate(bad)
  bad = _config()
  bad.train.phase1_episodes = 8
  bad.train.phase1_depth, bad.train.phase1_width = 3, 3
  with pytest.raises(errors.ConfigError, match="step_cap"):
    training.validate(bad)
  assert training.phase1_iterations(cfg) == 1
