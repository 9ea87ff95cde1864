"""Bounded resources of a router server (docs/serving.md, Bounds).

Against real server processes (experiments/serve_router.py):
  - a client key over its concurrency cap gets 429 `key_concurrency_exceeded` with Retry-After,
    while another key is served (admin keys are not capped);
  - a stream whose client never reads is cut off after the write deadline, its workflow
    cancelled and its slot and key place free again;
  - a `max_tokens` above the served config's sampling.max_tokens is clamped to it;
  - a flood of 100 unique 512 KiB prompts, 4 at a time, grows the server's RSS by less than
    FLOOD_RSS_BOUND_MB after a warm-up of 8 (measured on the 2-core test machine: +3.6 to +11.9
    MB with the bounds; +56 MB before them, and +57 MB with every bound but the simulator's).
In process: waiting requests get their slots round robin by key; the text encoder's cache and the
simulator's adopted queries stay at their caps under a flood, and an evicted query comes back
the same.
"""
import asyncio
import collections
import concurrent.futures
import contextlib
import http.client
import json
import socket
import threading
import time
import urllib.parse

import numpy as np
import pytest

from experiments import serve_router_process as process
from experiments.configs import serve as serve_config
from experiments.configs import test as test_config
from gp_jax import errors
from gp_jax.llm import catalog as catalog_lib
from gp_jax.llm import testing_server
from gp_jax.serving.engine import admission as admission_lib
from gp_jax.serving.engine import config as served_config
from gp_jax.serving.engine import errors as engine_errors
from gp_jax.serving import settings as settings_lib
from gp_jax.serving.engine import session as session_lib
from gp_jax.serving.http import auth
from gp_jax.sim import simulator as sim
from tests.util import http_client

LLMS = test_config.get_config().llms.split(",")
KEYS = {"alice": ("sk-alice-b0un", "client"), "bob": ("sk-bob-b0un", "client"),
        "ops": ("sk-ops-b0un", "admin")}
TOKEN_CAP = 1_000_000           # the keyed server's sampling.max_tokens
LONG = "answer at length"       # a message the test server streams 32 MB for
FLOOD_RSS_BOUND_MB = 24.0       # RSS growth allowed for the 100 x 512 KiB flood
PROMPT_BYTES = 512 << 10


class _LongStreams(testing_server.FakeOpenAIServer):
  """The test server; its streamed answer to LONG is 2,000 pieces of 16,000 characters."""

  async def _stream_answer(self, request, body, text, finish, usage):
    if text.endswith(LONG):
      text = " ".join(["a" * 16_000] * 2_000)
    return await super()._stream_answer(request, body, text, finish, usage)


@pytest.fixture(scope="module")
def backend():
  with _LongStreams(models=tuple(LLMS)) as srv:
    yield srv


@pytest.fixture
def calm(backend):
  """The test server answers at once, after the test too."""
  yield backend
  backend.config.latency_s, backend.config.stream_piece_s = 0.0, 0.0


@pytest.fixture(scope="module")
def keyed(workdir, backend, tmp_path_factory):
  """A server over the test server with two client keys and an admin: one place per client key,
  4 slots, a 1 s stream write deadline, a token cap of TOKEN_CAP."""
  state = tmp_path_factory.mktemp("bounds")
  (state / "keys.json").write_text(json.dumps({"keys": [
      {"name": n, "sha256": auth.key_digest(k), "role": r} for n, (k, r) in KEYS.items()]}))
  endpoints = state / "endpoints.json"
  endpoints.write_text(json.dumps({m: [{"base_url": backend.url, "model": m}] for m in LLMS}))
  srv = process.RouterProcess(
      [f"--workdir={workdir}", "--memory_path=none", f"--api_keys_file={state / 'keys.json'}",
       "--config.backend=endpoints", f"--config.endpoints_file={endpoints}",
       f"--config.sampling.max_tokens={TOKEN_CAP}", "--max_concurrency=4",
       "--max_key_concurrency=1", "--stream_write_timeout_s=1", "--deadline_s=120"],
      state / "server.log").start()
  yield srv
  srv.stop()


