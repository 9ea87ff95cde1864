"""Learning while serving (serve_router --learn, gp_jax/serving/learning/learner.py): real server
processes on the simulator serving conftest.py's `workdir`, spoken to with the official `openai`
client and raw HTTP; the guards' verdicts and the key-share selection in process."""
import asyncio
import collections
import dataclasses
import json
import os
import pathlib
import signal
import time
import urllib.error
import urllib.request

import jax
import numpy as np
import openai
import pytest

from experiments.configs import test as test_config
from gp_jax.graph import features as features_lib
from gp_jax.rl import loop as rl_loop
from gp_jax.rl import parallel
from gp_jax.rl import rollout
from gp_jax.runs import ppo_config
from gp_jax.runs import system as system_lib
from gp_jax.serving.engine import config as served_config
from gp_jax.serving.http import auth
from gp_jax.serving.learning import learner as learner_lib
from gp_jax.serving.learning import process as process_lib
from gp_jax.serving.learning import update as update_lib
from experiments import serve_router_process as process
from gp_jax.serving.engine import session as session_lib
from gp_jax.serving.state import versions as versions_lib
from gp_jax.sim import served_events

KEYS = {"alice": ("alice-secret", "client"), "bob": ("bob-secret", "client"),
        "ops": ("ops-secret", "admin")}
LLMS = test_config.get_config().llms.split(",")
WORDS = ("apples", "pens", "cars", "cups", "bags", "keys", "coins", "books")


def _queries(n: int, tag: str) -> list[str]:
  return [f"How many {WORDS[i % len(WORDS)]} are there in {i + 2} boxes of {i + 3}? ({tag} {i})"
          for i in range(n)]


def _http(url: str, path: str, *, body=None, raw: bytes | None = None, key: str | None = None,
          content_type: str = "application/json"):
  """(status, body as JSON or text) of one request (POST when a body is given)."""
  data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
  headers = {"Content-Type": content_type}
  if key is not None:
    headers["Authorization"] = f"Bearer {key}"
  req = urllib.request.Request(url + path, data=data, headers=headers)
  try:
    with urllib.request.urlopen(req, timeout=120) as r:
      status, out = r.status, r.read()
  except urllib.error.HTTPError as e:
    status, out = e.code, e.read()
  try:
    return status, json.loads(out)
  except ValueError:
    return status, out.decode()


def _ask(url: str, key: str, texts: list[str], seed: int | None = None) -> list:
  """Chat completions of `texts`, concurrently, with the official async client."""
  async def run():
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=120)
    try:
      kw = {} if seed is None else dict(seed=seed)
      return await asyncio.gather(*[client.chat.completions.create(
          model="graphplanner", messages=[{"role": "user", "content": t}], **kw) for t in texts])
    finally:
      await client.close()
  return asyncio.run(run())


def _ext(c) -> dict:
  return c.model_extra["graphplanner"]


def _feedback(url: str, key: str | None, completions, score) -> None:
  for c in completions:
    status, body = _http(url, "/v1/feedback", body=dict(id=c.id, score=score(c)), key=key)
    assert status == 200, body


def _idle(url: str, key: str | None, timeout_s: float = 300.0) -> dict:
  """/health's router part once no update runs (an update starts inside the feedback request
  that makes one possible, and the next at the end of the one before, so idle stays idle)."""
  t0 = time.monotonic()
  while time.monotonic() - t0 < timeout_s:
    status, h = _http(url, "/health", key=key)
    assert status == 200, h
    if not h["router"]["updating"]:
      return h["router"]
    time.sleep(0.2)
  raise AssertionError("the learner is still updating")


def _uses(c, llm: str) -> bool:
  return all(s["llm"] == llm for s in _ext(c)["route"])


def _share(c, llm: str) -> float:
  """The share of a completion's calls that `llm` made."""
  return float(np.mean([s["llm"] == llm for s in _ext(c)["route"]]))


