"""The learner look's verdict: per arm of the `learner` study, the numbers and targets T1-T6.

Reads the cells of a `learner` study workdir (gp_jax/runs/studies/definitions.py: one cell per
arm and seed, each with GraphPlanner's greedy evaluation, router:mlp and the DP optimum on the
same test queries) and computes, per arm over its seeds:
  calls per query, split rate, split recall and precision against the optimum, reward,
  reward / optimum, the paired (by seed) difference GraphPlanner - router:mlp with its 95%
  t-interval, training seconds and the training return's tail;
and judges the targets of docs/lab/2026-12-07-v2-decomposition-look.md:
  T1 calls >= 1.5; T2 split recall >= 0.5; T3 paired interval above 0; T4 reward / optimum
  >= 0.90; T5 (from a second, v1 workdir) reward / optimum >= 0.95; T6 training seconds within
  1.25x of the `study` arm's.
The combined arm's selection (`combined_choice`) reads only the training return: the options
whose arm's mean `train.final_return` beats `sweep_ppo`'s.
"""
from __future__ import annotations

import json
import math
import pathlib

from gp_jax import errors
from gp_jax.runs import feasibility
from gp_jax.runs.studies import definitions
from gp_jax.runs.studies import runner

OPTIMUM = "optimum (DP)"
MLP = "router:mlp"
TARGETS = dict(T1=1.5, T2=0.5, T4=0.90, T5=0.95, T6=1.25)


def load_cells(workdir) -> dict[str, list[dict]]:
  """{arm: [cell, ...] sorted by seed} of a learner study workdir; a DataError without cells or
  for a cell of another study."""
  workdir = pathlib.Path(workdir)
  out: dict[str, list[dict]] = {}
  for path in sorted(workdir.glob(f"*_seed*/{runner.CELL_FILE}")):
    try:
      cell = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
      raise errors.DataError(f"{path}: not a readable cell ({e})") from None
    if cell.get("study") != "learner":
      raise errors.DataError(f"{path}: a cell of the {cell.get('study')!r} study, not 'learner'")
    out.setdefault(cell["variant"], []).append(cell)
  if not out:
    raise errors.DataError(f"{workdir}: no cells of the learner study")
  return {a: sorted(c, key=lambda x: x["seed"]) for a, c in out.items()}


def arm_numbers(cells: list[dict]) -> dict:
  """One arm's per-seed numbers and their means (intervals over seeds)."""
  per_seed = []
  for c in cells:
    rows = runner.all_domain_rows(c)
    me = rows[f"{runner.ROUTER}[{c['variant']}]"]
    if OPTIMUM not in rows or MLP not in rows:
      raise errors.DataError(f"{c['variant']} seed {c['seed']}: the cell lacks the optimum or "
                             "router:mlp (not a learner-study cell)")
    opt, mlp = rows[OPTIMUM]["reward"], rows[MLP]["reward"]
    per_seed.append(dict(
        seed=c["seed"], calls=me["calls"], split_rate=me["split_rate"],
        split_recall=me.get("split_recall"), split_precision=me.get("split_precision"),
        reward=me["reward"], optimum=opt, share=me["reward"] / opt if opt else math.nan,
        mlp=mlp, minus_mlp=me["reward"] - mlp, optimum_calls=rows[OPTIMUM]["calls"],
        optimum_split_rate=rows[OPTIMUM]["split_rate"], train_seconds=c["train"]["seconds"],
        final_return=c["train"].get("final_return")))
  out = dict(seeds=[s["seed"] for s in per_seed], per_seed=per_seed)
  for k in ("calls", "split_rate", "split_recall", "split_precision", "reward", "optimum",
            "share", "mlp", "minus_mlp", "optimum_calls", "train_seconds", "final_return"):
    vals = [s[k] for s in per_seed]
    # A recall with no optimum split (or a precision with no router split) is undefined: 0 here
    # would be a made-up number, so the mean is over the seeds where it is defined.
    vals = [v for v in vals if v is not None]
    out[k] = feasibility.interval(vals) if vals else None
  return out


def judge(arm: dict, study_seconds: float | None, v1: dict | None = None) -> dict:
  """{target: {value, pass}} of one arm (pass None where the number is missing)."""
  def val(k):
    return None if arm[k] is None else arm[k]["mean"]
  out = {}
  out["T1"] = dict(value=val("calls"), threshold=TARGETS["T1"])
  out["T2"] = dict(value=val("split_recall"), threshold=TARGETS["T2"])
  d = arm["minus_mlp"]
  out["T3"] = dict(value=d["mean"], low=d["low"], high=d["high"], threshold=0.0,
                   pass_=(None if d["n"] < 2 else bool(d["low"] > 0.0)))
  out["T4"] = dict(value=val("share"), threshold=TARGETS["T4"])
  out["T5"] = dict(value=None if v1 is None else v1["share"]["mean"], threshold=TARGETS["T5"])
  ratio = (None if not study_seconds or arm["train_seconds"] is None
           else arm["train_seconds"]["mean"] / study_seconds)
  out["T6"] = dict(value=ratio, threshold=TARGETS["T6"],
                   pass_=None if ratio is None else bool(ratio <= TARGETS["T6"]))
  for k in ("T1", "T2", "T4", "T5"):
    v = out[k]["value"]
    out[k]["pass_"] = None if v is None else bool(v >= out[k]["threshold"])
  return {k: dict(v, passed=v.pop("pass_")) for k, v in out.items()}


