r"""Calibration of the v2 world (gp_jax/sim/world.py) to the paper's `fit` targets.

What is fitted: a few bounded, physically meaningful parameters of `WorldParams` -- the step
penalty gamma, the split penalty, the summary and final-answer quality shifts, the complexity tilt,
one hardness shift per domain (the tasks' hardness offsets are v1 assumptions; prior 0, width 0.5)
and one skill shift per LLM -- each with a prior (v1's value; the shifts 0) and a prior width:
0.25 logit for an LLM whose five domain skills in data/simulator.json are all sourced, 0.5 for
one with an assumed skill. The v2 mechanisms (step cue, clusters, offset size) stay as
configured: they are not fitted to the paper. Verbosity is not fitted: the paper's cost unit is
ambiguous (data/paper_targets.json, about.missing), so no cost target constrains it.

What the objective runs: single LLMs and cheap stand-ins for the baselines, computed exactly from
the world's success probabilities (expected accuracy, no sampling, no training, never
GraphPlanner), on fixed simulated queries (common random numbers: every evaluation sees the same
queries, sub-question noise and cluster draws, so two parameter vectors are compared on equal
terms):
  task router      one call: each test query goes to the LLM with the highest mean direct accuracy
                   on the training queries of its task (a single-round router that learned the
                   task-level signal); stands for RouterDC and Router-R1 (Phase 2), overall and per
                   domain. Router-R1's 1.8 calls per query are not modelled.
  decomposed       R2-Reasoner-style: the strongest LLM (highest mean skill) splits the root into
                   min(k, 3) sub-questions, each answered by its task's router LLM, then the strong
                   LLM summarises and gives the final answer; calls = 1 + width + 2. Stands for
                   R2-Reasoner (Phase 2 accuracy and calls).
  decomposed w3    the same with exactly 3 sub-questions (Phase 1, depth 1, width 3): stands for
                   the mean of Router-KNN*, RouterDC* and GraphRouter* there (it cannot tell the
                   three routers apart, so each enters with weight 1/3).
  domain router    held-out tasks: the LLM best on the training queries of the task's domain.
Every fit target is reported (paper vs simulator); the objective uses those with a stand-in. Not
in the objective: costs (ambiguous unit), AIME (no simulated task), Router-R1's calls, and the
held-out tasks (their hardness offsets are assumptions outside the fitted parameters; fitting them
through the skills would move every seen-task number): they are reported.

Objective: weighted mean squared residual in points over the accuracy targets, plus
(10 x calls residual)^2 for R2-Reasoner's calls (0.1 call weighs as one point), plus the prior
penalty sum ((value - prior) / prior_sd)^2 (one prior width costs one squared point).
Optimizer: coordinate search over the bounded parameters (each pass tries value +- step x range
for every parameter in turn, keeps an improvement; the step halves after a pass without one),
resumable from its state file after every coordinate.
"""
from __future__ import annotations

import dataclasses
import json
import math
import pathlib

import numpy as np

from gp_jax import errors
from gp_jax import files
from gp_jax import paths
from gp_jax import progress as progress_lib
from gp_jax.llm import catalog as catalog_lib
from gp_jax.sim import simulator as sim
from gp_jax.sim import world as world_lib

TARGETS_FILE = paths.DATA_DIR / "paper_targets.json"
STATE_FILE, WORLD_FILE, REPORT_JSON, REPORT_MD = ("calibrate_state.json", "world.json",
                                                  "report.json", "report.md")
CALLS_WEIGHT = 10.0     # points per call of R2-Reasoner's calls residual
DOMAINS = ("math", "code", "commonsense", "world_knowledge", "knowledge_reasoning")


@dataclasses.dataclass(frozen=True)
class Param:
  name: str
  prior: float
  lo: float
  hi: float
  prior_sd: float
  source: str


