"""Drift study: GraphPlanner when the pool changes during evaluation (simulator pool events).

For each seed the router is trained once on the configured pool (no event; the join event's LLM is
left out of training). For each event (quality_drop, price_rise, fail, join; config.study.drift_*)
the evaluated test stream has the event at query position t, and the cell records the expected
reward of every test query (E[U | calls] - alpha * cost, in stream order) for:
  online      the trained router, its history growing with the evaluated episodes (online memory);
  frozen      the trained router reading the history the training left (the default evaluation);
  no_history  the trained router with an empty history;
  retrained   the same router trained on the changed pool (the event acts on every training
              query), reading its own training history: the reference a router that knew the
              change could reach;
  optimum     the exact DP optimum of the pool at each query (the ceiling before and after);
  single:<m>  every single-LLM policy of the evaluated pool.
Strong multi-round and single-round baselines (Router-R1-style, KNN-multiround, the best
single-round router) are not among the arms yet.

Metrics (pure functions below, tested on small arrays):
  window_curve  mean reward in consecutive windows of `window` queries aligned at t (no window
                straddles the event; an incomplete last window is dropped), per seed, then the mean
                and 95% interval over seeds;
  recovery      the router's mean reward over the `window` queries starting `after` queries past
                t, as a fraction of the retrained router's mean reward over all queries from t on
                (undefined, NaN, when that reference mean is <= 0).
Cells are written atomically to <workdir>/<event>_seed<S>/cell.json; finished cells are skipped on
rerun and training runs resume (as in gp_jax/runs/studies/runner.py).
"""
from __future__ import annotations

import dataclasses
import math
import pathlib
import sys
import time

import numpy as np
from scipy import stats as scipy_stats

from gp_jax import errors
from gp_jax.runs import evaluate as evaluation
from gp_jax.runs import system as system_lib
from gp_jax.runs import train as training
from gp_jax.runs import workdir as workdir_config
from gp_jax.runs.studies import runner as runner_lib
from gp_jax.sim import optimal
from gp_jax.workflow import policies

STUDY = "drift"
EVENTS = ("quality_drop", "price_rise", "fail", "join")
ARMS = ("online", "frozen", "no_history", "retrained", "optimum")
TITLE = "Drift: the pool changes during evaluation (online memory vs frozen vs retrained)"


# ---- metrics ------------------------------------------------------------------------------------
def ci95(values) -> tuple[float, float, int]:
  """(mean, half-width of the 95% t-interval, n) over seeds; the half-width is NaN for n < 2."""
  v = np.asarray(values, float)
  if not len(v):
    return math.nan, math.nan, 0
  if len(v) < 2:
    return float(v[0]), math.nan, 1
  half = float(scipy_stats.t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / math.sqrt(len(v)))
  return float(v.mean()), half, len(v)


