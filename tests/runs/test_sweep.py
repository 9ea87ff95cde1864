"""The alpha sweep and its report, end to end on the CI-sized config in a temporary directory."""
import contextlib
import io
import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from experiments.configs import sweep as sweep_config
from gp_jax import errors
from gp_jax.runs import sweep
from gp_jax.runs import sweep_report as report

REPO = pathlib.Path(__file__).resolve().parents[2]


def tiny_config():
  c = sweep_config.get_config("test")
  c.sweep.seeds = "0"
  c.train.episodes = 16            # one PPO iteration: the test checks plumbing, not learning
  c.compile_cache = ""
  return c


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
  wd = tmp_path_factory.mktemp("sweep")
  c = tiny_config()
  c.sweep.alphas = "0.9"
  first = sweep.sweep_from_config(c, wd, verbose=False)
  cell = wd / "alpha0.9_seed0" / "cell.json"
  stamp = cell.stat().st_mtime_ns
  c.sweep.alphas = "0,0.9"
  err = io.StringIO()
  with contextlib.redirect_stderr(err):   # verbose: the progress lines
    second = sweep.sweep_from_config(c, wd, verbose=True)
  return wd, first, second, stamp, err.getvalue()


def test_sweep_writes_cells_and_resumes(swept):
  wd, first, second, stamp, err = swept
  # the one unfinished cell of the grown grid: "cell 1/1", then "1/1 cells" done
  lines = err.splitlines()
  assert "[sweep] cell 1/1: alpha=0 seed=0" in lines
  assert any(l.startswith("[sweep] 1/1 cells (100%)  last alpha=0 seed=0 | ") for l in lines)
  assert first["ran"] == [(0.9, 0)] and first["skipped"] == []
  assert second["ran"] == [(0.0, 0)] and second["skipped"] == [(0.9, 0)]
  assert (wd / "alpha0.9_seed0" / "cell.json").stat().st_mtime_ns == stamp   # not rewritten
  assert (wd / "labels_seed0.npz").exists()
  for a in ("0", "0.9"):
    rec = json.loads((wd / f"alpha{a}_seed0" / "cell.json").read_text())
    rows = {r["policy"]: r for r in rec["rows"] if r["domain"] == "all"}
    expected = {"GraphPlanner", "random", "optimum (DP)"} | {
        f"router:{n}" for n in tiny_config().sweep.routers.split(",")} | {
        f"single:{m}" for m in rec["llms"]} | {
        f"multi:{n}" for n in tiny_config().sweep.multi_routers.split(",")} | {
        "optimum (DP, Router-R1 mask)"}
    assert set(rows) == expected
    assert all(r["n"] == rec["n_test"] for r in rows.values())
    for r in rows.values():   # nothing beats the exact optimum in expectation
      assert r["reward"] <= rows["optimum (DP)"]["reward"] + 1e-9
    # Nor, within Router-R1's mask, the optimum of that mask; the mask can only cost reward.
    assert rows["multi:router_r1"]["reward"] <= rows["optimum (DP, Router-R1 mask)"]["reward"] + 1e-9
    assert rows["optimum (DP, Router-R1 mask)"]["reward"] < rows["optimum (DP)"]["reward"]
    # A router that always picks one LLM reproduces that LLM's single-LLM row exactly.
    largest = max(rec["router_picks"]["largest"], key=rec["router_picks"]["largest"].get)
    assert rows["router:largest"]["reward"] == pytest.approx(rows[f"single:{largest}"]["reward"])


def test_report_tables_and_plot(swept, tmp_path):
  wd, *_ = swept
  out = report.write_report(wd, tmp_path / "r.md")
  text = out.read_text()
  assert "![accuracy vs cost](r_pareto.png)" in text
  assert "| GraphPlanner |" in text and "## alpha = 0.9" in text
  png = (tmp_path / "r_pareto.png").read_bytes()
  assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
  agg = report.aggregate(report.load_cells(wd))
  assert sorted(agg) == [0.0, 0.9]
  cell = json.loads((wd / "alpha0_seed0" / "cell.json").read_text())
  gp = [r for r in cell["rows"] if r["policy"] == "GraphPlanner" and r["domain"] == "all"][0]
  assert agg[0.0]["GraphPlanner"]["reward"] == (pytest.approx(gp["reward"]), 0.0, 1)
  # alpha 0: the expected accuracy is the reward itself.
  assert agg[0.0]["GraphPlanner"]["exp_accuracy"][0] == pytest.approx(gp["reward"])


