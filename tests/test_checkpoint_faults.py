"""Crashes, damaged files and a full disk around checkpoints: resume always completes or says why.

In-process runs of the CPU test config with the default checkpoint spacing (train.checkpoint_every
= 5: "latest" at steps 4 and 7, each preceded by the best found since the previous one), 8
iterations of 16 episodes.
"""
import errno
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import jax.numpy as jnp
import numpy as np
import pytest

from experiments.configs import default as default_config
from experiments.configs import test as test_config
from gp_jax import errors
from gp_jax import files
from gp_jax.graph import history as history_lib
from gp_jax.rl import checkpoint as checkpoint_lib
from gp_jax.rl import rollout
from gp_jax.rl import loop as loop_lib
from gp_jax.runs import pipeline
from gp_jax.runs import system as system_lib
from gp_jax.runs import train as training
from gp_jax.runs import workdir as workdir_config

REPO = pathlib.Path(__file__).resolve().parents[1]
TIMING = {"rollout_s", "update_s"}
ITERATIONS = 8


def config():
  c = test_config.get_config()
  c.train.checkpoint_every = default_config.get_config().train.checkpoint_every
  c.train.episodes = ITERATIONS * c.train.episodes_per_iter
  c.compile_cache = ""   # tests/conftest.py sets the shared cache
  return c


def metrics(workdir):
  lines = (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines()
  return [{k: v for k, v in json.loads(l).items() if k not in TIMING} for l in lines]


def steps(workdir, kind):
  d = pathlib.Path(workdir) / "checkpoints" / kind
  return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit())


@pytest.fixture(scope="module")
def system():
  return system_lib.build(config())


@pytest.fixture(scope="module")
def whole(tmp_path_factory, system):
  """An uninterrupted run (and its evaluation)."""
  wd = tmp_path_factory.mktemp("whole")
  training.train(config(), wd, system=system, verbose=False)
  pipeline.evaluate_run(config(), wd, system=system, verbose=False)
  report = json.loads((wd / "eval.json").read_text())
  assert report["simulated"] is True and report["pool"] == {}   # the simulator keeps no counters
  assert "optimum (DP)" in {r["policy"] for r in report["rows"]}
  return wd


def interrupt_at(monkeypatch, iteration):
  """Makes the rollout of `iteration` raise KeyboardInterrupt (a kill between two iterations)."""
  real = rollout.run_episodes
  calls = []

  def run(*args, **kwargs):
    calls.append(1)
    if len(calls) == iteration + 1:
      raise KeyboardInterrupt("simulated kill")
    return real(*args, **kwargs)
  monkeypatch.setattr(rollout, "run_episodes", run)
  return lambda: monkeypatch.setattr(rollout, "run_episodes", real)


def interrupted_run(monkeypatch, wd, system, iteration):
  restore = interrupt_at(monkeypatch, iteration)
  with pytest.raises(KeyboardInterrupt):
    training.train(config(), wd, system=system, verbose=False)
  restore()


def interrupt_latest_save(monkeypatch, step):
  """Makes the "latest" save of `step` raise KeyboardInterrupt (a kill between the best write and
  the latest write of one checkpoint)."""
  real = checkpoint_lib.Checkpointer._write

  def write(self, w):
    if not w.best and w.step == step:
      raise KeyboardInterrupt("simulated kill")
    return real(self, w)
  monkeypatch.setattr(checkpoint_lib.Checkpointer, "_write", write)
  return lambda: monkeypatch.setattr(checkpoint_lib.Checkpointer, "_write", real)


@pytest.mark.parametrize("background", [False, True])
def test_resume_after_best_saved_past_latest(whole, system, tmp_path, monkeypatch, background):
  """Killed between the last best write and the latest write: latest is step 4, a best step past
  it exists. Resuming discards it and writes it again (orbax refuses to save an existing step).
  Background writes: the kill in the writer thread reaches the run when it waits for it."""
  restore = interrupt_latest_save(monkeypatch, ITERATIONS - 1)
  cfg = config()
  cfg.train.background_checkpoints = background
  with pytest.raises(KeyboardInterrupt):
    training.train(cfg, tmp_path, system=system, verbose=False)
  restore()
  assert steps(tmp_path, "latest") == [4]
  assert max(steps(tmp_path, "best")) > 4, "the scenario needs a best step past the latest"
  training.train(config(), tmp_path, system=system, verbose=False)
  assert metrics(tmp_path) == metrics(whole)
  assert steps(tmp_path, "latest") == steps(whole, "latest")
  assert steps(tmp_path, "best") == steps(whole, "best")
  pipeline.evaluate_run(config(), tmp_path, system=system, verbose=False)
  assert (tmp_path / "eval.json").read_text() == (whole / "eval.json").read_text()


