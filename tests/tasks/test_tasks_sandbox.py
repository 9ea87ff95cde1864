"""The sandbox: statuses, limits, and hostile programs contained with the test process unharmed.

The hostile programs run together (two at a time) in one batch; each test then checks one of
them. Wall-clock limits are short so the batch takes a few seconds.
"""
from __future__ import annotations

import os
import pathlib
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid

import pytest

from gp_jax import errors
from gp_jax import paths
from gp_jax.tasks import sandbox as sandbox_lib

NONCE = uuid.uuid4().hex[:12]
SECRET = f"gp-jax-secret-{NONCE}"
WALL = 3.0
NPROC = 12


def _live(pid: str) -> bool:
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")  # zombies are dead
  except OSError:
    return False


def _sandbox_processes() -> list[int]:
  """Live host pids running under a sandbox uid (>= 1,000,000)."""
  out = []
  for name in os.listdir("/proc"):
    if name.isdigit():
      try:
        if os.stat(f"/proc/{name}").st_uid >= 1_000_000 and _live(name):
          out.append(int(name))
      except OSError:
        pass
  return out


def _processes_with(marker: str) -> list[int]:
  out = []
  for name in os.listdir("/proc"):
    if name.isdigit():
      try:
        with open(f"/proc/{name}/cmdline", "rb") as f:
          if marker.encode() in f.read() and _live(name):
            out.append(int(name))
      except OSError:
        pass
  return out


class _Listener:
  """A TCP server on 127.0.0.1 in the test process that records every connection."""

  def __init__(self):
    self.sock = socket.socket()
    self.sock.bind(("127.0.0.1", 0))
    self.sock.listen(8)
    self.sock.settimeout(0.2)
    self.port = self.sock.getsockname()[1]
    self.connections = 0
    self._stop = False
    self._thread = threading.Thread(target=self._serve, daemon=True)
    self._thread.start()

  def _serve(self):
    while not self._stop:
      try:
        conn, _ = self.sock.accept()
        self.connections += 1
        conn.close()
      except OSError:
        pass

  def close(self):
    self._stop = True
    self._thread.join()
    self.sock.close()


