"""The drift study's report: its metrics, the summary over seeds, the table and the figure.

The study runner (gp_jax/runs/studies/drift.py) writes one cell per (event, seed); this module
reads finished cells and turns them into numbers (pure functions below, tested on small arrays):
  window_curve  mean reward in consecutive windows of `window` queries aligned at t (no window
                straddles the event; an incomplete last window is dropped), per seed, then the mean
                and 95% interval over seeds;
  recovery      the router's mean reward over the `window` queries starting `after` queries past
                t, as a fraction of the retrained router's mean reward over all queries from t on
                (undefined, NaN, when that reference mean is <= 0);
  gap_closure   (arm - frozen) / (retrained - frozen) of the mean rewards over the queries
                [t + closure_after, t + closure_after + closure_len), per seed (undefined, NaN, for
                a seed where retraining gains nothing: retrained - frozen <= 0), then the mean and
                paired 95% interval over the seeds where it is defined (stats.ci95; the count of
                seeds left out is reported).
The summary also reports two after-the-fact choices, labelled so: the best single LLM and the best
single-round router, each the one with the highest post-event mean over seeds.
"""
from __future__ import annotations

import math
import pathlib

import numpy as np

from gp_jax import errors
from gp_jax import files
from gp_jax import stats
from gp_jax.runs.studies import runner as runner_lib
from gp_jax.runs.studies.drift import (ARMS, BAND_ARMS, BEST_ROUTER, BEST_SINGLE, ROUTER_PREFIX,
                                       STUDY, TITLE, missing_arms)

__all__ = ["ARMS", "BAND_ARMS", "BEST_ROUTER", "BEST_SINGLE", "ROUTER_PREFIX", "STUDY", "TITLE"]


# ---- metrics ------------------------------------------------------------------------------------
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
  ci = [stats.ci95(table[:, j]) for j in range(table.shape[1])]
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


def gap_closure(arm, frozen, retrained, lo: int, hi: int) -> float:
  """(mean arm - mean frozen) / (mean retrained - mean frozen) over queries [lo, hi) of one
  stream; NaN when retraining gains nothing there (retrained - frozen <= 0)."""
  a, f, r = (np.asarray(x, float) for x in (arm, frozen, retrained))
  if not 0 <= lo < hi <= len(a) or len(f) != len(a) or len(r) != len(a):
    raise ValueError(f"gap-closure window [{lo}, {hi}) does not fit a stream of {len(a)} queries")
  gap = r[lo:hi].mean() - f[lo:hi].mean()
  return float((a[lo:hi].mean() - f[lo:hi].mean()) / gap) if gap > 0 else math.nan


def closure_over_seeds(arm_by_seed, frozen_by_seed, retrained_by_seed, lo: int, hi: int) -> dict:
  """Per-seed gap closures, and their mean and paired 95% interval over the seeds where it is
  defined (the arm, the frozen and the retrained router share each seed's stream)."""
  per = [gap_closure(a, f, r, lo, hi)
         for a, f, r in zip(arm_by_seed, frozen_by_seed, retrained_by_seed)]
  ok = [x for x in per if not math.isnan(x)]
  mean, half = stats.ci95(ok)[:2] if ok else (math.nan, math.nan)
  return dict(mean=mean, half=half, per_seed=per, undefined=len(per) - len(ok), lo=lo, hi=hi)


def closure_of_seed_means(arm_by_seed, frozen_by_seed, retrained_by_seed, lo: int, hi: int,
                          min_gap: float) -> dict:
  """Gap closure of the seed-mean rewards over queries [lo, hi): mean over seeds of (arm -
  frozen) divided by the mean over seeds of (retrained - frozen). Unlike closure_over_seeds it
  divides by no seed's own gap, so a seed where retraining gains nothing still counts (through
  its arm - frozen) and a seed with a tiny gap cannot blow up the mean. Defined when the mean
  gap is at least `min_gap` (NaN otherwise). The paired 95% interval reported is that of arm -
  frozen over seeds (the closure is above 0 exactly when it is, given a positive gap)."""
  def seed_means(by_seed):
    out = []
    for x in by_seed:
      x = np.asarray(x, float)
      if not 0 <= lo < hi <= len(x):
        raise ValueError(f"gap-closure window [{lo}, {hi}) does not fit a stream of {len(x)} "
                         "queries")
      out.append(x[lo:hi].mean())
    return np.array(out)
  a, f, r = (seed_means(x) for x in (arm_by_seed, frozen_by_seed, retrained_by_seed))
  if not len(a) == len(f) == len(r) > 0:
    raise ValueError("the arm, frozen and retrained streams need one per seed, the same seeds")
  gap = float(np.mean(r - f))
  gain, half, _ = stats.ci95(a - f)
  closure = float(gain / gap) if gap >= min_gap else math.nan
  return dict(closure=closure, gap=gap, min_gap=min_gap, minus_frozen=gain,
              minus_frozen_half=half, per_seed_gap=(r - f).tolist(),
              per_seed_minus_frozen=(a - f).tolist(), lo=lo, hi=hi)


