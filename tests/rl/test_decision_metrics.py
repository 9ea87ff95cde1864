"""Decision statistics of training (split_rate, p_planner_root, entropy/<type> in metrics.jsonl),
the TensorBoard event file beside metrics.jsonl, and the entropy stop's minimum episodes."""
import asyncio
import errno
import json
import math
import pathlib

import jax
import numpy as np
import pytest

from gp_jax import errors
from gp_jax.rl import batch as batch_lib
from gp_jax.rl import loop as rl_loop
from gp_jax.rl import parallel
from gp_jax.rl import ppo
from gp_jax.rl import rollout
from gp_jax.runs import ppo_config
from gp_jax.runs import system as system_lib
from gp_jax.runs import train as training
from gp_jax.workflow import mdp
from tests.util import tb_reader
from tests.util import tiny

NEW_KEYS = {"split_rate", "p_planner_root"} | {f"entropy/{t}" for t in rollout.DECISION_TYPES}


def _config():
  return tiny.tiny_config(episodes=24)


def test_decision_types_follow_the_state_and_mask(tiny_world):
  space, cfg = tiny_world["space"], mdp.MDPConfig(p_max=1)
  planner, executor = space.encode("planner", space.llms[0]), space.encode("executor", space.llms[0])
  summarizer = space.encode("summarizer", space.llms[0])
  s = mdp.new_state("q")
  assert rollout.decision_type(s.steps, mdp.action_mask(s, space, cfg), space) == "root"

  def call(action, text=""):
    role, llm = space.decode(action)
    return mdp.Call(step=0, action=action, role=role.name, kind=role.kind, llm=llm, node=0,
                    input_text="", output_text=text, input_tokens=0, output_tokens=0,
                    cost_usd=0.0, latency_s=0.0, error=None)
  mdp.apply(s, call(planner, "a\nb"), cfg)           # the root plans: two children, budget spent
  types = lambda: rollout.decision_type(s.steps, mdp.action_mask(s, space, cfg), space)
  assert types() == "other"                           # a child that can no longer be planned
  mdp.apply(s, call(executor), cfg)
  mdp.apply(s, call(executor), cfg)
  assert types() == "summarize"
  mdp.apply(s, call(summarizer), cfg)
  assert s.at_final_answer and types() == "other"     # the root's final answer
  s2 = mdp.new_state("q")
  mdp.apply(s2, call(planner, "a"), mdp.MDPConfig(p_max=2))
  assert rollout.decision_type(s2.steps, mdp.action_mask(s2, space, mdp.MDPConfig(p_max=2)),
                               space) == "pending"    # plan or execute is open


def test_entropy_over_the_valid_actions():
  mask = np.array([True, True, False, True])
  assert rollout.entropy(np.array([0.5, 0.5, 0.0, 0.0]), mask) == pytest.approx(math.log(2))
  assert rollout.entropy(np.array([1 / 3, 1 / 3, 0.0, 1 / 3]), mask) == pytest.approx(math.log(3))
  assert rollout.entropy(np.array([1.0, 0.0, 0.0, 0.0]), mask) == 0.0


def test_episodes_record_their_decisions_and_forced_roots_put_all_on_planners():
  cfg = _config()
  p = tiny.fresh_policy(cfg)
  sysm, feat, space, runner, env = p.sysm, p.feat, p.space, p.runner, p.env
  eps = asyncio.run(rollout.run_episodes(
      env, feat, runner, sysm.train_queries[:6], key=jax.random.PRNGKey(3), greedy=False,
      history=None, grow_history=False, seed_salt=("t", 0), planner_first=2))
  planners = space.kind_mask(["planner"])
  for i, e in enumerate(eps):
    assert len(e.decision_types) == len(e.entropies) == len(e.actions) == len(e.state.calls)
    assert e.decision_types[0] == "root" and "root" not in e.decision_types[1:]
    for obs, h in zip(e.obs, e.entropies):
      assert 0.0 <= h <= math.log(obs["mask"].sum()) + 1e-6
    if i < 2:   # forced: the first mask holds planners only
      assert e.p_planner_root == pytest.approx(1.0) and e.state.planner_calls > 0
    else:
      assert 0.0 < e.p_planner_root < 1.0
      assert planners[e.obs[0]["mask"]].any()
  m = rl_loop.decision_metrics(eps)
  assert set(m) == NEW_KEYS
  assert m["split_rate"] == np.mean([e.state.planner_calls > 0 for e in eps]) >= 2 / 6
  assert m["p_planner_root"] == pytest.approx(np.mean([e.p_planner_root for e in eps]))
  assert m["entropy/root"] == pytest.approx(np.mean([e.entropies[0] for e in eps]))


