"""GAE, PPO loss, history prefix sums and GARNet aggregation against plain numpy references."""
import dataclasses

import chex
import jax
import jax.numpy as jnp
import jraph
import numpy as np
import optax
import pytest

from gp_jax import errors
from gp_jax.graph import garnet
from gp_jax.graph import history as history_lib
from gp_jax.rl import gae
from gp_jax.rl import ppo


def gae_reference(rewards, discounts, values, lam):
  adv = np.zeros_like(rewards)
  last = 0.0
  for t in reversed(range(len(rewards))):
    delta = rewards[t] + discounts[t] * values[t + 1] - values[t]
    last = delta + discounts[t] * lam * last
    adv[t] = last
  return adv


class GAETest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_matches_python_loop(self):
    rng = np.random.default_rng(0)
    fn = self.variant(gae.gae_advantages, static_argnums=3)
    for T in (1, 5, 17):
      r = rng.normal(size=T).astype(np.float32)
      d = (0.99 * (rng.random(T) > 0.2)).astype(np.float32)
      v = rng.normal(size=T + 1).astype(np.float32)
      np.testing.assert_allclose(fn(r, d, v, 0.95), gae_reference(r, d, v, 0.95), rtol=1e-5, atol=1e-5)

  def test_lambda_one_is_discounted_return_minus_value(self):
    r = np.array([0.0, 0.0, 1.0], np.float32)
    d = np.array([0.9, 0.9, 0.0], np.float32)
    v = np.array([0.1, 0.2, 0.3, 5.0], np.float32)
    adv = gae.gae_advantages(r, d, v, 1.0)
    np.testing.assert_allclose(adv + v[:-1], [0.81, 0.9, 1.0], rtol=1e-6)


def ppo_loss_reference(logits, values, actions, old_logp, adv, ret, mask, w, clip, vc, ec):
  logp_all = logits - np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1, keepdims=True)) \
      - logits.max(1, keepdims=True)
  logp = logp_all[np.arange(len(actions)), actions]
  ratio = np.exp(logp - old_logp)
  surr = np.minimum(ratio * adv, np.clip(ratio, 1 - clip, 1 + clip) * adv)
  n = w.sum()
  p = np.exp(logp_all)
  ent = -(np.where(mask, p * logp_all, 0)).sum(1)
  return (-(surr * w).sum() / n + vc * 0.5 * ((values - ret) ** 2 * w).sum() / n
          - ec * (ent * w).sum() / n)


class PPOLossTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_matches_numpy(self):
    rng = np.random.default_rng(1)
    B, A = 12, 6
    mask = rng.random((B, A)) > 0.3
    mask[:, 0] = True
    logits = np.where(mask, rng.normal(size=(B, A)), garnet.NEG_INF).astype(np.float32)
    actions = np.array([rng.choice(np.flatnonzero(m)) for m in mask], np.int32)
    old_logp = (np.log(1 / mask.sum(1)) + 0.3 * rng.normal(size=B)).astype(np.float32)
    adv, ret, values = (rng.normal(size=B).astype(np.float32) for _ in range(3))
    w = (rng.random(B) > 0.2).astype(np.float32)
    fn = self.variant(lambda *a: ppo.ppo_loss(*a, clip_eps=0.2, value_coef=0.5, entropy_coef=0.01)[0])
    got = fn(logits, values, actions, old_logp, adv, ret, mask, w)
    want = ppo_loss_reference(logits, values, actions, old_logp, adv, ret, mask, w, 0.2, 0.5, 0.01)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)

  def test_clipping_stops_gradient_beyond_the_trust_region(self):
    logits = jnp.array([[2.0, 0.0]])
    args = (jnp.zeros(1), jnp.array([0]), jnp.array([-3.0]), jnp.array([1.0]), jnp.zeros(1),
            jnp.ones((1, 2), bool), jnp.ones(1))
    g = jax.grad(lambda l: ppo.ppo_loss(l, *args, clip_eps=0.2, value_coef=0.0, entropy_coef=0.0)[0])(logits)
    np.testing.assert_allclose(g, 0.0)   # ratio >> 1 + eps with positive advantage: clipped