# ---- in process ------------------------------------------------------------------------------------
def test_select_caps_each_keys_share_of_an_update():
  P = lambda key: learner_lib.Pending("id", key, 1.0, None)
  pending = [P("a")] * 10 + [P("b")] * 3 + [P(None)] * 2
  assert learner_lib.select(pending, 8, 4) == [0, 1, 2, 3, 10, 11, 12, 13]
  assert learner_lib.select(pending[:10], 8, 4) is None          # one key cannot fill an update
  assert learner_lib.select([P(None)] * 8, 8, 1) == list(range(8))   # no key: not capped
  assert learner_lib.LearnSettings(every=8, max_key_share=0.5).key_cap == 4
  assert learner_lib.LearnSettings(every=8, max_key_share=0.01).key_cap == 1
  for bad in (dict(every=0), dict(explore=1.5), dict(max_kl=0.0), dict(kl_backtrack=-1),
              dict(max_key_share=0.0), dict(canary_margin=-1.0), dict(every=8, max_pending=4),
              dict(key_check_z=-1.0), dict(key_check_min=2)):
    with pytest.raises(Exception, match="invalid learning settings"):
      learner_lib.LearnSettings(**bad)


def test_pack_sends_each_episode_as_its_own_pickle():
  """The episodes go to the learner process one pickle each (the lock is handed over between
  them), and the process gets back episodes equal to the sent ones."""
  episodes = [rollout.Episode(None, None, 0, None, None, None,
                              obs=[{"mask": np.arange(i + 3, dtype=np.float32)}],
                              actions=[i], logp=[-0.5 * i], values=[0.1], rewards=[1.0 - i],
                              utility=float(i)) for i in range(3)]
  blobs = process_lib.pack(episodes)
  assert [type(b) for b in blobs] == [bytes] * 3
  back = process_lib.unpack(blobs)
  for sent, got in zip(episodes, back):
    np.testing.assert_array_equal(got.obs[0]["mask"], sent.obs[0]["mask"])
    assert (got.actions, got.logp, got.rewards, got.utility) == (
        sent.actions, sent.logp, sent.rewards, sent.utility)


def test_policy_kl_is_zero_for_equal_logits_and_ignores_masked_actions():
  rng = np.random.default_rng(0)
  a = rng.normal(size=(4, 6))
  mask = np.ones((4, 6), bool)
  mask[:, 5] = False
  w = np.array([1, 1, 1, 0], np.float32)
  assert update_lib.policy_kl(a, a, mask, w) == pytest.approx(0.0, abs=1e-12)
  b = a.copy()
  b[:, 5] += 100.0   # a masked action's logit (the policy gives it -1e9 anyway)
  b[3] += rng.normal(size=6)   # a padding row
  a_m, b_m = np.where(mask, a, -1e9), np.where(mask, b, -1e9)
  assert update_lib.policy_kl(a_m, b_m, mask, w) == pytest.approx(0.0, abs=1e-12)
  c = np.where(mask, a + rng.normal(size=a.shape), -1e9)
  assert update_lib.policy_kl(a_m, c, mask, w) > 0.01


def test_shortened_steps_between_the_two_parameter_sets():
  a = {"w": np.zeros((2, 3), np.float32), "b": np.array([1.0, -1.0], np.float32)}
  b = {"w": np.full((2, 3), 4.0, np.float32), "b": np.array([3.0, 1.0], np.float32)}
  for beta in (0.0, 0.25, 1.0):
    got = update_lib.shortened(a, b, beta)
    assert got["w"].dtype == np.float32
    np.testing.assert_allclose(got["w"], 4.0 * beta)
    np.testing.assert_allclose(got["b"], a["b"] + beta * (b["b"] - a["b"]))