def window_means(rewards, t: int, window: int) -> tuple[np.ndarray, np.ndarray]:
  """Per-window mean rewards of one stream.

  Args:
    rewards: [n] reward of each query, in stream order.
    t: the event's position (0 <= t <= n).
    window: queries per window (>= 1).
  Returns:
    offsets [W]: first position of each window relative to t (multiples of window, negative
      before the event); means [W]. Windows are [t + o, t + o + window) and lie within [0, n).
  """
  r = np.asarray(rewards, float)
  n = len(r)
  if window < 1 or not 0 <= t <= n:
    raise ValueError(f"need window >= 1 and 0 <= t <= n, got window={window}, t={t}, n={n}")
  first = -(t // window)
  last = (n - t) // window            # windows entirely after t: 0 .. last-1
  offsets = np.arange(first, last) * window
  means = np.array([r[t + o:t + o + window].mean() for o in offsets])
  return offsets, means


def window_curve(rewards_by_seed, t: int, window: int) -> dict:
  """Mean and 95% interval over seeds of the per-window means (window_means).

  Args:
    rewards_by_seed: [S, n] rewards (one stream per seed, same t and n).
  Returns:
    dict(offsets [W], mean [W], half [W] (NaN for one seed), seeds S).
  """
  per_seed = [window_means(r, t, window) for r in rewards_by_seed]
  offsets = per_seed[0][0]
  table = np.stack([m for _, m in per_seed])          # [S, W]
  ci = [ci95(table[:, j]) for j in range(table.shape[1])]
  return dict(offsets=offsets.tolist(), mean=[c[0] for c in ci], half=[c[1] for c in ci],
              seeds=len(per_seed))


def recovery(router, reference, t: int, after: int, window: int) -> float:
  """The router's mean reward over queries [t + after, t + after + window) divided by the
  reference's mean reward over [t, n); NaN when that reference mean is <= 0."""
  r, ref = np.asarray(router, float), np.asarray(reference, float)
  lo, hi = t + after, t + after + window
  if after < 0 or window < 1 or hi > len(r) or len(ref) != len(r) or t >= len(r):
    raise ValueError(f"recovery window [{lo}, {hi}) does not fit a stream of {len(r)} queries "
                     f"with the event at {t}")
  base = ref[t:].mean()
  return float(r[lo:hi].mean() / base) if base > 0 else math.nan


# ---- the study ----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Settings:
  """config.study.drift_*, validated."""
  llm: str
  join_llm: str
  t: int
  delta: float
  price_scale: float
  window: int
  recovery_after: int
  events: tuple[str, ...]


def settings(config) -> Settings:
  s = config.study
  events = tuple(e.strip() for e in str(s.drift_events).split(",") if e.strip())
  for e in events:
    if e not in EVENTS:
      raise errors.unknown_name("drift event", e, EVENTS)
  if not events:
    raise errors.ConfigError("config.study.drift_events is empty")
  out = Settings(str(s.drift_llm), str(s.drift_join_llm), int(s.drift_t), float(s.drift_delta),
                 float(s.drift_price_scale), int(s.drift_window), int(s.drift_recovery_after),
                 events)
  n = int(config.data.n_test)
  if not 0 < out.t < n:
    raise errors.ConfigError(f"config.study.drift_t={out.t} must lie inside the test stream "
                             f"(0 < t < data.n_test={n})")
  if out.window < 1 or out.t + out.recovery_after + out.window > n or out.recovery_after < 0:
    raise errors.ConfigError(
        f"the recovery window [t + drift_recovery_after, + drift_window) = "
        f"[{out.t + out.recovery_after}, {out.t + out.recovery_after + out.window}) must fit the "
        f"{n} test queries (and drift_window >= 1)")
  train_llms = system_lib.select_llms(_catalog(config), config.llms)
  if "join" in events and out.join_llm in train_llms:
    raise errors.ConfigError(f"config.study.drift_join_llm={out.join_llm!r} is in the training "
                             "pool (config.llms): the join event needs an LLM new to the router")
  return out


def _catalog(config):
  from gp_jax.llm import catalog as catalog_lib
  return catalog_lib.load_catalog(config.catalog_file or catalog_lib.DEFAULT_POOL_FILE)


def event_overrides(kind: str, s: Settings, config) -> tuple[dict, dict]:
  """(evaluation overrides: the event at s.t of the test stream, retraining overrides: the event
  on every training query) as dotted config keys."""
  pre = "data.sim_events"
  fields = {"quality_drop": ("quality", s.llm, {"delta": s.delta}),
            "price_rise": ("price", s.llm, {"scale": s.price_scale}),
            "fail": ("fail", s.llm, {}),
            "join": ("join", s.join_llm, {})}[kind]
  sec, llm, extra = fields
  common = {f"{pre}.{sec}.llm": llm, **{f"{pre}.{sec}.{k}": v for k, v in extra.items()}}
  ev = {**common, f"{pre}.{sec}.t": s.t, f"{pre}.splits": "test"}
  re = {**common, f"{pre}.{sec}.t": 0, f"{pre}.splits": "train"}
  if kind == "join":   # evaluated (and retrained) on the pool with the new LLM
    pool = ",".join(system_lib.select_llms(_catalog(config), config.llms) + [llm])
    ev["llms"] = re["llms"] = pool
  return ev, re


def per_query_rewards(system, env, states) -> list[float]:
  """E[U | calls] - alpha * cost of each finished state of system.test_queries, in order."""
  return [evaluation.episode_stats(system, env, q, st)[2]
          for q, st in zip(system.test_queries, states)]


class DriftRunner:
  """Runs the drift study's (event, seed) cells into a workdir (resumable)."""

  def __init__(self, config, workdir, *, verbose: bool = True):
    self.config, self.workdir, self.verbose = config, pathlib.Path(workdir), verbose
    self.s = settings(config)
    self._runs: dict[tuple, tuple] = {}
    for kind in self.s.events:    # fail fast on bad overrides
      for o in event_overrides(kind, self.s, config):
        runner_lib.apply_overrides(config, o)

  def _log(self, msg: str) -> None:
    if self.verbose:
      print(msg, file=sys.stderr, flush=True)

  def run(self, seeds: list[int]) -> dict:
    workdir_config.check_or_record(self.workdir, self.config, ignore=("study.seeds",),
                                   what="drift study")
    t0, ran, skipped = time.time(), [], []
    for seed in seeds:
      for index, kind in enumerate(self.s.events):
        out = self.workdir / f"{kind}_seed{seed}"
        if (out / runner_lib.CELL_FILE).exists():
          skipped.append((kind, seed))
          continue
        out.mkdir(parents=True, exist_ok=True)
        rec = dict(self.run_cell(kind, seed), index=index)
        runner_lib._atomic_write(out / runner_lib.CELL_FILE, rec)
        ran.append((kind, seed))
        post = {a: float(np.mean(rec["rewards"][a][self.s.t:])) for a in ARMS}
        self._log(f"[drift] {kind} seed={seed}: post-event reward " +
                  ", ".join(f"{a} {v:.3f}" for a, v in post.items()) + f" ({rec['seconds']:.0f}s)")
    return dict(ran=ran, skipped=skipped, seconds=time.time() - t0)

  def _trained(self, overrides: dict, seed: int):
    """(config, system, model, params, history, dir) of the training run with `overrides`
    (trained or resumed once per process)."""
    key = (runner_lib._key(overrides), seed)
    if key not in self._runs:
      self._runs[key] = self._train(overrides, seed)
    return self._runs[key]

  def _train(self, overrides: dict, seed: int):
    cfg = runner_lib.apply_overrides(self.config, {"seed": int(seed), **overrides})
    sysm = system_lib.build(cfg)
    tdir = self.workdir / "train" / f"{runner_lib._key(overrides)}_seed{seed}"
    training.train(cfg, tdir, system=sysm, verbose=self.verbose)
    model, params, history = training.load_router(cfg, tdir, sysm)
    return cfg, sysm, model, params, runner_lib._history_for(cfg, history), tdir

  def run_cell(self, kind: str, seed: int) -> dict:
    t0 = time.time()
    ev, re = event_overrides(kind, self.s, self.config)
    tcfg, tsys, model, params, hist, tdir = self._trained({}, seed)
    ecfg = runner_lib.apply_overrides(tcfg, ev)
    esys = system_lib.build(ecfg)
    if hist is not None and not runner_lib.same_space(esys.space, tsys.space):
      hist = runner_lib.remap_history(hist, tsys.space, esys.space)
    alpha, parallel = float(tcfg.alpha), int(ecfg.train.parallel)
    env = esys.env(alpha)
    queries = esys.test_queries

    def router(p, h, online=False):
      return per_query_rewards(esys, env, evaluation.run_router(
          esys, env, model, p, h, queries, parallel=parallel, seed=seed, online=online))

    rewards = {"frozen": router(params, hist), "no_history": router(params, None)}
    rewards["online"] = router(params, hist, online=True) if hist is not None else rewards["frozen"]
    rcfg, rsys, _, rparams, rhist, rdir = self._trained(re, seed)
    if rhist is not None and not runner_lib.same_space(esys.space, rsys.space):
      rhist = runner_lib.remap_history(rhist, rsys.space, esys.space)
    rewards["retrained"] = router(rparams, rhist)
    solver = optimal.OptimalSolver(esys.world, esys.space, esys.mdp_cfg, alpha, esys.describe)
    rewards["optimum"] = per_query_rewards(esys, env, policies.run_policy(
        env, policies.oracle_policy(optimal.OraclePolicy(solver)), queries, seed=seed))
    for m in esys.space.llms:
      rewards[f"single:{m}"] = per_query_rewards(esys, env, policies.run_policy(
          env, policies.single_llm_policy(esys.space, m), queries, seed=seed))
    return dict(study=STUDY, variant=kind, seed=seed, alpha=alpha, t=self.s.t,
                window=self.s.window, recovery_after=self.s.recovery_after, eval_overrides=ev,
                retrain_overrides=re, llms=list(esys.space.llms), n_test=len(queries),
                online_history=hist is not None, rewards=rewards,
                train=dict(episodes=int(tcfg.train.episodes),
                           seconds=runner_lib._train_seconds(tdir),
                           retrained_seconds=runner_lib._train_seconds(rdir)),
                seconds=time.time() - t0)


# ---- report ---------------------------------------------------------------------------------------
def is_drift_cell(cell: dict) -> bool:
  return cell.get("study") == STUDY


def summarize(cells: list[dict]) -> dict:
  """Per event: per arm the window curve and the pre/post-event means (95% intervals over
  seeds), the best single LLM after the event (chosen on the post-event mean, labelled so), and
  the recovery of the online, frozen and no-history routers."""
  by_event: dict[str, list[dict]] = {}
  for c in sorted(cells, key=lambda c: (c.get("index", 0), c["seed"])):
    by_event.setdefault(c["variant"], []).append(c)
  out = {}
  for kind, cs in by_event.items():
    t, w, after = cs[0]["t"], cs[0]["window"], cs[0]["recovery_after"]
    if any((c["t"], c["window"], c["recovery_after"], c["n_test"]) != (t, w, after, cs[0]["n_test"])
           for c in cs):
      raise errors.DataError(f"drift cells of {kind} differ in t, window or stream length")
    singles = sorted(k for k in cs[0]["rewards"] if k.startswith("single:"))
    best = max(singles, key=lambda k: np.mean([np.mean(c["rewards"][k][t:]) for c in cs]))
    arms = list(ARMS) + [best]
    ev = {}
    for a in arms:
      r = [c["rewards"][a] for c in cs]
      ev[a] = dict(curve=window_curve(r, t, w), pre=ci95([np.mean(x[:t]) for x in r]),
                   post=ci95([np.mean(x[t:]) for x in r]))
      if a in ("online", "frozen", "no_history"):
        ev[a]["recovery"] = ci95([recovery(c["rewards"][a], c["rewards"]["retrained"], t, after, w)
                                  for c in cs])
    out[kind] = dict(arms=ev, best_single=best, t=t, window=w, after=after,
                     seeds=sorted(c["seed"] for c in cs), n_test=cs[0]["n_test"],
                     alpha=cs[0]["alpha"], overrides=cs[0]["eval_overrides"])
  return out


def _ci(c) -> str:
  return f"{c[0]:.3f}" + (f" ± {c[1]:.3f}" if not math.isnan(c[1]) else " (1 seed)")


def plot(summary: dict, path: pathlib.Path) -> None:
  """One panel per event: windowed reward since the event per arm, with 95% bands."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  kinds = list(summary)
  fig, axes = plt.subplots(1, len(kinds), figsize=(4.2 * len(kinds), 3.4), squeeze=False)
  for ax, kind in zip(axes[0], kinds):
    ev = summary[kind]
    for a, d in ev["arms"].items():
      x = np.asarray(d["curve"]["offsets"]) + ev["window"] / 2
      m, h = np.asarray(d["curve"]["mean"]), np.asarray(d["curve"]["half"])
      style = dict(ls=":", color="k") if a == "optimum" else {}
      ax.plot(x, m, marker=".", label=a, **style)
      if not np.isnan(h).all():
        ax.fill_between(x, m - h, m + h, alpha=0.15, **({"color": "k"} if a == "optimum" else {}))
    ax.axvline(0, color="grey", lw=0.8)
    ax.set_title(kind, fontsize=9)
    ax.set_xlabel("queries since the event (window centres)")
    ax.set_ylabel("expected reward")
  axes[0][0].legend(fontsize=6)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def markdown(cells: list[dict], figure: str | None) -> str:
  summary = summarize(cells)
  first = next(iter(summary.values()))
  out = [f"## {TITLE}", "",
         f"Alpha = {first['alpha']:g}; {first['n_test']} test queries per seed, the event at query "
         f"{first['t']}; windows of {first['window']} queries; seeds {first['seeds']}. Mean and "
         "95% t-interval over seeds of the mean expected reward per query. Recovery: the mean "
         f"reward of queries [t + {first['after']}, t + {first['after'] + first['window']}) over "
         "the retrained router's mean reward after the event. The best single LLM is chosen on "
         "its post-event reward (after the fact)."]
  if figure:
    out += ["", f"![drift]({figure})"]
  for kind, ev in summary.items():
    out += ["", f"### {kind} ({', '.join(f'{k}={v}' for k, v in ev['overrides'].items())})", "",
            "| arm | before the event | after the event | recovery |", "|---|---|---|---|"]
    for a, d in ev["arms"].items():
      rec = _ci(d["recovery"]) if "recovery" in d else "-"
      out.append(f"| {a} | {_ci(d['pre'])} | {_ci(d['post'])} | {rec} |")
  return "\n".join(out) + "\n"


def load_cells(path: pathlib.Path) -> list[dict]:
  cells = [errors.read_json(f, "drift cell") for f in sorted(path.glob(f"*/{runner_lib.CELL_FILE}"))]
  if any(not isinstance(c, dict) or not is_drift_cell(c) or "rewards" not in c for c in cells):
    raise errors.DataError(f"{path}: a cell.json is not a drift study cell")
  return cells


def write_report(workdir, out=None) -> pathlib.Path:
  """<workdir>/report.md and report.png (or `out` and its .png) from the finished cells."""
  workdir = pathlib.Path(workdir)
  cells = load_cells(workdir)
  if not cells:
    raise errors.DataError(f"{workdir}: no finished drift cells")
  out = pathlib.Path(out) if out else workdir / "report.md"
  png = out.with_suffix(".png")
  plot(summarize(cells), png)
  tmp = out.with_suffix(".tmp")
  tmp.write_text(markdown(cells, png.name))
  tmp.replace(out)
  return out

