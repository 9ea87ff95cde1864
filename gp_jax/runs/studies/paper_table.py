"""The studies' readings of the paper's published effects, each beside the paper's number.

One row per effect the four studies (phases, unseen, ablations, roles) can produce. The paper's
side is computed from data/paper_targets.json by target id (never typed in here); this run's side
from the study cells, per seed, in points of expected accuracy (E[acc] x 100: the simulator's
expected utility, reward + alpha x cost) unless the row says otherwise. A difference is paired by
seed (the same seed: the same data and test queries for both variants) and reported as its mean
and 95% t half-width over the seeds both variants have.

The studies run at their own setting (alpha, pool, sizes), not the paper's, so a row is a reading
of the paper's effect in that setting, not a test of it; docs/calibration.md holds the one
preregistered check.
"""
from __future__ import annotations

import dataclasses
import math
import pathlib
from typing import Callable

import numpy as np

from gp_jax import errors
from gp_jax import stats
from gp_jax.runs.studies import runner as runner_lib
from gp_jax.sim import calibration

DOMAINS = ("math", "code", "commonsense", "world_knowledge", "knowledge_reasoning")

# (study, variant, seed) -> that cell record
Index = dict[tuple[str, str, int], dict]


@dataclasses.dataclass(frozen=True)
class Effect:
  name: str
  study: str
  paper: Callable[[dict], tuple[float, str]]   # targets by id -> (signed value, text)
  measure: Callable[[Index, str, int], float | None]   # (index, study, seed) -> value or None
  difference: bool = True                      # a difference (has a sign to agree on)
  read_from: str = ""


def _router(index: Index, study: str, variant: str, seed: int, what: str = "acc") -> float | None:
  """The variant's router on one seed: its expected accuracy in points, or its calls per query."""
  cell = index.get((study, variant, seed))
  row = None if cell is None else runner_lib.all_domain_rows(cell).get(
      f"{runner_lib.ROUTER}[{variant}]")
  if row is None:
    return None
  return float(row["calls"]) if what == "calls" else 100.0 * runner_lib.expected_accuracy(row, cell)


def _minus(a: str, b: str | tuple[str, ...]) -> Callable[[Index, str, int], float | None]:
  """Variant a minus variant b (or minus the best of the variants b), on one seed."""
  bs = (b,) if isinstance(b, str) else b
  def measure(index, study, seed):
    x = _router(index, study, a, seed)
    ys = [_router(index, study, v, seed) for v in bs]
    if x is None or any(y is None for y in ys):
      return None
    return x - max(ys)
  return measure


def _value(variant: str, what: str = "acc") -> Callable[[Index, str, int], float | None]:
  return lambda index, study, seed: _router(index, study, variant, seed, what)


def _minus_best_router(variant: str) -> Callable[[Index, str, int], float | None]:
  """The variant minus the best single-round router (policies `router:*`) of the same cell."""
  def measure(index, study, seed):
    x = _router(index, study, variant, seed)
    if x is None:
      return None
    cell = index[(study, variant, seed)]
    routers = [100.0 * runner_lib.expected_accuracy(r, cell)
               for p, r in runner_lib.all_domain_rows(cell).items() if p.startswith("router:")]
    return x - max(routers) if routers else None
  return measure


def _t(targets: dict, tid: str) -> float:
  if tid not in targets:
    raise errors.DataError(f"paper targets: no target {tid!r}")
  return float(targets[tid]["value"])


def _domain_mean(targets: dict, prefix: str) -> float:
  return float(np.mean([_t(targets, f"{prefix}.{d}") for d in DOMAINS]))


def _num(value: float) -> tuple[float, str]:
  return value, f"{value:+.1f}"


def _sign(targets: dict, tid: str) -> tuple[float, str]:
  s = _t(targets, tid)
  return s, "> 0" if s > 0 else "< 0"


def _domains_higher(targets: dict, tid: str) -> tuple[float, str]:
  """A count of domains (of 5) where GraphPlanner is higher: its sign, from the majority."""
  k = _t(targets, tid)
  sign = float(np.sign(k - len(DOMAINS) / 2))
  return sign, f"{'> 0' if sign > 0 else '< 0'} (higher in {k:.0f} of {len(DOMAINS)} domains)"


def _history_text(targets: dict) -> tuple[float, str]:
  gains = [_t(targets, f"history_text.graphplanner_vs_best.rel_gain.{d}") for d in DOMAINS]
  sign = 1.0 if min(gains) > 0 else (-1.0 if max(gains) < 0 else 0.0)
  return sign, f"> 0 ({min(gains):+.1f} to {max(gains):+.1f} % by domain)"


