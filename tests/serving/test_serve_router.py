"""experiments/serve_router.py as users run it: a real server process on the simulator, serving a
workdir trained with experiments/configs/test.py (trained once per session), spoken to with the
official `openai` client (and raw HTTP where the client hides the wire format). The trained
workdir is conftest.py's `workdir`."""
import asyncio
import csv
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request

import numpy as np
import openai
import pytest

from experiments import serve_router_process as process
from experiments.configs import test as test_config
from gp_jax import paths
from gp_jax.llm import catalog as catalog_lib
from gp_jax.llm import testing_server
from gp_jax.serving.engine import config as served_config
from gp_jax.serving.state import journal as journal_lib
from gp_jax.serving.state import llmrouter_export
from gp_jax.serving.state import route_log as route_log_lib
from gp_jax.serving.state import store_api

QUERY = "Which planet in the solar system has the most moons, and how many were confirmed by 2023?"


@pytest.fixture(scope="module")
def served(workdir, tmp_path_factory):
  """The router server with a memory file; yields (RouterProcess, memory path, route log)."""
  state = tmp_path_factory.mktemp("served")
  memory = state / "memory.npz"
  srv = process.RouterProcess([f"--workdir={workdir}", f"--memory_path={memory}",
                               "--max_body_bytes=65536"], state / "server.log").start()
  yield srv, memory, state / "routes.jsonl"
  srv.stop()


def _client(srv) -> openai.OpenAI:
  return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _http(srv, path, body=None, raw: bytes | None = None):
  """(status, headers, body bytes) of one request (POST when a body is given)."""
  data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
  req = urllib.request.Request(srv.url + path, data=data,
                               headers={"Content-Type": "application/json"})
  try:
    with urllib.request.urlopen(req, timeout=120) as r:
      return r.status, dict(r.headers), r.read()
  except urllib.error.HTTPError as e:
    return e.code, dict(e.headers), e.read()


def _get(srv, path) -> dict:
  status, _, body = _http(srv, path)
  assert status == 200, body
  return json.loads(body)


def _all_routes(srv) -> list[dict]:
  """Every route record the server lists, paged by seq."""
  out, after = [], 0
  while True:
    page = _get(srv, f"/v1/routes?after={after}&limit=1000")
    if not page["data"]:
      return out
    assert len(page["data"]) <= 1000
    out += page["data"]
    after = page["last"]


def _ext(completion) -> dict:
  return completion.model_extra["graphplanner"]


def test_models_lists_router_and_backbones(served):
  srv, _, _ = served
  ids = [m.id for m in _client(srv).models.list().data]
  assert ids == ["graphplanner"] + test_config.get_config().llms.split(",")


def test_completion_usage_and_cost_sum_over_the_route(served):
  srv, _, _ = served
  raw = _client(srv).chat.completions.with_raw_response.create(
      model="graphplanner", messages=[{"role": "system", "content": "Be brief."},
                                      {"role": "user", "content": QUERY}])
  c = raw.parse()
  route = _ext(c)["route"]
  assert c.object == "chat.completion" and c.model == "graphplanner"
  assert c.choices[0].message.content and c.choices[0].finish_reason == "stop"
  assert len(route) >= 1 and route[0]["node"] == 0
  assert c.usage.prompt_tokens == sum(s["input_tokens"] for s in route)
  assert c.usage.completion_tokens == sum(s["output_tokens"] for s in route)
  assert c.usage.total_tokens == c.usage.prompt_tokens + c.usage.completion_tokens
  cat = catalog_lib.load_catalog()
  for s in route:   # every step's $ cost is its LLM's price times its tokens
    assert s["cost_usd"] == pytest.approx(cat.cost_usd(s["llm"], s["input_tokens"],
                                                       s["output_tokens"]))
  assert _ext(c)["cost_usd"] == pytest.approx(sum(s["cost_usd"] for s in route))
  assert float(raw.headers["x-gp-cost-usd"]) == pytest.approx(_ext(c)["cost_usd"])
  assert raw.headers["x-gp-route"] == ",".join(f"{s['role']}:{s['llm']}" for s in route)
  assert route[-1]["role"] == "executor"   # the root's final answer
  # The route log has the same request, with the texts of every call.
  logged = [r for r in _get(srv, "/v1/routes?since=0")["data"] if r["id"] == c.id]
  assert len(logged) == 1 and logged[0]["answer"] == c.choices[0].message.content
  assert [x["llm"] for x in logged[0]["calls"]] == [s["llm"] for s in route]
  assert logged[0]["calls"][0]["input_text"] == QUERY.strip()


