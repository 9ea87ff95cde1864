"""The paper's effects beside the studies' readings (gp_jax/runs/studies/paper_table.py)."""
import json

import numpy as np
import pytest

from experiments import report as report_cli
from gp_jax import errors
from gp_jax.runs.studies import paper_table
from gp_jax.runs.studies import report
from gp_jax.runs.studies import runner

ALPHA = 0.5


def _cell(study, variant, seed, exp_acc, cost=0.2, calls=3.0, others=None):
  """A study cell whose router has expected accuracy `exp_acc` (reward = exp_acc - alpha cost);
  `others`: policy -> expected accuracy of reference rows (cost 0.1)."""
  rows = [dict(policy=f"{runner.ROUTER}[{variant}]", domain="all", n=10, accuracy=0.0,
               cost=cost, reward=exp_acc - ALPHA * cost, calls=calls),
          dict(policy="optimum (DP)", domain="all", n=10, accuracy=0.0, cost=0.1, reward=0.9,
               calls=2.0)]
  for p, a in (others or {}).items():
    rows.append(dict(policy=p, domain="all", n=10, accuracy=0.0, cost=0.1,
                     reward=a - ALPHA * 0.1, calls=1.0))
  return dict(study=study, variant=variant, seed=seed, alpha=ALPHA, simulated=True, rows=rows,
              index=0, n_test=10, train=dict(episodes=8, seconds=1.0), seconds=1.0)


def _by_name(readings):
  return {r["effect"].name: r for r in readings}


def test_paper_side_is_computed_from_the_preregistered_targets():
  t = paper_table.load_targets()
  r = _by_name(paper_table.readings({}, t))
  v = lambda tid: t[tid]["value"]
  assert r["Phase 2 - Phase 1 depth 1 width 3"]["paper"] == pytest.approx(
      v("p2.graphplanner.acc") - v("p1.d1w3.graphplanner.acc"))
  assert r["unseen tasks - seen tasks"]["paper"] == pytest.approx(
      v("unseen_tasks.graphplanner.acc") - v("p2.graphplanner.acc"))
  doms = paper_table.DOMAINS
  assert r["new roles trained - Planner/Executor/Summarizer"]["paper"] == pytest.approx(
      np.mean([v(f"roles.new_role_train.acc.{d}") - v(f"p2.graphplanner.acc.{d}") for d in doms]))
  assert r["transductive - inductive inference"]["paper_text"].startswith("> 0")
  # nothing run: every reading says so, none is a number
  assert all(x["n"] == 0 and x["agrees"] is None and x["ratio"] is None for x in r.values())
  md = paper_table.markdown({}, t)
  assert md.count("| not run |") == len(paper_table.EFFECTS)


def test_missing_target_is_a_data_error(tmp_path):
  t = paper_table.load_targets()
  del t["p1.d2w2.graphplanner.acc"]
  with pytest.raises(errors.DataError, match="p1.d2w2.graphplanner.acc"):
    paper_table.readings({}, t)


def test_readings_pair_by_seed_and_judge_the_sign():
  t = paper_table.load_targets()
  phase2 = {0: 0.60, 1: 0.64}
  d1w3 = {0: 0.58, 1: 0.59}      # differences 2 and 5 points
  cells = {
      "phases": [_cell("phases", "phase2", s, a, calls=2.0 + s) for s, a in phase2.items()] +
                [_cell("phases", "phase1_d1w3", s, a) for s, a in d1w3.items()],
      # best single-round router 0.70 > GraphPlanner's 0.60 on seed 0 only ('single:' ignored)
      "unseen": [_cell("unseen", "seen_tasks", 0, 0.60,
                       others={"router:knn": 0.70, "router:mlp": 0.5, "single:x": 0.9})],
      "ablations": [_cell("ablations", "transductive", 0, 0.60),
                    _cell("ablations", "history_summary", 0, 0.55),
                    _cell("ablations", "history_retrieval", 0, 0.62)],
  }
  r = _by_name(paper_table.readings(cells, t))
  p2 = r["GraphPlanner, Phase 2"]
  assert p2["mean"] == pytest.approx(62.0) and p2["n"] == 2 and p2["agrees"] is None
  assert r["GraphPlanner's calls per query (calls)"]["mean"] == pytest.approx(2.5)
  d = r["Phase 2 - Phase 1 depth 1 width 3"]
  diffs = np.array([2.0, 5.0])
  assert d["per_seed"] == pytest.approx({0: 2.0, 1: 5.0})
  assert d["mean"] == pytest.approx(3.5)
  assert d["half_width"] == pytest.approx(12.7062 * diffs.std(ddof=1) / np.sqrt(2), rel=1e-4)
  assert d["agrees"] is True and d["ratio"] == pytest.approx(3.5 / d["paper"])
  b = r["GraphPlanner - best baseline (here: best single-round router)"]
  assert b["mean"] == pytest.approx(-10.0) and b["n"] == 1 and b["agrees"] is False
  h = r["graph memory - best history as text"]      # minus the better of the two: retrieval
  assert h["mean"] == pytest.approx(-2.0) and h["agrees"] is False and h["ratio"] is None
  assert r["Phase 2 - Phase 1 depth 2 width 2"]["n"] == 0        # variant absent: not run
  assert "in points of expected accuracy unless" in paper_table.markdown(cells, t)
  real = {"phases": [dict(c, simulated=False) for c in cells["phases"]]}
  assert "in points of sampled accuracy (a real backend" in paper_table.markdown(real, t)
  assert paper_table.readings(real, t)[0]["per_seed"] == pytest.approx({0: 0.0, 1: 0.0})
  same = dict(cells, roles=[_cell("roles", v, 0, 0.6) for v in ("pes_trained", "pestv_zero_shot")])
  z = _by_name(paper_table.readings(same, t))["new roles zero-shot - Planner/Executor/Summarizer"]
  assert z["mean"] == 0 and z["n"] == 1 and z["agrees"] is None      # a zero has no sign
  md = paper_table.markdown(cells, t)
  assert "| Phase 2 - Phase 1 depth 1 width 3 | +5.0 | +3.5 ± " in md
  assert ("| GraphPlanner - best baseline (here: best single-round router) | +9.3 | "
          "-10.0 ± n/a | 1 | no | -1.08 |") in md
  assert "| GraphPlanner's calls per query (calls) | 8.1 | 2.50 ± " in md


