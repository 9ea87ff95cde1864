"""The alpha sweep: GraphPlanner against every baseline at each alpha and seed, resumably.

Layout of a sweep workdir:
  config.json                 the config the sweep was run with (gp_jax/runs/workdir.py); a
                              rerun with other values than the grid's is refused
  labels_seed<S>.npz          single-round router training labels of seed S (alpha-independent)
  alpha<A>_seed<S>/graphplanner/  GraphPlanner checkpoints and metrics of that cell
  alpha<A>_seed<S>/cell.json  evaluation rows of every method on the cell's test queries
A cell whose cell.json exists is finished and skipped on a rerun; an interrupted GraphPlanner run
resumes from its latest checkpoint. The multi-round routers (gp_jax/baselines/multi_round/) are
fitted once per seed (Router-R1 is trained per cell, at the cell's alpha) and evaluated in every
cell next to the single-round ones.
"""
from __future__ import annotations

import dataclasses
import pathlib
import sys
import time

from gp_jax import config_lists
from gp_jax import errors
from gp_jax import files
from gp_jax import progress as progress_lib
from gp_jax.baselines import labels as labels_lib
from gp_jax.baselines import multi_round
from gp_jax.baselines.multi_round import r2_reasoner
from gp_jax.baselines import single_round
from gp_jax.runs import evaluate as evaluation
from gp_jax.runs import ppo_config
from gp_jax.runs import system as system_lib
from gp_jax.runs import train as training
from gp_jax.runs import workdir as workdir_config

CELL_FILE = "cell.json"


def cell_dir(workdir: pathlib.Path, alpha: float, seed: int) -> pathlib.Path:
  return workdir / f"alpha{alpha:g}_seed{seed}"


def _labels(system, workdir: pathlib.Path, seed: int) -> labels_lib.RoutingData:
  path = workdir / f"labels_seed{seed}.npz"
  if path.exists():
    data = labels_lib.RoutingData.load(path)
    if (data.llms == tuple(system.space.llms) and len(data.x) == len(system.train_queries)
        and data.llm_x is not None):
      return data
  data = labels_lib.collect(system, system.train_queries, seed=seed)
  with files.atomic_file(path, "the routing labels") as f:
    data.save(f)
  return data


def run_cell(config, system, routers, alpha: float, seed: int, out: pathlib.Path, *,
             verbose: bool, multi: dict | None = None) -> dict:
  """Trains GraphPlanner at (alpha, seed) and evaluates it with every baseline; writes cell.json."""
  t0 = time.time()
  cfg = config.copy_and_resolve_references()
  cfg.alpha, cfg.seed = float(alpha), int(seed)
  summary = training.train(cfg, out / "graphplanner", system=system, verbose=verbose)
  model, params, history = training.load_router(cfg, out / "graphplanner", system)
  hist = None if cfg.model.history == "inductive" else history
  rows = evaluation.evaluate(system, alpha, router=(model, params, hist), baselines=True,
                             optimum=system.simulated, parallel=int(cfg.train.parallel),
                             seed=seed, progress=verbose)
  router_rows, picks = single_round.evaluate_routers(system, alpha, routers, system.test_queries,
                                                     seed=seed)
  rows += router_rows
  t_multi = time.time()
  multi_rows, multi_picks = multi_round.evaluate_multi(system, alpha, multi or {},
                                                       system.test_queries, seed=seed)
  rows += multi_rows
  picks.update(multi_picks)
  record = dict(alpha=alpha, seed=seed, simulated=system.simulated,
                n_train=len(system.train_queries), n_test=len(system.test_queries),
                llms=list(system.space.llms), router_picks=picks,
                train=dict(episodes=summary["episodes"], seconds=summary["train_seconds"],
                           best_running=summary["best_running"]),
                multi_seconds=time.time() - t_multi, seconds=time.time() - t0,
                rows=[dataclasses.asdict(r) for r in rows])
  # A cell is finished only once its file is whole.
  files.write_json(out / CELL_FILE, record, "a sweep cell", parents=False, indent=1,
                   ensure_ascii=True, separators=None)
  return record


def run_sweep(config, workdir: str | pathlib.Path, *, alphas: list[float], seeds: list[int],
              routers: list[str], router_kwargs: dict | None = None,
              multi_routers: list[str] = (), multi_kwargs: dict | None = None,
              verbose: bool = True) -> dict:
  """Runs every unfinished (alpha, seed) cell.

  Args:
    config: the GraphPlanner run config (alpha and seed are overridden per cell).
    workdir: sweep directory (created).
    alphas, seeds: the grid.
    routers: single-round router names (gp_jax.baselines.single_round.ROUTERS).
    router_kwargs: hyperparameters of the routers (knn_k, mlp_hidden, steps, ...).
    multi_routers: multi-round router names (gp_jax.baselines.multi_round.MULTI_ROUTERS).
    multi_kwargs: their hyperparameters (knn_k, router_llm, r1_episodes, r2, ...).
  Returns:
    {"ran": [(alpha, seed)], "skipped": [(alpha, seed)], "seconds": wall time}.
  """
  _check_grid(config, alphas, routers, router_kwargs, multi_routers, multi_kwargs)
  workdir = pathlib.Path(workdir)
  # Every cell of a workdir comes from one config; the grid may grow between reruns.
  workdir_config.check_or_record(workdir, config, ignore=("sweep.alphas", "sweep.seeds"),
                                 what="sweep")
  t0 = time.time()
  ran, skipped = [], []
  total = sum(not (cell_dir(workdir, a, s) / CELL_FILE).exists() for s in seeds for a in alphas)
  cells = progress_lib.Progress("sweep", total, unit="cells", eta_from_start=True) if verbose and total else None
  for seed in seeds:
    todo = [a for a in alphas if not (cell_dir(workdir, a, seed) / CELL_FILE).exists()]
    skipped += [(a, seed) for a in alphas if a not in todo]
    if not todo:
      continue
    system, fitted, multi = _fit_seed(config, workdir, seed, routers, router_kwargs,
                                      multi_routers, multi_kwargs)
    for alpha in todo:
      out = cell_dir(workdir, alpha, seed)
      out.mkdir(parents=True, exist_ok=True)
      if cells is not None:
        progress_lib.note(f"[sweep] cell {len(ran) + 1}/{total}: alpha={alpha:g} seed={seed}")
      rec = run_cell(config, system, fitted, alpha, seed, out, verbose=verbose, multi=multi)
      ran.append((alpha, seed))
      if cells is not None:
        cells.update(len(ran), last=f"alpha={alpha:g} seed={seed}")
      if verbose:
        _print_cell(rec, alpha, seed)
  return dict(ran=ran, skipped=skipped, seconds=time.time() - t0)


