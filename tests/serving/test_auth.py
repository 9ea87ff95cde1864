"""Keys, the request gate, rate limits and /metrics, in process and fast: the keys file's checks,
token buckets on a fake clock, the Host check, and the app's gate and error bodies over real HTTP
(aiohttp's test server) in front of a stub session. The same behaviour against the real server
process is tests/serving/test_hostile.py."""
import asyncio
import collections
import json
import signal
import types

import pytest
from aiohttp import test_utils

from gp_jax import errors
from gp_jax.serving.engine import errors as engine_errors
from gp_jax.serving.http import app as app_lib
from gp_jax.serving.http import auth
from gp_jax.serving.http import errors as http_errors
from gp_jax.serving.http import gate as gate_lib
from gp_jax.serving.http import limits
from gp_jax.serving.http import metrics as metrics_lib

KEYS = {"alice": ("alice-secret", "client"), "bob": ("bob-secret", "client"),
        "ops": ("ops-secret", "admin"), "kiosk": ("kiosk-secret", "client", False)}


def _keys_file(path, keys=KEYS):
  """Writes a keys file of `keys` (name: (key, role[, feedback]))."""
  path.write_text(json.dumps({"keys": [
      {"name": n, "sha256": auth.key_digest(k[0]), "role": k[1],
       **({"feedback": k[2]} if len(k) > 2 else {})} for n, k in keys.items()]}))
  return path


def test_keys_file_is_checked_entry_by_entry(tmp_path):
  ring = auth.load(_keys_file(tmp_path / "keys.json"))
  assert ring.names == ("alice", "bob", "ops", "kiosk")
  assert ring.authenticate("Bearer alice-secret") == auth.Principal("alice", "client")
  assert ring.authenticate("bearer ops-secret").is_admin
  for header in (None, "", "Bearer", "Bearer wrong", "Basic alice-secret", "alice-secret",
                 "Bearer alice-secret2"):
    assert ring.authenticate(header) is None, header
  good = {"name": "a", "sha256": "ab" * 32, "role": "client"}
  bad = [
      ({"keys": []}, "keys is empty"),
      ([good], "an API keys file is"),
      ({"keys": [good, dict(good, name="b", role="root")]}, "keys[1] (b): role must be"),
      ({"keys": [dict(good, sha256="xyz")]}, "keys[0] (a): sha256 must be 64 hex"),
      ({"keys": [dict(good, key="plain")]}, "keys[0] (a): holds a plain key"),
      ({"keys": [good, dict(good, sha256="cd" * 32)]}, "keys[1] (a): the name 'a' is used twice"),
      ({"keys": [good, dict(good, name="b")]}, "keys[1] (b): the same key"),
      ({"keys": [dict(good, name="")]}, "keys[0]: name must be"),
      ({"keys": [dict(good, extra=1)]}, "unknown field(s) extra"),
      ({"keys": [dict(good, feedback="no")]}, "keys[0] (a): feedback must be true or false"),
      ({"keys": [dict(good, role="admin", feedback=False)]}, '"feedback": false is for client'),
  ]
  for data, message in bad:
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(data))
    with pytest.raises(errors.DataError) as e:
      auth.load(p)
    assert str(e.value).startswith(str(p)) and message in str(e.value), str(e.value)
  (tmp_path / "torn.json").write_text('{"keys": [')
  with pytest.raises(errors.DataError, match="torn.json: line 1"):
    auth.load(tmp_path / "torn.json")
  with pytest.raises(errors.DataError, match="not found"):
    auth.load(tmp_path / "missing.json")
  # "feedback": false makes a chat-only client key; true (the default) changes nothing.
  (tmp_path / "chat.json").write_text(json.dumps({"keys": [
      dict(good, sha256=auth.key_digest("ka"), feedback=False),
      dict(good, name="b", sha256=auth.key_digest("kb"), feedback=True)]}))
  ring = auth.load(tmp_path / "chat.json")
  assert ring.lookup("ka") == auth.Principal("a", "client", feedback=False)
  assert ring.lookup("kb") == auth.Principal("b", "client")
  assert not auth.may_feedback(ring.lookup("ka"), {"key": "a"})
  assert ring.path == tmp_path / "chat.json" and ring.stamp == auth.file_stamp(ring.path)