CLOSURE_SKIP = ("frozen", "retrained", "optimum")   # arms without a gap closure
CLOSURE_AXIS = 2.0   # the figure's gap-closure axis spans [-2, 2] (the table has every value)


# ---- report ---------------------------------------------------------------------------------------
def is_drift_cell(cell: dict) -> bool:
  return cell.get("study") == STUDY


def _best_after(cs: list[dict], prefix: str, t: int) -> str | None:
  """The arm named `prefix`... with the highest post-event mean over the cells (after the fact)."""
  names = sorted(k for k in cs[0]["rewards"] if k.startswith(prefix))
  return max(names, key=lambda k: np.mean([np.mean(c["rewards"][k][t:]) for c in cs]),
             default=None)


def summarize(cells: list[dict]) -> dict:
  """Per event: per arm the window curve and the pre/post-event means (95% intervals over
  seeds), and the recovery of every arm but the retrained router and the optimum. The arms are
  ARMS and, chosen after the fact on the post-event mean (labelled so), the best single LLM and
  the best single-round router; `best` names the arm behind each such label."""
  check_arms(cells, "drift summary")
  by_event: dict[str, list[dict]] = {}
  for c in sorted(cells, key=lambda c: (c.get("index", 0), c["seed"])):
    by_event.setdefault(c["variant"], []).append(c)
  out = {}
  for kind, cs in by_event.items():
    t, w, after = cs[0]["t"], cs[0]["window"], cs[0]["recovery_after"]
    if any((c["t"], c["window"], c["recovery_after"], c["n_test"]) != (t, w, after, cs[0]["n_test"])
           or sorted(c["rewards"]) != sorted(cs[0]["rewards"]) for c in cs):
      raise errors.DataError(f"drift cells of {kind} differ in t, window, stream length or arms")
    best = {label: arm for label, arm in ((BEST_SINGLE, _best_after(cs, "single:", t)),
                                          (BEST_ROUTER, _best_after(cs, ROUTER_PREFIX, t)))
            if arm is not None}
    ca, cl = cs[0].get("closure_after", 50), cs[0].get("closure_len", 150)
    lo, hi = t + ca, min(t + ca + cl, cs[0]["n_test"])
    ev = {}
    for label in list(ARMS) + list(best):
      r = [c["rewards"][best.get(label, label)] for c in cs]
      ev[label] = dict(curve=window_curve(r, t, w), pre=stats.ci95([np.mean(x[:t]) for x in r]),
                       post=stats.ci95([np.mean(x[t:]) for x in r]))
      if label not in CLOSURE_SKIP and lo < hi:
        ev[label]["closure"] = closure_over_seeds(
            r, [c["rewards"]["frozen"] for c in cs], [c["rewards"]["retrained"] for c in cs],
            lo, hi)
      if label not in ("retrained", "optimum"):
        ev[label]["recovery"] = stats.ci95([recovery(x, c["rewards"]["retrained"], t, after, w)
                                      for x, c in zip(r, cs)])
      if all(label in c.get("event_llm_share", {}) for c in cs):
        spans = min(len(c["event_llm_share"][label]) for c in cs)   # 2 in older cells
        ev[label]["share"] = [stats.ci95([c["event_llm_share"][label][j] for c in cs])
                              for j in range(spans)]
    out[kind] = dict(arms=ev, best=best, t=t, window=w, after=after,
                     event_llm=cs[0].get("event_llm"), vs_frozen=vs_frozen(cs, t),
                     seeds=sorted(c["seed"] for c in cs), n_test=cs[0]["n_test"],
                     closure=(lo, hi), online_parallel=cs[0].get("online_parallel"),
                     online_row_utility=cs[0].get("online_row_utility",
                                                  "reward utility of the episode, on every call"),
                     alpha=cs[0]["alpha"], overrides=cs[0]["eval_overrides"])
  return out


MEMORY_ARMS = ("online", "online_recent", "no_history")   # compared with frozen, paired per seed


