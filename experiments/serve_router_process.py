"""Starts the router server (experiments/serve_router.py) as a child process and waits until it
serves (tests, benchmarks, the integration stage). It sits next to the runner it starts: the
library (gp_jax/) never starts a runner."""
from __future__ import annotations

import os
import pathlib
import re
import signal
import subprocess
import sys
import time

from gp_jax import errors
from gp_jax import paths
from gp_jax.sim import served_events


def drift_event(kind: str, t: int, llm: str = "", delta: float | None = None,
                scale: float | None = None) -> served_events.ServedEvent:
  """A served pool event with the drift study's settings (experiments/configs/study.py:
  drift_llm, drift_delta, drift_price_scale) where not given: serve_router --sim_event's
  defaults, and the benchmark's retrained reference."""
  from experiments.configs import study as study_config
  study = study_config.get_config().study
  return served_events.ServedEvent(kind, llm or str(study.drift_llm), int(t),
                                   float(study.drift_delta if delta is None else delta),
                                   float(study.drift_price_scale if scale is None else scale))

_READY = re.compile(r"serving \S+ .* on (http://\S+)/v1")


class RouterProcess:
  """`python -m experiments.serve_router --port=0 ARGS...` in its own process group.

  Args:
    args: the runner's flags (--workdir=..., --memory_path=..., --config.backend=...).
    log_path: where its stdout and stderr go.
    start_timeout_s: how long to wait for the "serving ... on http://HOST:PORT/v1" line.
  """

  def __init__(self, args: list[str], log_path, *, start_timeout_s: float = 180.0):
    self.args, self.log_path = list(args), pathlib.Path(log_path)
    self.start_timeout_s = start_timeout_s
    self.proc: subprocess.Popen | None = None
    self.url = ""   # http://HOST:PORT (no /v1)

  def start(self) -> "RouterProcess":
    cmd = [sys.executable, "-m", "experiments.serve_router", "--port=0"] + self.args
    env = paths.child_env()
    self.log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(self.log_path, "w") as log:
      self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, cwd=paths.REPO_ROOT, env=env,
                                   start_new_session=True)
    t0 = time.monotonic()
    while True:
      m = _READY.search(self.log_path.read_text(errors="replace"))
      if m:
        self.url = m.group(1)
        return self
      if self.proc.poll() is not None:
        raise errors.BackendError(f"serve_router exited with {self.proc.returncode}:\n"
                                  f"{self.log_tail()}")
      if time.monotonic() - t0 > self.start_timeout_s:
        self.stop(signal.SIGKILL)
        raise errors.BackendError(f"serve_router not ready after {self.start_timeout_s:.0f} s:\n"
                                  f"{self.log_tail()}")
      time.sleep(0.2)

  def log_tail(self, n: int = 30) -> str:
    try:
      return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
      return "(no log)"

  def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 60.0) -> int | None:
    """Sends `sig` (SIGTERM: a clean stop that flushes the memory; SIGKILL: a crash) and waits."""
    if self.proc is None or self.proc.poll() is not None:
      return None if self.proc is None else self.proc.returncode
    os.killpg(self.proc.pid, sig)
    try:
      return self.proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
      os.killpg(self.proc.pid, signal.SIGKILL)
      return self.proc.wait(timeout=30)

  def __enter__(self) -> "RouterProcess":
    return self.start()

  def __exit__(self, *exc) -> None:
    self.stop()
