"""Row layout 2 through a rollout and the update: every decision's hub statistics are stored in
its observation, so the update recomputes exactly the log-probabilities the decisions had; the
statistics follow the history as episodes join it."""
import asyncio

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.configs import test as test_config
from gp_jax import errors
from gp_jax.graph import history as history_lib
from gp_jax.rl import batch as batch_lib
from gp_jax.rl import loop as loop_lib
from gp_jax.rl import ppo
from gp_jax.rl import rollout
from gp_jax.runs import ppo_config
from gp_jax.runs import system as system_lib
from gp_jax.runs import train as training


@pytest.mark.parametrize("term", [None, "memory_bias", "memory_predictor"])
def test_update_sees_the_statistics_each_decision_read(term):
  cfg = test_config.get_config()
  cfg.model.row_layout = 2                  # opt-in; the default stays layout 1
  memory_bias = term == "memory_bias"
  cfg.model.memory_bias = memory_bias
  cfg.model.memory_predictor = term == "memory_predictor"
  assert training.row_layout(cfg) == 2
  sysm = system_lib.build(cfg)
  feat = sysm.featurizer
  model = training.make_model(cfg, feat.spec)
  assert model.memory_bias == memory_bias
  assert model.memory_predictor == (term == "memory_predictor")
  params = loop_lib.init_state(model, feat, ppo_config.make_optimizer(cfg), 0).params
  if memory_bias:   # a bias that is not zero (it starts at zero), so the statistics weigh on it
    k = params["bias_out"]["kernel"]
    params = dict(params, bias_out=dict(params["bias_out"], kernel=jnp.asarray(
        np.random.default_rng(9).normal(size=k.shape).astype(np.float32) * 3)))
  A = sysm.space.size
  rng = np.random.default_rng(0)
  history = history_lib.HistoryMemory(feat.spec.row_dim, A, capacity=10_000)
  rows = rng.normal(size=(60, feat.spec.row_dim)).astype(np.float32)
  rows[:, -1] = rng.uniform(size=60) < 0.5
  history.add(rows, rng.integers(0, A, 60))
  runner = rollout.PolicyRunner(model, feat.hub_features, 4, featurizer=feat)
  runner.set_params(params, history)
  env = sysm.env(cfg.alpha, reward="auto")
  eps = asyncio.run(rollout.run_episodes(
      env, feat, runner, sysm.train_queries[:12], key=jax.random.PRNGKey(1), greedy=False,
      history=history, grow_history=True, seed_salt=("t", 0)))
  tables = [o["hub_stats"] for e in eps for o in e.obs]
  assert len({t.tobytes() for t in tables}) > 1            # the statistics moved as episodes joined
  np.testing.assert_allclose(runner.stats_table(), history_lib.HubStats.of(
      history.rows, history.hubs, A).table(), rtol=1e-5, atol=1e-6)
  assert len(history) > 60
  n = sum(len(e.actions) for e in eps)
  size = -(-n // 8) * 8
  batch, hist = batch_lib.build_batch(eps, history, batch_size=size, num_episodes=len(eps),
                                      max_calls=ppo_config.max_calls(sysm), num_hubs=A,
                                      predictor=cfg.model.memory_predictor)
  assert ("pred_stats" in hist) == (term == "memory_predictor")
  logits, _ = ppo.forward_batch(model, params, feat.hub_features, hist, batch.transitions,
                                size + 1)
  logp = jax.nn.log_softmax(logits)
  tr = batch.transitions
  got = np.take_along_axis(np.asarray(logp), tr["actions"][:, None], 1)[:n, 0]
  np.testing.assert_allclose(got, tr["old_logp"][:n], atol=2e-4)
  if term != "memory_predictor":
    return
  # the update also fits the predictor to the history's examples: its loss falls
  optimizer = ppo_config.make_optimizer(cfg)
  update, size = ppo_config.make_update(cfg, sysm, model, optimizer, len(eps))
  batch, hist = batch_lib.build_batch(eps, history, batch_size=size, num_episodes=len(eps),
                                      max_calls=ppo_config.max_calls(sysm), num_hubs=A,
                                      predictor=cfg.model.memory_predictor)
  state = ppo.TrainingState(params, optimizer.init(params), jax.random.PRNGKey(0),
                            jnp.zeros((), jnp.int32))
  losses = []
  for _ in range(4):
    state, m = update(state, jnp.asarray(feat.hub_features), hist, batch)
    losses.append(float(m["predictor_loss"]))
  assert losses[-1] < losses[0]


def test_a_memory_predictor_needs_layout_2_and_the_transductive_history():
  cfg = test_config.get_config()
  cfg.model.memory_predictor = True
  with pytest.raises(errors.ConfigError, match="memory_predictor reads row layout 2"):
    training.make_model(cfg)
  cfg.model.row_layout = 2
  cfg.model.history = "summary"
  with pytest.raises(errors.ConfigError, match="history 'summary'"):
    training.make_model(cfg)


def test_a_memory_bias_on_row_layout_1_is_a_config_error():
  cfg = test_config.get_config()
  cfg.model.memory_bias = True
  with pytest.raises(errors.ConfigError, match="memory_bias reads row layout 2"):
    training.make_model(cfg)