def _run(workdir, cfg, settings):
  """rl_loop.train of cfg's system and model under explicit loop settings."""
  p, t = cfg.ppo, cfg.train
  sysm = system_lib.build(cfg)
  env = sysm.env(float(cfg.alpha), reward=t.reward)
  model = training.make_model(cfg, sysm.featurizer.spec)
  settings_ppo = ppo_config.ppo_settings(cfg)
  optimizer = ppo.make_optimizer(settings_ppo)
  mesh = parallel.make_mesh(0)
  update = ppo.make_update_fn(model, optimizer, settings_ppo, mesh=mesh)
  batch_size = batch_lib.batch_size_for(t.episodes_per_iter, settings.max_calls,
                                        p.num_minibatches, mesh.size)
  return rl_loop.train(workdir, env=env, featurizer=sysm.featurizer, queries=sysm.train_queries,
                       model=model, optimizer=optimizer, update=update, batch_size=batch_size,
                       settings=settings, rollout_mesh=parallel.make_mesh(0, local=True),
                       verbose=False)


def _settings(sysm, episodes, **kw):
  return rl_loop.LoopSettings(
      episodes=episodes, episodes_per_iter=8, parallel=8, seed=0, checkpoint_every=1,
      max_calls=sysm.mdp_cfg.max_calls(), history="transductive", history_capacity=200, **kw)


def _check_events(events_file, lines):
  """The event file's first record is the file version, the second a SessionLog START at its
  first step, then one event per metrics line at step = the episodes so far, holding every
  number of the line (as float32)."""
  events = tb_reader.read_events(events_file)
  assert events[0]["file_version"] == "brain.Event:2"
  assert events[1]["session_status"] == 1 and events[1]["step"] == lines[0]["episodes"]
  assert [e["step"] for e in events[2:]] == [r["episodes"] for r in lines]
  for e, r in zip(events[2:], lines):
    numbers = {k: v for k, v in r.items()
               if isinstance(v, (int, float)) and not isinstance(v, bool)}
    assert set(e["values"]) == set(numbers)
    for k, v in numbers.items():
      assert e["values"][k] == pytest.approx(float(np.float32(v)), rel=1e-6, nan_ok=True), k


def test_a_run_logs_decision_metrics_and_events_and_stops_after_min_episodes(tmp_path):
  """Two iterations of 8 episodes; then resumed for more, with an entropy stop threshold above
  any entropy and a minimum of 32 episodes: iteration 2 (24 episodes) goes on, iteration 3 (32)
  stops. Every record has the decision statistics in range; each of the two runs wrote its own
  event file holding the numbers of its metrics lines."""
  cfg = _config()
  sysm = system_lib.build(cfg)
  _run(tmp_path, cfg, _settings(sysm, 16, entropy_stop=0.0))
  (first,) = tb_reader.event_files(tmp_path)
  summary = _run(tmp_path, cfg, _settings(sysm, 64, entropy_stop=100.0,
                                          entropy_stop_min_episodes=32))
  assert summary["stopped_early"] and summary["iteration"] == 3 and summary["episodes"] == 32
  lines = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [r["iteration"] for r in lines] == [0, 1, 2, 3]
  for r in lines:
    assert NEW_KEYS <= set(r)
    assert 0.0 <= r["split_rate"] <= 1.0 and 0.0 <= r["p_planner_root"] <= 1.0
    assert r["entropy/root"] is not None
    for t in rollout.DECISION_TYPES:
      h = r[f"entropy/{t}"]
      assert h is None or (math.isfinite(h) and h >= 0.0), (t, h)
  files = tb_reader.event_files(tmp_path)
  assert len(files) == 2 and files[0] == first   # the resumed run's file sorts after the first
  _check_events(files[0], lines[:2])
  _check_events(files[1], lines[2:])
  # Run again with nothing left to do (stopped early): no new event file.
  _run(tmp_path, cfg, _settings(sysm, 64, entropy_stop=100.0, entropy_stop_min_episodes=32))
  assert tb_reader.event_files(tmp_path) == files


def test_an_event_file_that_cannot_be_written_stops_the_run_with_a_storage_error(tmp_path,
                                                                                monkeypatch):
  """As for metrics.jsonl: a StorageError naming the event file, never a silent gap."""
  log = rl_loop.MetricsLog(tmp_path / "metrics.jsonl", -1)
  log.write(dict(iteration=0, episodes=8, loss=0.5, note="strings are left out"))
  (path,) = tb_reader.event_files(tmp_path)
  ev = tb_reader.read_events(path)[2]
  assert ev["step"] == 8 and ev["values"] == dict(iteration=0.0, episodes=8.0, loss=0.5)
  real_open = pathlib.Path.open

  def full(self, *args, **kwargs):
    if "tfevents" in self.name:
      raise OSError(errno.ENOSPC, "No space left on device")
    return real_open(self, *args, **kwargs)
  monkeypatch.setattr(pathlib.Path, "open", full)
  with pytest.raises(errors.StorageError, match=f"{path.name}: cannot write the TensorBoard "
                                                "events"):
    log.write(dict(iteration=1, episodes=16, loss=0.25))
