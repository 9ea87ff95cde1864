"""PPO (clipped surrogate) for GARNet: the loss and the whole update as one jitted function.

The update runs `epochs` x `num_minibatches` gradient steps inside one jit (nested lax.scan), on a
TrainingState pytree. Each minibatch encodes the history rows once and gives every transition its
own history snapshot through prefix sums over chunks of rows cut at the snapshot values.
History-summary ablation: `hist` carries summary [A, D], the per-hub summary embeddings every
decision of the iteration read, and all transitions use it (no per-transition sums).
Given a mesh of several devices (gp_jax/rl/parallel.py) the same update runs as one SPMD program:
history rows sharded (per-device sums joined by a psum), minibatches split across devices,
parameters replicated.
"""
from __future__ import annotations

import functools
from typing import Any

import chex
import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from gp_jax.graph import garnet as garnet_lib
from gp_jax.rl import parallel

VALUE_MODULES = ("value_row", "value_hub", "value_mlp", "value_shared")
# History rows one device encodes at once in the update when it holds more than twice as many
# (bounded memory; the sums are then added in another order: last-bit differences from one pass).
ROW_BLOCK = 1 << 19


@flax.struct.dataclass
class TrainingState:
  params: Any
  opt_state: Any
  rng: jax.Array
  update_step: jax.Array     # number of PPO updates applied


def make_optimizer(*, learning_rate: float, value_lr_multiplier: float, max_grad_norm: float,
                   decay_steps: int = 0, final_fraction: float = 1.0
                   ) -> optax.GradientTransformation:
  """Adam with global-norm clipping; the value network learns `value_lr_multiplier` x faster.

  decay_steps > 0: both learning rates fall linearly to `final_fraction` of their initial value
  over that many gradient steps (then stay there); 0 keeps them constant.
  """
  def label(params):
    return {k: ("value" if k in VALUE_MODULES else "policy") for k in params}

  def rate(lr):
    if decay_steps <= 0:
      return lr
    return optax.linear_schedule(lr, lr * final_fraction, int(decay_steps))
  return optax.chain(
      optax.clip_by_global_norm(max_grad_norm),
      optax.multi_transform({"policy": optax.adam(rate(learning_rate)),
                             "value": optax.adam(rate(learning_rate * value_lr_multiplier))}, label))


def masked_log_softmax(logits):
  return jax.nn.log_softmax(logits)


def entropy_of(logits, mask):
  logp = jax.nn.log_softmax(logits)
  p = jnp.exp(logp)
  return -jnp.sum(jnp.where(mask, p * logp, 0.0), -1)


def ppo_loss(logits: chex.Array, values: chex.Array, actions: chex.Array, old_logp: chex.Array,
             advantages: chex.Array, returns: chex.Array, mask: chex.Array, weights: chex.Array, *,
             clip_eps: float, value_coef: float, entropy_coef: float):
  """Clipped PPO loss over a batch.

  Args:
    logits: [B, A] masked logits. values: [B]. actions, old_logp, advantages, returns: [B].
    mask: [B, A] valid actions. weights: [B] 1 for real transitions, 0 for padding.
  Returns:
    (loss, metrics dict).
  """
  chex.assert_rank([logits, mask], 2)
  logp_all = jax.nn.log_softmax(logits)
  logp = jnp.take_along_axis(logp_all, actions[:, None], 1)[:, 0]
  ratio = jnp.exp(logp - old_logp)
  surr = jnp.minimum(ratio * advantages, jnp.clip(ratio, 1 - clip_eps, 1 + clip_eps) * advantages)
  n = jnp.maximum(weights.sum(), 1.0)
  policy_loss = -jnp.sum(surr * weights) / n
  value_loss = 0.5 * jnp.sum(jnp.square(values - returns) * weights) / n
  entropy = jnp.sum(entropy_of(logits, mask) * weights) / n
  loss = policy_loss + value_coef * value_loss - entropy_coef * entropy
  clipfrac = jnp.sum((jnp.abs(ratio - 1) > clip_eps) * weights) / n
  approx_kl = jnp.sum((old_logp - logp) * weights) / n
  return loss, dict(loss=loss, policy_loss=policy_loss, value_loss=value_loss, entropy=entropy,
                    clipfrac=clipfrac, approx_kl=approx_kl, ratio_mean=jnp.sum(ratio * weights) / n)