def test_streamed_completion_matches_the_plain_one(served):
  srv, _, _ = served
  client = _client(srv)
  plain = client.chat.completions.create(model="graphplanner", seed=7,
                                         messages=[{"role": "user", "content": QUERY}])
  chunks = list(client.chat.completions.create(
      model="graphplanner", seed=7, stream=True, stream_options={"include_usage": True},
      messages=[{"role": "user", "content": QUERY}]))
  text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
  assert text == plain.choices[0].message.content
  assert chunks[-1].usage.total_tokens == plain.usage.total_tokens
  finish = [ch for ch in chunks if ch.choices and ch.choices[0].finish_reason == "stop"]
  assert len(finish) == 1
  assert [s["llm"] for s in finish[0].model_extra["graphplanner"]["route"]] == [
      s["llm"] for s in _ext(plain)["route"]]
  # On the wire: SSE events, the last one [DONE].
  status, headers, body = _http(srv, "/v1/chat/completions", {
      "model": "graphplanner", "stream": True, "messages": [{"role": "user", "content": QUERY}]})
  assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
  events = [e for e in body.decode().split("\n\n") if e and not e.startswith(":")]   # keep-alives
  assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"


def test_passthrough_calls_the_named_backbone_only(served):
  srv, _, _ = served
  llm = test_config.get_config().llms.split(",")[1]
  raw = _client(srv).chat.completions.with_raw_response.create(
      model=llm, messages=[{"role": "user", "content": QUERY}], metadata={"task": "gsm8k"})
  c = raw.parse()
  route = _ext(c)["route"]
  assert c.model == llm and len(route) == 1 and route[0]["llm"] == llm
  assert route[0]["role"] == "passthrough" and raw.headers["x-gp-route"] == f"passthrough:{llm}"
  assert c.usage.total_tokens == route[0]["input_tokens"] + route[0]["output_tokens"] > 0
  assert _ext(c)["task"] == "gsm8k"
  assert c.choices[0].message.content


def test_bad_requests_get_openai_errors_and_the_server_stays_up(served):
  srv, _, _ = served
  client = _client(srv)
  with pytest.raises(openai.NotFoundError) as e:
    client.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "hi"}])
  assert e.value.body["code"] == "model_not_found"
  with pytest.raises(openai.BadRequestError) as e:
    client.chat.completions.create(model="graphplanner",
                                   messages=[{"role": "system", "content": "no question"}])
  assert e.value.body["code"] == "no_user_message"
  with pytest.raises(openai.BadRequestError) as e:
    client.chat.completions.create(model="graphplanner", metadata={"task": "no-such-task"},
                                   messages=[{"role": "user", "content": "hi"}])
  assert e.value.body["param"] == "metadata.task"
  status, _, body = _http(srv, "/v1/chat/completions", raw=b'{"model": "graphplanner", "mess')
  assert status == 400 and json.loads(body)["error"]["code"] == "invalid_json"
  big = {"model": "graphplanner", "messages": [{"role": "user", "content": "x" * 70_000}]}
  status, _, body = _http(srv, "/v1/chat/completions", big)
  assert status == 413 and json.loads(body)["error"]["code"] == "body_too_large"
  status, _, body = _http(srv, "/v1/feedback", {"id": "chatcmpl-unknown", "score": 1.0})
  assert status == 404 and json.loads(body)["error"]["code"] == "unknown_id"
  status, _, body = _http(srv, "/v1/feedback", {"id": "chatcmpl-unknown", "score": 1.5})
  assert status == 400 and json.loads(body)["error"]["param"] == "score"
  assert _get(srv, "/health")["status"] == "ok"
  assert client.chat.completions.create(
      model="graphplanner", messages=[{"role": "user", "content": "still there?"}]).choices