def parameters(llms, sim_file=sim.SIM_FILE) -> list[Param]:
  """The fitted parameters, their priors, bounds and where each prior comes from."""
  raw = json.loads(pathlib.Path(sim_file).read_text())["llms"]
  out = [
      Param("gamma", 1.2, 0.3, 2.5, 0.4, "v1 assumption (docs/simulator.md)"),
      Param("split_penalty", 0.6, 0.0, 1.5, 0.4, "v1 assumption"),
      Param("summary_shift", 0.0, -2.5, 2.5, 1.0, "v1 assumption (rho = sigmoid(2.5 + 0.8 g))"),
      Param("final_shift", 0.0, -2.5, 2.5, 1.0, "v1 assumption (phi = sigmoid(3.0 + 0.8 g))"),
      Param("complexity_tilt", 0.0, -1.5, 1.5, 0.75, "v1 assumption (k mix 0.4/0.25/0.2/0.15)"),
  ]
  for d in DOMAINS:
    out.append(Param(f"hardness.{d}", 0.0, -1.5, 1.5, 0.5,
                     "v1 assumption (simulator.TASKS hardness offsets)"))
  for m in llms:
    assumed = sum("assumed" in src.lower() for _acc, src in raw[m]["skill"].values())
    sd = 0.25 if assumed == 0 else 0.5
    out.append(Param(f"skill.{m}", 0.0, -1.0, 1.0, sd,
                     f"data/simulator.json ({5 - assumed} of 5 domain skills sourced)"))
  return out


def world_params(base: world_lib.WorldParams, values: dict) -> world_lib.WorldParams:
  shifts = {k[len("skill."):]: v for k, v in values.items() if k.startswith("skill.")}
  hardness = {k[len("hardness."):]: v for k, v in values.items() if k.startswith("hardness.")}
  plain = {k: v for k, v in values.items() if not k.startswith(("skill.", "hardness."))}
  return base.replace(skill_shift=shifts, domain_hardness=hardness, **plain)


@dataclasses.dataclass(frozen=True)
class Setup:
  """What every evaluation shares: the pool, the queries' seeds and sizes, the v2 mechanisms."""
  profiles: dict
  llms: tuple
  seed: int
  n_train: int
  n_test: int
  n_unseen: int
  base: world_lib.WorldParams


def measure(setup: Setup, params: world_lib.WorldParams) -> dict[str, float]:
  """The stand-ins' numbers in a world (module docstring): accuracies in points, calls per query."""
  world = sim.SimWorld(setup.profiles, params=params)
  llms = list(setup.llms)
  train = world.sample_queries(setup.n_train, seed=setup.seed, split="cal-train")
  test = world.sample_queries(setup.n_test, seed=setup.seed, split="cal-test")
  unseen = world.sample_queries(setup.n_unseen, seed=setup.seed, split="cal-unseen",
                                tasks=sim.UNSEEN_TASKS)

  def direct(q):
    node = world.lookup(q.query)
    return np.array([world.exec_probability(node, m) for m in llms])

  p_train = np.array([direct(q) for q in train])
  by_task, by_domain = {}, {}
  for key, group in (("task", by_task), ("domain", by_domain)):
    labels = np.array([getattr(q, "task_name" if key == "task" else "domain") for q in train])
    for lab in set(labels):
      group[lab] = llms[int(p_train[labels == lab].mean(axis=0).argmax())]
  fallback = llms[int(p_train.mean(axis=0).argmax())]
  strong = max(llms, key=lambda m: world.profiles[m].competence)
  prof = world.profiles[strong]

  def router_llm(q):
    return by_task.get(q.task_name, by_domain.get(q.domain, fallback))

  rows = []
  for q in test:
    node, m = world.lookup(q.query), router_llm(q)
    row = {"domain": q.domain, "task_router": world.exec_probability(node, m)}
    for name, width, exact in (("decomposed", 3, False), ("decomposed_w3", 3, True)):
      kids = world.children(node, strong, width, exact)
      p = np.mean([world.exec_probability(k, m) for k in kids])
      row[name] = prof.final_quality * prof.summary_quality * p
      row[name + ".calls"] = 1 + len(kids) + 2
    rows.append(row)
  out = {k: 100 * float(np.mean([r[k] for r in rows])) for k in ("task_router", "decomposed",
                                                                   "decomposed_w3")}
  out["decomposed.calls"] = float(np.mean([r["decomposed.calls"] for r in rows]))
  for d in DOMAINS:
    sel = [r["task_router"] for r in rows if r["domain"] == d]
    if sel:
      out[f"task_router.{d}"] = 100 * float(np.mean(sel))
  for t in sim.UNSEEN_TASKS:
    sel = [world.exec_probability(world.lookup(q.query), by_domain.get(q.domain, fallback))
           for q in unseen if q.task_name == t]
    if sel:
      out[f"domain_router.{t}"] = 100 * float(np.mean(sel))
  out["oracle_gap"] = world_lib.oracle_gap(world, test, llms)
  return out


