"""Training a GraphPlanner router from a config: the run-layer side of gp_jax/rl/loop.py.

Reads the config tree (model, PPO, loop, devices, processes), checks the workdir's config record,
builds the system and the learner's pieces, and calls `rl.loop.train` with them; `load_router`
restores a trained router the same way. Every runner that trains (experiments/train.py, the
sweep, the studies, serving) comes through here.

Phase-1 warm start (train.phase1_episodes = N > 0, off by default): the run's first
ceil(N / train.episodes_per_iter) iterations -- whole iterations, so at least N episodes, counted
in train.episodes -- run the paper's fixed Phase-1 workflow (depth train.phase1_depth, width
train.phase1_width: nodes above that depth plan with that width, nodes at it execute, the router
picks only the LLMs; gp_jax/workflow/mdp.py), and every later iteration runs Phase 2 (the
config's MDP). The environment's MDP is switched before each iteration's rollouts (the loop's
before_iteration hook), so a resumed run switches where the uninterrupted one did. The batches
hold the longer of the two workflows. The running reward of a Phase-1 iteration is not that of a
Phase-2 one, so, as under train.pool_perturb, `load_router` loads the latest checkpoint, not the
best.
"""
from __future__ import annotations

import dataclasses
import math
import pathlib
from typing import Callable

import jax

from gp_jax import errors
from gp_jax import progress as progress_lib
from gp_jax.graph import features as features_lib
from gp_jax.graph import garnet as garnet_lib
from gp_jax.rl import batch as batch_lib
from gp_jax.rl import parallel
from gp_jax.rl import loop as rl_loop
from gp_jax.runs import ppo_config
from gp_jax.runs import system as system_lib
from gp_jax.runs import workdir as workdir_config
from gp_jax.sim import perturb as perturb_lib
from gp_jax.workflow import mdp

# Config fields a resumed training run may change (gp_jax/runs/workdir.py).
TRAIN_CONFIG_FREE = ("sweep", "study", "eval", "train.checkpoint_every", "parallel")


def row_layout(config) -> int:
  """config.model.row_layout (features.ROW_LAYOUT_OF_OLDER_CONFIGS when an older record has no
  such field)."""
  layout = config.model.get("row_layout", features_lib.ROW_LAYOUT_OF_OLDER_CONFIGS)
  if layout not in features_lib.ROW_LAYOUTS:
    raise errors.ConfigError(f"config.model.row_layout must be one of "
                             f"{', '.join(map(str, features_lib.ROW_LAYOUTS))}; got {layout!r}")
  return int(layout)


def recorded_row_layout(config, workdir) -> int:
  """The row layout a trained workdir was trained with: its config record's model.row_layout
  (layout 1 for a record made before the field existed), or config's when it has no record."""
  path = pathlib.Path(workdir) / workdir_config.CONFIG_FILE
  if not path.exists():
    return row_layout(config)
  recorded = errors.read_json(path, "workdir config record")
  layout = recorded.get("model.row_layout", features_lib.ROW_LAYOUT_OF_OLDER_CONFIGS) if \
      isinstance(recorded, dict) else features_lib.ROW_LAYOUT_OF_OLDER_CONFIGS
  if layout not in features_lib.ROW_LAYOUTS:
    raise errors.DataError(f"{path}: model.row_layout {layout!r} is not one of "
                           f"{features_lib.ROW_LAYOUTS}")
  return int(layout)


