"""The main job: train a router, then evaluate it; what experiments/train.py calls."""
from __future__ import annotations

import pathlib
import time

import jax

from gp_jax.runs import evaluate as evaluation
from gp_jax.runs import system as system_lib
from gp_jax.runs import train as training


def evaluate_run(config, workdir, *, tag: str = "eval", system=None, verbose: bool = True) -> dict:
  """Evaluates the best checkpoint of `workdir`; writes <tag>.md / <tag>.json there.

  Several processes: all restore the checkpoint (orbax restores collectively), process 0 alone
  evaluates and writes; the others return {}."""
  t0 = time.time()
  system = system or system_lib.build(config)
  model, params, history = training.load_router(config, workdir, system)
  if jax.process_index() != 0:
    return {}
  hist = None if config.model.history == "inductive" else history   # summary/retrieval read it too
  before = system.pool.stats()
  rows = evaluation.evaluate(system, float(config.alpha), router=(model, params, hist),
                             baselines=bool(config.eval.baselines),
                             optimum=bool(config.eval.optimum),
                             parallel=int(config.train.parallel), seed=int(config.seed),
                             online_history=bool(config.eval.online_history),
                             online_recent_rows=int(config.eval.online_recent_rows),
                             progress=verbose)
  counters = evaluation.pool_counters(before, system.pool.stats())
  v = evaluation.write(rows, float(config.alpha), pathlib.Path(workdir) / tag,
                       simulated=system.simulated, pool=counters)
  if verbose:
    print(f"reward: {evaluation.REWARD_KINDS[system.simulated]}")
    print(evaluation.format_table([r for r in rows if r.domain == "all"], float(config.alpha)))
    if counters:
      print(evaluation.format_pool(counters))
    if "ratio_to_optimum" in v:
      print(f"\nrouter / optimum expected reward: {v['ratio_to_optimum']:.3f}")
    if "best_single" in v:
      print(f"best single LLM: {v['best_single']} ({v['best_single_reward']:.3f}); "
            f"router beats every single LLM: {v['beats_every_single']}")
    print(f"evaluation took {time.time() - t0:.0f}s; report: {pathlib.Path(workdir) / tag}.md")
  return v


def train_and_evaluate(config, workdir, *, evaluate: bool = True, verbose: bool = True) -> dict:
  """Several processes (config.parallel.distributed): all train; process 0 alone reports and
  evaluates."""
  training.init_distributed(config)   # before any other JAX work
  system = system_lib.build(config)
  summary = training.train(config, workdir, system=system, verbose=verbose)
  verbose = verbose and jax.process_index() == 0
  if verbose:
    print(f"trained {summary['episodes']} episodes in {summary['train_seconds']:.0f}s "
          f"(best running reward {summary['best_running']:.3f} at iteration {summary['best_iteration']})")
  if evaluate:
    summary["eval"] = evaluate_run(config, workdir, system=system, verbose=verbose)
  return summary
