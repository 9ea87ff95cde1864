"""One markdown report of every experiment in a runs directory, with figures.

Layout read (each part optional, at least one needed):
  <root>/sweep/                  alpha sweep cells (gp_jax/runs/sweep.py)
  <root>/studies/<study>/        study cells (gp_jax/runs/studies/runner.py)
  <root>/studies/drift/          drift study cells (gp_jax/runs/studies/drift.py: its own section,
                                 per-event tables of every arm and the windowed-reward figure)
  <root>/counselor_routed/       routed Graph Counselor results (results.md written by its runner)
Per study: a table of every variant (mean ± std over seeds of expected accuracy, cost, reward and
reward / optimum of its evaluation system), the reference policies of each evaluation system, the
share of calls per role and of calls to held-out LLMs, and a bar chart of reward / optimum.
After the studies: the paper's effects beside the studies' readings of them (paper_table.py).
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
from gp_jax.runs import sweep_report
from gp_jax.runs.studies import drift
from gp_jax.runs.studies import drift_report
from gp_jax.runs.studies import paper_table
from gp_jax.runs.studies import runner as runner_lib

OPTIMUM = "optimum (DP)"
TITLES = {
    "phases": "Phase 1 (fixed workflow, router picks LLMs) vs Phase 2 (router builds the workflow)",
    "unseen": "Unseen tasks and unseen LLMs",
    "ablations": "Inductive vs transductive inference, and GARNet ablations",
    "roles": "New roles: Thinker and Verifier (trained, zero-shot, few-shot)",
}


def load_study(path: pathlib.Path) -> list[dict]:
  """The finished cells of one study directory (malformed files are a DataError)."""
  cells = [errors.read_json(f, "study cell") for f in sorted(path.glob(f"*/{runner_lib.CELL_FILE}"))]
  bad = [c for c in cells if not isinstance(c, dict) or not {"rows", "variant", "seed"} <= set(c)]
  if bad:
    raise errors.DataError(f"{path}: a cell.json is not a study cell record")
  return cells


def _pm(t, digits=3) -> str:
  return f"{t[0]:.{digits}f} ± {t[1]:.{digits}f}"


def summarize_study(cells: list[dict]) -> tuple[list[dict], dict]:
  """Per variant: mean ± std over seeds of E[acc], cost, reward, ratio to its optimum, shares.
  And the reference policies per evaluation system (keyed by the variants that share it)."""
  by_variant = collections.OrderedDict()
  for c in sorted(cells, key=lambda c: c["seed"]):
    by_variant.setdefault(c["variant"], []).append(c)
  order = [c["variant"] for c in sorted(cells, key=lambda c: (c.get("index", 0), c["variant"]))]
  variants = []
  refs = collections.OrderedDict()
  for name in sorted(by_variant, key=order.index):
    cs = by_variant[name]
    vals = collections.defaultdict(list)
    for c in cs:
      rows = runner_lib.all_domain_rows(c)
      mine = rows[f"{runner_lib.ROUTER}[{name}]"]
      vals["exp_accuracy"].append(runner_lib.expected_accuracy(mine, c))
      vals["cost"].append(mine["cost"])
      vals["reward"].append(mine["reward"])
      vals["calls"].append(mine["calls"])
      opt = rows.get(OPTIMUM, {}).get("reward")
      if opt:
        vals["ratio"].append(mine["reward"] / opt)
      singles = [r["reward"] for p, r in rows.items() if p.startswith("single:")]
      if singles:
        vals["best_single"].append(max(singles))
      shares = c.get("shares", {})
      for role, s in shares.get("role", {}).items():
        vals[f"role:{role}"].append(s)
      vals["held_out_share"].append(sum(s for m, s in shares.get("llm", {}).items()
                                        if m in _held_out_names(c)))
      if (c.get("held_out_share") or {}).get("optimum") is not None:
        vals["optimum_held_out_share"].append(c["held_out_share"]["optimum"])
    variants.append(dict(name=name, seeds=[c["seed"] for c in cs],
                         reward_by_seed={c["seed"]: r for c, r in zip(cs, vals["reward"])},
                         stats={k: stats.mean_std(v) for k, v in vals.items()},
                         train_overrides=cs[0].get("train_overrides", {}),
                         eval_overrides=cs[0].get("eval_overrides", {}),
                         history=cs[0].get("history"), few_shot=cs[0].get("few_shot", 0),
                         few_shot_updates=cs[0].get("few_shot_updates", 1),
                         few_shot_rounds=cs[0].get("few_shot_rounds", 1),
                         seconds=float(np.mean([c["seconds"] for c in cs])),
                         train_seconds=float(np.mean([c["train"]["seconds"] for c in cs]))))
    key = json.dumps([cs[0].get("eval_overrides", {}),
                      {k: v for k, v in cs[0].get("train_overrides", {}).items()
                       if k.startswith("mdp.") or k == "roles"}], sort_keys=True)
    ref = refs.setdefault(key, dict(variants=[], rows=collections.defaultdict(list)))
    ref["variants"].append(name)
    if len(ref["variants"]) == 1:
      for c in cs:
        for p, r in runner_lib.all_domain_rows(c).items():
          if not p.startswith(runner_lib.ROUTER + "["):
            ref["rows"][p].append(r["reward"])
  return variants, refs


def _held_out_names(cell) -> set:
  """The cell's held-out LLMs: its variant's (config.study.unseen_llms), else the catalog's."""
  if cell.get("held_out"):
    return set(cell["held_out"]) & set(cell["llms"])
  from gp_jax.llm import catalog as catalog_lib
  full = catalog_lib.load_catalog()
  return {m.name for m in full.llms if m.held_out} & set(cell["llms"])