def make_model(config, spec: features_lib.FeatureSpec | None = None, *,
               layout: int | None = None, num_llms: int | None = None) -> garnet_lib.GARNet:
  """The GARNet (or ablation) of config.model: encoder, history mode, retrieval_k, heads, row
  layout (`layout` overrides config.model.row_layout: a trained workdir's recorded one), policy
  head.

  spec: the feature spec (needed by the homogeneous encoder, whose shared input transform spans
  the widest table; without it the width comes from config.text.dim and config.model.mem_proj).
  num_llms: the LLMs per role of the action space the factored policy head scores (default: the
  LLMs config.llms selects); the flat head reads none.
  """
  m = config.model
  history = m.history
  encoder = m.encoder
  k = m.retrieval_k
  heads = m.attention_heads
  _check_model(m, history, encoder, k, heads)
  kw = {}
  if m.policy_head != "flat":
    kw["policy_head"] = m.policy_head
    kw["num_llms"] = int(num_llms if num_llms is not None
                         else len(system_lib.configured_llms(config)))
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
  layout = row_layout(config) if layout is None else layout
  if layout != 1:
    kw["row_layout"] = layout
  if m.memory_bias:
    if layout != 2:
      raise errors.ConfigError("config.model.memory_bias reads row layout 2's per-hub statistics; "
                               f"config.model.row_layout is {layout}")
    kw["memory_bias"] = True
  if m.memory_predictor:
    if layout != 2 or history != "transductive":
      raise errors.ConfigError("config.model.memory_predictor reads row layout 2's per-hub "
                               "statistics and learns from the transductive history; "
                               f"config.model.row_layout is {layout}, "
                               f"config.model.history {history!r}")
    kw["memory_predictor"] = True
    kw["predictor_scale"] = float(m.memory_predictor_scale)
    kw["predictor_alpha"] = float(config.alpha)
  return garnet_lib.GARNet(hidden=int(m.hidden), num_layers=int(m.num_layers),
                           mlp_hidden=int(m.mlp_hidden),
                           use_history=history in ("transductive", "summary"), **kw)


def _check_model(m, history, encoder, k, heads) -> None:
  """ConfigError naming the field of config.model (`m`) that make_model cannot build."""
  if history not in rl_loop.HISTORY_MODES:
    raise errors.ConfigError(f"config.model.history must be one of "
                             f"{', '.join(rl_loop.HISTORY_MODES)}; got {history!r}")
  if encoder not in garnet_lib.ENCODERS:
    raise errors.ConfigError(f"config.model.encoder must be one of "
                             f"{', '.join(garnet_lib.ENCODERS)}; got {encoder!r}")
  if not isinstance(k, int) or k < 1:
    raise errors.ConfigError(f"config.model.retrieval_k must be an integer >= 1, got {k!r}")
  if m.policy_head not in garnet_lib.POLICY_HEADS:
    raise errors.ConfigError(f"config.model.policy_head must be one of "
                             f"{', '.join(garnet_lib.POLICY_HEADS)}; got {m.policy_head!r}")
  if encoder == "transformer" and (heads < 1 or int(m.hidden) % heads):
    raise errors.ConfigError(f"config.model.attention_heads ({heads}) must divide "
                             f"config.model.hidden ({m.hidden}) for the transformer encoder")


