"""The learner look's verdict: per-arm numbers, targets T1-T6 and the combined arm's rule."""
import json
import subprocess
import sys

import pytest

from gp_jax import errors
from gp_jax.runs.studies import definitions
from gp_jax.runs.studies import learner_look
from gp_jax.runs.studies import runner


def _cell(arm, seed, *, reward, mlp, opt=0.5, calls=1.0, split_rate=0.0, recall=0.0,
          precision=None, seconds=100.0, final_return=0.4, study="learner"):
  def row(policy, r, c, sr, rec=None, prec=None):
    return dict(policy=policy, domain="all", reward=r, calls=c, split_rate=sr,
                split_recall=rec, split_precision=prec)
  return dict(study=study, variant=arm, seed=seed,
              train=dict(episodes=10, seconds=seconds, final_return=final_return),
              rows=[row(f"{runner.ROUTER}[{arm}]", reward, calls, split_rate, recall, precision),
                    row("optimum (DP)", opt, 2.3, 0.26), row("router:mlp", mlp, 1.0, 0.0),
                    dict(row("router:mlp", 0.0, 1.0, 0.0), domain="math")])


def _write(work, cells):
  for c in cells:
    d = work / f"{c['variant']}_seed{c['seed']}"
    d.mkdir(parents=True)
    runner.write_cell(d / runner.CELL_FILE, c)


def test_targets_and_paired_interval(tmp_path):
  seeds = range(5)
  _write(tmp_path, [_cell("study", s, reward=0.44, mlp=0.45 + 0.001 * s) for s in seeds])
  _write(tmp_path, [_cell("gamma1", s, reward=0.48 + 0.002 * s, mlp=0.45 + 0.001 * s,
                          calls=2.0, split_rate=0.3, recall=0.6, precision=0.5, seconds=120.0)
                    for s in seeds])
  v = learner_look.verdict(tmp_path)
  g, st = v["arms"]["gamma1"], v["arms"]["study"]
  assert g["seeds"] == [0, 1, 2, 3, 4]
  assert g["minus_mlp"]["mean"] == pytest.approx(0.03 + 0.001 * 2)   # paired by seed
  assert g["share"]["mean"] == pytest.approx(g["reward"]["mean"] / 0.5)
  t = v["targets"]["gamma1"]
  assert t["T1"]["passed"] and t["T2"]["passed"] and t["T3"]["passed"]
  assert t["T4"]["value"] == pytest.approx(0.484 / 0.5) and t["T4"]["passed"]
  assert t["T5"]["passed"] is None                  # no v1 workdir given
  assert t["T6"]["value"] == pytest.approx(1.2) and t["T6"]["passed"]
  s = v["targets"]["study"]
  assert not s["T1"]["passed"] and not s["T2"]["passed"] and s["T3"]["passed"] is False
  assert s["T4"]["value"] == pytest.approx(0.88) and s["T4"]["passed"] is False
  assert st["split_precision"] is None              # never split: precision undefined, not 0
  text = learner_look.format_report(v)
  assert "| gamma1 | 5 | 2.00" in text and "not decidable yet" in text


def test_t4_threshold_and_t5_from_v1(tmp_path):
  v2, v1 = tmp_path / "v2", tmp_path / "v1"
  _write(v2, [_cell("study", s, reward=0.45, mlp=0.40) for s in range(3)])
  _write(v1, [_cell("study", s, reward=0.47, mlp=0.40) for s in range(3)])
  v = learner_look.verdict(v2, v1)
  t = v["targets"]["study"]
  assert t["T4"]["value"] == pytest.approx(0.90) and t["T4"]["passed"]     # >= 0.90 passes
  assert t["T5"]["value"] == pytest.approx(0.94) and t["T5"]["passed"] is False


def test_combined_choice_reads_training_return_only(tmp_path):
  cells = [_cell("sweep_ppo", s, reward=0.9, mlp=0.1, final_return=0.40) for s in range(2)]
  better = {"gamma1", "forced"}
  for name in definitions.LEARNER_OPTIONS:
    # the test reward says the opposite of the training return: the rule must not read it
    r = 0.1 if name in better else 0.9
    cells += [_cell(name, s, reward=r, mlp=0.1, final_return=0.41 if name in better else 0.39)
              for s in range(2)]
  _write(tmp_path, cells[:-2])                       # phase1 missing: not decidable
  assert learner_look.verdict(tmp_path)["combined_choice"] is None
  _write(tmp_path, cells[-2:])
  choice = learner_look.verdict(tmp_path)["combined_choice"]
  assert choice == [n for n in definitions.LEARNER_OPTIONS if n in better]


def test_bad_workdirs(tmp_path):
  with pytest.raises(errors.DataError, match="no cells of the learner study"):
    learner_look.verdict(tmp_path)
  _write(tmp_path, [_cell("base", 0, reward=0.4, mlp=0.4, study="ablations")])
  with pytest.raises(errors.DataError, match="'ablations' study"):
    learner_look.verdict(tmp_path)
  p = subprocess.run([sys.executable, "-m", "experiments.learner_look",
                      f"--workdir={tmp_path / 'nope'}"], capture_output=True, text=True,
                     timeout=120)
  assert p.returncode == 2 and "Traceback" not in p.stderr


def test_cli_prints_the_tables_and_writes_json(tmp_path):
  _write(tmp_path / "w", [_cell("study", s, reward=0.44, mlp=0.45) for s in range(2)])
  out = tmp_path / "look.json"
  p = subprocess.run([sys.executable, "-m", "experiments.learner_look",
                      f"--workdir={tmp_path / 'w'}", f"--json={out}"], capture_output=True,
                     text=True, timeout=120)
  assert p.returncode == 0, p.stderr
  assert "| study | 2 | 1.00" in p.stdout and "T6 time" in p.stdout
  assert json.loads(out.read_text())["arms"]["study"]["seeds"] == [0, 1]
