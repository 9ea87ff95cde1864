"""Report of a sweep workdir: mean +- std over seeds per (alpha, method), and a Pareto plot.

On the simulator the plotted and tabulated accuracy is the expected one, E[U | calls] =
reward + alpha * cost (the evaluation's reward is already E[U] - alpha * cost), which removes the
simulator's sampling noise; the sampled accuracy is tabulated next to it.
"""
from __future__ import annotations

import collections
import json
import math
import pathlib

import numpy as np

from gp_jax import errors
from gp_jax import files
from gp_jax import stats
from gp_jax.runs import sweep as sweep_lib

OPTIMUM = "optimum (DP)"
CEILING_PREFIX = "optimum"    # the DP optima (full, and within Router-R1's mask): not baselines
FIXED_LLM_PREFIX = "single:"
MULTI_PREFIX = "multi:"       # multi-round routers (gp_jax/baselines/multi_round/)


def load_cells(workdir: str | pathlib.Path) -> list[dict]:
  """Every finished cell.json of a sweep workdir, sorted by (alpha, seed)."""
  workdir = pathlib.Path(workdir)
  if not workdir.is_dir():
    raise errors.DataError(f"{workdir}: sweep directory not found")
  cells = []
  for path in sorted(workdir.glob(f"*/{sweep_lib.CELL_FILE}")):
    try:
      rec = json.loads(path.read_text())
    except json.JSONDecodeError as e:
      raise errors.DataError(f"{path}: not a sweep cell record ({e})") from None
    if isinstance(rec, dict) and rec.get("study"):
      raise errors.DataError(
          f"{workdir} holds cells of the {rec['study']!r} study, not of an alpha sweep: its "
          f"report is {workdir}/report.md (written by experiments.study), or pass the folder "
          "above studies/ as --root")
    missing = [k for k in ("rows", "alpha", "seed")
               if not isinstance(rec, dict) or k not in rec]
    if missing:
      raise errors.DataError(f"{path}: not a sweep cell record (no {', '.join(missing)})")
    cells.append(rec)
  if not cells:
    raise errors.DataError(f"{workdir}: no finished sweep cells ({sweep_lib.CELL_FILE}); run "
                           "experiments/sweep.py first")
  return sorted(cells, key=lambda c: (c["alpha"], c["seed"]))


def aggregate(cells: list[dict]) -> dict[float, dict[str, dict]]:
  """{alpha: {policy: {metric: (mean, std, n)}}} over seeds, on the 'all' domain.

  Metrics: accuracy (sampled), exp_accuracy (E[U] on the simulator, else sampled), cost, reward,
  calls. std is the sample standard deviation over seeds (0 for one seed).
  """
  vals = collections.defaultdict(lambda: collections.defaultdict(lambda: collections.defaultdict(list)))
  for c in cells:
    a = float(c["alpha"])
    for r in c["rows"]:
      if r["domain"] != "all":
        continue
      m = vals[a][r["policy"]]
      exp_acc = r["reward"] + a * r["cost"] if c.get("simulated") else r["accuracy"]
      for k, v in dict(accuracy=r["accuracy"], exp_accuracy=exp_acc, cost=r["cost"],
                       reward=r["reward"], calls=r["calls"]).items():
        m[k].append(float(v))
  out = {}
  for a, pols in vals.items():
    out[a] = {p: {k: stats.mean_std(v) for k, v in ms.items()} for p, ms in pols.items()}
  return dict(sorted(out.items()))


def paired_gaps(cells: list[dict], of: str = "GraphPlanner") -> dict[float, dict[str, tuple]]:
  """{alpha: {policy: (mean, std, wins, n)}}: reward of `of` minus the policy's, per seed (the
  same test queries), on the 'all' domain; wins = seeds where `of` is at or above the policy."""
  gaps = collections.defaultdict(lambda: collections.defaultdict(list))
  for c in cells:
    rew = {r["policy"]: float(r["reward"]) for r in c["rows"] if r["domain"] == "all"}
    if of not in rew:
      continue
    for p, v in rew.items():
      if p != of:
        gaps[float(c["alpha"])][p].append(rew[of] - v)
  return {a: {p: stats.mean_std(g)[:2] + (int(sum(x >= 0 for x in g)), len(g))
              for p, g in pols.items()}
          for a, pols in sorted(gaps.items())}


def strongest_gaps(gaps: dict[float, dict[str, tuple]]) -> dict[float, tuple]:
  """{alpha: (method, mean, low, high, n)}: the strongest baseline, i.e. the one with the smallest
  mean paired gap (the DP optima and the single LLMs aside), and the 95% t interval of that mean
  (n >= 2 seeds)."""
  out = {}
  for a, pols in gaps.items():
    rivals = {p: g for p, g in pols.items()
              if not p.startswith((CEILING_PREFIX, FIXED_LLM_PREFIX)) and g[3] >= 2}
    if rivals:
      p = min(rivals, key=lambda k: rivals[k][0])
      mean, std, _, n = rivals[p]
      half = stats.half_width_95(std, n)
      out[a] = (p, mean, mean - half, mean + half, n)
  return out


