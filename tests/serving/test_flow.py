"""The router server's request flow: backpressure (429 beyond the wait queue), cancellation of a
disconnected client's workflow, streams that open at once with keep-alives and the final call's
tokens, sampling fields reaching the backbones, finish_reason "length", refused fields,
x-request-id, the conversation as context.

A real `python -m experiments.serve_router` process serves the test router over the local
OpenAI-compatible test server (gp_jax/llm/testing_server.py), which counts and records every
backbone call and whose latency each test sets; the conversation on the simulator and the
worker thread are checked in process.
"""
import asyncio
import json
import re
import threading
import time
import types

import aiohttp
import numpy as np
import openai
import pytest

from experiments import serve_router_process as process
from experiments.configs import test as test_config
from gp_jax import errors
from gp_jax.llm import testing_server
from gp_jax.serving.engine import config as served_config
from gp_jax.serving.engine import conversation as conversation_lib
from gp_jax.workflow import prompts

QUERY = "Which planet in the solar system has the most moons, and how many were confirmed by 2023?"
LLMS = test_config.get_config().llms.split(",")


@pytest.fixture(scope="module")
def backend():
  with testing_server.FakeOpenAIServer(models=tuple(LLMS)) as srv:
    yield srv


@pytest.fixture(scope="module")
def router(workdir, backend, tmp_path_factory):
  """The router on the test server: 2 workflows at once, 2 more may wait, keep-alives every
  0.2 s, 10 s to answer."""
  state = tmp_path_factory.mktemp("flow")
  endpoints = state / "endpoints.json"
  endpoints.write_text(json.dumps({m: [{"base_url": backend.url, "model": m}] for m in LLMS}))
  srv = process.RouterProcess([f"--workdir={workdir}", "--memory_path=none",
                               "--config.backend=endpoints", f"--config.endpoints_file={endpoints}",
                               "--max_concurrency=2", "--max_queue=2", "--keepalive_s=0.2",
                               "--deadline_s=10"],
                              state / "server.log").start()
  yield srv
  srv.stop()


@pytest.fixture
def calm(backend):
  """The test server answers at once, without faults, after the test too."""
  backend.config.latency_s, backend.config.fault_rate = 0.0, 0.0
  yield backend
  backend.config.latency_s, backend.config.fault_rate = 0.0, 0.0


def _client(srv, **kw) -> openai.OpenAI:
  return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120,
                       **kw)


def _health(srv) -> dict:
  async def get():
    async with aiohttp.ClientSession() as http:
      async with http.get(srv.url + "/health") as r:
        return await r.json()
  return asyncio.run(get())


def _wait_for(cond, what: str, timeout_s: float = 60.0) -> None:
  t0 = time.monotonic()
  while not cond():
    assert time.monotonic() - t0 < timeout_s, f"timed out waiting for {what}"
    time.sleep(0.05)


def _route_length(srv) -> int:
  """Backbone calls of one plain request for QUERY (the greedy route is deterministic)."""
  c = _client(srv).chat.completions.create(model="graphplanner",
                                           messages=[{"role": "user", "content": QUERY}])
  return len(c.model_extra["graphplanner"]["route"])


def _chat_body(**extra) -> dict:
  return dict(model="graphplanner", messages=[{"role": "user", "content": QUERY}], **extra)


