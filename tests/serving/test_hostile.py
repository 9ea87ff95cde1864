"""Hostile clients against a real server process (experiments/serve_router.py with a keys file of
two clients and one admin, on the simulator): missing and invalid keys, a client reading what
only an admin may, feedback on another key's completion, a cross-origin text/plain post, a wrong
Host, oversized and malformed bodies, a request flood, a feedback flood from one key (capped at
its share of the memory). Each test checks the status and that
nothing was lost or changed that should not be (memory rows, feedback count); the last one checks
that /metrics counted every refusal the module caused. The official openai client is used where a
client would use it, raw http.client elsewhere."""
import collections
import csv
import http.client
import json
import os
import subprocess
import sys
import time
import urllib.parse

import openai
import pytest

from experiments import serve_router_process as process
from gp_jax import paths
from gp_jax.serving.http import auth
from gp_jax.serving.state import llmrouter_export
from gp_jax.serving.state import route_log as route_log_lib

KEYS = {"alice": ("sk-alice-7f3a9c", "client"), "bob": ("sk-bob-52e1d0", "client"),
        "ops": ("sk-ops-c04b8e", "admin")}
QUERY = "What is the boiling point of water at sea level in Fahrenheit?"
BURST = 30
# Every refusal this module has caused so far, (endpoint, status) -> count: /metrics counts the
# same at any point (test_metrics_count_what_happened, whatever the order of the tests).
REFUSED: collections.Counter = collections.Counter()


def _write_keys(path) -> None:
  path.write_text(json.dumps({"keys": [
      {"name": n, "sha256": auth.key_digest(k), "role": r} for n, (k, r) in KEYS.items()]}))


@pytest.fixture(scope="module")
def served(workdir, tmp_path_factory):
  """The server with keys and limits; yields (RouterProcess, its state folder)."""
  state = tmp_path_factory.mktemp("hostile")
  _write_keys(state / "keys.json")
  srv = process.RouterProcess(
      [f"--workdir={workdir}", f"--memory_path={state / 'memory.npz'}",
       f"--api_keys_file={state / 'keys.json'}", "--max_body_bytes=65536",
       "--rate_limit_rps=2", f"--rate_limit_burst={BURST}"], state / "server.log").start()
  yield srv, state
  srv.stop()


def _client(srv, name: str | None, key: str | None = None) -> openai.OpenAI:
  return openai.OpenAI(base_url=srv.url + "/v1", api_key=key or KEYS[name][0], max_retries=0,
                       timeout=120)


def _http(srv, method: str, path: str, body: bytes | None = None, *, key: str | None = None,
          headers: dict | None = None, expect: int | None = None):
  """(status, headers, body bytes) of one raw request. `expect`: the status it must get (a
  refusal is tallied for the /metrics check)."""
  u = urllib.parse.urlsplit(srv.url)
  conn = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
  h = {"Content-Type": "application/json"} if body is not None else {}
  if key:
    h["Authorization"] = f"Bearer {KEYS[key][0]}"
  h.update(headers or {})
  try:
    conn.request(method, path, body=body, headers=h)
    r = conn.getresponse()
    out = r.status, dict(r.getheaders()), r.read()
  finally:
    conn.close()
  if expect is not None:
    assert out[0] == expect, out
    if expect >= 400:
      REFUSED[(path.split("?")[0], expect)] += 1
  return out


def _error(body: bytes) -> dict:
  return json.loads(body)["error"]


def _memory(srv) -> dict:
  status, _, body = _http(srv, "GET", "/v1/memory", key="ops")
  assert status == 200, body
  return json.loads(body)


def _complete(srv, name: str, text: str = QUERY):
  return _client(srv, name).chat.completions.create(
      model="graphplanner", messages=[{"role": "user", "content": text}])


