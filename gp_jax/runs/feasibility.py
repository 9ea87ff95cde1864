"""Feasibility of a look's targets: the DP optimum against single-round routers, per seed.

Before a look trains anything, its targets are checked against the world's own optimum: can the
optimum make the calls, split the queries and beat the routers the targets name? For each seed
this builds the system exactly as the studies do (gp_jax/runs/studies/runner.py: the config with
`seed` set, gp_jax.runs.system.build), then on its test queries
  - runs the exact DP optimum (gp_jax.runs.evaluate.optimum_states) and summarises it as the
    evaluation does (expected reward on the simulator, calls per query, split rate: the share of
    queries with >= 1 Planner call);
  - fits the named single-round routers on the training queries' labels and evaluates them
    (gp_jax.baselines.single_round, as the studies' reference rows: seed = the seed, settings
    from config.study: knn_k, mlp_hidden, router_steps).
No GraphPlanner is trained. Over the seeds: each policy's mean with its 95% t half-width, and the
paired (by seed) difference optimum - router with its 95% t-interval (gp_jax/stats.py).

The record `run` returns (and `write` stores as JSON) holds every per-seed row, so every interval
can be recomputed from it.
"""
from __future__ import annotations

import dataclasses
import json
import math
import time

from gp_jax import config_lists
from gp_jax import errors
from gp_jax import files
from gp_jax import progress as progress_lib
from gp_jax import stats
from gp_jax.baselines import labels as labels_lib
from gp_jax.baselines import single_round
from gp_jax.runs import evaluate as evaluation
from gp_jax.runs import system as system_lib
from gp_jax.util import config_overrides

OPTIMUM = "optimum (DP)"
# Per-seed numbers of each policy, from its "all"-domain evaluation row.
FIELDS = ("reward", "expected_accuracy", "accuracy", "cost", "calls", "split_rate")
# The single-round routers' settings where the config has no `study` section (the registry's).
ROUTER_DEFAULTS = dict(knn_k=10, mlp_hidden=64, steps=500)


def parse_seeds(text: str) -> list[int]:
  """--seeds as a list of distinct seeds (config_lists.seeds)."""
  return config_lists.seeds(text)


def parse_routers(text: str) -> list[str]:
  """'knn,mlp' -> ['knn', 'mlp'] (blanks dropped); unknown names and repeats are ConfigErrors."""
  names = [p.strip() for p in str(text).split(",") if p.strip()]
  for n in names:
    if n not in single_round.ROUTERS:
      raise errors.unknown_name("router", n, single_round.ROUTERS)
  if len(set(names)) != len(names):
    raise errors.ConfigError(f"--routers={text}: a router is repeated")
  return names


def router_kwargs(config) -> dict:
  """The single-round routers' settings as the studies pass them (experiments/study.py)."""
  if "study" not in config:
    return dict(ROUTER_DEFAULTS)
  s = config.study
  return dict(knn_k=int(s.get("knn_k", ROUTER_DEFAULTS["knn_k"])),
              mlp_hidden=int(s.get("mlp_hidden", ROUTER_DEFAULTS["mlp_hidden"])),
              steps=int(s.get("router_steps", ROUTER_DEFAULTS["steps"])))


def _numbers(row: dict, alpha: float, simulated: bool) -> dict:
  """A policy's per-seed numbers from its "all"-domain row (dataclasses.asdict of a Row)."""
  out = {k: row[k] for k in ("reward", "accuracy", "cost", "calls", "split_rate", "n")}
  # As the studies report it: E[acc] = reward + alpha x cost on the simulator (expected reward).
  out["expected_accuracy"] = row["reward"] + alpha * row["cost"] if simulated else row["accuracy"]
  return out


