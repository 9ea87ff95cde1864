"""Permissions against a real server process (experiments/serve_router.py on the simulator, one
process for the module): /health says only up or down to anyone but an admin, a chat-only key
(`"feedback": false`) is refused feedback without touching the memory, keys are reloaded on
SIGHUP and when the keys file changes (a revoked key is refused on its next request, a malformed
file keeps the keys in force), and a Host name other than loopback without keys is refused at
start. The same rules in process, faster: tests/serving/test_auth.py."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from experiments import serve_router_process as process
from gp_jax import paths
from gp_jax.serving.http import auth
from tests.util import http_client

KEYS = {"alice": ("sk-alice-41c2", "client"), "bob": ("sk-bob-9e07", "client"),
        "carol": ("sk-carol-5a1d", "client"), "kiosk": ("sk-kiosk-77b3", "client", False),
        "ops": ("sk-ops-0d6f", "admin")}
QUERY = "What is the capital of Australia?"
RELOADED, NOT_RELOADED = "keys file reloaded: ", "keys file not reloaded, "


def _keys_json(names) -> str:
  return json.dumps({"keys": [
      {"name": n, "sha256": auth.key_digest(KEYS[n][0]), "role": KEYS[n][1],
       **({"feedback": KEYS[n][2]} if len(KEYS[n]) > 2 else {})} for n in names]})


@pytest.fixture(scope="module")
def served(workdir, tmp_path_factory):
  """The server with every key of KEYS; yields (RouterProcess, its keys file)."""
  state = tmp_path_factory.mktemp("permissions")
  keys = state / "keys.json"
  keys.write_text(_keys_json(KEYS))
  srv = process.RouterProcess(
      [f"--workdir={workdir}", f"--memory_path={state / 'memory.npz'}",
       f"--api_keys_file={keys}"], state / "server.log").start()
  yield srv, keys
  srv.stop()


def _http(srv, method: str, path: str, body: dict | None = None, key: str | None = None):
  """(status, parsed JSON body) of one request; `key`: a name of KEYS, or a raw key."""
  status, _, got = http_client.request(srv.url, method, path, body,
                                       bearer=(KEYS[key][0] if key in KEYS else key) if key else None)
  return status, got


def _chat(srv, key: str) -> str:
  status, out = _http(srv, "POST", "/v1/chat/completions",
                      {"model": "graphplanner", "messages": [{"role": "user", "content": QUERY}]},
                      key)
  assert status == 200, out
  return out["id"]


def _log_count(srv, text: str) -> int:
  return srv.log_path.read_text(errors="replace").count(text)


def _sighup_and_wait(srv, text: str, before: int) -> None:
  """Sends SIGHUP and waits until the server's log has one more line with `text`."""
  os.kill(srv.proc.pid, signal.SIGHUP)
  deadline = time.monotonic() + 20
  while _log_count(srv, text) <= before:
    assert srv.proc.poll() is None, srv.log_tail()
    assert time.monotonic() < deadline, f"no {text!r} line after SIGHUP:\n{srv.log_tail()}"
    time.sleep(0.05)


def _rewrite_same_stamp(path, content: str) -> None:
  """Writes `content` in place, padded to the file's size, and restores its mtime: the file's
  stamp (auth.file_stamp) is unchanged, so only SIGHUP (not the file poll) can reload it."""
  st = os.stat(path)
  data = content.encode()
  assert len(data) <= st.st_size
  with open(path, "r+b") as f:
    f.write(data + b" " * (st.st_size - len(data)))
  os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
  assert auth.file_stamp(path) == (st.st_mtime_ns, st.st_size, st.st_ino)


def test_health_is_up_or_down_for_clients_and_detailed_for_admins(served):
  srv, _ = served
  for key in (None, "alice", "kiosk", "sk-wrong"):
    assert _http(srv, "GET", "/health", key=key) == (200, {"status": "ok"}), key
  status, h = _http(srv, "GET", "/health", key="ops")
  assert status == 200 and h["status"] == "ok"
  assert {"counters", "memory", "workdir", "router", "decisions"} <= set(h), h


