"""The PPO batch of every learner: padded transitions and the episodes' grid (GAE in the jit).

A `Batch` holds
  transitions  pytree of [N, ...] arrays, N a fixed padded size: the learner's inputs (obs, ...),
               actions [N], old_logp [N], weights [N] (1 real, 0 padding) and the cell
               (episode [N], step [N]) of each transition in the grid below;
  rewards      [E, T]   r_t of episode e (0 past its end),
  continues    [E, T]   1 where episode e goes on after step t, 0 at its last step (terminal) and
                        past its end; the discount gamma x continues is applied with GAE's lambda
                        inside the update (both from the learner's PPOSettings),
  values       [E, T+1] V(s_t) the rollout recorded (0 past the end: no bootstrap).
`build` makes one from finished episodes on the host; `advantages`, called inside the learner's
jitted update (gp_jax.rl.ppo.learn), runs GAE (gp_jax.rl.gae) over the grid and gathers each
transition's advantage and return A + V. E, T and N are fixed per learner (or taken from a few
buckets), so the update compiles once per shape.

Two layouts of the transitions:
  "packed"  the real transitions in episode order (or a chosen subset and order of them), then
            padding up to N;
  "grid"    N = E x T, transition (e, t) in slot e x T + t, empty cells padding.
Padding slots copy the last real transition (finite inputs, so weight 0 removes them exactly).
Optional transitions adv_override [N] and adv_override_on [N] (bool): where on, `advantages`
gives that advantage instead of GAE's (the return, the value target, stays GAE's A + V): the
root-credit option root_rollout (gp_jax/rl/root_credit.py) sets its root decisions so.

With gamma = 1 (ppo.gamma) the returns are undiscounted: with gae_lambda = 1 too, a transition's
advantage is the plain sum of the episode's rewards from its step on minus V(s_t), and its return
that sum (the episode's remaining reward; every episode ends, so nothing is bootstrapped).

Decision types (DECISION_TYPES; ppo.advantage_norm = "per_type" standardises advantages within
each): what an observation already holds, its mask and its step, says which kind of choice a
transition was, given the role kind of every action (action_kinds). The types of the rollout's
decision statistics (gp_jax/rl/rollout.py), by the same rules:
  root       the episode's first decision (step 0): the query's choice to split or to answer,
             whose advantage carries the whole episode;
  pending    a later decision whose mask holds a planner and an executor (plan or answer a
             sub-query);
  summarize  a decision whose mask holds a summarizer (a planned node whose children are
             answered; a verifier may be allowed beside it);
  other      every other decision: a node that can no longer be planned, the final answer.
`decision_types` computes them from the masks and steps (traceable, so GraphPlanner's update
derives them in its jit from the batch it is given); `with_decision_types` stores them in the
batch's transitions as decision_type [N].

Also here: the padded batch sizes of GraphPlanner's updates (one size, or a few buckets) and its
batch from rollout episodes (build_batch).
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import chex
import flax
import jax
import jax.numpy as jnp
import numpy as np

from gp_jax.graph import features as features_lib
from gp_jax.graph import history as history_lib
from gp_jax.rl import gae as gae_lib

LAYOUTS = ("packed", "grid")
DECISION_TYPES = ("root", "pending", "summarize", "other")   # module docstring
EPISODE_FIELDS = ("rewards", "continues", "values")
MAX_WASTE = 0.25   # buckets: largest padded share of a batch (beyond the smallest sizes)


@flax.struct.dataclass
class Batch:
  """One PPO update's data (module docstring)."""
  transitions: Any
  rewards: Any      # [E, T]
  continues: Any    # [E, T]
  values: Any       # [E, T + 1]