def test_bind_and_host_checks():
  ring = auth.KeyRing([])
  for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
    auth.check_bind(host, None)
  for host in ("0.0.0.0", "", "::", "10.0.0.5", "example.com"):
    with pytest.raises(errors.ConfigError, match="--api_keys_file"):
      auth.check_bind(host, None)
    auth.check_bind(host, ring)
  # Other Host names than loopback ones need keys too: a proxy forwarding them opens the server.
  auth.check_bind("127.0.0.1", None, ["localhost", "127.0.0.1", "[::1]", " "])
  for allowed in (["router.example.com"], ["localhost", "*"], ["10.0.0.5"]):
    with pytest.raises(errors.ConfigError, match=r"^--allowed_hosts=\S+ without --api_keys_file"):
      auth.check_bind("127.0.0.1", None, allowed)
    auth.check_bind("127.0.0.1", ring, allowed)
  hosts = auth.HostCheck("0.0.0.0", ["router.example.com"])
  for ok in ("127.0.0.1:8080", "localhost", "[::1]:80", "ROUTER.example.com:443"):
    assert hosts.ok(ok), ok
  for bad in (None, "", "evil.example", "0.0.0.0:8080", "router.example.com.evil:80", "[::1"):
    assert not hosts.ok(bad), bad
  assert auth.HostCheck("10.1.2.3").ok("10.1.2.3:9000")
  assert auth.HostCheck("127.0.0.1", ["*"]).ok("anything")


def test_token_buckets_refill_and_say_when():
  now = [100.0]
  b = limits.TokenBuckets(2.0, 3, clock=lambda: now[0])
  assert [b.take("a") for _ in range(3)] == [0.0, 0.0, 0.0]
  assert b.take("a") == pytest.approx(0.5)        # one token back after 1 / rate
  assert b.take("b") == 0.0                       # buckets are per caller
  now[0] += 0.5
  assert b.take("a") == 0.0 and b.take("a") > 0
  now[0] += 60                                    # refills to the burst, never beyond
  assert [b.take("a") for _ in range(4)][-1] > 0
  assert limits.retry_after(0.01) == "1" and limits.retry_after(2.2) == "3"
  assert limits.TokenBuckets(0, 1).take("a") == 0.0   # 0 = off
  with pytest.raises(errors.ConfigError, match="--feedback_rps must be"):
    limits.TokenBuckets(-1, 1, what="--feedback_rps")
  with pytest.raises(errors.ConfigError, match="--rate_limit_burst"):
    limits.TokenBuckets(1, 0)


class _StubSession:
  """What the app's gate, feedback, routes, memory, health and /metrics handlers read."""

  def __init__(self):
    self.records = {"chatcmpl-a": {"id": "chatcmpl-a", "key": "alice", "created": 1.0},
                    "chatcmpl-b": {"id": "chatcmpl-b", "key": "bob", "created": 2.0}}
    self.given = []
    self.counters = collections.Counter()
    self.admissions = types.SimpleNamespace(in_flight=0, max_concurrency=4, waiting=0)
    self.batcher = types.SimpleNamespace(calls=2, decisions=6)
    self.history = _History()
    self.status = "ok"   # what health() says; None: it raises

  async def start(self):
    pass

  async def route(self, rid):
    return self.records.get(rid)

  async def routes_after(self, after, limit):
    recs = [dict(r, seq=i + 1) for i, r in enumerate(self.records.values())]
    return [r for r in recs if r["seq"] > after][:limit]

  async def routes_since(self, t, limit):
    return [r for r in self.records.values() if r["created"] > t][:limit]

  async def feedback(self, rid, score, *, key=None, record=None):
    if rid not in self.records:
      raise engine_errors.Refusal(engine_errors.NOT_FOUND, f"no served completion with id {rid!r}",
                                  "unknown_id", "id")
    self.given.append((rid, score, key))
    self.counters["feedback"] += 1
    return dict(id=rid, score=score, rows_added=1, rows_evicted=0, memory_rows=1)

  def memory_info(self):
    return dict(rows=len(self.history), capacity=self.history.capacity,
                path="/srv/secret/place/memory.npz", per_hub={})

  def health(self):
    if self.status is None:
      raise RuntimeError("/home/someone/runs: the store is gone")
    return dict(status=self.status, workdir="/home/someone/runs/alpha0.5", memory={"path": None},
                per_key={"alice": 3, "bob": 1})

  async def aclose(self):
    pass


