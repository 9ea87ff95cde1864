"""Two replicas of experiments/serve_router.py on one PostgreSQL (`--memory_url`), as a user runs
them behind a load balancer, spoken to with the official `openai` client: feedback sent to one
replica reaches the other's memory within the sync bound, a duplicate sent to the other replica is
refused, kill -9 of a replica loses nothing it acknowledged, a replica stopped mid-transaction
does not stall the other's completions, and a feedback counter that goes backwards is detected by
both replicas and no acknowledged feedback is skipped.

GP_JAX_HOLD_S sets how long the held replica stays stopped (12 s in CI; the issue's target run
is 120 s, docs/lab/2026-12-07-replica-hold-look.md)."""
from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.request
import uuid

import numpy as np
import openai
import psycopg
import pytest

from experiments import serve_router_process as process
from experiments.configs import test as test_config
from gp_jax.serving.state import postgres
from gp_jax.serving.state import postgres_conn
from gp_jax.serving.state import postgres_timeline

pytestmark = pytest.mark.pg

QUERY = "Which planet in the solar system has the most moons, and how many were confirmed by 2023?"
SYNC_S = 0.5           # --sync_interval_s of both replicas
BOUND_S = SYNC_S + 2.0  # the documented bound (one interval plus one read), with room for a busy CPU
HOLD_S = float(os.environ.get("GP_JAX_HOLD_S", "12"))


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  from gp_jax.runs import pipeline
  wd = tmp_path_factory.mktemp("router") / "run"
  pipeline.train_and_evaluate(test_config.get_config(), wd, evaluate=False, verbose=False)
  return wd


def _replica(workdir, url, namespace, log) -> process.RouterProcess:
  return process.RouterProcess([f"--workdir={workdir}", f"--memory_url={url}",
                                f"--memory_namespace={namespace}", f"--sync_interval_s={SYNC_S}"],
                               log).start()


@pytest.fixture
def replicas(workdir, pg_url, tmp_path):
  ns = "replicas-" + uuid.uuid4().hex[:8]
  a = _replica(workdir, pg_url, ns, tmp_path / "a.log")
  try:
    b = _replica(workdir, pg_url, ns, tmp_path / "b.log")
  except BaseException:
    a.stop(signal.SIGKILL)
    raise
  try:
    yield a, b, ns
  finally:
    a.stop()
    b.stop()


def _client(srv) -> openai.OpenAI:
  return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _memory(srv) -> dict:
  with urllib.request.urlopen(srv.url + "/v1/memory", timeout=60) as r:
    return json.loads(r.read())


def _ask(srv, text: str):
  return _client(srv).chat.completions.create(model="graphplanner",
                                              messages=[{"role": "user", "content": text}])


def _feedback(srv, rid: str, score: float) -> dict:
  return _client(srv).post("/feedback", body={"id": rid, "score": score}, cast_to=object)


def _wait_for(srv, want_feedback: int, limit_s: float) -> tuple[dict, float]:
  """(B's /v1/memory once it counts `want_feedback` feedback, seconds it took)."""
  t0 = time.monotonic()
  while True:
    mem = _memory(srv)
    took = time.monotonic() - t0
    if mem["feedback"] >= want_feedback or took > limit_s:
      return mem, took
    time.sleep(0.05)


def test_feedback_to_one_replica_reaches_the_other_within_the_bound(replicas):
  a, b, _ = replicas
  start_a, start_b = _memory(a), _memory(b)
  assert (start_a["rows"], start_a["per_hub"]) == (start_b["rows"], start_b["per_hub"])
  c = _ask(a, QUERY)
  route = c.model_extra["graphplanner"]["route"]
  ack = _feedback(a, c.id, 1.0)
  assert ack["rows_added"] == len(route)
  mem_b, took = _wait_for(b, start_b["feedback"] + 1, limit_s=30)
  assert mem_b["feedback"] == start_b["feedback"] + 1, mem_b
  assert took <= BOUND_S, f"replica B saw A's feedback after {took:.2f} s (bound {BOUND_S} s)"
  assert mem_b["rows"] == min(start_b["rows"] + len(route), mem_b["capacity"])
  for s in route:
    hub = f"{s['role']}/{s['llm']}"
    assert mem_b["per_hub"][hub] > start_b["per_hub"].get(hub, 0)
  assert _memory(a)["per_hub"] == mem_b["per_hub"]   # both replicas hold the same memory
  # B's next decision reads the rows A's feedback added.
  assert _ask(b, QUERY + " (on B)").model_extra["graphplanner"]["history_rows"] == mem_b["rows"]
  # The same the other way round.
  d = _ask(b, QUERY + " (scored on B)")
  _feedback(b, d.id, 0.0)
  mem_a, took = _wait_for(a, start_a["feedback"] + 2, limit_s=30)
  assert mem_a["feedback"] == start_a["feedback"] + 2 and took <= BOUND_S