def hostile_programs(ctx) -> dict[str, str]:
  me, port, outside = os.getpid(), ctx["port"], ctx["outside"]
  escape_tmp = f"/tmp/gp_jax_escape_{NONCE}"
  return {
      "fork_bomb": "import os\nwhile True:\n  try:\n    os.fork()\n  except OSError:\n    pass\n",
      "fork_count": (
          "import os, time\nn = 0\nfor _ in range(200):\n  try:\n    pid = os.fork()\n"
          "  except OSError:\n    break\n  if pid == 0:\n    time.sleep(30)\n    os._exit(0)\n"
          "  n += 1\nprint('forked', n, flush=True)\n"),
      "subprocess_bomb": (
          "import subprocess, sys\nps = []\nfor _ in range(100):\n  try:\n"
          "    ps.append(subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']))\n"
          "  except OSError:\n    break\nprint('spawned', len(ps), flush=True)\n"),
      "thread_bomb": (
          "import threading, time\nts = []\ntry:\n  while True:\n"
          "    t = threading.Thread(target=time.sleep, args=(30,), daemon=True)\n    t.start()\n"
          "    ts.append(t)\nexcept RuntimeError:\n  print('threads', len(ts), flush=True)\n"
          "  raise\n"),
      "memory_bomb": "x = bytearray(16 * 1024 ** 3)\n",
      "memory_creep": "xs = []\nwhile True:\n  xs.append(bytearray(50 * 1024 ** 2))\n",
      "infinite_loop": "while True:\n  pass\n",
      "ignore_sigterm": ("import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                         "while True:\n  pass\n"),
      "sleep_forever": "import time\ntime.sleep(3600)\n",
      "sleeping_children": (
          "import os, subprocess\n"
          f"subprocess.Popen(['sleep', '777.{NONCE[:6]}1'])\n"
          "if os.fork() == 0:\n  os.setsid()\n  if os.fork() == 0:\n"
          f"    os.execv('/bin/sleep', ['sleep', '777.{NONCE[:6]}2'])\n  os._exit(0)\n"
          "print('parent done', flush=True)\n"),
      "write_outside": (
          "import os\nhits = []\n"
          f"for p in [{str(paths.REPO_ROOT / ('escape_' + NONCE))!r}, {escape_tmp!r},\n"
          f"          {os.path.join(outside, 'escape')!r}, '/var/tmp/escape_{NONCE}',\n"
          f"          '/dev/shm/escape_{NONCE}', os.path.expanduser('~/escape_{NONCE}')]:\n"
          "  try:\n    open(p, 'w').write('x')\n    hits.append(p)\n  except OSError:\n    pass\n"
          "open('inside.txt', 'w').write('fine')\n"
          "print('wrote', hits, os.path.exists('inside.txt'), flush=True)\n"),
      "tcp_socket": (
          "import socket\n"
          f"s = socket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('connected')\n"),
      "raw_socket_syscall": (
          # Bypasses Python's audit hook: socket(AF_INET, SOCK_STREAM) and connect via libc.
          "import ctypes, struct\nlibc = ctypes.CDLL(None, use_errno=True)\n"
          "fd = libc.socket(2, 1, 0)\n"
          f"addr = struct.pack('!HH4s8x', 2, {port}, bytes([127, 0, 0, 1]))\n"
          "addr = struct.pack('H', 2) + addr[2:]\n"
          "rc = libc.connect(fd, addr, len(addr)) if fd >= 0 else -1\n"
          "print('fd', fd, 'rc', rc, 'errno', ctypes.get_errno(), flush=True)\n"
          "assert rc != 0\n"),
      "dns_lookup": "import socket\nprint(socket.getaddrinfo('example.com', 80))\n",
      "kill_parent": (
          "import os, signal\nhits = []\n"
          f"for pid in (os.getppid(), {me}, 1, -1):\n"
          "  try:\n    os.kill(pid, signal.SIGKILL)\n    hits.append(pid)\n"
          "  except OSError:\n    pass\n"
          "print('signalled', hits, flush=True)\n"),
      "print_gigabytes": "import sys\nwhile True:\n  sys.stdout.write('x' * 65536)\n",
      "stderr_gigabytes": "import sys\nwhile True:\n  sys.stderr.write('y' * 65536)\n",
      "disk_fill": "f = open('big.bin', 'wb')\nwhile True:\n  f.write(b'z' * 1048576)\n",
      "os_exit": "import os\nos._exit(7)\nraise SystemExit(0)\n",
      "recursion_bomb": ("import sys\nsys.setrecursionlimit(10 ** 8)\n"
                         "def f(n):\n  return f(n + 1) + 1\nf(0)\n"),
      "segfault": "import ctypes\nctypes.string_at(0)\n",
      "env_secrets": (
          "import os\nout = [repr(dict(os.environ))]\n"
          f"for p in ['/proc/self/environ', '/proc/1/environ', '/proc/{me}/environ',\n"
          f"          '/proc/{me}/cmdline', '/proc/{os.getppid()}/environ']:\n"
          "  try:\n    out.append(open(p, 'rb').read().decode('latin-1'))\n"
          "  except OSError as e:\n    out.append(type(e).__name__)\n"
          "print('\\n'.join(out), flush=True)\n"),
      "privilege_escalation": "import os\nos.setuid(0)\nprint('root again')\n",
      "read_root_files": "print(open('/etc/shadow').read()[:20])\n",
      "stdin_read": "print(input())\n",
  }


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
  os.environ["GP_JAX_TEST_SECRET"] = SECRET  # set before the server starts: it must not leak
  sb = sandbox_lib.Sandbox(wall_s=WALL, cpu_s=2, memory_mb=256, max_output_bytes=64 * 1024,
                           nproc=NPROC, max_parallel=2)
  if sb.mode == "plain":
    sb.close()
    del os.environ["GP_JAX_TEST_SECRET"]
    pytest.skip("the 'plain' sandbox mode (not root, no user namespaces) cannot keep hostile "
                "programs away from the test process; run as root or enable user namespaces")
  outside = tmp_path_factory.mktemp("outside")
  listener = _Listener()
  programs = hostile_programs({"port": listener.port, "outside": str(outside)})
  if sb.mode != "namespaces":
    programs.pop("write_outside")  # it would succeed in shared folders and leave files there
  staging = lambda: set(pathlib.Path(tempfile.gettempdir()).glob("gp_jax_sandbox_*"))
  before = staging()
  try:
    start = time.monotonic()
    # The fork bomb runs alone: its processes would starve (and time out) programs beside it.
    results = {"fork_bomb": sb.run(programs.pop("fork_bomb"))}
    results.update(zip(programs, sb.run_many(list(programs.values()))))
    batch_s = time.monotonic() - start
    after = sb.run("print('still fine')")
    mode = sb.mode
  finally:
    sb.close()
    del os.environ["GP_JAX_TEST_SECRET"]
    time.sleep(0.2)
    listener.close()
  yield {"results": results, "batch_s": batch_s, "after": after, "mode": mode,
         "leftover_dirs": staging() - before,
         "listener": listener, "outside": outside, "count": len(results)}


def _need_namespaces(hostile):
  if hostile["mode"] != "namespaces":
    pytest.skip(f"needs the 'namespaces' sandbox mode (root with CAP_SYS_ADMIN); "
                f"this machine gives {hostile['mode']!r}")


# Status each hostile program must end with. "pass" only where the program itself checks that its
# attack failed or where it exits normally after starting something the sandbox must clean up.
EXPECTED = {
    "fork_bomb": {"timeout"}, "fork_count": {"pass"}, "subprocess_bomb": {"pass"},
    "thread_bomb": {"fail"}, "memory_bomb": {"fail"}, "memory_creep": {"fail"},
    "infinite_loop": {"timeout"}, "ignore_sigterm": {"timeout"}, "sleep_forever": {"timeout"},
    "sleeping_children": {"pass"}, "write_outside": {"pass"}, "tcp_socket": {"fail"},
    "raw_socket_syscall": {"pass", "fail"}, "dns_lookup": {"fail"}, "kill_parent": {"pass"},
    "print_gigabytes": {"error"}, "stderr_gigabytes": {"error"}, "disk_fill": {"error"},
    "os_exit": {"fail"}, "recursion_bomb": {"fail", "error", "timeout"}, "segfault": {"error"},
    "env_secrets": {"pass"}, "privilege_escalation": {"fail"}, "read_root_files": {"fail"},
    "stdin_read": {"fail"},
}


def test_at_least_fifteen_hostile_programs_and_sandbox_survives(hostile):
  assert hostile["count"] >= 15 and set(hostile["results"]) <= set(EXPECTED)
  for name, r in hostile["results"].items():
    assert r.status in EXPECTED[name], (name, r.status, r.detail, r.stderr[-300:])
  assert hostile["after"].status == "pass" and hostile["after"].stdout == "still fine\n"
  # Every program ended by its wall-clock limit (plus scheduling slack).
  assert all(r.wall_s <= WALL + 1.0 for r in hostile["results"].values())


def test_machine_unharmed(hostile):
  assert os.getpid() > 0 and subprocess.run(["true"], timeout=10).returncode == 0
  assert _sandbox_processes() == []
  assert _processes_with(f"777.{NONCE[:6]}") == []
  assert hostile["leftover_dirs"] == set()  # every run's staging folder was removed


@pytest.mark.parametrize("name", ["fork_bomb", "infinite_loop", "ignore_sigterm",
                                  "sleep_forever"])
def test_runaway_programs_time_out(hostile, name):
  r = hostile["results"][name]
  assert r.status == "timeout", (r.detail, r.stderr[-300:])


def test_process_limits(hostile):
  res = hostile["results"]
  forked = int(res["fork_count"].stdout.split()[1])
  assert 0 < forked < NPROC
  spawned = int(res["subprocess_bomb"].stdout.split()[1])
  assert spawned < NPROC
  assert res["thread_bomb"].status == "fail"
  assert int(res["thread_bomb"].stdout.split()[1]) < NPROC


@pytest.mark.parametrize("name", ["memory_bomb", "memory_creep"])
def test_memory_limit(hostile, name):
  r = hostile["results"][name]
  assert r.status == "fail" and "MemoryError" in r.stderr


def test_children_killed_when_program_exits(hostile):
  r = hostile["results"]["sleeping_children"]
  assert r.status == "pass" and "parent done" in r.stdout
  assert r.wall_s < WALL  # the sandbox did not wait for the sleepers
  assert _processes_with(f"777.{NONCE[:6]}") == []


def test_writes_stay_inside(hostile):
  _need_namespaces(hostile)  # without them /tmp is shared (and, not root, so are the user's files)
  r = hostile["results"]["write_outside"]
  assert r.status == "pass" and r.stdout.strip().endswith("True")
  for p in [paths.REPO_ROOT / f"escape_{NONCE}", pathlib.Path(f"/tmp/gp_jax_escape_{NONCE}"),
            hostile["outside"] / "escape", pathlib.Path(f"/var/tmp/escape_{NONCE}"),
            pathlib.Path(f"/dev/shm/escape_{NONCE}"), pathlib.Path.home() / f"escape_{NONCE}"]:
    assert not p.exists(), p


@pytest.mark.parametrize("name", ["tcp_socket", "dns_lookup"])
def test_no_network_from_python(hostile, name):
  r = hostile["results"][name]
  assert r.status == "fail" and "PermissionError" in r.stderr
  assert hostile["listener"].connections == 0


def test_no_network_below_python(hostile):
  _need_namespaces(hostile)
  r = hostile["results"]["raw_socket_syscall"]
  assert r.status == "pass", r.stderr  # the program asserts that connect() failed
  assert hostile["listener"].connections == 0


def test_cannot_kill_parent(hostile):
  r = hostile["results"]["kill_parent"]
  assert r.status == "pass", r.stderr
  hits = r.stdout.split("signalled", 1)[1].strip()
  assert str(os.getpid()) not in hits and str(os.getppid()) not in hits


@pytest.mark.parametrize("name", ["print_gigabytes", "stderr_gigabytes", "disk_fill"])
def test_output_and_file_caps(hostile, name):
  r = hostile["results"][name]
  assert r.status == "error" and "size limit" in r.detail
  assert len(r.stdout.encode()) <= 64 * 1024 and len(r.stderr.encode()) <= 64 * 1024


def test_crashes_are_errors(hostile):
  res = hostile["results"]
  assert res["os_exit"].status == "fail" and res["os_exit"].exit_code == 7
  assert not res["recursion_bomb"].passed
  assert res["segfault"].signal == signal.SIGSEGV


def test_secrets_and_privileges(hostile):
  res = hostile["results"]
  text = res["env_secrets"].stdout + res["env_secrets"].stderr
  assert res["env_secrets"].status == "pass" and SECRET not in text
  assert "GP_JAX_TEST_SECRET" not in text
  assert res["privilege_escalation"].status == "fail"
  assert "PermissionError" in res["privilege_escalation"].stderr
  assert res["read_root_files"].status == "fail"
  assert res["stdin_read"].status == "fail" and "EOFError" in res["stdin_read"].stderr


def test_basic_statuses(sandbox):
  ok, bad, exc, exit3 = sandbox.run_many([
      "print('hi')", "assert 1 == 2", "raise ValueError('boom')", "import sys; sys.exit(3)"])
  assert (ok.status, ok.stdout, ok.exit_code) == ("pass", "hi\n", 0)
  assert bad.status == "fail" and "AssertionError" in bad.stderr
  assert exc.status == "fail" and "ValueError: boom" in exc.stderr
  assert exit3.status == "fail" and exit3.exit_code == 3
  r = sandbox.run("import helper; print(helper.X)", files={"helper.py": "X = 41 + 1"})
  assert r.stdout == "42\n"
  r = sandbox.run("import os; print(sorted(os.environ))")
  assert r.stdout.strip() == "['HOME', 'LANG', 'PATH', 'PYTHONHASHSEED', 'TMPDIR']"
  r = sandbox.run("import os\nprint(os.getuid() != 0 or os.geteuid() != 0)")
  if os.geteuid() == 0:
    assert r.stdout == "True\n"  # never root inside


def test_fresh_directory_per_run(sandbox):
  a, b = sandbox.run_many(["open('mark', 'w').write('1'); import os; print(os.listdir('.'))",
                           "import os; print(sorted(os.listdir('.')))"])
  assert a.status == b.status == "pass"
  assert b.stdout == "['main.py']\n"


def test_uid_mode_contains_fork_bomb_and_children():
  if os.geteuid() != 0:
    pytest.skip("the 'uid' mode needs root")
  marker = f"555.{NONCE[:6]}"
  with sandbox_lib.Sandbox(mode="uid", wall_s=2.0, cpu_s=1, memory_mb=256, nproc=8,
                           max_parallel=2) as sb:
    assert sb.mode == "uid"
    bomb = sb.run("import os\nwhile True:\n  try:\n    os.fork()\n  except OSError:\n    pass\n")
    kids, count = sb.run_many([
        f"import os\nif os.fork() == 0:\n  os.setsid()\n  os.execv('/bin/sleep', ['sleep', "
        f"'{marker}'])\nprint('done')\n",
        "import os, time\nn = 0\nfor _ in range(100):\n  try:\n    pid = os.fork()\n"
        "  except OSError:\n    break\n  if pid == 0:\n    time.sleep(20)\n    os._exit(0)\n"
        "  n += 1\nprint(n)\n"])
  assert bomb.status == "timeout"
  assert kids.status == "pass" and _processes_with(marker) == []
  assert int(count.stdout) < 8
  assert _sandbox_processes() == []


STDLIB_SOLUTION = """import base64, csv, difflib, io, queue, zlib
q = queue.Queue()
q.put(base64.b64encode(zlib.compress(b"abc")).decode())
rows = list(csv.reader(io.StringIO("a,b\\n1,2\\n")))
print(zlib.decompress(base64.b64decode(q.get())).decode(), rows[1],
      round(difflib.SequenceMatcher(None, "abcd", "abed").ratio(), 2))
"""


def test_standard_library_imports_in_every_supported_mode():
  # As root the uid mode must work even when Python lives under a folder the sandbox uid cannot
  # enter (here /root/.pyenv under a 0700 /root); the other modes where the machine has them.
  ran = {}
  for mode in ("namespaces", "uid", "userns", "plain"):
    try:
      with sandbox_lib.Sandbox(mode=mode, wall_s=10.0, max_parallel=1) as sb:
        ran[mode] = sb.run(STDLIB_SOLUTION)
    except errors.ConfigError as e:   # the mode is not available on this machine
      assert "could not start" in str(e) and "needs" in str(e)
  for mode, r in ran.items():
    assert r.status == "pass", (mode, r.stderr)
    assert r.stdout == "abc ['1', '2'] 0.75\n", mode
  assert ("uid" in ran) == (os.geteuid() == 0)
  assert len(ran) >= 2 if os.geteuid() == 0 else ran


def test_bad_configuration():
  with pytest.raises(errors.ConfigError, match="unknown sandbox mode"):
    sandbox_lib.Sandbox(mode="docker")
  with pytest.raises(errors.ConfigError, match="must be positive"):
    sandbox_lib.Sandbox(wall_s=0)


def test_server_death_is_reported_and_recovered():
  with sandbox_lib.Sandbox(wall_s=10.0, max_parallel=2) as sb:
    assert sb.run("print(1)").passed
    waits = [sb._submit("import time; time.sleep(8)", None, None, None)]
    time.sleep(0.5)
    sb._proc.kill()  # the fork server dies while a program runs
    r = waits[0]()
    assert r.status == "error" and "exited" in r.detail
    assert sb.run("print(2)").stdout == "2\n"  # a new server starts on demand


def test_extra_file_names_stay_inside(sandbox):
  for name in ("../escape.py", "/etc/x", "a/../../b", "main.py"):
    with pytest.raises(errors.ConfigError, match="relative path inside"):
      sandbox.run("pass", files={name: "x"})