def test_report_aggregates_over_seeds(tmp_path):
  rows = lambda r: [dict(policy="p", domain="all", n=2, accuracy=r, cost=1.0, reward=r, calls=1.0)]
  for seed, r in ((0, 0.2), (1, 0.4), (2, 0.9)):
    d = tmp_path / f"alpha0.5_seed{seed}"
    d.mkdir()
    (d / "cell.json").write_text(json.dumps(dict(alpha=0.5, seed=seed, simulated=True, rows=rows(r))))
  m = report.aggregate(report.load_cells(tmp_path))[0.5]["p"]
  assert m["reward"][0] == pytest.approx(0.5)
  assert m["reward"][1] == pytest.approx(0.3605551, rel=1e-5)   # sample std of 0.2, 0.4, 0.9
  assert m["exp_accuracy"][0] == pytest.approx(0.5 + 0.5 * 1.0)


def test_paired_gaps_compare_within_each_seed(tmp_path):
  def row(p, r):
    return dict(policy=p, domain="all", n=2, accuracy=r, cost=0.0, reward=r, calls=1.0)
  # GraphPlanner wins seed 0 by 0.1 and loses seed 1 by 0.05; the other method's spread over seeds
  # (0.2 vs 0.8) does not enter the paired gap.
  for seed, (gp, other) in enumerate(((0.3, 0.2), (0.75, 0.8))):
    d = tmp_path / f"alpha0.5_seed{seed}"
    d.mkdir()
    (d / "cell.json").write_text(json.dumps(dict(alpha=0.5, seed=seed, simulated=True, n_train=1,
                                                 n_test=2, llms=["m"],
                                                 rows=[row("GraphPlanner", gp), row("q", other),
                                                       row("optimum (DP, Router-R1 mask)", 0.9)])))
  cells = report.load_cells(tmp_path)
  mean, std, wins, n = report.paired_gaps(cells)[0.5]["q"]
  assert (mean, wins, n) == (pytest.approx(0.025), 1, 2)
  assert std == pytest.approx(np.std([0.1, -0.05], ddof=1))
  text = report.markdown(report.aggregate(cells), cells, None)
  assert "| q | +0.025 ± 0.106 (1/2) |" in text
  # Two seeds: 1 degree of freedom, t = 12.706; q is the only rival (a DP optimum is a ceiling,
  # not a baseline, however small its gap), so it is the strongest.
  half = 12.7062 * np.std([0.1, -0.05], ddof=1) / np.sqrt(2)   # t(0.975, 1 d.o.f.) = 12.7062
  name, m, lo, hi, n = report.strongest_gaps(report.paired_gaps(cells))[0.5]
  assert (name, n) == ("q", 2) and (lo, hi) == (pytest.approx(0.025 - half, rel=1e-5),
                                                 pytest.approx(0.025 + half, rel=1e-5))
  assert f"| 0.5 | q | +0.025 | [{0.025 - half:+.3f}, {0.025 + half:+.3f}] | 2 |" in text


def test_bad_inputs_fail_cleanly(tmp_path):
  c = tiny_config()
  c.sweep.routers = "knn,nope"
  with pytest.raises(errors.ConfigError, match="unknown router 'nope'"):
    sweep.sweep_from_config(c, tmp_path / "w", verbose=False)
  assert not (tmp_path / "w").exists()          # nothing written before the check
  c = tiny_config()
  c.sweep.alphas = "0,x"
  with pytest.raises(errors.ConfigError, match="sweep.alphas"):
    sweep.sweep_from_config(c, tmp_path / "w", verbose=False)
  (tmp_path / "bad" / "alpha0_seed0").mkdir(parents=True)
  (tmp_path / "bad" / "alpha0_seed0" / "cell.json").write_text("{not json")
  with pytest.raises(errors.DataError, match="cell.json"):
    report.load_cells(tmp_path / "bad")


def test_report_runner_exits_2_on_empty_workdir(tmp_path):
  p = subprocess.run([sys.executable, "-m", "experiments.report", f"--workdir={tmp_path}"],
                     cwd=REPO, capture_output=True, text=True, timeout=120)
  assert p.returncode == 2
  assert p.stderr.strip().splitlines()[-1].startswith("error: ") and "no finished sweep cells" in p.stderr