def test_a_version_written_apart_serves_only_once_committed(tmp_path):
  """The learner process writes a version's checkpoint, the server commits it: an uncommitted
  folder is not a version (removed when the store opens, replaced by the next write), and a
  commit without its folder is refused."""
  from gp_jax.rl import ppo
  state = lambda x: ppo.TrainingState(params={"w": np.full(3, x, np.float32)},
                                      opt_state={"m": np.zeros(3, np.float32)},
                                      rng=np.zeros(2, np.uint32),
                                      update_step=np.asarray(int(x), np.int32))
  store = versions_lib.VersionStore(tmp_path, row_dim=4, num_hubs=2)
  store.add(state(0), dict(version="v0"), {})
  record = versions_lib.stamped(dict(version="v1", parent="v0"))
  versions_lib.write_checkpoint(tmp_path / "v1", state(7), record, row_dim=4, num_hubs=2)
  assert [v["version"] for v in versions_lib.VersionStore(tmp_path, row_dim=4,
                                                          num_hubs=2).versions()] == ["v0"]
  assert not (tmp_path / "v1").exists()   # the reopened store removed the uncommitted write
  with pytest.raises(Exception, match="no checkpoint folder"):
    store.commit(record, {})
  (tmp_path / "v1").mkdir()
  (tmp_path / "v1" / "junk").write_text("half written")
  versions_lib.write_checkpoint(tmp_path / "v1", state(5), record, row_dim=4, num_hubs=2)
  assert store.commit(record, {"n": 1})["version"] == "v1" and store.serving == "v1"
  again = versions_lib.VersionStore(tmp_path, row_dim=4, num_hubs=2)
  assert again.serving == "v1" and again.learner == {"n": 1}
  np.testing.assert_array_equal(again.load("v1", state(0)).params["w"], np.full(3, 5.0))
  with pytest.raises(ValueError, match="exists"):
    store.commit(record, {})


def test_canary_guard_rejects_a_worse_candidate_and_kl_guard_a_far_one(workdir, tmp_path):
  """The guards on real weights: the trained router and an untrained one, each scored on the
  canary by the simulator; whichever is worse is refused as a candidate against the other when
  the gap exceeds the margin, and accepted when it is within it."""
  config = served_config.load_config(workdir)
  settings = learner_lib.LearnSettings(every=4, explore=0.0, canary_size=4, max_kl=1e6,
                                  canary_margin=0.0)
  s = session_lib.RouterSession(config, workdir, max_concurrency=4, learn=settings,
                                versions_dir=tmp_path / "versions")

  async def serve():
    return await asyncio.gather(*[s.complete(t) for t in _queries(4, "canary")])
  try:
    asyncio.run(serve())
    # The learner process's guarded update, built here on the served system and GARNet.
    learner = update_lib.GuardedUpdate(settings, config=config, system=s.system, model=s.model)
    obs = features_lib.stack([o for e in s._trajectories.values() for o in e.obs])
    weights = np.ones(len(obs["mask"]), np.float32)
    trained = s.learner.params
    other = rl_loop.init_state(s.model, s.featurizer, ppo_config.make_optimizer(config),
                               seed=123).params
    other = jax.device_get(other)
    view = s.history.view()
    score = {"trained": learner.canary(trained, view), "untrained": learner.canary(other, view)}
    assert score["trained"] != score["untrained"]
    better, worse = sorted(score, key=score.get, reverse=True)
    params = {"trained": trained, "untrained": other}
    gap = score[better] - score[worse]
    learner.settings = dataclasses.replace(settings, canary_margin=gap / 2)
    v = learner.judge(params[better], params[worse], obs, weights, view)
    assert v["reason"] == "canary", v
    assert v["canary"]["candidate"] == pytest.approx(score[worse])
    assert v["canary"]["parent"] == pytest.approx(score[better])
    assert learner.judge(params[worse], params[better], obs, weights, view)["reason"] is None
    learner.settings = dataclasses.replace(settings, canary_margin=2 * gap)
    assert learner.judge(params[better], params[worse], obs, weights, view)["reason"] is None
    learner.settings = dataclasses.replace(settings, max_kl=1e-6)
    v = learner.judge(params[better], params[worse], obs, weights, view)
    assert v["reason"] == "kl" and v["kl"] > 1e-6 and v["canary"] is None
    # Backtracking: a bound between the quarter step's KL and the full step's accepts a halved
    # step (the first within it); with no halvings the full step is kept (and refused).
    a, b = params[better], params[worse]
    kl_of = lambda p: update_lib.policy_kl(learner._logits(a, obs, view),
                                              learner._logits(p, obs, view), obs["mask"], weights)
    quarter, half, full = (kl_of(update_lib.shortened(a, b, x)) for x in (0.25, 0.5, 1.0))
    assert 0 < quarter < full
    bound = quarter * 1.0001
    learner.settings = dataclasses.replace(settings, max_kl=bound, kl_backtrack=3)
    got, beta, full_kl, _ = learner.backtrack(a, b, obs, weights, view)
    assert full_kl == pytest.approx(full) and beta == (0.5 if half <= bound else 0.25)
    assert kl_of(got) <= bound and learner.judge(a, got, obs, weights, view)["kl"] <= bound
    learner.settings = dataclasses.replace(settings, max_kl=bound, kl_backtrack=0)
    got, beta, _, _ = learner.backtrack(a, b, obs, weights, view)
    assert beta == 1.0 and learner.judge(a, got, obs, weights, view)["reason"] == "kl"
  finally:
    asyncio.run(s.aclose())


