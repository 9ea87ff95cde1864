"""OpenAIPool against the local fake OpenAI-compatible server: retries, faults, limits, balancing."""
import asyncio
import pathlib
import subprocess
import sys
import time

import pytest

from gp_jax import errors
from gp_jax.llm import base
from gp_jax.llm import catalog as catalog_lib
from gp_jax.llm import openai_pool
from gp_jax.llm import testing_server

QWEN = "qwen2.5-7b-instruct"      # $0.20 / M tokens
NEMO = "llama-3.3-nemotron-super-49b-v1"  # $0.90 / M tokens
MSG = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "what is two plus two"}]


@pytest.fixture(scope="module")
def catalog():
  return catalog_lib.load_catalog()


def make_pool(catalog, *urls, name=QWEN, **kwargs):
  kwargs.setdefault("backoff_base_s", 0.005)
  kwargs.setdefault("backoff_max_s", 0.02)
  kwargs.setdefault("timeout_s", 5.0)
  return openai_pool.OpenAIPool(catalog, {name: [{"base_url": u, "model": "m"} for u in urls]},
                                **kwargs)


def run_calls(pool, n, model=QWEN, messages=MSG, params=base.SamplingParams()):
  async def go():
    try:
      return await asyncio.gather(*[pool.chat(model, messages, params) for _ in range(n)])
    finally:
      await pool.aclose()
  return asyncio.run(go())


def test_success_usage_cost_and_payload(catalog):
  with testing_server.FakeOpenAIServer(models=("m",)) as srv:
    pool = make_pool(catalog, srv.url, name=NEMO)
    params = base.SamplingParams(temperature=0.5, max_tokens=64, seed=7, stop=("\n\n",))
    (c,) = run_calls(pool, 1, model=NEMO, params=params)
    body = srv.bodies[0]
  assert c.ok and c.text == "echo: what is two plus two"
  # The fake counts words + 2 per message: (2 + 2) + (5 + 2) in, 6 out ("echo:" + 5 words).
  assert (c.input_tokens, c.output_tokens) == (11, 6)
  assert c.cost_usd == pytest.approx((11 + 6) * 0.9e-6)
  assert c.latency_s > 0
  assert body["model"] == "m" and body["seed"] == 7 and body["stop"] == ["\n\n"]
  assert body["temperature"] == 0.5 and body["max_tokens"] == 64 and body["messages"] == MSG
  s = pool.stats()
  assert (s["calls"], s["ok"], s["failed"], s["input_tokens"]) == (1, 1, 0, 11)
  assert s["cost_usd"] == pytest.approx(c.cost_usd)


@pytest.mark.parametrize("fault,kind", [("http_500", "http_500"), ("http_429", "http_429"),
                                        ("reset", "connection")])
def test_retries_transient_faults(catalog, fault, kind):
  with testing_server.FakeOpenAIServer(script=[fault, fault]) as srv:
    pool = make_pool(catalog, srv.url, max_retries=3)
    (c,) = run_calls(pool, 1)
    assert srv.requests == 3
  assert c.ok
  s = pool.stats()
  assert s["retries"] == 2 and s[f"faults/{kind}"] == 2 and s["failed"] == 0


def test_gives_up_after_max_retries(catalog):
  with testing_server.FakeOpenAIServer(script=["http_500"] * 10) as srv:
    pool = make_pool(catalog, srv.url, max_retries=2)
    (c,) = run_calls(pool, 1)
    assert srv.requests == 3
  assert c.error == "http_500" and c.text == "" and c.cost_usd == 0.0
  s = pool.stats()
  assert s["errors/http_500"] == 1 and s["faults/http_500"] == 3 and s["failed"] == 1


def test_no_retry_on_4xx(catalog):
  # The fake answers 404 for a model it does not serve: a client error, never retried.
  with testing_server.FakeOpenAIServer(models=("other",)) as srv:
    pool = make_pool(catalog, srv.url, max_retries=3)
    (c,) = run_calls(pool, 1)
    assert srv.requests == 1
  assert c.error == "http_404"
  assert pool.stats()["retries"] == 0


def test_no_retry_on_400(catalog):
  with testing_server.FakeOpenAIServer() as srv:
    pool = make_pool(catalog, srv.url, max_retries=3)
    (c,) = run_calls(pool, 1, messages=[])  # the fake rejects an empty message list with 400
    assert srv.requests == 1
  assert c.error == "http_400" and pool.stats()["errors/http_400"] == 1