def _http(srv, method: str, path: str, body: dict | None = None, key: str | None = None):
  """(status, headers, decoded body) of one request."""
  return http_client.request(srv.url, method, path, body, bearer=KEYS[key][0] if key else None)


def _chat(srv, key: str, text: str = "one two three", model: str = LLMS[0], **extra):
  return _http(srv, "POST", "/v1/chat/completions",
               dict(model=model, messages=[{"role": "user", "content": text}], **extra), key)


def _health(srv) -> dict:
  status, _, body = _http(srv, "GET", "/health", key="ops")
  assert status == 200, body
  return body


def _wait_for(cond, what: str, timeout_s: float = 60.0) -> None:
  t0 = time.monotonic()
  while not cond():
    assert time.monotonic() - t0 < timeout_s, f"timed out waiting for {what}"
    time.sleep(0.05)


def _metric(srv, series: str) -> float:
  """The value of one Prometheus series in the admin's /metrics scrape."""
  u = urllib.parse.urlsplit(srv.url)
  conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
  try:
    conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {KEYS['ops'][0]}"})
    text = conn.getresponse().read().decode()
  finally:
    conn.close()
  values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith(series + " ")]
  assert len(values) == 1, f"{series} not in /metrics"
  return values[0]


def _in_background(fn):
  """fn() in a thread; returns a callable that joins it and gives its result."""
  out = {}
  t = threading.Thread(target=lambda: out.setdefault("r", fn()), daemon=True)
  t.start()

  def result():
    t.join(120)
    return out["r"]
  return result


def test_a_key_over_its_cap_gets_429_while_another_key_is_served(keyed, calm):
  calm.config.latency_s = 1.0   # each pass-through call holds its slot for a second
  before = _health(keyed)["counters"].get("key_overloaded", 0)
  first = _in_background(lambda: _chat(keyed, "alice"))
  _wait_for(lambda: _health(keyed)["in_flight"] == 1, "alice's request to run")
  status, headers, body = _chat(keyed, "alice")
  assert status == 429 and body["error"]["code"] == admission_lib.KEY_CODE, body
  assert int(headers["Retry-After"]) >= 1
  second = _in_background(lambda: _chat(keyed, "bob"))   # bob still has his place
  admins = [_in_background(lambda: _chat(keyed, "ops")) for _ in range(2)]   # not capped
  assert first()[0] == 200 and second()[0] == 200
  assert [a()[0] for a in admins] == [200, 200]
  assert _chat(keyed, "alice")[0] == 200   # her place is free again
  h = _health(keyed)
  assert h["counters"]["key_overloaded"] - before == 1
  assert h["in_flight"] == 0 and h["waiting"] == 0
  assert _metric(keyed, 'gp_router_overloaded_total{scope="key"}') == h["counters"]["key_overloaded"]


def test_a_stream_that_is_never_read_is_cut_off_and_frees_its_slot(keyed, calm):
  """A pass-through stream of 32 MB that the test server sends over 10 s or more, to a client
  that never reads: the sockets buffer about 3 MB, then the server's writes stall."""
  calm.config.stream_piece_s = 0.004
  before = _health(keyed)["counters"]
  body = json.dumps(dict(model=LLMS[0], stream=True,
                         messages=[{"role": "user", "content": LONG}])).encode()
  u = urllib.parse.urlsplit(keyed.url)
  sock = socket.socket()
  sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
  sock.connect((u.hostname, u.port))
  sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: " + u.netloc.encode() +
               b"\r\nContent-Type: application/json\r\nAuthorization: Bearer " +
               KEYS["alice"][0].encode() + b"\r\nContent-Length: " + str(len(body)).encode() +
               b"\r\n\r\n" + body)
  try:
    _wait_for(lambda: _health(keyed)["in_flight"] == 1, "the stream's workflow to run")
    assert _chat(keyed, "alice")[0] == 429   # her place is held while her stream's call runs
    t0 = time.monotonic()
    _wait_for(lambda: _health(keyed)["counters"].get("stream_stalled", 0)
              == before.get("stream_stalled", 0) + 1, "the stream to be cut off", 60)
    h = _health(keyed)
    assert h["in_flight"] == 0 and h["waiting"] == 0, h
    # Its call was still running (the backend streams for many seconds more): cancelled.
    assert h["counters"]["cancelled"] - before.get("cancelled", 0) == 1
    assert time.monotonic() - t0 < 8
    # The server aborted the connection: what the kernel held, then end of stream or reset.
    sock.settimeout(30)
    with contextlib.suppress(ConnectionResetError):
      drained = 0
      while chunk := sock.recv(1 << 20):
        drained += len(chunk)
  finally:
    sock.close()
  status, _, body = _chat(keyed, "alice", stream=False)
  assert status == 200 and body["choices"][0]["message"]["content"] == "echo: one two three"
  assert _metric(keyed, "gp_router_streams_stalled_total") == h["counters"]["stream_stalled"]