def test_a_swap_compiles_nothing_and_installs_the_exact_weights(workdir, tmp_path):
  """A learning server compiles a swap's weight transfer before serving (a first compile on the
  event loop would stall every request in flight); the decisions then read exactly the weights
  swapped in, on the device."""
  config = served_config.load_config(workdir)
  settings = learner_lib.LearnSettings(every=4, explore=0.0, canary_size=4)
  s = session_lib.RouterSession(config, workdir, max_concurrency=2, learn=settings,
                                versions_dir=tmp_path / "versions")
  try:
    compiled = parallel._split._cache_size()
    host = jax.tree_util.tree_map(lambda x: np.asarray(x) * 0.5, s.learner.params)
    s._swap(host, "v-half")
    assert parallel._split._cache_size() == compiled
    for a, b in zip(jax.tree_util.tree_leaves(host), jax.tree_util.tree_leaves(s.runner.params)):
      assert isinstance(b, jax.Array)
      np.testing.assert_array_equal(np.asarray(b), a)
    assert s.router_version == "v-half"
  finally:
    asyncio.run(s.aclose())


def test_canary_follows_the_pool_the_latest_served_query_met(workdir):
  """A served fail event at training position T: an update whose latest served query comes
  before T is judged on the configured pool, one whose latest comes at or after T on the pool
  with the event on every canary query (and the canary's reward changes with it for an LLM the
  router calls there)."""
  t = 3
  base = served_config.load_config(workdir)
  s = session_lib.RouterSession(base, workdir, max_concurrency=2)
  try:
    params, view = s.params, s.history.view()
    settings = learner_lib.LearnSettings(every=4, canary_size=4)
    plain = update_lib.GuardedUpdate(settings, config=base, system=s.system, model=s.model)
    configured = plain.canary(params, view)
    moved = {}
    for llm in LLMS:
      config = served_config.with_pool_event(base, served_events.ServedEvent("fail", llm, t, 0.0, 1.0))
      system = system_lib.build(config)
      learner = update_lib.GuardedUpdate(settings, config=config, system=system,
                                            model=s.model)
      train = system.train_queries
      episode = lambda i: rollout.Episode(train[i], None, 0, None, None, None)
      assert learner.canary_pool([episode(t + 1), episode(t - 1)]) is None   # latest first
      assert learner.canary_pool([episode(0), rollout.Episode(None, *[None] * 5)]) is None
      pool = learner.canary_pool([episode(t - 1), episode(t)])
      assert [(e.kind, e.llm, e.t) for e in pool.events] == [("fail", llm, 0)]
      assert pool.splits == (update_lib.CANARY_SPLIT,)
      assert learner.canary(params, view, None) == configured
      moved[llm] = learner.canary(params, view, pool)
      v = learner.judge(params, params, *_one_decision(s), view, pool=pool)
      assert v["reason"] is None and v["canary"]["pool"][0]["kind"] == "fail"
    assert any(abs(r - configured) > 1e-9 for r in moved.values()), (configured, moved)
  finally:
    asyncio.run(s.aclose())


