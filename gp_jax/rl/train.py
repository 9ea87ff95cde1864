"""GraphPlanner training: rollouts on the routing MDP, jitted PPO updates, checkpoints, metrics.

`train_and_evaluate(config, workdir)` is the whole run. The host loop (not jittable: LLM calls) per
iteration: roll out `episodes_per_iter` training queries with the sampled policy, build one padded
batch (GAE in JAX), apply the jitted PPO update, evict history beyond capacity, refresh the history
hub sums for the new parameters, log, checkpoint. Resuming from `workdir` continues from the latest
checkpoint (params, optimizer, history memory, PRNG state, counters) and reproduces the run.
"""
from __future__ import annotations

import json
import math
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from gp_jax import errors
from gp_jax import files
from gp_jax import progress as progress_lib
from gp_jax.graph import features as features_lib
from gp_jax.graph import garnet as garnet_lib
from gp_jax.graph import history as history_lib
from gp_jax.rl import checkpoint as checkpoint_lib
from gp_jax.rl import batch as batch_lib
from gp_jax.rl import parallel
from gp_jax.rl import ppo
from gp_jax.rl import rollout
from gp_jax.runs import learner as learner_cfg
from gp_jax.runs import system as system_lib
from gp_jax.runs import workdir as workdir_config
from gp_jax.util import aio


PADDINGS = ("fixed", "buckets")   # train.padding


class MetricsLog:
  """metrics.jsonl in the workdir; on resume, lines past the restored iteration are dropped.

  A run killed while appending can leave a partial last line: it belongs to an iteration past
  the checkpoint, so it is dropped like the others. A malformed line before it is a DataError."""

  def __init__(self, path: pathlib.Path, keep_through_iteration: int):
    self.path = path
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


HISTORY_MODES = ("transductive", "inductive", "summary", "retrieval")
# Config fields a resumed training run may change (gp_jax/runs/workdir.py).
TRAIN_CONFIG_FREE = ("sweep", "study", "eval", "train.checkpoint_every", "parallel")


def make_model(config, spec: features_lib.FeatureSpec | None = None) -> garnet_lib.GARNet:
  """The GARNet (or ablation) of config.model: encoder, history mode, retrieval_k, heads.

  spec: the feature spec (needed by the homogeneous encoder, whose shared input transform spans
  the widest table; without it the width comes from config.text.dim and config.model.mem_proj).
  """
  m = config.model
  history = m.history
  encoder = m.get("encoder", "garnet")
  k = m.get("retrieval_k", 5)
  heads = m.get("attention_heads", 4)
  if history not in HISTORY_MODES:
    raise errors.ConfigError(f"config.model.history must be one of {', '.join(HISTORY_MODES)}; "
                             f"got {history!r}")
  if encoder not in garnet_lib.ENCODERS:
    raise errors.ConfigError(f"config.model.encoder must be one of "
                             f"{', '.join(garnet_lib.ENCODERS)}; got {encoder!r}")
  if not isinstance(k, int) or k < 1:
    raise errors.ConfigError(f"config.model.retrieval_k must be an integer >= 1, got {k!r}")
  if encoder == "transformer" and (heads < 1 or int(m.hidden) % heads):
    raise errors.ConfigError(f"config.model.attention_heads ({heads}) must divide "
                             f"config.model.hidden ({m.hidden}) for the transformer encoder")
  kw = {}
  if encoder != "garnet":
    kw["encoder"] = encoder
  if encoder == "homogeneous":
    if spec is not None:
      text, row = spec.text_dim, spec.row_dim
    else:
      text = int(config.text.dim)
      row = 2 * (int(m.mem_proj) or text) + 3
    kw["input_width"] = max(2 * text, row)
  if encoder == "transformer":
    kw["heads"] = int(heads)
  if history == "summary":
    kw["history_input"] = "summary"
  if history == "retrieval":
    kw["retrieval_k"] = int(k)
  return garnet_lib.GARNet(hidden=int(m.hidden), num_layers=int(m.num_layers),
                           mlp_hidden=int(m.mlp_hidden),
                           use_history=history in ("transductive", "summary"), **kw)


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


