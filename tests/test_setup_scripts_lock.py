"""scripts/setup_vllm_cpu.sh holds a lock like scripts/env.sh: a second run waits for the first
instead of deleting the vLLM venv it is installing (the integration stage runs it)."""
import fcntl
import os
import pathlib
import subprocess
import time

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_setup_vllm_cpu_waits_for_the_lock(tmp_path):
  cache, venv, model = tmp_path / "cache", tmp_path / "venv", tmp_path / "model"
  (venv / "bin").mkdir(parents=True)
  (venv / "bin" / "python").write_text("#!/bin/sh\n")
  (venv / "bin" / "python").chmod(0o755)
  (venv / ".complete").touch()
  model.mkdir()
  (model / ".complete").touch()   # both complete: an unlocked run would print and exit at once
  cache.mkdir()
  env = dict(os.environ, GP_JAX_CACHE=str(cache), GP_JAX_VLLM_VENV=str(venv),
             GP_JAX_SMOLLM2_DIR=str(model))
  with open(cache / ".vllm-cpu.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)   # another setup run in progress
    proc = subprocess.Popen(["bash", str(REPO / "scripts" / "setup_vllm_cpu.sh")], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1.5)
    assert proc.poll() is None, "the script ran while another held the lock"
  out, err = proc.communicate(timeout=30)
  assert proc.returncode == 0, err
  assert out.splitlines() == [f"GP_JAX_VLLM_PYTHON={venv}/bin/python", f"GP_JAX_SMOLLM2_DIR={model}"]