def test_malformed_and_empty_are_failed_calls(catalog):
  with testing_server.FakeOpenAIServer(script=["malformed", "empty"]) as srv:
    pool = make_pool(catalog, srv.url, max_retries=3)
    first = run_calls(pool, 1)[0]
    second = run_calls(pool, 1)[0]
    assert srv.requests == 2  # neither is retried
  assert first.error == "malformed" and first.text == ""
  # An empty answer was billed for its prompt: tokens and cost are kept.
  assert second.error == "empty" and second.input_tokens == 11 and second.cost_usd > 0
  s = pool.stats()
  assert s["errors/malformed"] == 1 and s["errors/empty"] == 1 and s["failed"] == 2


def test_timeout_is_bounded(catalog):
  with testing_server.FakeOpenAIServer(script=["timeout"] * 5, timeout_sleep_s=30.0) as srv:
    pool = make_pool(catalog, srv.url, timeout_s=0.2, max_retries=1)
    t0 = time.monotonic()
    (c,) = run_calls(pool, 1)
    elapsed = time.monotonic() - t0
    assert srv.requests == 2
  assert c.error == "timeout" and elapsed < 2.0
  assert pool.stats()["faults/timeout"] == 2


def test_total_timeout_caps_retries(catalog):
  with testing_server.FakeOpenAIServer(script=["timeout"] * 20, timeout_sleep_s=30.0) as srv:
    pool = make_pool(catalog, srv.url, timeout_s=0.3, max_retries=10, total_timeout_s=0.5)
    t0 = time.monotonic()
    (c,) = run_calls(pool, 1)
    assert time.monotonic() - t0 < 1.5
  assert c.error == "timeout"


def test_unreachable_server_fails_fast_and_never_raises(catalog):
  pool = make_pool(catalog, "http://127.0.0.1:9", max_retries=2, connect_timeout_s=0.5)
  t0 = time.monotonic()
  (c,) = run_calls(pool, 1)
  assert c.error == "connection" and time.monotonic() - t0 < 3.0
  assert pool.stats()["faults/connection"] == 3


def test_concurrency_limit_per_endpoint(catalog):
  with testing_server.FakeOpenAIServer(latency_s=0.05) as srv:
    pool = make_pool(catalog, srv.url, max_concurrency=3)
    out = run_calls(pool, 12)
    assert srv.max_in_flight == 3
  assert all(c.ok for c in out)


def test_balances_over_replicas_by_load(catalog):
  with testing_server.FakeOpenAIServer(latency_s=0.2) as slow, \
       testing_server.FakeOpenAIServer(latency_s=0.01) as fast:
    pool = make_pool(catalog, slow.url, fast.url, max_concurrency=4)
    out = run_calls(pool, 40)
    n_slow, n_fast = slow.requests, fast.requests
  assert all(c.ok for c in out) and n_slow + n_fast == 40
  # The fast replica frees its slots ~20x sooner, so it must take most of the calls.
  assert n_fast >= 3 * n_slow > 0


def test_equal_replicas_share_load(catalog):
  with testing_server.FakeOpenAIServer(latency_s=0.05) as a, \
       testing_server.FakeOpenAIServer(latency_s=0.05) as b:
    pool = make_pool(catalog, a.url, b.url, max_concurrency=8)
    run_calls(pool, 32)
    assert a.requests == b.requests == 16
    assert a.max_in_flight == b.max_in_flight == 8


def test_failover_to_healthy_replica(catalog):
  with testing_server.FakeOpenAIServer(latency_s=0.01) as good:
    pool = make_pool(catalog, "http://127.0.0.1:9", good.url, max_retries=2, connect_timeout_s=0.5)
    out = run_calls(pool, 8)
  assert all(c.ok for c in out)


def test_fault_mix_never_hangs_and_counts_everything(catalog):
  with testing_server.FakeOpenAIServer(latency_s=0.01, fault_rate=0.5, timeout_sleep_s=30.0,
                                       seed=3) as srv:
    pool = make_pool(catalog, srv.url, timeout_s=0.3, max_retries=2, max_concurrency=16)
    t0 = time.monotonic()
    out = run_calls(pool, 60)
    elapsed = time.monotonic() - t0
    sent = dict(srv.faults_sent)
  assert elapsed < 10.0
  s = pool.stats()
  assert s["calls"] == 60 and s["ok"] + s["failed"] == 60
  assert s["ok"] == sum(c.ok for c in out) and s["failed"] == sum(not c.ok for c in out)
  # Every injected fault shows up in the pool's counters under its kind.
  kinds = {"timeout": "timeout", "http_500": "http_500", "http_429": "http_429",
           "reset": "connection", "malformed": "malformed", "empty": "empty"}
  for fault, n in sent.items():
    assert s.get(f"faults/{kinds[fault]}", 0) == n, (fault, sent, s)
  assert len(sent) == 6