def test_duplicate_feedback_refused_across_replicas(replicas):
  a, b, _ = replicas
  c = _ask(a, QUERY + " (dup)")
  _feedback(a, c.id, 1.0)
  with pytest.raises(openai.ConflictError) as e:   # 409, however soon after
    _feedback(b, c.id, 0.0)
  assert e.value.body["code"] == "duplicate_feedback"
  # A request served by A may be scored on B (the route log is shared), once.
  d = _ask(a, QUERY + " (scored elsewhere)")
  assert _feedback(b, d.id, 0.5)["rows_added"] == len(d.model_extra["graphplanner"]["route"])
  with pytest.raises(openai.ConflictError):
    _feedback(a, d.id, 0.5)
  # Two replicas at the same moment: exactly one accepts.
  e2 = _ask(b, QUERY + " (race)")
  results = []

  def send(srv):
    try:
      results.append(_feedback(srv, e2.id, 1.0)["id"])
    except openai.ConflictError:
      results.append("409")
  threads = [threading.Thread(target=send, args=(s,)) for s in (a, b)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(120)
  assert sorted(results) == sorted([e2.id, "409"])


def test_kill_9_of_a_replica_loses_nothing_acknowledged(replicas, workdir, pg_url, tmp_path):
  a, b, ns = replicas
  start = _memory(b)["feedback"]
  acked, stop = [], threading.Event()

  def load():   # requests and feedback on A until it dies
    i = 0
    while not stop.is_set():
      try:
        c = _ask(a, f"{QUERY} (load {i})")
        _feedback(a, c.id, 0.75)
      except (openai.APIConnectionError, openai.APIStatusError):
        return
      acked.append(c.id)
      i += 1
  worker = threading.Thread(target=load)
  worker.start()
  deadline = time.monotonic() + 120
  while len(acked) < 5 and time.monotonic() < deadline and worker.is_alive():
    time.sleep(0.05)
  a.stop(signal.SIGKILL)   # mid-load: no clean shutdown, no final flush
  stop.set()
  worker.join(120)
  assert len(acked) >= 5, a.log_tail()
  # The store holds every feedback A acknowledged, B's memory counts them, and B refuses them.
  with postgres.PostgresStore(pg_url, row_dim=2 * test_config.get_config().model.mem_proj + 3,
                              num_hubs=_num_hubs(), namespace=ns) as store:
    missing = [rid for rid in acked if not store.has_feedback(rid)]
    assert not missing
    stored = len(store.feedback_after(0))
  assert stored >= start + len(acked)
  mem_b, _ = _wait_for(b, stored, limit_s=30)
  assert mem_b["feedback"] == stored
  for rid in acked[:3]:
    with pytest.raises(openai.ConflictError):
      _feedback(b, rid, 0.0)
  # A restarted on the same database comes back with the same memory as B.
  a2 = _replica(workdir, pg_url, ns, tmp_path / "a2.log")
  try:
    mem_a2, mem_b = _memory(a2), _memory(b)
    assert (mem_a2["rows"], mem_a2["feedback"], mem_a2["per_hub"]) == (
        mem_b["rows"], mem_b["feedback"], mem_b["per_hub"])
    with pytest.raises(openai.ConflictError):
      _feedback(a2, acked[-1], 0.0)
  finally:
    a2.stop()


def _num_hubs() -> int:
  c = test_config.get_config()
  return len(c.roles.split(",")) * len(c.llms.split(","))


def _sql(url, query, params=()):
  with psycopg.connect(url, autocommit=True) as conn:
    cur = conn.execute(query, params)
    return cur.fetchall() if cur.description else None


def _timed_completions(srv, seconds: float, tag: str, clients: int = 4):
  """(latencies of the completions that succeeded, failures) of `clients` threads asking `srv`
  back to back for `seconds`."""
  latencies, failures, end = [], [], time.monotonic() + seconds

  def client(i):
    n = 0
    while time.monotonic() < end:
      t0 = time.monotonic()
      try:
        _ask(srv, f"{QUERY} ({tag} {i}-{n})")
        latencies.append(time.monotonic() - t0)
      except Exception as e:   # noqa: BLE001 - every failure is reported by the test
        failures.append(repr(e))
      n += 1
  threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(seconds + 180)
  return latencies, failures


def _summary(lat) -> str:
  q = np.percentile(lat, [50, 99]) if lat else [float("nan")] * 2
  return (f"{len(lat)} completions, p50 {q[0] * 1000:.0f} ms, p99 {q[1] * 1000:.0f} ms, "
          f"max {max(lat, default=float('nan')) * 1000:.0f} ms")


def test_replica_held_mid_transaction_does_not_stall_the_other(replicas, pg_url):
  """Replica A is stopped (SIGSTOP) while it serves and writes, and a session with a replica's
  limits holds the counter rows inside an open transaction: B's completions keep succeeding,
  with p99 < 1 s, for the whole hold."""
  a, b, ns = replicas
  unloaded, failures = _timed_completions(b, 3.0, "unloaded")
  assert not failures, failures[:3]
  stop, a_errors = threading.Event(), []

  def load_a():   # A inside its route and feedback writes, until it is stopped
    i = 0
    while not stop.is_set():
      try:
        _feedback(a, _ask(a, f"{QUERY} (A {i})").id, 0.5)
      except Exception as e:   # noqa: BLE001 - A's own errors do not matter here
        a_errors.append(repr(e))
      i += 1
  worker = threading.Thread(target=load_a)
  worker.start()
  time.sleep(1.0)
  held = postgres_conn.connect(pg_url, postgres_conn.parse_url(pg_url)[0],
                               postgres_conn.SessionLimits(), str)
  held.execute("BEGIN")
  held.execute("SELECT value FROM gp_jax_counter WHERE namespace = %s FOR UPDATE", (ns,))
  os.kill(a.proc.pid, signal.SIGSTOP)
  try:
    lat, failures = _timed_completions(b, HOLD_S, "held")
  finally:
    os.kill(a.proc.pid, signal.SIGCONT)
    stop.set()
  worker.join(180)
  print(f"\nB unloaded: {_summary(unloaded)}\nB while A was held {HOLD_S:.0f} s: "
        f"{_summary(lat)}, {len(failures)} failed")
  assert not failures, failures[:3]
  assert len(lat) >= 10 and np.percentile(lat, 99) < 1.0, _summary(lat)
  with pytest.raises(postgres_conn.LOST):   # the server ended the held session
    held.execute("SELECT 1")
  held.close()
  # A serves again once it runs, and B's feedback is stored.
  c = _ask(a, QUERY + " (A again)")
  assert _feedback(b, c.id, 1.0)["id"] == c.id


def test_counter_going_backwards_is_detected_and_nothing_is_skipped(replicas, pg_url):
  """The feedback and route counters are lowered by hand while both replicas run (what a
  promoted standby that was behind holds); feedback continues on both. Both replicas detect it
  (one log line each), every acknowledged feedback is in both memories, and no seq is reused."""
  a, b, ns = replicas
  start = _memory(b)["feedback"]
  acked = []

  def feedback_round(tag, n):
    for i in range(n):
      served, scored = (a, b) if i % 2 else (b, a)
      c = _ask(served, f"{QUERY} ({tag} {i})")
      _feedback(scored, c.id, 0.25 * (i % 5))
      acked.append(c.id)
  feedback_round("before", 4)
  for srv in (a, b):
    assert _wait_for(srv, start + 4, limit_s=30)[0]["feedback"] == start + 4
  _sql(pg_url, "UPDATE gp_jax_counter SET value = value - 3 WHERE namespace = %s AND kind IN "
               "('feedback', 'route')", (ns,))
  feedback_round("after", 6)
  mems = [_wait_for(srv, start + 10, limit_s=30)[0] for srv in (a, b)]
  assert [m["feedback"] for m in mems] == [start + 10] * 2
  assert mems[0]["rows"] == mems[1]["rows"] and mems[0]["per_hub"] == mems[1]["per_hub"]
  for srv in (a, b):   # the memory holds each id: a second feedback is refused at once
    for rid in acked[-3:]:
      with pytest.raises(openai.ConflictError):
        _feedback(srv, rid, 0.0)
  logs = [srv.log_path.read_text(errors="replace") for srv in (a, b)]
  assert sum(log.count("started epoch 1 (was 0)") for log in logs) == 1, [
      line for log in logs for line in log.splitlines() if "epoch" in line]
  assert all("epoch 1" in log for log in logs)
  seqs = [r[0] for r in _sql(pg_url, "SELECT seq FROM gp_jax_feedback WHERE namespace = %s "
                                     "ORDER BY seq", (ns,))]
  assert len(seqs) == len(set(seqs)) == start + 10
  assert min(seqs[-6:]) > 1 << postgres_timeline.EPOCH_BITS
  assert _sql(pg_url, "SELECT value FROM gp_jax_counter WHERE namespace = %s AND kind = 'epoch'",
              (ns,))[0][0] == 1
