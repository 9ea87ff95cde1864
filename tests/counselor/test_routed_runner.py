"""experiments/counselor_routed.py and its config: the settings the config gives, a run end to end
with resume, and one-line errors with exit status 2 on bad input."""
import json
import pathlib
import subprocess
import sys

import pytest

from experiments.configs import counselor_routed as routed_config
from gp_jax import errors
from gp_jax.runs import counselor_routed as rx

ROOT = pathlib.Path(__file__).resolve().parents[2]
SMALL, BIG = "qwen2.5-7b-instruct", "llama-3.3-nemotron-super-49b-v1"
CONFIG = ROOT / "experiments" / "configs" / "counselor_routed.py"


def test_the_configs_give_the_documented_settings():
  # The default config is the documented run (docs/counselor_routing.md): ExperimentConfig's
  # defaults, with every float a float (seed files compare settings as JSON).
  default = rx.experiment_config(routed_config.get_config())
  assert default == rx.ExperimentConfig()
  assert json.dumps(default.to_json()) == json.dumps(rx.ExperimentConfig().to_json())
  assert rx.parse_seeds(routed_config.get_config().seeds) == [0, 1, 2]
  test = routed_config.get_config("test")
  assert rx.experiment_config(test) == rx.ExperimentConfig(
      size="tiny", per_template=4, n_train=24, n_test=16, episodes=192, batch_questions=16,
      llms=(SMALL, "llama-3.1-8b-instruct", BIG))
  assert rx.parse_seeds(test.seeds) == [0]
  with pytest.raises(ValueError, match="unknown counselor_routed config variant 'big'"):
    routed_config.get_config("big")


def _small_config():
  c = routed_config.get_config("test")
  c.data.per_template, c.data.n_train, c.data.n_test = 2, 8, 4
  c.llms = f"{SMALL},{BIG}"
  c.train.episodes, c.train.batch_questions = 16, 8
  c.counselor.max_steps, c.counselor.max_reflect = 4, 1
  return c


def test_runner_end_to_end_and_resume(tmp_path):
  config = _small_config()
  logs = []
  summary = rx.run_from_config(config, str(tmp_path), log=logs.append)
  assert (tmp_path / "seeds" / "seed_0.json").exists()
  saved = json.loads((tmp_path / "results.json").read_text())
  assert saved["seeds"] == [0] and set(saved["methods"]) == {"routed", rx.TABLE, SMALL, BIG}
  seed = json.loads((tmp_path / "seeds" / "seed_0.json").read_text())
  assert set(seed["table"]) == set(rx.KINDS) and set(seed["table"].values()) <= {SMALL, BIG}
  # the differences are paired per seed: routed minus the reference, seed by seed
  d = saved["differences"]["table"]["reward"]
  assert d["mean"] == pytest.approx(seed["methods"]["routed"]["reward"]
                                    - seed["methods"][rx.TABLE]["reward"])
  assert d["ci95"] is None and d["n"] == 1   # one seed: no interval
  assert saved["config"] == rx.experiment_config(config).to_json()
  for row in saved["methods"].values():
    assert 0 <= row["em"]["mean"] <= 1 and row["cost_usd_per_q"]["mean"] > 0
  table = (tmp_path / "results.md").read_text()
  assert "| **routed** |" in table and f"| {BIG} |" in table and f"| {rx.TABLE} |" in table
  assert summary["methods"]["routed"]["em"]["std"] == 0.0
  logs.clear()
  config.concurrency = 3    # not part of the results: the finished seed is still reused
  rx.run_from_config(config, str(tmp_path), log=logs.append)
  assert any("done already" in line for line in logs)
  config.alpha = 0.5
  with pytest.raises(errors.ConfigError, match="other settings"):
    rx.run_from_config(config, str(tmp_path), log=logs.append)


def test_bad_input_exits_2_with_one_line(tmp_path):
  (tmp_path / "a_file").write_text("")
  cases = [
      (["--config.llms=qwen2.5-7b-instruct,gpt-9"], "unknown LLM 'gpt-9'"),
      (["--config.alpha=-0.1"], "config.alpha must be a finite number >= 0"),
      (["--config.alpha=abc"], "--config.alpha=abc"),
      (["--config.seeds=a,b"], "config.seeds must be comma-separated integers"),
      (["--config.data.domain=legal"], "unknown domain 'legal'"),
      (["--config.sim.skill_domain=poetry"], "unknown simulator domain 'poetry'"),
      (["--config.data.n_train=0"], "config.data.n_train and config.data.n_test must be >= 1"),
      (["--config.data.graph=g.json"], "config.data.graph and config.data.questions go together"),
      (["--config.episodes=3"], "no such config field"),
      ([f"--config={CONFIG}:big"], "unknown counselor_routed config variant 'big'"),
  ]
  procs = [(args, words, subprocess.Popen(
      [sys.executable, "-m", "experiments.counselor_routed", f"--workdir={tmp_path / 'w'}", *args],
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT))
           for args, words in cases]
  procs.append(([], "a_file is not a directory", subprocess.Popen(
      [sys.executable, "-m", "experiments.counselor_routed",
       f"--workdir={tmp_path / 'a_file' / 'w'}"],
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)))
  for args, words, proc in procs:
    out, err = proc.communicate(timeout=180)
    lines = [l for l in err.splitlines() if l.strip()]
    assert proc.returncode == 2, (args, err[-2000:])
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], (args, err)
  assert not (tmp_path / "w").exists()
