"""ReplayPool: keys, modes, bit-for-bit replay, failures, and several writer processes."""
import asyncio
import multiprocessing
import sqlite3

import pytest

from gp_jax import errors
from gp_jax.llm import base
from gp_jax.llm import catalog as catalog_lib
from gp_jax.llm import replay


class CountingPool(base.LLMPool):
  """A test double: answers from the request, counts calls, and can fail the first n calls."""

  def __init__(self, catalog, fail_first=0, tag="", delay_s=0.0):
    super().__init__(catalog)
    self.calls = 0
    self.fail_first = fail_first
    self.tag = tag
    self.delay_s = delay_s

  async def chat(self, model, messages, params=base.SamplingParams()):
    self.calls += 1
    if self.delay_s:
      await asyncio.sleep(self.delay_s)
    if self.calls <= self.fail_first:
      return base.failed(model, "http_500", latency_s=0.125)
    text = f"{self.tag}{model}:{messages[-1]['content']}:{params.seed}:{params.temperature}"
    n_in, n_out = 3 * len(messages), len(text)
    return base.Completion(model, text, n_in, n_out, self.catalog.cost_usd(model, n_in, n_out),
                           latency_s=0.1 + 1e-9 * self.calls)


QWEN = "qwen2.5-7b-instruct"
MSG = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def catalog():
  return catalog_lib.load_catalog()


def test_key_covers_model_messages_and_params():
  k = replay.request_key(QWEN, MSG, base.SamplingParams())
  assert k == replay.request_key(QWEN, [dict(MSG[0])], base.SamplingParams())
  assert k != replay.request_key("gemma-2-9b-it", MSG, base.SamplingParams())
  assert k != replay.request_key(QWEN, [{"role": "user", "content": "hello!"}], base.SamplingParams())
  assert k != replay.request_key(QWEN, MSG, base.SamplingParams(seed=1))
  assert k != replay.request_key(QWEN, MSG, base.SamplingParams(temperature=0.7))
  assert k != replay.request_key(QWEN, MSG, base.SamplingParams(stop=("x",)))


def test_record_then_replay_bit_for_bit(catalog, tmp_path):
  path = tmp_path / "replay.sqlite"
  inner = CountingPool(catalog)
  rec = replay.ReplayPool(inner, path, "read-write")
  prompts = [[{"role": "user", "content": f"q{i}"}] for i in range(5)]

  async def run(pool):
    return await asyncio.gather(*[pool.chat(QWEN, p, base.SamplingParams(seed=i))
                                  for i, p in enumerate(prompts)])

  recorded = asyncio.run(run(rec))
  assert inner.calls == 5 and len(rec) == 5
  again = asyncio.run(run(rec))
  assert inner.calls == 5 and again == recorded and rec.stats()["replay/hits"] == 5
  rec.close()
  ro = replay.ReplayPool(None, path, "read-only", catalog=catalog)
  replayed = asyncio.run(run(ro))
  assert replayed == recorded  # texts, tokens, costs and latencies identical
  assert [c.latency_s for c in replayed] == [c.latency_s for c in recorded]


def test_read_only_miss_is_a_clear_error(catalog, tmp_path):
  path = tmp_path / "replay.sqlite"
  rec = replay.ReplayPool(CountingPool(catalog), path, "read-write")
  asyncio.run(rec.chat(QWEN, MSG))
  ro = replay.ReplayPool(None, path, "read-only", catalog=catalog)
  with pytest.raises(replay.ReplayMissError, match="no recorded answer for LLM 'qwen2.5-7b-instruct'"):
    asyncio.run(ro.chat(QWEN, MSG, base.SamplingParams(seed=5)))
  assert isinstance(replay.ReplayMissError("x"), errors.ConfigError)


def test_read_only_never_writes(catalog, tmp_path):
  path = tmp_path / "replay.sqlite"
  rec = replay.ReplayPool(CountingPool(catalog), path, "read-write")
  asyncio.run(rec.chat(QWEN, MSG))
  rec.close()
  ro = replay.ReplayPool(CountingPool(catalog), path, "read-only")
  with pytest.raises(replay.ReplayMissError):
    asyncio.run(ro.chat(QWEN, [{"role": "user", "content": "new"}]))
  assert ro.inner.calls == 0 and len(ro) == 1