def _roles(kind: str) -> Callable[[dict], tuple[float, str]]:
  return lambda t: _num(_domain_mean(t, f"roles.new_role_{kind}.acc") -
                        _domain_mean(t, "p2.graphplanner.acc"))


EFFECTS: tuple[Effect, ...] = (
    Effect("GraphPlanner, Phase 2", "phases",
           lambda t: (_t(t, "p2.graphplanner.acc"), f"{_t(t, 'p2.graphplanner.acc'):.1f}"),
           _value("phase2"), difference=False, read_from="phase2"),
    Effect("GraphPlanner's calls per query (calls)", "phases",
           lambda t: (_t(t, "p2.graphplanner.calls"), f"{_t(t, 'p2.graphplanner.calls'):.1f}"),
           _value("phase2", "calls"), difference=False, read_from="phase2"),
    Effect("Phase 2 - Phase 1 depth 1 width 3", "phases",
           lambda t: _num(_t(t, "p2.graphplanner.acc") - _t(t, "p1.d1w3.graphplanner.acc")),
           _minus("phase2", "phase1_d1w3"), read_from="phase2 - phase1_d1w3"),
    Effect("Phase 2 - Phase 1 depth 2 width 2", "phases",
           lambda t: _num(_t(t, "p2.graphplanner.acc") - _t(t, "p1.d2w2.graphplanner.acc")),
           _minus("phase2", "phase1_d2w2"), read_from="phase2 - phase1_d2w2"),
    Effect("GraphPlanner - best baseline (here: best single-round router)", "unseen",
           lambda t: _num(_t(t, "p2.graphplanner_vs_best_baseline.acc")),
           _minus_best_router("seen_tasks"), read_from="seen_tasks - best router:*"),
    Effect("unseen tasks - seen tasks", "unseen",
           lambda t: _num(_t(t, "unseen_tasks.graphplanner.acc") - _t(t, "p2.graphplanner.acc")),
           _minus("unseen_tasks", "seen_tasks"), read_from="unseen_tasks - seen_tasks"),
    Effect("transductive - inductive inference", "ablations",
           lambda t: _sign(t, "ablation.transductive_vs_inductive.sign"),
           _minus("transductive", "inductive_inference"),
           read_from="transductive - inductive_inference"),
    Effect("GraphPlanner - no history memory", "ablations",
           lambda t: _domains_higher(t, "ablation.graphplanner_vs_no_history.domains_higher"),
           _minus("transductive", "no_history"), read_from="transductive - no_history"),
    Effect("heterogeneous - homogeneous graph", "ablations",
           lambda t: _sign(t, "ablation.hetero_vs_homo.sign"),
           _minus("transductive", "homogeneous"), read_from="transductive - homogeneous"),
    Effect("graph memory - best history as text", "ablations", _history_text,
           _minus("transductive", ("history_summary", "history_retrieval")),
           read_from="transductive - max(history_summary, history_retrieval)"),
    Effect("new roles trained - Planner/Executor/Summarizer", "roles", _roles("train"),
           _minus("pestv_trained", "pes_trained"), read_from="pestv_trained - pes_trained"),
    Effect("new roles zero-shot - Planner/Executor/Summarizer", "roles", _roles("zero_shot"),
           _minus("pestv_zero_shot", "pes_trained"), read_from="pestv_zero_shot - pes_trained"),
    Effect("new roles few-shot - Planner/Executor/Summarizer", "roles", _roles("few_shot"),
           _minus("pestv_few_shot", "pes_trained"), read_from="pestv_few_shot - pes_trained"),
)


STUDIES: tuple[str, ...] = tuple(sorted({e.study for e in EFFECTS}))   # the studies read


def load_targets(path: str | pathlib.Path = calibration.TARGETS_FILE) -> dict[str, dict]:
  raw = errors.read_json(path, "paper targets file")
  return {t["id"]: t for t in raw["targets"]}


def index_cells(cells_by_study: dict[str, list[dict]]) -> Index:
  return {(study, c["variant"], int(c["seed"])): c
          for study, cells in cells_by_study.items() for c in cells}


def readings(cells_by_study: dict[str, list[dict]], targets: dict[str, dict]) -> list[dict]:
  """Per effect: the paper's (value, text), this run's per-seed values, mean and 95% half-width."""
  index = index_cells(cells_by_study)
  out = []
  for e in EFFECTS:
    paper_value, paper_text = e.paper(targets)
    seeds = sorted({int(c["seed"]) for c in cells_by_study.get(e.study, [])})
    per_seed = {s: v for s in seeds if (v := e.measure(index, e.study, s)) is not None}
    mean, half, n = (stats.ci95(list(per_seed.values())) if per_seed
                     else (math.nan, math.nan, 0))
    agrees = None
    if e.difference and n and paper_value != 0 and mean != 0:   # a zero has no sign
      agrees = bool(np.sign(mean) == np.sign(paper_value))
    # a ratio only where the paper gives a size, not only a sign
    ratio = (mean / paper_value if e.difference and n and paper_text[0] in "+-"
             and paper_value != 0 else None)
    out.append(dict(effect=e, paper=paper_value, paper_text=paper_text, per_seed=per_seed,
                    mean=mean, half_width=half, n=n, agrees=agrees, ratio=ratio))
  return out