class _History:
  capacity = 10

  def __len__(self):
    return 7


async def _with_app(fn, **kw):
  s = _StubSession()
  application = app_lib.make_app(s, **kw)
  application.router.add_get("/boom", _boom)
  application.router.add_get("/refuse/{kind}", _refuse)
  async with test_utils.TestClient(test_utils.TestServer(application)) as client:
    return await fn(client, s)


async def _boom(request):
  raise ValueError("/very/secret/path/config.json is broken")


async def _refuse(request):   # what the engine refuses (test_engine_refusals_keep_their_statuses)
  raise _REFUSALS[request.match_info["kind"]][0]


def _run(fn, **kw):
  return asyncio.run(_with_app(fn, **kw))


def _auth(name):
  return {"Authorization": f"Bearer {KEYS[name][0]}"}


def test_gate_keys_roles_and_own_feedback(tmp_path):
  ring = auth.load(_keys_file(tmp_path / "keys.json"))

  async def go(c, s):
    r = await c.get("/v1/memory")
    assert r.status == 401 and r.headers["WWW-Authenticate"].startswith("Bearer")
    assert (await r.json())["error"]["code"] == "invalid_api_key"
    r = await c.get("/v1/memory", headers={"Authorization": "Bearer nope"})
    assert r.status == 401
    for path in ("/v1/memory", "/v1/routes", "/metrics"):
      r = await c.get(path, headers=_auth("alice"))
      assert r.status == 403, path
      assert (await r.json())["error"]["type"] == "permission_error"
    # Another key's completion is answered exactly as a made-up id.
    foreign = await c.post("/v1/feedback", json={"id": "chatcmpl-b", "score": 1.0},
                           headers=_auth("alice"))
    unknown = await c.post("/v1/feedback", json={"id": "chatcmpl-zz", "score": 1.0},
                           headers=_auth("alice"))
    assert foreign.status == unknown.status == 404
    fb, ub = await foreign.json(), await unknown.json()
    assert fb["error"]["message"].replace("chatcmpl-b", "X") == \
        ub["error"]["message"].replace("chatcmpl-zz", "X")
    assert s.given == []
    r = await c.post("/v1/feedback", json={"id": "chatcmpl-a", "score": 1.0},
                     headers=_auth("alice"))
    assert r.status == 200
    r = await c.post("/v1/feedback", json={"id": "chatcmpl-b", "score": 0.5},
                     headers=_auth("ops"))   # an admin: any completion
    assert r.status == 200
    assert s.given == [("chatcmpl-a", 1.0, "alice"), ("chatcmpl-b", 0.5, "ops")]
    # No paths in answers; /health without an admin key is up or down only.
    mem = await (await c.get("/v1/memory", headers=_auth("ops"))).json()
    assert mem["path"] == "memory.npz"
    assert await (await c.get("/health")).json() == {"status": "ok"}
    assert await (await c.get("/health", headers=_auth("bob"))).json() == {"status": "ok"}
    h = await (await c.get("/health", headers=_auth("ops"))).json()
    assert h["workdir"] == "alpha0.5" and "/home" not in json.dumps(h)
    r = await c.get("/v1/routes?limit=100000000", headers=_auth("ops"))
    assert r.status == 200
    # Not JSON, wrong Host: refused before the key is even read.
    r = await c.post("/v1/feedback", data=b'{"id": "chatcmpl-a", "score": 0}',
                     headers={"Content-Type": "text/plain", **_auth("alice")})
    assert r.status == 415 and (await r.json())["error"]["code"] == "unsupported_media_type"
    r = await c.get("/v1/models", headers={"Host": "evil.example", **_auth("alice")})
    assert r.status == 421
    assert len(s.given) == 2
    # An unexpected error: 500 with the request id, never the exception text.
    r = await c.get("/boom", headers={**_auth("ops"), "x-request-id": "req-42"})
    body = await r.text()
    assert r.status == 500 and "req-42" in body and "secret" not in body and "Value" not in body
    for path in ("/v1/nope", "/v1/nope/../../etc", "/%2e%2e/x"):   # not served: one label
      assert (await c.get(path, headers=_auth("alice"))).status == 404
    assert (await c.get("/v1/feedback", headers=_auth("alice"))).status == 405
    text = await (await c.get("/metrics", headers=_auth("ops"))).text()
    assert 'gp_router_requests_total{endpoint="other",status="404"} 3.0' in text
    assert "nope" not in text
    assert 'gp_router_requests_total{endpoint="/v1/feedback",status="404"} 2.0' in text
    assert 'gp_router_requests_total{endpoint="/v1/memory",status="403"} 1.0' in text
    assert "gp_router_memory_rows 7.0" in text and "gp_router_feedback_total 2.0" in text
    assert "gp_router_decisions_per_policy_call 3.0" in text

  _run(go, keys=ring)


