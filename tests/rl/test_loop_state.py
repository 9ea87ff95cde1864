"""The host loop's state (rl.loop.LoopState) and the checkpoints written before it existed.

tests/rl/data/main_checkpoint is a workdir written by the code before LoopState and
checkpoint.Write (commit 32a4c62): the tiny config below (`_config`), bucket padding, trained for
one of two iterations (its "latest" step 0, metrics line 0). main_checkpoint_iteration1.json is
that code's metrics line of iteration 1, from the same uninterrupted run."""
import json
import math
import pathlib
import shutil

import pytest

from experiments.configs import test as test_config
from gp_jax.rl import loop as rl_loop
from gp_jax.runs import train as training

DATA = pathlib.Path(__file__).parent / "data"
PER_PROCESS = {"rollout_s", "update_s", "update_compiles"}   # timing, this process's compiles


def _config():
  cfg = test_config.get_config()
  cfg.data.n_train = 16
  cfg.data.n_test = 8
  cfg.text.dim = 16
  cfg.model.hidden = 8
  cfg.model.mlp_hidden = 8
  cfg.model.num_layers = 1
  cfg.model.mem_proj = 4
  cfg.model.attention_heads = 2
  cfg.model.history_capacity = 64
  cfg.train.episodes = 16
  cfg.train.episodes_per_iter = 8
  cfg.train.parallel = 8
  cfg.train.padding = "buckets"
  cfg.compile_cache = ""
  return cfg


def test_a_fresh_state_is_before_the_first_iteration():
  s = rl_loop.LoopState()
  assert (s.iteration, s.episodes, s.running_reward, s.best_iteration) == (-1, 0, None, -1)
  assert s.best_running == -math.inf and not s.stopped_early and s.padded_size == 0


def test_advanced_keeps_the_running_reward_best_and_stop():
  s = rl_loop.LoopState().advanced(0, episodes=8, episode_return=0.5, entropy=1.0,
                                   entropy_stop=0.1, padded_size=32)
  assert (s.iteration, s.episodes, s.running_reward, s.best_iteration) == (0, 8, 0.5, 0)
  s = s.advanced(1, episodes=16, episode_return=0.0, entropy=1.0, entropy_stop=0.1,
                 padded_size=48)
  assert s.running_reward == pytest.approx(0.45) and s.best_running == 0.5
  assert s.best_iteration == 0 and s.padded_size == 48 and not s.stopped_early
  s = s.advanced(2, episodes=24, episode_return=1.0, entropy=0.05, entropy_stop=0.1,
                 padded_size=48)
  assert s.running_reward == pytest.approx(0.505) and s.best_iteration == 2
  assert s.stopped_early
  stays = s.advanced(3, episodes=32, episode_return=1.0, entropy=1.0, entropy_stop=0.1,
                     padded_size=48)
  assert stays.stopped_early   # once stopped, a run stays stopped


def test_the_entropy_stop_waits_for_its_minimum_episodes():
  s = rl_loop.LoopState()
  for it, episodes in enumerate((8, 16, 24)):
    s = s.advanced(it, episodes=episodes, episode_return=0.0, entropy=0.01, entropy_stop=0.1,
                   padded_size=0, entropy_stop_min_episodes=24)
    assert s.stopped_early == (episodes >= 24), episodes
  # 0, the default: the first update below the threshold stops the run, as before.
  assert rl_loop.LoopState().advanced(0, episodes=8, episode_return=0.0, entropy=0.01,
                                      entropy_stop=0.1, padded_size=0).stopped_early


def test_the_record_round_trips_and_old_records_load():
  s = rl_loop.LoopState(iteration=3, episodes=32, running_reward=0.25, best_running=0.3,
                        best_iteration=2, stopped_early=False, padded_size=48)
  assert rl_loop.LoopState.from_record(json.loads(json.dumps(s.record()))) == s
  # A fixed-padding checkpoint of the older code: no padded_size; history_rows is no field.
  old = dict(iteration=3, episodes=32, running_reward=0.25, best_running=0.3, best_iteration=2,
             stopped_early=False, history_rows=90)
  assert rl_loop.LoopState.from_record(old) == rl_loop.LoopState(
      iteration=3, episodes=32, running_reward=0.25, best_running=0.3, best_iteration=2)


def test_a_checkpoint_of_the_older_code_resumes_as_its_run_went_on(tmp_path):
  """Resumed from the older code's step 0, iteration 1 gives that code's metrics line (the
  restored parameters, optimizer state, PRNG key, history rows and padded size all feed it), and
  the step written now has the same metadata keys."""
  wd = tmp_path / "run"
  shutil.copytree(DATA / "main_checkpoint", wd)
  summary = training.train(_config(), wd, verbose=False)
  assert (summary["iteration"], summary["episodes"]) == (1, 16)
  lines = [json.loads(l) for l in (wd / "metrics.jsonl").read_text().splitlines()]
  assert [l["iteration"] for l in lines] == [0, 1]
  got = {k: v for k, v in lines[1].items() if k not in PER_PROCESS}
  want = {k: v for k, v in json.loads((DATA / "main_checkpoint_iteration1.json").read_text()
                                      ).items() if k not in PER_PROCESS}
  # Keys added since (decision statistics...) come on top; none of that code's keys is missing.
  assert want.keys() <= got.keys()
  # abs 1e-6: a metric near zero that is a mean of O(1) float32 terms of both signs (policy_loss,
  # its advantages normalised) keeps only its absolute error across CPUs' XLA code (1.6e-7 on an
  # AVX-512 EPYC against the file's machine); a wrong restore moves every metric by far more.
  for k, v in want.items():
    assert got[k] == (v if isinstance(v, int) else pytest.approx(v, rel=1e-5, abs=1e-6)), k
  meta = lambda d: json.loads((d / "checkpoints" / "latest" / "0" / "meta" / "metadata"
                               ).read_text())
  new = json.loads((wd / "checkpoints" / "latest" / "1" / "meta" / "metadata").read_text())
  assert list(new) == list(meta(DATA / "main_checkpoint"))


def test_the_config_field_reaches_the_loop_and_is_checked():
  from gp_jax import errors
  cfg = test_config.get_config()
  cfg.ppo.entropy_stop_min_episodes = 32
  assert training.loop_settings(cfg, 10).entropy_stop_min_episodes == 32
  cfg.ppo.entropy_stop_min_episodes = -1
  with pytest.raises(errors.ConfigError, match="entropy_stop_min_episodes"):
    training.validate(cfg)
