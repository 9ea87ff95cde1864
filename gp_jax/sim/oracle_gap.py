r"""Fitting the v2 world's cluster-offset size to a published oracle-over-best-single gap.

The source: LLMRouterBench (github.com/ynulihao/LLMRouterBench, README Table 7), a pool of 20
LLMs of about 7B parameters on 15 data sets, reports the per-query oracle (a query counts as
solved when any LLM of the pool answers it correctly, on realised outcomes) at 91.64 against 73.10
for the best single LLM. Three ways to read the pair:

  gap_points       oracle - best, in points (18.54)
  ratio            oracle / best (1.254)
  recovered_share  (oracle - best) / (100 - best): the share of the best single LLM's misses that
                   some other LLM of the pool answers (0.689); the only one free of the level

The simulator's side (gp_jax/sim/world.py `oracle_gap`): on N simulated test queries of the seen
tasks (split `SPLIT`, seed s), direct answers, the best single LLM's expected accuracy and the
expected accuracy of the per-query oracle over outcomes sampled independently per LLM given the
latents, 1 - prod_m (1 - p_m), averaged over the queries. Every setting of `cluster_offset_sd`
sees the same queries (their latents, clusters and texts do not depend on it) and the same unit
offsets z (world.cluster_offsets: fixed per (domain, LLM)), so the quantities are smooth,
deterministic functions of the size: common random numbers. `fit` bisects the size at which a
quantity crosses a target between size 0 and `MAX_SD`. The readings grow with the size beyond
about 1 logit; below it the best single LLM can gain faster than the oracle (on 150 queries of a
3-LLM pool the share dips from size 0 to 0.8), so bisection returns a crossing, the one of the
bracket it narrows to (docs/lab/2026-12-07-oracle-gap.md). A target below the value at
size 0 or above the value at `MAX_SD` is a ConfigError naming both values.

Pure functions of their arguments (numpy); the runner is experiments/oracle_gap.py.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from gp_jax import errors
from gp_jax.llm import catalog as catalog_lib
from gp_jax.sim import calibration
from gp_jax.sim import simulator as sim
from gp_jax.sim import world as world_lib

SOURCE = ("LLMRouterBench (github.com/ynulihao/LLMRouterBench, README Table 7): 20 LLMs of about "
          "7B parameters on 15 data sets, per-query oracle 91.64 against 73.10 for the best "
          "single LLM, on realised outcomes")
BENCH_BEST, BENCH_ORACLE = 73.10, 91.64
QUANTITIES = ("recovered_share", "gap_points", "ratio")
SAME_KIND_B = (7.0, 9.0)    # "about 7B": the catalog's LLMs of 7 to 9 billion parameters
SPLIT = "oracle-gap"        # the simulated queries' split name (their own stream)
MAX_SD = 6.0                # the search's upper end, logit
TOLERANCE = 0.005           # the search stops once the bracket is this narrow, logit
TABLE_SIZES = (0.0, 0.4, 0.8, 1.2, 1.6, 2.0, 2.4, 2.8, 3.2)   # cluster_offset_sd of the table
BENCH_POOL_SIZE = 20        # LLMRouterBench's pool: the replicated-pool check's size


def levels(best: float, oracle: float) -> dict[str, float]:
  """The three readings of a (best single, oracle) pair in points (module docstring)."""
  if not 0 < best < 100:
    raise errors.ConfigError(f"best single accuracy {best} must lie strictly between 0 and 100")
  return {"best_single": best, "oracle": oracle, "gap_points": oracle - best,
          "ratio": oracle / best, "recovered_share": (oracle - best) / (100.0 - best)}


def bench() -> dict[str, float]:
  """LLMRouterBench's readings (`SOURCE`)."""
  return levels(BENCH_BEST, BENCH_ORACLE)


def check_quantity(quantity: str) -> str:
  if quantity not in QUANTITIES:
    raise errors.unknown_name("matched quantity", quantity, QUANTITIES)
  return quantity


def check_target(quantity: str, target: float) -> float:
  """A target in the quantity's range (a share in (0, 1), a gap in (0, 100), a ratio > 1)."""
  lo, hi = {"recovered_share": (0.0, 1.0), "gap_points": (0.0, 100.0),
            "ratio": (1.0, math.inf)}[check_quantity(quantity)]
  if not (math.isfinite(target) and lo < target < hi):
    raise errors.ConfigError(f"target {target!r} for {quantity} must lie in ({lo:g}, {hi:g})")
  return float(target)


def same_kind_pool(catalog, size_b: tuple[float, float] = SAME_KIND_B) -> list[str]:
  """The catalog's LLMs whose size lies in `size_b` (billions, both ends included), in order."""
  lo, hi = size_b
  return [m.name for m in catalog.llms if lo <= m.size_b <= hi]