def test_full_report_adds_the_section_only_with_the_papers_studies(tmp_path):
  for s, a in ((0, 0.60), (1, 0.64)):
    for variant, acc in (("phase2", a), ("phase1_d1w3", a - 0.03)):
      d = tmp_path / "studies" / "phases" / f"{variant}_seed{s}"
      d.mkdir(parents=True)
      (d / runner.CELL_FILE).write_text(json.dumps(_cell("phases", variant, s, acc)))
  text = report.write_full_report(tmp_path, tmp_path / "report.md").read_text()
  assert "## Against the paper" in text
  assert "| Phase 2 - Phase 1 depth 1 width 3 | +5.0 | +3.0 ± 0.0 | 2 | yes |" in text
  assert "| unseen tasks - seen tasks | +14.4 | not run |" in text
  other = tmp_path / "other"
  d = other / "studies" / "toy" / "a_seed0"
  d.mkdir(parents=True)
  (d / runner.CELL_FILE).write_text(json.dumps(_cell("toy", "a", 0, 0.5)))
  assert "Against the paper" not in report.write_full_report(other, other / "r.md").read_text()


def _write_cells(root, study, cells):
  for c in cells:
    d = root / "studies" / study / f"{c['variant']}_seed{c['seed']}"
    d.mkdir(parents=True)
    (d / runner.CELL_FILE).write_text(json.dumps(c))


def test_compare_reads_each_run_side_by_side_through_the_cli(tmp_path):
  """experiments.report --compare=label=root,...: one column per run; a bad spec, a root with no
  study cells and a missing --out are one error line each, exit 2, nothing written."""
  import subprocess
  import sys
  for label, gap in (("v1", 0.03), ("v2", -0.02)):
    _write_cells(tmp_path / label, "phases",
                 [_cell("phases", "phase2", s, 0.6 + 0.01 * s) for s in (0, 1)] +
                 [_cell("phases", "phase1_d1w3", s, 0.6 + 0.01 * s - gap) for s in (0, 1)])
  _write_cells(tmp_path / "v2", "ablations", [_cell("ablations", "transductive", 0, 0.6),
                                              _cell("ablations", "no_history", 0, 0.5)])
  out = tmp_path / "cmp.md"
  run = lambda *a: subprocess.run([sys.executable, "-m", "experiments.report", *a],
                                  capture_output=True, text=True, timeout=120)
  p = run(f"--compare=v1={tmp_path / 'v1'},v2={tmp_path / 'v2'}", f"--out={out}")
  assert p.returncode == 0, p.stderr
  text = out.read_text()
  assert "| effect | paper | v1 | v2 | read from (study: variants) |" in text
  assert ("| Phase 2 - Phase 1 depth 1 width 3 | +5.0 | +3.0 ± 0.0 (sign as paper) | "
          "-2.0 ± 0.0 (sign opposite) |") in text
  assert "| GraphPlanner - no history memory | > 0 (higher in 5 of 5 domains) | not run | " \
         "+10.0 ± n/a (sign as paper) |" in text
  assert "Seeds per run: v1 [0, 1]; v2 [0, 1]. Points of accuracy (v1 expected accuracy; v2 " \
         "expected accuracy)" in text
  assert "Setting per run: v1 alpha 0.5, 8 training episodes per router; v2 alpha 0.5, 8" in text
  for args, msg in (([f"--compare=v1{tmp_path}", f"--out={tmp_path / 'a.md'}"],
                     "is not label=root"),
                    ([f"--compare=a={tmp_path / 'v1'}"], "--compare needs --out")):
    p = run(*args)
    assert p.returncode == 2 and msg in p.stderr and "Traceback" not in p.stderr, p.stderr
  with pytest.raises(errors.ConfigError, match="label 'a' given twice"):
    report_cli._compare_roots(f"a={tmp_path / 'v1'},a={tmp_path / 'v2'}")
  with pytest.raises(errors.DataError, match="no finished cells of the studies"):
    report.write_comparison({"a": tmp_path / "none"}, tmp_path / "a.md")
  assert not (tmp_path / "a.md").exists()