def history_chunk_sums(model: garnet_lib.GARNet, params, hist: dict, num_chunks: int, num_hubs: int,
                       mesh=None):
  """Exclusive prefix sums over chunks of per-(chunk, hub) sums of transformed history rows.

  mesh: several devices: hist rows/segment are sharded along parallel.DATA; each device encodes
  and sums its rows, a psum joins the per-(chunk, hub) sums (the prefix sums then run replicated).
  A device holding more than 2 x ROW_BLOCK rows encodes them in blocks (rematerialised).
  Returns [num_chunks, A, d]: entry j = per-hub sums of the rows a transition with chunk index j
  saw (gp_jax/graph/history.py, update_inputs).
  """
  A = num_hubs

  S = num_chunks * A + 1

  def encode_block(params, rows, segment):
    h = model.apply({"params": params}, rows, method=model.history_rows)
    return jax.ops.segment_sum(h, segment, S)

  def encode(params, rows, segment):
    n = rows.shape[0]
    if n <= 2 * ROW_BLOCK:   # two blocks would save little memory and cost the recompute
      return encode_block(params, rows, segment)
    # Block by block, each block's activations recomputed in the backward pass: memory for
    # ROW_BLOCK rows, not all of them. The last block starts early (n need not divide) and sends
    # the rows an earlier block already summed to the dropped segment S - 1.
    # The slicing sits inside the checkpoint, so the backward pass keeps only the block index per
    # block (not a stacked copy of the sliced rows).
    @jax.checkpoint
    def block(params, rows, segment, i):
      start = jnp.minimum(i * ROW_BLOCK, n - ROW_BLOCK)
      r = jax.lax.dynamic_slice_in_dim(rows, start, ROW_BLOCK)
      seg = jax.lax.dynamic_slice_in_dim(segment, start, ROW_BLOCK)
      seg = jnp.where(start + jnp.arange(ROW_BLOCK) >= i * ROW_BLOCK, seg, S - 1)
      return encode_block(params, r, seg)
    return jax.lax.map(lambda i: block(params, rows, segment, i),
                       jnp.arange(-(-n // ROW_BLOCK))).sum(0)

  if parallel.is_sharded(mesh):
    spec = P(parallel.DATA)
    per_chunk = jax.shard_map(lambda p, r, s: jax.lax.psum(encode(p, r, s), parallel.DATA),
                              mesh=mesh, in_specs=(P(), spec, spec), out_specs=P())(
                                  params, hist["rows"], hist["segment"])
  else:
    per_chunk = encode(params, hist["rows"], hist["segment"])
  per_chunk = per_chunk[:-1].reshape(num_chunks, A, -1)
  inclusive = jnp.cumsum(per_chunk, axis=0)
  return jnp.concatenate([jnp.zeros_like(inclusive[:1]), inclusive[:-1]], 0)


def history_sums(model: garnet_lib.GARNet, params, hist: dict, chunk: chex.Array, count: chex.Array,
                 num_chunks: int, mesh=None):
  """Per-transition hub sums [B, A, d] and counts [B, A] of the history rows each one saw."""
  return history_chunk_sums(model, params, hist, num_chunks, count.shape[-1], mesh)[chunk], count


def forward_batch(model, params, hub_features, hist, batch, num_chunks: int, mesh=None):
  """Logits [B, A] and values [B] of a minibatch, each with its own history snapshot."""
  if "summary" in hist:   # one history input for the whole iteration
    h_hist = model.apply({"params": params}, hub_features, hist["summary"],
                         jnp.zeros(hub_features.shape[0]), method=model.history_hubs)
    def one_summary(obs):
      logits = model.apply({"params": params}, h_hist, obs, method=model.policy)
      value = model.apply({"params": params}, hub_features, obs, method=model.value)
      return logits, value
    return jax.vmap(one_summary)(batch["obs"])
  sums, count = history_sums(model, params, hist, batch["hist_chunk"], batch["hist_count"],
                             num_chunks, mesh)
  def one(obs, s, c):
    h_hist = model.apply({"params": params}, hub_features, s, c, method=model.history_hubs)
    logits = model.apply({"params": params}, h_hist, obs, method=model.policy)
    value = model.apply({"params": params}, hub_features, obs, method=model.value)
    return logits, value
  return jax.vmap(one)(batch["obs"], sums, count)


def entropy_coefficient(step, coef: float, decay_updates: int, final_fraction: float):
  """Entropy coefficient of PPO update `step` (0-based): `coef` when decay_updates <= 0, else a
  linear fall to coef x final_fraction at step decay_updates, held there afterwards."""
  if decay_updates <= 0:
    return jnp.asarray(coef, jnp.float32)
  frac = jnp.minimum(jnp.asarray(step, jnp.float32) / float(decay_updates), 1.0)
  return coef * (1.0 - (1.0 - final_fraction) * frac)


def make_update_fn(model: garnet_lib.GARNet, optimizer: optax.GradientTransformation, *,
                   epochs: int, num_minibatches: int, clip_eps: float, value_coef: float,
                   entropy_coef: float, num_chunks: int | None = None,
                   max_traces: int | None = None,
                   entropy_decay_updates: int = 0, entropy_final_fraction: float = 1.0,
                   mesh=None):
  """Returns update(state, hub_features, hist, batch) -> (state, metrics), jitted once per shape.

  batch: dict of arrays with leading dim N (a multiple of num_minibatches): obs (dict), actions,
  old_logp, advantages, returns, weights, hist_chunk [N], hist_count [N, A].
  num_chunks: the chunk budget of the history inputs; None = N + 1 (each padded batch size N
  compiles once, so one function serves several padding buckets).
  hist: rows [H, F], segment [H] from HistoryMemory.update_inputs(..., num_chunks); in the
  summary ablation also summary [A, D] (PolicyRunner.history_input_array of the iteration).
  entropy_decay_updates > 0: update k (state.update_step) uses the entropy coefficient
  entropy_coef x (1 - (1 - entropy_final_fraction) x min(k / entropy_decay_updates, 1)).
  mesh: a jax.sharding.Mesh (axis parallel.DATA) of several devices: the update places its
  inputs (host data identical on every process) -- history rows sharded, transitions sharded, the
  rest replicated -- and returns replicated state; N / num_minibatches must then be a multiple of
  the mesh size, and the history row count too (parallel.pad_rows). One device (or None): the
  plain jitted function, bit for bit the unsharded program.
  """
  sharded = parallel.is_sharded(mesh)
  loss_kw = dict(clip_eps=clip_eps, value_coef=value_coef)

  def chunks_of(batch) -> int:
    return num_chunks or batch["actions"].shape[0] + 1

  def loss_fn(params, hub_features, hist, mb, ent_coef, chunks):
    logits, values = forward_batch(model, params, hub_features, hist, mb, chunks, mesh)
    w = mb["weights"]
    adv = mb["advantages"]
    return ppo_loss(logits, values, mb["actions"], mb["old_logp"], adv, mb["returns"],
                    mb["obs"]["mask"], w, entropy_coef=ent_coef, **loss_kw)

  def update(state: TrainingState, hub_features, hist, batch):
    n = batch["actions"].shape[0]
    chunks = chunks_of(batch)
    mb_size = n // num_minibatches
    # Advantage normalisation over the real transitions of the whole batch.
    w = batch["weights"]
    mean = jnp.sum(batch["advantages"] * w) / jnp.maximum(w.sum(), 1)
    std = jnp.sqrt(jnp.sum(jnp.square(batch["advantages"] - mean) * w) / jnp.maximum(w.sum(), 1))
    batch = dict(batch, advantages=(batch["advantages"] - mean) / (std + 1e-8))
    ent_coef = entropy_coefficient(state.update_step, entropy_coef, entropy_decay_updates,
                                   entropy_final_fraction)

    def epoch(carry, key):
      params, opt_state = carry
      perm = jax.random.permutation(key, n)
      shuffled = jax.tree_util.tree_map(lambda x: x[perm].reshape((num_minibatches, mb_size) + x.shape[1:]), batch)
      if sharded:   # data-parallel minibatches: each device takes mb_size / devices transitions
        shuffled = jax.lax.with_sharding_constraint(
            shuffled, NamedSharding(mesh, P(None, parallel.DATA)))

      def minibatch(carry, mb):
        params, opt_state = carry
        (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, hub_features, hist, mb,
                                                                   ent_coef, chunks)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        metrics["grad_norm"] = optax.global_norm(grads)
        return (params, opt_state), metrics

      (params, opt_state), metrics = jax.lax.scan(minibatch, (params, opt_state), shuffled)
      return (params, opt_state), metrics

    rng, key = jax.random.split(state.rng)
    (params, opt_state), metrics = jax.lax.scan(epoch, (state.params, state.opt_state),
                                                jax.random.split(key, epochs))
    metrics = jax.tree_util.tree_map(jnp.mean, metrics)
    metrics["param_norm"] = optax.global_norm(params)
    metrics["entropy_coef"] = ent_coef
    return TrainingState(params, opt_state, rng, state.update_step + 1), metrics

  if max_traces is not None:   # tests: fail loudly if anything retraces
    update = chex.assert_max_traces(update, n=max_traces)
  if not sharded:
    return jax.jit(update, donate_argnums=(0,))
  rep = parallel.replicated(mesh)
  jitted = jax.jit(update, donate_argnums=(0,), out_shardings=rep)
  rows = parallel.rows_sharding(mesh)

  def place_and_update(state, hub_features, hist, batch):
    if "segment" in hist and not isinstance(hist["segment"], jax.Array):
      rows_, segment = parallel.pad_rows(hist["rows"], hist["segment"], mesh.size,
                                         chunks_of(batch) * batch["hist_count"].shape[-1])
      hist = dict(hist, rows=rows_, segment=segment)
    hist = {k: parallel.put(v, rows if k in ("rows", "segment") else rep) for k, v in hist.items()}
    return jitted(parallel.put_tree(state, rep), parallel.put(hub_features, rep), hist,
                  parallel.put_tree(batch, rows))
  place_and_update.jitted = jitted
  return place_and_update


def compile_count(update) -> int:
  """Programs compiled so far by an update of make_update_fn (one per input shape)."""
  return getattr(update, "jitted", update)._cache_size()
