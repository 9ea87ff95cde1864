"""Crashes against the real server process (experiments/serve_router.py via RouterProcess): two
servers on one workdir, a torn route log, a flipped journal byte, a failed fsync, kill -9 under
load. Each counts the acknowledged feedback before and after."""
import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

from experiments import serve_router_process as process
from experiments.configs import test as test_config
from gp_jax import paths
from gp_jax.serving.engine import config as served_config
from gp_jax.serving.state import journal as journal_lib
from gp_jax.serving.state import route_log as route_log_lib

QUERY = "Which planet in the solar system has the most moons?"


def _http(url, path, body=None, timeout=60):
  """(status, parsed JSON body) of one request (POST when a body is given)."""
  data = json.dumps(body).encode() if body is not None else None
  req = urllib.request.Request(url + path, data=data, headers={"Content-Type": "application/json"})
  try:
    with urllib.request.urlopen(req, timeout=timeout) as r:
      return r.status, json.loads(r.read())
  except urllib.error.HTTPError as e:
    return e.code, json.loads(e.read() or b"null")


def _complete(url, text) -> dict:
  status, body = _http(url, "/v1/chat/completions",
                       {"model": "graphplanner", "messages": [{"role": "user", "content": text}]})
  assert status == 200, body
  return body


def _server(workdir, state, log_name, *extra) -> process.RouterProcess:
  return process.RouterProcess([f"--workdir={workdir}", f"--memory_path={state / 'memory.npz'}",
                                *extra], state / log_name)


def _run_runner(workdir, state, *extra) -> subprocess.CompletedProcess:
  """The runner started to completion (for starts that must fail)."""
  return subprocess.run([sys.executable, "-m", "experiments.serve_router", f"--workdir={workdir}",
                         f"--memory_path={state / 'memory.npz'}", "--port=0", *extra],
                        cwd=paths.REPO_ROOT, capture_output=True, text=True, timeout=300,
                        env=dict(os.environ, PYTHONPATH=str(paths.REPO_ROOT)))


def _one_error_line(out: subprocess.CompletedProcess) -> str:
  assert out.returncode == 2, out.stderr
  errs = [l for l in out.stderr.splitlines() if l.startswith("error:")]
  assert len(errs) == 1 and out.stderr.strip().splitlines()[-1] == errs[0], out.stderr
  return errs[0]


def _stored_feedback(state) -> list[str]:
  """Ids of the feedback the stopped server's files hold (base, then journal), in order."""
  F = 2 * test_config.get_config().model.mem_proj + 3
  c = test_config.get_config()
  mf = journal_lib.MemoryFile(state / "memory.npz", row_dim=F,
                              num_hubs=len(c.roles.split(",")) * len(c.llms.split(",")))
  _, _, header, feedback = mf.load()
  return list(header.get("feedback_ids", [])) + [fb.rid for fb in feedback]


def test_a_second_server_on_the_same_files_is_refused(workdir, tmp_path):
  with _server(workdir, tmp_path, "first.log") as first:
    c = _complete(first.url, QUERY)
    assert _http(first.url, "/v1/feedback", {"id": c["id"], "score": 1.0})[0] == 200
    line = _one_error_line(_run_runner(workdir, tmp_path))
    assert "in use by another router server" in line and str(tmp_path) in line
    # The first one is untouched and keeps serving.
    assert _http(first.url, "/v1/memory")[1]["feedback"] == 1
    assert _complete(first.url, QUERY + " again")["choices"]


def test_a_torn_route_log_line_does_not_swallow_the_next_record(workdir, tmp_path):
  with _server(workdir, tmp_path, "a.log") as srv:
    before = _complete(srv.url, QUERY)
    srv.stop(signal.SIGKILL)
  log = tmp_path / "routes.jsonl"
  with open(log, "a") as f:   # killed mid-append: half a line at the end
    f.write('{"type": "route", "id": "chatcmpl-torn", "query": "half a li')
  with _server(workdir, tmp_path, "b.log") as srv:
    after = _complete(srv.url, QUERY + " (after the tear)")
    for c in (after, before):
      assert _http(srv.url, "/v1/feedback", {"id": c["id"], "score": 0.5})[0] == 200
    srv.stop(signal.SIGKILL)
  with _server(workdir, tmp_path, "c.log") as srv:
    ids = [r["id"] for r in _http(srv.url, "/v1/routes?after=0")[1]["data"]]
    assert ids == [before["id"], after["id"]]
    assert _http(srv.url, "/v1/memory")[1]["feedback"] == 2
    for c in (after, before):   # their feedback is recorded: a second one is refused
      assert _http(srv.url, "/v1/feedback", {"id": c["id"], "score": 1.0})[0] == 409
  assert "chatcmpl-torn" not in log.read_text()
  recs = list(route_log_lib.read_log(log))
  assert [r["type"] for r in recs] == ["route", "route", "feedback", "feedback"]
  assert [r["seq"] for r in recs] == [1, 2, 3, 4]


