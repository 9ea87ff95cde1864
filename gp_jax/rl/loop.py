"""GraphPlanner training: rollouts on the routing MDP, jitted PPO updates, checkpoints, metrics.

`train(workdir, env=..., model=..., update=..., settings=...)` is the learner's whole run, given
explicit pieces (gp_jax/runs/train.py assembles them from a config). The host loop (not jittable:
LLM calls) per iteration: roll out `episodes_per_iter` training queries with the sampled policy,
build one padded batch (GAE in JAX), apply the jitted PPO update, evict history beyond capacity,
refresh the history hub sums for the new parameters, log, checkpoint. Resuming from `workdir`
continues from the latest checkpoint (params, optimizer, history memory, PRNG state, counters) and
reproduces the run.

Each iteration's record goes to metrics.jsonl and, its numbers, to a TensorBoard event file in the
workdir (gp_jax/util/tb_events.py; step: the training episodes so far). Besides the update's
metrics and the episodes' means, a record says how the sampling policy decomposes:
  split_rate      share of the iteration's episodes with at least one Planner call;
  p_planner_root  mean over its episodes of the probability the first decision's distribution put
                  on the planner actions (1 in forced-planner episodes: their first mask holds
                  planners only);
  entropy/<type>  mean entropy (nats) of the distributions the decisions of that type were drawn
                  from, types root, pending, summarize, other (gp_jax/rl/rollout.py); None when the
                  iteration made no decision of the type. (`entropy` is the PPO update's mean over
                  its transitions.)
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import pathlib
import sys
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from gp_jax import errors
from gp_jax import files
from gp_jax import progress as progress_lib
from gp_jax.graph import features as features_lib
from gp_jax.graph import garnet as garnet_lib
from gp_jax.graph import history as history_lib
from gp_jax.rl import batch as batch_lib
from gp_jax.rl import checkpoint as checkpoint_lib
from gp_jax.rl import parallel
from gp_jax.rl import ppo
from gp_jax.rl import rollout
from gp_jax.rl import root_credit
from gp_jax.types import Query
from gp_jax.util import aio
from gp_jax.util import buckets as buckets_lib
from gp_jax.util import tb_events
from gp_jax.workflow import env as env_lib


PADDINGS = ("fixed", "buckets")   # train.padding


class MetricsLog:
  """metrics.jsonl in the workdir; on resume, lines past the restored iteration are dropped.

  A run killed while appending can leave a partial last line: it belongs to an iteration past
  the checkpoint, so it is dropped like the others. A malformed line before it is a DataError.
  Every record's numbers also go to a TensorBoard event file beside it (tb_events.EventWriter, at
  step record["episodes"]), a new file per run or resume (the event files are never rewritten:
  TensorBoard replaces the points of steps written again). A record that cannot be written to
  either is a StorageError."""

  def __init__(self, path: pathlib.Path, keep_through_iteration: int):
    self.path = path
    self.events = tb_events.EventWriter(path.parent)
    lines = [l for l in (path.read_text().splitlines() if path.exists() else []) if l.strip()]
    kept = []
    for i, l in enumerate(lines):
      try:
        it = json.loads(l).get("iteration", -1)
      except json.JSONDecodeError as e:
        if i == len(lines) - 1:
          break
        raise errors.DataError(f"{path}: line {i + 1}: not valid JSON ({e.msg})") from None
      if it <= keep_through_iteration:
        kept.append(l)
    files.write_atomic(path, "".join(l + "\n" for l in kept), "the training metrics")

  def write(self, record: dict) -> None:
    with files.storage_errors(self.path, "the training metrics"), self.path.open("a") as f:
      f.write(json.dumps(record, sort_keys=True) + "\n")
    self.events.scalars(int(record.get("episodes", record.get("iteration", 0))), record)


HISTORY_MODES = ("transductive", "inductive", "summary", "retrieval")   # model.history


def init_state(model, featurizer, optimizer, seed: int) -> ppo.TrainingState:
  spec = featurizer.spec
  obs = dict(task=np.zeros(spec.text_dim, np.float32), query=np.zeros(spec.text_dim, np.float32),
             state=np.zeros(spec.state_dim, np.float32),
             rows=np.zeros((spec.max_rows, spec.row_dim), np.float32),
             row_hub=np.full(spec.max_rows, spec.num_actions, np.int32),
             row_valid=np.zeros(spec.max_rows, bool), mask=np.ones(spec.num_actions, bool))
  key = jax.random.PRNGKey(seed)
  init_key, rng = jax.random.split(key)
  params = model.init(init_key, jnp.asarray(featurizer.hub_features),
                      jnp.zeros((2, spec.row_dim)), obs)["params"]
  return ppo.TrainingState(params=params, opt_state=optimizer.init(params), rng=rng,
                           update_step=jnp.zeros((), jnp.int32))


def _shares(n: int, parts: int) -> list[tuple[int, int]]:
  """Contiguous (start, stop) slices of n items over `parts` processes, sizes differing by <= 1."""
  cuts = [n * p // parts for p in range(parts + 1)]
  return list(zip(cuts[:-1], cuts[1:]))


@dataclasses.dataclass(frozen=True)
class LoopSettings:
  """The host loop's plain settings (the run layer reads them from config.train, .ppo, .model).

  Attributes:
    episodes: training episodes of the run; ceil(episodes / episodes_per_iter) iterations.
    episodes_per_iter: episodes rolled out per PPO update.
    parallel: episodes in flight at once, over all processes.
    seed: the run's seed: parameter init, query order, rollout keys.
    checkpoint_every: iterations between "latest" checkpoints (the last iteration always saves).
      The best state by running reward is kept in memory when it improves and written as "best"
      together with the next "latest", so at most one best write per latest write.
    entropy_stop: the run stops early once the policy entropy of an update falls below this.
    entropy_stop_min_episodes: ... but not before this many training episodes have run (0: from
      the first update).
    max_calls: the MDP's bound on one episode's calls (the batch's episode grid).
    history: the history mode (HISTORY_MODES): which memory the decisions read and grow.
    history_capacity: rows the history memory keeps after each update's eviction.
    background_checkpoints: write checkpoints in a thread while the run goes on (one process;
      a gain where cores are idle: orbax's writes compress, so they cost CPU time).
    predictor: the model has a memory predictor (GARNet.memory_predictor): every update also
      gets its examples from the history rows (history.predictor_pairs).
    force_planner_episodes: the run's first this many training episodes (counted from the start
      of the run, over resumes: episode j is query j of the run's stream) take their first step
      among the planner actions only (the released code's forced-planner episodes; 0: none).
    root_floor: the behaviour policy's floor e at each training episode's first decision
      (gp_jax/rl/root_credit.py; 0: none).
    root_rollout: per iteration, the first this many episodes' root advantages come from paired
      greedy continuations (root_credit.py; 0: none; one process only).
  """
  episodes: int
  episodes_per_iter: int
  parallel: int
  seed: int
  checkpoint_every: int
  entropy_stop: float
  max_calls: int
  history: str
  history_capacity: int
  background_checkpoints: bool = False
  predictor: bool = False
  force_planner_episodes: int = 0
  entropy_stop_min_episodes: int = 0
  root_floor: float = 0.0
  root_rollout: int = 0

  @property
  def iterations(self) -> int:
    return math.ceil(self.episodes / self.episodes_per_iter)

  def planner_first(self, it: int) -> int:
    """How many of iteration `it`'s episodes (its first ones) are forced-planner episodes: the
    episodes before force_planner_episodes in the run's order."""
    return min(max(self.force_planner_episodes - it * self.episodes_per_iter, 0),
               self.episodes_per_iter)


@dataclasses.dataclass(frozen=True)
class LoopState:
  """Where a run stands after an iteration (the checkpoints' JSON metadata); a fresh run's
  before the first. Changed only by `advanced`.

  Attributes:
    iteration: the last finished iteration (-1: none yet).
    episodes: training episodes rolled out so far.
    running_reward: exponential average (0.9) of the iterations' mean episode return (None: no
      iteration yet).
    best_running: the highest running reward so far.
    best_iteration: the iteration that reached it (-1: none).
    stopped_early: the policy entropy fell below settings.entropy_stop (once at least
      settings.entropy_stop_min_episodes episodes had run).
    padded_size: with bucket padding, the padded transitions of the updates (0: none yet, or
      fixed padding); kept so that a resumed run pads as the uninterrupted one.
  """
  iteration: int = -1
  episodes: int = 0
  running_reward: float | None = None
  best_running: float = -math.inf
  best_iteration: int = -1
  stopped_early: bool = False
  padded_size: int = 0

  def advanced(self, it: int, *, episodes: int, episode_return: float, entropy: float,
               entropy_stop: float, padded_size: int,
               entropy_stop_min_episodes: int = 0) -> "LoopState":
    """The state after iteration `it`: its episodes (the run's so far), mean episode return,
    policy entropy and padded size. The run stops once the entropy is below entropy_stop and at
    least entropy_stop_min_episodes episodes have run."""
    running = (episode_return if self.running_reward is None
               else 0.9 * self.running_reward + 0.1 * episode_return)
    best = running > self.best_running
    return LoopState(iteration=it, episodes=episodes, running_reward=running,
                     best_running=running if best else self.best_running,
                     best_iteration=it if best else self.best_iteration,
                     stopped_early=self.stopped_early or (
                         entropy < entropy_stop and episodes >= entropy_stop_min_episodes),
                     padded_size=padded_size)

  def record(self) -> dict:
    """The JSON metadata of a checkpoint (and the run's summary)."""
    return dataclasses.asdict(self)

  @classmethod
  def from_record(cls, meta: dict) -> "LoopState":
    """The state a checkpoint's metadata records. Keys added after a checkpoint was written
    (padded_size) take their defaults; keys that are no field (the checkpoint's history_rows)
    are left out."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in meta.items() if k in names})


@dataclasses.dataclass
class _Loop:
  """What every iteration of one run uses (built once by `train`)."""
  env: env_lib.WorkflowEnv
  featurizer: features_lib.Featurizer
  queries: list[Query]
  update: Callable
  batch_size: int
  buckets: list[int] | None
  settings: LoopSettings
  history: history_lib.HistoryMemory
  runner: rollout.PolicyRunner
  hub_features: jax.Array
  slots: int   # episodes in flight per process
  pending_best: checkpoint_lib.Write | None = None   # a best not yet written


def train(workdir: str | pathlib.Path, *, env: env_lib.WorkflowEnv,
          featurizer: features_lib.Featurizer, queries: list[Query], model: garnet_lib.GARNet,
          optimizer, update: Callable, batch_size: int, settings: LoopSettings,
          buckets: list[int] | None = None, rollout_mesh=None, verbose: bool = True,
          before_iteration: Callable[[int], None] | None = None) -> dict:
  """Trains the policy `model` on `env` with PPO; resumes from the latest checkpoint in workdir.

  The caller (gp_jax/runs/train.py) has checked workdir's config record. Several processes
  (jax.distributed): each runs its share of the rollouts, the update is one SPMD program, only
  process 0 writes metrics; checkpoints are written by all, as orbax needs.

  Args:
    workdir: checkpoints/ and metrics.jsonl go here.
    env: the routing environment; its pool's counters are logged, its action space sizes the
      history memory.
    featurizer: observations of the env's states (spec, hub features).
    queries: the training queries, drawn in per-epoch shuffles of settings.seed.
    model: the policy-value network (GARNet or an ablation).
    optimizer: the PPO optimizer; the state's opt_state is made with it.
    update: the jitted PPO update, (state, hub_features [A, F], hist_inputs, batch) ->
      (state, metrics).
    batch_size: padded transitions of every update (with buckets: the largest bucket).
    settings: the loop's plain settings.
    buckets: padded batch sizes to choose from per iteration (None: always batch_size).
    rollout_mesh: this process's devices for the rollouts' history refresh (None: one device).
    verbose: progress bar and resume note (pass False on processes other than 0).
    before_iteration: called with each iteration's index before its rollouts (a training pool
      that changes between iterations, gp_jax/sim/perturb.py).
  Returns:
    iteration, episodes, running_reward, best_running, best_iteration, stopped_early of the
    last iteration, and train_seconds (this call's wall time).
  """
  workdir = pathlib.Path(workdir)
  procs, rank = jax.process_count(), jax.process_index()
  if settings.root_rollout and procs > 1:
    raise errors.ConfigError("train.root_rollout runs in one process (its continuations run on "
                             "the learner's process): set it to 0 with several processes")
  state = init_state(model, featurizer, optimizer, settings.seed)
  # The history memory grows in every mode but inductive; only transductive sums its rows.
  history = history_lib.HistoryMemory(featurizer.spec.row_dim, env.space.size,
                                      capacity=int(settings.history_capacity),
                                      headroom=batch_size)
  ckpt = checkpoint_lib.Checkpointer(workdir / "checkpoints",
                                     background=settings.background_checkpoints)
  state, progress = _restore(ckpt, state, history, verbose)
  # Steps past the restored state (a best saved after the last latest, a damaged step) are
  # written again by this run; left in place they would collide with it or be evaluated.
  # Every process calls it: orbax's delete ends in a barrier of all processes.
  ckpt.discard_after(progress.iteration)
  log = MetricsLog(workdir / "metrics.jsonl", progress.iteration) if rank == 0 else None
  slots = -(-int(settings.parallel) // procs)
  runner = rollout.PolicyRunner(model, featurizer.hub_features, slots * procs,
                                featurizer=featurizer, mesh=rollout_mesh)
  loop = _Loop(env=env, featurizer=featurizer, queries=queries, update=update,
               batch_size=batch_size, buckets=buckets, settings=settings, history=history,
               runner=runner, hub_features=jnp.asarray(featurizer.hub_features), slots=slots)
  runner.set_params(state.params, history if _grows(settings) else None)
  n_iters = settings.iterations
  t0 = time.time()
  bar = None
  if verbose and progress.iteration + 1 < n_iters and not progress.stopped_early:
    bar = progress_lib.Progress("train", n_iters, unit="iter")
  try:
    for it in range(progress.iteration + 1, n_iters):
      if progress.stopped_early:
        break
      if before_iteration is not None:
        before_iteration(it)
      state, progress, rec = _iteration(loop, state, progress, it)
      if log is not None:
        log.write(rec)
      if bar is not None:
        bar.update(it + 1, episodes=progress.episodes, reward=f"{rec['episode_return']:+.3f}",
                   running=f"{progress.running_reward:+.3f}", entropy=f"{rec['entropy']:.2f}")
      _checkpoint(ckpt, loop, state, progress)
  except BaseException:
    with contextlib.suppress(Exception):   # the write under way finishes; the first error wins
      ckpt.close()
    raise
  if bar is not None:
    bar.close()
  ckpt.close()
  return dict(progress.record(), train_seconds=time.time() - t0)


def _grows(settings: LoopSettings) -> bool:
  """Whether finished episodes join the history memory (every mode but inductive)."""
  return settings.history != "inductive"


def _restore(ckpt: checkpoint_lib.Checkpointer, state: ppo.TrainingState,
             history: history_lib.HistoryMemory,
             verbose: bool) -> tuple[ppo.TrainingState, LoopState]:
  """(state, loop state) of the latest checkpoint (history restored in place), or of a fresh
  run."""
  try:
    restored = ckpt.restore(jax.tree_util.tree_map(np.asarray, state), history)
  except BaseException:
    ckpt.close()
    raise
  if restored is None:
    return state, LoopState()
  progress = LoopState.from_record(restored.meta)
  if verbose:
    print(f"resumed from iteration {progress.iteration} ({progress.episodes} episodes, "
          f"{len(history)} history rows)", file=sys.stderr)
  return jax.tree_util.tree_map(jnp.asarray, restored.state), progress


def _rollouts(loop: _Loop, it: int) -> list[rollout.Episode]:
  """The episodes of iteration `it`, in query order (several processes: each rolls out its
  share, then all gather every episode)."""
  s = loop.settings
  procs, rank = jax.process_count(), jax.process_index()
  start = it * s.episodes_per_iter
  batch_q = [loop.queries[i] for i in _query_order(len(loop.queries), s.seed, start,
                                                    s.episodes_per_iter)]
  shard = None
  if procs > 1:
    lo, hi = _shares(len(batch_q), procs)[rank]
    batch_q = batch_q[lo:hi]
    shard = rollout.RolloutShard(index_offset=lo, slots=loop.slots,
                                 allgather=parallel.allgather_objects)
  memory = _grows(s)
  history = loop.history if memory else None
  episodes = aio.run(rollout.run_episodes(
      loop.env, loop.featurizer, loop.runner, batch_q,
      key=jax.random.fold_in(jax.random.PRNGKey(s.seed + 1), it),
      greedy=False, history=history, grow_history=memory, seed_salt=(s.seed, it), shard=shard,
      planner_first=s.planner_first(it), root_floor=s.root_floor))
  if procs > 1:   # every process builds the same batch from all the episodes, in query order
    episodes = [e for part in parallel.allgather_objects(episodes) for e in part]
  return episodes


def _iteration(loop: _Loop, state: ppo.TrainingState, progress: LoopState,
               it: int) -> tuple[ppo.TrainingState, LoopState, dict]:
  """One iteration: rollouts, one PPO update, history eviction and refresh; returns the new
  training state, the loop state after it and the metrics record."""
  s = loop.settings
  t_roll = time.time()
  episodes = _rollouts(loop, it)
  root, root_rec = _root_rollout(loop, it, episodes) if s.root_rollout else (None, {})
  t_upd = time.time()
  size = _padded_size(loop, progress.padded_size, sum(len(e.rewards) for e in episodes))
  batch, hist_inputs = batch_lib.build_batch(
      episodes, loop.history if s.history == "transductive" else None, batch_size=size, num_episodes=s.episodes_per_iter, max_calls=s.max_calls,
      num_hubs=loop.env.space.size, predictor=s.predictor, root_advantages=root)
  if s.history == "summary":   # the summary every decision of this iteration read
    hist_inputs["summary"] = loop.runner.history_input_array()
  state, m = loop.update(state, loop.hub_features, hist_inputs, batch)
  m = {k: float(v) for k, v in jax.device_get(m).items()}
  loop.history.evict()
  loop.runner.set_params(state.params, loop.history if _grows(s) else None)
  ret = float(np.mean([e.episode_return for e in episodes]))
  progress = progress.advanced(it, episodes=it * s.episodes_per_iter + len(episodes),
                               episode_return=ret, entropy=m["entropy"],
                               entropy_stop=s.entropy_stop,
                               padded_size=0 if loop.buckets is None else size,
                               entropy_stop_min_episodes=s.entropy_stop_min_episodes)
  env = loop.env
  rec = dict(iteration=it, episodes=progress.episodes, episode_return=ret,
             running_reward=progress.running_reward,
             utility=float(np.mean([e.utility for e in episodes])),
             cost=float(np.mean([env.cost_units(e.state) for e in episodes])),
             calls=float(np.mean([len(e.state.calls) for e in episodes])),
             failed_calls=int(sum(c.error is not None for e in episodes for c in e.state.calls)),
             transitions=int(sum(len(e.rewards) for e in episodes)),
             history_rows=len(loop.history), rollout_s=t_upd - t_roll,
             update_s=time.time() - t_upd, padded_transitions=size,
             update_compiles=ppo.compile_count(loop.update), **m)
  if s.force_planner_episodes:   # only in runs that force: other runs' records stay as they were
    rec["planner_first"] = int(sum(e.planner_first for e in episodes))
  rec.update(decision_metrics(episodes), **root_rec)
  # Backend counters (calls, failures by kind, retries...) of real pools, cumulative.
  rec.update({f"pool/{k}": v for k, v in env.pool.stats().items() if isinstance(v, (int, float))})
  return state, progress, rec


def _root_rollout(loop: _Loop, it: int, episodes: list[rollout.Episode]) -> tuple[dict, dict]:
  """The root advantages of iteration `it`'s first settings.root_rollout episodes from paired
  greedy continuations (gp_jax/rl/root_credit.py; run before the update, with the parameters the
  iteration's rollouts used and the history as they left it, which they do not grow), and their
  record: root_rollout/split_minus_direct (the mean of R_split - R_direct) and
  root_rollout/replaced (root advantages replaced)."""
  s = loop.settings
  first = episodes[:s.root_rollout]
  r_direct, r_split = aio.run(root_credit.paired_returns(
      rollout.run_episodes, loop.env, loop.featurizer, loop.runner, [e.query for e in first],
      key=jax.random.PRNGKey(s.seed), history=loop.history if _grows(s) else None,
      seed_salt=(s.seed, it, "root_rollout")))
  root = root_credit.root_overrides([e.actions[0] for e in first], [e.obs[0]["mask"] for e in first],
                                    r_direct, r_split, loop.env.space)
  return root, {"root_rollout/split_minus_direct": float(np.mean(r_split - r_direct)),
                "root_rollout/replaced": len(root)}


def decision_metrics(episodes: list[rollout.Episode]) -> dict:
  """split_rate, p_planner_root and entropy/<type> of a list of episodes (module docstring)."""
  by_type = {t: [] for t in rollout.DECISION_TYPES}
  for e in episodes:
    for t, h in zip(e.decision_types, e.entropies):
      by_type[t].append(h)
  out = dict(split_rate=float(np.mean([e.state.planner_calls > 0 for e in episodes])),
             p_planner_root=float(np.mean([e.p_planner_root for e in episodes])))
  out.update({f"entropy/{t}": float(np.mean(v)) if v else None for t, v in by_type.items()})
  return out


def _padded_size(loop: _Loop, padded_size: int, n: int) -> int:
  """Padded transitions of this iteration's update (n real ones; `padded_size`: the previous
  iteration's, LoopState.padded_size).

  Fixed padding: batch_size. Buckets: the bucket of the most transitions an iteration has had so
  far, so the size grows at once when n needs more and never shrinks; the update compiles once
  per (padded size, history row bucket) pair.
  """
  if loop.buckets is None:
    return loop.batch_size
  if n > padded_size:
    return buckets_lib.bucket(n, loop.buckets)
  return padded_size


def _checkpoint(ckpt: checkpoint_lib.Checkpointer, loop: _Loop, state: ppo.TrainingState,
                progress: LoopState) -> None:
  """The checkpoints of iteration progress.iteration.

  A new best (the running reward improved) is kept in memory: a copy of the state (the update
  donates it), the history as of then (its arrays are never changed in place, so this holds no
  copy) and the loop state. Every checkpoint_every iterations and at the end, the best not yet
  written goes to "best" first, then the state to "latest". A kill between the two leaves a best
  step past the latest one; resuming discards it (Checkpointer.discard_after) and writes it again.
  The best as of every latest step is therefore on disk, and the newest best step is the run's
  best so far as of its newest latest step.
  """
  s = loop.settings
  it = progress.iteration
  if progress.best_iteration == it:
    loop.pending_best = checkpoint_lib.Write(
        step=it, state=jax.tree_util.tree_map(jnp.copy, state), history=loop.history.view(),
        meta=progress.record(), best=True)
  last = it == s.iterations - 1 or progress.stopped_early
  if (it + 1) % s.checkpoint_every == 0 or last:
    writes = [] if loop.pending_best is None else [loop.pending_best]
    ckpt.save_all(writes + [checkpoint_lib.Write(step=it, state=state, history=loop.history,
                                                 meta=progress.record())])
    loop.pending_best = None


def _query_order(n: int, seed: int, start: int, count: int) -> list[int]:
  """Indices of training queries start..start+count of a stream of per-epoch shuffles."""
  out = []
  for j in range(start, start + count):
    epoch, pos = divmod(j, n)
    perm = np.random.default_rng([seed, epoch]).permutation(n)
    out.append(int(perm[pos]))
  return out


def restore_policy(checkpoints: str | pathlib.Path, model: garnet_lib.GARNet,
                   featurizer: features_lib.Featurizer, optimizer, *, seed: int, num_hubs: int,
                   history_capacity: int, best: bool = True
                   ) -> tuple[dict, history_lib.HistoryMemory]:
  """(params, history) of a run's checkpoint: the best by running reward (falling back to the
  latest when there is no best), or the latest.

  Args:
    checkpoints: the run's checkpoints/ folder (opened read-only).
    model, featurizer, optimizer, seed: as in training (they give the state's structure).
    num_hubs: the action space size (hubs of the history memory).
    history_capacity: rows the history memory keeps.
  Raises:
    ConfigError: no checkpoint there.
  """
  state = init_state(model, featurizer, optimizer, seed)
  history = history_lib.HistoryMemory(featurizer.spec.row_dim, num_hubs,
                                      capacity=int(history_capacity))
  checkpoints = pathlib.Path(checkpoints)
  ckpt = checkpoint_lib.Checkpointer(checkpoints, read_only=True)
  try:
    restored = ckpt.restore(jax.tree_util.tree_map(np.asarray, state), history, best=best)
    if restored is None:
      restored = ckpt.restore(jax.tree_util.tree_map(np.asarray, state), history, best=False)
  finally:
    ckpt.close()
  if restored is None:
    raise errors.ConfigError(f"no checkpoint in {checkpoints}: train first")
  return jax.tree_util.tree_map(jnp.asarray, restored.state.params), history