def test_64_concurrent_requests_all_answered_with_batched_decisions(served):
  srv, _, _ = served
  before = _get(srv, "/health")["decisions"]

  async def run():
    client = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0,
                                timeout=300)
    try:
      return await asyncio.gather(*[client.chat.completions.create(
          model="graphplanner", messages=[{"role": "user", "content": f"{QUERY} (variant {i})"}])
          for i in range(64)])
    finally:
      await client.close()

  out = asyncio.run(run())
  assert len({c.id for c in out}) == 64 and all(c.choices[0].message.content for c in out)
  after = _get(srv, "/health")["decisions"]
  decisions = after["decisions"] - before["decisions"]
  calls = after["policy_calls"] - before["policy_calls"]
  assert decisions == sum(len(_ext(c)["route"]) for c in out)
  assert calls < decisions / 4, (calls, decisions)   # concurrent decisions share policy calls


def test_feedback_grows_the_memory_that_the_next_decision_reads(served):
  srv, memory_path, _ = served
  client = _client(srv)
  mem0 = _get(srv, "/v1/memory")
  first = client.chat.completions.create(model="graphplanner",
                                         messages=[{"role": "user", "content": QUERY + " (fb)"}])
  assert _ext(first)["history_rows"] == mem0["rows"]
  # As the README shows it: the openai client's generic POST.
  ack = client.post("/feedback", body={"id": first.id, "score": 1.0}, cast_to=object)
  n = len(_ext(first)["route"])
  assert ack["rows_added"] == n
  mem1 = _get(srv, "/v1/memory")
  assert mem1["rows"] == mem0["rows"] + n and mem1["feedback"] == mem0["feedback"] + 1
  for s in _ext(first)["route"]:
    hub = f"{s['role']}/{s['llm']}"
    assert mem1["per_hub"][hub] > mem0["per_hub"].get(hub, 0)
  # The acknowledged feedback is on disk: the journal's last record holds the new rows with
  # utility = score.
  _, _, _, records = journal_lib.MemoryFile(memory_path, row_dim=_row_dim(),
                                            num_hubs=_num_hubs()).load()
  assert records[-1].rid == first.id and len(records[-1].rows) == n
  assert records[-1].seq == ack["seq"] and records[-1].score == 1.0
  assert np.all(records[-1].rows[:, 2 * test_config.get_config().model.mem_proj] == 1.0)
  second = client.chat.completions.create(model="graphplanner",
                                          messages=[{"role": "user", "content": QUERY + " (2)"}])
  assert _ext(second)["history_rows"] == mem1["rows"]
  status, _, body = _http(srv, "/v1/feedback", {"id": first.id, "score": 0.0})
  assert status == 409


def _row_dim() -> int:
  c = test_config.get_config()
  return 2 * c.model.mem_proj + 3


def _num_hubs() -> int:
  c = test_config.get_config()
  return len(c.roles.split(",")) * len(c.llms.split(","))


def test_memory_is_bounded_and_survives_kill_9_and_restart(workdir, tmp_path):
  """Its own server (the kill would stop the module's shared one for the tests after it)."""
  memory_path, route_log = tmp_path / "memory.npz", tmp_path / "routes.jsonl"
  srv = process.RouterProcess([f"--workdir={workdir}", f"--memory_path={memory_path}"],
                              tmp_path / "server.log").start()
  try:
    _fill_kill_and_restart(srv, workdir, tmp_path, memory_path, route_log)
  finally:
    srv.stop()