class HistorySumsTest(chex.TestCase):

  def test_snapshot_sums_match_direct_sums(self):
    """Each transition's per-hub sums equal sums over exactly the rows it saw."""
    rng = np.random.default_rng(3)
    A, F, N = 5, 4, 300
    mem = history_lib.HistoryMemory(F, A, capacity=1000)
    rows = rng.normal(size=(N, F)).astype(np.float32)
    hubs = rng.integers(0, A, N)
    mem.add(rows, hubs)
    snaps = np.array([17, 0, 1, 17, 150, 299, 300])
    inputs = mem.update_inputs(snaps, num_chunks=10)
    model = garnet.GARNet(hidden=8, num_layers=1)
    obs = dict(task=jnp.zeros(3), query=jnp.zeros(3), state=jnp.zeros(3), rows=jnp.zeros((2, F)),
               row_hub=jnp.array([A, A]), row_valid=jnp.zeros(2, bool), mask=jnp.ones(A, bool))
    params = model.init(jax.random.PRNGKey(0), jnp.zeros((A, 6)), jnp.zeros((1, F)), obs)["params"]
    sums, counts = jax.jit(ppo.history_sums, static_argnums=(0, 5))(
        model, params, inputs, inputs["chunk"], inputs["count"], 10)
    h = np.asarray(model.apply({"params": params}, jnp.asarray(rows), method=model.history_rows))
    for t, s in enumerate(snaps):
      want = np.zeros((A, 8))
      np.add.at(want, hubs[:s], h[:s])
      np.testing.assert_allclose(sums[t], want, rtol=1e-4, atol=1e-4)
      np.testing.assert_array_equal(counts[t], np.bincount(hubs[:s], minlength=A))

  def test_eviction_and_buckets(self):
    mem = history_lib.HistoryMemory(2, 3, capacity=4)
    mem.add(np.arange(12, dtype=np.float32).reshape(6, 2), np.array([0, 1, 2, 0, 1, 2]))
    assert mem.evict() == 2 and len(mem) == 4
    np.testing.assert_array_equal(mem.hubs, [2, 0, 1, 2])
    rows, hubs = mem.padded()
    assert rows.shape[0] == history_lib.bucket(4, 4) == history_lib.ALIGN and (hubs[4:] == 3).all()
    B, G = history_lib.MIN_BUCKET, history_lib.GROWTH
    assert history_lib.bucket(B + 1) == B * G
    assert history_lib.bucket(B * G + 1, limit=B * G + 100) == B * G + history_lib.ALIGN  # cut at the limit
    assert history_lib.bucket(B * G + 1, limit=B * G) == B * G * G     # past the limit: geometric
    assert history_lib.bucket(10, limit=10 * B) == B


