"""The factored policy head (model.policy_head = "factored", gp_jax/graph/garnet.py): a role, then
an LLM within it; joint log-probabilities as the masked logits; greedy = best role, then its best
LLM; the flat head (the default) unchanged, old configs load as flat."""
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.configs import test as test_config
from gp_jax.graph import garnet
from gp_jax.rl import ppo
from gp_jax.rl import rollout
from gp_jax.runs import config_defaults
from gp_jax.runs import system as system_lib
from gp_jax.runs import train as training
from gp_jax.runs import workdir as workdir_config

K = 3   # LLMs per role; roles: planner, executor, summarizer (A = 9)


def _softmax(x):
  e = np.exp(x - x.max())
  return e / e.sum()


def _joint(llm_scores, role_scores, mask):
  return np.asarray(garnet.factored_log_probs(jnp.asarray(llm_scores), jnp.asarray(role_scores),
                                              jnp.asarray(mask), K))


def test_probabilities_sum_to_one_over_valid_actions_and_are_zero_elsewhere():
  rng = np.random.default_rng(0)
  for mask in ([1, 1, 1, 1, 1, 1, 0, 0, 0],     # the root: planners and executors
               [0, 1, 1, 1, 0, 1, 0, 0, 0],     # some LLMs of two roles
               [0, 0, 0, 0, 0, 0, 1, 1, 1],     # one role only
               [0, 0, 0, 0, 0, 0, 0, 0, 0]):    # nothing valid (a finished episode's padding)
    mask = np.asarray(mask, bool)
    logits = _joint(rng.normal(size=9) * 3, rng.normal(size=3) * 3, mask)
    if not mask.any():   # as the flat head: every logit NEG_INF
      assert np.all(logits == garnet.NEG_INF)
      continue
    p = np.exp(np.asarray(jax.nn.log_softmax(logits)))
    assert np.all(p[~mask] == 0)
    np.testing.assert_allclose(p[mask].sum(), 1.0, rtol=1e-6)
    np.testing.assert_allclose(np.exp(logits[mask]).sum(), 1.0, rtol=1e-6)   # log-probs already
    # A role with no valid action has probability 0; each valid role gets its softmax share.
    roles = mask.reshape(3, K).any(1)
    role_p = p.reshape(3, K).sum(1)
    assert np.all(role_p[~roles] == 0)


def test_joint_is_role_softmax_times_within_role_softmax():
  llm = np.array([1.0, 2.0, 0.5, -1.0, 0.0, 3.0, 9.0, 9.0, 9.0])
  role = np.array([0.3, -0.2, 5.0])
  mask = np.array([1, 1, 1, 1, 0, 1, 0, 0, 0], bool)   # summarizer role masked: its 5.0 is ignored
  p = np.exp(_joint(llm, role, mask))
  pr = _softmax(role[:2])
  expect = np.zeros(9)
  expect[:3] = pr[0] * _softmax(llm[:3])
  expect[[3, 5]] = pr[1] * _softmax(llm[[3, 5]])
  np.testing.assert_allclose(p, expect, rtol=1e-5, atol=1e-12)


def test_ppo_ratio_is_the_product_of_the_two_heads_ratios():
  mask = np.array([1, 1, 1, 1, 1, 1, 0, 0, 0], bool)
  old_llm, old_role = np.array([0.1, 0.4, -0.3, 1.0, 0.2, -0.5, 0, 0, 0]), np.array([0.2, -0.1, 0])
  new_llm, new_role = np.array([0.5, 0.1, -0.3, 0.7, 0.9, -0.5, 0, 0, 0]), np.array([0.6, -0.4, 0])
  old, new = _joint(old_llm, old_role, mask), _joint(new_llm, new_role, mask)
  for action in (1, 4):   # a planner, an executor
    r, l = divmod(action, K)
    role_ratio = _softmax(new_role[:2])[r] / _softmax(old_role[:2])[r]
    llm_ratio = (_softmax(new_llm[r * K:(r + 1) * K])[l] / _softmax(old_llm[r * K:(r + 1) * K])[l])
    # ppo_loss's ratio: exp(log_softmax(logits)[a] - old_logp), old_logp as the rollout records it
    old_logp = np.asarray(jax.nn.log_softmax(old))[action]
    _, m = ppo.ppo_loss(jnp.asarray(new[None]), jnp.zeros(1), jnp.array([action]),
                        jnp.array([old_logp]), jnp.ones(1), jnp.zeros(1), jnp.asarray(mask[None]),
                        jnp.ones(1), clip_eps=0.2, value_coef=0.5, entropy_coef=0.0)
    np.testing.assert_allclose(float(m["ratio_mean"]), role_ratio * llm_ratio, rtol=1e-5)