def test_a_chat_only_key_chats_but_its_feedback_is_refused(served):
  srv, _ = served
  rid = _chat(srv, "kiosk")
  _, mem0 = _http(srv, "GET", "/v1/memory", key="ops")
  status, out = _http(srv, "POST", "/v1/feedback", {"id": rid, "score": 1.0}, "kiosk")
  assert status == 403 and out == {"error": {
      "message": "this API key may chat but not send feedback", "type": "permission_error",
      "param": None, "code": "permission_denied"}}
  _, mem1 = _http(srv, "GET", "/v1/memory", key="ops")
  assert (mem1["rows"], mem1["feedback"], mem1["seq"]) == (mem0["rows"], mem0["feedback"],
                                                            mem0["seq"])
  assert "kiosk" not in mem1["per_key"]
  _, routes = _http(srv, "GET", "/v1/routes?after=0", key="ops")
  (rec,) = [r for r in routes["data"] if r["id"] == rid]
  assert rec["key"] == "kiosk" and rec.get("score") is None
  # The completion itself could take feedback: an admin's is stored.
  status, out = _http(srv, "POST", "/v1/feedback", {"id": rid, "score": 1.0}, "ops")
  assert status == 200, out
  assert _http(srv, "GET", "/v1/memory", key="ops")[1]["feedback"] == mem0["feedback"] + 1


def test_sighup_revokes_a_key_for_its_next_request(served):
  srv, keys = served
  assert _http(srv, "GET", "/v1/models", key="carol")[0] == 200
  before = _log_count(srv, RELOADED)
  _rewrite_same_stamp(keys, _keys_json([n for n in KEYS if n != "carol"]))
  assert _http(srv, "GET", "/v1/models", key="carol")[0] == 200   # not read yet: no poll saw it
  _sighup_and_wait(srv, RELOADED, before)
  status, out = _http(srv, "GET", "/v1/models", key="carol")
  assert status == 401 and out["error"]["code"] == "invalid_api_key"
  assert _http(srv, "GET", "/v1/models", key="alice")[0] == 200
  assert _http(srv, "GET", "/health", key="ops")[1]["status"] == "ok"


def test_a_malformed_keys_file_on_sighup_keeps_the_keys_in_force(served):
  srv, keys = served
  good = keys.read_text()
  for broken in ('{"keys": [{"name": "alice", ', '{"keys": []}'):
    before = _log_count(srv, NOT_RELOADED)
    _rewrite_same_stamp(keys, broken)
    _sighup_and_wait(srv, NOT_RELOADED, before)
    assert srv.proc.poll() is None
    assert _http(srv, "GET", "/v1/models", key="alice")[0] == 200
    assert _http(srv, "GET", "/health", key="ops")[1]["status"] == "ok"
    lines = [ln for ln in srv.log_tail(200).splitlines() if NOT_RELOADED in ln]
    assert str(keys) in lines[-1], lines[-1]
  before = _log_count(srv, RELOADED)
  keys.write_text(good)   # a changed stamp: the poll reads it back (the next test starts clean)
  deadline = time.monotonic() + 15
  while _log_count(srv, RELOADED) <= before:
    assert time.monotonic() < deadline, srv.log_tail()
    time.sleep(0.05)


def test_a_changed_keys_file_is_followed_without_a_signal(served):
  """The server polls the keys file (gate.KEYS_POLL_S, 2 s): an edit alone revokes a key."""
  srv, keys = served
  assert _http(srv, "GET", "/v1/models", key="bob")[0] == 200
  keys.write_text(_keys_json([n for n in KEYS if n not in ("bob", "carol")]))
  deadline = time.monotonic() + 15
  while _http(srv, "GET", "/v1/models", key="bob")[0] != 401:
    assert time.monotonic() < deadline, srv.log_tail()
    time.sleep(0.1)
  assert _http(srv, "GET", "/v1/models", key="alice")[0] == 200


def test_allowed_hosts_beyond_loopback_without_keys_are_refused_at_start(tmp_path):
  """One error line and exit status 2, before the router loads (other names and `*`:
  test_auth.test_bind_and_host_checks)."""
  out = subprocess.run([sys.executable, "-m", "experiments.serve_router", "--port=0",
                        f"--workdir={tmp_path}", "--allowed_hosts=localhost,router.example.com"],
                       cwd=paths.REPO_ROOT, capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(paths.REPO_ROOT)))
  assert out.returncode == 2, out.stderr
  lines = out.stderr.strip().splitlines()
  assert [ln for ln in lines if ln.startswith("error:")] == [lines[-1]], lines
  assert lines[-1].startswith("error: --allowed_hosts=router.example.com without "
                              "--api_keys_file"), lines
  assert "Traceback" not in out.stderr