def replicate_pool(profiles: dict, params: world_lib.WorldParams, n: int
                   ) -> tuple[dict, world_lib.WorldParams]:
  """A pool of n LLMs made by repeating `profiles` in turn: the k-th copy (k >= 2) of LLM m is
  named "m~k" and has m's skills and skill shift; its cluster offsets are its own draws (they are
  keyed by name).

  A stand-in for a larger pool of the same kind; returns the profiles and the params carrying the
  copies' skill shifts."""
  if n < 1:
    raise errors.ConfigError(f"a replicated pool needs n >= 1 LLMs, got {n}")
  names = sorted(profiles)
  out, shifts = {}, dict(params.skill_shift)
  for i in range(n):
    m = names[i % len(names)]
    name = m if i < len(names) else f"{m}~{i // len(names) + 1}"
    out[name] = dataclasses.replace(profiles[m], name=name)
    shifts[name] = params.shift_of(m)
  return out, params.replace(skill_shift=shifts)


def measure(profiles: dict, params: world_lib.WorldParams, *, n_queries: int, seed: int
            ) -> dict:
  """`levels` of the pool `profiles` in the world `params` on n_queries simulated test queries
  (seed `seed`), plus the best LLM's name and the oracle that knows the probabilities."""
  world = sim.SimWorld(profiles, params=params)
  queries = world.sample_queries(n_queries, seed=seed, split=SPLIT)
  g = world_lib.oracle_gap(world, queries, sorted(profiles))
  return dict(levels(100.0 * g["best_single"], 100.0 * g["oracle"]), best_llm=g["best_llm"],
              oracle_expected=100.0 * g["oracle_expected"],
              cluster_offset_sd=params.cluster_offset_sd, n_queries=n_queries, seed=seed)


def at_size(profiles: dict, params: world_lib.WorldParams, sd: float, *, n_queries: int,
            seeds) -> dict:
  """`measure` at cluster_offset_sd = sd on every seed: per-seed rows and each reading's mean."""
  rows = [measure(profiles, params.replace(cluster_offset_sd=float(sd)), n_queries=n_queries,
                  seed=s) for s in seeds]
  mean = {k: float(np.mean([r[k] for r in rows]))
          for k in ("best_single", "oracle", "gap_points", "ratio", "recovered_share",
                    "oracle_expected")}
  return dict(mean, cluster_offset_sd=float(sd), seeds=list(seeds), per_seed=rows)


def fit(profiles: dict, params: world_lib.WorldParams, *, quantity: str, target: float,
        n_queries: int, seed: int, max_sd: float = MAX_SD, tolerance: float = TOLERANCE) -> dict:
  """The cluster_offset_sd in [0, max_sd] at which `quantity` equals `target` on one seed's
  queries, by bisection (module docstring). Raises ConfigError when the target lies outside the
  values at the two ends."""
  check_target(quantity, target)

  def value(sd):
    return measure(profiles, params.replace(cluster_offset_sd=sd), n_queries=n_queries,
                   seed=seed)[quantity]

  lo, hi = 0.0, float(max_sd)
  v_lo, v_hi = value(lo), value(hi)
  evaluations = 2
  if not v_lo <= target <= v_hi:
    where = "below" if target < v_lo else "above"
    raise errors.ConfigError(
        f"{quantity} target {target:.4g} is {where} what the cluster offsets can give on this "
        f"pool: {v_lo:.4g} at cluster_offset_sd=0, {v_hi:.4g} at {max_sd:g} ({n_queries} queries, "
        f"seed {seed})")
  while hi - lo > tolerance:
    mid = 0.5 * (lo + hi)
    v = value(mid)
    evaluations += 1
    if v < target:
      lo, v_lo = mid, v
    else:
      hi, v_hi = mid, v
  # linear interpolation inside the final bracket
  sd = lo if v_hi == v_lo else lo + (hi - lo) * (target - v_lo) / (v_hi - v_lo)
  return {"cluster_offset_sd": float(sd), "seed": seed, "evaluations": evaluations,
          "bracket": [lo, hi]}


def fit_seeds(profiles: dict, params: world_lib.WorldParams, *, quantity: str, target: float,
              n_queries: int, seeds, **kwargs) -> dict:
  """`fit` on each seed's query set: per-seed sizes, their mean, standard deviation and range."""
  rows = [fit(profiles, params, quantity=quantity, target=target, n_queries=n_queries, seed=s,
              **kwargs) for s in seeds]
  sds = np.array([r["cluster_offset_sd"] for r in rows])
  return {"quantity": quantity, "target": float(target), "n_queries": n_queries,
          "seeds": list(seeds), "per_seed": rows, "mean": float(sds.mean()),
          "sd": float(sds.std(ddof=1)) if len(sds) > 1 else 0.0,
          "min": float(sds.min()), "max": float(sds.max())}