# target id -> (stand-in key, weight in the objective (0: reported only), why)
def _mapping(target: dict) -> tuple[str | None, float, str]:
  tid = target["id"]
  if tid in ("p2.routerdc.acc", "p2.router_r1.acc"):
    return "task_router", 1.0, "task router"
  if tid.startswith("p2.router_r1.acc."):
    return "task_router." + tid.rsplit(".", 1)[1], 1.0, "task router, per domain"
  if tid == "p2.r2_reasoner.acc":
    return "decomposed", 1.0, "decomposed (R2-Reasoner-style)"
  if tid == "p2.r2_reasoner.calls":
    return "decomposed.calls", 1.0, "decomposed: 1 + width + 2 calls"
  if tid.startswith("p1.d1w3.") and tid.endswith(".acc"):
    return "decomposed_w3", 1.0 / 3, "decomposed, exactly 3 sub-questions (mean of 3 routers)"
  if tid == "p2.routerdc.calls":
    return "one_call", 0.0, "a single-round router makes 1 call by construction"
  if tid.startswith("unseen_tasks.") and target.get("aggregate_of") is None:
    return "domain_router." + tid.rsplit(".", 1)[1], 0.0, "domain router; reported, not fitted"
  if tid.startswith("unseen_tasks."):
    return "domain_router.mean", 0.0, "domain router, mean of the held-out tasks; reported"
  if tid.endswith(".cost"):
    return None, 0.0, "not simulated here: the paper's cost unit is ambiguous"
  if tid.startswith("aime."):
    return None, 0.0, "not simulated: AIME is not a simulated task"
  if tid == "p2.router_r1.calls":
    return None, 0.0, "not modelled by the task-router stand-in"
  return None, 0.0, "no stand-in"


def load_fit_targets(path=TARGETS_FILE) -> list[dict]:
  raw = errors.read_json(path, "paper targets file")
  return [t for t in raw["targets"] if t["label"] == "fit"]


def compare(targets: list[dict], measured: dict) -> list[dict]:
  """One row per fit target: paper, simulator (None when not simulated), weight, residual."""
  m = dict(measured, one_call=1.0)
  unseen = [v for k, v in measured.items() if k.startswith("domain_router.")]
  if unseen:
    m["domain_router.mean"] = float(np.mean(unseen))
  rows = []
  for t in targets:
    key, weight, how = _mapping(t)
    value = m.get(key) if key else None
    rows.append({"id": t["id"], "paper": float(t["value"]), "unit": t["unit"], "stand_in": how,
                 "simulator": value, "weight": weight if value is not None else 0.0,
                 "residual": None if value is None else value - float(t["value"])})
  return rows


def rmse(rows) -> float:
  """Weighted RMSE in points over the accuracy targets of the objective."""
  acc = [(r["weight"], r["residual"]) for r in rows
         if r["weight"] > 0 and not r["id"].endswith(".calls")]
  w = sum(a for a, _ in acc)
  return math.sqrt(sum(a * e * e for a, e in acc) / w) if w else float("nan")


def loss(rows, values: dict, specs: list[Param]) -> float:
  acc = [(r["weight"], r["residual"]) for r in rows
         if r["weight"] > 0 and not r["id"].endswith(".calls")]
  w = sum(a for a, _ in acc)
  total = sum(a * e * e for a, e in acc) / w if w else 0.0
  for r in rows:
    if r["weight"] > 0 and r["id"].endswith(".calls"):
      total += (CALLS_WEIGHT * r["residual"]) ** 2
  total += sum(((values[p.name] - p.prior) / p.prior_sd) ** 2 for p in specs)
  return float(total)


@dataclasses.dataclass
class Settings:
  seed: int
  llms: tuple
  n_train: int
  n_test: int
  n_unseen: int
  passes: int
  initial_step: float
  min_step: float
  fit: tuple            # names of the fitted parameters (() = all)
  base: dict            # the v2 mechanisms (WorldParams fields)

  def to_json(self) -> dict:
    d = dataclasses.asdict(self)
    d["llms"], d["fit"] = list(self.llms), list(self.fit)
    return d