def test_garnet_layer_scatter_mean_and_add_back():
  """One GARNet layer against a numpy implementation of the equations."""
  rng = np.random.default_rng(4)
  A, M, d = 4, 6, 5
  layer = garnet.GARNetLayer(hidden=d)
  valid = np.array([1, 1, 1, 1, 0, 0], bool)
  hub_of_row = np.array([0, 2, 2, 3, 0, 0])
  g = garnet.workflow_graph(jnp.asarray(rng.normal(size=d), jnp.float32),
                            jnp.asarray(rng.normal(size=(A, d)), jnp.float32),
                            jnp.asarray(rng.normal(size=(M, d)), jnp.float32),
                            jnp.asarray(np.where(valid, hub_of_row, A)), jnp.asarray(valid))
  params = layer.init(jax.random.PRNGKey(0), g, A)
  out = layer.apply(params, g, A)
  p = params["params"]

  def T(name, x):
    q = p[name]
    h = x @ np.asarray(q["Dense_0"]["kernel"]) + np.asarray(q["Dense_0"]["bias"])
    mu, var = h.mean(-1, keepdims=True), h.var(-1, keepdims=True)
    h = (h - mu) / np.sqrt(var + 1e-6) * np.asarray(q["LayerNorm_0"]["scale"]) + np.asarray(q["LayerNorm_0"]["bias"])
    return np.maximum(h, 0) + x
  nodes, rows = np.asarray(g.nodes), np.asarray(g.edges)
  hq, hh, hr = T("query", nodes[:1]), T("hub", nodes[1:1 + A]), T("row", rows)
  beta = float(p["beta"])
  hub_out = hh.copy()
  for a in range(A):
    sel = valid & (hub_of_row == a)
    if sel.any():
      hub_out[a] += beta * hr[sel].mean(0)
  q_out = hq[0] + beta * hr[valid].mean(0)
  np.testing.assert_allclose(out.nodes[1:1 + A], hub_out, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(out.nodes[0], q_out, rtol=1e-4, atol=1e-4)
  row_out = hr + beta * (q_out[None] + np.concatenate([hub_out, np.zeros((1, d))])[
      np.where(valid, hub_of_row, A)])
  np.testing.assert_allclose(out.edges[valid], row_out[valid], rtol=1e-4, atol=1e-4)


def test_policy_masks_invalid_actions():
  A, F = 6, 4
  model = garnet.GARNet(hidden=8, num_layers=2)
  mask = np.array([1, 0, 1, 0, 0, 1], bool)
  obs = dict(task=jnp.ones(3), query=jnp.ones(3), state=jnp.ones(3), rows=jnp.ones((2, F)),
             row_hub=jnp.array([0, A]), row_valid=jnp.array([True, False]), mask=jnp.asarray(mask))
  params = model.init(jax.random.PRNGKey(0), jnp.ones((A, 6)), jnp.ones((3, F)), obs)["params"]
  logits, _ = model.apply({"params": params}, jnp.ones((A, 6)), jnp.ones((3, F)), obs)
  probs = np.asarray(jax.nn.softmax(logits))
  assert (probs[~mask] == 0).all() and probs[mask].sum() == pytest.approx(1.0)


def test_linear_lr_schedule_decays_both_learning_rates():
  """Adam's first step moves each parameter by ~lr; after decay_steps it moves by lr * final."""
  settings = ppo.PPOSettings(learning_rate=1e-2, epochs=2, num_minibatches=1, clip_eps=0.2,
                             gamma=0.99, gae_lambda=0.95, value_coef=0.5, entropy_coef=0.0,
                             max_grad_norm=1e9, value_lr_multiplier=2.0, lr_schedule="linear",
                             lr_final_fraction=0.25)
  assert settings.lr_decay_steps(5) == 10   # 5 updates x 2 epochs x 1 minibatch
  opt = ppo.make_optimizer(settings, num_updates=5)
  params = {"policy_mlp": jnp.zeros(3), "value_mlp": jnp.zeros(3)}
  grads = {"policy_mlp": jnp.ones(3), "value_mlp": jnp.ones(3)}
  state = opt.init(params)
  steps = []
  for _ in range(12):
    updates, state = opt.update(grads, state, params)
    steps.append((float(-updates["policy_mlp"][0]), float(-updates["value_mlp"][0])))
  np.testing.assert_allclose(steps[0], (1e-2, 2e-2), rtol=1e-4)
  np.testing.assert_allclose(steps[5], (1e-2 * (1 - 0.75 * 5 / 10), 2e-2 * (1 - 0.75 * 5 / 10)),
                             rtol=1e-4)
  np.testing.assert_allclose(steps[11], (2.5e-3, 5e-3), rtol=1e-4)   # held at the final fraction
  const = ppo.make_optimizer(dataclasses.replace(settings, lr_schedule="constant"), num_updates=5)
  cstate = const.init(params)
  for _ in range(12):
    updates, cstate = const.update(grads, cstate, params)
  np.testing.assert_allclose(float(-updates["policy_mlp"][0]), 1e-2, rtol=1e-4)


def test_gradient_clip_zero_is_no_clipping():
  """max_grad_norm > 0 scales the gradients to that global norm; 0 (the released code's update)
  leaves them as they are; a negative value is a config error."""
  grads = {"policy_mlp": jnp.full(4, 3.0), "value_mlp": jnp.zeros(2)}   # global norm 6
  for norm, want in ((0.5, 0.5), (100.0, 6.0), (0.0, 6.0)):
    clip = ppo.gradient_clip(norm)
    out, _ = clip.update(grads, clip.init(grads))
    assert float(optax.global_norm(out)) == pytest.approx(want, rel=1e-6)
  with pytest.raises(errors.ConfigError, match="max_grad_norm"):
    ppo.PPOSettings(learning_rate=1e-3, epochs=1, num_minibatches=1, clip_eps=0.2, gamma=0.99,
                    gae_lambda=0.95, value_coef=0.5, entropy_coef=0.0, max_grad_norm=-1.0)

@pytest.mark.parametrize("jit", [True, False])
def test_linear_entropy_schedule(jit):
  """The entropy coefficient falls linearly over decay_updates updates, then holds; 0 = constant."""
  fn = jax.jit(ppo.entropy_coefficient, static_argnums=(1, 2, 3)) if jit else ppo.entropy_coefficient
  got = [float(fn(jnp.int32(k), 0.04, 10, 0.25)) for k in (0, 5, 10, 30)]
  np.testing.assert_allclose(got, [0.04, 0.04 * (1 - 0.75 * 0.5), 0.01, 0.01], rtol=1e-6)
  assert float(fn(jnp.int32(7), 0.04, 0, 0.25)) == pytest.approx(0.04)
