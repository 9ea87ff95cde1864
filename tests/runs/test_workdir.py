"""A workdir records its config; reruns with another config are refused before anything is written."""
import json
import pathlib
import subprocess
import sys

import ml_collections
import pytest

from experiments.configs import sweep as sweep_config
from experiments.configs import test as test_config
from gp_jax import errors
from gp_jax.runs import sweep
from gp_jax.runs import train as training
from gp_jax.runs import workdir as workdir_config

REPO = pathlib.Path(__file__).resolve().parents[2]


def small():
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.compile_cache = "/a"
  c.model = ml_collections.ConfigDict(dict(hidden=32, layers=(1, 2)))
  c.sweep = ml_collections.ConfigDict(dict(seeds="0", alphas="0"))
  return c


def test_flatten_uses_dotted_keys_and_json_values():
  assert workdir_config.flatten(small()) == {
      "seed": 0, "compile_cache": "/a", "model.hidden": 32, "model.layers": [1, 2],
      "sweep.seeds": "0", "sweep.alphas": "0"}


def test_first_run_records_and_same_config_passes(tmp_path):
  wd = tmp_path / "w"
  workdir_config.check_or_record(wd, small())
  recorded = json.loads((wd / "config.json").read_text())
  assert recorded["model.hidden"] == 32
  workdir_config.check_or_record(wd, small())          # same config: accepted
  c = small()
  c.compile_cache = "/elsewhere"                       # a runtime field: never compared
  c.sweep.seeds = "0,1"                                # a field this runner may vary
  workdir_config.check_or_record(wd, c, ignore=("sweep.seeds",))


def test_changed_field_is_refused_and_nothing_is_rewritten(tmp_path):
  wd = tmp_path / "w"
  workdir_config.check_or_record(wd, small())
  before = (wd / "config.json").read_bytes()
  c = small()
  c.model.hidden = 64
  with pytest.raises(errors.ConfigError, match=r"model.hidden: recorded 32, now 64"):
    workdir_config.check_or_record(wd, c)
  c = small()
  c.model.extra = 1                                     # a field the record lacks
  with pytest.raises(errors.ConfigError, match=r"model.extra: recorded '<absent>', now 1"):
    workdir_config.check_or_record(wd, c)
  c = small()
  c.sweep.alphas = "0,1"                                # ignored only where the runner says so
  with pytest.raises(errors.ConfigError, match="sweep.alphas"):
    workdir_config.check_or_record(wd, c, ignore=("sweep.seeds",))
  assert (wd / "config.json").read_bytes() == before


def test_malformed_record_is_a_clear_error(tmp_path):
  (tmp_path / "config.json").write_text("{nope")
  with pytest.raises(errors.ConfigError, match="config.json: line 1: not valid JSON"):
    workdir_config.check_or_record(tmp_path, small())
  (tmp_path / "config.json").write_text("[1, 2]")
  with pytest.raises(errors.ConfigError, match="not a config record"):
    workdir_config.check_or_record(tmp_path, small())


def test_resumed_training_with_another_width_is_refused(tmp_path):
  c = test_config.get_config()
  c.train.episodes = 16
  c.compile_cache = ""
  training.train(c, tmp_path, verbose=False)
  metrics = (tmp_path / "metrics.jsonl").read_text()
  c.eval.baselines = False                              # evaluation switches may change
  training.train(c, tmp_path, verbose=False)
  c.model.hidden = 16
  with pytest.raises(errors.ConfigError, match=r"training run made with another config "
                                               r"\(model.hidden: recorded 32, now 16\)"):
    training.train(c, tmp_path, verbose=False)
  assert (tmp_path / "metrics.jsonl").read_text() == metrics