def test_removed_route_segments_then_restart(workdir, tmp_path):
  """An operator removes the oldest route-log segment of a stopped server: the restarted server
  still finds every other completion (their feedback is accepted), the removed ones are unknown
  (404), and new completions never reuse a seq."""
  small = "--route_log_segment_bytes=3000"   # a route record or two per segment
  with _server(workdir, tmp_path, "a.log", small) as srv:
    served = [_complete(srv.url, f"{QUERY} #{i}") for i in range(4)]
    old_seqs = [r["seq"] for r in _http(srv.url, "/v1/routes?after=0")[1]["data"]]
  log = tmp_path / "routes.jsonl"
  segments = route_log_lib.log_segments(log)
  assert len(segments) >= 3
  removed = {rec["id"] for rec, _, _ in route_log_lib.read_segment(segments[0])}
  assert removed and len(removed & {c["id"] for c in served}) < len(served)
  segments[0].unlink()
  with _server(workdir, tmp_path, "b.log", small) as srv:
    for c in served:
      want = 404 if c["id"] in removed else 200
      assert _http(srv.url, "/v1/feedback", {"id": c["id"], "score": 1.0})[0] == want, c["id"]
    new = _complete(srv.url, QUERY + " (after the removal)")
    listed = _http(srv.url, "/v1/routes?after=0")[1]["data"]
    assert [r["id"] for r in listed] == [c["id"] for c in served if c["id"] not in removed] + [
        new["id"]]
    assert listed[-1]["seq"] > max(old_seqs)
  assert "error:" in _one_error_line(_run_runner(workdir, tmp_path, "--route_retention=7 days"))


def test_a_flipped_journal_byte_stops_the_start_with_one_error(workdir, tmp_path):
  with _server(workdir, tmp_path, "a.log") as srv:
    ids = []
    for i in range(3):
      c = _complete(srv.url, f"{QUERY} #{i}")
      assert _http(srv.url, "/v1/feedback", {"id": c["id"], "score": 1.0})[0] == 200
      ids.append(c["id"])
    srv.stop(signal.SIGKILL)   # no clean stop: the journal keeps its 3 records
  journal = tmp_path / "memory.npz.journal"
  data = bytearray(journal.read_bytes())
  second = journal_lib._HEAD.size + journal_lib._HEAD.unpack_from(data)[2]
  data[second + journal_lib._HEAD.size + 100] ^= 0x01   # one bit in record 2's payload
  journal.write_bytes(bytes(data))
  line = _one_error_line(_run_runner(workdir, tmp_path))
  assert str(journal) in line and "record 2" in line and f"byte offset {second}" in line
  assert "--memory_recover" in line
  assert journal.read_bytes() == bytes(data)   # nothing was cut
  # The documented recovery: the journal is kept aside, the memory starts from record 1.
  with _server(workdir, tmp_path, "b.log", "--memory_recover") as srv:
    mem = _http(srv.url, "/v1/memory")[1]
    assert mem["feedback"] == 1 and mem["restored"]
    assert _http(srv.url, "/v1/feedback", {"id": ids[0], "score": 0.0})[0] == 409
    assert _http(srv.url, "/v1/feedback", {"id": ids[2], "score": 0.0})[0] == 200
  aside = list(tmp_path.glob("memory.npz.journal.damaged-*"))
  assert len(aside) == 1 and aside[0].read_bytes() == bytes(data)