_REFUSALS = {   # kind: the engine's refusal, its status, OpenAI error type and extra headers
    engine_errors.INVALID: (engine_errors.Refusal(
        engine_errors.INVALID, "unknown task 'x'", "invalid_task", "metadata.task"),
        400, "invalid_request_error", {}),
    engine_errors.NOT_FOUND: (engine_errors.Refusal(
        engine_errors.NOT_FOUND, "no router version 'v9'", "unknown_version", "version"),
        404, "not_found_error", {}),
    engine_errors.CONFLICT: (engine_errors.Refusal(
        engine_errors.CONFLICT, "already has feedback", "duplicate_feedback", "id"),
        409, "conflict_error", {}),
    engine_errors.OVERLOADED: (engine_errors.Refusal(
        engine_errors.OVERLOADED, "at capacity", "server_overloaded", retry_after_s=7),
        429, "rate_limit_error", {"Retry-After": "7"}),
    engine_errors.BACKBONE: (engine_errors.Refusal(
        engine_errors.BACKBONE, "no answer", "backbone_error",
        details={"request_id": "chatcmpl-x", "cost_usd": 0.000125}),
        502, "backbone_error", {"x-gp-request-id": "chatcmpl-x", "x-gp-cost-usd": "0.000125"}),
    engine_errors.UNAVAILABLE: (engine_errors.Refusal(
        engine_errors.UNAVAILABLE, "could not be logged", "storage_unavailable"),
        503, "server_error", {}),
}


def test_engine_refusals_keep_their_statuses():
  """Each kind of engine refusal is the HTTP error it always was: status, body and headers."""
  assert set(_REFUSALS) == set(engine_errors.KINDS)

  async def go(c, s):
    for kind, (refusal, status, kind_type, headers) in _REFUSALS.items():
      r = await c.get(f"/refuse/{kind}")
      assert r.status == status, kind
      assert await r.json() == {"error": {"message": refusal.message, "type": kind_type,
                                          "param": refusal.param, "code": refusal.code}}
      assert {k: r.headers.get(k) for k in headers} == headers, kind
      if not headers:
        assert "Retry-After" not in r.headers and "x-gp-cost-usd" not in r.headers
    # A backbone refusal without its request's facts has no headers to add.
    passthrough = engine_errors.Refusal(engine_errors.BACKBONE, "backbone m1 failed",
                                        "backbone_error")
    assert http_errors.from_refusal(passthrough).headers == {}

  _run(go)