def accuracy_unit(cells_by_study: dict[str, list[dict]]) -> str:
  """What the accuracy points are: expected on the simulator, sampled on a real backend."""
  sim = {bool(c.get("simulated")) for cells in cells_by_study.values() for c in cells}
  if sim == {False}:
    return "sampled accuracy (a real backend: no expectation exists)"
  if sim == {True, False}:
    return "expected accuracy on simulated cells, sampled accuracy on real-backend cells"
  return "expected accuracy"


def markdown(cells_by_study: dict[str, list[dict]], targets: dict[str, dict]) -> str:
  """The section "Against the paper": every effect, 'not run' where
  its study or variant is absent."""
  out = ["## Against the paper: the studies' readings of its effects", "",
         "The paper's number (data/paper_targets.json) beside this run's, in points of "
         f"{accuracy_unit(cells_by_study)} unless the row says otherwise; a difference is paired "
         "by seed, with its 95% t half-width over the seeds (n/a for one seed). The studies run "
         "at their own setting (alpha, pool, sizes), so each row reads the paper's effect there; "
         "it is not a test of it (docs/calibration.md holds the preregistered check).", "",
         "| effect | paper | this run | seeds | sign as the paper's | ratio to the paper | "
         "read from (study: variants) |", "|---|---|---|---|---|---|---|"]
  for r in readings(cells_by_study, targets):
    e = r["effect"]
    run = _cell_text(dict(r, agrees=None))
    agrees = "-" if r["agrees"] is None else ("yes" if r["agrees"] else "no")
    ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}"
    out.append(f"| {e.name} | {r['paper_text']} | {run} | {r['n']} | {agrees} | {ratio} | "
               f"{e.study}: {e.read_from} |")
  return "\n".join(out) + "\n"


def _cell_text(r: dict) -> str:
  if not r["n"]:
    return "not run"
  e = r["effect"]
  half = "n/a" if math.isnan(r["half_width"]) else f"{r['half_width']:.1f}"
  fmt = "+.1f" if e.difference else ".2f" if "calls" in e.name else ".1f"
  sign = "" if r["agrees"] is None else (" (sign as paper)" if r["agrees"] else " (sign opposite)")
  return f"{r['mean']:{fmt}} ± {half}{sign}"


def compare_markdown(runs: dict[str, dict[str, list[dict]]], targets: dict[str, dict]) -> str:
  """One table of the effects read from several runs (label -> that run's cells by study), e.g.
  the same studies on two worlds, beside the paper's numbers."""
  if not runs:
    raise errors.ConfigError("compare: no runs given")
  cols = {label: readings(cells, targets) for label, cells in runs.items()}
  first = next(iter(cols.values()))
  seeds = {label: sorted({int(c["seed"]) for cs in cells.values() for c in cs})
           for label, cells in runs.items()}
  out = ["| effect | paper | " + " | ".join(cols) + " | read from (study: variants) |",
         "|---|---|" + "---|" * len(cols) + "---|"]
  for i, r in enumerate(first):
    e = r["effect"]
    out.append(f"| {e.name} | {r['paper_text']} | " +
               " | ".join(_cell_text(col[i]) for col in cols.values()) +
               f" | {e.study}: {e.read_from} |")
  def setting(cells):
    cs = [c for v in cells.values() for c in v]
    alphas = "/".join(f"{a:g}" for a in sorted({float(c["alpha"]) for c in cs}))
    episodes = "/".join(str(e) for e in sorted({c["train"]["episodes"] for c in cs}))
    return f"alpha {alphas}, {episodes} training episodes per router"
  out += ["", "Setting per run: " + "; ".join(f"{k} {setting(v)}" for k, v in runs.items()) + "."]
  units = "; ".join(f"{k} {accuracy_unit(v)}" for k, v in runs.items())
  out += ["", "Seeds per run: " + "; ".join(f"{k} {v}" for k, v in seeds.items()) + ". Points "
          f"of accuracy ({units}) unless the row says otherwise; mean ± 95% t half-width over the "
          "seeds, differences paired by seed (n/a for one seed)."]
  return "\n".join(out) + "\n"
