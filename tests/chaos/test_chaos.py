"""The training CLI killed with SIGKILL at >= 10 moments, rerun each time, ends as if never killed.

Default config (experiments/configs/default.py) and its checkpoint spacing (train.checkpoint_every
= 5, each "latest" write preceded by a "best" write when a better state was found since), shortened by flags only: 12 iterations of 64 episodes and 32
test queries. The moments come from a seeded schedule of four kinds:
- "write": as the k-th (1-5) checkpoint write of that process starts (orbax's temporary folder
  appears); the kill counts as landing inside a write when a temporary folder that this process
  created is still there afterwards (leftovers of an earlier kill count for neither);
- "delay": t (5-25) seconds after the process started (start-up, rollouts, updates, writes alike);
- "eval": shortly after the last iteration's metrics line (final checkpoints or evaluation).
Where a kill lands within its moment depends on timing, but the assertion holds for every landing
point, so the outcome never depends on it: the final metrics.jsonl (timings aside) and eval.json
equal those of an uninterrupted run, byte for byte. The whole schedule runs twice: with the
default synchronous checkpoint writes and with train.background_checkpoints (writes in a thread
while training goes on), against the same uninterrupted reference.
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


def command(workdir, background=False):
  return [sys.executable, "-m", "experiments.train", f"--workdir={workdir}"] + FLAGS + (
      ["--config.train.background_checkpoints=true"] if background else [])


def metrics(workdir):
  path = pathlib.Path(workdir) / "metrics.jsonl"
  if not path.exists():
    return []
  return [{k: v for k, v in json.loads(l).items() if k not in TIMING}
          for l in path.read_text().splitlines() if l.strip()]


def checkpoint_temporaries(workdir) -> set[tuple[str, int]]:
  """Orbax's temporary folders under the workdir's checkpoints, as (name, inode): a folder made
  again under an old name is a new one."""
  out = set()
  for kind in ("latest", "best"):
    d = pathlib.Path(workdir) / "checkpoints" / kind
    try:
      for p in d.iterdir():
        if TMP_MARK in p.name:
          try:
            out.add((f"{kind}/{p.name}", p.stat().st_ino))
          except FileNotFoundError:   # renamed away between the listing and the stat
            pass
    except FileNotFoundError:
      pass
  return out


def count_lines(workdir) -> int:
  try:
    return (pathlib.Path(workdir) / "metrics.jsonl").read_text().count("\n")
  except FileNotFoundError:
    return 0


def run_until(workdir, trigger, log, background=False) -> set | bool:
  """Starts the CLI and SIGKILLs it when trigger(workdir, t0, leftovers) is true (leftovers: the
  temporary folders there before it started). Returns the temporary folders this process left
  (a set, maybe empty) when killed; False if it finished first."""
  leftovers = checkpoint_temporaries(workdir)
  with open(log, "ab") as out:
    proc = subprocess.Popen(command(workdir, background), cwd=REPO, stdout=out,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
  t0 = time.monotonic()
  try:
    while proc.poll() is None:
      if trigger(workdir, t0, leftovers):
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        return checkpoint_temporaries(workdir) - leftovers
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

  def trigger(workdir, t0, leftovers):
    seen.update(checkpoint_temporaries(workdir) - leftovers)
    return len(seen) >= k
  return trigger


def after(seconds):
  return lambda workdir, t0, leftovers: time.monotonic() - t0 >= seconds


def after_last_iteration(seconds):
  state = {}

  def trigger(workdir, t0, leftovers):
    if "t" not in state and count_lines(workdir) >= ITERATIONS:
      state["t"] = time.monotonic()
    return "t" in state and time.monotonic() - state["t"] >= seconds
  return trigger


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """An uninterrupted run (synchronous writes; background writes give the same results)."""
  ref = tmp_path_factory.mktemp("reference") / "run"
  subprocess.run(command(ref), cwd=REPO, check=True, capture_output=True, timeout=RUN_LIMIT_S)
  assert len(metrics(ref)) == ITERATIONS
  return ref


def test_leftovers_of_an_earlier_kill_are_not_this_kill(tmp_path):
  """A temporary folder left by an earlier process neither triggers a write kill nor counts as
  one landing inside a write; one made again under the same name does."""
  d = tmp_path / "checkpoints" / "latest"
  d.mkdir(parents=True)
  old = d / f"5{TMP_MARK}-1"
  old.mkdir()
  leftovers = checkpoint_temporaries(tmp_path)
  trigger = at_write(1)
  assert not trigger(tmp_path, 0.0, leftovers)
  (d / f"10{TMP_MARK}-2").mkdir()
  assert trigger(tmp_path, 0.0, leftovers)
  assert checkpoint_temporaries(tmp_path) - leftovers == {(f"latest/10{TMP_MARK}-2",
                                                           (d / f"10{TMP_MARK}-2").stat().st_ino)}
  keep = tmp_path / "keep"   # holds the old inode, so the new folder cannot reuse its number
  old.rename(keep)
  old.mkdir()
  assert len(checkpoint_temporaries(tmp_path) - leftovers) == 2


@pytest.mark.parametrize("background", [False, True], ids=["sync_writes", "background_writes"])
def test_kills_at_random_moments_change_nothing(tmp_path, reference, background):
  ref = reference
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
    left = run_until(workdirs[-1], trigger, log, background)
    if left is False:
      # Finished before the moment came (an earlier kill let it get far): check it and go on
      # with a fresh workdir, so that every planned kill happens.
      check_same(workdirs[-1], ref)
      assert len(workdirs) < 6, kills
      workdirs.append(tmp_path / f"chaos{len(workdirs)}")
      plan.insert(0, (kind, arg))
      continue
    landed = bool(left) if kind == "write" else None
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
  assert run_until(workdirs[-1], lambda *_: False, log, background) is False   # never killed
  check_same(workdirs[-1], ref)


def check_same(workdir, ref):
  assert metrics(workdir) == metrics(ref)
  assert (workdir / "eval.json").read_text() == (ref / "eval.json").read_text()
  assert (workdir / "eval.md").read_text() == (ref / "eval.md").read_text()
