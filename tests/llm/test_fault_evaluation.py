"""Evaluation over a faulty OpenAI-compatible server on simulated queries: sampled scores only, no
simulator optimum, and the pool's counters in eval.json and eval.md.

The test server echoes (it never writes 'Answer: <number>'), so every sampled utility is 0; the
simulator would have credited the same calls with its expected utility, which the old evaluation
did (it tested `system.world is not None`, not what answers the calls as training does).
"""
import json

import pytest

from experiments.configs import test as test_config
from gp_jax.llm import catalog as catalog_lib
from gp_jax.llm import openai_pool
from gp_jax.llm import testing_server
from gp_jax.runs import system as system_lib
from tests.llm.faults import POOL_KIND, deadline
from gp_jax.runs import pipeline
from gp_jax.runs import train as training

LIMIT_S = 150   # far above the ~20 s this takes; only there to turn a hang into a failure


@pytest.fixture(scope="module")
def faulty_eval(tmp_path_factory):
  """One training iteration, then the evaluation, against a server faulting 25% of requests."""
  config = test_config.get_config()
  config.compile_cache = ""
  config.train.episodes = config.train.episodes_per_iter
  config.data.n_test = 12
  workdir = tmp_path_factory.mktemp("faulty_eval")
  names = [n.strip() for n in config.llms.split(",")]
  server_cfg = testing_server.ServerConfig(fault_rate=0.25, timeout_sleep_s=10.0, seed=5)
  with testing_server.FakeOpenAIServer(server_cfg) as srv:
    pool = openai_pool.OpenAIPool(
        catalog_lib.load_catalog(), {n: [{"base_url": srv.url, "model": "fake"}] for n in names},
        timeout_s=0.4, connect_timeout_s=0.4, max_retries=1, backoff_base_s=0.005,
        backoff_max_s=0.02, max_concurrency=16)
    system = system_lib.build(config, pool=pool)
    with deadline(LIMIT_S):
      training.train(config, workdir, system=system, verbose=False)
      sent_before, requests_before = dict(srv.faults_sent), srv.requests
      pipeline.evaluate_run(config, workdir, system=system, verbose=False)
    sent = {k: v - sent_before.get(k, 0) for k, v in srv.faults_sent.items()}
    requests = srv.requests - requests_before
  return dict(config=config, system=system, report=json.loads((workdir / "eval.json").read_text()),
              md=(workdir / "eval.md").read_text(), sent=sent, requests=requests, url=srv.url)


def test_real_pool_is_not_the_simulator(faulty_eval):
  report = faulty_eval["report"]
  assert not any("optimum" in r["policy"] for r in report["rows"])
  assert "ratio_to_optimum" not in report["verdict"]
  alpha = faulty_eval["config"].alpha
  for r in report["rows"]:
    # Sampled: the mean scored utility (the accuracy column) minus alpha x cost, nothing expected.
    assert r["reward"] == pytest.approx(r["accuracy"] - alpha * r["cost"], abs=1e-9), r
    assert r["accuracy"] == 0.0     # the echo server never answers correctly
  assert "Reward: sampled" in faulty_eval["md"] and "| optimum" not in faulty_eval["md"]
  assert report["simulated"] is False and report["reward"].startswith("sampled")
  assert faulty_eval["system"].world is not None and not faulty_eval["system"].simulated


def test_pool_counters_of_the_evaluation_are_reported(faulty_eval):
  pool, sent = faulty_eval["report"]["pool"], faulty_eval["sent"]
  assert sum(sent.values()) > 0, "the server injected no fault during the evaluation"
  assert pool["calls"] > 0 and pool["failed"] > 0 and pool["retries"] > 0
  assert pool["ok"] + pool["failed"] == pool["calls"]
  assert sum(v for k, v in pool.items() if k.startswith("errors/")) == pool["failed"]
  counted = {k: v for k, v in pool.items() if k.startswith("faults/")}
  assert sum(counted.values()) >= sum(sent.values())
  for kind, n in sent.items():
    if n and kind != "timeout":
      assert 1 <= counted[f"faults/{POOL_KIND[kind]}"] <= n, (kind, counted, sent)
  # Counters of the evaluation alone (training's requests are not in them).
  (per_replica,) = [v for k, v in pool.items() if k.startswith("requests/")]
  assert per_replica == faulty_eval["requests"]
  md = faulty_eval["md"]
  assert "### LLM pool during the evaluation" in md
  for key in ("calls", "failed", "retries"):
    assert f"| {key} | {pool[key]} |" in md
  for key in counted:
    assert f"| {key} | {pool[key]} |" in md
