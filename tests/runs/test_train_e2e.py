"""End to end on the CPU test config: train, evaluate, determinism, kill -9 resume, bad config."""
import json
import pathlib
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.configs import test as test_config
from gp_jax.graph import history as history_lib
from gp_jax.rl import batch as batch_lib
from gp_jax.rl import ppo
from gp_jax.rl import rollout
from gp_jax.rl import loop as loop_lib
from gp_jax.runs import pipeline
from gp_jax.runs import ppo_config
from gp_jax.runs import system as system_lib
from gp_jax.runs import train as training

REPO = pathlib.Path(__file__).resolve().parents[2]
TIMING = {"rollout_s", "update_s"}


def metrics(workdir):
  lines = (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines()
  return [{k: v for k, v in json.loads(l).items() if k not in TIMING} for l in lines]


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
  wd = tmp_path_factory.mktemp("ref")
  summary = pipeline.train_and_evaluate(test_config.get_config(), wd, verbose=False)
  return wd, summary


def test_train_and_evaluate_writes_everything(reference_run):
  wd, summary = reference_run
  cfg = test_config.get_config()
  assert summary["episodes"] == cfg.train.episodes
  m = metrics(wd)
  assert [r["iteration"] for r in m] == list(range(3))
  assert all(np.isfinite(r["loss"]) and r["transitions"] > 0 for r in m)
  assert all(r["update_compiles"] == 1 for r in m)   # fixed padding: no recompile after the first
  assert (wd / "checkpoints" / "latest").is_dir() and (wd / "checkpoints" / "best").is_dir()
  report = json.loads((wd / "eval.json").read_text())
  policies = {r["policy"] for r in report["rows"]}
  assert {"GraphPlanner", "random", "optimum (DP)"} <= policies
  assert sum(p.startswith("single:") for p in policies) == 3
  opt = [r for r in report["rows"] if r["policy"] == "optimum (DP)" and r["domain"] == "all"][0]
  for r in report["rows"]:
    if r["domain"] == "all":     # nothing beats the exact optimum in expectation
      assert r["reward"] <= opt["reward"] + 1e-9
  assert "| GraphPlanner |" in (wd / "eval.md").read_text()


def test_same_seed_same_metrics(reference_run, tmp_path):
  wd, _ = reference_run
  pipeline.train_and_evaluate(test_config.get_config(), tmp_path, evaluate=False, verbose=False)
  assert metrics(tmp_path) == metrics(wd)


def _train_cmd(workdir):
  return [sys.executable, "-m", "experiments.train", "--config=experiments/configs/test.py",
          f"--workdir={workdir}", "--evaluate=false"]


def test_kill_9_then_rerun_resumes_and_finishes(reference_run, tmp_path):
  wd, _ = reference_run
  proc = subprocess.Popen(_train_cmd(tmp_path), cwd=REPO, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE)
  latest = tmp_path / "checkpoints" / "latest"
  deadline = time.time() + 240
  while time.time() < deadline and proc.poll() is None:
    if latest.is_dir() and any(p.name.isdigit() for p in latest.iterdir()):
      break
    time.sleep(0.05)
  assert proc.poll() is None, "training finished before it could be killed"
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  done_before = len(metrics(tmp_path))
  assert done_before < 3
  out = subprocess.run(_train_cmd(tmp_path), cwd=REPO, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  assert "resumed from iteration" in out.stderr
  assert metrics(tmp_path) == metrics(wd)   # same result as the uninterrupted run


@pytest.mark.parametrize("flag,message", [
    ("--config.llms=gpt-9", "unknown LLM 'gpt-9'"),
    ("--config.roles=planner,critic", "unknown role 'critic'"),
    ("--config.ppo.clip_eps=2.0", "clip_eps"),
    ("--config.data.tasks=chess", "unknown simulated task 'chess'"),
    ("--config.model.history=sometimes", "config.model.history"),
    ("--config.ppo.lr_schedule=cosine", "unknown ppo.lr_schedule 'cosine'"),
    ("--config.ppo.lr_final_fraction=1.5", "lr_final_fraction"),
    ("--config.ppo.entropy_schedule=step", "unknown ppo.entropy_schedule 'step'"),
    ("--config.ppo.entropy_final_fraction=-1", "entropy_final_fraction"),
    # A mistyped field is caught while the config flag is defined (ml_collections applies
    # overrides at import), not by the runner.
    ("--config.model.hiden=3", 'no such config field in the --config.* flags: \'hiden\' Did you '
                               'mean "hidden"'),
    ("--config.nosection.x=1", "no such config field"),
])
def test_bad_config_exits_2_with_one_message(tmp_path, flag, message):
  out = subprocess.run(_train_cmd(tmp_path) + [flag], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
  assert out.returncode == 2
  lines = [l for l in out.stderr.splitlines() if l.strip()]
  assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], out.stderr


def test_mistyped_field_on_the_default_config_exits_2(tmp_path):
  """Without --config, overrides apply to the default config while the flag is defined."""
  for runner, extra in (("experiments.train", []), ("experiments.sweep", []),
                        ("experiments.study", ["--study=phases"])):
    out = subprocess.run([sys.executable, "-m", runner, f"--workdir={tmp_path / 'w'}",
                          "--config.trian.episodes=3"] + extra, cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    lines = [l for l in out.stderr.splitlines() if l.strip()]
    assert out.returncode == 2 and len(lines) == 1, (runner, out.stderr[-2000:])
    assert lines[0].startswith("error: no such config field") and "trian" in lines[0]
  assert not (tmp_path / "w").exists()


def test_no_retrace_as_history_grows_within_a_bucket():
  cfg = test_config.get_config()
  sysm = system_lib.build(cfg)
  model = training.make_model(cfg)
  settings = ppo.PPOSettings(learning_rate=1e-3, epochs=1, num_minibatches=2, clip_eps=0.2,
                             gamma=0.99, gae_lambda=0.95, value_coef=0.5, entropy_coef=0.01,
                             max_grad_norm=0.5, value_lr_multiplier=2.0)
  opt = ppo.make_optimizer(settings)
  state = loop_lib.init_state(model, sysm.featurizer, opt, 0)
  runner = rollout.PolicyRunner(model, sysm.featurizer.hub_features, 8, max_traces=1)
  history = history_lib.HistoryMemory(sysm.featurizer.spec.row_dim, sysm.space.size, capacity=400)
  runner.set_params(state.params, history)
  env = sysm.env(0.3)
  bsz = batch_lib.batch_size_for(8, sysm.mdp_cfg.max_calls(), 2)
  update = ppo.make_update_fn(model, opt, settings, num_chunks=bsz + 1, max_traces=1)
  import asyncio
  sizes = []
  for it in range(3):   # history grows 0 -> ~100 rows, all inside the first bucket
    eps = asyncio.run(rollout.run_episodes(
        env, sysm.featurizer, runner, sysm.train_queries[it * 8:(it + 1) * 8],
        key=jax.random.PRNGKey(it), greedy=False, history=history, grow_history=True, seed_salt=it))
    batch, hist = batch_lib.build_batch(eps, history, batch_size=bsz, num_episodes=8,
                                        max_calls=ppo_config.max_calls(sysm),
                                        num_hubs=sysm.space.size)
    state, _ = update(state, jnp.asarray(sysm.featurizer.hub_features), hist, batch)
    runner.set_params(state.params, history)
    sizes.append(len(history))
  assert sizes[0] < sizes[-1] <= history_lib.MIN_BUCKET


def test_linear_schedules_resume_exactly(tmp_path, monkeypatch):
  """With ppo.lr_schedule=linear the schedule's step count is part of the checkpointed optimizer
  state, and with ppo.entropy_schedule=linear the coefficient follows the checkpointed update
  count: a run interrupted after two iterations and resumed gives the uninterrupted run's metrics."""
  cfg = test_config.get_config()
  cfg.ppo.lr_schedule = "linear"
  cfg.ppo.lr_final_fraction = 0.1
  cfg.ppo.entropy_coef = 0.02
  cfg.ppo.entropy_schedule = "linear"
  cfg.ppo.entropy_final_fraction = 0.5
  training.train(cfg, tmp_path / "whole", verbose=False)
  n_updates = -(-cfg.train.episodes // cfg.train.episodes_per_iter)
  np.testing.assert_allclose([m["entropy_coef"] for m in metrics(tmp_path / "whole")],
                             [0.02 * (1 - 0.5 * k / n_updates) for k in range(n_updates)],
                             rtol=1e-6)
  real = rollout.run_episodes
  calls = []

  def interrupted(*args, **kwargs):
    calls.append(1)
    if len(calls) == 3:
      raise KeyboardInterrupt("simulated interruption")
    return real(*args, **kwargs)
  monkeypatch.setattr(rollout, "run_episodes", interrupted)
  with pytest.raises(KeyboardInterrupt):
    training.train(cfg, tmp_path / "resumed", verbose=False)
  monkeypatch.setattr(rollout, "run_episodes", real)
  assert len(metrics(tmp_path / "resumed")) == 2
  training.train(cfg, tmp_path / "resumed", verbose=False)
  assert metrics(tmp_path / "resumed") == metrics(tmp_path / "whole")
  const = metrics(tmp_path / "whole")
  cfg.ppo.lr_schedule = "constant"
  cfg.ppo.entropy_schedule = "constant"
  training.train(cfg, tmp_path / "constant", verbose=False)
  assert [m["entropy_coef"] for m in metrics(tmp_path / "constant")] == pytest.approx(
      [0.02] * n_updates)
  # Same first rollout (same initial parameters); the decaying rate changes the updates.
  assert metrics(tmp_path / "constant")[0]["episode_return"] == const[0]["episode_return"]
  assert metrics(tmp_path / "constant")[0]["loss"] != const[0]["loss"]