def test_missing_and_invalid_keys_get_401_and_change_nothing(served):
  srv, _ = served
  mem0 = _memory(srv)
  routes0 = json.loads(_http(srv, "GET", "/v1/routes?since=0", key="ops")[2])["data"]
  chat = json.dumps({"model": "graphplanner",
                     "messages": [{"role": "user", "content": QUERY}]}).encode()
  status, headers, body = _http(srv, "POST", "/v1/chat/completions", chat, expect=401)
  assert _error(body)["code"] == "invalid_api_key" and headers["WWW-Authenticate"].startswith(
      "Bearer")
  _http(srv, "POST", "/v1/chat/completions", chat, headers={"Authorization": "Basic c2s6"},
        expect=401)
  with pytest.raises(openai.AuthenticationError) as e:
    _client(srv, None, key="sk-guessed").chat.completions.create(
        model="graphplanner", messages=[{"role": "user", "content": QUERY}])
  REFUSED[("/v1/chat/completions", 401)] += 1
  assert e.value.body["code"] == "invalid_api_key"
  for path in ("/v1/models", "/v1/routes", "/v1/memory", "/metrics"):
    _http(srv, "GET", path, expect=401)
  _http(srv, "POST", "/v1/feedback", json.dumps({"id": "chatcmpl-x", "score": 1}).encode(),
        expect=401)
  # /health answers a probe without a key, and says nothing else.
  status, _, body = _http(srv, "GET", "/health")
  assert status == 200 and json.loads(body) == {"status": "ok"}
  mem1 = _memory(srv)
  assert (mem1["rows"], mem1["feedback"]) == (mem0["rows"], mem0["feedback"])
  routes = json.loads(_http(srv, "GET", "/v1/routes?since=0", key="ops")[2])["data"]
  assert routes == routes0   # nothing was served to anyone without a key


def test_clients_chat_but_only_admins_read_routes_memory_and_metrics(served):
  srv, state = served
  alice = _client(srv, "alice")
  c = _complete(srv, "alice")
  assert c.choices[0].message.content
  for path in ("/routes", "/memory"):
    with pytest.raises(openai.PermissionDeniedError) as e:
      alice.get(path, cast_to=object)
    REFUSED[("/v1" + path, 403)] += 1
    assert e.value.body["code"] == "permission_denied"
  _http(srv, "GET", "/metrics", key="bob", expect=403)
  # The admin reads the route log: the record names the key that asked, no other secret.
  status, _, body = _http(srv, "GET", "/v1/routes?since=0&limit=100000000", key="ops")
  assert status == 200
  recs = {r["id"]: r for r in json.loads(body)["data"]}
  assert recs[c.id]["key"] == "alice" and recs[c.id]["answer"] == c.choices[0].message.content
  assert all(k not in body.decode() for k, _ in KEYS.values())
  # The same on disk.
  logged = [r for r in route_log_lib.read_log(state / "routes.jsonl") if r.get("id") == c.id]
  assert logged and logged[0]["key"] == "alice"
  # No absolute paths in what the server tells: memory and health.
  mem = _memory(srv)
  health = json.loads(_http(srv, "GET", "/health", key="ops")[2])
  for text in (json.dumps(mem), json.dumps(health)):
    assert str(state) not in text and str(paths.REPO_ROOT) not in text
    assert "/tmp" not in text and "/home" not in text
  assert mem["store"] and health["status"] == "ok"


def test_feedback_on_another_keys_completion_is_an_unknown_id(served):
  srv, _ = served
  mine = _complete(srv, "alice", QUERY + " (mine)")
  theirs = _complete(srv, "bob", QUERY + " (theirs)")
  mem0 = _memory(srv)
  bob = _client(srv, "bob")
  with pytest.raises(openai.NotFoundError) as foreign:
    bob.post("/feedback", body={"id": mine.id, "score": 1.0}, cast_to=object)
  with pytest.raises(openai.NotFoundError) as unknown:
    bob.post("/feedback", body={"id": "chatcmpl-" + "0" * 32, "score": 1.0}, cast_to=object)
  REFUSED[("/v1/feedback", 404)] += 2
  assert foreign.value.body["code"] == unknown.value.body["code"] == "unknown_id"
  assert (foreign.value.body["message"].replace(mine.id, "ID")
          == unknown.value.body["message"].replace("chatcmpl-" + "0" * 32, "ID"))
  mem1 = _memory(srv)
  assert (mem1["rows"], mem1["feedback"]) == (mem0["rows"], mem0["feedback"])
  # The owner's feedback still succeeds (bob's attempt did not use the id up).
  ack = _client(srv, "alice").post("/feedback", body={"id": mine.id, "score": 1.0},
                                   cast_to=object)
  n = len(mine.model_extra["graphplanner"]["route"])
  assert ack["rows_added"] == n
  mem2 = _memory(srv)
  assert mem2["feedback"] == mem0["feedback"] + 1 and mem2["rows"] == min(
      mem0["rows"] + n, mem0["capacity"])
  # Once scored, the id is still not bob's: 404, not the 409 that would confirm it exists.
  with pytest.raises(openai.NotFoundError):
    bob.post("/feedback", body={"id": mine.id, "score": 0.0}, cast_to=object)
  REFUSED[("/v1/feedback", 404)] += 1
  # An admin may score any completion.
  status, _, body = _http(srv, "POST", "/v1/feedback",
                          json.dumps({"id": theirs.id, "score": 0.0}).encode(), key="ops")
  assert status == 200 and json.loads(body)["rows_added"] == len(
      theirs.model_extra["graphplanner"]["route"])
  assert _memory(srv)["feedback"] == mem0["feedback"] + 2