def test_requests_beyond_the_queue_get_429_at_once_and_none_hang(router, calm):
  calm.config.latency_s = 0.3   # each workflow takes seconds: the 4 places stay taken
  before = _health(router)["counters"].get("overloaded", 0)

  async def one(client, i):
    t0 = time.monotonic()
    try:
      c = await client.chat.completions.create(
          model="graphplanner", messages=[{"role": "user", "content": f"{QUERY} ({i})"}])
      return "ok", time.monotonic() - t0, c
    except openai.RateLimitError as e:
      return "429", time.monotonic() - t0, e

  async def run():
    client = openai.AsyncOpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0,
                                timeout=120)
    try:
      return await asyncio.gather(*[one(client, i) for i in range(12)])
    finally:
      await client.close()

  out = asyncio.run(run())
  ok = [r for r in out if r[0] == "ok"]
  refused = [r for r in out if r[0] == "429"]
  assert len(ok) + len(refused) == 12
  assert len(ok) >= 4 and refused, [r[0] for r in out]   # 2 running + 2 waiting at least
  for _, _, e in refused:
    assert e.status_code == 429 and e.body["code"] == "server_overloaded"
    assert int(e.response.headers["retry-after"]) >= 1
    assert e.response.headers["x-request-id"]
  # Refused at once: every 429 came back before the first answer.
  assert max(t for _, t, _ in refused) < min(t for _, t, _ in ok)
  assert all(c.choices[0].message.content for _, _, c in ok)
  h = _health(router)
  assert h["counters"]["overloaded"] - before == len(refused)
  assert h["waiting"] == 0 and h["in_flight"] == 0 and h["max_queue"] == 2


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_disconnects_cancels_its_workflow(router, calm, stream):
  n = _route_length(router)
  assert n >= 3, n   # the route has calls left to cancel
  calm.config.latency_s = 0.4
  h0 = _health(router)["counters"]
  base = calm.requests

  async def leave_after_first_call():
    async with aiohttp.ClientSession() as http:
      resp = await http.post(router.url + "/v1/chat/completions", json=_chat_body(stream=stream))
      if stream:
        assert resp.status == 200
        first = await resp.content.readline()
        assert b'"role": "assistant"' in first
      while calm.requests < base + 2:   # the second backbone call is under way
        await asyncio.sleep(0.02)
      resp.close()   # the client leaves

  async def leave_non_stream():
    # Without a stream the client has no response until the end: close while the request runs.
    async with aiohttp.ClientSession() as http:
      task = asyncio.ensure_future(http.post(router.url + "/v1/chat/completions",
                                             json=_chat_body()))
      while calm.requests < base + 2:
        await asyncio.sleep(0.02)
      task.cancel()
      await asyncio.gather(task, return_exceptions=True)

  asyncio.run(leave_after_first_call() if stream else leave_non_stream())
  _wait_for(lambda: _health(router)["counters"].get("cancelled", 0) > h0.get("cancelled", 0),
            "the workflow to be cancelled")
  settled = calm.requests
  time.sleep(2.5)   # about 6 backbone latencies: an uncancelled workflow would call again
  assert calm.requests == settled < base + n
  h = _health(router)["counters"]
  assert h["client_gone"] - h0.get("client_gone", 0) == 1
  assert h["cancelled_calls"] - h0.get("cancelled_calls", 0) >= 1   # the calls it had spent
  log = router.log_path.read_text()
  assert re.search(r"cancelled chatcmpl-\w+ \(x-request-id req-\w+\): \d+ backbone calls done", log)


