"""The training CLI killed with SIGKILL at >= 10 moments, rerun each time, ends as if never killed.

Default config (experiments/configs/default.py) and its checkpoint spacing (train.checkpoint_every
= 5, each "latest" write preceded by a "best" write when a better state was found since), shortened by flags only: 12 iterations of 64 episodes and 32
test queries. The moments come from a seeded schedule of four kinds:
- "write": as the k-th (1-5) checkpoint write of that process starts (orbax's temporary folder appears);
  the kill counts as landing inside a write when that folder is still there afterwards;
- "delay": t (5-25) seconds after the process started (start-up, rollouts, updates, writes alike);
- "eval": shortly after the last iteration's metrics line (final checkpoints or evaluation).
Where a kill lands within its moment depends on timing, but the assertion holds for every landing
point, so the outcome never depends on it: the final metrics.jsonl (timings aside) and eval.json
equal those of an uninterrupted run, byte for byte.
"""
import json
import pathlib
import random
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.chaos

REPO = pathlib.Path(__file__).resolve().parents[2]
SEED = 18
ITERATIONS = 12
FLAGS = [f"--config.train.episodes={ITERATIONS * 64}", "--config.data.n_test=32"]
TIMING = {"rollout_s", "update_s"}
MIN_KILLS = 10
MIN_KILLS_IN_WRITES = 3
RUN_LIMIT_S = 600     # one whole run takes ~1 min on 2 busy cores; this only turns a hang into a failure
TMP_MARK = ".orbax-checkpoint-tmp"


def command(workdir):
  return [sys.executable, "-m", "experiments.train", f"--workdir={workdir}"] + FLAGS


def metrics(workdir):
  path = pathlib.Path(workdir) / "metrics.jsonl"
  if not path.exists():
    return []
  return [{k: v for k, v in json.loads(l).items() if k not in TIMING}
          for l in path.read_text().splitlines() if l.strip()]


def checkpoint_temporaries(workdir) -> set[str]:
  out = set()
  for kind in ("latest", "best"):
    d = pathlib.Path(workdir) / "checkpoints" / kind
    try:
      out |= {f"{kind}/{p.name}" for p in d.iterdir() if TMP_MARK in p.name}
    except FileNotFoundError:
      pass
  return out


def count_lines(workdir) -> int:
  try:
    return (pathlib.Path(workdir) / "metrics.jsonl").read_text().count("\n")
  except FileNotFoundError:
    return 0


def run_until(workdir, trigger, log) -> bool:
  """Starts the CLI and SIGKILLs it when trigger(workdir, t0) is true; False if it finished first."""
  with open(log, "ab") as out:
    proc = subprocess.Popen(command(workdir), cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
  t0 = time.monotonic()
  try:
    while proc.poll() is None:
      if trigger(workdir, t0):
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        return True
      if time.monotonic() - t0 > RUN_LIMIT_S:
        raise AssertionError(f"training still running after {RUN_LIMIT_S} s; log: {log}")
      time.sleep(0.002)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  assert proc.returncode == 0, pathlib.Path(log).read_text()[-3000:]
  return False


def at_write(k):
  seen = set()

  def trigger(workdir, t0):
    seen.update(checkpoint_temporaries(workdir))
    return len(seen) >= k
  return trigger


def after(seconds):
  return lambda workdir, t0: time.monotonic() - t0 >= seconds


def after_last_iteration(seconds):
  state = {}

  def trigger(workdir, t0):
    if "t" not in state and count_lines(workdir) >= ITERATIONS:
      state["t"] = time.monotonic()
    return "t" in state and time.monotonic() - state["t"] >= seconds
  return trigger


def test_kills_at_random_moments_change_nothing(tmp_path):
  ref = tmp_path / "reference"
  subprocess.run(command(ref), cwd=REPO, check=True, capture_output=True, timeout=RUN_LIMIT_S)
  assert len(metrics(ref)) == ITERATIONS

  rng = random.Random(SEED)
  plan = [("write", rng.randint(1, 5)) for _ in range(5)] + \
         [("delay", rng.uniform(5.0, 25.0)) for _ in range(4)]
  rng.shuffle(plan)
  plan += [("eval", rng.uniform(0.0, 3.0)) for _ in range(2)]
  log = tmp_path / "chaos.log"
  workdirs = [tmp_path / "chaos0"]
  kills, in_writes, extra = [], 0, 0
  while plan:
    kind, arg = plan.pop(0)
    trigger = {"write": at_write, "delay": after, "eval": after_last_iteration}[kind](arg)
    if not run_until(workdirs[-1], trigger, log):
      # Finished before the moment came (an earlier kill let it get far): check it and go on
      # with a fresh workdir, so that every planned kill happens.
      check_same(workdirs[-1], ref)
      assert len(workdirs) < 6, kills
      workdirs.append(tmp_path / f"chaos{len(workdirs)}")
      plan.insert(0, (kind, arg))
      continue
    landed = bool(checkpoint_temporaries(workdirs[-1])) if kind == "write" else None
    in_writes += bool(landed)
    kills.append((kind, round(arg, 2), len(workdirs) - 1, len(metrics(workdirs[-1])), landed))
    # Kills inside a write depend on timing: retry (within a bound) until enough have landed.
    if not plan and in_writes < MIN_KILLS_IN_WRITES and extra < 10:
      extra += 1
      plan.append(("write", rng.randint(1, 3)))
  print("\nkills (kind, arg, workdir, metrics lines after, landed in a write):", *kills,
        sep="\n  ")
  assert len(kills) >= MIN_KILLS, kills
  assert in_writes >= MIN_KILLS_IN_WRITES, kills
  assert run_until(workdirs[-1], lambda *_: False, log) is False    # the last run, never killed
  check_same(workdirs[-1], ref)


def check_same(workdir, ref):
  assert metrics(workdir) == metrics(ref)
  assert (workdir / "eval.json").read_text() == (ref / "eval.json").read_text()
  assert (workdir / "eval.md").read_text() == (ref / "eval.md").read_text()