def _one_decision(s):
  """(obs, weights) of one decision of the served router (the KL limit's input)."""
  q = s.system.test_queries[0]
  state = s.env.reset(q)
  t_emb, q_emb = s.featurizer.encoder.encode([s.describe(q)[0], q.query])
  rows = np.zeros((0, s.featurizer.spec.row_dim), np.float32)
  obs = features_lib.stack([s.featurizer.observe(state, t_emb, q_emb, rows, s.env.mask(state))])
  return obs, np.ones(1, np.float32)


def test_learning_needs_a_versions_folder_and_a_learnable_mode(workdir):
  config = served_config.load_config(workdir)
  with pytest.raises(Exception, match="--memory_path"):
    session_lib.RouterSession(config, workdir, max_concurrency=2,
                              learn=learner_lib.LearnSettings(every=4))


# ---- a learning server with keys -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def keyed(workdir, tmp_path_factory):
  """A learning server with client keys alice and bob and admin ops; each key may be at most half
  of an 8-episode update; the KL and canarys wide open (this server tests the learning and
  the key share; the guards have their own tests)."""
  state = tmp_path_factory.mktemp("learn-keyed")
  keys = state / "keys.json"
  keys.write_text(json.dumps({"keys": [
      {"name": n, "sha256": auth.key_digest(k), "role": r} for n, (k, r) in KEYS.items()]}))
  srv = process.RouterProcess([
      f"--workdir={workdir}", f"--memory_path={state / 'memory.npz'}", f"--api_keys_file={keys}",
      "--learn", "--learn_every=8", "--learn_explore=0.5", "--learn_max_key_share=0.5",
      "--learn_max_kl=1000", "--learn_canary_margin=1000", "--learn_canary_size=4"],
      state / "server.log").start()
  yield srv, state
  srv.stop()


def test_new_endpoints_refuse_callers_and_bad_bodies(keyed):
  srv, _ = keyed
  url = srv.url
  alice, ops = KEYS["alice"][0], KEYS["ops"][0]
  assert _http(url, "/v1/router/versions")[0] == 401
  assert _http(url, "/v1/router/rollback", body={"version": "v0"})[0] == 401
  assert _http(url, "/v1/router/versions", key=alice)[0] == 403
  assert _http(url, "/v1/router/rollback", body={"version": "v0"}, key=alice)[0] == 403
  assert _http(url, "/v1/router/versions", key="wrong")[0] == 401
  status, body = _http(url, "/v1/router/rollback", raw=b"version=v0", key=ops,
                       content_type="text/plain")
  assert status == 415, body
  for raw in (b"{", b"[1]", b'{"version": 3}', b'{"version": ""}', b"{}",
              b'{"version": "v0", "also": 1}'):
    status, body = _http(url, "/v1/router/rollback", raw=raw, key=ops)
    assert status == 400 and body["error"]["type"] == "invalid_request_error", (raw, body)
  status, body = _http(url, "/v1/router/rollback", body={"version": "v99"}, key=ops)
  assert status == 404 and body["error"]["code"] == "unknown_version"
  status, body = _http(url, "/v1/router/versions", key=ops)
  assert status == 200 and body["serving"] == "v0" and body["data"][0]["version"] == "v0"
  assert "/" not in json.dumps(_http(url, "/health", key=ops)[1]["router"])