def plot_study(name: str, variants: list[dict], refs: dict, path: pathlib.Path) -> None:
  """Left: expected reward per variant with its own optimum and best single LLM; right: the ratio."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  names = [v["name"] for v in variants]
  x = np.arange(len(names))
  get = lambda v, k: v["stats"].get(k, (math.nan, 0.0, 0))
  fig, (ax, ax2) = plt.subplots(1, 2, figsize=(max(9, 1.6 * len(names) + 3), 4.2))
  reward = [get(v, "reward") for v in variants]
  ax.bar(x, [r[0] for r in reward], yerr=[r[1] for r in reward], capsize=3, color="tab:red",
         alpha=0.8, label="GraphPlanner")
  opt = {n: np.mean(ref["rows"][OPTIMUM]) for ref in refs.values() if OPTIMUM in ref["rows"]
         for n in ref["variants"]}
  ax.plot(x, [opt.get(n, math.nan) for n in names], "k*", ms=11, label="optimum (DP) of its system")
  ax.plot(x, [get(v, "best_single")[0] for v in variants], "D", color="grey", ms=6,
          label="best single LLM of its system")
  ax.set_ylabel("expected reward")
  ax.legend(fontsize=7, loc="lower right")
  ratio = [get(v, "ratio") for v in variants]
  bars = ax2.bar(x, [r[0] for r in ratio], yerr=[r[1] for r in ratio], capsize=3,
                 color="tab:red", alpha=0.8)
  for b, r in zip(bars, ratio):
    ax2.annotate(f"{r[0]:.3f}", (b.get_x() + b.get_width() / 2, r[0]), ha="center", fontsize=7,
                 xytext=(0, 6), textcoords="offset points")
  ax2.axhline(1.0, color="black", ls="--", lw=1.2)
  lo = np.nanmin([r[0] - r[1] for r in ratio]) if names else 0.0
  ax2.set_ylim(max(0.0, lo - 0.1), 1.03)   # zoomed: the differences are small
  ax2.set_ylabel("expected reward / optimum (zoomed)")
  for a in (ax, ax2):
    a.set_xticks(x)
    a.set_xticklabels(names, rotation=25, ha="right", fontsize=8)
    a.grid(axis="y", alpha=0.3)
  fig.suptitle(TITLES.get(name, name) + " (mean ± std over seeds)", fontsize=10)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def _short(value) -> str:
  """Long comma lists (LLM or role names) as their count."""
  text = str(value)
  return f"({len(text.split(','))} names)" if "," in text and len(text) > 40 else text


def _demote(md: str) -> str:
  """Every markdown heading one level deeper (the sweep report becomes a section)."""
  return "\n".join("#" + line if line.startswith("#") else line for line in md.split("\n"))


def _few_shot(v: dict) -> str:
  rounds, updates = v["few_shot_rounds"], v["few_shot_updates"]
  return (f"few-shot {v['few_shot']} episodes" + (f" x {rounds} rounds" if rounds > 1 else "") +
          (", history only" if not updates else
           f", {updates} update{'s' if updates > 1 else ''} per round"))


def paired_differences(variants: list[dict]) -> list[dict]:
  """Each variant's reward minus the first variant's, paired by seed (the same seed: the same
  data and test queries): mean and 95% t half-width over the seeds both have."""
  if len(variants) < 2:
    return []
  ref = variants[0]["reward_by_seed"]
  out = []
  for v in variants[1:]:
    seeds = sorted(set(ref) & set(v["reward_by_seed"]))
    mean, half, n = stats.ci95([v["reward_by_seed"][s] - ref[s] for s in seeds])
    out.append(dict(name=v["name"], mean=mean, half_width=half, n=n))
  return out


def paired_markdown(variants: list[dict]) -> list[str]:
  diffs = paired_differences(variants)
  if not diffs:
    return []
  out = ["", f"Reward minus {variants[0]['name']}'s, paired by seed (mean and 95% t interval over "
         "the seeds both have; n/a for one seed):", "",
         "| variant | difference | seeds |", "|---|---|---|"]
  for d in diffs:
    half = "n/a" if math.isnan(d["half_width"]) else f"{d['half_width']:.3f}"
    out.append(f"| {d['name']} | {d['mean']:+.3f} ± {half} | {d['n']} |")
  return out


def study_markdown(name: str, cells: list[dict], figure: str | None) -> str:
  variants, refs = summarize_study(cells)
  c0 = cells[0]
  out = [f"## {TITLES.get(name, name)}", "",
         f"Alpha = {c0['alpha']:g}; {c0['n_test']} test queries per seed; seeds "
         f"{sorted({c['seed'] for c in cells})}; routers trained for "
         f"{'/'.join(str(e) for e in sorted({c['train']['episodes'] for c in cells}))} episodes. "
         "Mean ± std over seeds (sample std). Reward / optimum divides by the DP optimum of the "
         "variant's own evaluation system; 'train s' is rollout + update time of its training run. "
         "Held-out LLM share: the share of the router's calls made with the held-out (unseen) "
         "LLMs, and after the slash the optimum's share where the cell measured it."]
  if figure:
    out += ["", f"![{name}]({figure})"]
  out += ["", "| variant | E[acc] | cost (m$) | reward | reward / optimum | best single LLM | "
          "calls/query | held-out LLM share | train s | what |", "|---|---|---|---|---|---|---|---|---|---|"]
  for v in variants:
    s = v["stats"]
    what = ", ".join([f"train {k}={_short(val)}" for k, val in v["train_overrides"].items()] +
                     [f"eval {k}={_short(val)}" for k, val in v["eval_overrides"].items()] +
                     (["empty history at test"] if v["history"] == "none" else []) +
                     ([_few_shot(v)] if v["few_shot"] else [])) or "default"
    opt_share = (f" / {s['optimum_held_out_share'][0]:.3f}"
                 if "optimum_held_out_share" in s else "")
    out.append(f"| {v['name']} | {_pm(s['exp_accuracy'])} | {_pm(s['cost'])} | {_pm(s['reward'])} | "
               f"{_pm(s['ratio']) if 'ratio' in s else '-'} | "
               f"{_pm(s['best_single']) if 'best_single' in s else '-'} | {s['calls'][0]:.2f} | "
               f"{s['held_out_share'][0]:.3f}{opt_share} | {v['train_seconds']:.0f} | {what} |")
  out += paired_markdown(variants)
  role_keys = sorted({k for v in variants for k in v["stats"] if k.startswith("role:")})
  if role_keys:
    out += ["", "Share of calls per role:", "",
            "| variant | " + " | ".join(k[5:] for k in role_keys) + " |",
            "|---|" + "---|" * len(role_keys)]
    for v in variants:
      out.append(f"| {v['name']} | " + " | ".join(
          f"{v['stats'][k][0]:.3f}" if k in v["stats"] else "0" for k in role_keys) + " |")
  out += ["", "Reference policies (reward, mean ± std over seeds) per evaluation system:", ""]
  for ref in refs.values():
    rows = sorted(ref["rows"].items(), key=lambda kv: -np.mean(kv[1]))
    out.append(f"- evaluation system of {', '.join(ref['variants'])}: " + "; ".join(
        f"{p} {_pm(stats.mean_std(v))}" for p, v in rows[:8]))
  return "\n".join(out) + "\n"


def _study_section(name: str, cells: list[dict], png: pathlib.Path) -> str:
  """Study `name`'s markdown section, its figure written to `png` (referred to by file name)."""
  plot_study(name, *summarize_study(cells), png)
  return study_markdown(name, cells, png.name)