def combined_choice(arms: dict[str, dict]) -> list[str] | None:
  """The options whose arm's mean training return beats sweep_ppo's (training queries only);
  None until sweep_ppo and every option arm have all their cells' training returns."""
  base = arms.get("sweep_ppo")
  if base is None or base["final_return"] is None:
    return None
  chosen = []
  for name in definitions.LEARNER_OPTIONS:
    a = arms.get(name)
    if a is None or a["final_return"] is None:
      return None
    if a["final_return"]["mean"] > base["final_return"]["mean"]:
      chosen.append(name)
  return chosen


def verdict(workdir, v1_workdir=None) -> dict:
  """Every arm's numbers and targets; the combined choice; seeds per arm."""
  arms = {a: arm_numbers(c) for a, c in load_cells(workdir).items()}
  v1 = ({a: arm_numbers(c) for a, c in load_cells(v1_workdir).items()}
        if v1_workdir else {})
  study_s = arms["study"]["train_seconds"]["mean"] if "study" in arms else None
  targets = {a: judge(n, study_s, v1.get(a)) for a, n in arms.items()}
  return dict(arms=arms, v1_arms=v1, targets=targets, combined_choice=combined_choice(arms))


def _pm(iv, digits=3) -> str:
  if iv is None:
    return "n/a"
  if iv["n"] < 2:
    return f"{iv['mean']:.{digits}f}"
  return f"{iv['mean']:.{digits}f} ± {iv['half_width']:.{digits}f}"


def _mark(t: dict, fmt: str) -> str:
  if t["value"] is None:
    return "n/a"
  p = {True: "pass", False: "miss", None: "?"}[t["passed"]]
  return f"{format(t['value'], fmt)} {p}"


def format_report(v: dict) -> str:
  """Markdown: the numbers per arm (mean ± 95% t over seeds), then the targets per arm."""
  order = ["study", "sweep_ppo", *definitions.LEARNER_OPTIONS, "combined"]
  arms = [a for a in order if a in v["arms"]] + sorted(set(v["arms"]) - set(order))
  lines = ["| arm | seeds | calls/query | split rate | split recall | split precision | reward | "
           "reward / optimum | minus router:mlp (95% t) | train s | training return (last 10%) |",
           "|" + "---|" * 11]
  for a in arms:
    n = v["arms"][a]
    d = n["minus_mlp"]
    ci = (f"{d['mean']:+.4f} [{d['low']:+.4f}, {d['high']:+.4f}]" if d["n"] >= 2
          else f"{d['mean']:+.4f}")
    lines.append(f"| {a} | {len(n['seeds'])} | {_pm(n['calls'], 2)} | {_pm(n['split_rate'])} | "
                 f"{_pm(n['split_recall'])} | {_pm(n['split_precision'])} | {_pm(n['reward'])} | "
                 f"{_pm(n['share'])} | {ci} | {_pm(n['train_seconds'], 0)} | "
                 f"{_pm(n['final_return'])} |")
  lines += ["", "| arm | T1 calls >= 1.5 | T2 recall >= 0.5 | T3 interval > 0 | "
                "T4 share >= 0.90 | T5 v1 share >= 0.95 | T6 time <= 1.25x study |",
            "|" + "---|" * 7]
  for a in arms:
    t = v["targets"][a]
    t3 = ("n/a" if t["T3"]["passed"] is None else
          f"[{t['T3']['low']:+.4f}, {t['T3']['high']:+.4f}] "
          + ("pass" if t["T3"]["passed"] else "miss"))
    lines.append(f"| {a} | {_mark(t['T1'], '.2f')} | {_mark(t['T2'], '.3f')} | {t3} | "
                 f"{_mark(t['T4'], '.3f')} | {_mark(t['T5'], '.3f')} | {_mark(t['T6'], '.2f')} |")
  ch = v["combined_choice"]
  lines += ["", "Combined arm (options whose mean training return beats sweep_ppo's): "
            + ("not decidable yet (an option arm or sweep_ppo lacks cells)" if ch is None
               else (", ".join(ch) if ch else "none (no option beats sweep_ppo)"))]
  return "\n".join(lines)