def test_bad_configuration(catalog, tmp_path):
  with pytest.raises(errors.ConfigError, match="unknown replay mode 'rw'"):
    replay.ReplayPool(CountingPool(catalog), tmp_path / "a", "rw")
  with pytest.raises(errors.ConfigError, match="not found"):
    replay.ReplayPool(None, tmp_path / "missing.sqlite", "read-only", catalog=catalog)
  with pytest.raises(errors.ConfigError, match="needs an inner pool"):
    replay.ReplayPool(None, tmp_path / "a", "read-write", catalog=catalog)
  junk = tmp_path / "junk.sqlite"
  junk.write_bytes(b"this is not sqlite" * 100)
  with pytest.raises(errors.ConfigError, match="not a replay database"):
    replay.ReplayPool(CountingPool(catalog), junk, "read-write")
  rec = replay.ReplayPool(CountingPool(catalog), tmp_path / "b", "read-write")
  with pytest.raises(errors.ConfigError, match="unknown LLM"):
    asyncio.run(rec.chat("gpt-9", MSG))


def test_off_mode_passes_through(catalog, tmp_path):
  inner = CountingPool(catalog)
  pool = replay.ReplayPool(inner, tmp_path / "never.sqlite", "off")
  asyncio.run(pool.chat(QWEN, MSG))
  asyncio.run(pool.chat(QWEN, MSG))
  assert inner.calls == 2 and not (tmp_path / "never.sqlite").exists()


def test_failures_are_recorded_replayed_and_refreshed(catalog, tmp_path):
  path = tmp_path / "replay.sqlite"
  inner = CountingPool(catalog, fail_first=1)
  rec = replay.ReplayPool(inner, path, "read-write")
  first = asyncio.run(rec.chat(QWEN, MSG))
  assert first.error == "http_500"
  ro = replay.ReplayPool(None, path, "read-only", catalog=catalog)
  assert asyncio.run(ro.chat(QWEN, MSG)) == first  # a recorded failure replays as that failure
  second = asyncio.run(rec.chat(QWEN, MSG))  # read-write retries a stored failure ...
  assert second.ok and inner.calls == 2
  assert asyncio.run(ro.chat(QWEN, MSG)) == second  # ... and replaces it


def test_concurrent_identical_calls_share_one_inner_call(catalog, tmp_path):
  inner = CountingPool(catalog, delay_s=0.05)
  rec = replay.ReplayPool(inner, tmp_path / "r.sqlite", "read-write")

  async def go():
    return await asyncio.gather(*[rec.chat(QWEN, MSG) for _ in range(8)])
  out = asyncio.run(go())
  assert inner.calls == 1 and all(c == out[0] for c in out)


def _writer(path, tag, n, barrier):
  catalog = catalog_lib.load_catalog()
  pool = replay.ReplayPool(CountingPool(catalog, tag=tag), path, "read-write", busy_timeout_s=30)
  barrier.wait(10)

  async def go():
    return await asyncio.gather(*[pool.chat(QWEN, [{"role": "user", "content": f"q{i}"}])
                                  for i in range(n)])
  out = asyncio.run(go())
  pool.close()
  return [c.text for c in out]


def test_several_writer_processes(catalog, tmp_path):
  path = tmp_path / "shared.sqlite"
  ctx = multiprocessing.get_context("spawn")
  barrier = ctx.Manager().Barrier(3)
  with ctx.Pool(3) as procs:
    results = procs.starmap(_writer, [(path, f"p{j}/", 40, barrier) for j in range(3)])
  db = sqlite3.connect(path)
  rows = dict(db.execute("SELECT key, completion FROM completions").fetchall())
  assert len(rows) == 40
  # Every process got, for each prompt, the one answer that was stored (the first writer's).
  assert results[0] == results[1] == results[2]
  ro = replay.ReplayPool(None, path, "read-only", catalog=catalog)
  replayed = asyncio.run(ro.chat(QWEN, [{"role": "user", "content": "q7"}]))
  assert replayed.text == results[0][7]