def test_killed_between_checkpoints_resumes_the_same(whole, system, tmp_path, monkeypatch):
  """Killed at iteration 7 (latest is step 4; the bests found after it were only in memory)."""
  interrupted_run(monkeypatch, tmp_path, system, 7)
  assert steps(tmp_path, "latest") == [4]
  assert max(steps(tmp_path, "best")) <= 4
  training.train(config(), tmp_path, system=system, verbose=False)
  assert metrics(tmp_path) == metrics(whole)
  assert steps(tmp_path, "best") == steps(whole, "best")


def test_best_is_written_with_latest(system, tmp_path, monkeypatch):
  """At most one best write per latest write, each just before it, and the final best is the
  run's best iteration with that iteration's parameters."""
  writes = []
  real = checkpoint_lib.Checkpointer._write

  def write(self, w):
    writes.append((w.step, w.best, w.meta["best_iteration"]))
    return real(self, w)
  monkeypatch.setattr(checkpoint_lib.Checkpointer, "_write", write)
  training.train(config(), tmp_path, system=system, verbose=False)
  latest = [i for i, (_, best, _) in enumerate(writes) if not best]
  assert [writes[i][0] for i in latest] == [4, ITERATIONS - 1]
  for i, (step, best, best_it) in enumerate(writes):
    if best:   # a best write is followed by its latest write, whose best iteration it is
      assert i + 1 in latest and step == writes[i + 1][2] == best_it
  assert sum(best for _, best, _ in writes) <= len(latest)
  last_best = json.loads((tmp_path / "checkpoints" / "latest" / str(ITERATIONS - 1) / "meta" /
                          "metadata").read_text())["best_iteration"]
  assert max(steps(tmp_path, "best")) == last_best
  records = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  running = [r["running_reward"] for r in records]
  assert last_best == int(np.argmax(running))


def test_best_as_of_the_restored_step_is_kept(whole, system, tmp_path, monkeypatch):
  """The best of each retained latest step stays on disk (a resumed run may finish with it)."""
  best_of = {}
  for s in steps(whole, "latest"):
    meta = json.loads((whole / "checkpoints" / "latest" / str(s) / "meta" / "metadata").read_text())
    best_of[s] = meta["best_iteration"]
  assert set(best_of.values()) <= set(steps(whole, "best"))
  assert len(steps(whole, "best")) <= len(best_of) + 1