def build(transitions: Any, rewards: Sequence[Sequence[float]], values: Sequence[Sequence[float]],
          *, size: int, num_episodes: int, num_steps: int, layout: str = "packed",
          order: Sequence[int] | None = None) -> Batch:
  """A Batch from finished episodes (host arrays).

  Args:
    transitions: pytree of [n, ...] arrays: the n real transitions, episode 0's steps first, then
      episode 1's, ...; must hold actions [n] and old_logp [n].
    rewards, values: per episode e, its n_e rewards and recorded values (sum n_e = n; every
      episode ends at its last step).
    size: N, the padded transition count ("grid": num_episodes x num_steps).
    num_episodes, num_steps: E and T of the grid (>= the episodes and their longest length).
    layout: "packed" or "grid" (module docstring).
    order: "packed" only: indices of the transitions to place, in this order (default: all).
  Returns:
    the Batch; its weights mark the real transitions.
  """
  lengths = [len(r) for r in rewards]
  n = sum(lengths)
  if n == 0 or min(lengths) == 0:
    raise ValueError("a batch needs episodes of at least one transition")
  if len(values) != len(lengths) or any(len(v) != m for v, m in zip(values, lengths)):
    raise ValueError("rewards and values differ in length")
  if len(lengths) > num_episodes or max(lengths) > num_steps:
    raise ValueError(f"{len(lengths)} episodes of up to {max(lengths)} steps exceed the grid "
                     f"{num_episodes} x {num_steps}")
  E, T = num_episodes, num_steps
  grid_r = np.zeros((E, T), np.float32)
  grid_d = np.zeros((E, T), np.float32)
  grid_v = np.zeros((E, T + 1), np.float32)
  for e, (r, v) in enumerate(zip(rewards, values)):
    m = len(r)
    grid_r[e, :m] = r
    grid_d[e, :m - 1] = 1.0            # the last step is terminal
    grid_v[e, :m] = v
  episode = np.repeat(np.arange(len(lengths)), lengths).astype(np.int32)
  step = np.concatenate([np.arange(m) for m in lengths]).astype(np.int32)
  if layout == "packed":
    index = np.arange(n) if order is None else np.asarray(order, np.int64)
    if len(index) > size:
      raise ValueError(f"{len(index)} transitions exceed the batch size {size}")
    take = np.concatenate([index, np.full(size - len(index), index[-1])])
    weights = (np.arange(size) < len(index)).astype(np.float32)
  elif layout == "grid":
    if order is not None or size != E * T:
      raise ValueError(f"a grid batch has all {E} x {T} cells, in order")
    slots = episode * T + step
    take = np.full(size, n - 1)
    take[slots] = np.arange(n)
    weights = np.zeros(size, np.float32)
    weights[slots] = 1.0
  else:
    raise ValueError(f"unknown batch layout {layout!r}; known layouts: {', '.join(LAYOUTS)}")
  out = jax.tree_util.tree_map(lambda x: np.asarray(x)[take], transitions)
  out.update(episode=episode[take], step=step[take], weights=weights)
  return Batch(transitions=out, rewards=grid_r, continues=grid_d, values=grid_v)


def advantages(batch: Batch, gamma: float, gae_lambda: float) -> tuple[chex.Array, chex.Array]:
  """GAE advantages [N] and returns A + V [N] of the batch's transitions (0 for padding), with
  discount gamma and GAE lambda (the learner's PPOSettings). gamma = gae_lambda = 1: the
  undiscounted reward-to-go minus the recorded value, and the reward-to-go (module docstring).

  Traceable: the learner's jitted update calls it, so GAE runs in the same program as PPO."""
  discounts = gamma * batch.continues
  adv = gae_lib.batched_gae(batch.rewards, discounts, batch.values, gae_lambda)
  tr = batch.transitions
  e, t = tr["episode"], tr["step"]
  real = tr["weights"] > 0
  a = adv[e, t]
  returns = jnp.where(real, a + batch.values[e, t], 0.0)
  if "adv_override_on" in tr:   # static: only batches built with overrides carry the fields
    a = jnp.where(tr["adv_override_on"], tr["adv_override"], a)
  return jnp.where(real, a, 0.0), returns


def action_kinds(space) -> tuple[str, ...]:
  """The role kind of every action of an action space (gp_jax.workflow.mdp.ActionSpace), [A]."""
  return tuple(space.decode(a)[0].kind for a in range(space.size))


def decision_types(mask: chex.Array, step: chex.Array, kinds, xp=jnp) -> chex.Array:
  """The decision type (index into DECISION_TYPES) of each transition, int32 [N]: the one
  definition, used by the update (traced, xp=jnp) and by the rollout's statistics (xp=np).

  Args:
    mask: [N, A] the valid actions each decision read (its observation's mask).
    step: [N] the decision's step in its episode (0: the first).
    kinds: [A] the role kind of every action (action_kinds), static.
  """
  kinds = np.asarray(kinds)

  def allows(kind):
    return xp.any(mask & (kinds == kind), -1)
  root, pending, summarize, other = (DECISION_TYPES.index(t)
                                     for t in ("root", "pending", "summarize", "other"))
  later = xp.where(allows("planner") & allows("executor"), pending,
                   xp.where(allows("summarizer"), summarize, other))
  return xp.where(step == 0, root, later).astype(xp.int32)