def test_max_tokens_over_the_config_cap_is_clamped(keyed, calm):
  for field in ("max_tokens", "max_completion_tokens"):
    base = len(calm.bodies)
    status, _, body = _chat(keyed, "bob", **{field: 1 << 20})
    assert status == 200, body
    assert [b["max_tokens"] for b in calm.bodies[base:]] == [TOKEN_CAP]
  status, _, _ = _chat(keyed, "bob", max_tokens=7)   # within the cap: as asked
  assert status == 200 and calm.bodies[-1]["max_tokens"] == 7
  status, _, body = _chat(keyed, "bob", max_tokens=(1 << 20) + 1)   # outside [1, 2^20]: 400
  assert status == 400 and body["error"]["param"] == "max_tokens"


def _prompts(n: int, size: int) -> list[str]:
  """n unique texts of `size` characters (words of one shared random text behind a number)."""
  rng = np.random.default_rng(0)
  words = " ".join(f"w{int(i)}" for i in rng.integers(0, 100_000, size // 4))
  return [(f"prompt {i} of the flood: " + words)[:size] for i in range(n)]


def _rss_mb(pid: int) -> float:
  with open(f"/proc/{pid}/status") as f:
    for line in f:
      if line.startswith("VmRSS:"):
        return int(line.split()[1]) / 1024
  raise AssertionError("no VmRSS")


def test_a_flood_of_unique_large_prompts_keeps_the_servers_rss_bounded(workdir, tmp_path):
  """100 unique 512 KiB prompts (under the 1 MiB body cap) on the simulator, 4 at a time. The
  route log is a file (its RAM holds references to its records), so what could grow is the
  encoder's cache, the simulator's queries and what the allocator keeps."""
  srv = process.RouterProcess([f"--workdir={workdir}", f"--memory_path={tmp_path / 'memory.npz'}"],
                              tmp_path / "server.log").start()
  try:
    texts = _prompts(108, PROMPT_BYTES)

    def ask(text):
      status, _, body = _http(srv, "POST", "/v1/chat/completions", dict(
          model="graphplanner", messages=[{"role": "user", "content": text}]))
      assert status == 200, body
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
      list(pool.map(ask, texts[100:]))   # warm-up: 4 large requests at once set the heap's peak
      rss0 = _rss_mb(srv.proc.pid)
      list(pool.map(ask, texts[:100]))
    grown = _rss_mb(srv.proc.pid) - rss0
    assert grown < FLOOD_RSS_BOUND_MB, f"RSS grew by {grown:.1f} MB"
  finally:
    srv.stop()


def test_the_bounds_settings():
  s = settings_lib.from_config(serve_config.get_config())
  assert s.http.stream_write_timeout_s == 30.0 and s.session_kwargs()["max_key_concurrency"] is None
  for section, name, value in (("http", "stream_write_timeout_s", 0.0),
                               ("engine", "max_key_concurrency", -1)):
    c = serve_config.get_config()
    c[section][name] = value
    with pytest.raises(errors.ConfigError, match=name):
      settings_lib.from_config(c)


def test_waiting_requests_get_slots_round_robin_by_key():
  counters = collections.Counter()
  adm = admission_lib.Admissions(1, 10, counters, max_key_concurrency=3)
  assert admission_lib.Admissions(64, None, counters).max_key_concurrency == 16   # default
  order = []

  async def run():
    gate = asyncio.Event()

    async def job(key, tag):
      async with adm.admit(key):
        order.append(tag)
        await gate.wait()
    tasks = [asyncio.create_task(job("a", "a0"))]
    await asyncio.sleep(0)
    for key, tag in (("a", "a1"), ("a", "a2"), ("b", "b0"), ("b", "b1"), ("c", "c0")):
      tasks.append(asyncio.create_task(job(key, tag)))
      await asyncio.sleep(0)
    with pytest.raises(engine_errors.Refusal) as e:   # a: 3 places already
      adm.admit("a")
    assert e.value.code == admission_lib.KEY_CODE and e.value.retry_after_s >= 1
    adm.admit(None).cancel()   # no key: not capped
    assert (adm.in_flight, adm.waiting, dict(adm.per_key)) == (1, 5, {"a": 3, "b": 2, "c": 1})
    gate.set()
    await asyncio.gather(*tasks)
  asyncio.run(run())
  # First come first served would give a1, a2, b0, b1, c0; by key in turn it is:
  assert order == ["a0", "a1", "b0", "c0", "a2", "b1"]
  assert (adm.in_flight, adm.waiting, dict(adm.per_key)) == (0, 0, {})
  assert counters["key_overloaded"] == 1


def test_a_key_over_its_cap_is_refused_at_admission_and_holds_nothing():
  adm = admission_lib.Admissions(4, 4, collections.Counter(), max_key_concurrency=1)
  adm.admit("a")
  with pytest.raises(engine_errors.Refusal):
    adm.admit("a")
  assert adm.waiting == 1 and dict(adm.per_key) == {"a": 1}
  assert adm.admit("b").key == "b" and adm.per_key["b"] == 1


def test_the_simulator_keeps_at_most_its_cap_of_adopted_queries():
  world = sim.SimWorld(sim.load_profiles(catalog_lib.load_catalog()))
  own = world.sample_queries(3, seed=0, split="train")
  world.served_capacity = 2
  first = world.adopt_query("first question " + "x" * 10_000, "mmlu")
  kids = world.children(first, sorted(world.profiles)[0], 3, False)
  second = world.adopt_query("second question", "mmlu")
  assert world.lookup(first.text) == first and world.lookup(kids[0].text) == kids[0]
  world.adopt_query("third question", "gsm8k")   # evicts the least recently used: second
  assert world.lookup(second.text) is None and world.served_queries == 2
  world.adopt_query("fourth question", "gsm8k")   # then first, its sub-questions with it
  assert world.lookup(first.text) is None and world.lookup(kids[0].text) is None
  assert world.served_queries == 2 and not any(k[0] == first.key
                                               for k in world._children_cache)
  assert all(world.lookup(q.query) is not None for q in own)   # the world's own stay
  again = world.adopt_query(first.text, "mmlu")   # the same latents when it comes back
  assert again == first and world.served_queries == 2


def test_the_encoder_cache_and_simulated_queries_stay_at_their_caps(workdir):
  """In process: 40 unique 64 KiB requests with the caps set low; an evicted query served again
  gets the same answer."""
  s = session_lib.RouterSession(served_config.load_config(workdir, {}), workdir,
                                max_concurrency=4)
  s.featurizer.encoder.capacity = 24
  s.world.served_capacity = 8
  texts = _prompts(40, 64 << 10)

  async def run():
    first = await s.complete(texts[0], seed=1)
    for i in range(1, len(texts), 4):
      await asyncio.gather(*[s.complete(t, seed=1) for t in texts[i:i + 4]])
    assert len(s.featurizer.encoder) == 24 and s.world.served_queries == 8
    assert s.world.lookup(" ".join(texts[0].split())) is None   # evicted
    again = await s.complete(texts[0], seed=1)
    assert again.answer == first.answer
    assert [c["llm"] for c in again.record["calls"]] == [c["llm"] for c in first.record["calls"]]
    await s.aclose()
  asyncio.run(run())