def test_sweep_runner_refuses_another_config_with_exit_2(tmp_path):
  c = sweep_config.get_config("test")   # as the runner's --config builds it
  workdir_config.check_or_record(tmp_path, c, ignore=("sweep.alphas", "sweep.seeds"))
  args = [sys.executable, "-m", "experiments.sweep", "--config=experiments/configs/sweep.py:test",
          f"--workdir={tmp_path}", "--config.data.n_test=12"]
  p = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=300)
  assert p.returncode == 2, p.stderr[-2000:]
  last = p.stderr.strip().splitlines()[-1]
  assert last.startswith("error: ") and "(data.n_test: recorded 24, now 12)" in last
  assert sorted(x.name for x in tmp_path.iterdir()) == ["config.json"]   # nothing else written
  with pytest.raises(errors.ConfigError, match="sweep.routers"):
    c2 = c.copy_and_resolve_references()
    c2.sweep.routers = "knn,mlp"
    sweep.sweep_from_config(c2, tmp_path, verbose=False)


def test_a_record_older_than_the_pool_events_matches_while_they_are_off(tmp_path):
  """Workdirs recorded before config.data.sim_events, eval.online_history, train.padding and
  parallel existed still resume with them off (parallel is never compared); turning one of the
  others on is a changed config."""
  c = test_config.get_config()
  old = workdir_config.flatten(c)
  old = {k: v for k, v in old.items()
         if not k.startswith(("data.sim_events.", "parallel.")) and
         k not in ("eval.online_history", "train.padding")}
  wd = tmp_path / "w"
  wd.mkdir()
  (wd / "config.json").write_text(json.dumps(old))
  workdir_config.check_or_record(wd, c)
  c.data.sim_events.fail.llm = "qwen2.5-7b-instruct"
  with pytest.raises(errors.ConfigError, match=r"data.sim_events.fail.llm: recorded '<absent>'"):
    workdir_config.check_or_record(wd, c)
  c = test_config.get_config()
  c.eval.online_history = True
  with pytest.raises(errors.ConfigError, match=r"eval.online_history: recorded '<absent>'"):
    workdir_config.check_or_record(wd, c)
  c = test_config.get_config()
  c.train.padding = "buckets"
  with pytest.raises(errors.ConfigError, match=r"train.padding: recorded '<absent>'"):
    workdir_config.check_or_record(wd, c)
  new = tmp_path / "n"                      # recorded with the section: compared as usual
  workdir_config.check_or_record(new, test_config.get_config())
  c = test_config.get_config()
  c.data.sim_events.fail.t = 3
  with pytest.raises(errors.ConfigError, match=r"data.sim_events.fail.t: recorded 0, now 3"):
    workdir_config.check_or_record(new, c)


def test_a_study_record_older_than_the_drift_settings_still_resumes(tmp_path):
  from experiments.configs import study as study_config
  from gp_jax.runs.studies import definitions
  from gp_jax.runs.studies import runner
  c = study_config.get_config("test")
  wd = tmp_path / "phases"
  wd.mkdir()
  old = {k: v for k, v in workdir_config.flatten(c).items()
         if not k.startswith(("study.drift_", "data.sim_events.")) and k != "eval.online_history"}
  (wd / "config.json").write_text(json.dumps(old))
  study = runner.StudyRunner(c, wd, "phases", definitions.variants("phases", c), verbose=False)
  assert study.run([])["ran"] == []
  c.study.knn_k = 3                          # other study fields are still compared
  with pytest.raises(errors.ConfigError, match="study.knn_k"):
    runner.StudyRunner(c, wd, "phases", definitions.variants("phases", c), verbose=False).run([])


def test_a_record_older_than_forced_planner_episodes_resumes_while_it_is_off(tmp_path):
  c = test_config.get_config()
  old = {k: v for k, v in workdir_config.flatten(c).items() if k != "train.force_planner_episodes"}
  (tmp_path / "config.json").write_text(json.dumps(old))
  workdir_config.check_or_record(tmp_path, c)
  c.train.force_planner_episodes = 50
  with pytest.raises(errors.ConfigError,
                     match=r"train.force_planner_episodes: recorded '<absent>', now 50"):
    workdir_config.check_or_record(tmp_path, c)
