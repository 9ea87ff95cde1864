"""PPO (clipped surrogate): the settings, the loss and the one update loop every learner uses.

One learner for GraphPlanner (GARNet, `make_update_fn`), the Router-R1-style router
(gp_jax/baselines/multi_round/router_r1.py) and the routed Graph Counselor
(gp_jax/counselor/routing/router.py): the same `PPOSettings`, the same batch
(gp_jax/rl/batch.py: padded transitions plus the episodes' reward grid, GAE inside the jit) and the
same `learn` -- GAE, advantage normalisation, then `epochs` x `num_minibatches` clipped-PPO steps
as nested lax.scan -- inside each learner's one jitted update. A learner supplies only its forward
pass (logits, values, mask of a minibatch).

GARNet's update encodes the history rows once per minibatch and gives every transition its own
history snapshot through prefix sums over chunks of rows cut at the snapshot values.
History-summary ablation: `hist` carries summary [A, D], the per-hub summary embeddings every
decision of the iteration read, and all transitions use it (no per-transition sums).
Given a mesh of several devices (gp_jax/rl/parallel.py) the same update runs as one SPMD program:
history rows sharded (per-device sums joined by a psum), minibatches split across devices,
parameters replicated.

Two options for the choice of role (both off by default; they need the learner's action space):
  role_entropy_coef > 0: the loss also subtracts role_entropy_coef x H(role), the entropy of the
    role marginal p(r) = sum of p(a) over role r's actions (`role_entropy`, from the masked
    logits and the static role index of every action), with either policy head, so the policy
    keeps choosing among the roles (split or answer) while it sharpens among the LLMs.
  advantage_norm = "per_type": advantages are standardised within each decision type
    (gp_jax/rl/batch.py, DECISION_TYPES: the episode's first decision, a later one that may plan
    or answer, a summary, every other) instead of over the whole batch, so the many answering
    decisions do not set the scale (and the sign) of the few decisions to split or not.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import chex
import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from gp_jax import errors
from gp_jax.graph import garnet as garnet_lib
from gp_jax.rl import batch as batch_lib
from gp_jax.rl import parallel

VALUE_MODULES = ("value_row", "value_hub", "value_mlp", "value_shared", "value_stats")   # GARNet's value network
# History rows one device encodes at once in the update when it holds more than twice as many
# (bounded memory; the sums are then added in another order: last-bit differences from one pass).
ROW_BLOCK = 1 << 19
SCHEDULES = ("constant", "linear")   # lr_schedule and entropy_schedule
ADVANTAGE_NORMS = ("batch", "per_type")


@dataclasses.dataclass(frozen=True)
class PPOSettings:
  """The PPO hyperparameters of a learner (frozen and hashable: they key cached jitted updates).

  Attributes:
    learning_rate: Adam learning rate of the policy.
    epochs: passes over the batch per update.
    num_minibatches: minibatches per pass (the batch size must be a multiple).
    clip_eps: PPO ratio clip, in (0, 1).
    gamma: discount; gae_lambda: GAE lambda (both in [0, 1]).
    value_coef: weight of the value loss; entropy_coef: weight of the entropy bonus (>= 0).
    max_grad_norm: global-norm gradient clip (0: no clipping, as the released code's update).
    value_lr_multiplier: the value network's learning rate is this x learning_rate (the modules
      named by make_optimizer's value_modules).
    lr_schedule: "constant", or "linear": both rates fall to lr_final_fraction of their initial
      value over the run's gradient steps (num_updates x epochs x num_minibatches).
    entropy_schedule: "constant", or "linear": the coefficient falls to entropy_final_fraction of
      entropy_coef over the run's num_updates updates.
    entropy_stop: GraphPlanner's training stops once the mean policy entropy falls below it.
    role_entropy_coef: weight of the bonus on the entropy of the role marginal (>= 0; 0: none,
      and nothing of it is computed; module notes).
    advantage_norm: "batch" (standardised over the batch's real transitions) or "per_type"
      (within each decision type; module notes).
  """
  learning_rate: float
  epochs: int
  num_minibatches: int
  clip_eps: float
  gamma: float
  gae_lambda: float
  value_coef: float
  entropy_coef: float
  max_grad_norm: float
  value_lr_multiplier: float = 1.0
  lr_schedule: str = "constant"
  lr_final_fraction: float = 0.0
  entropy_schedule: str = "constant"
  entropy_final_fraction: float = 0.0
  entropy_stop: float = 0.0
  role_entropy_coef: float = 0.0
  advantage_norm: str = "batch"

  def __post_init__(self):
    for key in ("lr_schedule", "entropy_schedule"):
      if getattr(self, key) not in SCHEDULES:
        raise errors.unknown_name(f"ppo.{key}", getattr(self, key), SCHEDULES)
    if self.advantage_norm not in ADVANTAGE_NORMS:
      raise errors.unknown_name("ppo.advantage_norm", self.advantage_norm, ADVANTAGE_NORMS)
    checks = [(self.epochs >= 1, "epochs >= 1"),
              (self.num_minibatches >= 1, "num_minibatches >= 1"),
              (0 < self.clip_eps < 1, "0 < clip_eps < 1"),
              (self.learning_rate > 0, "learning_rate > 0"),
              (0 <= self.gamma <= 1, "0 <= gamma <= 1"),
              (0 <= self.gae_lambda <= 1, "0 <= gae_lambda <= 1"),
              (self.entropy_coef >= 0, "entropy_coef >= 0"),
              (self.role_entropy_coef >= 0, "role_entropy_coef >= 0"),
              (self.max_grad_norm >= 0, "max_grad_norm >= 0 (0: no clipping)"),
              (self.value_lr_multiplier > 0, "value_lr_multiplier > 0"),
              (0 <= self.lr_final_fraction <= 1, "0 <= lr_final_fraction <= 1"),
              (0 <= self.entropy_final_fraction <= 1, "0 <= entropy_final_fraction <= 1")]
    for ok, what in checks:
      if not ok:
        raise errors.ConfigError(f"invalid PPO settings: need ppo.{what}")

  @property
  def reads_space(self) -> bool:
    """The update reads the action space: the role of each action (role_entropy_coef > 0) or
    the role kinds (advantage_norm "per_type")."""
    return self.role_entropy_coef > 0 or self.advantage_norm == "per_type"

  def lr_decay_steps(self, num_updates: int) -> int:
    """Gradient steps of the linear lr decay over a run of num_updates updates (0 = constant)."""
    if self.lr_schedule != "linear":
      return 0
    return int(num_updates) * int(self.epochs) * int(self.num_minibatches)

  def entropy_decay_updates(self, num_updates: int) -> int:
    """PPO updates of the linear entropy-coefficient decay (0 = constant)."""
    return int(num_updates) if self.entropy_schedule == "linear" else 0


@flax.struct.dataclass
class TrainingState:
  params: Any
  opt_state: Any
  rng: jax.Array
  update_step: jax.Array     # number of PPO updates applied


def gradient_clip(max_grad_norm: float) -> optax.GradientTransformation:
  """Global-norm clipping to max_grad_norm; 0: the gradients as they are."""
  if max_grad_norm > 0:
    return optax.clip_by_global_norm(max_grad_norm)
  return optax.identity()


def make_optimizer(settings: PPOSettings, *, num_updates: int = 1,
                   value_modules: tuple[str, ...] = VALUE_MODULES) -> optax.GradientTransformation:
  """Adam with global-norm clipping (none when max_grad_norm is 0); the top-level parameter
  modules named in `value_modules` learn at value_lr_multiplier x learning_rate (learners without
  a separate value network pass ()). With lr_schedule "linear" both rates fall linearly to
  lr_final_fraction of their initial value over settings.lr_decay_steps(num_updates) gradient
  steps, then stay there.
  """
  decay_steps = settings.lr_decay_steps(num_updates)

  def label(params):
    return {k: ("value" if k in value_modules else "policy") for k in params}

  def rate(lr):
    if decay_steps <= 0:
      return lr
    return optax.linear_schedule(lr, lr * settings.lr_final_fraction, int(decay_steps))
  lr = settings.learning_rate
  return optax.chain(
      gradient_clip(settings.max_grad_norm),
      optax.multi_transform({"policy": optax.adam(rate(lr)),
                             "value": optax.adam(rate(lr * settings.value_lr_multiplier))}, label))


def entropy_of(logits, mask):
  """[...] the entropy of the policy of masked logits [..., A] over its valid actions (mask)."""
  logp = jax.nn.log_softmax(logits)
  p = jnp.exp(logp)
  return -jnp.sum(jnp.where(mask, p * logp, 0.0), -1)


def role_entropy(logits, action_roles):
  """[...] the entropy of the role marginal of the policy of masked logits [..., A]: p(r) = sum
  of p(a) over the actions with action_roles[a] = r (action_roles: static int [A]); roles of
  probability 0 add nothing."""
  roles = np.asarray(action_roles)
  onehot = jnp.asarray(roles[:, None] == np.arange(int(roles.max()) + 1)[None], logits.dtype)
  p = jax.nn.softmax(logits) @ onehot                                       # [..., R]
  safe = jnp.where(p > 0, p, 1.0)
  return -jnp.sum(p * jnp.log(safe), -1)


def ppo_loss(logits: chex.Array, values: chex.Array, actions: chex.Array, old_logp: chex.Array,
             advantages: chex.Array, returns: chex.Array, mask: chex.Array, weights: chex.Array, *,
             clip_eps: float, value_coef: float, entropy_coef: float,
             role_entropy_coef: float = 0.0, action_roles=None):
  """Clipped PPO loss over a batch.

  Args:
    logits: [B, A] masked logits. values: [B]. actions, old_logp, advantages, returns: [B].
    mask: [B, A] valid actions. weights: [B] 1 for real transitions, 0 for padding.
    role_entropy_coef: weight of the role-marginal entropy bonus (a Python float; 0: the loss
      is the plain one, nothing computed).
    action_roles: static int [A], the role of every action (needed when role_entropy_coef > 0;
      given, the metrics also hold role_entropy).
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
  metrics = dict(loss=loss, policy_loss=policy_loss, value_loss=value_loss, entropy=entropy,
                 clipfrac=clipfrac, approx_kl=approx_kl, ratio_mean=jnp.sum(ratio * weights) / n)
  if role_entropy_coef < 0:
    raise ValueError(f"role_entropy_coef must be >= 0, got {role_entropy_coef}")
  if role_entropy_coef > 0 and action_roles is None:
    raise ValueError("the role entropy bonus needs the role of every action (action_roles)")
  if action_roles is not None:
    h_role = jnp.sum(role_entropy(logits, action_roles) * weights) / n
    if role_entropy_coef > 0:
      loss = loss - role_entropy_coef * h_role
    metrics.update(loss=loss, role_entropy=h_role)
  return loss, metrics


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


Forward = Callable[[Any, dict], tuple[jax.Array, jax.Array, jax.Array]]


def normalize_advantages(advantages: chex.Array, weights: chex.Array) -> chex.Array:
  """[N] advantages standardised over the real transitions (weights [N], 1 real, 0 padding)."""
  n = jnp.maximum(weights.sum(), 1.0)
  mean = jnp.sum(advantages * weights) / n
  std = jnp.sqrt(jnp.sum(jnp.square(advantages - mean) * weights) / n)
  return (advantages - mean) / (std + 1e-8)


def normalize_advantages_per_type(advantages: chex.Array, weights: chex.Array, types: chex.Array,
                                  num_types: int) -> chex.Array:
  """[N] advantages standardised within each type (types [N] in [0, num_types)) over its real
  transitions (weights [N]): each type with real transitions gets weighted mean 0 and std 1 (a
  type whose advantages are all equal, e.g. one transition, gets 0)."""
  def per_type(x):
    return jax.ops.segment_sum(x, types, num_types)
  n = jnp.maximum(per_type(weights), 1.0)
  mean = per_type(advantages * weights) / n
  centred = advantages - mean[types]
  std = jnp.sqrt(per_type(jnp.square(centred) * weights) / n)
  return centred / (std[types] + 1e-8)


def standardized_advantages(advantages: chex.Array, transitions: dict,
                            settings: PPOSettings) -> chex.Array:
  """The advantages the PPO loss reads: normalize_advantages over the batch (advantage_norm
  "batch"), or per decision type (transitions["decision_type"], batch_lib.with_decision_types)."""
  weights = transitions["weights"]
  if settings.advantage_norm == "batch":
    return normalize_advantages(advantages, weights)
  if "decision_type" not in transitions:
    raise ValueError("ppo.advantage_norm='per_type' needs the decision type of every transition "
                     "(batch_lib.with_decision_types)")
  return normalize_advantages_per_type(advantages, weights, transitions["decision_type"],
                                       len(batch_lib.DECISION_TYPES))


def predictor_loss(model: garnet_lib.GARNet, params, hist: dict):
  """GARNet's memory predictor's regression loss (model.memory_predictor): the weighted mean of
  0.5 (U(s_i) - y_i)^2 over the history rows' examples (history.predictor_pairs in hist)."""
  pred = model.apply({"params": params}, hist["pred_stats"], method=model.predict_utility)
  w = hist["pred_weight"]
  loss = 0.5 * jnp.sum(w * jnp.square(pred - hist["pred_target"])) / jnp.maximum(w.sum(), 1.0)
  return loss, dict(predictor_loss=loss)


def learn(forward: Forward, optimizer: optax.GradientTransformation, settings: PPOSettings,
          params, opt_state, key: jax.Array, batch: batch_lib.Batch, *,
          entropy_coef: chex.Array, constrain: Callable[[Any], Any] | None = None,
          aux_loss: Callable[[Any], tuple[jax.Array, dict]] | None = None,
          action_roles=None):
  """The PPO update of every learner here (call it inside the learner's jit).

  GAE over the batch's episodes (batch_lib.advantages), advantages standardised over the real
  transitions (settings.advantage_norm "per_type": within each decision type, read from the
  batch's decision_type), then settings.epochs passes, each over a fresh permutation of the N
  transitions cut into settings.num_minibatches minibatches, one clipped-PPO gradient step per
  minibatch (nested lax.scan).

  Args:
    forward: forward(params, minibatch transitions) -> (masked logits [B, A], values [B],
      valid-action mask [B, A]).
    optimizer: the learner's optax transformation (make_optimizer).
    params, opt_state: the learner's parameters and optimizer state.
    key: PRNG key of this update's permutations (split into one per epoch).
    batch: batch_lib.Batch; N (its transitions) a multiple of settings.num_minibatches.
    entropy_coef: the entropy weight of this update (entropy_coefficient).
    constrain: applied to the shuffled [num_minibatches, B, ...] transitions of each epoch
      (sharding constraints of a data-parallel update).
    aux_loss: aux_loss(params) -> (loss, metrics), added to every minibatch's loss (a supervised
      head trained beside the policy: GARNet's memory predictor).
    action_roles: static int [A], the role of every action (settings.role_entropy_coef > 0).
  Returns:
    (params, opt_state, metrics averaged over all steps: ppo_loss's, and grad_norm).
  """
  adv, returns = batch_lib.advantages(batch, settings.gamma, settings.gae_lambda)
  data = dict(batch.transitions, returns=returns,
              advantages=standardized_advantages(adv, batch.transitions, settings))
  role_kw = {}
  if settings.role_entropy_coef > 0:
    role_kw = dict(role_entropy_coef=settings.role_entropy_coef, action_roles=action_roles)
  n = data["actions"].shape[0]
  mb_size = n // settings.num_minibatches

  def loss_fn(params, mb):
    logits, values, mask = forward(params, mb)
    loss, metrics = ppo_loss(logits, values, mb["actions"], mb["old_logp"], mb["advantages"],
                             mb["returns"], mask, mb["weights"], clip_eps=settings.clip_eps,
                             value_coef=settings.value_coef, entropy_coef=entropy_coef, **role_kw)
    if aux_loss is not None:
      extra, extra_metrics = aux_loss(params)
      loss = loss + extra
      metrics = dict(metrics, **extra_metrics)
    return loss, metrics

  def epoch(carry, key):
    perm = jax.random.permutation(key, n)[:mb_size * settings.num_minibatches]
    shuffled = jax.tree_util.tree_map(
        lambda x: x[perm].reshape((settings.num_minibatches, mb_size) + x.shape[1:]), data)
    if constrain is not None:
      shuffled = constrain(shuffled)

    def minibatch(carry, mb):
      params, opt_state = carry
      (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, mb)
      updates, opt_state = optimizer.update(grads, opt_state, params)
      params = optax.apply_updates(params, updates)
      metrics["grad_norm"] = optax.global_norm(grads)
      return (params, opt_state), metrics
    return jax.lax.scan(minibatch, carry, shuffled)

  (params, opt_state), metrics = jax.lax.scan(epoch, (params, opt_state),
                                              jax.random.split(key, settings.epochs))
  return params, opt_state, jax.tree_util.tree_map(jnp.mean, metrics)


def make_update_fn(model: garnet_lib.GARNet, optimizer: optax.GradientTransformation,
                   settings: PPOSettings, *, num_updates: int = 1, num_chunks: int | None = None,
                   max_traces: int | None = None, mesh=None, space=None):
  """GARNet's update: update(state, hub_features, hist, batch) -> (state, metrics), jitted once
  per shape; `learn` with GARNet's forward pass (forward_batch).

  batch: batch_lib.Batch whose transitions hold obs (dict), actions, old_logp, weights, episode,
  step, hist_chunk [N], hist_count [N, A] (N a multiple of settings.num_minibatches).
  num_updates: the run's number of updates (the lr decay is the optimizer's; the entropy decay,
  settings.entropy_decay_updates(num_updates), is applied here at state.update_step).
  num_chunks: the chunk budget of the history inputs; None = N + 1 (each padded batch size N
  compiles once, so one function serves several padding buckets).
  hist: rows [H, F], segment [H] from HistoryMemory.update_inputs(..., num_chunks); in the
  summary ablation also summary [A, D] (PolicyRunner.history_input_array of the iteration); with
  a memory predictor also pred_stats [H, S], pred_target [H], pred_weight [H]
  (history.predictor_pairs), whose regression loss joins every minibatch's (predictor_loss).
  mesh: a jax.sharding.Mesh (axis parallel.DATA) of several devices: the update places its
  inputs (host data identical on every process) -- history rows sharded, transitions sharded, the
  episodes and the rest replicated -- and returns replicated state; N / num_minibatches must then
  be a multiple of the mesh size, and the history row count too (parallel.pad_rows). One device
  (or None): the plain jitted function, bit for bit the unsharded program.
  space: the action space (gp_jax.workflow.mdp.ActionSpace) whose roles and kinds
  settings.role_entropy_coef > 0 and advantage_norm "per_type" read (module notes); the decision
  types are then derived in the update from each observation's mask and step
  (batch_lib.with_decision_types).
  """
  sharded = parallel.is_sharded(mesh)
  action_roles = kinds = None
  if settings.reads_space:
    if space is None:
      raise ValueError("ppo.role_entropy_coef > 0 and ppo.advantage_norm='per_type' read the "
                       "action space: pass space")
    action_roles = garnet_lib.action_roles(space.size, space.num_llms)
    kinds = batch_lib.action_kinds(space)
  decay_updates = settings.entropy_decay_updates(num_updates)

  def chunks_of(batch) -> int:
    return num_chunks or batch.transitions["actions"].shape[0] + 1

  def constrain(shuffled):   # data-parallel minibatches: each device takes B / devices of them
    return jax.lax.with_sharding_constraint(shuffled, NamedSharding(mesh, P(None, parallel.DATA)))

  def update(state: TrainingState, hub_features, hist, batch: batch_lib.Batch):
    chunks = chunks_of(batch)
    if settings.advantage_norm == "per_type":
      batch = batch_lib.with_decision_types(batch, kinds)

    def forward(params, mb):
      logits, values = forward_batch(model, params, hub_features, hist, mb, chunks, mesh)
      return logits, values, mb["obs"]["mask"]
    ent_coef = entropy_coefficient(state.update_step, settings.entropy_coef, decay_updates,
                                   settings.entropy_final_fraction)
    rng, key = jax.random.split(state.rng)
    aux = None
    if "pred_stats" in hist:   # the memory predictor's examples (history.predictor_pairs)
      aux = lambda params: predictor_loss(model, params, hist)   # noqa: E731
    params, opt_state, metrics = learn(forward, optimizer, settings, state.params, state.opt_state,
                                       key, batch, entropy_coef=ent_coef,
                                       constrain=constrain if sharded else None, aux_loss=aux,
                                       action_roles=action_roles)
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
      budget = chunks_of(batch) * batch.transitions["hist_count"].shape[-1]
      rows_, segment = parallel.pad_rows(hist["rows"], hist["segment"], mesh.size, budget)
      hist = dict(hist, rows=rows_, segment=segment)
    hist = {k: parallel.put(v, rows if k in ("rows", "segment") else rep) for k, v in hist.items()}
    episodes = {k: parallel.put(getattr(batch, k), rep) for k in batch_lib.EPISODE_FIELDS}
    batch = batch.replace(transitions=parallel.put_tree(batch.transitions, rows), **episodes)
    return jitted(parallel.put_tree(state, rep), parallel.put(hub_features, rep), hist, batch)
  place_and_update.jitted = jitted
  return place_and_update


def compile_count(update) -> int:
  """Programs compiled so far by an update of make_update_fn (one per input shape)."""
  return getattr(update, "jitted", update)._cache_size()
