"""Generalised advantage estimation (Schulman et al. 2016), for one trajectory; vmap for batches.

  delta_t = r_t + discount_t * v_{t+1} - v_t
  A_t     = delta_t + discount_t * lambda * A_{t+1}
with discount_t = gamma * (1 - done_t), so the value after a terminal step is ignored.
"""
import chex
import jax
import jax.numpy as jnp


def gae_advantages(rewards: chex.Array, discounts: chex.Array, values: chex.Array,
                   lambda_: float) -> chex.Array:
  """Advantages [T] from rewards [T], discounts [T] and values [T + 1] (last = bootstrap)."""
  chex.assert_rank([rewards, discounts, values], 1)
  chex.assert_equal_shape([rewards, discounts])
  chex.assert_axis_dimension(values, 0, rewards.shape[0] + 1)
  deltas = rewards + discounts * values[1:] - values[:-1]

  def step(carry, x):
    delta, discount = x
    adv = delta + discount * lambda_ * carry
    return adv, adv

  _, adv = jax.lax.scan(step, jnp.zeros((), rewards.dtype), (deltas, discounts), reverse=True)
  return adv


def batched_gae(rewards, discounts, values, lambda_):
  """[B, T] rewards/discounts, [B, T + 1] values -> [B, T] advantages."""
  return jax.vmap(gae_advantages, in_axes=(0, 0, 0, None))(rewards, discounts, values, lambda_)