def test_rate_limits_per_key_and_per_address(tmp_path):
  ring = auth.load(_keys_file(tmp_path / "keys.json"))

  async def requests(c, s):
    statuses = [(await c.get("/v1/routes", headers=_auth("ops"))).status for _ in range(3)]
    assert statuses == [200, 200, 429]
    r = await c.get("/v1/routes", headers=_auth("ops"))
    assert r.status == 429 and int(r.headers["Retry-After"]) >= 1
    assert (await r.json())["error"]["code"] == "rate_limit_exceeded"
    # Another key has its own bucket; /health is never limited.
    assert (await c.get("/v1/routes", headers=_auth("bob"))).status == 403   # not a 429
    assert all([(await c.get("/health")).status == 200 for _ in range(5)])
    # The scrape is not counted against a key: ops, out of tokens, still reads /metrics.
    text = await (await c.get("/metrics", headers=_auth("ops"))).text()
    assert 'gp_router_rate_limited_total{limit="requests"} 2.0' in text

  _run(requests, keys=ring, rate_limit_rps=0.001, rate_limit_burst=2)

  async def feedback(c, s):
    body = {"id": "chatcmpl-a", "score": 1}
    statuses = [(await c.post("/v1/feedback", json=body, headers=_auth("alice"))).status
                for _ in range(2)]
    r = await c.post("/v1/feedback", json=body, headers=_auth("alice"))
    assert statuses == [200, 200] and r.status == 429
    assert "feedback rate limit" in (await r.json())["error"]["message"]
    assert len(s.given) == 2   # the refused one changed nothing
    # Other requests of the same key are not feedback.
    assert all([(await c.get("/v1/models", headers=_auth("alice"))).status != 429
                for _ in range(5)])
    text = await (await c.get("/metrics", headers=_auth("ops"))).text()
    assert 'gp_router_rate_limited_total{limit="feedback"} 1.0' in text

  _run(feedback, keys=ring, feedback_rps=0.001, rate_limit_burst=2)

  async def anon(c, s):   # no keys: the client address is the caller
    return [(await c.get("/v1/memory")).status for _ in range(3)]

  assert _run(anon, rate_limit_rps=0.001, rate_limit_burst=2) == [200, 200, 429]


def test_two_apps_count_apart():
  a, b = metrics_lib.Metrics(), metrics_lib.Metrics()
  a.request("/v1/models", 200, 0.01)
  a.served({"timing": {"router_s": 0.004, "decisions": 2},
            "calls": [{"llm": "m1", "error": "timeout"}, {"llm": "m2", "error": None}]})
  ta, tb = a.render().decode(), b.render().decode()
  assert 'gp_router_requests_total{endpoint="/v1/models",status="200"} 1.0' in ta
  assert "gp_router_requests_total{" not in tb
  assert 'gp_router_backbone_call_errors_total{llm="m1"} 1.0' in ta
  assert "gp_router_overhead_per_decision_seconds_count 1.0" in ta
  assert 'gp_router_overhead_per_decision_seconds_bucket{le="0.002"} 1.0' in ta


def test_health_says_up_or_down_and_only_admins_read_its_details(tmp_path):
  """A load balancer's probe (no key) and a client key read only up or down; an admin reads the
  counters, memory and per-key traffic; the anonymous admin of a keyless loopback server too."""
  ring = auth.load(_keys_file(tmp_path / "keys.json"))

  async def go(c, s):
    for headers in ({}, _auth("alice"), _auth("kiosk"), {"Authorization": "Bearer nope"}):
      r = await c.get("/health", headers=headers)
      assert (r.status, await r.json()) == (200, {"status": "ok"}), headers
    r = await c.get("/health", headers=_auth("ops"))
    h = await r.json()
    assert r.status == 200 and h["per_key"] == {"alice": 3, "bob": 1} and h["status"] == "ok"
    s.status = "draining"   # anything but ok: the server cannot serve
    for headers in ({}, _auth("bob")):
      r = await c.get("/health", headers=headers)
      assert (r.status, await r.json()) == (503, {"status": "down"})
    r = await c.get("/health", headers=_auth("ops"))
    assert r.status == 503 and (await r.json())["status"] == "down"
    s.status = None         # no health at all: down, never a 500, no exception text
    r = await c.get("/health", headers=_auth("ops"))
    assert (r.status, await r.json()) == (503, {"status": "down"})

  _run(go, keys=ring)

  async def keyless(c, s):
    return await (await c.get("/health")).json()

  assert _run(keyless)["per_key"] == {"alice": 3, "bob": 1}