def test_feedback_favouring_one_llm_shifts_routing_there_within_the_key_share(keyed):
  srv, _ = keyed
  url = srv.url
  alice, bob, ops = (KEYS[k][0] for k in ("alice", "bob", "ops"))
  probe = _queries(32, "probe")

  def greedy() -> list:   # the completions whose decisions were greedy (about half)
    out = [c for c in _ask(url, ops, probe, seed=3) if not _ext(c)["explored"]]
    assert len(out) >= 4
    return out

  first = greedy()
  before = {llm: float(np.mean([_share(c, llm) for c in first])) for llm in LLMS}
  target = min(LLMS, key=before.get)   # the LLM the trained router uses least
  favour = lambda c: _share(c, target)   # the share of its calls the favoured LLM made
  for r in range(4):   # alice sends three times bob's feedback: she is capped at half an update
    _feedback(url, alice, _ask(url, alice, _queries(12, f"alice {r}")), favour)
    _feedback(url, bob, _ask(url, bob, _queries(4, f"bob {r}")), favour)
  router = _idle(url, ops)
  probes = greedy()
  after = float(np.mean([_share(c, target) for c in probes]))
  assert router["counters"]["accepted"] >= 3, router
  assert after >= before[target] + 0.4, (target, before, after)
  assert {_ext(c)["version"] for c in probes} == {router["version"]}
  # The per-key share: no version learned from more than 4 of one key's 8 episodes, and
  # alice's surplus waits.
  status, listed = _http(url, "/v1/router/versions", key=ops)
  assert status == 200 and listed["serving"] == router["version"]
  learned = [v for v in listed["data"] if v["version"] != "v0"]
  assert len(learned) == router["counters"]["accepted"]
  for v in learned:
    per_key = collections.Counter(f["key"] for f in v["feedback"])
    assert len(v["feedback"]) == 8 and max(per_key.values()) <= 4, per_key
    assert v["parent"] is not None and v["canary"]["queries"] == 4
  assert router["pending"] >= 16   # 48 of alice's, 16 of bob's: at most 16 + 16 learned
  metrics = _http(url, "/metrics", key=ops)[1]
  assert f"gp_router_learner_accepted_total {float(router['counters']['accepted'])}" in metrics


# ---- versions: rollback, restart, kill -9 ----------------------------------------------------------------
def _children(pid: int, module: str) -> list[int]:
  """Processes whose parent is `pid` running `python -m module`."""
  out = []
  for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
    try:
      ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
      cmd = (stat.parent / "cmdline").read_bytes().split(b"\0")
    except (OSError, IndexError, ValueError):
      continue
    if ppid == pid and module.encode() in cmd:
      out.append(int(stat.parent.name))
  return out


def _niceness(pid: int) -> int:
  return int(pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16])


def _alive(pid: int) -> bool:
  """Whether `pid` runs (a zombie no reaper collected has exited)."""
  try:
    return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
  except OSError:
    return False


def test_learner_process_reports_errors_and_is_started_again_after_dying(workdir):
  """The learner process's failures come back as one error with its traceback; a learner that
  died fails the call that finds it so, and the next call starts a new one."""
  config = served_config.load_config(workdir)
  learner = process_lib.LearnerProcess(config, workdir,
                                           learner_lib.LearnSettings(every=4, canary_size=2))
  try:
    with pytest.raises(process_lib.LearnerProcessError, match="unknown op 'nonsense'"):
      learner.call("nonsense")
    first = learner.pid
    assert _niceness(first) == 19
    os.kill(first, signal.SIGKILL)
    with pytest.raises(process_lib.LearnerProcessError, match="exited .*-9"):
      learner.call("nonsense")
    assert learner.pid is None and not _alive(first)
    with pytest.raises(process_lib.LearnerProcessError, match="unknown op"):
      learner.call("nonsense")   # answered by a new learner process
    assert learner.pid not in (None, first)
  finally:
    second = learner.pid
    learner.close()
  assert learner.pid is None and not _alive(second)