def settings_from_config(c, catalog: catalog_lib.Catalog) -> Settings:
  llms = (catalog_lib.training_names(catalog) if c.llms == "train"
          else list(catalog.names) if c.llms == "all"
          else [s.strip() for s in str(c.llms).split(",") if s.strip()])
  catalog_lib.check_names(catalog, llms)
  if len(llms) < 2:
    raise errors.ConfigError("calibration needs at least 2 LLMs (config.llms)")
  for name in ("n_train", "n_test", "n_unseen", "passes"):
    if int(c[name]) < 1:
      raise errors.ConfigError(f"config.{name} must be >= 1, got {c[name]}")
  if not 0 < float(c.min_step) <= float(c.initial_step) <= 1:
    raise errors.ConfigError("config needs 0 < min_step <= initial_step <= 1 (fractions of a "
                             "parameter's range)")
  base = dict(c.world)
  world_lib.WorldParams.from_json(base, where="config.world")   # checks the fields
  fit = tuple(s.strip() for s in str(c.fit).split(",") if s.strip()) if c.fit != "all" else ()
  return Settings(int(c.seed), tuple(llms), int(c.n_train), int(c.n_test), int(c.n_unseen),
                  int(c.passes), float(c.initial_step), float(c.min_step), fit, base)


def calibrate(settings: Settings, workdir, catalog: catalog_lib.Catalog, *,
              targets_file=TARGETS_FILE) -> dict:
  """Runs (or resumes) the coordinate search; writes the world file and the report; returns the
  report's JSON."""
  workdir = pathlib.Path(workdir)
  specs_all = parameters(settings.llms)
  known = {p.name for p in specs_all}
  unknown = sorted(set(settings.fit) - known)
  if unknown:
    raise errors.ConfigError(f"config.fit names unknown parameters {unknown} (known: {sorted(known)})")
  specs = [p for p in specs_all if not settings.fit or p.name in settings.fit]
  targets = load_fit_targets(targets_file)
  base = world_lib.WorldParams.from_json(settings.base, where="config.world")
  setup = Setup(sim.load_profiles(catalog.select(list(settings.llms))), settings.llms,
                settings.seed, settings.n_train, settings.n_test, settings.n_unseen, base)

  def evaluate(values):
    measured = measure(setup, world_params(base, values))
    rows = compare(targets, measured)
    return loss(rows, values, specs), rows, measured

  state_path = workdir / STATE_FILE
  state = _load_state(state_path, settings)
  if state is not None and sorted(state["values"]) != sorted(p.name for p in specs):
    raise errors.ConfigError(f"{state_path} fits other parameters than this code does; use another "
                             "--workdir or delete it")
  if state is None:
    values = {p.name: p.prior for p in specs}
    first, _, _ = evaluate(values)
    state = {"settings": settings.to_json(), "values": values, "loss": first, "prior_loss": first,
             "pass": 0, "index": 0, "step": settings.initial_step, "improved": False,
             "evaluations": 1, "done": False}
    files.write_json(state_path, state, "calibration state", indent=1)
  total = settings.passes * len(specs)
  bar = progress_lib.Progress("calibrate", total, unit="coords")
  while not state["done"]:
    p = specs[state["index"]]
    values = state["values"]
    for sign in (+1, -1):
      trial = dict(values)
      trial[p.name] = float(np.clip(values[p.name] + sign * state["step"] * (p.hi - p.lo),
                                    p.lo, p.hi))
      if trial[p.name] == values[p.name]:
        continue
      value, _, _ = evaluate(trial)
      state["evaluations"] += 1
      if value < state["loss"] - 1e-9:
        state["values"], state["loss"], state["improved"] = trial, value, True
        break
    state["index"] += 1
    if state["index"] == len(specs):
      state["index"], state["pass"] = 0, state["pass"] + 1
      if not state["improved"]:
        state["step"] /= 2
      state["improved"] = False
      state["done"] = state["pass"] >= settings.passes or state["step"] < settings.min_step
    files.write_json(state_path, state, "calibration state", indent=1)
    bar.update(min(total, state["pass"] * len(specs) + state["index"]), loss=f"{state['loss']:.2f}",
               step=f"{state['step']:.3f}")
  bar.update(total, final=True, loss=f"{state['loss']:.2f}")

  final_loss, rows, measured = evaluate(state["values"])
  prior_values = {p.name: p.prior for p in specs}
  _, prior_rows, prior_measured = evaluate(prior_values)
  fitted = world_params(base, state["values"])
  report = {
      "settings": settings.to_json(), "targets_file": str(targets_file),
      "loss": final_loss, "prior_loss": state["prior_loss"], "evaluations": state["evaluations"],
      "passes": state["pass"], "final_step": state["step"],
      "rmse_points": rmse(rows), "prior_rmse_points": rmse(prior_rows),
      "targets": [dict(r, prior_simulator=pr["simulator"]) for r, pr in zip(rows, prior_rows)],
      "parameters": [{"name": p.name, "prior": p.prior, "fitted": state["values"][p.name],
                      "move": state["values"][p.name] - p.prior,
                      "move_in_prior_sd": (state["values"][p.name] - p.prior) / p.prior_sd,
                      "lo": p.lo, "hi": p.hi, "prior_sd": p.prior_sd, "source": p.source,
                      "at_bound": state["values"][p.name] in (p.lo, p.hi)} for p in specs],
      "oracle_gap": measured["oracle_gap"], "prior_oracle_gap": prior_measured["oracle_gap"],
  }
  files.write_json(workdir / WORLD_FILE, {"params": fitted.to_json(),
                                          "about": "v2 world fitted by experiments.calibrate "
                                                   "(docs/calibration.md)",
                                          "rmse_points": report["rmse_points"]},
                   "fitted world file", indent=1)
  files.write_json(workdir / REPORT_JSON, report, "calibration report", indent=1)
  files.write_atomic(workdir / REPORT_MD, render(report), "calibration report")
  return report


