"""Rollback that holds (docs/serving.md, "Learning while serving"; learning/rollback.py) against
real server processes on the simulator serving conftest.py's `workdir`: a rollback issued while
updates stream in serves the version with the memory it began to serve with (its decisions on a
fixed query set are the ones recorded while it served), sets the span's memory aside in a file
(rolling forward serves the later version's own memory again), drops the episodes waiting and
pauses learning until an admin resumes it, also across a restart. The canary's anchor in
process, and /health saying down when the store cannot keep feedback."""
import asyncio
import dataclasses
import json
import shutil

import numpy as np
import pytest

from experiments import serve_router_process as process
from gp_jax.rl import loop as rl_loop
from gp_jax.runs import ppo_config
from gp_jax.serving.engine import config as served_config
from gp_jax.serving.engine import session as session_lib
from gp_jax.serving.http import auth
from gp_jax.serving.learning import learner as learner_lib
from gp_jax.serving.learning import update as update_lib
from gp_jax.serving.state import journal as journal_lib
from gp_jax.serving.state import store as store_lib
from gp_jax.serving.state import store_api
from gp_jax.serving.state import versions as versions_lib
from tests.serving import test_learning as tl

EVERY = 4
LLM = tl.LLMS[0]


def _routes(url: str, probe: list[str]) -> tuple[list, list]:
  """The probe's routes [(role, llm), ...] per query (greedy: exploring is off) and versions."""
  out = tl._ask(url, "unused", probe, seed=5)
  return ([[(s["role"], s["llm"]) for s in tl._ext(c)["route"]] for c in out],
          [tl._ext(c)["version"] for c in out])


def _share(routes: list) -> float:
  return float(np.mean([llm == LLM for route in routes for _, llm in route]))


def _batch(url: str, tag: str, n: int = EVERY) -> None:
  """n requests, each with one-sided feedback: 1 when the route only used LLM, else 0."""
  tl._feedback(url, None, tl._ask(url, "unused", tl._queries(n, tag)),
               lambda c: 1.0 if tl._uses(c, LLM) else 0.0)


def _router(url: str) -> dict:
  status, h = tl._http(url, "/health")
  assert status == 200, h
  return h["router"]