def make_mesh(config, *, local: bool = False):
  """The learner's device mesh of config.parallel.devices (0 = all devices); local: this
  process's devices only (the rollout's history refresh)."""
  devices = int(config.parallel.devices)
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
  other JAX work; a no-op once joined)."""
  par = config.parallel
  if not par.distributed:
    return
  parallel.initialize(coordinator=str(par.coordinator), num_processes=int(par.num_processes),
                      process_id=int(par.process_id))


def validate(config) -> None:
  """ConfigError naming the first training field out of range (before anything is built)."""
  t, p = config.train, config.ppo
  checks = [(t.episodes >= 1, "train.episodes >= 1"), (t.episodes_per_iter >= 1, "train.episodes_per_iter >= 1"),
            (t.parallel >= 1, "train.parallel >= 1"), (p.epochs >= 1, "ppo.epochs >= 1"),
            (p.num_minibatches >= 1, "ppo.num_minibatches >= 1"), (0 < p.clip_eps < 1, "0 < ppo.clip_eps < 1"),
            (p.learning_rate > 0, "ppo.learning_rate > 0"), (0 <= p.gamma <= 1, "0 <= ppo.gamma <= 1"),
            (0 <= p.gae_lambda <= 1, "0 <= ppo.gae_lambda <= 1"), (config.alpha >= 0, "alpha >= 0"),
            (0 <= p.lr_final_fraction <= 1, "0 <= ppo.lr_final_fraction <= 1"),
            (0 <= p.entropy_final_fraction <= 1, "0 <= ppo.entropy_final_fraction <= 1"),
            (config.model.history_capacity >= 0, "model.history_capacity >= 0"),
            (config.eval.online_recent_rows >= 0, "eval.online_recent_rows >= 0"),
            (not config.eval.online_recent_rows or config.eval.online_history,
             "eval.online_history=True with eval.online_recent_rows > 0"),
            (t.checkpoint_every >= 1, "train.checkpoint_every >= 1"),
            (isinstance(t.force_planner_episodes, int) and t.force_planner_episodes >= 0,
             "an integer train.force_planner_episodes >= 0"),
            (0 <= t.root_floor < 1, "0 <= train.root_floor < 1"),
            (isinstance(t.root_rollout, int) and 0 <= t.root_rollout <= t.episodes_per_iter,
             "an integer 0 <= train.root_rollout <= train.episodes_per_iter"),
            (isinstance(p.entropy_stop_min_episodes, int) and p.entropy_stop_min_episodes >= 0,
             "an integer ppo.entropy_stop_min_episodes >= 0"),
            (isinstance(t.phase1_episodes, int) and t.phase1_episodes >= 0,
             "an integer train.phase1_episodes >= 0"),
            (not t.phase1_episodes or (t.phase1_depth >= 1 and t.phase1_width >= 1),
             "train.phase1_depth >= 1 and train.phase1_width >= 1 with train.phase1_episodes > 0"),
            (t.padding in rl_loop.PADDINGS, f"train.padding in {rl_loop.PADDINGS}")]
  for ok, what in checks:
    if not ok:
      raise errors.ConfigError(f"invalid config: need {what}")
  ppo_config.ppo_settings(config)          # unknown ppo.lr_schedule / entropy_schedule names
  make_model(config)                        # model errors before anything is built
  phase1_mdp(config, system_lib.mdp_config(config.mdp))   # a warm start the MDP cannot run
  perturb_settings(config)                  # pool perturbation out of range


def loop_settings(config, max_calls: int) -> rl_loop.LoopSettings:
  """The learner's loop settings of config.train, config.ppo and config.model; max_calls: the
  MDP's bound on one episode's calls (learner.max_calls of the system)."""
  t = config.train
  return rl_loop.LoopSettings(
      episodes=t.episodes, episodes_per_iter=t.episodes_per_iter, parallel=int(t.parallel),
      seed=config.seed, checkpoint_every=t.checkpoint_every, entropy_stop=config.ppo.entropy_stop,
      max_calls=max_calls, history=config.model.history,
      history_capacity=int(config.model.history_capacity),
      background_checkpoints=bool(t.background_checkpoints),
      predictor=bool(config.model.memory_predictor),
      force_planner_episodes=int(t.force_planner_episodes),
      root_floor=float(t.root_floor), root_rollout=int(t.root_rollout),
      entropy_stop_min_episodes=int(config.ppo.entropy_stop_min_episodes))


def check_workdir(config, workdir: pathlib.Path) -> None:
  """Records config in workdir/config.json, or refuses a config other than the recorded one: a
  resumed run must use the config its checkpoints were made with (the sweep's and studies'
  sections, evaluation switches and checkpoint spacing do not change what is trained)."""
  rank = jax.process_index()
  if rank == 0:   # several processes: process 0 records, the others then only compare
    workdir_config.check_or_record(workdir, config, ignore=TRAIN_CONFIG_FREE, what="training run")
  parallel.barrier("workdir config")
  if rank != 0:
    workdir_config.check_or_record(workdir, config, ignore=TRAIN_CONFIG_FREE, what="training run")


def train(config, workdir: str | pathlib.Path, *, system: system_lib.System | None = None,
          verbose: bool = True) -> dict:
  """Trains the router of `config` in workdir; returns rl.loop.train's summary. Resumes from
  the latest checkpoint there.

  system: the built system of config (built here when None).
  Raises:
    ConfigError: a field out of range, or workdir holds a run of another config; raised before
      the workdir is touched (config errors) or anything is trained.
  """
  validate(config)
  init_distributed(config)
  verbose = verbose and jax.process_index() == 0   # only process 0 prints
  mesh = make_mesh(config)   # too many devices asked: error before the workdir is touched
  enable_compile_cache(config.compile_cache)
  workdir = pathlib.Path(workdir)
  check_workdir(config, workdir)
  if verbose:
    progress_lib.note(f"[train] {workdir}: {ppo_config.num_updates(config)} iterations of "
                      f"{config.train.episodes_per_iter} episodes; compiling first (a minute or "
                      f"more without a warm XLA cache)")
  sysm = system or system_lib.build(config)
  settings = loop_settings(config, training_max_calls(config, sysm))
  perturbed = pool_perturbation(config, sysm)
  if perturbed is None:
    return _train(config, workdir, sysm, settings, mesh, verbose, None)
  base = sysm.world.events
  sysm.world.events = perturbed   # the training split's pool follows the phase; restored after
  try:
    return _train(config, workdir, sysm, settings, mesh, verbose, perturbed.set_iteration)
  finally:
    sysm.world.events = base


def perturb_settings(config) -> perturb_lib.PerturbSettings | None:
  """config.train.pool_perturb's distribution (None when it is off or absent; the seed is the
  run's)."""
  p = config.train.get("pool_perturb")
  if p is None or not p.get("enabled", False):
    return None
  s = perturb_lib.PerturbSettings(
      every=int(p.every), skill_prob=float(p.skill_prob), delta_low=float(p.delta_low),
      delta_high=float(p.delta_high), price_prob=float(p.price_prob),
      fail_prob=float(p.fail_prob), absent_prob=float(p.absent_prob), seed=int(config.seed))
  s.validate()
  return s


