"""The released GraphPlanner PPO update (RouteAgent.update in the authors' network.py), jitted.

On a buffer of T transitions (observations with their action, reward, old log-probability, value
and done flag) and the history memory of the time of the update:
  GAE over the whole buffer in its order: delta_t = r_t + gamma v_{t+1} (1 - done_t) - v_t,
  A_t = delta_t + gamma lambda (1 - done_t) A_{t+1}, v_T = 0; returns R = A + v; then A is
  normalised with the buffer's mean and its unbiased standard deviation (+ 1e-8).
  k epochs; each epoch visits the buffer in a given order (the released code's random.shuffle,
  passed in as `perm`) in minibatches of `batch_size` (the last one may be smaller). Per minibatch:
    p = policy probabilities; p' = p * mask / (sum + 1e-10); log p' + 1e-10 at the taken action;
    ratio = exp(new - old); loss_pi = -mean(min(ratio A, clip(ratio, 1 +- eps) A)) - c mean(H(p'));
    one Adam step of the policy on loss_pi; then loss_v = mean((v - R)^2) and one Adam step of
    the value network (its own Adam, learning rate 2 x lr). No gradient clipping.
Minibatches are padded to `batch_size` with weight 0, so one compiled step serves the partial one;
the means are over the real entries only. The history is encoded once per minibatch and shared
by its transitions (the released code encodes it per transition: the same numbers).
Returns the new parameters and optimiser states, the mean policy loss, value loss and entropy
over the minibatches (what the released update returns), and each minibatch's three [S, 3].
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from gp_jax.graph import official

EPS_PROB = 1e-10


class Buffer(NamedTuple):
  """T transitions: observations (leading axis T), action [T], reward [T], log_prob [T] (old
  policy), value [T], done [T] (float)."""
  obs: official.Observation
  action: jax.Array
  reward: jax.Array
  log_prob: jax.Array
  value: jax.Array
  done: jax.Array


class Settings(NamedTuple):
  lr: float = 1e-4            # RouteAgent default; the value network's is 2 x lr
  gamma: float = 0.98
  gae_lambda: float = 0.85
  eps_clip: float = 0.2
  entropy_coef: float = 0.0
  batch_size: int = 32


def optimizers(settings: Settings):
  """(policy Adam, value Adam) as the released agent builds them (torch's Adam defaults)."""
  return (optax.adam(settings.lr, b1=0.9, b2=0.999, eps=1e-8),
          optax.adam(2.0 * settings.lr, b1=0.9, b2=0.999, eps=1e-8))


def gae(reward, value, done, gamma, lam):
  """Advantages [T] by the released compute_gae (next value 0 after the last transition)."""
  next_value = jnp.concatenate([value[1:], jnp.zeros(1, value.dtype)])

  def step(carry, x):
    r, v, nv, d = x
    delta = r + gamma * nv * (1.0 - d) - v
    a = delta + gamma * lam * (1.0 - d) * carry
    return a, a

  _, adv = jax.lax.scan(step, jnp.zeros((), value.dtype), (reward, value, next_value, done),
                        reverse=True)
  return adv


def minibatch_plan(perm: np.ndarray, batch_size: int):
  """(index [S, batch_size], weight [S, batch_size]) of every minibatch step, epochs in order:
  the released loop `for epoch: for start in range(0, T, batch_size)` over each epoch's order."""
  perm = np.asarray(perm, np.int64)
  idx, w = [], []
  for order in perm:
    for start in range(0, len(order), batch_size):
      part = order[start:start + batch_size]
      pad = batch_size - len(part)
      idx.append(np.concatenate([part, np.zeros(pad, np.int64)]))
      w.append(np.concatenate([np.ones(len(part)), np.zeros(pad)]))
  return np.asarray(idx, np.int32), np.asarray(w, np.float32)


def _take(tree, i):
  return jax.tree_util.tree_map(lambda x: x[i], tree)


def _mean(x, w):
  return jnp.sum(x * w) / jnp.sum(w)


@functools.partial(jax.jit, static_argnames=("nets", "settings", "with_grads"))
def update(nets: official.Networks, settings: Settings, params, opt_state, query, llm,
           history: official.Memory, buffer: Buffer, index, weight, with_grads: bool = False):
  """One released-code update. params/opt_state: {"policy", "value"}; index/weight from
  `minibatch_plan`. Returns (params, opt_state, (policy_loss, value_loss, entropy) means,
  per-step [S, 3]), and with_grads the gradients of every step {"policy", "value"} (leading
  axis S) last."""
  opt_pi, opt_v = optimizers(settings)
  adv = gae(buffer.reward, buffer.value, buffer.done, settings.gamma, settings.gae_lambda)
  returns = adv + buffer.value
  adv = (adv - adv.mean()) / (jnp.std(adv, ddof=1) + 1e-8)

  def policy_loss(p_pi, b, a, w):
    l_his = nets.policy.apply({"params": p_pi}, query, llm, history,
                              method=official.OfficialPolicy.history)
    probs = jax.vmap(lambda o: nets.policy.apply({"params": p_pi}, query, l_his, o,
                                                 method=official.OfficialPolicy.decide))(b.obs)
    mp = probs * b.obs.mask
    mp = mp / (mp.sum(-1, keepdims=True) + EPS_PROB)
    lp = jnp.log(mp + EPS_PROB)
    new_lp = jnp.take_along_axis(lp, b.action[:, None], 1)[:, 0]
    ent = -(mp * lp).sum(-1)
    ratio = jnp.exp(new_lp - b.log_prob)
    s1 = ratio * a
    s2 = jnp.clip(ratio, 1.0 - settings.eps_clip, 1.0 + settings.eps_clip) * a
    loss = -_mean(jnp.minimum(s1, s2), w) - settings.entropy_coef * _mean(ent, w)
    return loss, _mean(ent, w)

  def value_loss(p_v, b, ret, w):
    l_his, his_agg = nets.value.apply({"params": p_v}, query, llm, history,
                                      method=official.OfficialValue.history)
    v = jax.vmap(lambda o: nets.value.apply({"params": p_v}, query, l_his, his_agg, o,
                                            method=official.OfficialValue.decide))(b.obs)
    return _mean((v - ret) ** 2, w)

  def step(carry, plan):
    params, opt_state = carry
    i, w = plan
    b, a, ret = _take(buffer, i), adv[i], returns[i]
    (pl, ent), g_pi = jax.value_and_grad(policy_loss, has_aux=True)(params["policy"], b, a, w)
    u_pi, s_pi = opt_pi.update(g_pi, opt_state["policy"], params["policy"])
    vl, g_v = jax.value_and_grad(value_loss)(params["value"], b, ret, w)
    u_v, s_v = opt_v.update(g_v, opt_state["value"], params["value"])
    params = {"policy": optax.apply_updates(params["policy"], u_pi),
              "value": optax.apply_updates(params["value"], u_v)}
    out = jnp.stack([pl, vl, ent])
    return (params, {"policy": s_pi, "value": s_v}), (
        (out, {"policy": g_pi, "value": g_v}) if with_grads else out)

  (params, opt_state), per_step = jax.lax.scan(step, (params, opt_state), (index, weight))
  if with_grads:
    losses, grads = per_step
    return params, opt_state, tuple(losses.mean(0)), losses, grads
  return params, opt_state, tuple(per_step.mean(0)), per_step


def init_opt_state(settings: Settings, params):
  opt_pi, opt_v = optimizers(settings)
  return {"policy": opt_pi.init(params["policy"]), "value": opt_v.init(params["value"])}