def truncate(path: pathlib.Path) -> None:
  data = path.read_bytes()
  path.write_bytes(data[:len(data) // 2])


@pytest.mark.parametrize("part", ["state", "history", "meta"])
def test_damaged_latest_falls_back_to_the_previous_step(whole, system, tmp_path, part, capsys):
  """A truncated file of the newest latest step: one warning line, the previous step resumed, and
  the run ends as the uninterrupted one. On the old code: a traceback from orbax."""
  run = tmp_path / "run"
  training.train(config(), run, system=system, verbose=False)
  newest = max(steps(run, "latest"))
  biggest = max((p for p in (run / "checkpoints" / "latest" / str(newest) / part).rglob("*")
                 if p.is_file() and p.name != "commit_success.txt"), key=lambda p: p.stat().st_size)
  truncate(biggest)
  capsys.readouterr()
  training.train(config(), run, system=system, verbose=False)
  err = capsys.readouterr().err
  warnings = [l for l in err.splitlines() if l.startswith("warning: damaged checkpoint")]
  assert len(warnings) == 1 and str(biggest) in warnings[0], err
  assert metrics(run) == metrics(whole)
  assert steps(run, "latest") == steps(whole, "latest")


def test_no_intact_step_is_one_error_line(whole, tmp_path):
  """Every latest step damaged: the CLI prints one error line naming a damaged file, exit 2."""
  import shutil
  shutil.copytree(whole, tmp_path / "w")
  for s in steps(tmp_path / "w", "latest"):
    truncate(tmp_path / "w" / "checkpoints" / "latest" / str(s) / "meta" / "metadata")
  out = subprocess.run(_train_cmd(tmp_path / "w"), cwd=REPO, capture_output=True, text=True,
                       timeout=300)
  lines = [l for l in out.stderr.splitlines() if l.strip() and not l.startswith("[train]")]  # progress note aside
  assert out.returncode == 2 and len(lines) == 1, out.stderr[-3000:]
  assert lines[0].startswith("error: no intact checkpoint") and "meta/metadata" in lines[0]


def test_damaged_step_without_integrity_record_is_one_error_line(whole, tmp_path):
  """A checkpoint without the integrity record (written before it existed) whose data file is
  truncated: orbax's own read error, as one line, without its "Event loop is closed" tracebacks."""
  import shutil
  shutil.copytree(whole, tmp_path / "w")
  for s in steps(tmp_path / "w", "latest"):
    step = tmp_path / "w" / "checkpoints" / "latest" / str(s)
    (step / checkpoint_lib.INTEGRITY_FILE).unlink()
    truncate(max((step / "state").rglob("*"), key=lambda p: p.stat().st_size if p.is_file() else 0))
  out = subprocess.run(_train_cmd(tmp_path / "w"), cwd=REPO, capture_output=True, text=True,
                       timeout=300)
  lines = [l for l in out.stderr.splitlines() if l.strip() and not l.startswith("[train]")]  # progress note aside
  assert out.returncode == 2 and len(lines) == 1, out.stderr[-3000:]
  assert lines[0].startswith("error: no intact checkpoint") and "cannot be restored" in lines[0]


def test_damaged_best_is_an_error_at_evaluation(whole, system, tmp_path):
  """The best checkpoint has no stand-in: evaluation refuses, naming the file."""
  import shutil
  shutil.copytree(whole, tmp_path / "w")
  best = max(steps(tmp_path / "w", "best"))
  path = tmp_path / "w" / "checkpoints" / "best" / str(best) / "meta" / "metadata"
  truncate(path)
  with pytest.raises(errors.DataError, match="best checkpoint is damaged: " + str(path)):
    training.load_router(config(), tmp_path / "w", system)


def test_partial_last_metrics_line_is_dropped(tmp_path):
  path = tmp_path / "metrics.jsonl"
  path.write_text('{"iteration": 0}\n{"iteration": 1}\n{"iterat')
  loop_lib.MetricsLog(path, 1)
  assert path.read_text() == '{"iteration": 0}\n{"iteration": 1}\n'
  path.write_text('{"iteration": 0}\n{"iterat\n{"iteration": 2}\n')
  with pytest.raises(errors.DataError, match="line 2: not valid JSON"):
    loop_lib.MetricsLog(path, 2)


@pytest.mark.parametrize("background", [False, True])
def test_disk_full_during_a_checkpoint_keeps_the_previous_one(whole, system, tmp_path,
                                                              monkeypatch, background):
  """An OSError (ENOSPC) while a checkpoint is written: StorageError, the half-written step is
  gone, the earlier steps are intact, and a rerun completes with the uninterrupted metrics.
  Background writes: the error is raised by the next write, which waits for this one."""
  real = checkpoint_lib.write_integrity
  calls = []

  def failing(step_dir):
    calls.append(step_dir)
    if step_dir.parent.name == "latest" and step_dir.name == "9":
      raise OSError(errno.ENOSPC, "No space left on device", str(step_dir / "x"))
    return real(step_dir)
  monkeypatch.setattr(checkpoint_lib, "write_integrity", failing)
  cfg = config()
  cfg.train.episodes = 12 * cfg.train.episodes_per_iter
  cfg.train.background_checkpoints = background
  with pytest.raises(errors.StorageError, match="No space left on device.*previous checkpoints "
                                                "are intact"):
    training.train(cfg, tmp_path, system=system, verbose=False)
  assert steps(tmp_path, "latest") == [4]
  assert not [p for p in (tmp_path / "checkpoints" / "latest").iterdir() if p.name != "4"]
  assert checkpoint_lib.check_integrity(tmp_path / "checkpoints" / "latest" / "4") is None
  monkeypatch.setattr(checkpoint_lib, "write_integrity", real)
  training.train(cfg, tmp_path, system=system, verbose=False)
  assert len(metrics(tmp_path)) == 12


def _can_mount_tmpfs(path) -> bool:
  if os.geteuid() != 0:
    return False
  path.mkdir(parents=True, exist_ok=True)
  ok = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(path)],
                      capture_output=True).returncode == 0
  if ok:
    subprocess.run(["umount", str(path)], check=True)
  return ok


