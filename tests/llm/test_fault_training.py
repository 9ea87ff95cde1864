"""GraphPlanner training over a faulty OpenAI-compatible server: it completes and counts every fault.

The local test server answers the pool's chat calls (echoes, not the simulator) and injects, at a
set rate, timeouts, 500s, 429s, connection resets, malformed JSON and empty content. Training must
finish, record the failures per iteration and the pool's counters in metrics.jsonl, and never hang.
"""
import json
import math
import pathlib
import socket
import subprocess
import sys

import pytest

from experiments.configs import test as test_config
from gp_jax.llm import catalog as catalog_lib
from gp_jax.llm import openai_pool
from gp_jax.llm import testing_server
from gp_jax.runs import system as system_lib
from gp_jax.runs import train as training
from tests.llm.faults import POOL_KIND, deadline

REPO = pathlib.Path(__file__).resolve().parents[2]
TRAIN_LIMIT_S = 150   # far above the ~20-40 s a run takes; only there to turn a hang into a failure


@pytest.fixture(scope="module")
def faulty_run(tmp_path_factory):
  """Trains the test config (3 iterations x 16 episodes) against a server faulting 25% of requests."""
  config = test_config.get_config()
  config.compile_cache = ""   # tests/conftest.py already sets the shared cache
  workdir = tmp_path_factory.mktemp("faulty")
  names = [n.strip() for n in config.llms.split(",")]
  # The script puts every fault kind among the first requests, so each one is certainly injected;
  # the rate then adds a seeded random mix for the rest of the run.
  server_cfg = testing_server.ServerConfig(
      fault_rate=0.25, script=tuple(testing_server.FAULT_KINDS), timeout_sleep_s=10.0, seed=3)
  with testing_server.FakeOpenAIServer(server_cfg) as srv:
    catalog = catalog_lib.load_catalog()
    pool = openai_pool.OpenAIPool(
        catalog, {n: [{"base_url": srv.url, "model": "fake"}] for n in names},
        timeout_s=0.4, connect_timeout_s=0.4, max_retries=1, backoff_base_s=0.005,
        backoff_max_s=0.02, max_concurrency=16)
    with deadline(TRAIN_LIMIT_S):
      summary = training.train(config, workdir, system=system_lib.build(config, pool=pool),
                                verbose=False)
    sent = dict(srv.faults_sent)
    requests = srv.requests
  lines = (workdir / "metrics.jsonl").read_text().splitlines()
  return dict(config=config, summary=summary, metrics=[json.loads(l) for l in lines], sent=sent,
              requests=requests, stats=pool.stats())


def test_training_completes_despite_faults(faulty_run):
  config, summary, m = faulty_run["config"], faulty_run["summary"], faulty_run["metrics"]
  assert summary["episodes"] == config.train.episodes
  assert [r["iteration"] for r in m] == list(range(3))
  for r in m:
    assert math.isfinite(r["loss"]) and math.isfinite(r["episode_return"])
    assert 0.0 <= r["utility"] <= 1.0 and r["transitions"] > 0
  # The echo server never writes 'Answer: <number>', so the reward is the (negative) cost only.
  assert all(r["utility"] == 0.0 for r in m)


def test_every_injected_fault_kind_is_counted(faulty_run):
  sent, last = faulty_run["sent"], faulty_run["metrics"][-1]
  assert set(sent) == set(testing_server.FAULT_KINDS)
  for kind, pool_kind in POOL_KIND.items():
    assert last.get(f"pool/faults/{pool_kind}", 0) >= 1, (kind, last)
  # Each injected fault fails exactly one attempt. A normal answer can only fail by running past
  # the client timeout, so the pool counts at least as many failed attempts as were injected, and
  # no kind other than timeouts more often than the server sent it.
  counted = {k: v for k, v in last.items() if k.startswith("pool/faults/")}
  assert sum(counted.values()) >= sum(sent.values())
  for kind, pool_kind in POOL_KIND.items():
    if kind != "timeout":
      assert counted[f"pool/faults/{pool_kind}"] <= sent[kind]
  assert set(counted) <= {f"pool/faults/{k}" for k in POOL_KIND.values()}
  # One replica: every HTTP request the server received was sent (and counted) by the pool.
  (per_replica,) = [v for k, v in last.items() if k.startswith("pool/requests/")]
  assert per_replica == faulty_run["requests"]


def test_failed_calls_per_iteration_match_the_pool_counters(faulty_run):
  m, stats = faulty_run["metrics"], faulty_run["stats"]
  # Every chat call of the run is one transition of one episode.
  assert sum(r["transitions"] for r in m) == stats["calls"] == m[-1]["pool/calls"]
  assert sum(r["failed_calls"] for r in m) == stats["failed"] == m[-1]["pool/failed"]
  assert stats["failed"] > 0 and stats["ok"] > 0
  assert stats["ok"] + stats["failed"] == stats["calls"]
  errors = {k: v for k, v in stats.items() if k.startswith("errors/")}
  assert sum(errors.values()) == stats["failed"]
  # Malformed and empty answers are not retried: they always end the call as failed.
  assert errors.get("errors/malformed", 0) == stats["faults/malformed"] > 0
  assert errors.get("errors/empty", 0) == stats["faults/empty"] > 0
  assert stats["retries"] > 0
  # The counters are cumulative: the per-iteration pool fields never decrease.
  for key in ("pool/calls", "pool/failed", "pool/retries"):
    values = [r[key] for r in m]
    assert values == sorted(values)


def test_unreachable_endpoints_at_startup_exit_2(tmp_path):
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]   # closed again below: nothing listens there
  names = [n.strip() for n in test_config.get_config().llms.split(",")]
  endpoints = tmp_path / "endpoints.json"
  endpoints.write_text(json.dumps(
      {n: [{"base_url": f"http://127.0.0.1:{port}/v1", "model": "m"}] for n in names}))
  cmd = [sys.executable, "-m", "experiments.train", "--config=experiments/configs/test.py",
         f"--workdir={tmp_path / 'run'}", "--config.backend=endpoints",
         f"--config.endpoints_file={endpoints}"]
  out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
  assert out.returncode == 2, out.stderr[-2000:]
  lines = [l for l in out.stderr.splitlines() if l.strip()]
  assert len(lines) == 1 and lines[0].startswith("error: "), out.stderr
  assert "unreachable" in lines[0] and f"127.0.0.1:{port}" in lines[0]
  assert not (tmp_path / "run" / "metrics.jsonl").exists()
