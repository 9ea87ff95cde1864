"""The shell entry points: env.sh sourced interactively, train.sh's terminal output, the studies
and runs that experiments.sh (CI's experiments stage) runs."""
import os
import pathlib
import re
import subprocess
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


def _bash(script: str, cwd, env=None, timeout=600):
  return subprocess.run(["bash", "-c", script], cwd=cwd, capture_output=True, text=True,
                        timeout=timeout, env=env or dict(os.environ))


def test_env_sh_leaves_an_interactive_shell_as_it_was(tmp_path):
  # Sourced from elsewhere, with the shell's options all off: afterwards they are still off,
  # the directory is unchanged, a failing command does not end the shell, and the project
  # imports from any directory, also with nothing but the venv's python (no PYTHONPATH).
  out = _bash(f"""set +euo pipefail
source {REPO}/scripts/env.sh; echo "rc=$?"
echo "opts=$-"; shopt -qo pipefail && echo pipefail-on || echo pipefail-off
echo "pwd=$PWD"
false; echo "alive after false"
cd / && python -c 'import gp_jax, experiments.common; print("import", gp_jax.__file__)'
env -u PYTHONPATH python {REPO}/experiments/prepare_data.py --tasks=nope 2>&1 | head -1
""", cwd=tmp_path)
  assert out.returncode == 0, out.stderr
  lines = out.stdout.splitlines()
  assert "rc=0" in lines and "pipefail-off" in lines and f"pwd={tmp_path}" in lines
  opts = next(l for l in lines if l.startswith("opts="))
  assert "e" not in opts[5:] and "u" not in opts[5:]
  assert "alive after false" in lines
  assert "error: unknown task 'nope'" in out.stdout   # the runner ran: gp_jax was importable
  assert f"import {REPO}/gp_jax/__init__.py" in lines


def test_env_sh_failure_returns_instead_of_closing_the_shell(tmp_path):
  (tmp_path / "file").write_text("")
  env = dict(os.environ, GP_JAX_CACHE=str(tmp_path / "file" / "cache"))
  out = _bash(f"""set +euo pipefail
source {REPO}/scripts/env.sh; echo "rc=$?"; echo "opts=$-"; echo still here""", cwd=tmp_path,
              env=env)
  assert out.returncode == 0
  assert "rc=1" in out.stdout and "still here" in out.stdout
  assert "e" not in out.stdout.split("opts=")[1].split()[0]


