"""Feasibility runner (gp_jax/runs/feasibility.py, experiments/feasibility.py): the DP optimum and
router:mlp per seed at CI size, the paired interval recomputed from the per-seed rows, and one
bad flag through the real runner."""
import json
import math
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats as scipy_stats

from experiments.configs import study as study_config
from gp_jax import errors
from gp_jax.runs import config_defaults
from gp_jax.runs import feasibility

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_optimum_and_mlp_per_seed_with_the_paired_interval(tmp_path):
  config = config_defaults.complete(study_config.get_config("test"))
  record = feasibility.run(config, [0, 1], 0.5, ["mlp"])
  path = tmp_path / "feasibility.json"
  feasibility.write(record, path)
  saved = json.loads(path.read_text())
  assert [s["seed"] for s in saved["seeds"]] == [0, 1]
  assert saved["setting"]["router_kwargs"] == dict(knn_k=10, mlp_hidden=64, steps=100)
  for s in saved["seeds"]:
    opt = s["policies"][feasibility.OPTIMUM]
    assert 0.0 <= opt["split_rate"] <= 1.0
    assert opt["calls"] >= 1.0
    assert s["n_test"] == config.data.n_test and opt["n"] == s["n_test"]
    assert "router:mlp" in s["policies"]
  # The interval from the per-seed rows, recomputed here (Student t, 1 degree of freedom).
  diffs = [s["policies"][feasibility.OPTIMUM]["reward"] - s["policies"]["router:mlp"]["reward"]
           for s in saved["seeds"]]
  mean = float(np.mean(diffs))
  half = float(scipy_stats.t.ppf(0.975, 1) * np.std(diffs, ddof=1) / math.sqrt(2))
  p = saved["paired"]["optimum (DP) - router:mlp"]
  assert p["differences"] == pytest.approx(diffs)
  assert p["mean"] == pytest.approx(mean) and p["half_width"] == pytest.approx(half)
  assert (p["low"], p["high"]) == pytest.approx((mean - half, mean + half))
  assert p["dof"] == 1 and p["t"] == pytest.approx(12.706, abs=1e-3)
  assert p["contains_zero"] == (mean - half <= 0 <= mean + half)
  # The per-policy summaries are the per-seed rows' means.
  rewards = [s["policies"]["router:mlp"]["reward"] for s in saved["seeds"]]
  assert saved["summary"]["router:mlp"]["reward"]["mean"] == pytest.approx(np.mean(rewards))
  table = feasibility.format_table(record)
  assert "optimum (DP) - router:mlp" in table and "95% t-interval" in table


def test_bad_lists_are_config_errors():
  for text in ["", "0,x", "0,-1", "1,1"]:
    with pytest.raises(errors.ConfigError, match="--seeds"):
      feasibility.parse_seeds(text)
  assert feasibility.parse_seeds("0, 2,4") == [0, 2, 4]
  with pytest.raises(errors.ConfigError, match="unknown router 'nope'"):
    feasibility.parse_routers("mlp,nope")
  assert feasibility.parse_routers("") == []


def test_cli_bad_seed_list_is_one_error_line_exit_2(tmp_path):
  out = tmp_path / "f.json"
  proc = subprocess.run(
      [sys.executable, "-m", "experiments.feasibility",
       "--config=experiments/configs/study.py:test", "--seeds=0,x", f"--out={out}"],
      cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True,
      timeout=180)
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert proc.returncode == 2, proc.stderr[-2000:]
  assert lines == ["error: --seeds=0,x: not a comma list of integers"]
  assert proc.stdout == "" and not out.exists()
