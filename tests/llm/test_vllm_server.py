"""The vLLM launcher and the serve_backbones runner, with a stand-in `vllm` module.

The stand-in is a package named vllm whose entrypoints.openai.api_server module parses the same
flags and serves the fake OpenAI server; it also forks a grandchild, as vLLM does (engine core), to
check that stopping leaves no process behind. The real server is exercised in tests/integration.
"""
import asyncio
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from gp_jax import errors
from gp_jax import paths
from gp_jax.llm import catalog as catalog_lib
from gp_jax.llm import endpoints as endpoints_lib
from gp_jax.llm import openai_pool
from gp_jax.llm import vllm_server

STAND_IN = '''
import argparse, os, subprocess, sys, time
p = argparse.ArgumentParser()
p.add_argument("--model"); p.add_argument("--host"); p.add_argument("--port", type=int)
p.add_argument("--served-model-name"); p.add_argument("--max-model-len", type=int)
p.add_argument("--tensor-parallel-size", type=int, default=1)
p.add_argument("--crash", action="store_true"); p.add_argument("--never-ready", action="store_true")
a = p.parse_args()
print("stand-in args", sys.argv[1:], "CUDA_VISIBLE_DEVICES=" + os.environ.get("CUDA_VISIBLE_DEVICES", ""), flush=True)
if a.crash:
    print("RuntimeError: no model weights found", flush=True); sys.exit(3)
# A grandchild in the same process group, like vLLM's engine core process.
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
with open(os.environ["STAND_IN_PIDS"], "a") as f:
    f.write(f"{os.getpid()} {child.pid}\\n")
if a.never_ready:
    time.sleep(600)
from gp_jax.llm import testing_server
testing_server.main(["--port", str(a.port), "--models", a.served_model_name])
'''


def alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  # A zombie (exited, not yet reaped by its parent) counts as gone.
  try:
    return pathlib.Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
  except OSError:
    return False


@pytest.fixture()
def stand_in(tmp_path):
  pkg = tmp_path / "pkgs" / "vllm" / "entrypoints" / "openai"
  pkg.mkdir(parents=True)
  for d in (pkg, pkg.parent, pkg.parent.parent):
    (d / "__init__.py").write_text("")
  (pkg / "api_server.py").write_text(STAND_IN)
  pids = tmp_path / "pids.txt"
  env = {"PYTHONPATH": f"{tmp_path / 'pkgs'}:{paths.REPO_ROOT}", "STAND_IN_PIDS": str(pids)}
  return env, pids