def test_a_stream_opens_at_once_keeps_alive_and_streams_the_final_call(router, calm):
  n = _route_length(router)
  plain = _client(router).chat.completions.create(
      model="graphplanner", messages=[{"role": "user", "content": QUERY}])
  calm.config.latency_s = 0.4   # the workflow takes n x 0.4 s; keep-alives every 0.2 s
  base = len(calm.bodies)

  async def read():
    events, calls_at_first = [], None
    async with aiohttp.ClientSession() as http:
      async with http.post(router.url + "/v1/chat/completions",
                           json=_chat_body(stream=True)) as resp:
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        buf = b""
        async for piece in resp.content.iter_any():
          if calls_at_first is None:
            calls_at_first = len(calm.bodies) - base
          buf += piece
        events = [e for e in buf.decode().split("\n\n") if e]
    return events, calls_at_first

  events, calls_at_first = asyncio.run(read())
  assert calls_at_first < n   # the first bytes came while the workflow still ran
  first = json.loads(events[0][len("data: "):])
  assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
  keepalives = [e for e in events if e.startswith(":")]
  assert keepalives and all(e == ": keep-alive" for e in keepalives)
  assert events[-1] == "data: [DONE]"
  chunks = [json.loads(e[len("data: "):]) for e in events
            if e.startswith("data: {") and json.loads(e[len("data: "):])["choices"]]
  pieces = [c["choices"][0]["delta"].get("content") for c in chunks[1:]]
  pieces = [p for p in pieces if p]
  assert "".join(pieces) == plain.choices[0].message.content
  # The final call was streamed by the backend: its request asked for a stream, and its answer
  # came in as many pieces as the test server sends (one per word).
  bodies = calm.bodies[base:]
  assert bodies[-1].get("stream") is True and not any(b.get("stream") for b in bodies[:-1])
  assert len(pieces) == len(plain.choices[0].message.content.split(" "))
  assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
  # The official client reads the same stream (keep-alive comments are skipped).
  text = "".join(ch.choices[0].delta.content or "" for ch in _client(router).chat.completions.create(
      stream=True, **_chat_body()) if ch.choices)
  assert text == plain.choices[0].message.content
  # A streamed pass-through call is relayed piece by piece as well.
  base = len(calm.bodies)
  pieces = [ch.choices[0].delta.content for ch in _client(router).chat.completions.create(
      model=LLMS[0], stream=True, messages=[{"role": "user", "content": "one two three"}])
      if ch.choices and ch.choices[0].delta.content]
  assert pieces == ["echo: ", "one ", "two ", "three"] and calm.bodies[base]["stream"] is True


def test_an_error_after_the_stream_opened_is_an_sse_error_event(router, calm):
  calm.config.fault_rate, calm.config.faults = 1.0, ("malformed",)
  with pytest.raises(openai.APIError) as e:
    list(_client(router).chat.completions.create(stream=True, **_chat_body()))
  assert e.value.body["code"] == "backbone_error"


def test_a_stream_past_the_deadline_ends_with_a_timeout_event(router, calm):
  calm.config.latency_s = 4.0   # three calls take longer than the 10 s deadline
  before = _health(router)["counters"]
  with pytest.raises(openai.APIError) as e:
    list(_client(router).chat.completions.create(stream=True, **_chat_body()))
  assert e.value.body["code"] == "timeout"
  after = _health(router)["counters"]
  assert after["timeout"] - before.get("timeout", 0) == 1
  assert after["cancelled"] - before.get("cancelled", 0) == 1   # its workflow was cancelled


def test_sampling_fields_reach_the_final_call(router, calm):
  base = len(calm.bodies)
  c = _client(router).chat.completions.create(
      temperature=0.3, top_p=0.9, max_tokens=300, stop=["###"], seed=11, **_chat_body())
  bodies = calm.bodies[base:]
  assert len(bodies) == len(c.model_extra["graphplanner"]["route"]) >= 2
  final = bodies[-1]
  assert (final["temperature"], final["top_p"], final["max_tokens"], final["stop"]) == (
      0.3, 0.9, 300, ["###"])
  sampling = test_config.get_config().sampling
  for b in bodies[:-1]:   # the workflow's inner calls keep the served config's sampling
    assert (b["temperature"], b["max_tokens"]) == (sampling.temperature, sampling.max_tokens)
    assert "stop" not in b
  assert {b["seed"] for b in bodies} == {11}   # the request's seed is the episode's
  assert c.choices[0].finish_reason == "stop"
  # max_completion_tokens is the same cap.
  base = len(calm.bodies)
  _client(router).chat.completions.create(max_completion_tokens=400, **_chat_body())
  assert calm.bodies[-1]["max_tokens"] == 400


def test_finish_reason_length_when_the_final_call_was_cut(router, calm):
  c = _client(router).chat.completions.create(max_tokens=2, **_chat_body())
  assert c.choices[0].finish_reason == "length"
  assert len(c.choices[0].message.content.split()) == 2
  chunks = list(_client(router).chat.completions.create(max_tokens=2, stream=True, **_chat_body()))
  assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
  # A pass-through call cut by its cap, too.
  p = _client(router).chat.completions.create(model=LLMS[0], max_tokens=1,
                                              messages=[{"role": "user", "content": QUERY}])
  assert p.choices[0].finish_reason == "length"


