"""The online learner's compute (docs/serving.md, "Learning while serving"): one PPO update of
the serving weights from served episodes whose feedback arrived, and the KL and canarys on
the candidate it makes. It holds no server state: given the serving learner state, the episodes
and the memory view it returns the candidate and the guards' verdict, so it runs in the learner's
own process (learner_process.py) and, in tests, in the caller's.

  update   the project's one jitted PPO update (gp_jax/rl/ppo.py through
           gp_jax/runs/ppo_config.make_update) on the PPO batch of the episodes
           (gp_jax/rl/batch.build_batch), every transition given the memory as it is when the
           update starts.
  KL       mean KL(serving || candidate) over the update's decisions; past `max_kl` the step is
           shortened (serving + beta x (update - serving), beta = 1/2, 1/4, ..., `kl_backtrack`
           halvings; the first within the bound is kept, as TRPO's line search does), refused
           when none is.
  canary   both weights run the canary queries (the first `canary_size` of the simulated test
           split) greedily, scored by the simulator's expected utility minus alpha x cost; a
           candidate worse than the serving weights by more than `canary_margin` is refused.
           The canary is anchored: the best accepted version so far (the anchor, learner.py)
           runs the same queries on the same memory and pool, and a candidate worse than it by
           more than the margin is refused too, so small losses cannot add up version after
           version.
           The canary follows the pool: its queries meet the pool that the latest of the
           update's served queries met (a served pool event that acts there acts on every
           canary query; gp_jax/sim/events.PoolEvents.at), so after the pool changes a
           candidate is judged on the pool it will serve, not on the one the router trained on.
           Without served events, or when no served query of the update is a simulated one,
           the canary meets the configured pool.
"""
from __future__ import annotations

import asyncio
import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from gp_jax.rl import batch as batch_lib
from gp_jax.rl import ppo
from gp_jax.rl import rollout
from gp_jax.runs import ppo_config
from gp_jax.sim import events as sim_events

CANARY_SPLIT = "test"   # the simulated split the canary queries come from


def shortened(serving, update, beta: float):
  """Parameters serving + beta x (update - serving), leaf by leaf (float32 kept)."""
  return jax.tree_util.tree_map(
      lambda a, b: (np.asarray(a) + beta * (np.asarray(b) - np.asarray(a))).astype(
          np.asarray(a).dtype), serving, update)


def _log_softmax(x: np.ndarray) -> np.ndarray:
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def policy_kl(old_logits: np.ndarray, new_logits: np.ndarray, mask: np.ndarray,
              weights: np.ndarray) -> float:
  """Mean KL(old || new) over the real decisions (weights 1) of masked logits [B, A]."""
  lo, ln = _log_softmax(old_logits.astype(np.float64)), _log_softmax(new_logits.astype(np.float64))
  each = np.where(mask, np.exp(lo) * (lo - ln), 0.0).sum(-1)
  return float((each * weights).sum() / max(weights.sum(), 1.0))


def learning_episode(episode: rollout.Episode) -> rollout.Episode:
  """What the update reads of a served episode (its decisions and rewards, and its query, whose
  position tells the canary the pool it met), without the workflow state and embeddings that it
  does not read (smaller to send to the learner's process)."""
  return rollout.Episode(episode.query, None, 0, None, None, None, obs=list(episode.obs),
                         actions=list(episode.actions), logp=list(episode.logp),
                         values=list(episode.values), rewards=list(episode.rewards),
                         utility=float(episode.utility))