def test_cross_origin_text_plain_post_is_415(served):
  srv, _ = served
  c = _complete(srv, "alice", QUERY + " (form)")
  mem0 = _memory(srv)
  form = json.dumps({"id": c.id, "score": 0.0}).encode()
  page = {"Content-Type": "text/plain", "Origin": "http://evil.example"}
  _, _, body = _http(srv, "POST", "/v1/feedback", form, headers=page, expect=415)
  assert _error(body)["code"] == "unsupported_media_type"
  # Refused by its Content-Type even when the key is valid, and for chat as well.
  _http(srv, "POST", "/v1/feedback", form, key="alice", headers=page, expect=415)
  _http(srv, "POST", "/v1/chat/completions", json.dumps(
      {"model": "graphplanner", "messages": [{"role": "user", "content": "hi"}]}).encode(),
        key="alice", headers={"Content-Type": "application/x-www-form-urlencoded"}, expect=415)
  mem1 = _memory(srv)
  assert (mem1["rows"], mem1["feedback"]) == (mem0["rows"], mem0["feedback"])
  status, _, _ = _http(srv, "POST", "/v1/feedback", form, key="alice")   # JSON: accepted
  assert status == 200 and _memory(srv)["feedback"] == mem0["feedback"] + 1


def test_wrong_host_is_refused(served):
  srv, _ = served
  mem0 = _memory(srv)
  for host in ("evil.example", "evil.example:80", "127.0.0.1.nip.io"):
    _, _, body = _http(srv, "GET", "/v1/models", key="alice", headers={"Host": host},
                       expect=421)
    assert _error(body)["code"] == "invalid_host"
  c = _complete(srv, "alice", QUERY + " (host)")
  _http(srv, "POST", "/v1/feedback", json.dumps({"id": c.id, "score": 1.0}).encode(),
        key="alice", headers={"Host": "evil.example"}, expect=421)
  assert _memory(srv)["feedback"] == mem0["feedback"]
  for host in ("localhost", f"127.0.0.1:{urllib.parse.urlsplit(srv.url).port}"):
    assert _http(srv, "GET", "/v1/models", key="alice", headers={"Host": host})[0] == 200


def test_oversized_and_malformed_bodies(served):
  srv, _ = served
  mem0 = _memory(srv)
  big = json.dumps({"model": "graphplanner",
                    "messages": [{"role": "user", "content": "x" * 70_000}]}).encode()
  _, _, body = _http(srv, "POST", "/v1/chat/completions", big, key="alice", expect=413)
  assert _error(body)["code"] == "body_too_large"
  big_fb = json.dumps({"id": "chatcmpl-x", "score": 1.0, "pad": "y" * 70_000}).encode()
  _http(srv, "POST", "/v1/feedback", big_fb, key="alice", expect=413)
  for raw in (b'{"model": "graphplanner", "mess', b"\xff\xfe{}", b"[1, 2]", b""):
    _, _, body = _http(srv, "POST", "/v1/chat/completions", raw, key="alice", expect=400)
    err = _error(body)
    assert err["code"] == "invalid_json"
    assert "Traceback" not in err["message"] and "Error" not in err["message"]
  _http(srv, "POST", "/v1/feedback", b'{"id": ', key="alice", expect=400)
  mem1 = _memory(srv)
  assert (mem1["rows"], mem1["feedback"]) == (mem0["rows"], mem0["feedback"])
  routes = json.loads(_http(srv, "GET", "/v1/routes?since=0", key="ops")[2])["data"]
  assert not any("x" * 1000 in (r.get("query") or "") for r in routes)