def with_decision_types(batch: Batch, kinds) -> Batch:
  """The batch with transitions["decision_type"] [N] (decision_types of its observations' masks
  and steps; kinds: the role kind of every action). Traceable."""
  tr = batch.transitions
  types = decision_types(tr["obs"]["mask"], tr["step"], kinds)
  return batch.replace(transitions=dict(tr, decision_type=types))


# ---- GraphPlanner's batches ----------------------------------------------------------------------

def batch_size_for(episodes_per_iter: int, max_calls: int, num_minibatches: int,
                   devices: int = 1) -> int:
  """Fixed padded transition count of every update: all the calls the episodes could make,
  rounded up to a multiple of 8 per minibatch (one shape per run, so one compilation), and of the
  device count per minibatch (minibatches are split across the mesh)."""
  unit = math.lcm(8, devices) * num_minibatches
  return -(-episodes_per_iter * max_calls // unit) * unit


def padding_buckets(max_size: int, unit: int) -> list[int]:
  """Padded batch sizes (multiples of `unit`, the last one `max_size`) such that a batch of n
  transitions, padded to the smallest size >= n, wastes at most MAX_WASTE of it once n > 3 units
  (below that, at most one unit): each size is at most 4/3 of the one before."""
  sizes = [unit]
  while sizes[-1] < max_size:
    grow = int(sizes[-1] / (1 - MAX_WASTE)) // unit * unit
    sizes.append(min(max(grow, sizes[-1] + unit), max_size))
  return sizes


def build_batch(episodes: Sequence[Any], history: history_lib.HistoryMemory | None, *,
                batch_size: int, num_episodes: int, max_calls: int,
                num_hubs: int, predictor: bool = False,
                root_advantages: dict[int, float] | None = None) -> tuple[Batch, dict]:
  """GraphPlanner's packed Batch of `batch_size` transitions, and the history inputs, from
  finished rollout episodes (gp_jax.rl.rollout.Episode).

  num_episodes, max_calls: the grid (the update's episode count and the MDP's call bound).
  history: the memory whose per-hub sums the decisions read (transductive), else None.
  predictor: the model has a memory predictor: the history inputs also hold its examples, one
  per history row (history.predictor_pairs).
  root_advantages: {episode index: advantage} replacing GAE's at those episodes' first
  transition (adv_override, module docstring); None: the batch has no override fields."""
  obs = [o for e in episodes for o in e.obs]
  snaps = [s for e in episodes for s in e.snapshots]
  n = len(obs)
  if n > batch_size:
    raise ValueError(f"{n} transitions exceed the batch size {batch_size}")
  if history is None:   # no per-transition sums (inductive, summary, retrieval): empty memory
    history = history_lib.HistoryMemory(obs[0]["rows"].shape[-1], num_hubs, capacity=0)
    snaps = np.zeros(len(snaps), np.int64)
  hist_inputs = history.update_inputs(np.asarray(snaps), num_chunks=batch_size + 1)
  if predictor:
    hist_inputs.update(history_lib.predictor_pairs(history.rows, history.hubs, num_hubs,
                                                   size=hist_inputs["rows"].shape[0]))
  transitions = dict(obs=features_lib.stack(obs),
                     actions=np.asarray([a for e in episodes for a in e.actions], np.int32),
                     old_logp=np.asarray([l for e in episodes for l in e.logp], np.float32),
                     hist_chunk=hist_inputs.pop("chunk").astype(np.int32),
                     hist_count=hist_inputs.pop("count").astype(np.float32))
  if root_advantages is not None:
    first = np.cumsum([0] + [len(e.actions) for e in episodes])[:-1]
    on, value = np.zeros(n, bool), np.zeros(n, np.float32)
    for i, v in root_advantages.items():
      on[first[i]], value[first[i]] = True, v
    transitions.update(adv_override=value, adv_override_on=on)
  batch = build(transitions, [e.rewards for e in episodes], [e.values for e in episodes],
                size=batch_size, num_episodes=num_episodes, num_steps=max_calls)
  return batch, hist_inputs