def test_rollback_restart_and_kill_during_an_update(workdir, tmp_path):
  state = tmp_path / "state"
  args = [f"--workdir={workdir}", f"--memory_path={state / 'memory.npz'}", "--learn",
          "--learn_every=4", "--learn_explore=0", "--learn_max_kl=1000",
          "--learn_canary_margin=1000", "--learn_canary_size=4"]
  probe = _queries(6, "probe")
  llm = LLMS[0]
  favour = lambda c: 1.0 if _uses(c, llm) else 0.2

  def routes(url):
    out = _ask(url, "unused", probe, seed=5)
    return [[(s["role"], s["llm"]) for s in _ext(c)["route"]] for c in out], out

  srv = process.RouterProcess(args, tmp_path / "server1.log").start()
  try:
    _feedback(srv.url, None, _ask(srv.url, "unused", _queries(4, "first")), favour)
    router = _idle(srv.url, None)
    assert router["version"] == "v1" and router["counters"]["accepted"] == 1, router
    at_v1, out = routes(srv.url)
    assert {_ext(c)["version"] for c in out} == {"v1"}
    status, body = _http(srv.url, "/v1/router/rollback", body={"version": "v0"})
    assert status == 200 and body["serving"] == "v0" and body["version"] == "v0"
    at_v0, out = routes(srv.url)
    assert {_ext(c)["version"] for c in out} == {"v0"}
    status, body = _http(srv.url, "/v1/router/rollback", body={"version": "v1"})
    assert status == 200 and body["serving"] == "v1"
    again, _ = routes(srv.url)
    assert again == at_v1   # the exact decisions of v1, after serving v0 in between
    assert _http(srv.url, "/v1/router/rollback", body={"version": "v0"})[0] == 200
    assert routes(srv.url)[0] == at_v0
    assert _http(srv.url, "/v1/router/rollback", body={"version": "v1"})[0] == 200
  finally:
    srv.stop()
  # A clean restart resumes the serving version and the learner's counters.
  srv = process.RouterProcess(args, tmp_path / "server2.log").start()
  try:
    router = _idle(srv.url, None)
    assert router["version"] == "v1" and router["counters"]["accepted"] == 1
    assert router["counters"]["rollbacks"] == 4
    assert router["paused"]["version"] == "v1"   # the last rollback's pause outlives a restart
    assert routes(srv.url)[0] == at_v1
    status, body = _http(srv.url, "/v1/router/resume", body={})
    assert status == 200 and body["resumed"] and body["version"] == "v1", body
    assert _http(srv.url, "/health")[1]["router"]["paused"] is None
    # kill -9 while the next update runs (its first run in this process compiles: seconds).
    _feedback(srv.url, None, _ask(srv.url, "unused", _queries(4, "second")), favour)
    status, h = _http(srv.url, "/health")
    assert h["router"]["updating"], h["router"]
    # The update runs in the server's learner process, at the lowest priority.
    (child,) = _children(srv.proc.pid, "gp_jax.serving.learning.process")
    assert _niceness(child) == 19
    os.kill(srv.proc.pid, signal.SIGKILL)   # the server only: its learner must notice alone
    srv.proc.wait(timeout=60)
    deadline = time.time() + 120
    while _alive(child) and time.time() < deadline:
      time.sleep(0.2)
    assert not _alive(child), "the learner process outlived its killed server"
  finally:
    srv.stop()
  index = json.loads((state / versions_lib.FOLDER / versions_lib.INDEX).read_text())
  assert index["serving"] == "v1" and [v["version"] for v in index["versions"]] == ["v0", "v1"]
  tight = args + ["--learn_max_kl=1e-9"]   # the next update is refused by the KL limit
  srv = process.RouterProcess(tight, tmp_path / "server3.log").start()
  try:
    assert not (state / versions_lib.FOLDER / "v2").exists()
    router = _idle(srv.url, None)
    assert router["version"] == "v1" and router["versions"] == 2
    # The memory now also holds the second batch's feedback (acknowledged before the kill); a
    # rollback to v0 and back to v1 serves v1 with the memory it began to serve with, so its
    # decisions are those first recorded for it.
    assert _http(srv.url, "/v1/router/rollback", body={"version": "v0"})[0] == 200
    assert _http(srv.url, "/v1/router/rollback", body={"version": "v1"})[0] == 200
    assert routes(srv.url)[0] == at_v1
    assert _http(srv.url, "/v1/router/resume", body={})[0] == 200
    _feedback(srv.url, None, _ask(srv.url, "unused", _queries(4, "third")), favour)
    router = _idle(srv.url, None)
    assert router["version"] == "v1" and router["counters"]["rejected_kl"] == 1, router
    metrics = _http(srv.url, "/metrics")[1]
    assert 'gp_router_learner_rejected_total{reason="kl"} 1.0' in metrics
    listed = _http(srv.url, "/v1/router/versions")[1]
    assert listed["rejected"][-1]["reason"] == "kl" and len(listed["data"]) == 2
  finally:
    srv.stop()