def offset_rms(profiles: dict, params: world_lib.WorldParams) -> float:
  """The root mean square of the unit offsets z the pool actually draws, over every (domain,
  cluster, LLM): centring over K clusters makes its expectation about sqrt((K - 1) / K) (0.91 at
  K = 6), so the offsets a query meets spread by about this times cluster_offset_sd."""
  world = sim.SimWorld(profiles, params=params.replace(cluster_offset_sd=1.0))
  domains = sorted({d for p in profiles.values() for d in p.theta})
  z = [world.cluster_offset(d, c, m) for d in domains for c in range(params.clusters_per_domain)
       for m in profiles]
  return float(np.sqrt(np.mean(np.square(z))))


def base_params(base) -> world_lib.WorldParams:
  """The parameters of a world file's JSON in the form experiments.calibrate writes it."""
  if not isinstance(base, dict) or not isinstance(base.get("params"), dict):
    raise errors.DataError('the base world file must hold an object {"params": {...}}')
  return world_lib.WorldParams.from_json(base["params"], where="the base world file")


def world_file(base: dict, sd: float, about: str, record: dict) -> dict:
  """The content of a world file: `base` (a world file's JSON, {"params": {...}, ...}) with
  cluster_offset_sd = sd, `about` replaced, and `record` under "oracle_gap_fit". Nothing else of
  the params changes; the result loads with world.load_world_file."""
  base_params(base)   # checks it
  out = dict(base, about=about, oracle_gap_fit=record)
  out["params"] = dict(base["params"], cluster_offset_sd=float(sd))
  return out


def calibration_rmse(catalog, params: world_lib.WorldParams, settings: calibration.Settings
                     ) -> float:
  """The calibration's fit RMSE in points (gp_jax/sim/calibration.py) of the world `params`, on
  the queries and pool of calibration `settings`: whether a changed world still meets the paper."""
  llms = tuple(settings.llms)
  setup = calibration.Setup(sim.load_profiles(catalog.select(list(llms))), llms, settings.seed,
                            settings.n_train, settings.n_test, settings.n_unseen, params)
  measured = calibration.measure(setup, params)
  return calibration.rmse(calibration.compare(calibration.load_fit_targets(), measured))


def _brief(row: dict) -> dict:
  """An `at_size` row without its per-seed rows, with the recovered share's range over seeds."""
  shares = [r["recovered_share"] for r in row["per_seed"]]
  out = {k: v for k, v in row.items() if k not in ("per_seed", "seeds")}
  out["recovered_share_range"] = [min(shares), max(shares)]
  out["best_llms"] = sorted({r["best_llm"] for r in row["per_seed"]})
  return out


def study(catalog, base: dict, *, quantity: str = "recovered_share", target: float | None = None,
          n_queries: int, seeds, table_sizes=TABLE_SIZES, replicate_to: int = BENCH_POOL_SIZE,
          calibration_settings: calibration.Settings | None = None) -> dict:
  """The whole fit (the runner's record): the same-kind pool, the per-seed fits and the value
  kept (their mean, to 0.01 logit), the table over `table_sizes`, the readings at the kept value
  on the same-kind pool, on the catalog's training pool and on a same-kind pool replicated to
  `replicate_to` LLMs, the unit offsets' realised spread, and (with `calibration_settings`) the
  calibration RMSE before and after.

  Args:
    catalog: the LLM catalog (gp_jax/llm/catalog.py).
    base: the base world file's JSON ({"params": {...}, ...}).
    quantity: one of QUANTITIES.
    target: its value to match; None: LLMRouterBench's (`bench`).
    n_queries: simulated test queries per seed.
    seeds: the query sets' seeds.
    table_sizes: cluster_offset_sd values of the table.
    replicate_to: the replicated pool's size (0: no replicated pool).
    calibration_settings: the calibration whose RMSE to report (None: not reported).
  """
  check_quantity(quantity)
  target = check_target(quantity, bench()[quantity] if target is None else float(target))
  if n_queries < 1 or not seeds:
    raise errors.ConfigError("the fit needs n_queries >= 1 and at least one seed")
  params = base_params(base)
  pool = same_kind_pool(catalog)
  if len(pool) < 2:
    raise errors.ConfigError(f"the catalog has {len(pool)} LLM(s) of {SAME_KIND_B[0]:g} to "
                             f"{SAME_KIND_B[1]:g}B parameters; the oracle needs at least 2")
  profiles = sim.load_profiles(catalog.select(pool))
  fitted = fit_seeds(profiles, params, quantity=quantity, target=target, n_queries=n_queries,
                     seeds=seeds)
  kept = round(fitted["mean"], 2)
  sizes = sorted(set(float(x) for x in table_sizes) | {params.cluster_offset_sd, kept})
  table = [_brief(at_size(profiles, params, x, n_queries=n_queries, seeds=seeds)) for x in sizes]
  train = catalog_lib.training_names(catalog)
  train_profiles = sim.load_profiles(catalog.select(train))
  pools = {f"same_kind ({len(pool)} LLMs)": (profiles, params)}
  pools[f"training ({len(train)} LLMs)"] = (train_profiles, params)
  if replicate_to:
    pools[f"same_kind replicated to {replicate_to}"] = replicate_pool(profiles, params,
                                                                      replicate_to)
  readings = {name: {f"{x:g}": _brief(at_size(p, q, x, n_queries=n_queries, seeds=seeds))
                     for x in (0.0, params.cluster_offset_sd, kept)}
              for name, (p, q) in pools.items()}
  out = {"source": SOURCE, "bench": bench(), "quantity": quantity, "target": target,
         "pool": pool, "training_pool": train, "n_queries": n_queries, "seeds": list(seeds),
         "split": SPLIT, "base_cluster_offset_sd": params.cluster_offset_sd, "fit": fitted,
         "cluster_offset_sd": kept, "table": table, "pools": readings,
         "offset_rms_per_unit_sd": offset_rms(profiles, params)}
  if calibration_settings is not None:
    out["calibration_rmse_points"] = {
        "base": calibration_rmse(catalog, params, calibration_settings),
        "fitted": calibration_rmse(catalog, params.replace(cluster_offset_sd=kept),
                                   calibration_settings)}
  return out