def write_study_report(workdir: str | pathlib.Path, name: str) -> pathlib.Path:
  """<workdir>/report.md and report.png: study `name`'s section alone, from its finished cells
  (what experiments.study writes after its cells; --root reports every experiment together)."""
  workdir = pathlib.Path(workdir)
  cells = load_study(workdir)
  if not cells:
    raise errors.DataError(f"{workdir}: no finished study cells ({runner_lib.CELL_FILE})")
  out = workdir / "report.md"
  return files.write_atomic(out, _study_section(name, cells, out.with_suffix(".png")) + "\n",
                            "the study report", parents=True)


def write_comparison(roots: dict[str, str | pathlib.Path], out: str | pathlib.Path) -> pathlib.Path:
  """`out`: the paper's effects read from the studies of several runs directories side by side
  (label -> root; e.g. the same studies on the v1 and v2 worlds)."""
  runs = {}
  for label, root in roots.items():
    studies = pathlib.Path(root) / "studies"
    cells = {name: load_study(studies / name) for name in paper_table.STUDIES
             if (studies / name).is_dir()}
    cells = {k: v for k, v in cells.items() if v}
    if not cells:
      raise errors.DataError(f"{root}: no finished cells of the studies "
                             f"{', '.join(paper_table.STUDIES)}")
    runs[label] = cells
  text = ["# The paper's effects, read from " + ", ".join(f"{k} ({v})" for k, v in roots.items()),
          "", "Generated by `python -m experiments.report --compare=" +
          ",".join(f"{k}={v}" for k, v in roots.items()) + f" --out={out}`. " +
          "Each run reads the effect at its studies' own setting; nothing here is a test of the "
          "paper (docs/calibration.md holds the preregistered check).", "",
          paper_table.compare_markdown(runs, paper_table.load_targets())]
  return files.write_atomic(pathlib.Path(out), "\n".join(text), "the comparison", parents=True)