def seed_result(config, seed: int, alpha: float, routers: list[str], kwargs: dict, *,
                verbose: bool = False) -> dict:
  """One seed: {seed, n_train, n_test, llms, policies: {name: numbers}, seconds: {...}}."""
  def log(msg):
    if verbose:
      progress_lib.note(f"[feasibility] seed {seed}: {msg}")

  t0 = time.time()
  cfg = config_overrides.apply(config, {"seed": int(seed), "alpha": float(alpha)})
  log("building the system")
  system = system_lib.build(cfg)
  if not system.simulated:
    raise errors.ConfigError("the DP optimum needs the simulated pool (backend=sim)")
  seconds = dict(build=time.time() - t0)
  queries = system.test_queries
  env = system.env(alpha)
  log(f"DP optimum on {len(queries)} test queries")
  t1 = time.time()
  opt_states = evaluation.optimum_states(system, env, queries, seed=seed)
  rows = evaluation.summarize(OPTIMUM, system, env, queries, opt_states)
  seconds["optimum"] = time.time() - t1
  if routers:
    log(f"fitting {', '.join(routers)} on {len(system.train_queries)} training queries")
    t2 = time.time()
    data = labels_lib.collect(system, system.train_queries, seed=seed)
    fitted = single_round.fit_routers(routers, data, system.catalog, **dict(kwargs, seed=seed))
    r_rows, _ = single_round.evaluate_routers(system, alpha, fitted, queries, seed=seed)
    rows += r_rows
    seconds["routers"] = time.time() - t2
  seconds["total"] = time.time() - t0
  policies = {r.policy: _numbers(dataclasses.asdict(r), alpha, system.simulated)
              for r in rows if r.domain == "all"}
  o = policies[OPTIMUM]
  log(f"optimum reward {o['reward']:.4f}, {o['calls']:.2f} calls, split rate "
      f"{o['split_rate']:.2f}" + "".join(f"; router:{n} {policies['router:' + n]['reward']:.4f}"
                                          for n in routers)
      + f" ({seconds['total']:.0f}s)")
  return dict(seed=int(seed), n_train=len(system.train_queries), n_test=len(queries),
              llms=list(system.space.llms), policies=policies, seconds=seconds)


def interval(values) -> dict:
  """Mean and two-sided 95% Student-t interval of `values` (NaN bounds below two values)."""
  mean, half, n = stats.ci95(values)
  t = stats.t_critical_95(n - 1) if n >= 2 else math.nan
  return dict(mean=mean, half_width=half, low=mean - half, high=mean + half, n=n, dof=n - 1,
              t=t)


def paired(seeds: list[dict], a: str, b: str) -> dict:
  """Reward of policy a minus policy b, paired by seed: the differences and their interval;
  `contains_zero` None below two seeds."""
  diffs = [s["policies"][a]["reward"] - s["policies"][b]["reward"] for s in seeds]
  out = dict(a=a, b=b, seeds=[s["seed"] for s in seeds], differences=diffs, **interval(diffs))
  out["contains_zero"] = None if out["n"] < 2 else bool(out["low"] <= 0.0 <= out["high"])
  return out


def summary(seeds: list[dict]) -> dict:
  """{policy: {field: interval over seeds}} for every policy and number of FIELDS."""
  names = list(seeds[0]["policies"])
  return {p: {f: interval([s["policies"][p][f] for s in seeds]) for f in FIELDS
              if all(s["policies"][p][f] is not None for s in seeds)} for p in names}