def test_rollback_during_updates_restores_the_version_and_pauses_learning(workdir, tmp_path):
  state = tmp_path / "state"
  args = [f"--workdir={workdir}", f"--memory_path={state / 'memory.npz'}", "--learn",
          f"--learn_every={EVERY}", "--learn_explore=0", "--learn_max_kl=1000",
          "--learn_canary_margin=1000", "--learn_canary_size=4"]
  probe = tl._queries(8, "probe")
  recorded = {}
  srv = process.RouterProcess(args, tmp_path / "server1.log").start()
  try:
    recorded["v0"], _ = _routes(srv.url, probe)
    for r in range(2):   # v1, v2, each probed as it begins to serve (no feedback in between)
      _batch(srv.url, f"settle {r}")
      version = tl._idle(srv.url, None)["version"]
      assert version == f"v{r + 1}"
      recorded[version], served_by = _routes(srv.url, probe)
      assert set(served_by) == {version}
    # A stream: batches back to back, each starting an update while the next arrives.
    for r in range(6):
      _batch(srv.url, f"stream {r}")
    end, _ = _routes(srv.url, probe)
    late = tl._ask(srv.url, "unused", tl._queries(1, "late"))   # decided before the rollback
    _batch(srv.url, "half", EVERY // 2)                           # waits: half an update
    status, body = tl._http(srv.url, "/v1/router/rollback", body={"version": "v1"})
    assert status == 200 and body["serving"] == "v1", body
    entry = body["rollback"]
    assert entry["to"] == "v1" and entry["rollback"] == 1
    assert entry["pending_dropped"] >= EVERY // 2, entry
    # The span: every feedback after v1 began (v2's batch, the stream, the half batch).
    assert entry["memory"]["feedback_set_aside"] == EVERY + 6 * EVERY + EVERY // 2, entry
    aside = state / versions_lib.FOLDER / entry["memory"]["set_aside"]
    rows, _, header = journal_lib.load_memory(aside, row_dim=_row_dim(aside),
                                              num_hubs=_num_hubs(aside))
    assert len(rows) == entry["memory"]["rows_before"] > entry["memory"]["rows"]
    assert header["rollback"] == 1
    at_v1, served_by = _routes(srv.url, probe)
    assert at_v1 == recorded["v1"] and set(served_by) == {"v1"}
    router = _router(srv.url)
    assert router["paused"]["version"] == "v1" and router["pending"] == 0
    assert router["counters"]["dropped_rollback"] == entry["pending_dropped"]
    metrics = tl._http(srv.url, "/metrics")[1]
    assert "gp_router_learner_paused 1.0" in metrics
    # Paused: a whole update's feedback waits; the late request's is not learned from.
    accepted = router["counters"]["accepted"]
    tl._feedback(srv.url, None, late, lambda c: 1.0)
    _batch(srv.url, "paused")
    router = _router(srv.url)
    assert not router["updating"] and router["pending"] == EVERY, router
    assert router["counters"]["accepted"] == accepted
    # Rolling forward serves v2 with its own memory (the span's rows up to v2 come back).
    status, body = tl._http(srv.url, "/v1/router/rollback", body={"version": "v2"})
    assert status == 200 and body["rollback"]["pending_dropped"] == EVERY, body
    assert _routes(srv.url, probe)[0] == recorded["v2"]
    status, body = tl._http(srv.url, "/v1/router/rollback", body={"version": "v0"})
    assert status == 200
    at_v0, _ = _routes(srv.url, probe)
    assert at_v0 == recorded["v0"]
    print(f"\n{LLM} share of the probe's calls: v0 {_share(recorded['v0']):.2f}, v2 "
          f"{_share(recorded['v2']):.2f}, end of the stream {_share(end):.2f}, after rollback "
          f"to v0 {_share(at_v0):.2f}; an update was running at the rollback: "
          f"{entry['waited_for_update']}")
    _batch(srv.url, "before resume")
    router = _router(srv.url)
    assert router["pending"] == EVERY and not router["updating"]
    # Only an admin resumes (no keys here: loopback is the anonymous admin; auth's table).
    assert auth.access("/v1/router/resume") == auth.ADMIN_ONLY
    assert tl._http(srv.url, "/v1/router/resume", body={"x": 1})[0] == 400
    status, body = tl._http(srv.url, "/v1/router/resume", body={})
    assert status == 200 and body["resumed"] and body["was_paused"]["version"] == "v0", body
    router = tl._idle(srv.url, None)
    assert router["paused"] is None and router["counters"]["accepted"] == accepted + 1, router
    assert tl._http(srv.url, "/v1/router/resume", body={})[1]["resumed"] is False
    listed = tl._http(srv.url, "/v1/router/versions")[1]
    newest = listed["data"][-1]
    assert newest["parent"] == "v0" and listed["serving"] == newest["version"]
    _check_anchors(listed["data"])
    status, body = tl._http(srv.url, "/v1/router/rollback", body={"version": "v0"})
    assert status == 200
  finally:
    srv.stop()
  # A restart serves v0 with v0's memory (the rollback's base), still paused.
  srv = process.RouterProcess(args, tmp_path / "server2.log").start()
  try:
    router = _router(srv.url)
    assert router["version"] == "v0" and router["paused"]["version"] == "v0"
    assert _routes(srv.url, probe)[0] == recorded["v0"]
  finally:
    srv.stop()


def _row_dim(path) -> int:
  with np.load(path) as z:
    return int(z["rows"].shape[1])


def _num_hubs(path) -> int:
  with np.load(path) as z:
    return int(json.loads(str(z["header"]))["num_hubs"])


def _check_anchors(versions: list[dict]) -> None:
  """Each accepted version's canary bar is max(parent, anchor) - margin, and its anchor is the
  best of the anchor before it, its parent and itself on that canary (newest on a tie)."""
  for v in versions[1:]:
    c = v["canary"]
    assert c["bar"] == pytest.approx(max(c["parent"], c["anchor"]) - 1000)
    best = (c["anchor"], c["anchor_version"])
    if c["parent"] >= best[0]:
      best = (c["parent"], v["parent"])
    if c["candidate"] >= best[0]:
      best = (c["candidate"], v["version"])
    assert v["anchor"] == best[1], v


def test_canary_is_anchored_to_the_best_accepted_version(workdir, tmp_path):
  """A candidate no worse than its parent is refused when it loses more than the margin to the
  anchor (the best accepted version), and the anchor moves only to a version at least as good."""
  config = served_config.load_config(workdir)
  settings = learner_lib.LearnSettings(every=4, explore=0.0, canary_size=4, max_kl=1e6)
  s = session_lib.RouterSession(config, workdir, max_concurrency=4)
  try:
    guard = update_lib.GuardedUpdate(settings, config=config, system=s.system, model=s.model)
    other = rl_loop.init_state(s.model, s.featurizer, ppo_config.make_optimizer(config),
                               seed=123).params
    params = {"trained": s.params, "untrained": other}
    view = s.history.view()
    score = {k: guard.canary(p, view) for k, p in params.items()}
    better, worse = sorted(score, key=score.get, reverse=True)
    gap = score[better] - score[worse]
    assert gap > 0
    guard.settings = dataclasses.replace(settings, canary_margin=gap / 2)
    obs, weights = tl._one_decision(s)
    # Parent and candidate the worse weights: no loss against the parent...
    assert guard.judge(params[worse], params[worse], obs, weights, view)["reason"] is None
    # ...but a loss of the whole gap against the anchor.
    v = guard.judge(params[worse], params[worse], obs, weights, view, anchor=params[better])
    assert v["reason"] == "canary", v
    assert v["canary"]["anchor"] == pytest.approx(score[better])
    assert v["canary"]["bar"] == pytest.approx(score[better] - gap / 2)
    ok = guard.judge(params[worse], params[better], obs, weights, view, anchor=params[better])
    assert ok["reason"] is None
  finally:
    asyncio.run(s.aclose())
  # The anchor's bookkeeping (learner._next_anchor): the best of anchor, parent and candidate.
  me = type("L", (), {})()
  me.anchor, me._anchor_params, me.version = "v1", "p1", "v3"
  me.state = type("S", (), {"params": "p3"})()
  pick = lambda **c: learner_lib.OnlineLearner._next_anchor(me, c, "v4", "p4")
  assert pick(anchor=0.5, parent=0.45, candidate=0.48) == ("v1", "p1")   # within the margin
  assert pick(anchor=0.5, parent=0.55, candidate=0.52) == ("v3", "p3")
  assert pick(anchor=0.5, parent=0.45, candidate=0.5) == ("v4", "p4")


# ---- /health when the store breaks ---------------------------------------------------------------
def test_health_says_down_when_the_state_folder_is_removed(workdir, tmp_path):
  keys = tmp_path / "keys" / "keys.json"
  keys.parent.mkdir()
  keys.write_text(json.dumps({"keys": [
      {"name": n, "sha256": auth.key_digest(k), "role": r} for n, (k, r) in tl.KEYS.items()]}))
  state = tmp_path / "state"
  srv = process.RouterProcess([f"--workdir={workdir}", f"--memory_path={state / 'memory.npz'}",
                               f"--api_keys_file={keys}"], tmp_path / "server.log").start()
  alice, ops = tl.KEYS["alice"][0], tl.KEYS["ops"][0]
  try:
    assert tl._http(srv.url, "/health", key=alice) == (200, {"status": "ok"})
    status, h = tl._http(srv.url, "/health", key=ops)
    assert status == 200 and h["status"] == "ok" and h["store_problem"] is None
    shutil.rmtree(state)
    assert tl._http(srv.url, "/health", key=alice) == (503, {"status": "down"})
    assert tl._http(srv.url, "/health") == (503, {"status": "down"})
    status, h = tl._http(srv.url, "/health", key=ops)
    assert status == 503 and h["status"] == "down" and "gone" in h["store_problem"], h
    assert str(tmp_path) not in json.dumps(h)
  finally:
    srv.stop()


def test_a_broken_journal_and_missing_files_are_store_problems(tmp_path):
  store = store_lib.FileStore(tmp_path / "memory.npz", tmp_path / "routes.jsonl", row_dim=3,
                              num_hubs=2)
  try:
    assert store.problem() == "the memory base memory.npz is gone"
    store.write_base(np.zeros((0, 3), np.float32), np.zeros(0, np.int32), {"num_hubs": 2}, 0)
    assert store.problem() is None
    fb = lambda rid: store_api.Feedback(0, rid, None, 1.0, np.ones((1, 3), np.float32),
                                        np.zeros(1, np.int32))
    store.add_feedback(fb("a"))
    assert store.problem() is None

    def broken(records):
      raise journal_lib.JournalBroken("memory.npz.journal: a failed append could not be undone")
    store.memfile.append = broken
    with pytest.raises(journal_lib.JournalBroken):
      store.add_feedback(fb("b"))
    assert "broken" in store.problem()
  finally:
    store.close()
  store = store_lib.FileStore(tmp_path / "m2" / "memory.npz", None, row_dim=3, num_hubs=2)
  try:
    store.write_base(np.zeros((0, 3), np.float32), np.zeros(0, np.int32), {"num_hubs": 2}, 0)
    (tmp_path / "m2" / store_lib.LOCK_NAME).unlink()
    assert "lock file" in store.problem()
  finally:
    store.close()