def test_unknown_model_is_a_config_error(catalog):
  pool = make_pool(catalog, "http://127.0.0.1:9")
  with pytest.raises(errors.ConfigError, match="unknown LLM"):
    asyncio.run(pool.chat("gpt-9", MSG))
  with pytest.raises(errors.ConfigError, match="has no endpoint"):
    asyncio.run(pool.chat(NEMO, MSG))


def test_usable_from_successive_event_loops(catalog):
  with testing_server.FakeOpenAIServer() as srv:
    pool = make_pool(catalog, srv.url)
    a = asyncio.run(pool.chat(QWEN, MSG))
    b = asyncio.run(pool.chat(QWEN, MSG))
  assert a.ok and b.ok and a.text == b.text


def test_check_at_startup(catalog, tmp_path):
  with pytest.raises(errors.BackendError, match="unreachable"):
    make_pool(catalog, "http://127.0.0.1:9", check=True, connect_timeout_s=0.5)
  with testing_server.FakeOpenAIServer(models=("m",)) as srv:
    make_pool(catalog, srv.url, check=True)
  with testing_server.FakeOpenAIServer(models=("x",)) as srv:
    with pytest.raises(errors.BackendError, match="does not serve model 'm'"):
      make_pool(catalog, srv.url, check=True)


def test_parse_chat_response_kinds():
  ok = b'{"choices": [{"message": {"content": "hi"}}], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}'
  assert openai_pool.parse_chat_response(200, ok) == ("hi", 3, 1)
  bad_bodies = [b"", b"[]", b'{"choices": []}', b'{"choices": [{"message": {"content": "x"}}]}',
                b'{"choices": [{"message": {"content": "x"}}], "usage": {"prompt_tokens": -1}}']
  for body in bad_bodies:
    with pytest.raises(openai_pool._Fault) as e:
      openai_pool.parse_chat_response(200, body)
    assert e.value.kind == "malformed" and not e.value.retryable
  with pytest.raises(openai_pool._Fault) as e:
    openai_pool.parse_chat_response(503, b"", {"Retry-After": "2"})
  assert e.value.kind == "http_503" and e.value.retryable and e.value.retry_after == 2.0
  with pytest.raises(openai_pool._Fault) as e:
    openai_pool.parse_chat_response(401, b"")
  assert not e.value.retryable


def test_fake_server_as_subprocess(catalog):
  import os
  import subprocess
  import sys
  from gp_jax import paths
  proc = subprocess.Popen(
      [sys.executable, "-m", "gp_jax.llm.testing_server", "--port", "0", "--models", "m",
       "--fault_rate", "1.0", "--faults", "http_500"],
      stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(paths.REPO_ROOT)})
  try:
    line = proc.stdout.readline().strip()
    assert line.startswith("listening on http://127.0.0.1:")
    pool = make_pool(catalog, line.split()[-1] + "/v1", max_retries=1, check=True)
    (c,) = run_calls(pool, 1)
    assert c.error == "http_500" and pool.stats()["faults/http_500"] == 2
  finally:
    proc.terminate()
    proc.wait(10)


_EXIT_SCRIPT = """
import gc
from gp_jax.llm import base, catalog as catalog_lib, openai_pool, testing_server
from gp_jax.util import aio
with testing_server.FakeOpenAIServer(models=("m",)) as srv:
  pool = openai_pool.OpenAIPool(catalog_lib.load_catalog(),
                                {"qwen2.5-7b-instruct": [{"base_url": srv.url, "model": "m"}]})
  c = aio.run(pool.chat("qwen2.5-7b-instruct", [{"role": "user", "content": "hi"}],
                        base.SamplingParams()))
  assert c.ok, c
  del pool                 # a runner that never closes its pool, then the garbage collector
  gc.collect()
print("done")
"""


def test_unclosed_pool_on_the_reused_loop_exits_without_warnings():
  """A pool used through gp_jax.util.aio and never closed: its session is closed at exit, silently."""
  repo = pathlib.Path(__file__).resolve().parents[2]
  p = subprocess.run([sys.executable, "-c", _EXIT_SCRIPT], cwd=repo, capture_output=True,
                     text=True, timeout=120)
  assert p.returncode == 0 and p.stdout.strip() == "done", p.stderr[-2000:]
  for warning in ("Unclosed", "Task was destroyed"):
    assert warning not in p.stderr, p.stderr[-2000:]