def free_port() -> int:
  import socket
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_build_command_and_spec_validation():
  spec = vllm_server.make_spec("/models/qwen-7b/", ["qwen2.5-7b-instruct"], port=8001, gpus=[2, 3],
                               tensor_parallel_size=2, max_model_len=4096,
                               extra_args=["--dtype", "bfloat16"])
  cmd = vllm_server.build_command(spec, "/venv/bin/python")
  assert cmd[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
  assert cmd[cmd.index("--served-model-name") + 1] == "qwen-7b"
  assert cmd[cmd.index("--tensor-parallel-size") + 1] == "2"
  assert cmd[cmd.index("--max-model-len") + 1] == "4096" and cmd[-2:] == ["--dtype", "bfloat16"]
  assert spec.base_url == "http://127.0.0.1:8001/v1"
  with pytest.raises(errors.ConfigError, match="do not split"):
    vllm_server.make_spec("m", ["a"], gpus=[0, 1, 2], tensor_parallel_size=2)
  with pytest.raises(errors.ConfigError, match="port"):
    vllm_server.make_spec("m", ["a"], port=70000)
  with pytest.raises(errors.ConfigError, match="same port"):
    vllm_server.check_specs([vllm_server.make_spec("m", ["a"]), vllm_server.make_spec("n", ["b"])], None)
  with pytest.raises(errors.ConfigError, match="unknown LLM 'gpt-9'"):
    vllm_server.check_specs([vllm_server.make_spec("m", ["gpt-9"])], catalog_lib.load_catalog())


def test_load_backbones_file(tmp_path):
  p = tmp_path / "b.json"
  p.write_text(json.dumps({"backbones": [
      {"model": "/m/a", "catalog_names": ["qwen2.5-7b-instruct"], "port": 8000, "gpus": [0]},
      {"model": "/m/a", "catalog_names": ["qwen2.5-7b-instruct"], "port": 8001, "gpus": [1],
       "env": {"X": "1"}}]}))
  specs = vllm_server.load_backbones(p)
  assert [s.port for s in specs] == [8000, 8001] and specs[1].env == (("X", "1"),)
  p.write_text(json.dumps({"backbones": [{"model": "/m/a", "catalog_names": ["x"], "gpu": [0]}]}))
  with pytest.raises(errors.DataError, match=r"backbones\[0\]: unknown field\(s\) \['gpu'\]"):
    vllm_server.load_backbones(p)
  p.write_text("{")
  with pytest.raises(errors.DataError, match="not valid JSON"):
    vllm_server.load_backbones(p)


def test_start_serve_and_stop_without_orphans(stand_in, tmp_path):
  env, pids = stand_in
  ports = [free_port(), free_port()]
  specs = [vllm_server.make_spec("/models/tiny", ["qwen2.5-7b-instruct", "gemma-2-9b-it"],
                                 port=port, gpus=[i], env=env) for i, port in enumerate(ports)]
  out = tmp_path / "endpoints.json"
  catalog = catalog_lib.load_catalog()
  servers = vllm_server.BackboneServers(specs, python=sys.executable, log_dir=tmp_path / "logs",
                                        endpoints_path=out, health_timeout_s=60, catalog=catalog)
  with servers:
    eps = endpoints_lib.load_endpoints(out, catalog)
    assert [e.base_url for e in eps["gemma-2-9b-it"]] == [f"http://127.0.0.1:{p}/v1" for p in ports]
    assert all(e.model == "tiny" for e in eps["qwen2.5-7b-instruct"])
    pool = openai_pool.OpenAIPool(catalog, out, check=True)
    c = asyncio.run(pool.chat("gemma-2-9b-it", [{"role": "user", "content": "hi"}]))
    assert c.ok and c.text == "echo: hi"
    log = (tmp_path / "logs" / f"vllm-tiny-{ports[1]}.log").read_text()
    assert "CUDA_VISIBLE_DEVICES=1" in log  # the GPU list reaches the server's environment
    started = [int(x) for line in pids.read_text().split("\n") if line for x in line.split()]
    assert len(started) == 4 and all(alive(p) for p in started)
  assert not out.exists()  # removed on stop: it would point at dead servers
  time.sleep(0.2)
  assert not any(alive(p) for p in started)


def test_crash_reports_log_tail(stand_in, tmp_path):
  env, _ = stand_in
  spec = vllm_server.make_spec("/models/tiny", ["qwen2.5-7b-instruct"], port=free_port(), env=env,
                               extra_args=["--crash"])
  servers = vllm_server.BackboneServers([spec], python=sys.executable, log_dir=tmp_path,
                                        endpoints_path=tmp_path / "e.json", health_timeout_s=60)
  with pytest.raises(errors.BackendError, match=r"(?s)exited with status 3.*no model weights found"):
    servers.start()
  assert not (tmp_path / "e.json").exists()


def test_health_timeout_stops_everything(stand_in, tmp_path):
  env, pids = stand_in
  spec = vllm_server.make_spec("/models/tiny", ["qwen2.5-7b-instruct"], port=free_port(), env=env,
                               extra_args=["--never-ready"])
  servers = vllm_server.BackboneServers([spec], python=sys.executable, log_dir=tmp_path,
                                        endpoints_path=tmp_path / "e.json", health_timeout_s=3)
  with pytest.raises(errors.BackendError, match=r"(?s)not healthy after 3 s.*stand-in args"):
    servers.start()
  started = [int(x) for x in pids.read_text().split()]
  time.sleep(0.2)
  assert started and not any(alive(p) for p in started)


def test_port_in_use_is_a_clear_error(stand_in, tmp_path):
  import socket
  env, _ = stand_in
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    s.listen()
    spec = vllm_server.make_spec("/models/tiny", ["qwen2.5-7b-instruct"], port=s.getsockname()[1], env=env)
    servers = vllm_server.BackboneServers([spec], python=sys.executable, log_dir=tmp_path,
                                          endpoints_path=tmp_path / "e.json")
    with pytest.raises(errors.BackendError, match="already in use"):
      servers.start()


def test_runner_sigterm_stops_children(stand_in, tmp_path):
  env, pids = stand_in
  out = tmp_path / "endpoints.json"
  cmd = [sys.executable, str(paths.REPO_ROOT / "experiments" / "serve_backbones.py"),
         "--model=/models/tiny", "--names=qwen2.5-7b-instruct", f"--port={free_port()}",
         f"--python={sys.executable}", f"--endpoints_out={out}", f"--server_log_dir={tmp_path / 'logs'}",
         "--health_timeout_s=60"]
  proc = subprocess.Popen(cmd, env={**os.environ, **env}, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
  try:
    deadline = time.monotonic() + 60
    while not out.exists() and time.monotonic() < deadline and proc.poll() is None:
      time.sleep(0.1)
    assert out.exists(), proc.stdout.read() if proc.poll() is not None else "no endpoints file"
    started = [int(x) for x in pids.read_text().split()]
    proc.send_signal(signal.SIGTERM)
    text, _ = proc.communicate(timeout=30)
  finally:
    if proc.poll() is None:
      proc.kill()
  assert proc.returncode == 0 and "ready: 1 server(s)" in text and "stopping on signal SIGTERM" in text
  time.sleep(0.2)
  assert not out.exists() and not any(alive(p) for p in started)


def test_runner_bad_flags_exit_2(tmp_path):
  run = lambda *a: subprocess.run(
      [sys.executable, str(paths.REPO_ROOT / "experiments" / "serve_backbones.py"), *a],
      capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(paths.REPO_ROOT)})
  r = run("--model=/m", "--names=gpt-9", f"--endpoints_out={tmp_path / 'e.json'}")
  assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith("error: unknown LLM 'gpt-9'")
  r = run(f"--endpoints_out={tmp_path / 'e.json'}")
  assert r.returncode == 2 and "give --backbones=FILE" in r.stderr
  r = run(f"--backbones={tmp_path / 'missing.json'}")
  assert r.returncode == 2 and "backbones file not found" in r.stderr


def test_server_dies_with_a_killed_parent(stand_in, tmp_path):
  env, pids = stand_in
  port = free_port()
  parent_code = f"""
import sys, time
from gp_jax.llm import vllm_server
spec = vllm_server.make_spec("/models/tiny", ["qwen2.5-7b-instruct"], port={port}, env={env!r})
s = vllm_server.BackboneServers([spec], python=sys.executable, log_dir={str(tmp_path)!r},
                                endpoints_path={str(tmp_path / 'e.json')!r}, health_timeout_s=60)
s.start()
print("up", flush=True)
time.sleep(600)
"""
  parent = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(paths.REPO_ROOT)})
  try:
    assert parent.stdout.readline().strip() == "up"
    server_pid = int(pids.read_text().split()[0])
    assert alive(server_pid)
    parent.kill()  # SIGKILL: no cleanup code runs in the parent
    parent.wait(10)
    deadline = time.monotonic() + 15
    while alive(server_pid) and time.monotonic() < deadline:
      time.sleep(0.1)
    assert not alive(server_pid)
  finally:
    if parent.poll() is None:
      parent.kill()
    for pid in [int(x) for x in pids.read_text().split()] if pids.exists() else []:
      if alive(pid):
        os.kill(pid, signal.SIGKILL)