@pytest.mark.parametrize("field,value", [
    ("tools", [{"type": "function", "function": {"name": "f", "parameters": {}}}]),
    ("tool_choice", "auto"), ("functions", [{"name": "f"}]),
    ("response_format", {"type": "json_object"}), ("logprobs", True), ("top_logprobs", 2),
    ("n", 2), ("audio", {"voice": "alloy", "format": "wav"}), ("modalities", ["text", "audio"]),
    ("logit_bias", {"50256": -100}), ("presence_penalty", 0.5),
])
def test_unsupported_fields_are_refused_by_name(router, calm, field, value):
  base = calm.requests
  with pytest.raises(openai.BadRequestError) as e:
    _client(router).chat.completions.create(**{field: value}, **_chat_body())
  assert e.value.body["code"] == "unsupported_parameter" and e.value.body["param"] == field
  assert calm.requests == base   # refused before any backbone call


def test_tool_messages_are_refused_and_accepted_defaults_pass(router, calm):
  messages = [{"role": "user", "content": "hi"},
              {"role": "assistant", "content": None,
               "tool_calls": [{"id": "1", "type": "function",
                               "function": {"name": "f", "arguments": "{}"}}]},
              {"role": "tool", "tool_call_id": "1", "content": "42"},
              {"role": "user", "content": QUERY}]
  with pytest.raises(openai.BadRequestError) as e:
    _client(router).chat.completions.create(model="graphplanner", messages=messages)
  assert e.value.body["code"] == "unsupported_parameter" and e.value.body["param"] == "messages[1]"
  # The values that ask for nothing unsupported are accepted.
  c = _client(router).chat.completions.create(n=1, logprobs=False, response_format={"type": "text"},
                                              presence_penalty=0, **_chat_body())
  assert c.choices[0].message.content


def test_x_request_id_is_honoured_and_returned_on_every_response(router, calm):
  async def send(method, path, headers=None, body=None):
    async with aiohttp.ClientSession() as http:
      async with http.request(method, router.url + path, headers=headers or {},
                              json=body) as r:
        await r.read()
        return r.status, r.headers.get("x-request-id")

  async def run():
    mine = {"x-request-id": "client-42:abc"}
    return [await send("POST", "/v1/chat/completions", mine, _chat_body()),
            await send("POST", "/v1/chat/completions", mine, _chat_body(stream=True)),
            await send("POST", "/v1/chat/completions", mine, {"model": "nope", "messages": []}),
            await send("GET", "/health", mine),
            await send("GET", "/v1/no-such-path", mine),
            await send("GET", "/health"),
            await send("GET", "/health", {"x-request-id": "has a space"}),
            await send("GET", "/health", {"x-request-id": "x" * 129})]

  out = asyncio.run(run())
  assert [s for s, _ in out[:5]] == [200, 200, 404, 200, 404]
  assert all(x == "client-42:abc" for _, x in out[:5])
  generated = [x for _, x in out[5:]]
  assert all(re.fullmatch(r"req-[0-9a-f]{32}", x) for x in generated)
  assert len(set(generated)) == 3


def test_the_conversation_reaches_the_root_calls(router, calm):
  base = len(calm.bodies)
  messages = [{"role": "system", "content": "Answer in French.\nBe brief."},
              {"role": "user", "content": "What is the largest planet?"},
              {"role": "assistant", "content": "Jupiter."},
              {"role": "user", "content": QUERY}]
  c = _client(router).chat.completions.create(model="graphplanner", messages=messages)
  calls = c.model_extra["graphplanner"]["route"]
  bodies = calm.bodies[base:]
  block = ("Conversation before this question (oldest first):\nSystem: Answer in French. Be "
           "brief.\nUser: What is the largest planet?\nAssistant: Jupiter.\n\n")
  for call, body in zip(calls, bodies):
    user = next(m["content"] for m in body["messages"] if m["role"] == "user")
    assert user.startswith(block) == (call["node"] == 0), (call, user[:200])
    if call["node"] == 0:   # the query is still the question the prompt asks
      lines = user.splitlines()
      assert f"{prompts.QUESTION}{QUERY}" in lines or f"{prompts.MAIN_QUESTION}{QUERY}" in lines
  assert any(call["node"] == 0 for call in calls)


