"""Served pool events (serve_router --sim_event, gp_jax/sim/served_events.py): real server
processes on the simulator serving conftest.py's `workdir`, spoken to with the official `openai`
client; a client replays the workdir's training queries in order, so request i meets query i."""
import asyncio
import collections
import json
import subprocess
import sys
import urllib.request

import openai
import pytest

from experiments import serve_router_process as process
from gp_jax import paths
from gp_jax.runs import system as system_lib
from gp_jax.serving.engine import config as served_config
from gp_jax.sim import served_events

T = 24   # the event's position in the 48-query training stream of the test config


def _replay(url: str, queries) -> list:
  """The answers to the training queries in order (seed = position), 8 at a time: a completion,
  or the openai.APIStatusError of an unanswered request."""
  async def run():
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0,
                                timeout=120)

    async def one(i, q):
      try:
        return await client.chat.completions.create(
            model="graphplanner", messages=[{"role": "user", "content": q.query}],
            metadata={"task": q.task_name}, seed=i)
      except openai.APIStatusError as e:
        return e
    out = []
    try:
      for lo in range(0, len(queries), 8):
        out += await asyncio.gather(*[one(i, q) for i, q in enumerate(queries[lo:lo + 8],
                                                                       start=lo)])
    finally:
      await client.close()
    return out
  return asyncio.run(run())


def _route(c) -> list[dict]:
  return c.model_extra["graphplanner"]["route"]


def _calls(c) -> list[dict]:
  """A completion's route without the measured latencies."""
  return [{k: v for k, v in s.items() if k != "latency_s"} for s in _route(c)]


@pytest.fixture(scope="module")
def frozen_replay(workdir, tmp_path_factory):
  """(training queries, completions of a server without events)."""
  tmp = tmp_path_factory.mktemp("events_plain")
  queries = system_lib.build(served_config.load_config(workdir)).train_queries
  with process.RouterProcess([f"--workdir={workdir}", f"--memory_path={tmp / 'm.npz'}"],
                             tmp / "plain.log") as srv:
    return queries, _replay(srv.url, queries)


def test_fail_event_on_the_preferred_llm_fails_its_calls_from_request_t_on(workdir, tmp_path,
                                                                          frozen_replay):
  queries, plain = frozen_replay
  calls = collections.Counter(s["llm"] for c in plain for s in _route(c))
  llm = calls.most_common(1)[0][0]          # the LLM the trained router prefers
  assert any(s["llm"] == llm for c in plain[T:] for s in _route(c))   # it is called after t
  state = tmp_path / "state"
  with process.RouterProcess([f"--workdir={workdir}", f"--memory_path={state / 'm.npz'}",
                              "--sim_event=fail", f"--sim_event_llm={llm}",
                              f"--sim_event_t={T}"], tmp_path / "event.log") as srv:
    got = _replay(srv.url, queries)
    record = json.loads((state / served_events.FILE).read_text())
    assert record == dict(kind="fail", llm=llm, t=T, delta=record["delta"],
                          price_scale=record["price_scale"], split="train")
    for i in range(T):      # before t: the same routes, answers and costs as without the event
      assert _calls(got[i]) == _calls(plain[i]), i
      assert got[i].choices[0].message.content == plain[i].choices[0].message.content
    failed, unanswered = 0, []
    for i in range(T, len(queries)):   # from t on: every call to the failed LLM errors, costs 0
      if isinstance(got[i], openai.APIStatusError):   # no answer at all: 502, its id for feedback
        e = got[i]
        assert e.status_code == 502 and e.body["code"] == "backbone_error", e
        assert "(unavailable)" in e.body["message"], e.body
        unanswered.append(e.response.headers["x-gp-request-id"])
        continue
      for s in _route(got[i]):
        if s["llm"] == llm:
          assert s["error"] == "unavailable" and s["cost_usd"] == 0.0 and s["output_tokens"] == 0
          failed += 1
        else:
          assert s["error"] is None
    assert failed + len(unanswered) > 0
    # An unanswered request's failure can be reported: feedback 0 joins the memory.
    for rid in unanswered[:2]:
      r = urllib.request.urlopen(urllib.request.Request(
          srv.url + "/v1/feedback", data=json.dumps(dict(id=rid, score=0.0)).encode(),
          headers={"Content-Type": "application/json"}), timeout=60)
      assert r.status == 200 and json.loads(r.read())["rows_added"] > 0
  assert all(not isinstance(c, Exception) and all(s["error"] is None for s in _route(c))
             for c in plain)


def _run_refused(workdir, tmp_path, *args) -> subprocess.CompletedProcess:
  return subprocess.run(
      [sys.executable, "-m", "experiments.serve_router", "--port=0", f"--workdir={workdir}",
       f"--memory_path={tmp_path / 'm.npz'}", *args],
      cwd=paths.REPO_ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args, message", [
    (["--sim_event=join"], "unknown served pool event"),
    (["--sim_event=fail", "--sim_event_llm=no-such-llm"], "not in the pool"),
    (["--sim_event=fail", "--sim_event_t=-1"], "t must be >= 0"),
    (["--sim_event_t=3"], "need --sim_event"),
    (["--sim_event=fail", "--config.backend=endpoints", "--config.endpoints_file=x.json"],
     "needs the simulator backend"),
])
def test_bad_event_flags_are_refused_with_one_error_before_serving(workdir, tmp_path, args,
                                                                   message):
  r = _run_refused(workdir, tmp_path, *args)
  out = r.stdout + r.stderr
  assert r.returncode == 2, out
  assert "error:" in out and message in out, out
  assert "Traceback" not in out
  assert not (tmp_path / served_events.FILE).exists()


def test_apply_replaces_recorded_events_and_follows_the_training_stream(workdir):
  config = served_config.load_config(workdir)
  e = served_events.ServedEvent("quality_drop", "qwen2.5-7b-instruct", 7, -3.0, 4.0)
  recorded = served_config.with_pool_event(config, served_events.ServedEvent(
      "fail", "llama-3.1-8b-instruct", 0, -3.0, 4.0))
  out = served_config.with_pool_event(recorded, e)
  ev = out.data.sim_events
  assert (ev.splits, ev.quality.llm, ev.quality.t, ev.quality.delta) == (
      "train", "qwen2.5-7b-instruct", 7, -3.0)
  assert ev.fail.llm == "" and ev.price.llm == ""      # the recorded fail event is gone
  assert config.data.sim_events.quality.llm == ""      # the loaded config is unchanged
  re = served_events.retrained_overrides(e)
  assert re["data.sim_events.quality.t"] == 0 and re["data.sim_events.splits"] == "train"