def write_full_report(root: str | pathlib.Path, out: str | pathlib.Path) -> pathlib.Path:
  """Writes the combined report `out` (markdown) and its PNG figures next to it."""
  root, out = pathlib.Path(root), pathlib.Path(out)
  if not root.is_dir():
    raise errors.DataError(f"{root}: runs directory not found")
  out.parent.mkdir(parents=True, exist_ok=True)
  stem = out.stem
  parts = ["# gp_jax experiments report", "",
           f"Generated by `python -m experiments.report --root={root} --out={out}` from the runs in "
           f"`{root}`. Every number below was produced by those runs; `bash scripts/experiments.sh` "
           "reruns them (per-part commands and wall times: docs/experiments.md, docs/studies.md, "
           "docs/counselor_routing.md)."]
  found = False
  sweep_dir = root / "sweep"
  if sweep_dir.is_dir() and list(sweep_dir.glob(f"*/{sweep_report.sweep_lib.CELL_FILE}")):
    cells = sweep_report.load_cells(sweep_dir)
    agg = sweep_report.aggregate(cells)
    png = out.with_name(f"{stem}_pareto.png")
    sweep_report.plot(agg, png)
    md = sweep_report.markdown(agg, cells, png.name)
    parts += ["", _demote(md)]
    found = True
  studies = root / "studies"
  study_cells = {}
  for name in list(TITLES) + sorted(p.name for p in studies.glob("*") if p.name not in TITLES):
    d = studies / name
    if not d.is_dir():
      continue
    if name == drift.STUDY or name.startswith(drift.STUDY + "_"):
      # per-query rewards around a pool event: its own summary (drift_<x>: another drift run,
      # e.g. with other model settings, titled with its folder name)
      cells = drift_report.load_cells(d)
      if cells:
        png = out.with_name(f"{stem}_{name}.png")
        drift_report.plot(drift_report.summarize(cells), png)
        parts += ["", drift_report.markdown(
            cells, png.name,
            title=None if name == drift.STUDY else f"{drift_report.TITLE} [{name}]")]
        found = True
      continue
    cells = load_study(d)
    if not cells:
      continue
    parts += ["", _study_section(name, cells, out.with_name(f"{stem}_{name}.png"))]
    study_cells[name] = cells
    found = True
  if set(study_cells) & set(paper_table.STUDIES):
    parts += ["", paper_table.markdown(study_cells, paper_table.load_targets())]
  counselor = root / "counselor_routed" / "results.md"
  if counselor.exists():
    text = counselor.read_text()
    parts += ["", "## Routed Graph Counselor", "", text.replace("\n# ", "\n### ")]
    found = True
  if not found:
    raise errors.DataError(f"{root}: no finished sweep, study or counselor runs found")
  return files.write_atomic(out, "\n".join(parts) + "\n", "the report")
