"""One PPO learner: GraphPlanner, the Router-R1-style router and the routed Graph Counselor take the
same settings class and run the same update loop (gp_jax.rl.ppo.learn)."""
import dataclasses
import types

import jax
import numpy as np
import pytest

from experiments.configs import sweep as sweep_config
from experiments.configs import test as test_config
from gp_jax import errors
from gp_jax.baselines.multi_round import router_r1
from gp_jax.counselor.routing import router as routing
from gp_jax.counselor.routing import selector as routing_selector
from gp_jax.llm import catalog as catalog_lib
from gp_jax.rl import batch as batch_lib
from gp_jax.rl import ppo
from gp_jax.rl import loop as rl_loop
from gp_jax.runs import ppo_config
from gp_jax.text import encoder as encoder_lib


@pytest.fixture
def spy(monkeypatch):
  """Records the settings of every ppo.learn traced (each learner's jitted update calls it)."""
  calls = []
  real = ppo.learn

  def learn(forward, optimizer, settings, *args, **kw):
    calls.append(settings)
    return real(forward, optimizer, settings, *args, **kw)
  monkeypatch.setattr(ppo, "learn", learn)
  router_r1.make_update.cache_clear()   # a cached update would not trace again
  yield calls
  router_r1.make_update.cache_clear()


def test_settings_are_one_class_read_from_the_configs():
  c = test_config.get_config()
  gp = ppo_config.ppo_settings(c)
  assert type(gp) is ppo.PPOSettings
  assert (gp.epochs, gp.num_minibatches, gp.value_lr_multiplier) == (
      c.ppo.epochs, c.ppo.num_minibatches, c.ppo.value_lr_multiplier)
  s = sweep_config.get_config("test")
  r1 = ppo_config.router_r1_settings(s)
  assert type(r1) is ppo.PPOSettings and r1.learning_rate == s.sweep.r1_learning_rate
  assert (r1.clip_eps, r1.gae_lambda, r1.max_grad_norm) == (
      s.ppo.clip_eps, s.ppo.gae_lambda, s.ppo.max_grad_norm)
  assert type(router_r1.DEFAULT_PPO) is ppo.PPOSettings
  assert type(routing.RouterConfig().ppo) is ppo.PPOSettings
  hash(gp), hash(r1)   # they key cached updates


@pytest.mark.parametrize("field,value,message", [
    ("clip_eps", 1.5, "ppo.0 < clip_eps < 1"), ("epochs", 0, "ppo.epochs >= 1"),
    ("lr_schedule", "cosine", "unknown ppo.lr_schedule 'cosine'"),
    ("entropy_final_fraction", -1.0, "entropy_final_fraction"),
])
def test_bad_settings_are_config_errors(field, value, message):
  with pytest.raises(errors.ConfigError, match=message.replace(".", r"\.")):
    dataclasses.replace(router_r1.DEFAULT_PPO, **{field: value})


def test_graphplanner_update_is_the_shared_learner(spy, monkeypatch):
  """runs.ppo_config builds GraphPlanner's update with ppo.make_update_fn from config.ppo."""
  made = []
  monkeypatch.setattr(ppo, "make_update_fn", lambda *a, **kw: made.append((a, kw)) or "update")
  c = test_config.get_config()
  system = types.SimpleNamespace(
      space=types.SimpleNamespace(roles=types.SimpleNamespace(indices_of_kind=lambda k: [])),
      mdp_cfg=types.SimpleNamespace(max_calls=lambda thinker, verifier: 5))
  update, size = ppo_config.make_update(c, system, "model", "opt", 8)
  assert update == "update" and size == batch_lib.batch_size_for(8, 5, c.ppo.num_minibatches)
  (args, kw), = made
  assert args == ("model", "opt", ppo_config.ppo_settings(c))
  assert kw["num_updates"] == ppo_config.num_updates(c)


def test_router_r1_and_the_routed_counselor_run_the_shared_learner(spy, monkeypatch):
  # Router-R1: its update on a small grid batch.
  settings = dataclasses.replace(router_r1.DEFAULT_PPO, epochs=1)
  net = router_r1.R1Net(num_actions=3, hidden=8)
  params = net.init(jax.random.PRNGKey(0), np.zeros((1, 4), np.float32))
  tr = dict(obs=np.ones((3, 4), np.float32), mask=np.ones((3, 3), bool),
            actions=np.zeros(3, np.int32), old_logp=np.full(3, -1.0, np.float32))
  batch = batch_lib.build(tr, [[1.0, 0.5], [0.0]], [[0.1, 0.2], [0.3]], size=4,
                          num_episodes=2, num_steps=2, layout="grid")
  update = router_r1.make_update(net, settings)
  update(params, router_r1.make_optimizer(settings).init(params), jax.random.PRNGKey(1), batch)
  assert spy == [settings]
  # The routed Graph Counselor: its update of recorded decisions is GARNet's update
  # (ppo.make_update_fn, tracing ppo.learn with the router's settings) on a TrainingState made by
  # rl/train's init_state, passed in and out.
  made = []
  real_make = ppo.make_update_fn

  def make_update_fn(*args, **kw):
    made.append(args[2])
    return real_make(*args, **kw)
  monkeypatch.setattr(ppo, "make_update_fn", make_update_fn)
  cfg = routing.RouterConfig(hidden=8, num_layers=1, mlp_hidden=8, mem_proj=4, max_rows=4,
                             update_size=8, ppo=dataclasses.replace(routing.DEFAULT_PPO, epochs=1))
  llms = ["qwen2.5-7b-instruct", "llama-3.1-8b-instruct"]
  router = routing.make_router(catalog=catalog_lib.load_catalog().select(llms), llms=llms,
                               encoder=encoder_lib.make_encoder("hashing", dim=16), cfg=cfg)
  assert made == [cfg.ppo]
  state = routing.init_state(router, 0)
  fresh = rl_loop.init_state(router.model, router.featurizer, router.optimizer, 0)
  assert type(state) is ppo.TrainingState
  assert jax.tree_util.tree_all(jax.tree_util.tree_map(np.array_equal, state.params, fresh.params))
  before = jax.tree_util.tree_map(np.array, state.params)
  obs = router.featurizer.blank("plan")
  eps = [([routing_selector.Transition(obs, 0, -0.7, 0.1),
           routing_selector.Transition(obs, 1, -0.7, 0.2)], np.array([0.0, 1.0], np.float32)),
         ([routing_selector.Transition(obs, 1, -0.7, 0.3)], np.array([0.5], np.float32))]
  state, metrics = routing.update(router, state, eps, num_episodes=2, num_steps=2)
  assert spy == [settings, cfg.ppo] and np.isfinite(metrics["loss"])
  assert int(state.update_step) == 1
  assert not jax.tree_util.tree_all(jax.tree_util.tree_map(np.array_equal, before, state.params))