def _pm(t, digits=3) -> str:
  return f"{t[0]:.{digits}f} ± {t[1]:.{digits}f}"


def _order(policies) -> list[str]:
  rank = lambda p: (p != "GraphPlanner", p.startswith(CEILING_PREFIX),
                    p.startswith(FIXED_LLM_PREFIX), p)
  return sorted(policies, key=rank)


def markdown(agg: dict, cells: list[dict], plot_name: str | None) -> str:
  """The sweep report: setup, reward by alpha, paired gaps to GraphPlanner, one table per alpha,
  the routers' LLM choices."""
  out = (_setup_lines(agg, cells, plot_name) + _reward_lines(agg) + _gap_lines(cells)
         + _alpha_lines(agg) + _pick_lines(cells))
  return "\n".join(out) + "\n"


def _setup_lines(agg: dict, cells: list[dict], plot_name: str | None) -> list[str]:
  seeds = sorted({c["seed"] for c in cells})
  c0 = cells[0]
  out = ["# Alpha sweep: GraphPlanner against single- and multi-round routers, single LLMs and the "
         "optimum", "",
         f"{len(cells)} cells: alphas {', '.join(f'{a:g}' for a in agg)}; seeds {seeds}; "
         f"{c0['n_train']} training and {c0['n_test']} test queries per seed; LLMs: "
         f"{', '.join(c0['llms'])}. Values are mean ± std over seeds (sample std).",
         "Cost is in milli-dollars per query; reward = E[U] - alpha * cost"
         + (" with E[U] the simulator's expected utility; 'E[acc]' is that expected accuracy and "
            "'acc' the sampled one." if c0.get("simulated") else "; acc is the realised score.")]
  if plot_name:
    out += ["", f"![accuracy vs cost]({plot_name})"]
  return out


def _reward_lines(agg: dict) -> list[str]:
  """Mean ± std reward of every method (rows) at every alpha (columns)."""
  out = ["", "## Reward by alpha", "",
         "| method | " + " | ".join(f"alpha={a:g}" for a in agg) + " |",
         "|---|" + "---|" * len(agg)]
  all_pols = _order({p for pols in agg.values() for p in pols})
  for p in all_pols:
    out.append(f"| {p} | " + " | ".join(_pm(agg[a][p]["reward"]) if p in agg[a] else "-"
                                         for a in agg) + " |")
  return out


def _gap_lines(cells: list[dict]) -> list[str]:
  """GraphPlanner's reward minus each method's, paired by seed, and the strongest baseline."""
  gaps = paired_gaps(cells)
  if not gaps:
    return []
  alphas = list(gaps)
  shown = _order({p for pols in gaps.values() for p in pols
                  if not p.startswith(FIXED_LLM_PREFIX)})
  out = ["", "## GraphPlanner minus each method, paired by seed", "",
         "Reward of GraphPlanner minus the method's on the same test queries, mean ± std over "
         "seeds, and in brackets the seeds where GraphPlanner is at or above it.", "",
         "| method | " + " | ".join(f"alpha={a:g}" for a in alphas) + " |",
         "|---|" + "---|" * len(alphas)]
  for p in shown:
    cols = []
    for a in alphas:
      g = gaps[a].get(p)
      cols.append("-" if g is None else f"{g[0]:+.3f} ± {g[1]:.3f} ({g[2]}/{g[3]})")
    out.append(f"| {p} | " + " | ".join(cols) + " |")
  strongest = strongest_gaps(gaps)
  if strongest:
    out += ["", "Strongest baseline at each alpha (the smallest gap above): the mean paired gap "
            "and its 95% confidence interval (Student's t over seeds). An interval that contains "
            "0 means the seeds do not separate the two methods.", "",
            "| alpha | strongest baseline | GraphPlanner minus it | 95% interval | seeds |",
            "|---|---|---|---|---|"]
    for a, (p, mean, lo, hi, n) in strongest.items():
      out.append(f"| {a:g} | {p} | {mean:+.3f} | [{lo:+.3f}, {hi:+.3f}] | {n} |")
  return out


def _alpha_lines(agg: dict) -> list[str]:
  """One table per alpha: every method's accuracy, cost, reward and its ratio to the optimum."""
  out = []
  for a, pols in agg.items():
    opt = pols.get(OPTIMUM, {}).get("reward", (math.nan,))[0]
    out += ["", f"## alpha = {a:g}", "",
            "| method | E[acc] | acc | cost (m$) | reward | reward / optimum | calls/query |",
            "|---|---|---|---|---|---|---|"]
    for p in sorted(pols, key=lambda p: -pols[p]["reward"][0]):
      m = pols[p]
      ratio = m["reward"][0] / opt if opt and not math.isnan(opt) else math.nan
      out.append(f"| {p} | {_pm(m['exp_accuracy'])} | {_pm(m['accuracy'])} | {_pm(m['cost'])} | "
                 f"{_pm(m['reward'])} | {ratio:.2f} | {m['calls'][0]:.2f} |")
  return out