def test_a_flood_gets_429_with_retry_after_and_others_keep_their_share(served):
  srv, _ = served
  mem0 = _memory(srv)
  u = urllib.parse.urlsplit(srv.url)
  conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
  statuses, retry = [], None
  try:
    for _ in range(3 * BURST):   # bob's requests, back to back on one connection
      conn.request("GET", "/v1/models", headers={"Authorization": f"Bearer {KEYS['bob'][0]}"})
      r = conn.getresponse()
      body = r.read()
      statuses.append(r.status)
      if r.status == 429:
        retry = r.getheader("Retry-After")
        assert _error(body)["code"] == "rate_limit_exceeded"
  finally:
    conn.close()
  limited = statuses.count(429)
  REFUSED[("/v1/models", 429)] += limited
  assert set(statuses) == {200, 429}, statuses
  # The burst is served first: bob's bucket held BURST tokens less the 4 requests bob sent in
  # the feedback test (refilled at 2/s since).
  assert statuses.index(429) >= BURST - 4, statuses
  assert limited >= BURST   # the bucket refills at 2/s: most of the rest is refused
  assert retry is not None and int(retry) >= 1
  # Another key is not slowed by bob's flood; bob is served again after Retry-After.
  assert _client(srv, "alice").models.list().data
  time.sleep(int(retry))
  assert _http(srv, "GET", "/v1/models", key="bob")[0] == 200
  mem1 = _memory(srv)
  assert (mem1["rows"], mem1["feedback"]) == (mem0["rows"], mem0["feedback"])


def test_export_from_the_server_needs_the_admin_key(served, tmp_path):
  srv, _ = served
  out = tmp_path / "rows.csv"
  assert _complete(srv, "alice").choices[0].message.content   # at least one route to export

  def export(key):
    env = dict(os.environ, PYTHONPATH=str(paths.REPO_ROOT))
    env.pop("GP_JAX_API_KEY", None)
    if key:
      env["GP_JAX_API_KEY"] = KEYS[key][0]
    return subprocess.run([sys.executable, "-m", "experiments.export_routes", f"--url={srv.url}",
                           f"--out={out}", "--include_unscored"], cwd=paths.REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=120)

  for key, status, why in ((None, 401, "is unset"), ("alice", 403, "is not an admin's")):
    run = export(key)
    assert run.returncode == 2 and not out.exists()
    assert run.stderr.strip().splitlines()[-1] == (
        f"error: {srv.url}/v1/routes answered {status}: it needs an admin API key in "
        f"GP_JAX_API_KEY, which {why}")
    REFUSED[("/v1/routes", status)] += 1
  run = export("ops")
  assert run.returncode == 0, run.stderr
  routes = json.loads(_http(srv, "GET", "/v1/routes?since=0", key="ops")[2])["data"]
  with open(out, newline="") as f:
    table = list(csv.reader(f))
  assert table[0] == list(llmrouter_export.FIELDS)
  assert len(table) - 1 == sum(len(r["calls"]) for r in routes) > 0   # one row per call


def test_metrics_count_what_happened(served):
  srv, _ = served
  assert _complete(srv, "alice").choices[0].message.content   # at least one routed request
  status, headers, body = _http(srv, "GET", "/metrics", key="ops")
  assert status == 200 and headers["Content-Type"].startswith("text/plain")
  samples = {}
  for line in body.decode().splitlines():
    if line and not line.startswith("#"):
      name, value = line.rsplit(" ", 1)
      samples[name] = float(value)
  counted = collections.Counter()
  for name, value in samples.items():
    if name.startswith("gp_router_requests_total{"):
      labels = dict(p.split("=", 1) for p in name[len("gp_router_requests_total{"):-1].split(","))
      status_ = int(labels["status"].strip('"'))
      if status_ >= 400:
        counted[(labels["endpoint"].strip('"'), status_)] += int(value)
  assert counted == REFUSED, (counted, REFUSED)
  assert samples.get('gp_router_rate_limited_total{limit="requests"}', 0) == REFUSED[
      ("/v1/models", 429)]
  mem = _memory(srv)
  assert samples["gp_router_memory_rows"] == mem["rows"]
  assert samples["gp_router_feedback_total"] == mem["feedback"]   # a new memory: all of them
  assert samples['gp_router_served_total{kind="routed"}'] == len(json.loads(
      _http(srv, "GET", "/v1/routes?since=0", key="ops")[2])["data"])
  assert samples["gp_router_policy_calls_total"] >= 1
  assert samples["gp_router_decisions_total"] >= samples["gp_router_policy_calls_total"]
  assert samples["gp_router_overhead_per_decision_seconds_count"] == samples[
      'gp_router_served_total{kind="routed"}']
  assert samples["gp_router_in_flight"] == 0 and samples["gp_router_queue_depth"] == 0
  assert samples['gp_router_request_seconds_count{endpoint="/v1/chat/completions"}'] >= 1


