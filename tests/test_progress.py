"""Progress lines: styles, throttling, ETA; and what the real runners print."""
import io
import os
import pathlib
import subprocess
import sys

import pytest

from gp_jax import progress

REPO = pathlib.Path(__file__).resolve().parents[1]


class Clock:
  def __init__(self):
    self.t = 1000.0

  def __call__(self):
    return self.t


@pytest.fixture
def clock(monkeypatch):
  c = Clock()
  monkeypatch.setattr(progress.time, "monotonic", c)
  monkeypatch.delenv("GP_JAX_PROGRESS_EVERY", raising=False)
  return c


def test_lines_style_waits_for_an_eta_then_one_line_per_interval(clock):
  out = io.StringIO()
  bar = progress.Progress("train", 100, unit="iter", stream=out, style="lines")
  clock.t += 30            # the first iteration compiles: no rate from it
  bar.update(1, reward="+0.100")
  assert out.getvalue() == ""
  for i in range(2, 51):   # then 1 s per iteration
    clock.t += 1
    bar.update(i, reward="+0.200")
  lines = out.getvalue().splitlines()
  assert "\r" not in out.getvalue()
  assert lines[0] == "[train] 2/100 iter (2%)  reward +0.200 | 31s elapsed, ETA 1m38s"
  # one line per 10 s after that: iterations 12, 22, 32, 42
  assert [l.split()[1] for l in lines] == ["2/100", "12/100", "22/100", "32/100", "42/100"]
  assert lines[-1].endswith("ETA 58s")
  clock.t += 1
  bar.update(100)          # the last one is always written, without an ETA
  assert out.getvalue().splitlines()[-1] == "[train] 100/100 iter (100%) | 1m20s elapsed"


def test_close_writes_a_held_back_last_update(clock):
  out = io.StringIO()
  bar = progress.Progress("train", 100, stream=out, style="lines")
  for i in range(1, 5):
    clock.t += 1
    bar.update(i)
  n = len(out.getvalue().splitlines())
  bar.close()              # stopped early at 4/100: that state is reported
  assert len(out.getvalue().splitlines()) == n + 1
  assert out.getvalue().splitlines()[-1].startswith("[train] 4/100")


def test_tty_style_rewrites_one_line(clock):
  out = io.StringIO()
  bar = progress.Progress("eval", 3, unit="queries", stream=out, style="tty")
  for i in range(1, 4):
    clock.t += 1
    bar.update(i)
  text = out.getvalue()
  assert text.count("\r") == 3 and text.rstrip(" \n").endswith("(100%) | 3s elapsed")
  assert text.count("\n") == 1
  assert "ETA ?" in text.split("\r")[1]      # no rate from a single update


def test_parts_share_one_line_budget(clock):
  out = io.StringIO()
  bar = progress.Progress("eval 1/2 a", 10, unit="queries", stream=out, style="lines",
                          write_at_total=False)
  for i in range(1, 11):
    clock.t += 0.5
    bar.update(i)
  bar.restart("eval 2/2 b", 10)
  for i in range(1, 11):
    clock.t += 2
    bar.update(i)
  bar.close()
  lines = out.getvalue().splitlines()
  assert lines[0].startswith("[eval 1/2 a] 3/10 queries")   # a rate over >= 1 s
  assert lines[-1] == "[eval 2/2 b] 10/10 queries (100%) | 20s elapsed"
  assert [l.split("]")[1].split()[0] for l in lines] == ["3/10", "4/10", "9/10", "10/10"]
  assert lines[1].startswith("[eval 2/2 b]")


def test_off_and_environment_override(monkeypatch):
  out = io.StringIO()
  monkeypatch.setenv("GP_JAX_PROGRESS", "off")
  bar = progress.Progress("train", 2, stream=out)
  bar.update(1)
  bar.update(2)
  progress.note("[train] hello", stream=out)
  assert out.getvalue() == ""
  monkeypatch.setenv("GP_JAX_PROGRESS", "lines")
  assert progress.style_for(sys.stderr) == "lines"
  monkeypatch.delenv("GP_JAX_PROGRESS")
  assert progress.style_for(io.StringIO()) == "lines"   # not a terminal


def test_format_seconds():
  assert [progress.format_seconds(s) for s in (4, 65, 3725)] == ["4s", "1m05s", "1h02m"]


def test_runner_prints_train_and_eval_progress_lines(tmp_path):
  """The real CLI on the test config, stderr a pipe: plain lines, each step with its ETA."""
  out = subprocess.run(
      [sys.executable, "-m", "experiments.train", "--config=experiments/configs/test.py",
       f"--workdir={tmp_path / 'w'}", "--config.train.episodes=192"], cwd=REPO, capture_output=True, text=True, timeout=300,
      env=dict(os.environ, GP_JAX_PROGRESS_EVERY="0"))
  assert out.returncode == 0, out.stderr[-2000:]
  err = out.stderr
  assert "\r" not in err
  train = [l for l in err.splitlines() if l.startswith("[train] ")]
  assert train[0].startswith("[train] ") and "12 iterations of 16 episodes" in train[0]
  assert any("iter (" in l and "reward " in l and ", ETA " in l for l in train), train
  assert train[-1].startswith("[train] 12/12 iter (100%)")
  evals = [l for l in err.splitlines() if l.startswith("[eval ")]
  # (each policy of the test config takes well under a second: no rate, so no ETA, to show)
  assert evals[0].startswith("[eval 1/6 GraphPlanner] ")
  assert evals[-1].startswith("[eval 6/6 optimum (DP)] 24/24 queries (100%)"), evals