def test_a_chat_only_key_may_not_send_feedback(tmp_path):
  ring = auth.load(_keys_file(tmp_path / "keys.json"))

  async def go(c, s):
    s.records["chatcmpl-k"] = {"id": "chatcmpl-k", "key": "kiosk", "created": 3.0}
    for rid in ("chatcmpl-k", "chatcmpl-a", "chatcmpl-zz"):   # its own, another's, none
      r = await c.post("/v1/feedback", json={"id": rid, "score": 1.0}, headers=_auth("kiosk"))
      assert r.status == 403, rid
      assert await r.json() == {"error": {
          "message": "this API key may chat but not send feedback", "type": "permission_error",
          "param": None, "code": "permission_denied"}}
    assert s.given == [] and s.counters["feedback"] == 0
    r = await c.post("/v1/feedback", json={"id": "chatcmpl-k", "score": 1.0}, headers=_auth("ops"))
    assert r.status == 200 and s.given == [("chatcmpl-k", 1.0, "ops")]

  _run(go, keys=ring)


def test_keys_reload_revokes_and_a_bad_file_keeps_the_keys_in_force(tmp_path, caplog):
  """reload_keys (what SIGHUP runs) puts a changed file in force; a file that does not load keeps
  the keys there are and logs one error line; follow_keys' poll sees a changed file by itself.
  SIGHUP against the real server process: tests/serving/test_permissions.py."""
  path = _keys_file(tmp_path / "keys.json")
  gate = gate_lib.Gate(auth.load(path), auth.HostCheck("127.0.0.1"),
                       limits.TokenBuckets(0, 1), limits.TokenBuckets(0, 1))
  who = lambda name: gate.keys.authenticate(f"Bearer {KEYS[name][0]}")
  _keys_file(path, {k: v for k, v in KEYS.items() if k != "bob"})
  assert gate.reload_keys() and who("bob") is None and who("alice").name == "alice"
  kept = gate.keys
  bad_digest = json.dumps({"keys": [{"name": "x", "sha256": "12", "role": "client"}]})
  for content in ('{"keys": [', bad_digest, b"\xff\xfe{", None):
    if content is None:
      path.unlink()
    elif isinstance(content, bytes):
      path.write_bytes(content)
    else:
      path.write_text(content)
    caplog.clear()
    assert not gate.reload_keys()
    assert gate.keys is kept and who("ops").is_admin
    (line,) = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert line.startswith("keys file not reloaded, the 3 keys in force stay: ") and \
        str(path) in line and "\n" not in line, line

  async def follow():
    gate.follow_keys(asyncio.get_running_loop(), poll_s=0.02)
    try:
      _keys_file(path)   # bob is back
      for _ in range(250):
        await asyncio.sleep(0.02)
        if who("bob") is not None:
          return True
      return False
    finally:
      asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
      gate._poll.cancel()

  assert asyncio.run(follow())
  # Without a keys file there is nothing to follow, and no Host name but loopback ones.
  assert gate_lib.Gate(None, auth.HostCheck("127.0.0.1"), limits.TokenBuckets(0, 1),
                       limits.TokenBuckets(0, 1)).keys is None
  with pytest.raises(errors.ConfigError, match="--allowed_hosts=router.example.com without"):
    app_lib.make_app(_StubSession(), allowed_hosts=["router.example.com"])