def test_conversation_block_is_capped_system_first_newest_turns():
  msgs = [{"role": "system", "content": "S" * 50}]
  msgs += [{"role": r, "content": f"{r} turn {i} " + "w" * 30}
           for i in range(40) for r in ("user", "assistant")]
  msgs += [{"role": "user", "content": "the query"}]
  block = conversation_lib.render(msgs, max_chars=400)
  lines = block.splitlines()
  assert len("\n".join(lines[1:])) <= 400
  assert lines[1] == "System: " + "S" * 50
  assert lines[-1].startswith("Assistant: assistant turn 39")   # the newest turns are kept
  assert re.match(r"Conversation before this question \(oldest first, \d+ older messages left "
                  r"out\):", lines[0])
  assert "the query" not in block
  assert conversation_lib.render([{"role": "user", "content": "only the query"}]) == ""


@pytest.mark.parametrize("policy_thread", ["thread", "loop"])
def test_on_the_simulator_context_keeps_the_query_and_compute_runs_where_asked(workdir,
                                                                              policy_thread):
  """In process: with a conversation the simulator still reads every call's question (no call
  fails to be recognised); a request's first encoding runs in the worker thread (a call's row,
  with the hashing encoder, on the loop), and the policy calls where policy_thread says (the
  worker thread, or the event loop's)."""
  from gp_jax.serving.engine import session as session_lib
  s = session_lib.RouterSession(served_config.load_config(workdir, {}), workdir, max_concurrency=2,
                                policy_thread=policy_thread)
  threads = set()
  act_each, encode = s.runner.act_each, s.featurizer.encoder.encode

  def spy_act(*a, **k):
    threads.add(("policy", threading.current_thread().name))
    return act_each(*a, **k)

  def spy_encode(*a, **k):
    threads.add(("encode", threading.current_thread().name))
    return encode(*a, **k)

  s.runner.act_each = spy_act
  s.featurizer.encoder.encode = spy_encode
  context = conversation_lib.render([{"role": "system", "content": "Question: not the query"},
                                 {"role": "user", "content": QUERY}])

  async def run():
    try:
      plain = await s.complete(QUERY, rid="chatcmpl-a", seed=3)
      with_context = await s.complete(QUERY, rid="chatcmpl-b", seed=3, conversation=context)
      return plain, with_context, threading.current_thread().name
    finally:
      await s.aclose()

  plain, with_context, loop_thread = asyncio.run(run())
  assert with_context.record["query"] == plain.record["query"]
  assert all(c["error"] is None for c in with_context.record["calls"])
  assert s.rows_on_loop   # the test config's hashing encoder
  assert {name for kind, name in threads if kind == "encode"} == {"router-compute_0",
                                                                  loop_thread}, threads
  policy = {name for kind, name in threads if kind == "policy"}
  assert policy == ({"router-compute_0"} if policy_thread == "thread" else {loop_thread}), threads
  assert s.health()["decisions"]["on_loop"] == (policy_thread == "loop")


def test_auto_runs_a_cheap_policy_on_the_loop_and_a_slow_one_off_it(workdir, monkeypatch):
  """policy_thread="auto" times the largest batch's call at start: within INLINE_POLICY_S the
  calls run on the loop, beyond it in the compute thread; /health says which."""
  from gp_jax.serving.engine import placement
  from gp_jax.serving.engine import session as session_lib
  config = served_config.load_config(workdir, {})
  for limit, on_loop in ((10.0, True), (0.0, False)):
    monkeypatch.setattr(placement, "INLINE_POLICY_S", limit)
    s = session_lib.RouterSession(config, workdir, max_concurrency=2)
    try:
      d = s.health()["decisions"]
      assert d["on_loop"] is on_loop and d["largest_call_s"] > 0
    finally:
      asyncio.run(s.aclose())
  with pytest.raises(errors.ConfigError, match="policy_thread"):
    session_lib.RouterSession(config, workdir, policy_thread="gpu")