def about(record: dict) -> str:
  """The fitted world file's `about` line."""
  return (f"v2 world file with cluster_offset_sd = {record['cluster_offset_sd']:g} (was "
          f"{record['base_cluster_offset_sd']:g}) fitted by experiments.oracle_gap: on the "
          f"{len(record['pool'])} catalog LLMs of 7-9B, the {record['quantity']} of the per-query "
          f"oracle over the best single LLM matches {record['target']:.4g}, from "
          f"LLMRouterBench (github.com/ynulihao/LLMRouterBench, README Table 7); every other "
          f"parameter as in the base file (docs/lab/2026-12-07-oracle-gap.md)")


def _fmt_row(name: str, r: dict) -> str:
  lo, hi = r["recovered_share_range"]
  return (f"| {name} | {r['best_single']:.1f} | {r['oracle']:.1f} | {r['gap_points']:.2f} | "
          f"{r['ratio']:.3f} | {r['recovered_share']:.3f} ({lo:.3f} to {hi:.3f}) | "
          f"{r['oracle_expected']:.1f} |")


_HEADER = ["| {} | best single | oracle | gap (points) | ratio | recovered share (seed range) | "
           "oracle knowing p |", "|---|---|---|---|---|---|---|"]


def render(record: dict) -> str:
  """The record as a short markdown report."""
  b, f = record["bench"], record["fit"]
  per_seed = ", ".join(f"{r['cluster_offset_sd']:.3f}" for r in f["per_seed"])
  lines = [f"# Oracle gap fit: {record['quantity']} = {record['target']:.4g}", "",
           f"Source: {record['source']} (gap {b['gap_points']:.2f} points, ratio "
           f"{b['ratio']:.3f}, recovered share {b['recovered_share']:.3f}).", "",
           f"Same-kind pool: {', '.join(record['pool'])}. {record['n_queries']} simulated test "
           f"queries per seed, seeds {', '.join(map(str, record['seeds']))}.", "",
           f"Fitted cluster_offset_sd per seed: {per_seed}; mean "
           f"{f['mean']:.3f}, sd {f['sd']:.3f}, range {f['min']:.3f} to {f['max']:.3f}; kept "
           f"{record['cluster_offset_sd']:g}. Realised unit offsets' RMS "
           f"{record['offset_rms_per_unit_sd']:.3f}.", "",
           "Same-kind pool, means over the seeds:", "", _HEADER[0].format("cluster_offset_sd"),
           _HEADER[1]]
  lines += [_fmt_row(f"{r['cluster_offset_sd']:g}", r) for r in record["table"]]
  lines += ["", "By pool:", "", _HEADER[0].format("pool, cluster_offset_sd"), _HEADER[1]]
  for name, rows in record["pools"].items():
    lines += [_fmt_row(f"{name}, {x}", r) for x, r in rows.items()]
  if "calibration_rmse_points" in record:
    c = record["calibration_rmse_points"]
    lines += ["", f"Calibration fit RMSE (gp_jax/sim/calibration.py, its default queries): "
              f"{c['base']:.2f} points at {record['base_cluster_offset_sd']:g}, {c['fitted']:.2f} "
              f"at {record['cluster_offset_sd']:g}."]
  return "\n".join(lines) + "\n"