def test_disk_full_on_a_small_file_system_is_one_error_line(tmp_path):
  """The real thing: the CLI on a 3 MB tmpfs fills it with checkpoints (~0.9 MB a step). One error
  line, exit 2, and what is left restores. Needs root (mount); elsewhere the OSError injected in
  the test above covers the same path."""
  mnt = tmp_path / "small"
  if not _can_mount_tmpfs(mnt):
    pytest.skip("mounting a tmpfs needs root")
  subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)], check=True)
  try:
    out = subprocess.run(_train_cmd(mnt / "w"), cwd=REPO, capture_output=True, text=True,
                         timeout=300)
    # Progress lines (carriage returns) precede the error on the same terminal line.
    assert out.returncode == 2, out.stderr[-3000:]
    assert out.stderr.count("error:") == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert len(out.stderr.split("error:")[1].splitlines()) == 1, out.stderr[-3000:]
    line = out.stderr.split("error:")[1]
    # Mostly a checkpoint step fills the disk; the metrics line or a report may be the one.
    assert line.startswith(" cannot write") and "No space left on device" in line, line
    for kind in ("latest", "best"):
      d = mnt / "w" / "checkpoints" / kind
      for p in d.iterdir():
        assert p.name.isdigit(), f"left behind: {p}"
        assert checkpoint_lib.check_integrity(p) is None
  finally:
    subprocess.run(["umount", str(mnt)], check=True)


def test_unwritable_workdir_is_one_error_line(tmp_path):
  """A workdir under a regular file: the config record cannot be written; one line, exit 2."""
  (tmp_path / "file").write_text("x")
  out = subprocess.run(_train_cmd(tmp_path / "file" / "run"), cwd=REPO, capture_output=True,
                       text=True, timeout=300)
  lines = [l for l in out.stderr.splitlines() if l.strip() and not l.startswith("[train]")]  # progress note aside
  assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), out.stderr


def test_read_only_config_write_is_a_storage_error(tmp_path, monkeypatch):
  """EROFS (a read-only file system) on the config record: StorageError naming the file."""
  def refuse(*args, dir=None, **kwargs):
    raise OSError(errno.EROFS, "Read-only file system", str(dir))
  monkeypatch.setattr(tempfile, "mkstemp", refuse)
  with pytest.raises(errors.StorageError, match="config.json: cannot write.*Read-only file system"):
    workdir_config.check_or_record(tmp_path, config(), what="training run")
  assert not list(tmp_path.iterdir())


def test_write_atomic_keeps_the_old_file(tmp_path, monkeypatch):
  path = tmp_path / "eval.json"
  path.write_text("old")

  def full(src, dst):
    raise OSError(errno.ENOSPC, "No space left on device")
  monkeypatch.setattr(os, "replace", full)
  with pytest.raises(errors.StorageError, match="eval.json: cannot write the report"):
    files.write_atomic(path, "new", "the report")
  assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["eval.json"]


def _train_cmd(workdir):
  return [sys.executable, "-m", "experiments.train", "--config=experiments/configs/test.py",
          f"--workdir={workdir}", "--evaluate=false", "--config.train.checkpoint_every=5",
          f"--config.train.episodes={ITERATIONS * 16}"]


def test_background_write_saves_the_state_as_it_was(tmp_path):
  """A background write works from host copies taken by save: deleting the device arrays (what a
  donating update does) and growing the history afterwards change nothing on disk."""
  ckpt = checkpoint_lib.Checkpointer(tmp_path, background=True)
  state = {"w": jnp.arange(4.0)}
  hist = history_lib.HistoryMemory(3, 2, capacity=10)
  hist.add(np.ones((2, 3), np.float32), np.zeros(2, np.int32))
  ckpt.save(checkpoint_lib.Write(step=0, state=state, history=hist, meta=dict(best_iteration=0)))
  state["w"].delete()
  hist.add(np.zeros((3, 3), np.float32), np.ones(3, np.int32))
  ckpt.close()
  reader = checkpoint_lib.Checkpointer(tmp_path, read_only=True)
  restored = history_lib.HistoryMemory(3, 2, capacity=10)
  out = reader.restore({"w": np.zeros(4, np.float32)}, restored)
  reader.close()
  np.testing.assert_array_equal(out.state["w"], np.arange(4.0))
  assert out.meta["history_rows"] == 2 and len(restored) == 2
  np.testing.assert_array_equal(restored.rows, np.ones((2, 3)))