def pool_perturbation(config, sysm) -> perturb_lib.PerturbedPool | None:
  """The perturbed training pool of config.train.pool_perturb (None: off); the history is a
  sliding window of model.history_capacity rows, as always."""
  s = perturb_settings(config)
  if s is None:
    return None
  if not sysm.simulated:
    raise errors.ConfigError("config.train.pool_perturb changes the simulated pool: it needs "
                             "backend='simulator' and data.source='simulated'")
  return perturb_lib.PerturbedPool(s, sysm.space.llms, perturb_lib.simulated_domains(),
                                   sysm.world.events)


def phase1_mdp(config, mdp_cfg: mdp.MDPConfig) -> mdp.MDPConfig | None:
  """The MDP of the Phase-1 warm start (module docstring): `mdp_cfg`, the run's Phase-2 MDP, with
  Phase 1's fixed structure of depth train.phase1_depth and width train.phase1_width; None when
  train.phase1_episodes is 0.

  Raises:
    ConfigError: the run's MDP is Phase 1 already, or its step cap cannot hold the workflow.
  """
  t = config.train
  if not t.phase1_episodes:
    return None
  if mdp_cfg.phase1:
    raise errors.ConfigError("train.phase1_episodes warms up a Phase 2 run: config.mdp."
                             "phase1_depth and phase1_width must be 0")
  cfg = dataclasses.replace(mdp_cfg, phase1_depth=int(t.phase1_depth),
                            phase1_width=int(t.phase1_width))
  cfg.validate()
  if cfg.max_calls() > cfg.step_cap:
    raise errors.ConfigError(f"config.mdp.step_cap={cfg.step_cap} is below the {cfg.max_calls()} "
                             f"calls of the Phase-1 warm start's workflow (depth "
                             f"{cfg.phase1_depth}, width {cfg.phase1_width})")
  return cfg