def vs_frozen(cells: list[dict], t: int) -> dict:
  """Per memory arm, against the frozen router on the same seed's stream after the event: the
  paired difference of the post-event means (95% interval over seeds) and the mean number of
  post-event queries whose reward differs at all (the decisions the memory changed)."""
  out = {}
  for a in MEMORY_ARMS:
    pairs = [(np.asarray(c["rewards"][a][t:], float), np.asarray(c["rewards"]["frozen"][t:], float))
             for c in cells]
    out[a] = dict(diff=stats.ci95([x.mean() - f.mean() for x, f in pairs]),
                  changed=float(np.mean([int((np.abs(x - f) > 1e-12).sum()) for x, f in pairs])),
                  queries=int(len(pairs[0][0])))
  return out


def _ci(c) -> str:
  return f"{c[0]:.3f}" + (f" ± {c[1]:.3f}" if not math.isnan(c[1]) else " (1 seed)")


def plot(summary: dict, path: pathlib.Path) -> None:
  """One column per event: windowed reward since the event per arm (95% bands of BAND_ARMS) and,
  below, each arm's gap closure with its paired 95% interval over seeds."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  kinds = list(summary)
  fig, axes = plt.subplots(2, len(kinds), figsize=(5.2 * len(kinds), 8.0), squeeze=False)
  for ax, kind in zip(axes[1], kinds):
    ev = summary[kind]
    names = [a for a, d in ev["arms"].items() if "closure" in d]
    m = [ev["arms"][a]["closure"]["mean"] for a in names]
    h = [ev["arms"][a]["closure"]["half"] for a in names]
    y = np.arange(len(names))
    ax.barh(y, np.nan_to_num(m), xerr=np.nan_to_num(h), color="tab:blue", alpha=0.7)
    ax.set_yticks(y, [a.replace(" (after the fact)", " *") for a in names], fontsize=6)
    ax.axvline(0, color="grey", lw=0.8)
    ax.axvline(1, color="k", lw=0.8, ls=":")
    ax.set_xlim(-CLOSURE_AXIS, CLOSURE_AXIS)   # a seed with a tiny gap makes wide intervals
    lo, hi = ev["closure"]
    ax.set_xlabel(f"gap closure, queries [{lo}, {hi})\n(1 = retrained; * after the fact; axis cut "
                  f"at ±{CLOSURE_AXIS:g})", fontsize=7)
  for ax, kind in zip(axes[0], kinds):
    ev = summary[kind]
    # The axis follows the means: with few seeds the t-intervals are far wider than the
    # differences between arms; bands are drawn for BAND_ARMS only (the table has every one).
    means = np.concatenate([np.asarray(d["curve"]["mean"], float) for d in ev["arms"].values()])
    lo, hi = float(np.nanmin(means)), float(np.nanmax(means))
    ax.set_ylim(lo - 0.15 * (hi - lo + 1e-3), hi + 0.15 * (hi - lo + 1e-3))
    for a, d in ev["arms"].items():
      x = np.asarray(d["curve"]["offsets"]) + ev["window"] / 2
      m, h = np.asarray(d["curve"]["mean"]), np.asarray(d["curve"]["half"])
      style = (dict(ls=":", color="k") if a == "optimum" else
               dict(lw=2.2, zorder=5) if a == "online" else {})   # online on top of frozen
      ax.plot(x, m, marker=".", label=a, **style)
      if a in BAND_ARMS and not np.isnan(h).all():
        ax.fill_between(x, m - h, m + h, alpha=0.12, color=ax.lines[-1].get_color())
    ax.axvline(0, color="grey", lw=0.8)
    chosen = ", ".join(v.split(":", 1)[1] for v in ev.get("best", {}).values())
    ax.set_title(kind + (f"\n(best after the fact: {chosen})" if chosen else ""), fontsize=8)
    ax.set_xlabel("queries since the event (window centres)")
    ax.set_ylabel("expected reward")
  handles, labels = axes[0][0].get_legend_handles_labels()
  fig.legend(handles, labels, loc="lower center", ncol=5, fontsize=7, frameon=False)
  fig.tight_layout(rect=(0, 0.08, 1, 1))
  fig.savefig(path, dpi=110)
  plt.close(fig)


def markdown(cells: list[dict], figure: str | None, title: str | None = None) -> str:
  summary = summarize(cells)
  first = next(iter(summary.values()))
  out = [f"## {title or TITLE}", "",
         f"Alpha = {first['alpha']:g}; {first['n_test']} test queries per seed, the event at query "
         f"{first['t']}; windows of {first['window']} queries; seeds {first['seeds']}. Mean and "
         "95% t-interval over seeds of the mean expected reward per query. Recovery: the mean "
         f"reward of queries [t + {first['after']}, t + {first['after'] + first['window']}) over "
         "the retrained router's mean reward after the event. GraphPlanner's arms: online, frozen "
         "and no-history memory; retrained on the changed pool (the reference). multi:router_r1 "
         "(Router-R1-style) and multi:knn (KNN-multiround) are fitted on the pre-event pool, as "
         "are the single-round routers; the best single LLM and the best single-round router are "
         "chosen on their post-event reward (after the fact), the arm chosen in brackets. "
         "In the figure the shaded bands are the 95% intervals of the online and retrained arms. "
         "online_recent: online memory in a recency window (the newest rows only). Share: the "
         "fraction of the arm's calls made with the event's LLM, before / after the event (/ from "
         "t + closure_after on, in cells that record it)."]
  if figure:
    out += ["", f"![drift]({figure})"]
  for kind, ev in summary.items():
    out += ["", f"### {kind} ({', '.join(f'{k}={v}' for k, v in ev['overrides'].items())})", "",
            f"Gap closure (arm - frozen) / (retrained - frozen) over queries "
            f"[{ev['closure'][0]}, {ev['closure'][1]}), mean and paired 95% interval over the "
            f"seeds (seeds where retraining gains nothing left out, counted in brackets). "
            f"Memory arms: {ev['online_parallel'] or 'train.parallel'} episodes in flight; "
            f"online rows: {ev['online_row_utility']}.", "",
            f"| arm | before the event | after the event | recovery | gap closure | share of "
            f"calls on {ev['event_llm'] or 'the event LLM'} |", "|---|---|---|---|---|---|"]
    for a, d in ev["arms"].items():
      rec = _ci(d["recovery"]) if "recovery" in d else "-"
      share = (" / ".join(f"{x[0]:.2f}" for x in d["share"]) if "share" in d else "-")
      name = f"{a} [{ev['best'][a]}]" if a in ev["best"] else a
      clo = "-"
      if "closure" in d:
        c = d["closure"]
        clo = _ci((c["mean"], c["half"])) + (f" ({c['undefined']} left out)" if c["undefined"]
                                             else "")
      out.append(f"| {name} | {_ci(d['pre'])} | {_ci(d['post'])} | {rec} | {clo} | {share} |")
    out += ["", "Against the frozen router on the same stream after the event (paired per seed): "
            "the difference of the post-event means, and the post-event queries (mean over seeds) "
            "whose reward differs at all.", "",
            "| arm | minus frozen | queries changed |", "|---|---|---|"]
    for a, d in ev["vs_frozen"].items():
      out.append(f"| {a} | {_ci(d['diff'])} | {d['changed']:.1f} of {d['queries']} |")
  return "\n".join(out) + "\n"


def load_cells(path: pathlib.Path) -> list[dict]:
  """The finished cells of a drift workdir; DataError for a file that is not a drift cell or a
  cell without one of ARMS (written before the baseline arms existed: rerun into a new workdir)."""
  cells = [errors.read_json(f, "drift cell") for f in sorted(path.glob(f"*/{runner_lib.CELL_FILE}"))]
  if any(not isinstance(c, dict) or not is_drift_cell(c) or "rewards" not in c for c in cells):
    raise errors.DataError(f"{path}: a cell.json is not a drift study cell")
  check_arms(cells, path)
  return cells


def check_arms(cells: list[dict], where) -> None:
  """DataError for a cell without one of ARMS (written before the baseline arms existed)."""
  for c in cells:
    missing = missing_arms(c, ARMS)
    if missing:
      raise errors.DataError(
          f"{where}: the {c.get('variant')} seed {c.get('seed')} drift cell has no "
          f"{', '.join(missing)} arm (written by an older drift study); rerun the drift study "
          "into a new workdir")


def write_report(workdir, out=None) -> pathlib.Path:
  """<workdir>/report.md and report.png (or `out` and its .png) from the finished cells."""
  workdir = pathlib.Path(workdir)
  cells = load_cells(workdir)
  if not cells:
    raise errors.DataError(f"{workdir}: no finished drift cells")
  out = pathlib.Path(out) if out else workdir / "report.md"
  png = out.with_suffix(".png")
  plot(summarize(cells), png)
  return files.write_atomic(out, markdown(cells, png.name), "the drift report", parents=True)