def _fill_kill_and_restart(srv, workdir, tmp_path, memory_path, route_log):
  capacity = test_config.get_config().model.history_capacity
  client = _client(srv)
  ids = []
  while True:   # serve and score requests until the memory is full and evicting
    rows = _get(srv, "/v1/memory")["rows"]
    if rows >= capacity and len(ids) >= 3:
      break
    c = client.chat.completions.create(model="graphplanner",
                                       messages=[{"role": "user", "content": f"q{len(ids)} {QUERY}"}])
    ids.append(c.id)
    status, _, body = _http(srv, "/v1/feedback", {"id": c.id, "score": 0.5})
    assert status == 200, body
  assert _get(srv, "/v1/memory")["rows"] == capacity
  client.chat.completions.create(model="graphplanner",   # one served request left unscored
                                 messages=[{"role": "user", "content": f"unscored {QUERY}"}])
  before = _get(srv, "/v1/memory")
  served_ids = [r["id"] for r in _all_routes(srv)]
  srv.stop(signal.SIGKILL)   # a crash: no clean shutdown
  restarted = process.RouterProcess([f"--workdir={workdir}", f"--memory_path={memory_path}"],
                                    tmp_path / "restart.log").start()
  try:
    after = _get(restarted, "/v1/memory")
    assert after["restored"] and after["rows"] == before["rows"]
    assert after["per_hub"] == before["per_hub"] and after["feedback"] == before["feedback"]
    # The route log came back too: feedback for a request served before the crash is accepted,
    # a second one for an already scored request is refused.
    unscored = [i for i in served_ids if i not in ids]
    status, _, _ = _http(restarted, "/v1/feedback", {"id": unscored[0], "score": 1.0})
    assert status == 200
    status, _, _ = _http(restarted, "/v1/feedback", {"id": ids[0], "score": 1.0})
    assert status == 409
    assert _ext(_client(restarted).chat.completions.create(
        model="graphplanner", messages=[{"role": "user", "content": QUERY}]))["history_rows"] == capacity
    # Export from the running server (/v1/routes), unscored requests included.
    out = tmp_path / "all.csv"
    subprocess.run([sys.executable, "-m", "experiments.export_routes", f"--url={restarted.url}",
                    f"--out={out}", "--include_unscored"], check=True, cwd=paths.REPO_ROOT,
                   capture_output=True)
    listed = _all_routes(restarted)
    with open(out, newline="") as f:
      table = list(csv.reader(f))   # responses (planner lines) hold newlines: read it as CSV
    assert table[0] == list(llmrouter_export.FIELDS)
    assert len(table) - 1 == sum(len(r["calls"]) for r in listed)
  finally:
    restarted.stop()
  # A clean stop (SIGTERM) folds the journal into a new base.
  rows, _, header, records = journal_lib.MemoryFile(memory_path, row_dim=_row_dim(),
                                                    num_hubs=_num_hubs()).load()
  assert records == [] and len(rows) == capacity and header["seq"] > 0
  # The route log exports as LLMRouter rows, one per call of every scored request.
  out = tmp_path / "rows.jsonl"
  subprocess.run([sys.executable, "-m", "experiments.export_routes", f"--route_log={route_log}",
                  f"--out={out}"], check=True, cwd=paths.REPO_ROOT, capture_output=True)
  rows = [json.loads(l) for l in out.read_text().splitlines()]
  records = [r for r in route_log_lib.read_log(route_log) if r["type"] == "route"]
  scored = {r["id"] for r in route_log_lib.read_log(route_log) if r["type"] == "feedback"}
  assert len(rows) == sum(len(r["calls"]) for r in records if r["id"] in scored)
  assert set(rows[0]) == set(llmrouter_export.FIELDS)
  assert {r["performance"] for r in rows} <= {0.5, 1.0}


