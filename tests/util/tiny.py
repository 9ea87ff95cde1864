"""A tiny training config for tests that run a few real PPO iterations in seconds."""
from experiments.configs import test as test_config


def tiny_config(*, n_train: int = 24, n_test: int = 8, episodes: int = 24,
                history_capacity: int = 200):
  """experiments/configs/test.py made smaller: 16-d text, width 8, one layer, 8 episodes per
  iteration (all in flight)."""
  cfg = test_config.get_config()
  cfg.data.n_train = n_train
  cfg.data.n_test = n_test
  cfg.text.dim = 16
  cfg.model.hidden = 8
  cfg.model.mlp_hidden = 8
  cfg.model.num_layers = 1
  cfg.model.mem_proj = 4
  cfg.model.history_capacity = history_capacity
  cfg.train.episodes = episodes
  cfg.train.episodes_per_iter = 8
  cfg.train.parallel = 8
  return cfg


def fresh_policy(cfg, batch_size: int = 4):
  """The built system of `cfg` and a PolicyRunner over freshly initialised GARNet weights (no
  history): namespace with sysm, feat, space, model, params, runner and env (reward "auto")."""
  import types

  from gp_jax.rl import loop as loop_lib
  from gp_jax.rl import rollout
  from gp_jax.runs import ppo_config
  from gp_jax.runs import system as system_lib
  from gp_jax.runs import train as training
  sysm = system_lib.build(cfg)
  feat = sysm.featurizer
  model = training.make_model(cfg, feat.spec)
  params = loop_lib.init_state(model, feat, ppo_config.make_optimizer(cfg), 0).params
  runner = rollout.PolicyRunner(model, feat.hub_features, batch_size, featurizer=feat)
  runner.set_params(params, None)
  return types.SimpleNamespace(sysm=sysm, feat=feat, space=sysm.space, model=model,
                               params=params, runner=runner, env=sysm.env(cfg.alpha, reward="auto"))
