"""Forced-planner episodes (train.force_planner_episodes): the run's first N training episodes
take their first step among the planners only; the decision and the PPO update both read that
mask; the count follows the run's episode index over resumes; evaluation is never forced."""
import asyncio
import json

import jax
import numpy as np
import pytest

from gp_jax import errors
from gp_jax.rl import batch as batch_lib
from gp_jax.rl import ppo
from gp_jax.rl import rollout
from gp_jax.runs import ppo_config
from gp_jax.runs import system as system_lib
from gp_jax.runs import train as training
from gp_jax.workflow import mdp
from tests.util import tiny

TIMING = {"rollout_s", "update_s", "update_compiles"}


def _config():
  return tiny.tiny_config(episodes=24)


def _kinds(space, actions):
  return [space.decode(int(a))[0].kind for a in actions]


def test_forced_episodes_start_with_a_planner_under_the_mask_the_update_reads():
  cfg = _config()
  p = tiny.fresh_policy(cfg)
  sysm, feat, space, model, params, runner, env = (p.sysm, p.feat, p.space, p.model, p.params,
                                                   p.runner, p.env)
  queries = sysm.train_queries[:6]

  def run(**kw):
    return asyncio.run(rollout.run_episodes(
        env, feat, runner, queries, key=jax.random.PRNGKey(3), greedy=False, history=None,
        grow_history=False, seed_salt=("t", 0), **kw))

  eps = run(planner_first=3)     # 3: not a multiple of the 4 episodes in flight
  for i, ep in enumerate(eps):
    root = env.mask(env.reset(ep.query))
    first = ep.obs[0]["mask"]
    assert ep.planner_first == (i < 3)
    if i < 3:
      assert np.array_equal(first, mdp.planner_only(root, space))
      assert _kinds(space, ep.actions[:1]) == ["planner"]
      # only the first decision is forced: a child node then offers its executors again
      assert "executor" in _kinds(space, np.flatnonzero(ep.obs[1]["mask"]))
    else:
      assert np.array_equal(first, root)
  # No forcing (the default, and 0): every episode's first decision reads the env's mask.
  for ep0, ep in zip(run(planner_first=0), run()):
    assert np.array_equal(ep0.obs[0]["mask"], env.mask(env.reset(ep0.query)))
    assert ep0.actions == ep.actions and not ep0.planner_first

  # The update recomputes each decision's log-probability from the stored (forced) mask.
  n = sum(len(e.actions) for e in eps)
  size = -(-n // 8) * 8
  batch, hist = batch_lib.build_batch(eps, None, batch_size=size, num_episodes=len(eps),
                                      max_calls=ppo_config.max_calls(sysm), num_hubs=space.size)
  tr = batch.transitions

  def logp_of(transitions):
    logits, _ = ppo.forward_batch(model, params, feat.hub_features, hist, transitions, size + 1)
    logp = jax.nn.log_softmax(logits)
    return np.take_along_axis(np.asarray(logp), tr["actions"][:, None], 1)[:n, 0]
  np.testing.assert_allclose(logp_of(tr), tr["old_logp"][:n], atol=2e-4)
  # Under the unforced mask the same first actions are less likely: the forced mask is the one used.
  starts = np.cumsum([0] + [len(e.actions) for e in eps[:3]])[:3]
  unforced = np.array(tr["obs"]["mask"])
  for ep, j in zip(eps[:3], starts):
    unforced[j] = env.mask(env.reset(ep.query))
  loose = logp_of(dict(tr, obs=dict(tr["obs"], mask=unforced)))
  assert np.all(loose[starts] < tr["old_logp"][starts] - 1e-3)


def _metrics(workdir):
  lines = (workdir / "metrics.jsonl").read_text().splitlines()
  return [{k: v for k, v in json.loads(l).items() if k not in TIMING} for l in lines]


def test_the_first_n_episodes_of_the_run_are_forced_across_a_resume(tmp_path, monkeypatch):
  """N = 11 with 8 episodes per iteration: iteration 0 forces all 8, iteration 1 its first 3,
  iteration 2 none; a run interrupted after iteration 0 resumes with the 3 (a count kept by the
  process would start again at 11), and gives the uninterrupted run's metrics."""
  cfg = _config()
  cfg.train.force_planner_episodes = 11
  real = rollout.run_episodes
  space = system_lib.build(cfg).space
  seen = []   # (planner_first given, episodes) per rollout

  def recording(*args, stop_at=None, **kwargs):
    if stop_at is not None and len(seen) == stop_at:
      raise KeyboardInterrupt("simulated interruption")

    async def record():
      eps = await real(*args, **kwargs)
      seen.append((kwargs["planner_first"], eps))
      return eps
    return record()

  monkeypatch.setattr(rollout, "run_episodes", recording)
  training.train(cfg, tmp_path / "whole", verbose=False)
  assert [p for p, _ in seen] == [8, 3, 0]
  for p, eps in seen:
    assert [e.planner_first for e in eps] == [j < p for j in range(8)]
    assert _kinds(space, [e.actions[0] for e in eps[:p]]) == ["planner"] * p
  # unforced episodes may answer at once
  assert "executor" in _kinds(space, [e.actions[0] for e in seen[-1][1]])
  whole = _metrics(tmp_path / "whole")
  assert [m["planner_first"] for m in whole] == [8, 3, 0]

  seen.clear()
  monkeypatch.setattr(rollout, "run_episodes",
                      lambda *a, **k: recording(*a, stop_at=1, **k))
  with pytest.raises(KeyboardInterrupt):
    training.train(cfg, tmp_path / "resumed", verbose=False)
  monkeypatch.setattr(rollout, "run_episodes", recording)
  training.train(cfg, tmp_path / "resumed", verbose=False)
  assert [p for p, _ in seen] == [8, 3, 0]
  assert _metrics(tmp_path / "resumed") == whole


def test_a_negative_count_is_a_config_error():
  cfg = _config()
  cfg.train.force_planner_episodes = -1
  with pytest.raises(errors.ConfigError, match="train.force_planner_episodes"):
    training.validate(cfg)