def _check_grid(config, alphas, routers, router_kwargs, multi_routers, multi_kwargs) -> None:
  """ConfigError for a negative alpha or an unknown router or router LLM, before any work."""
  if any(a < 0 for a in alphas):
    raise errors.ConfigError(f"alphas must be >= 0, got {alphas}")
  for name in routers:               # every name checked before any work is done
    single_round.make_router(name, **(router_kwargs or {}))
  for name in multi_routers:
    multi_round.make_multi_router(name, **(multi_kwargs or {}))
  _check_router_llm(config, (multi_kwargs or {}).get("router_llm", ""))


def _fit_seed(config, workdir: pathlib.Path, seed: int, routers, router_kwargs, multi_routers,
              multi_kwargs) -> tuple[system_lib.System, dict, dict]:
  """(system, fitted single-round routers, fitted multi-round routers) of one seed: the seed
  fixes the train/test queries of its cells, and the routers do not depend on alpha."""
  cfg = config.copy_and_resolve_references()
  cfg.seed = int(seed)
  system = system_lib.build(cfg)
  data = _labels(system, workdir, seed)
  fitted = single_round.fit_routers(routers, data, system.catalog,
                                    **dict(router_kwargs or {}, seed=seed))
  multi = multi_round.fit_multi_routers(list(multi_routers), system, system.train_queries,
                                        seed=seed, **(multi_kwargs or {}))
  return system, fitted, multi


def _print_cell(rec: dict, alpha: float, seed: int) -> None:
  """One line per finished cell on stderr: GraphPlanner, the optimum, the best router."""
  best = {r["policy"]: r["reward"] for r in rec["rows"] if r["domain"] == "all"}
  nan = float("nan")
  router_best = max((v for k, v in best.items() if k.startswith("router:")), default=nan)
  print(f"alpha={alpha:g} seed={seed}: GraphPlanner {best.get('GraphPlanner', nan):.3f}, "
        f"optimum {best.get('optimum (DP)', nan):.3f}, best router {router_best:.3f}"
        + "".join(f", {k} {v:.3f}" for k, v in best.items()
                  if k.startswith(multi_round.ROW_PREFIX))
        + f" ({rec['seconds']:.0f}s)", file=sys.stderr)


def _check_router_llm(config, name: str) -> None:
  """A configured router LLM must be one of the sweep's LLMs (checked before any write)."""
  if not name:
    return
  llms = system_lib.configured_llms(config)
  if name not in llms:
    raise errors.unknown_name("router LLM", name, llms)


def multi_kwargs_from_config(config) -> dict:
  """Hyperparameters of the multi-round routers from config.sweep (Router-R1's PPO clip, epochs,
  minibatches, gamma, lambda, value weight and grad clip are GraphPlanner's config.ppo ones; the
  R2-Reasoner-style router's settings are the sweep.r2_* fields, defaults those of R2Settings)."""
  s = config.sweep
  return dict(knn_k=int(s.knn_k), router_llm=str(s.router_llm), r1_hidden=int(s.r1_hidden),
              r1_episodes=int(s.r1_episodes), r1_batch=int(s.r1_batch),
              r1_reward=str(config.train.reward),
              r1_ppo=ppo_config.router_r1_settings(config), r2=r2_settings_from_config(config))


def r2_settings_from_config(config) -> r2_reasoner.R2Settings:
  """R2Settings from the config.sweep fields r2_<field> (a missing field keeps its default)."""
  s, default = config.sweep, r2_reasoner.R2Settings()
  return r2_reasoner.R2Settings(**{
      f.name: type(getattr(default, f.name))(s.get("r2_" + f.name, getattr(default, f.name)))
      for f in dataclasses.fields(default)})


def sweep_from_config(config, workdir, *, verbose: bool = True) -> dict:
  """run_sweep with the grid and router settings of config.sweep."""
  if "sweep" not in config:
    raise errors.ConfigError("the config has no 'sweep' section; use experiments/configs/sweep.py")
  s = config.sweep
  return run_sweep(config, workdir, alphas=config_lists.numbers(s.alphas, "sweep.alphas"),
                   seeds=config_lists.numbers(s.seeds, "sweep.seeds", int),
                   routers=list(config_lists.names(s.routers)),
                   router_kwargs=dict(knn_k=int(s.knn_k), mlp_hidden=int(s.mlp_hidden),
                                      steps=int(s.router_steps),
                                      learning_rate=float(s.router_learning_rate),
                                      weight_decay=float(s.router_weight_decay),
                                      graph_hidden=int(s.graph_hidden),
                                      graph_steps=int(s.graph_steps),
                                      routerdc_steps=int(s.routerdc_steps)),
                   multi_routers=list(config_lists.names(s.multi_routers)),
                   multi_kwargs=multi_kwargs_from_config(config), verbose=verbose)