def _runner(*args, tmp_path):
  return subprocess.run([sys.executable, "-m", "experiments.serve_router", "--port=0", *args],
                        cwd=paths.REPO_ROOT, capture_output=True, text=True, timeout=120,
                        env=dict(os.environ, PYTHONPATH=str(paths.REPO_ROOT)))


def test_a_feedback_flood_from_one_key_churns_only_its_own_share(workdir, tmp_path):
  """bob sends pass-through requests and scores each 1.0 until its rows would be far more than
  its share of the memory: every feedback is acknowledged and kept in the store, but in the memory
  bob's rows stop at --max_key_share of the capacity, its own oldest evicted first, so alice's rows
  and the training history that is left are untouched by the rest of the flood."""
  _write_keys(tmp_path / "keys.json")
  share = 0.25
  with process.RouterProcess(
      [f"--workdir={workdir}", f"--memory_path={tmp_path / 'memory.npz'}",
       f"--api_keys_file={tmp_path / 'keys.json'}", f"--max_key_share={share}"],
      tmp_path / "server.log") as srv:
    mem0 = _memory(srv)
    cap = int(share * mem0["capacity"])
    alice = [_complete(srv, "alice", f"{QUERY} ({i})") for i in range(3)]
    for c in alice:
      assert _client(srv, "alice").post("/feedback", body={"id": c.id, "score": 0.5},
                                        cast_to=object)["rows_added"] >= 1
    alice_rows = _memory(srv)["per_key"]["alice"]
    backbone = [m.id for m in _client(srv, "bob").models.list().data][1]
    bob = _client(srv, "bob")

    def flood(n, start):
      for i in range(start, start + n):
        c = bob.chat.completions.create(model=backbone, messages=[
            {"role": "user", "content": f"Flood question {i}: what is {i} + {i}?"}])
        out = bob.post("/feedback", body={"id": c.id, "score": 1.0}, cast_to=object)
        assert out["rows_added"] == 1   # acknowledged: durable in the store
    flood(cap + 10, 0)
    mid = _memory(srv)
    flood(cap, cap + 10)                # as many again: only bob's own rows go
    end = _memory(srv)
  assert mid["per_key"]["bob"] == end["per_key"]["bob"] == cap
  assert mid["per_key"]["alice"] == end["per_key"]["alice"] == alice_rows
  training = lambda m: m["rows"] - sum(m["per_key"].values())
  assert training(end) == training(mid) > 0
  assert end["rows"] <= end["capacity"]
  # Nothing acknowledged was dropped: every feedback is in the store (3 of alice's, 2 cap + 10
  # of bob's), though most of bob's rows left the memory.
  assert end["feedback"] == mem0["feedback"] + 3 + 2 * cap + 10
  assert end["seq"] == mem0["seq"] + 3 + 2 * cap + 10


def test_non_loopback_bind_without_keys_and_bad_keys_files_are_refused(tmp_path):
  for host in ("0.0.0.0", "::", "192.0.2.10"):
    out = _runner(f"--workdir={tmp_path}", f"--host={host}", tmp_path=tmp_path)
    assert out.returncode == 2, out.stderr
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: --host={host} without --api_keys_file"), last
  bad = tmp_path / "keys.json"
  bad.write_text(json.dumps({"keys": [
      {"name": "alice", "sha256": auth.key_digest("k1"), "role": "client"},
      {"name": "ops", "sha256": "not-a-digest", "role": "admin"}]}))
  out = _runner(f"--workdir={tmp_path}", f"--api_keys_file={bad}", tmp_path=tmp_path)
  assert out.returncode == 2
  lines = out.stderr.strip().splitlines()
  assert lines[-1] == f"error: {bad}: keys[1] (ops): sha256 must be 64 hex digits (the SHA-256 " \
                      "of the key)", lines
  assert sum(line.startswith("error:") for line in lines) == 1
  out = _runner(f"--workdir={tmp_path}", "--rate_limit_rps=-1", tmp_path=tmp_path)
  assert out.returncode == 2 and "--rate_limit_rps must be" in out.stderr