def test_unservable_requests_get_502_and_504_never_a_hang(workdir, tmp_path):
  llms = test_config.get_config().llms.split(",")
  with testing_server.FakeOpenAIServer(models=tuple(llms)) as backend:
    endpoints = tmp_path / "endpoints.json"
    endpoints.write_text(json.dumps({m: [{"base_url": backend.url, "model": m}] for m in llms}))
    srv = process.RouterProcess([f"--workdir={workdir}", "--memory_path=none",
                                 "--config.backend=endpoints",
                                 f"--config.endpoints_file={endpoints}", "--deadline_s=3"],
                                tmp_path / "server.log").start()
    try:
      client = _client(srv)
      ok = client.chat.completions.create(model="graphplanner",
                                          messages=[{"role": "user", "content": "2 + 2?"}])
      assert ok.choices[0].message.content.startswith("echo:")   # the backend's echo
      backend.config.fault_rate, backend.config.faults = 1.0, ("malformed",)
      with pytest.raises(openai.APIStatusError) as e:
        client.chat.completions.create(model="graphplanner",
                                       messages=[{"role": "user", "content": "2 + 2?"}])
      assert e.value.status_code == 502 and e.value.body["code"] == "backbone_error"
      backend.config.faults = ("timeout",)
      with pytest.raises(openai.APIStatusError) as e:
        client.chat.completions.create(model=llms[0], messages=[{"role": "user", "content": "hi"}])
      assert e.value.status_code == 504 and e.value.body["code"] == "timeout"
      backend.config.fault_rate = 0.0
      assert _get(srv, "/health")["counters"]["timeout"] == 1
      assert client.chat.completions.create(
          model="graphplanner", messages=[{"role": "user", "content": "2 + 2?"}]).choices
    finally:
      srv.stop()


def test_runner_refuses_overrides_that_change_the_trained_router(workdir, tmp_path):
  out = subprocess.run([sys.executable, "-m", "experiments.serve_router", f"--workdir={workdir}",
                        "--config.model.hidden=64", "--port=0"], cwd=paths.REPO_ROOT,
                       capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(paths.REPO_ROOT)))
  assert out.returncode == 2
  assert out.stderr.strip().splitlines()[-1].startswith("error: --config.model.hidden changes")
  out = subprocess.run([sys.executable, "-m", "experiments.serve_router",
                        f"--workdir={tmp_path}", "--port=0"], cwd=paths.REPO_ROOT,
                       capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(paths.REPO_ROOT)))
  assert out.returncode == 2 and "not a training workdir" in out.stderr


def _fb(seq, F, A, n=2, rid=None, key=None):
  return store_api.Feedback(seq=seq, rid=rid or f"id{seq}", key=key, score=0.5,
                            rows=np.full((n, F), seq, np.float32),
                            hubs=np.arange(n, dtype=np.int32) % A)


def test_memory_file_survives_crashes_at_any_point(tmp_path, monkeypatch):
  F, A = 5, 4
  path = tmp_path / "memory.npz"
  mf = journal_lib.MemoryFile(path, row_dim=F, num_hubs=A)
  base = np.ones((3, F), np.float32)
  mf.write_base(base, np.array([0, 1, 2]), dict(row_dim=F, num_hubs=A), seq=0)
  recs = [_fb(i, F, A) for i in (1, 2, 3)]
  mf.append(recs[:2])
  mf.append(recs[2:])
  # A crash in the middle of the last append: its record is torn.
  data = mf.journal_path.read_bytes()
  mf.journal_path.write_bytes(data[:-7])
  rows, hubs, header, got = journal_lib.MemoryFile(path, row_dim=F, num_hubs=A).load()
  np.testing.assert_array_equal(rows, base)
  assert [(fb.seq, fb.rid) for fb in got] == [(1, "id1"), (2, "id2")]
  np.testing.assert_array_equal(got[1].rows, recs[1].rows)
  # The torn tail was cut off: a later append follows a whole record and is read back.
  mf2 = journal_lib.MemoryFile(path, row_dim=F, num_hubs=A)
  mf2.load()
  mf2.append([recs[2]])
  got = journal_lib.MemoryFile(path, row_dim=F, num_hubs=A).load()[3]
  assert [fb.seq for fb in got] == [1, 2, 3]
  # Compaction killed between the new base and emptying the journal: seq skips what the base
  # holds, so nothing is counted twice.
  monkeypatch.setattr(mf2, "journal_path", tmp_path / "elsewhere")   # the truncation misses
  folded = np.concatenate([base] + [fb.rows for fb in recs])
  mf2.write_base(folded, np.zeros(len(folded), np.int32), dict(row_dim=F, num_hubs=A), seq=3)
  rows, _, header, got = journal_lib.MemoryFile(path, row_dim=F, num_hubs=A).load()
  assert len(rows) == 9 and header["seq"] == 3 and got == []
  # A crash while a new base is written (before the rename) leaves the old base whole.
  def crash(*a):
    raise OSError("killed mid-write")
  monkeypatch.setattr(os, "replace", crash)
  with pytest.raises(OSError):
    mf2.write_base(np.zeros((1, F), np.float32), np.zeros(1), dict(row_dim=F, num_hubs=A), seq=9)
  rows, _, header, _ = journal_lib.MemoryFile(path, row_dim=F, num_hubs=A).load()
  assert len(rows) == 9 and header["seq"] == 3
  with pytest.raises(Exception, match="other features"):
    journal_lib.MemoryFile(path, row_dim=F + 1, num_hubs=A).load()