def run(config, seeds: list[int], alpha: float, routers: list[str], *,
        verbose: bool = False) -> dict:
  """The feasibility record: the setting, per-seed results, summaries and paired intervals.
  Its `config` is the config as given, before each seed's `seed` and `alpha` are set."""
  if not seeds:
    raise errors.ConfigError("no seeds to run")
  if alpha < 0 or not math.isfinite(alpha):
    raise errors.ConfigError(f"--alpha={alpha}: must be a finite number >= 0")
  kwargs = router_kwargs(config)
  for n in routers:                       # every name checked before the first seed runs
    single_round.make_router(n, **kwargs)
  t0 = time.time()
  per_seed = [seed_result(config, s, alpha, routers, kwargs, verbose=verbose) for s in seeds]
  sim = config.get("sim")
  setting = dict(alpha=float(alpha), seeds=list(seeds), routers=list(routers),
                 router_kwargs=kwargs, llms=per_seed[0]["llms"], n_train=per_seed[0]["n_train"],
                 n_test=per_seed[0]["n_test"],
                 world=str(sim.world) if sim is not None else None,
                 world_file=str(sim.world_file) if sim is not None else None)
  return dict(
      what=("DP optimum and single-round routers on the test queries, per seed; reward is the "
            "expected reward E[U | calls] - alpha x cost; split_rate the share of test queries "
            "with >= 1 Planner call; intervals: mean and 95% Student-t half-width over seeds"),
      setting=setting, config=json.loads(config.to_json_best_effort()),
      seeds=per_seed, summary=summary(per_seed),
      paired={f"{OPTIMUM} - router:{n}": paired(per_seed, OPTIMUM, f"router:{n}")
              for n in routers},
      seconds=time.time() - t0)


def write(record: dict, path) -> None:
  """The record as indented JSON, atomically (NaN written as null)."""
  def clean(x):
    if isinstance(x, float) and not math.isfinite(x):
      return None
    if isinstance(x, dict):
      return {k: clean(v) for k, v in x.items()}
    if isinstance(x, list):
      return [clean(v) for v in x]
    return x
  files.write_json(path, clean(record), "the feasibility record", indent=1,
                   separators=(",", ": "))


def _pm(iv: dict, digits: int = 3) -> str:
  if math.isnan(iv["half_width"]):
    return f"{iv['mean']:.{digits}f}"
  return f"{iv['mean']:.{digits}f} ± {iv['half_width']:.{digits}f}"


def format_table(record: dict) -> str:
  """Markdown: one line per seed (the optimum's reward, E[acc], calls and split rate, each
  router's reward and the optimum's lead over it), the means with 95% t half-widths, and the
  paired intervals."""
  routers = record["setting"]["routers"]
  head = ["seed", "optimum reward", "optimum E[acc]", "optimum calls", "optimum split rate"]
  for n in routers:
    head += [f"router:{n} reward", f"optimum - router:{n}"]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for s in record["seeds"]:
    o = s["policies"][OPTIMUM]
    cells = [str(s["seed"]), f"{o['reward']:.4f}", f"{o['expected_accuracy']:.4f}",
             f"{o['calls']:.2f}", f"{o['split_rate']:.3f}"]
    for n in routers:
      r = s["policies"][f"router:{n}"]["reward"]
      cells += [f"{r:.4f}", f"{o['reward'] - r:+.4f}"]
    lines.append("| " + " | ".join(cells) + " |")
  sm = record["summary"][OPTIMUM]
  cells = ["mean ± 95% t", _pm(sm["reward"]), _pm(sm["expected_accuracy"]), _pm(sm["calls"], 2),
           _pm(sm["split_rate"])]
  for n in routers:
    cells += [_pm(record["summary"][f"router:{n}"]["reward"]),
              _pm(record["paired"][f"{OPTIMUM} - router:{n}"])]
  lines.append("| " + " | ".join(cells) + " |")
  st = record["setting"]
  lines.append("")
  lines.append(f"alpha {st['alpha']:g}, world {st['world']}, {len(st['llms'])} LLMs, "
               f"{st['n_train']} training / {st['n_test']} test queries, seeds "
               f"{','.join(map(str, st['seeds']))}; {record['seconds']:.0f}s")
  for name, p in record["paired"].items():
    if p["n"] < 2:
      lines.append(f"{name}: {p['mean']:+.4f} (one seed: no interval)")
    else:
      lines.append(f"{name}: {p['mean']:+.4f}, 95% t-interval [{p['low']:+.4f}, {p['high']:+.4f}] "
                   f"(t = {p['t']:.3f}, {p['dof']} dof); "
                   + ("contains 0" if p["contains_zero"] else "excludes 0"))
  return "\n".join(lines)