@pytest.mark.parametrize("rows_on_loop", [True, False])
def test_compute_hops_per_request_and_each_decision_reads_the_calls_before_it(workdir,
                                                                             rows_on_loop):
  """In process: a request waits for the compute thread once (its encoding and first
  observation); with a cheap encoder (rows_on_loop) each call's memory row and the next
  observation are made on the loop, else each costs one more hop; decision i reads the memory
  rows of exactly the first i calls of its route."""
  from gp_jax.serving.engine import session as session_lib
  s = session_lib.RouterSession(served_config.load_config(workdir, {}), workdir, max_concurrency=2)
  assert s.rows_on_loop   # the test config's hashing encoder
  s.rows_on_loop = rows_on_loop   # as a server with an expensive encoder runs
  hops, seen = [], []
  off_loop, observe = s._off_loop, s.featurizer.observe

  async def spy_off_loop(fn, *a):
    hops.append(fn.__name__)
    return await off_loop(fn, *a)

  def spy_observe(state, t_emb, q_emb, rows, mask):
    seen.append(np.array(rows))
    return observe(state, t_emb, q_emb, rows, mask)

  s._off_loop, s.featurizer.observe = spy_off_loop, spy_observe

  async def run():
    try:
      return [await s.complete(QUERY, rid=f"chatcmpl-{i}", seed=i) for i in range(3)]
    finally:
      await s.aclose()

  served = asyncio.run(run())
  decisions = [x.record["timing"]["decisions"] for x in served]
  assert len(seen) == sum(decisions) and min(decisions) >= 1
  assert hops.count("_first_observation") == len(served)
  assert len(hops) == (len(served) if rows_on_loop else sum(decisions))
  at = 0
  for x, k in zip(served, decisions):
    calls = [types.SimpleNamespace(**c) for c in x.record["calls"]]
    assert len(calls) == k   # one call per decision
    for i in range(k):
      expect = s.featurizer.memory_rows(calls[:i], None)
      np.testing.assert_allclose(seen[at + i], expect, rtol=1e-6, atol=1e-6)
    at += k


def test_pool_streams_the_answer_in_pieces_and_retries_before_the_first():
  """OpenAIPool.chat_stream against the test server: the pieces as they come, the usage and
  finish_reason of the streamed answer, a fault before any piece retried like `chat`'s."""
  from gp_jax.llm import base
  from gp_jax.llm import catalog as catalog_lib
  from gp_jax.llm import openai_pool
  model = LLMS[0]
  messages = [{"role": "user", "content": "one two three four"}]
  with testing_server.FakeOpenAIServer(models=(model,), script=("http_500", None)) as srv:
    pool = openai_pool.OpenAIPool(catalog_lib.load_catalog(),
                                  {model: [{"base_url": srv.url, "model": model}]},
                                  backoff_base_s=0.01)

    async def run():
      try:
        pieces = []
        streamed = await pool.chat_stream(model, messages, base.SamplingParams(), pieces.append)
        cut = await pool.chat_stream(model, messages, base.SamplingParams(max_tokens=2),
                                     lambda _: None)
        plain = await pool.chat(model, messages, base.SamplingParams())
        return pieces, streamed, cut, plain
      finally:
        await pool.aclose()

    pieces, streamed, cut, plain = asyncio.run(run())
    assert srv.requests == 4 and srv.faults_sent == {"http_500": 1}
    assert srv.bodies[0]["stream"] is True and srv.bodies[0]["stream_options"] == {
        "include_usage": True}
  assert pieces == ["echo: ", "one ", "two ", "three ", "four"]
  assert streamed.text == plain.text == "".join(pieces) and streamed.error is None
  assert (streamed.input_tokens, streamed.output_tokens) == (plain.input_tokens,
                                                             plain.output_tokens)
  assert streamed.finish_reason == plain.finish_reason == "stop"
  assert cut.text == "echo: one" and cut.finish_reason == "length"