def make_mesh(config, *, local: bool = False):
  """The learner's device mesh of config.parallel.devices (0 or absent = all devices); local: this
  process's devices only (the rollout's history refresh)."""
  par = config.get("parallel") or {}
  devices = int(par.get("devices", 0))
  if devices < 0:
    raise errors.ConfigError(f"config.parallel.devices must be >= 0 (0 = all), got {devices}")
  return parallel.make_mesh(devices, local=local)


def enable_compile_cache(path: str) -> None:
  """Keeps compiled XLA programs on disk so repeated runs (and resumes) skip recompiling."""
  if path:
    path = str(pathlib.Path(path).expanduser())
    pathlib.Path(path).mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


def init_distributed(config) -> None:
  """Joins the multi-process job of config.parallel when parallel.distributed is set (before any
  other JAX work; a no-op once joined or when the section is absent)."""
  par = config.get("parallel")
  if par is None or not par.get("distributed", False):
    return
  parallel.initialize(coordinator=str(par.get("coordinator", "")),
                      num_processes=int(par.get("num_processes", 0)),
                      process_id=int(par.get("process_id", -1)))


def _shares(n: int, parts: int) -> list[tuple[int, int]]:
  """Contiguous (start, stop) slices of n items over `parts` processes, sizes differing by <= 1."""
  cuts = [n * p // parts for p in range(parts + 1)]
  return list(zip(cuts[:-1], cuts[1:]))


def _validate(config) -> None:
  t, p = config.train, config.ppo
  checks = [(t.episodes >= 1, "train.episodes >= 1"), (t.episodes_per_iter >= 1, "train.episodes_per_iter >= 1"),
            (t.parallel >= 1, "train.parallel >= 1"), (p.epochs >= 1, "ppo.epochs >= 1"),
            (p.num_minibatches >= 1, "ppo.num_minibatches >= 1"), (0 < p.clip_eps < 1, "0 < ppo.clip_eps < 1"),
            (p.learning_rate > 0, "ppo.learning_rate > 0"), (0 <= p.gamma <= 1, "0 <= ppo.gamma <= 1"),
            (0 <= p.gae_lambda <= 1, "0 <= ppo.gae_lambda <= 1"), (config.alpha >= 0, "alpha >= 0"),
            (0 <= p.get("lr_final_fraction", 0.0) <= 1, "0 <= ppo.lr_final_fraction <= 1"),
            (0 <= p.get("entropy_final_fraction", 0.0) <= 1, "0 <= ppo.entropy_final_fraction <= 1"),
            (config.model.history_capacity >= 0, "model.history_capacity >= 0"),
            (t.checkpoint_every >= 1, "train.checkpoint_every >= 1"),
            (t.get("padding", "fixed") in PADDINGS, f"train.padding in {PADDINGS}")]
  for ok, what in checks:
    if not ok:
      raise errors.ConfigError(f"invalid config: need {what}")
  learner_cfg.ppo_settings(config)


def train(config, workdir: str | pathlib.Path, *, system: system_lib.System | None = None,
          verbose: bool = True) -> dict:
  """Trains a router; returns a summary. Resumes from the latest checkpoint in workdir."""
  _validate(config)
  make_model(config)   # config errors before anything is built
  init_distributed(config)
  # Several processes: each runs its share of the rollouts; the learner is one SPMD program;
  # only process 0 writes metrics and prints (checkpoints are written by all, as orbax needs).
  procs, rank = jax.process_count(), jax.process_index()
  verbose = verbose and rank == 0
  mesh = make_mesh(config)   # too many devices asked: error before the workdir is touched
  enable_compile_cache(config.get("compile_cache", ""))
  workdir = pathlib.Path(workdir)
  # A resumed run must use the config its checkpoints were made with (the sweep's and studies'
  # sections, evaluation switches and checkpoint spacing do not change what is trained).
  if rank == 0:   # several processes: process 0 records, the others then only compare
    workdir_config.check_or_record(workdir, config, ignore=TRAIN_CONFIG_FREE, what="training run")
  parallel.barrier("workdir config")
  if rank != 0:
    workdir_config.check_or_record(workdir, config, ignore=TRAIN_CONFIG_FREE, what="training run")
  if verbose:
    progress_lib.note(f"[train] {workdir}: {learner_cfg.num_updates(config)} iterations of "
                      f"{config.train.episodes_per_iter} episodes; compiling first (a minute or "
                      f"more without a warm XLA cache)")
  sysm = system or system_lib.build(config)
  env = sysm.env(float(config.alpha), reward=config.train.get("reward", "sampled"))
  model = make_model(config, sysm.featurizer.spec)
  p = config.ppo
  optimizer = learner_cfg.make_optimizer(config)
  state = init_state(model, sysm.featurizer, optimizer, config.seed)
  update, batch_size = learner_cfg.make_update(config, sysm, model, optimizer,
                                   int(config.train.episodes_per_iter), mesh)
  # The history memory grows in every mode but inductive; only transductive sums its rows.
  buckets = None   # fixed padding: every batch is batch_size transitions
  if config.train.get("padding", "fixed") == "buckets":
    unit = batch_lib.batch_size_for(1, 1, int(p.num_minibatches), mesh.size)
    buckets = batch_lib.padding_buckets(batch_size, unit)
  transductive = config.model.history == "transductive"
  memory = config.model.history != "inductive"
  summary = config.model.history == "summary"
  history = history_lib.HistoryMemory(sysm.featurizer.spec.row_dim, sysm.space.size,
                                      capacity=int(config.model.history_capacity),
                                      headroom=batch_size)
  ckpt = checkpoint_lib.Checkpointer(workdir / "checkpoints")
  meta = dict(iteration=-1, episodes=0, running_reward=None, best_running=-math.inf,
              best_iteration=-1, stopped_early=False)
  try:
    restored = ckpt.restore(jax.tree_util.tree_map(np.asarray, state), history)
  except BaseException:
    ckpt.close()
    raise
  if restored is not None:
    state, meta = restored
    state = jax.tree_util.tree_map(jnp.asarray, state)
    if verbose:
      print(f"resumed from iteration {meta['iteration']} ({meta['episodes']} episodes, "
            f"{len(history)} history rows)", file=sys.stderr)
  # Steps past the restored state (a best saved after the last latest, a damaged step) are
  # written again by this run; left in place they would collide with it or be evaluated.
  # Every process calls it: orbax's delete ends in a barrier of all processes.
  ckpt.discard_after(meta["iteration"])
  log = MetricsLog(workdir / "metrics.jsonl", meta["iteration"]) if rank == 0 else None
  slots = -(-int(config.train.parallel) // procs)   # episodes in flight per process
  runner = rollout.PolicyRunner(model, sysm.featurizer.hub_features, slots * procs,
                                featurizer=sysm.featurizer, mesh=make_mesh(config, local=True))
  runner.set_params(state.params, history if memory else None)
  hub_features = jnp.asarray(sysm.featurizer.hub_features)
  n_iters = math.ceil(config.train.episodes / config.train.episodes_per_iter)
  queries = sysm.train_queries
  t0 = time.time()
  bar = None
  if verbose and meta["iteration"] + 1 < n_iters and not meta["stopped_early"]:
    bar = progress_lib.Progress("train", n_iters, unit="iter")
  for it in range(meta["iteration"] + 1, n_iters):
    if meta["stopped_early"]:
      break
    start = it * config.train.episodes_per_iter
    batch_q = [queries[i] for i in _query_order(len(queries), config.seed, start,
                                                 config.train.episodes_per_iter)]
    shard = None
    if procs > 1:
      lo, hi = _shares(len(batch_q), procs)[rank]
      batch_q = batch_q[lo:hi]
      shard = rollout.RolloutShard(index_offset=lo, slots=slots,
                                   allgather=parallel.allgather_objects)
    t_roll = time.time()
    episodes = aio.run(rollout.run_episodes(
        env, sysm.featurizer, runner, batch_q, key=jax.random.fold_in(jax.random.PRNGKey(config.seed + 1), it),
        greedy=False, history=history if memory else None, grow_history=memory,
        seed_salt=(config.seed, it), shard=shard))
    if procs > 1:   # every process builds the same batch from all the episodes, in query order
      episodes = [e for part in parallel.allgather_objects(episodes) for e in part]
    t_upd = time.time()
    size = batch_size if buckets is None else batch_lib.padded_size(
        sum(len(e.rewards) for e in episodes), buckets)
    batch, hist_inputs = batch_lib.build_batch(
        episodes, history if transductive else None, gamma=p.gamma, batch_size=size,
        num_episodes=int(config.train.episodes_per_iter), max_calls=learner_cfg.max_calls(sysm),
        num_hubs=sysm.space.size)
    if summary:   # the summary every decision of this iteration read
      hist_inputs["summary"] = runner.history_input_array()
    state, m = update(state, hub_features, hist_inputs, batch)
    m = {k: float(v) for k, v in jax.device_get(m).items()}
    history.evict()
    runner.set_params(state.params, history if memory else None)
    ret = float(np.mean([e.episode_return for e in episodes]))
    meta["running_reward"] = ret if meta["running_reward"] is None else 0.9 * meta["running_reward"] + 0.1 * ret
    meta["iteration"], meta["episodes"] = it, start + len(episodes)
    rec = dict(iteration=it, episodes=meta["episodes"], episode_return=ret,
               running_reward=meta["running_reward"],
               utility=float(np.mean([e.utility for e in episodes])),
               cost=float(np.mean([env.cost_units(e.state) for e in episodes])),
               calls=float(np.mean([len(e.state.calls) for e in episodes])),
               failed_calls=int(sum(c.error is not None for e in episodes for c in e.state.calls)),
               transitions=int(sum(len(e.rewards) for e in episodes)), history_rows=len(history),
               rollout_s=t_upd - t_roll, update_s=time.time() - t_upd,
               padded_transitions=size, update_compiles=ppo.compile_count(update), **m)
    # Backend counters (calls, failures by kind, retries...) of real pools, cumulative.
    rec.update({f"pool/{k}": v for k, v in sysm.pool.stats().items()
                if isinstance(v, (int, float))})
    if log is not None:
      log.write(rec)
    if bar is not None:
      bar.update(it + 1, episodes=meta["episodes"], reward=f"{ret:+.3f}",
                 running=f"{meta['running_reward']:+.3f}", entropy=f"{m['entropy']:.2f}")
    is_best = meta["running_reward"] > meta["best_running"]
    if is_best:
      meta["best_running"], meta["best_iteration"] = meta["running_reward"], it
    if m["entropy"] < config.ppo.entropy_stop:
      meta["stopped_early"] = True
    last = it == n_iters - 1 or meta["stopped_early"]
    if is_best:
      ckpt.save(it, state, history, meta, best=True)
    if (it + 1) % config.train.checkpoint_every == 0 or last:
      ckpt.save(it, state, history, meta)
  if bar is not None:
    bar.close()
  ckpt.close()
  return dict(meta, train_seconds=time.time() - t0)


def _query_order(n: int, seed: int, start: int, count: int) -> list[int]:
  """Indices of training queries start..start+count of a stream of per-epoch shuffles."""
  out = []
  for j in range(start, start + count):
    epoch, pos = divmod(j, n)
    perm = np.random.default_rng([seed, epoch]).permutation(n)
    out.append(int(perm[pos]))
  return out


def load_router(config, workdir, system: system_lib.System, *, best: bool = True):
  """(model, params, history) from a run's checkpoint (best by running reward, or latest).

  Evaluate with the returned history for the transductive, summary and retrieval modes (they read
  it), None for inductive."""
  model = make_model(config, system.featurizer.spec)
  state = init_state(model, system.featurizer, learner_cfg.make_optimizer(config), config.seed)
  history = history_lib.HistoryMemory(system.featurizer.spec.row_dim, system.space.size,
                                      capacity=int(config.model.history_capacity))
  ckpt = checkpoint_lib.Checkpointer(pathlib.Path(workdir) / "checkpoints", read_only=True)
  try:
    restored = ckpt.restore(jax.tree_util.tree_map(np.asarray, state), history, best=best)
    if restored is None:
      restored = ckpt.restore(jax.tree_util.tree_map(np.asarray, state), history, best=False)
  finally:
    ckpt.close()
  if restored is None:
    raise errors.ConfigError(f"no checkpoint in {workdir}/checkpoints: train first")
  state, _ = restored
  return model, jax.tree_util.tree_map(jnp.asarray, state.params), history