def _pick_lines(cells: list[dict]) -> list[str]:
  """The LLMs each router chose, summed over seeds."""
  picks = collections.defaultdict(collections.Counter)
  for c in cells:
    for name, counts in c.get("router_picks", {}).items():
      picks[(c["alpha"], name)].update(counts)
  if not picks:
    return []
  out = ["", "## LLMs chosen by the routers (summed over seeds)", "",
         "Single-round routers: queries per LLM. Multi-round routers (multi:*): LLM calls per "
         "role:LLM.", "", "| alpha | router | choices |", "|---|---|---|"]
  for (a, name), cnt in sorted(picks.items()):
    out.append(f"| {a:g} | {name} | " + ", ".join(f"{k} {v}" for k, v in cnt.most_common()) + " |")
  return out


def plot(agg: dict, path: pathlib.Path) -> None:
  """Expected accuracy vs cost: one curve per alpha-dependent method, a point per fixed LLM."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(10, 5.5))
  alphas = list(agg)
  pols = _order({p for ps in agg.values() for p in ps})
  # tab20 without its reds and greys (GraphPlanner and the single LLMs use those); the optimum
  # within Router-R1's mask is dark green, next to the Router-R1-style router's green.
  palette = [c for i, c in enumerate(plt.get_cmap("tab20").colors) if i not in (6, 7, 14, 15)]
  markers = "o^sDvP<>X"
  k = 0
  for p in pols:
    pts = [(a, agg[a][p]) for a in alphas if p in agg[a]]
    x = np.array([m["cost"][0] for _, m in pts])
    y = np.array([m["exp_accuracy"][0] for _, m in pts])
    xe = np.array([m["cost"][1] for _, m in pts])
    ye = np.array([m["exp_accuracy"][1] for _, m in pts])
    if p.startswith(FIXED_LLM_PREFIX):       # the same episodes at every alpha: one point
      ax.errorbar(x[:1], y[:1], xerr=xe[:1], yerr=ye[:1], fmt="s", color="grey", ms=5, alpha=0.8)
      ax.annotate(p[len(FIXED_LLM_PREFIX):], (x[0], y[0]), fontsize=7, color="dimgrey",
                  xytext=(4, -8), textcoords="offset points")
      continue
    if p == OPTIMUM:
      style = dict(color="black", ls="--", lw=2.2, marker="*", ms=10, label="optimum (DP, ceiling)")
    elif p.startswith(CEILING_PREFIX):
      style = dict(color="darkgreen", ls=":", lw=1.8, marker="*", ms=8, label=p + ", ceiling")
    elif p == "GraphPlanner":
      style = dict(color="tab:red", lw=2.2, marker="o", ms=7, label="GraphPlanner")
    else:
      label = "random (any role, any LLM)" if p == "random" else p
      style = dict(color=palette[(2 * k + (2 * k) // len(palette)) % len(palette)], lw=1.2,
                   marker=markers[k % len(markers)], ms=4, label=label, alpha=0.85,
                   ls="-." if p.startswith(MULTI_PREFIX) else "-")
      k += 1
    ax.errorbar(x, y, xerr=xe, yerr=ye, capsize=2, **style)
    if p in (OPTIMUM, "GraphPlanner"):   # optimum labels above-left, GraphPlanner's below-right
      offset, align = ((-6, 5), "right") if p == OPTIMUM else ((6, -10), "left")
      for (a, _), xi, yi in zip(pts, x, y):
        ax.annotate(f"α={a:g}", (xi, yi), fontsize=7, xytext=offset, textcoords="offset points",
                    ha=align)
  ax.set_xscale("log")
  ax.set_xlabel("cost per query (milli-dollars, log scale)")
  ax.set_ylabel("expected accuracy E[U]")
  ax.set_title("Accuracy vs cost over alpha (mean ± std over seeds); grey squares: single LLMs")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))   # outside: no label hidden
  fig.tight_layout()
  fig.savefig(path, dpi=130)
  plt.close(fig)


def write_report(workdir: str | pathlib.Path, out: str | pathlib.Path | None = None, *,
                 figure: bool = True) -> pathlib.Path:
  """Writes <out> (default <workdir>/report.md) and, with figure, pareto.png next to it."""
  cells = load_cells(workdir)
  agg = aggregate(cells)
  out = pathlib.Path(out) if out else pathlib.Path(workdir) / "report.md"
  out.parent.mkdir(parents=True, exist_ok=True)
  png = out.with_name(out.stem + "_pareto.png") if figure else None
  if png is not None:
    plot(agg, png)
  return files.write_atomic(out, markdown(agg, cells, png.name if png else None), "the report")
