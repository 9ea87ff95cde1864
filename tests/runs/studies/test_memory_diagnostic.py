"""The memory diagnostic (gp_jax/runs/studies/memory_diagnostic.py) and row layouts of trained
workdirs: a workdir recorded before model.row_layout existed evaluates as layout 1."""
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from experiments.configs import test as test_config
from gp_jax.graph import history as history_lib
from gp_jax.runs import evaluate as evaluation
from gp_jax.runs import system as system_lib
from gp_jax.runs import train as training
from gp_jax.runs.studies import memory_diagnostic as diag

REPO = pathlib.Path(__file__).resolve().parents[3]


def test_inject_overwrites_only_the_llms_rows():
  rng = np.random.default_rng(0)
  rows = rng.uniform(size=(10, 7)).astype(np.float32)
  hubs = np.array([0, 1, 2, 3, 0, 1, 2, 3, 0, 1])
  h = history_lib.HistoryMemory(7, 4, capacity=100, rows=rows, hubs=hubs)
  sel = np.array([True, False, True, False])
  mine = sel[hubs]
  u0, fl, c4, fg = (diag.inject(h, sel, k) for k in ("utility0", "failed", "cost4x", "failing"))
  assert (fg.rows[mine, -3:] == [0, 0, 1]).all() and (fg.rows[~mine] == rows[~mine]).all()
  assert (u0.rows[mine, -3] == 0).all() and (u0.rows[~mine] == rows[~mine]).all()
  assert (fl.rows[mine, -1] == 1).all() and (fl.rows[~mine] == rows[~mine]).all()
  np.testing.assert_allclose(c4.rows[mine, -2], 4 * rows[mine, -2])
  assert (h.rows == rows).all()                      # the original is untouched
  with pytest.raises(Exception, match="injection"):
    diag.inject(h, sel, "nope")


@pytest.fixture(scope="module")
def old_workdir(tmp_path_factory):
  """A one-iteration layout-1 run whose config record lacks model.row_layout (an older record)."""
  c = test_config.get_config()
  c.model.row_layout = 1
  c.train.episodes = 16
  wd = tmp_path_factory.mktemp("old")
  training.train(c, wd, verbose=False)
  rec = json.loads((wd / "config.json").read_text())
  rec.pop("model.row_layout")
  (wd / "config.json").write_text(json.dumps(rec))
  return wd


def test_an_old_workdir_evaluates_with_its_layout_and_the_diagnostic_runs(old_workdir):
  c = test_config.get_config()
  c.model.row_layout = 2                # a config asking for layout 2 still loads the old run as 1
  assert training.row_layout(c) == 2
  assert training.recorded_row_layout(c, old_workdir) == 1
  sysm = system_lib.build(c)
  model, params, history = training.load_router(c, old_workdir, sysm)
  assert model.row_layout == 1 and len(history) > 0
  env = sysm.env(float(c.alpha), reward=c.train.reward)
  q = sysm.test_queries[:4]
  states = evaluation.run_router(sysm, env, model, params, history, q, parallel=4, seed=0)
  assert len(states) == 4 and all(s.done for s in states)
  d = diag.diagnose(sysm, env, model, params, history, "qwen2.5-7b-instruct", q, parallel=4,
                    seed=0)
  inj = d["injections"]
  assert set(inj) == set(diag.INJECTIONS)
  assert inj["none"]["input_change_mean"] == 0 and inj["none"]["logit_change"] == 0
  assert inj["utility0"]["input_change_mean"] > 0 and inj["failed"]["input_change_mean"] > 0
  assert 0 <= inj["failed"]["share"] <= 1
  assert d["sensitivity"]["mean"]["llm"] > 0 and "stats" not in d["sensitivity"]
  assert diag.report_lines(d)[0].startswith("memory diagnostic")


def test_training_under_a_perturbed_pool_puts_failures_in_the_history(tmp_path):
  """train.pool_perturb: the training pool changes per phase (failures included), so training
  rows carry the failed flag; the system's pool is the configured one again afterwards."""
  c = test_config.get_config()
  c.train.episodes = 32
  c.train.pool_perturb.enabled = True
  c.train.pool_perturb.every = 1
  c.train.pool_perturb.fail_prob = 0.5
  sysm = system_lib.build(c)
  before = sysm.world.events
  training.train(c, tmp_path, system=sysm, verbose=False)
  assert sysm.world.events is before
  _, _, history = training.load_router(c, tmp_path, sysm, best=False)
  assert history.rows[:, -1].max() == 1.0 and history.rows[:, -1].min() == 0.0


@pytest.mark.parametrize("term", ["memory_bias", "memory_predictor"])
def test_a_memory_term_router_trains_and_the_diagnostic_reports_its_term_through_the_cli(
    tmp_path, term):
  """What a user runs: experiments.train with model.memory_bias or model.memory_predictor (row
  layout 2, training under changing pools), then experiments.memory_diagnostic on the workdir,
  both as subprocesses."""
  flags = ["--config=experiments/configs/test.py", f"--workdir={tmp_path}",
           "--config.model.row_layout=2", f"--config.model.{term}=True",
           "--config.train.pool_perturb.enabled=True", "--config.train.episodes=32"]
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  train = subprocess.run([sys.executable, "-m", "experiments.train", *flags, "--evaluate=False"],
                         cwd=REPO, capture_output=True, text=True, env=env, timeout=600)
  assert train.returncode == 0, train.stderr[-2000:]
  out = tmp_path / "diag.json"
  run = subprocess.run([sys.executable, "-m", "experiments.memory_diagnostic", *flags,
                        f"--out={out}"], cwd=REPO, capture_output=True, text=True, env=env,
                       timeout=600)
  assert run.returncode == 0, run.stderr[-2000:]
  d = json.loads(out.read_text())
  inj = d["injections"]
  assert d["row_layout"] == 2 and all("bias_change" in r for r in inj.values())
  assert inj["none"]["bias_change"] == 0
  assert inj["failing"]["bias_change"] != 0     # trained: the term reads the failure rows
  if term == "memory_predictor":   # the predictor's regression ran in every update
    metrics = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all("predictor_loss" in m for m in metrics if "iteration" in m)
  assert "| bias change |" in run.stdout
