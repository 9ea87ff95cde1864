"""The one PPO batch (gp_jax/rl/batch.py): GAE inside the jit, both layouts, zero-weight padding."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gp_jax.rl import batch as batch_lib
from gp_jax.rl import gae as gae_lib
from gp_jax.rl import ppo

GAMMA, LAMBDA = 0.9, 0.8
SETTINGS = ppo.PPOSettings(learning_rate=1e-2, epochs=2, num_minibatches=2, clip_eps=0.2,
                           gamma=GAMMA, gae_lambda=LAMBDA, value_coef=0.5, entropy_coef=0.01,
                           max_grad_norm=1.0)


def episodes(lengths, seed=0, features=3, actions=4):
  """Random episodes: rewards and values per episode, transitions in episode order."""
  rng = np.random.default_rng(seed)
  rewards = [rng.normal(size=n).astype(np.float32) for n in lengths]
  values = [rng.normal(size=n).astype(np.float32) for n in lengths]
  n = sum(lengths)
  transitions = dict(obs=rng.normal(size=(n, features)).astype(np.float32),
                     mask=np.ones((n, actions), bool),
                     actions=rng.integers(0, actions, n).astype(np.int32),
                     old_logp=np.full(n, -np.log(actions), np.float32))
  return transitions, rewards, values


def reference(rewards, values):
  """Per episode, gp_jax.rl.gae (jitted, as every learner runs it) on its own arrays (terminal last
  step, no bootstrap); checked against a plain Python loop of the same recursion."""
  out = []
  for r, v in zip(rewards, values):
    n = len(r)
    d = np.full(n, GAMMA, np.float32)
    d[-1] = 0.0
    adv = np.asarray(jax.jit(gae_lib.gae_advantages, static_argnums=3)(
        r, d, np.concatenate([v, np.zeros(1, np.float32)]), LAMBDA))
    loop, carry = np.zeros(n), 0.0
    for t in reversed(range(n)):
      nxt = v[t + 1] if t + 1 < n else 0.0
      carry = r[t] + d[t] * nxt - v[t] + d[t] * LAMBDA * carry
      loop[t] = carry
    np.testing.assert_allclose(adv, loop, rtol=1e-5, atol=1e-5)
    out.append(adv)
  return out


@pytest.mark.parametrize("layout", ["packed", "grid"])
def test_gae_inside_the_jit_equals_rl_gae_on_the_same_episodes(layout):
  lengths = [3, 1, 5, 2]
  transitions, rewards, values = episodes(lengths)
  E, T = 6, 7
  if layout == "packed":
    order = np.random.default_rng(1).permutation(sum(lengths))[:9]   # a shuffled chunk of 9
    batch = batch_lib.build(transitions, rewards, values, size=16, num_episodes=E,
                            num_steps=T, order=order)
    cells = [(e, t) for e, n in enumerate(lengths) for t in range(n)]
    real = [cells[i] for i in order]
    slots = range(len(order))
  else:
    batch = batch_lib.build(transitions, rewards, values, size=E * T,
                            num_episodes=E, num_steps=T, layout="grid")
    real = [(e, t) for e, n in enumerate(lengths) for t in range(n)]
    slots = [e * T + t for e, t in real]
  adv, ret = jax.jit(batch_lib.advantages, static_argnums=(1, 2))(batch, GAMMA, LAMBDA)
  want = reference(rewards, values)
  for slot, (e, t) in zip(slots, real):
    assert adv[slot] == want[e][t], (slot, e, t)
    assert ret[slot] == np.float32(want[e][t] + values[e][t])
  tr = batch.transitions
  pad = np.ones(len(adv), bool)
  pad[list(slots)] = False
  assert (tr["weights"][~pad] == 1).all() and (tr["weights"][pad] == 0).all()
  assert (np.asarray(adv)[pad] == 0).all() and (np.asarray(ret)[pad] == 0).all()


def test_padding_has_zero_weight_in_the_update():
  """The update's result does not depend on what the padding slots hold."""
  transitions, rewards, values = episodes([4, 3, 2])
  batch = batch_lib.build(transitions, rewards, values, size=16, num_episodes=4,
                          num_steps=4)
  assert batch.transitions["weights"].sum() == 9
  # padding copies the last real transition (finite inputs)
  assert (batch.transitions["obs"][9:] == transitions["obs"][-1]).all()
  junk = {k: v.copy() for k, v in batch.transitions.items()}
  rng = np.random.default_rng(5)
  junk["obs"][9:] = rng.normal(size=junk["obs"][9:].shape) * 100
  junk["actions"][9:] = 3
  junk["old_logp"][9:] = -7.0
  other = batch.replace(transitions=junk)

  def forward(params, mb):
    logits = mb["obs"] @ params["pi"]
    return logits, mb["obs"] @ params["v"], mb["mask"]
  params = {"pi": jnp.full((3, 4), 0.1), "v": jnp.full((3,), 0.2)}
  opt = ppo.make_optimizer(SETTINGS, value_modules=("v",))

  @jax.jit
  def run(b):
    return ppo.learn(forward, opt, SETTINGS, params, opt.init(params), jax.random.PRNGKey(0), b,
                     entropy_coef=jnp.float32(0.01))
  (p1, _, m1), (p2, _, m2) = run(batch), run(other)
  for a, b in zip(jax.tree_util.tree_leaves((p1, m1)), jax.tree_util.tree_leaves((p2, m2))):
    np.testing.assert_array_equal(a, b)
  assert not np.array_equal(p1["pi"], params["pi"])   # it did learn


def test_bad_batches_are_refused():
  transitions, rewards, values = episodes([4, 3])
  build = functools.partial(batch_lib.build, transitions, rewards, values)
  with pytest.raises(ValueError, match="exceed the batch size"):
    build(size=6, num_episodes=2, num_steps=4)
  with pytest.raises(ValueError, match="exceed the grid"):
    build(size=8, num_episodes=2, num_steps=3)
  with pytest.raises(ValueError, match="all 2 x 4 cells"):
    build(size=7, num_episodes=2, num_steps=4, layout="grid")
  with pytest.raises(ValueError, match="unknown batch layout"):
    build(size=8, num_episodes=2, num_steps=4, layout="ragged")
  with pytest.raises(ValueError, match="differ in length"):
    batch_lib.build(transitions, rewards, [values[0]], size=8, num_episodes=2,
                    num_steps=4)