def test_a_failed_fsync_is_a_503_the_id_stays_unused_and_the_retry_succeeds(
    workdir, tmp_path, monkeypatch):
  """In process: the store's fsync fails once under a feedback; while it is in flight a second
  feedback for the same id is refused."""
  from aiohttp import test_utils
  from gp_jax.serving.engine import session as session_lib
  from gp_jax.serving.http import app as app_lib
  s = session_lib.RouterSession(served_config.load_config(workdir, {}), workdir, max_concurrency=4,
                                memory_path=tmp_path / "memory.npz",
                                route_log=tmp_path / "routes.jsonl")
  real, fails = os.fsync, []
  entered, release = threading.Event(), threading.Event()

  def fsync(fd):   # the next fsync waits for `release`, then fails
    if fails:
      fails.pop()
      entered.set()
      release.wait(60)
      raise OSError(5, "Input/output error")
    return real(fd)

  monkeypatch.setattr(os, "fsync", fsync)

  async def run():
    async with test_utils.TestClient(test_utils.TestServer(app_lib.make_app(s))) as client:
      r = await client.post("/v1/chat/completions", json={
          "model": "graphplanner", "messages": [{"role": "user", "content": QUERY}]})
      rid = (await r.json())["id"]
      mem0 = await (await client.get("/v1/memory")).json()
      fails.append(1)
      first = asyncio.ensure_future(client.post("/v1/feedback", json={"id": rid, "score": 1.0}))
      assert await asyncio.to_thread(entered.wait, 60)   # the first one is being written
      r = await client.post("/v1/feedback", json={"id": rid, "score": 0.0})
      assert r.status == 409 and (await r.json())["error"]["code"] == "duplicate_feedback"
      release.set()
      r = await first
      body = await r.json()
      assert r.status == 503 and body["error"]["code"] == "storage_unavailable"
      assert "Input/output" not in body["error"]["message"]   # no internals
      mem1 = await (await client.get("/v1/memory")).json()
      assert (mem1["rows"], mem1["feedback"], mem1["served_rows"]) == (
          mem0["rows"], mem0["feedback"], mem0["served_rows"])   # nothing applied
      assert not s.store.has_feedback(rid)
      r = await client.post("/v1/feedback", json={"id": rid, "score": 1.0})   # the retry
      assert r.status == 200, await r.text()
      mem2 = await (await client.get("/v1/memory")).json()
      assert mem2["feedback"] == mem0["feedback"] + 1
      r = await client.post("/v1/feedback", json={"id": rid, "score": 1.0})
      assert r.status == 409
      return rid

  rid = asyncio.run(run())
  assert _stored_feedback(tmp_path) == [rid]


def test_kill_9_under_load_loses_no_acknowledged_feedback(workdir, tmp_path):
  srv = _server(workdir, tmp_path, "a.log").start()
  acked, sent, calls = [], [], {}
  lock, stop = threading.Lock(), threading.Event()

  def client(k):
    i = 0
    while not stop.is_set():
      try:
        c = _complete(srv.url, f"{QUERY} client {k} #{i}")
        with lock:
          calls[c["id"]] = len(c["graphplanner"]["route"])
          sent.append(c["id"])
        status, _ = _http(srv.url, "/v1/feedback", {"id": c["id"], "score": (i % 5) / 4})
        if status == 200:
          with lock:
            acked.append(c["id"])
      except (OSError, AssertionError, urllib.error.URLError):
        return   # the server is gone
      i += 1

  threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
  for t in threads:
    t.start()
  t0 = time.monotonic()
  while len(acked) < 40 and time.monotonic() - t0 < 120:
    time.sleep(0.05)
  srv.stop(signal.SIGKILL)   # mid-load: requests and feedback in flight
  stop.set()
  for t in threads:
    t.join(timeout=60)
  assert len(acked) >= 40
  with _server(workdir, tmp_path, "b.log") as again:
    mem = _http(again.url, "/v1/memory")[1]
    again.stop(signal.SIGKILL)
  stored = _stored_feedback(tmp_path)
  assert len(stored) == len(set(stored))                  # none twice
  assert set(acked) <= set(stored) <= set(sent)           # every acknowledged one is there
  assert mem["feedback"] == len(stored) >= len(acked)
  assert mem["served_rows"] == sum(calls[i] for i in stored)   # each applied exactly once
  with _server(workdir, tmp_path, "c.log") as again:
    for rid in acked[:10]:
      assert _http(again.url, "/v1/feedback", {"id": rid, "score": 1.0})[0] == 409