@pytest.mark.slow
def test_train_sh_names_its_logs_first_and_shows_progress(tmp_path):
  """scripts/train.sh as a user runs it (both alphas side by side), made small by flags: the log
  files are named before anything else, then each run's progress lines (with an ETA) appear on
  the terminal while it runs, then the summaries."""
  env = dict(os.environ, GP_JAX_WORKDIRS=str(tmp_path / "workdirs"), GP_JAX_PROGRESS_EVERY="0")
  t0 = time.time()
  proc = subprocess.Popen(
      ["bash", str(REPO / "scripts/train.sh"), "--config.train.episodes=256",
       "--config.train.episodes_per_iter=32", "--config.data.n_train=100",
       "--config.data.n_test=20", "--config.eval.optimum=false"],
      cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
  seen = []   # (seconds since start, line)
  for line in proc.stdout:
    seen.append((time.time() - t0, line.rstrip("\n")))
  assert proc.wait(timeout=600) == 0, "\n".join(l for _, l in seen)[-3000:]
  lines = [l for _, l in seen]
  assert lines[0].startswith("[train.sh] training at alpha 0.0 0.5 side by side; full logs: ")
  assert f"{tmp_path}/workdirs/alpha0.0.log" in lines[0] and f"{tmp_path}/workdirs/alpha0.5.log" in lines[0]
  for alpha in ("0.0", "0.5"):
    progress = [(t, l) for t, l in seen if l.startswith(f"alpha {alpha}  [train] ")]
    assert any(re.search(r"\d+/8 iter .*ETA \d", l) for _, l in progress), progress
    assert any(l.startswith(f"alpha {alpha}  [eval ") for l in lines)
    # progress shows up while training runs, long before the summary at the end
    first_eta = min(t for t, l in progress if "ETA" in l)
    assert first_eta < seen[-1][0] - 2
    assert (tmp_path / "workdirs" / f"alpha{alpha}.log").exists()
  assert "\r" not in "".join(lines)
  assert any(l.startswith("== alpha = 0.5 (log: ") for l in lines)
  assert any(l.startswith("| GraphPlanner |") for l in lines)
  assert lines[-1].startswith("total wall time: ")


def test_experiments_sh_runs_every_study_then_the_report():
  """CI's experiments stage (.ci/run: experiments.sh test) runs the five studies at the size
  given, each into <root>/studies/<study>, the drift study twice (three seeds at CPU size; the
  second run reads the history by retrieval, into studies/drift_retrieval), before the combined
  report."""
  ci = (REPO / ".ci" / "run").read_text()
  assert "bash scripts/experiments.sh test" in ci
  script = (REPO / "scripts" / "experiments.sh").read_text()
  loop = re.search(r"^for study in ([a-z ]+); do$", script, re.M)
  assert loop and loop.group(1).split() == ["phases", "unseen", "ablations", "roles"]
  body = script[loop.end():script.index("done", loop.end())]
  assert '--study="$study" --config="experiments/configs/study.py$suffix"' in body
  assert '--workdir="$root/studies/$study"' in body
  report = script.index("python -m experiments.report --root=")
  drift_runs = [m.end() for m in re.finditer(
      r'--study=drift --config="experiments/configs/study.py\$suffix"', script)]
  assert len(drift_runs) == 2 and loop.end() < drift_runs[0] < drift_runs[1] < report
  first, second = script[drift_runs[0]:drift_runs[1]], script[drift_runs[1]:report]
  assert '--workdir="$root/studies/drift" --config.study.seeds="$drift_seeds"' in first
  assert re.search(r'default\).*drift_seeds="0,1,2"', script)
  assert '--workdir="$root/studies/drift_retrieval" --config.model.history=retrieval' in second


def test_experiments_sh_trains_the_released_settings_before_the_report():
  """experiments.sh trains (and evaluates) experiments/configs/official.py at the size given into
  <root>/official, with a stamp line, before the report; not on the v2 world."""
  script = (REPO / "scripts" / "experiments.sh").read_text()
  run = script.index(
      'python -m experiments.train --config="experiments/configs/official.py$suffix"')
  assert script.index('--workdir="$root/official"', run) < script.index("stamp ", run)
  assert script.rfind('if [ "$size" != v2 ]; then', 0, run) > script.rfind("fi\n", 0, run)
  assert run < script.index("python -m experiments.report --root=")


def test_experiments_sh_v2_runs_every_sweep_and_study_on_the_v2_world():
  """`experiments.sh v2`: the CPU size on the v2 world into its own root and report, the world's
  flags before the user's on every sweep and study run, no routed Graph Counselor; an unknown
  size is one error line, exit 2, before anything runs."""
  script = (REPO / "scripts" / "experiments.sh").read_text()
  case = re.search(r'^  v2\) +suffix="";.*?;;$', script, re.M | re.S)
  assert case and 'root="workdirs/experiments_v2"' in case.group(0)
  assert 'out="docs/report_v2.md"' in case.group(0)
  assert ("world=(--config.sim.world=v2 --config.sim.world_file=data/world_v2.json)"
          in case.group(0))
  prepend = script.index('set -- ${world[@]+"${world[@]}"} "$@"')
  runs = [m.start() for m in re.finditer(r"python -m experiments\.(sweep|study) ", script)]
  assert len(runs) == 4 and prepend < min(runs)
  counselor = script.index("python -m experiments.counselor_routed")
  assert script.rfind('if [ "$size" != v2 ]; then', 0, counselor) > max(runs)
  assert (REPO / "data" / "world_v2.json").exists()
  p = subprocess.run(["bash", str(REPO / "scripts" / "experiments.sh"), "v3"],
                     capture_output=True, text=True, timeout=600)
  assert p.returncode == 2
  assert p.stderr.strip().splitlines()[-1] == ("error: unknown size 'v3' "
                                               "(use default, test or v2)")