def test_entropy_of_the_joint_is_role_entropy_plus_expected_llm_entropy():
  mask = np.array([1, 1, 1, 1, 0, 1, 0, 0, 0], bool)
  llm, role = np.array([1.0, 2.0, 0.5, -1.0, 0.0, 3.0, 0, 0, 0]), np.array([0.3, -0.2, 0.0])
  logits = _joint(llm, role, mask)

  def h(p):
    return -np.sum(p * np.log(p))
  pr = _softmax(role[:2])
  expect = h(pr) + pr[0] * h(_softmax(llm[:3])) + pr[1] * h(_softmax(llm[[3, 5]]))
  np.testing.assert_allclose(float(ppo.entropy_of(jnp.asarray(logits), jnp.asarray(mask))),
                             expect, rtol=1e-5)
  np.testing.assert_allclose(float(ppo.role_entropy(jnp.asarray(logits),
                                                    garnet.action_roles(9, K))), h(pr), rtol=1e-5)


def test_greedy_picks_the_role_first():
  """Flat argmax: the executor with the single largest probability (0.3); factored: the planner
  role, whose three actions hold 0.6 in all, then its best LLM."""
  p = np.array([0.25, 0.2, 0.15, 0.3, 0.05, 0.05, 0.0, 0.0, 0.0])
  mask = p > 0
  logits = jnp.asarray(np.where(mask, np.log(np.where(mask, p, 1.0)), garnet.NEG_INF)[None])
  flat = garnet.GARNet()
  factored = garnet.GARNet(policy_head="factored", num_llms=K)
  assert int(garnet.greedy_actions(flat, logits)[0]) == 3
  assert int(garnet.greedy_actions(factored, logits)[0]) == 0
  assert int(garnet.greedy_actions(None, logits)[0]) == 3      # models without a head: flat
  # The rollout's choice (every greedy caller: evaluation, serving, decision batches) follows.
  sampled = jnp.array([5])
  for model, want in ((flat, 3), (factored, 0)):
    a, lp = rollout._chosen(logits, sampled, jnp.asarray(True), model)
    assert int(a[0]) == want
    np.testing.assert_allclose(float(lp[0]), np.log(p[want]), rtol=1e-5)
    a, _ = rollout._chosen(logits, sampled, jnp.asarray(False), model)
    assert int(a[0]) == 5
  # A masked role never wins, however its padding logits compare.
  only_exec = jnp.asarray(np.where(np.arange(9) // K == 1, 0.0, garnet.NEG_INF)[None])
  assert int(garnet.greedy_actions(factored, only_exec)[0]) // K == 1


def _obs(rng, mask, D=6, F=5, M=4):
  return dict(task=rng.normal(size=D).astype(np.float32),
              query=rng.normal(size=D).astype(np.float32),
              state=rng.normal(size=D + 8).astype(np.float32),
              rows=rng.normal(size=(M, F)).astype(np.float32),
              row_hub=np.array([0, 4, 9, 9], np.int32),
              row_valid=np.array([True, True, False, False]), mask=np.asarray(mask, bool))


def _init(model, rng, A=9):
  hubs = rng.normal(size=(A, 12)).astype(np.float32)
  obs = _obs(rng, np.ones(A, bool))
  return hubs, model.init(jax.random.PRNGKey(0), hubs, np.zeros((3, 5), np.float32), obs)["params"]


def test_the_network_gives_a_distribution_and_the_runner_acts_greedily_by_role():
  rng = np.random.default_rng(1)
  flat = garnet.GARNet(hidden=8, num_layers=1, mlp_hidden=8)
  model = garnet.GARNet(hidden=8, num_layers=1, mlp_hidden=8, policy_head="factored", num_llms=K)
  hubs, params = _init(model, rng)
  _, flat_params = _init(flat, np.random.default_rng(1))
  # The factored head adds the role readout's query MLP and nothing else: a flat checkpoint's
  # tree is the flat model's, unchanged.
  assert set(params) == set(flat_params) | {"role_mlp"}
  jax.tree_util.tree_map(lambda a, b: np.testing.assert_array_equal(a.shape, b.shape),
                         {k: params[k] for k in flat_params}, flat_params)
  runner = rollout.PolicyRunner(model, hubs, batch_size=3)
  runner.set_params(params, None)
  masks = [[1, 1, 1, 1, 1, 1, 0, 0, 0], [0, 0, 0, 1, 1, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0, 1, 0, 1]]
  obs = {k: np.stack([_obs(np.random.default_rng(i), m)[k] for i, m in enumerate(masks)])
         for k in _obs(rng, masks[0])}
  logits, _ = runner.scores(obs)
  p = np.exp(np.asarray(jax.nn.log_softmax(jnp.asarray(logits))))
  mask = np.asarray(masks, bool)
  np.testing.assert_allclose(p.sum(1), 1.0, rtol=1e-5)
  assert np.all(p[~mask] == 0)
  a, lp, _ = runner.act(obs, jax.random.PRNGKey(0), greedy=True)
  np.testing.assert_array_equal(a, garnet.greedy_actions(model, jnp.asarray(logits)))
  assert all(mask[i, a[i]] for i in range(3))
  # near-uniform start: each valid role about equally likely
  np.testing.assert_allclose(p[0].reshape(3, K).sum(1)[:2], [0.5, 0.5], atol=0.05)


def test_a_factored_router_scores_another_pool_with_the_same_parameters():
  rng = np.random.default_rng(3)
  model = garnet.GARNet(hidden=8, num_layers=1, mlp_hidden=8, policy_head="factored", num_llms=K)
  _, params = _init(model, rng)
  space = types.SimpleNamespace(num_llms=4)     # one LLM more per role: A = 12
  wider = garnet.for_action_space(model, space)
  assert wider.num_llms == 4 and garnet.for_action_space(garnet.GARNet(), space).num_llms == 0
  hubs = rng.normal(size=(12, 12)).astype(np.float32)
  h_hist = wider.apply({"params": params}, hubs, np.zeros((12, 8), np.float32), np.ones(12),
                       method=wider.history_hubs)
  logits = wider.apply({"params": params}, h_hist, _obs(rng, np.arange(12) < 8),
                       method=wider.policy)
  np.testing.assert_allclose(np.exp(np.asarray(logits))[:8].sum(), 1.0, rtol=1e-5)


def test_factored_needs_the_llms_per_role():
  rng = np.random.default_rng(2)
  with pytest.raises(ValueError, match="num_llms"):
    _init(garnet.GARNet(hidden=8, num_layers=1, mlp_hidden=8, policy_head="factored"), rng)
  with pytest.raises(ValueError, match="roles x 4 LLMs"):
    _init(garnet.GARNet(hidden=8, num_layers=1, mlp_hidden=8, policy_head="factored",
                        num_llms=4), rng)


def test_config_default_is_flat_and_old_records_still_match():
  c = test_config.get_config()
  assert c.model.policy_head == "flat"
  assert training.make_model(c).policy_head == "flat"
  # A config without the field (an older record or file) completes to the flat head.
  del c.model["policy_head"]
  config_defaults.complete(c)
  assert c.model.policy_head == "flat" and training.make_model(c).num_llms == 0
  # A workdir recorded before the option (and the PPO / warm-start options) resumes while they
  # are off, and refuses a run that turns one on.
  new = [k for k in config_defaults.FIELDS
         if k in ("model.policy_head", "ppo.role_entropy_coef", "ppo.advantage_norm")
         or k.startswith("train.phase1_")]
  assert len(new) == 6
  flat = workdir_config.flatten(test_config.get_config())
  old = {k: v for k, v in flat.items() if k not in new}
  assert workdir_config.differences(old, flat) == []
  on = dict(flat, **{"model.policy_head": "factored"})
  assert [d[0] for d in workdir_config.differences(old, on)] == ["model.policy_head"]
  factored = test_config.get_config()
  factored.model.policy_head = "factored"
  m = training.make_model(factored)
  assert (m.policy_head, m.num_llms) == ("factored",
                                         len(system_lib.configured_llms(factored)))