class GuardedUpdate:
  """One guarded update (module docstring).

  Args:
    settings: the server's learning settings (online.LearnSettings: every, canary_size,
      canary_margin, max_kl, kl_backtrack are read).
    config, system, model: the served router's config, its system (gp_jax/runs/system) and GARNet.
  """

  def __init__(self, settings, *, config, system, model):
    self.settings = settings
    self.model = model
    self.featurizer = system.featurizer
    self.space = system.space
    self.hub_features = jnp.asarray(system.featurizer.hub_features)
    optimizer = ppo_config.make_optimizer(config)
    self.update, self.batch_size = ppo_config.make_update(config, system, model, optimizer,
                                                          episodes=settings.every)
    self.max_calls = ppo_config.max_calls(system)
    self.alpha = float(config.alpha)
    self.predictor = bool(config.model.memory_predictor)
    self.canary_queries = list(system.test_queries[:settings.canary_size])
    self.system = system
    self._canary_envs = {None: system.env(self.alpha, reward="expected")}   # by pool events
    # The guards' own policy (canary rollouts and the KL's logits), apart from the serving one.
    self.runner = rollout.PolicyRunner(model, system.featurizer.hub_features,
                                       len(self.canary_queries), featurizer=system.featurizer)

  def _batch(self, episodes: list[rollout.Episode], view):
    n_rows = len(view) if view is not None else 0
    episodes = [dataclasses.replace(e, snapshots=[n_rows] * len(e.actions)) for e in episodes]
    return batch_lib.build_batch(episodes, view, batch_size=self.batch_size,
                                 num_episodes=self.settings.every, max_calls=self.max_calls,
                                 num_hubs=self.space.size,
                                 predictor=self.predictor)

  def warm_up(self, state: ppo.TrainingState, obs: dict, view) -> None:
    """Compiles the update, the KL's scoring and the canary's policy (on a batch of copies of
    one observation; nothing is kept), so the first update takes as long as the others."""
    action = int(np.flatnonzero(obs["mask"])[0])
    episode = rollout.Episode(None, None, 0, None, None, None, obs=[obs], actions=[action],
                              logp=[0.0], values=[0.0], rewards=[0.0])
    batch, hist = self._batch([episode] * self.settings.every, view)
    jax.block_until_ready(self.update(jax.tree_util.tree_map(jnp.array, state),
                                      self.hub_features, hist, batch))
    self._logits(state.params, batch.transitions["obs"], view)
    self.canary(state.params, view, None)

  def step(self, state: ppo.TrainingState, episodes: list[rollout.Episode], view,
           anchor=None) -> dict:
    """One update of `state` (the serving learner state) from `episodes` over the memory `view`,
    and the guards on it. Returns {state: the candidate's learner state (host arrays), metrics
    (the PPO update's), seconds, beta (the step kept), full_step_kl, kl, canary (parent,
    candidate and anchor rewards; None when the KL limit refused), reason (None: it may serve;
    "kl" or "canary"), why}. anchor: the parameters of the best accepted version when it is not
    the serving one (None: the serving version is the anchor)."""
    t0 = time.perf_counter()
    batch, hist = self._batch(episodes, view)
    start = jax.tree_util.tree_map(jnp.array, state)
    new, metrics = self.update(start, self.hub_features, hist, batch)
    new = jax.device_get(new)
    metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
    seconds = time.perf_counter() - t0
    obs, weights = batch.transitions["obs"], batch.transitions["weights"]
    params, beta, full_kl, kl = self.backtrack(state.params, new.params, obs, weights, view)
    new = new.replace(params=params)
    verdict = self.judge(state.params, new.params, obs, weights, view, kl=kl,
                         pool=self.canary_pool(episodes), anchor=anchor)
    return dict(verdict, state=new, metrics=metrics, seconds=seconds, beta=beta,
                full_step_kl=full_kl)

  def backtrack(self, serving, update, obs: dict, weights: np.ndarray, view):
    """The candidate's parameters: the full update when its KL is within max_kl, else the
    first of `kl_backtrack` halvings of its step that is (else the full update, which the KL
    guard then refuses). Returns (params, beta, the full update's KL, the returned params' KL)."""
    s = self.settings
    old = self._logits(serving, obs, view)
    kl = full = policy_kl(old, self._logits(update, obs, view), obs["mask"], weights)
    candidate, beta = update, 1.0
    for _ in range(s.kl_backtrack):
      if kl <= s.max_kl:
        break
      beta /= 2.0
      candidate = shortened(serving, update, beta)
      kl = policy_kl(old, self._logits(candidate, obs, view), obs["mask"], weights)
    if kl > s.max_kl:
      return update, 1.0, full, full
    return candidate, beta, full, kl

  def judge(self, serving, candidate, obs: dict, weights: np.ndarray, view,
            kl: float | None = None, pool: sim_events.PoolEvents | None = None,
            anchor=None) -> dict:
    """The KL and canarys on `candidate` against the `serving` weights: {kl, canary
    (parent, candidate and anchor rewards, the bar the candidate had to reach, the canary's
    pool events; None when the KL limit already refused), reason (None: the candidate may serve;
    "kl" or "canary"), why}. obs, weights: the update's decisions; kl: the candidate's KL when
    already computed (backtrack); pool: the canary's pool events (canary_pool; None: the
    configured pool); anchor: the best accepted version's parameters (None: `serving` is it).
    The candidate must reach max(serving, anchor) - canary_margin."""
    s = self.settings
    if kl is None:
      kl = policy_kl(self._logits(serving, obs, view), self._logits(candidate, obs, view),
                     obs["mask"], weights)
    out = dict(kl=kl, canary=None, reason=None, why="")
    if kl > s.max_kl:
      return dict(out, reason="kl", why=f"KL {kl:.4g} > max_kl {s.max_kl:g}")
    old, new = self.canary(serving, view, pool), self.canary(candidate, view, pool)
    best = old if anchor is None else self.canary(anchor, view, pool)
    bar = max(old, best) - s.canary_margin
    out["canary"] = dict(parent=old, candidate=new, anchor=best, bar=bar,
                         queries=len(self.canary_queries),
                         pool=[dataclasses.asdict(e) for e in pool.events] if pool else [])
    if new < bar:
      return dict(out, reason="canary", why=f"canary reward {new:.4f} < max(serving {old:.4f}, "
                  f"anchor {best:.4f}) - margin {s.canary_margin:g}")
    return out

  def _logits(self, params, obs: dict, view) -> np.ndarray:
    self.runner.set_params(params, view)
    return self.runner.scores(obs)[0]

  def canary_pool(self, episodes: list[rollout.Episode]) -> sim_events.PoolEvents | None:
    """The canary's pool (module docstring): the pool the latest of `episodes` whose query is a
    simulated one met, as events on the canary's split; None for the configured pool."""
    world = self.system.world
    if world is None or world.events is None:
      return None
    for e in reversed(episodes):
      node = world.lookup(e.query.query) if e.query is not None else None
      if node is not None:
        return world.events.at(node.key, splits=(CANARY_SPLIT,))
    return None

  def canary(self, params, view, pool: sim_events.PoolEvents | None = None) -> float:
    """Mean reward (expected utility - alpha x cost) of greedy episodes of the canary queries
    with `params` over the memory `view` (frozen: the episodes do not join it), on the pool
    under the events `pool` (None: the configured pool)."""
    key = pool.events if pool else None
    if key not in self._canary_envs:
      self._canary_envs[key] = self.system.with_pool_events(pool).env(self.alpha,
                                                                      reward="expected")
    self.runner.set_params(params, view)
    episodes = asyncio.run(rollout.run_episodes(
        self._canary_envs[key], self.featurizer, self.runner, self.canary_queries,
        key=jax.random.PRNGKey(0), greedy=True, history=view, grow_history=False,
        seed_salt="canary"))
    return float(np.mean([e.episode_return for e in episodes]))