def phase1_iterations(config) -> int:
  """The iterations of the Phase-1 warm start: ceil(train.phase1_episodes / episodes_per_iter)."""
  return math.ceil(int(config.train.phase1_episodes) / int(config.train.episodes_per_iter))


def training_max_calls(config, system: system_lib.System) -> int:
  """The bound on one training episode's calls: the system's MDP's, or the Phase-1 warm start's
  workflow's when it is longer."""
  calls = ppo_config.max_calls(system)
  warm = phase1_mdp(config, system.mdp_cfg)
  return max(calls, warm.max_calls()) if warm is not None else calls


def phase1_switch(config, env) -> Callable[[int], None] | None:
  """The before_iteration hook of the Phase-1 warm start: sets env's MDP to Phase 1 for the
  first phase1_iterations(config) iterations and to the run's own MDP after them; None when off."""
  warm = phase1_mdp(config, env.cfg)
  if warm is None:
    return None
  phase2, first = env.cfg, phase1_iterations(config)

  def switch(it: int) -> None:
    env.cfg = warm if it < first else phase2
  return switch


def _hooks(*hooks):
  """One before_iteration hook calling each of `hooks` that is not None, in order (None: none)."""
  hooks = [h for h in hooks if h is not None]
  if not hooks:
    return None
  if len(hooks) == 1:
    return hooks[0]

  def each(it: int) -> None:
    for h in hooks:
      h(it)
  return each


def _train(config, workdir, sysm, settings, mesh, verbose, before_iteration) -> dict:
  env = sysm.env(float(config.alpha), reward=config.train.reward)
  before_iteration = _hooks(phase1_switch(config, env), before_iteration)
  model = make_model(config, sysm.featurizer.spec, num_llms=sysm.space.num_llms)
  optimizer = ppo_config.make_optimizer(config)
  update, batch_size = ppo_config.make_update(config, sysm, model, optimizer,
                                               int(config.train.episodes_per_iter), mesh,
                                               calls=training_max_calls(config, sysm))
  buckets = None   # fixed padding: every batch is batch_size transitions
  if config.train.padding == "buckets":
    unit = batch_lib.batch_size_for(1, 1, int(config.ppo.num_minibatches), mesh.size)
    buckets = batch_lib.padding_buckets(batch_size, unit)
  return rl_loop.train(workdir, env=env, featurizer=sysm.featurizer, queries=sysm.train_queries,
                        model=model, optimizer=optimizer, update=update, batch_size=batch_size,
                        settings=settings, buckets=buckets,
                        rollout_mesh=make_mesh(config, local=True), verbose=verbose,
                        before_iteration=before_iteration)


def load_router(config, workdir, system: system_lib.System, *, best: bool = True):
  """(model, params, history) from a run's checkpoint (best by running reward, or latest).

  Evaluate with the returned history for the transductive, summary and retrieval modes (they read
  it), None for inductive. The model has the row layout the workdir was trained with
  (recorded_row_layout: a workdir trained before row layouts existed evaluates as layout 1).
  Under train.pool_perturb the running reward of one iteration is not comparable with another's
  (each phase has its own pool), nor under a Phase-1 warm start (train.phase1_episodes), so the
  latest checkpoint is loaded then, not the best. The factored policy head scores `system`'s
  action space (its LLMs per role)."""
  best = best and perturb_settings(config) is None and not config.train.phase1_episodes
  model = make_model(config, system.featurizer.spec, layout=recorded_row_layout(config, workdir),
                     num_llms=system.space.num_llms)
  params, history = rl_loop.restore_policy(
      pathlib.Path(workdir) / "checkpoints", model, system.featurizer,
      ppo_config.make_optimizer(config), seed=config.seed, num_hubs=system.space.size,
      history_capacity=int(config.model.history_capacity), best=best)
  return model, params, history
