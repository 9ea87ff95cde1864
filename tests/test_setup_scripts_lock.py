"""scripts/setup_vllm_cpu.sh, scripts/setup_llmrouter.sh and scripts/setup_litellm.sh hold a lock
like scripts/env.sh: a second run waits for the first instead of deleting the venv it is
installing (the integration and llmrouter stages and benchmarks/bench_server.py run them)."""
import fcntl
import os
import pathlib
import subprocess
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


def _complete_venv(venv: pathlib.Path) -> pathlib.Path:
  """A venv folder the scripts take as installed and complete."""
  (venv / "bin").mkdir(parents=True)
  (venv / "bin" / "python").write_text("#!/bin/sh\n")
  (venv / "bin" / "python").chmod(0o755)
  (venv / ".complete").touch()
  return venv


def _run_behind_lock(script: str, cache: pathlib.Path, lock_name: str, **env) -> str:
  """Runs scripts/<script> while another holder has its lock; checks that it waits, then that it
  ends well once the lock is free. Returns its stdout."""
  cache.mkdir()
  env = dict(os.environ, GP_JAX_CACHE=str(cache), **env)
  with open(cache / lock_name, "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)   # another setup run in progress
    proc = subprocess.Popen(["bash", str(REPO / "scripts" / script)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1.5)
    assert proc.poll() is None, "the script ran while another held the lock"
  out, err = proc.communicate(timeout=30)
  assert proc.returncode == 0, err
  return out


def test_setup_vllm_cpu_waits_for_the_lock(tmp_path):
  venv, model = _complete_venv(tmp_path / "venv"), tmp_path / "model"
  model.mkdir()
  (model / ".complete").touch()   # both complete: an unlocked run would print and exit at once
  out = _run_behind_lock("setup_vllm_cpu.sh", tmp_path / "cache", ".vllm-cpu.lock",
                         GP_JAX_VLLM_VENV=str(venv), GP_JAX_SMOLLM2_DIR=str(model))
  assert out.splitlines() == [f"GP_JAX_VLLM_PYTHON={venv}/bin/python", f"GP_JAX_SMOLLM2_DIR={model}"]


@pytest.mark.parametrize("script, lock, variable", [
    ("setup_llmrouter.sh", ".llmrouter.lock", "GP_JAX_LLMROUTER_VENV"),
    ("setup_litellm.sh", ".litellm.lock", "GP_JAX_LITELLM_VENV"),
])
def test_setup_venv_waits_for_the_lock_then_reuses_the_venv(tmp_path, script, lock, variable):
  """A complete venv is reused: its python path is all the script prints."""
  venv = _complete_venv(tmp_path / "venv")
  out = _run_behind_lock(script, tmp_path / "cache", lock, **{variable: str(venv)})
  assert out.splitlines() == [f"{venv}/bin/python"]
