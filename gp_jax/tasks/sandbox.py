"""A sandbox for model-written Python: run a program, get pass / fail / timeout / error.

Programs run in a fork server (`_sandbox_server.py`, one per Sandbox) started with
`python -I -S -B` and a scrubbed environment, so each program costs a fork, not an interpreter
start. Every program gets:
  * its own session/process group, and -- where the kernel allows -- its own mount, network, PID,
    IPC and UTS namespaces. A small init (root, PID 1 of the namespace) runs the program as PID 2
    and reports its exit status; when the program exits or the wall clock runs out, that init
    exits and the kernel kills every process the program started (sleeping children, daemons,
    fork bombs). The program is not PID 1 itself because the kernel ignores default-action
    signals sent to a namespace init, which would disarm the CPU and file-size limits;
  * no network: an empty network namespace (no usable interface), plus an audit hook that refuses
    to create sockets or resolve names before the program starts;
  * a fresh working directory on a size-capped tmpfs (with private /tmp, /var/tmp, /dev/shm that
    vanish afterwards), or a fresh temporary directory without namespaces. The interpreter's
    prefix is bind-mounted read-only at /tmp/.sandbox-python so that the standard library stays
    importable when it lives under a directory the sandbox uid cannot enter (e.g. /root/.pyenv);
    in "uid" mode the program reaches it through a directory descriptor opened before the uid
    changed (/proc/self/fd/3), and the mode is refused when even that cannot read it;
  * as root: a uid of its own (never 0) with no groups and no_new_privs. That makes RLIMIT_NPROC
    effective (the kernel does not apply it to root), so a fork bomb stops at `nproc` processes;
    the program cannot signal or trace the caller, nor write files it does not own;
  * rlimits: address space (`memory_mb`), CPU seconds, file size (= `max_output_bytes`, which also
    caps stdout/stderr, written to files), 64 open files, no core dumps;
  * a wall-clock limit enforced by its monitor, which kills the whole program (namespace, or
    process group plus every process of its uid) on expiry;
  * an environment of PATH, HOME, TMPDIR, LANG and PYTHONHASHSEED only; stdin is /dev/null.

`Sandbox.mode` says which set applied: "namespaces" (root with CAP_SYS_ADMIN: everything above),
"uid" (root without namespaces: no private /tmp, so the program can leave files in
world-writable folders; network blocked only by the audit hook),
"userns" (not root, unprivileged user namespaces: namespaces but the caller's uid, so RLIMIT_NPROC
counts the caller's processes too) or "plain" (not root: rlimits, process group and audit hook
only; such a program could signal the caller's processes and write where the caller can).

Not isolated: CPU share and total memory across processes. A fork bomb's `nproc` processes
compete for the CPU with programs running next to it until its wall clock runs out, and each of
its processes may use `memory_mb` (cgroups would bound both; they are not used).
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent import futures
from typing import Sequence

from gp_jax import errors

PASS, FAIL, TIMEOUT, ERROR = "pass", "fail", "timeout", "error"
_SERVER = pathlib.Path(__file__).with_name("_sandbox_server.py")
_MODES = ("auto", "namespaces", "uid", "userns", "plain")
_MODE_NEEDS = {
    "auto": "root needs CAP_SYS_ADMIN or a standard library another uid can read; "
            "non-root needs nothing",
    "namespaces": "needs root with CAP_SYS_ADMIN",
    "uid": "needs root, and the interpreter's standard library readable by another uid "
           "through a descriptor opened as root",
    "userns": "needs unprivileged user namespaces",
    "plain": "needs only a working fork",
}


@dataclasses.dataclass(frozen=True)
class SandboxResult:
  """Outcome of one program.

  Attributes:
    status: "pass" (exit status 0), "fail" (non-zero exit: exception, failed assert, exit(n)),
      "timeout" (wall-clock or CPU limit) or "error" (killed by a signal, output/file limit,
      sandbox failure).
    exit_code: exit status, or None when killed by a signal.
    signal: the killing signal number, or None.
    stdout: captured standard output (at most max_output_bytes, decoded leniently).
    stderr: captured standard error (same cap).
    wall_s: wall-clock seconds the program ran.
    detail: one line explaining a non-pass status.
  """
  status: str
  exit_code: int | None
  signal: int | None
  stdout: str
  stderr: str
  wall_s: float
  detail: str

  @property
  def passed(self) -> bool:
    return self.status == PASS


class Sandbox:
  """Runs untrusted Python programs in isolation; thread-safe; one fork server per instance.

  Args:
    wall_s: default wall-clock limit per program, seconds.
    cpu_s: default CPU-time limit per process, seconds (default: ceil(wall_s)).
    memory_mb: address-space limit per process, MiB.
    max_output_bytes: cap on stdout and stderr each, and on any file the program writes.
    nproc: most processes/threads the program may have at once.
    tmpfs_mb: size of the private /tmp holding the working directory (namespaces modes).
    max_parallel: programs run at once (default: number of CPUs).
    mode: "auto" (strongest available) or one of "namespaces", "uid", "userns", "plain".
  """

  def __init__(self, *, wall_s: float = 10.0, cpu_s: int | None = None, memory_mb: int = 512,
               max_output_bytes: int = 1 << 20, nproc: int = 16, tmpfs_mb: int = 64,
               max_parallel: int | None = None, mode: str = "auto"):
    if mode not in _MODES:
      raise errors.unknown_name("sandbox mode", mode, _MODES)
    if wall_s <= 0 or memory_mb < 64 or max_output_bytes < 1024 or nproc < 1 or tmpfs_mb < 1:
      raise errors.ConfigError(
          "sandbox limits must be positive (wall_s > 0, memory_mb >= 64, "
          "max_output_bytes >= 1024, nproc >= 1, tmpfs_mb >= 1)")
    self.wall_s = float(wall_s)
    self.cpu_s = int(cpu_s) if cpu_s is not None else max(1, int(-(-wall_s // 1)))
    self.memory_mb = int(memory_mb)
    self.max_output_bytes = int(max_output_bytes)
    self.nproc = int(nproc)
    self.tmpfs_mb = int(tmpfs_mb)
    self.max_parallel = int(max_parallel or os.cpu_count() or 1)
    self._requested_mode = mode
    self._lock = threading.Lock()
    self._slots = threading.BoundedSemaphore(self.max_parallel)
    self._ids = itertools.count()
    self._proc: subprocess.Popen | None = None
    self._pending: dict[int, futures.Future] = {}
    self._mode: str | None = None
    self._closed = False

  # -- server lifecycle -------------------------------------------------------------------------

  @property
  def mode(self) -> str:
    """The isolation mode in force (starts the server if needed)."""
    with self._lock:
      self._ensure_server()
      return self._mode

  def _ensure_server(self):
    if self._closed:
      raise errors.ConfigError("sandbox is closed")
    if self._proc is not None and self._proc.poll() is None:
      return
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", "-B", str(_SERVER), self._requested_mode],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
        cwd="/", start_new_session=True, close_fds=True)
    hello = _read_line_with_timeout(proc.stdout, 30.0)
    try:
      info = json.loads(hello) if hello else {}
    except ValueError:
      info = {}
    if not info.get("hello") or not info.get("mode"):
      proc.kill()
      proc.wait()
      raise errors.ConfigError(
          f"sandbox could not start in mode {self._requested_mode!r} on this machine "
          f"({_MODE_NEEDS.get(self._requested_mode, '')})")
    self._proc = proc
    self._mode = info["mode"]
    threading.Thread(target=self._read_results, args=(proc,), daemon=True,
                     name="sandbox-results").start()

  def _read_results(self, proc):
    for raw in proc.stdout:
      try:
        res = json.loads(raw)
      except ValueError:
        continue
      with self._lock:
        fut = self._pending.pop(res.get("id"), None)
      if fut is not None and not fut.done():
        fut.set_result(res)
    # Server gone: fail whatever was still waiting on it.
    with self._lock:
      stranded = [f for f in self._pending.values()]
      self._pending.clear()
    for fut in stranded:
      if not fut.done():
        fut.set_result({"status": ERROR, "detail": "sandbox server exited"})

  def _restart(self):
    with self._lock:
      proc, self._proc = self._proc, None
    if proc is not None:
      _stop(proc)

  def close(self):
    """Stops the server; running programs are killed."""
    with self._lock:
      self._closed = True
      proc, self._proc = self._proc, None
    if proc is not None:
      _stop(proc)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()

  def __del__(self):
    try:
      self.close()
    except Exception:  # interpreter shutdown: nothing left to clean up reliably.
      pass

  # -- running programs -------------------------------------------------------------------------

  def run(self, source: str, *, files: dict[str, str] | None = None,
          wall_s: float | None = None, cpu_s: int | None = None) -> SandboxResult:
    """Runs one program (`source` as main.py, plus optional extra files) and waits for it."""
    return self._submit(source, files, wall_s, cpu_s)()

  def run_many(self, sources: Sequence[str], *, wall_s: float | None = None,
               cpu_s: int | None = None) -> list[SandboxResult]:
    """Runs many programs, up to `max_parallel` at once; results in input order."""
    waits = [self._submit(src, None, wall_s, cpu_s) for src in sources]
    return [w() for w in waits]

  def _submit(self, source, files, wall_s, cpu_s):
    wall = float(wall_s if wall_s is not None else self.wall_s)
    cpu = int(cpu_s if cpu_s is not None else (self.cpu_s if wall_s is None
                                               else max(1, int(-(-wall // 1)))))
    all_files = dict(files or {})
    for name in all_files:
      parts = pathlib.PurePosixPath(name).parts
      if not parts or name.startswith("/") or ".." in parts or name == "main.py":
        raise errors.ConfigError(f"sandbox file name {name!r} must be a relative path inside "
                                 "the working directory (and not main.py)")
    all_files["main.py"] = source
    outdir = tempfile.mkdtemp(prefix="gp_jax_sandbox_")
    os.chmod(outdir, 0o711)  # traversable (not listable) by the sandbox uid.
    self._slots.acquire()
    fut: futures.Future = futures.Future()
    try:
      with self._lock:
        self._ensure_server()
        rid = next(self._ids)
        self._pending[rid] = fut
        req = {"id": rid, "files": all_files, "entry": "main.py", "wall_s": wall,
               "cpu_s": cpu, "memory_mb": self.memory_mb, "output_bytes": self.max_output_bytes,
               "nproc": self.nproc, "tmpfs_mb": self.tmpfs_mb, "outdir": outdir}
        self._proc.stdin.write((json.dumps(req) + "\n").encode())
        self._proc.stdin.flush()
    except (OSError, ValueError) as e:
      with self._lock:
        self._pending.pop(locals().get("rid"), None)
      fut.set_result({"status": ERROR, "detail": f"sandbox unavailable: {e}"})
    except BaseException:
      self._slots.release()
      shutil.rmtree(outdir, ignore_errors=True)
      raise
    fut.add_done_callback(lambda _: self._slots.release())
    started = time.monotonic()

    def wait() -> SandboxResult:
      grace = wall + 15.0
      try:
        res = fut.result(timeout=max(0.0, grace - (time.monotonic() - started)))
      except futures.TimeoutError:
        # The monitor enforces the wall clock; no answer by now means the server is stuck.
        self._restart()
        res = {"status": ERROR, "detail": "sandbox server did not answer"}
      try:
        out = _read_capped(os.path.join(outdir, "stdout"), self.max_output_bytes)
        err = _read_capped(os.path.join(outdir, "stderr"), self.max_output_bytes)
      finally:
        shutil.rmtree(outdir, ignore_errors=True)
      return SandboxResult(status=res.get("status", ERROR), exit_code=res.get("exit_code"),
                           signal=res.get("signal"), stdout=out, stderr=err,
                           wall_s=float(res.get("wall_s", 0.0)), detail=res.get("detail", ""))
    return wait


def _read_capped(path: str, cap: int) -> str:
  try:
    with open(path, "rb") as f:
      return f.read(cap).decode("utf-8", errors="replace")
  except OSError:
    return ""


def _read_line_with_timeout(stream, timeout: float) -> bytes:
  box: list[bytes] = []
  t = threading.Thread(target=lambda: box.append(stream.readline()), daemon=True)
  t.start()
  t.join(timeout)
  return box[0] if box else b""


def _stop(proc: subprocess.Popen):
  try:
    proc.stdin.close()  # the server exits on EOF; its monitors die with it (PDEATHSIG).
  except OSError:
    pass
  try:
    proc.wait(timeout=5)
  except subprocess.TimeoutExpired:
    proc.kill()
    proc.wait()


_DEFAULT: Sandbox | None = None
_DEFAULT_LOCK = threading.Lock()


def default_sandbox() -> Sandbox:
  """The process-wide sandbox used by the code metrics (created on first use)."""
  global _DEFAULT
  with _DEFAULT_LOCK:
    if _DEFAULT is None:
      _DEFAULT = Sandbox()
    return _DEFAULT