def _load_state(path: pathlib.Path, settings: Settings) -> dict | None:
  if not path.exists():
    return None
  state = errors.read_json(path, "calibration state")
  if state.get("settings") != json.loads(json.dumps(settings.to_json())):
    raise errors.ConfigError(f"{path} holds a calibration with other settings; use another "
                             "--workdir or delete it")
  return state


def _fmt(v, digits=1):
  return "n/a" if v is None else f"{v:.{digits}f}"


def render(report: dict) -> str:
  """The report as Markdown."""
  lines = ["# Calibration of the v2 world", "",
           f"Fit RMSE over the accuracy targets of the objective: **{report['rmse_points']:.2f} "
           f"points** (at the priors: {report['prior_rmse_points']:.2f}); objective "
           f"{report['loss']:.2f} (at the priors {report['prior_loss']:.2f}); "
           f"{report['evaluations']} evaluations, {report['passes']} pass(es), final step "
           f"{report['final_step']:.4f} of each range.", "",
           "## Targets (paper vs simulator)", "",
           "| target | paper | simulator (fitted) | simulator (priors) | residual | weight | stand-in |",
           "|---|---|---|---|---|---|---|"]
  for r in report["targets"]:
    digits = 2 if r["id"].endswith(".calls") else 1
    lines.append(f"| {r['id']} | {r['paper']:g} | {_fmt(r['simulator'], digits)} | "
                 f"{_fmt(r['prior_simulator'], digits)} | {_fmt(r['residual'], digits)} | "
                 f"{r['weight']:.2f} | {r['stand_in']} |")
  lines += ["", "## Parameters (move from the prior)", "",
            "| parameter | prior | fitted | move | move / prior sd | bounds | source of the prior |",
            "|---|---|---|---|---|---|---|"]
  for p in report["parameters"]:
    flag = " (at a bound)" if p["at_bound"] else ""
    lines.append(f"| {p['name']} | {p['prior']:g} | {p['fitted']:.3f}{flag} | {p['move']:+.3f} | "
                 f"{p['move_in_prior_sd']:+.2f} | [{p['lo']:g}, {p['hi']:g}] | {p['source']} |")
  g, g0 = report["oracle_gap"], report["prior_oracle_gap"]
  lines += ["", "## Oracle over single LLMs (direct answers, test queries)", "",
            f"Fitted world: best single {100 * g['best_single']:.1f} ({g['best_llm']}), per-query "
            f"oracle {100 * g['oracle']:.1f} (on sampled outcomes), {100 * g['oracle_expected']:.1f} "
            f"(knowing the probabilities). At the priors: best single {100 * g0['best_single']:.1f}, "
            f"oracle {100 * g0['oracle']:.1f}, {100 * g0['oracle_expected']:.1f}.", ""]
  return "\n".join(lines)