def test_history_sums_stay_exact_while_a_full_memory_evicts(workdir):
  """In process: feedback on a full memory evicts on every call; the decisions' per-hub sums,
  kept incrementally (add new rows, subtract evicted ones), equal a full recompute."""
  from gp_jax.serving.engine import session as session_lib
  s = session_lib.RouterSession(served_config.load_config(workdir, {}), workdir, max_concurrency=1)
  capacity = s.history.capacity
  rng = np.random.default_rng(0)

  async def run():
    while s.counters["evicting_feedback"] < 5:
      c = await s.complete(f"{QUERY} #{s.counters['served']}")
      out = await s.feedback(c.record["id"], float(rng.uniform()))
      s.counters["evicting_feedback"] += out["rows_evicted"] > 0
    await s.aclose()

  asyncio.run(run())
  assert len(s.history) == capacity and s.memory._evicted_since_sync > 0   # incremental path
  kept_sum, kept_count = s.runner.hub_sum.copy(), s.runner.hub_count.copy()
  s.runner.set_params(s.params, s.history)
  np.testing.assert_allclose(kept_count, s.runner.hub_count)
  np.testing.assert_allclose(kept_sum, s.runner.hub_sum, rtol=1e-4, atol=1e-4)


def test_retrieval_router_serves_through_the_shared_batcher(tmp_path):
  """A router trained in the retrieval mode, served in process: concurrent requests share policy
  calls (the batcher's prepare step adds each query's nearest history rows on the loop) and get
  the routes they get one at a time (batching changes the speed, not the decisions); feedback
  rebuilds the retrieval index and serving goes on."""
  from gp_jax.runs import pipeline
  from gp_jax.serving.engine import session as session_lib
  cfg = test_config.get_config()
  cfg.model.history = "retrieval"
  wd = tmp_path / "retrieval"
  pipeline.train_and_evaluate(cfg, wd, evaluate=False, verbose=False)
  s = session_lib.RouterSession(served_config.load_config(wd, {}), wd, max_concurrency=8)
  assert s.batcher.prepare is not None
  texts = [f"{QUERY} #{i}" for i in range(8)]
  route = lambda served: [(c["role"], c["llm"]) for c in served.record["calls"]]

  async def run():
    together = await asyncio.gather(*[s.complete(t, rid=f"r{i}") for i, t in enumerate(texts)])
    calls = s.batcher.calls
    alone = [await s.complete(t, rid=f"r{i}") for i, t in enumerate(texts)]
    await s.feedback(alone[0].record["id"], 1.0)
    after = await s.complete(texts[1], rid="after")
    await s.aclose()
    return together, alone, calls, after

  together, alone, calls, after = asyncio.run(run())
  assert calls < sum(t.record["timing"]["decisions"] for t in together)   # shared policy calls
  assert [route(t) for t in together] == [route(a) for a in alone]
  assert route(after)
