"""The online learner's own process (docs/serving.md, "Learning while serving").

The guarded update (online_update.GuardedUpdate: the PPO update, the KL line search and the
canary rollouts) is CPU work in JAX and Python. In the server's process it would share the
interpreter lock and XLA's thread pool with the decisions, and slow them; here it runs in a
child process at the lowest scheduling priority (niceness 19), so the operating system gives the
decisions the cores first and the server process only sends episodes and receives candidates.
(Linux's SCHED_IDLE policy on top of it was tried and measured no better: docs/serving.md.)

Protocol: the parent writes requests to the child's stdin and reads replies from its stdout,
each a pickled (op, payload) tuple behind an 8-byte length; the child's own prints and logs go to
its stderr (the server's log). Ops: init (config, workdir, settings: builds the system and
GARNet of the served config), warm_up (state, obs, view), step (state, episodes, view and
the anchor's parameters or None: one guarded update, online_update.GuardedUpdate.step; the
episodes come as `pack`'s list of pickles), write (folder, record: the last step's
candidate as a version's checkpoint, versions.write_checkpoint; the server then commits it in
the index). A reply is ("ok", result) or ("error", the
child's traceback). The child exits when its stdin closes: when the server closes it, or when
the server dies (kill -9 included), so no learner outlives its server. A child that died is
started again (and initialised) by the next call; the call that found it dead raises.

  python -m gp_jax.serving.learning.process   (started by LearnerProcess, never by hand)
"""
from __future__ import annotations

import contextlib
import os

NICENESS = 19   # the learner's scheduling priority (the lowest); set before any thread starts
if __name__ == "__main__":
  with contextlib.suppress(OSError):   # not permitted: the default priority
    os.nice(NICENESS)

import pickle
import signal
import struct
import subprocess
import sys
import threading
import time
import traceback

from gp_jax import errors
from gp_jax import paths

_HEADER = struct.Struct("<Q")


class LearnerProcessError(errors.GpJaxError, RuntimeError):
  """The learner's process failed a call (its traceback is the message) or died."""


def _write(stream, message) -> None:
  data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
  stream.write(_HEADER.pack(len(data)))
  stream.write(data)
  stream.flush()


def pack(items) -> list[bytes]:
  """Each item pickled on its own, the interpreter lock handed over between items: one pickle of
  an update's episodes (many small arrays) held the lock for 7 to 28 ms in one C call, so the
  server's event loop, which needs the lock for every decision, waited that long
  (docs/serving.md, the fourth overhead look); one episode takes about 1 ms. Sending the
  pickled bytes costs a copy. The learner process unpacks them (`unpack`)."""
  out = []
  for item in items:
    out.append(pickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL))
    time.sleep(0)   # releases the lock: a waiting thread takes it now, not after 5 ms
  return out


def unpack(blobs: list[bytes]) -> list:
  return [pickle.loads(b) for b in blobs]


def _read(stream):
  head = stream.read(_HEADER.size)
  if len(head) < _HEADER.size:
    raise EOFError("the other end closed")
  (size,) = _HEADER.unpack(head)
  data = stream.read(size)
  if len(data) < size:
    raise EOFError("the other end closed mid-message")
  return pickle.loads(data)


class LearnerProcess:
  """The server's handle on its learner process (module docstring).

  Args:
    config: the served config (with any served pool event), workdir: the trained router's run,
    settings: the learning settings (online.LearnSettings).
  Calls come from one thread at a time (a lock keeps them in order).
  """

  def __init__(self, config, workdir, settings):
    self._init = dict(config=config, workdir=str(workdir), settings=settings)
    self._proc: subprocess.Popen | None = None
    self._lock = threading.Lock()

  @property
  def pid(self) -> int | None:
    return self._proc.pid if self._proc is not None else None

  def _start(self) -> None:
    env = paths.child_env()
    self._proc = subprocess.Popen(
        [sys.executable, "-m", "gp_jax.serving.learning.process"], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, env=env, cwd=str(paths.REPO_ROOT))
    self._exchange("init", self._init)

  def _exchange(self, op: str, payload):
    proc = self._proc
    try:
      _write(proc.stdin, (op, payload))
      kind, value = _read(proc.stdout)
    except (EOFError, BrokenPipeError, OSError) as e:
      self._proc = None
      try:
        code = proc.wait(timeout=10)
      except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait()
      raise LearnerProcessError(f"the learner process exited (code {code}) during {op!r}: "
                                f"{e}") from None
    if kind == "error":
      raise LearnerProcessError(f"the learner process failed {op!r}:\n{value}")
    return value

  def call(self, op: str, *args):
    """Runs `op` in the learner process (started first if it is not running) and returns its
    result. Raises LearnerProcessError when it fails there or the process dies."""
    with self._lock:
      if self._proc is None:
        self._start()
      return self._exchange(op, args)

  def close(self, timeout_s: float = 30.0) -> None:
    """Closes the child's stdin (it exits after the call in progress) and waits for it."""
    with self._lock:
      proc, self._proc = self._proc, None
    if proc is None:
      return
    with contextlib.suppress(OSError):   # already broken: the child is gone
      proc.stdin.close()
    try:
      proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait()
    proc.stdout.close()


# ---- the child -------------------------------------------------------------------------------------
def _build(config, workdir: str, settings):
  """The guarded update of the served config: its system and GARNet (the workdir's row layout)."""
  from gp_jax.runs import system as system_lib
  from gp_jax.runs import train as training
  from gp_jax.serving.learning import update as update_lib
  training.enable_compile_cache(config.compile_cache)
  system = system_lib.build(config)
  model = training.make_model(config, system.featurizer.spec,
                              layout=training.recorded_row_layout(config, workdir))
  return update_lib.GuardedUpdate(settings, config=config, system=system, model=model)


def main() -> int:
  # A stop signal to the server's process group (Ctrl-C, a service manager's SIGTERM) is the
  # server's to handle: it lets the update in progress finish, then closes the pipe.
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  signal.signal(signal.SIGTERM, signal.SIG_IGN)
  replies = os.fdopen(os.dup(sys.stdout.fileno()), "wb")   # the protocol's own stream
  os.dup2(sys.stderr.fileno(), sys.stdout.fileno())         # prints go to the server's log
  requests = sys.stdin.buffer
  import logging
  from gp_jax.serving.state import versions as versions_lib
  logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                      format="%(asctime)s learner %(levelname)s %(message)s")
  core = last = None
  while True:
    try:
      op, payload = _read(requests)
    except EOFError:   # the server closed the pipe or died
      return 0
    try:
      if op == "init":
        core, result = _build(**payload), None
      elif core is None:
        raise RuntimeError(f"{op!r} before init")
      elif op == "warm_up":
        result = core.warm_up(*payload)
      elif op == "step":   # (state, episodes, view[, anchor params])
        state, episodes, view, *anchor = payload
        result = core.step(state, unpack(episodes), view, *anchor)
        last = result["state"]
      elif op == "write":   # the last step's candidate, as an uncommitted version
        if last is None:
          raise RuntimeError("'write' before a step")
        folder, record = payload
        result = versions_lib.write_checkpoint(folder, last, record,
                                               row_dim=core.featurizer.spec.row_dim,
                                               num_hubs=core.space.size)
      else:
        raise ValueError(f"unknown op {op!r}")
      reply = ("ok", result)
    except Exception:
      reply = ("error", traceback.format_exc())
    try:
      _write(replies, reply)
    except (BrokenPipeError, OSError):   # the server is gone
      return 0


if __name__ == "__main__":
  sys.exit(main())
