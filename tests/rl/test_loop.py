"""The learner's loop (rl.loop.train) driven by explicit pieces, no config tree: the same values
give the run that the run layer (gp_jax/runs/train.py) assembles from the config, and the library
leaves the workdir's config record to the run layer."""
import inspect
import json
import pathlib

from experiments.configs import test as test_config
from gp_jax.rl import batch as batch_lib
from gp_jax.rl import parallel
from gp_jax.rl import ppo
from gp_jax.rl import loop as rl_loop
from gp_jax.runs import system as system_lib
from gp_jax.runs import train as training

TIMING = {"rollout_s", "update_s"}


def _metrics(workdir: pathlib.Path) -> list[dict]:
  lines = (workdir / "metrics.jsonl").read_text().splitlines()
  return [{k: v for k, v in json.loads(l).items() if k not in TIMING} for l in lines]


def test_library_takes_no_config():
  params = inspect.signature(rl_loop.train).parameters
  assert "config" not in params and "system" not in params


def test_explicit_pieces_reproduce_the_configured_run(tmp_path):
  cfg = test_config.get_config()
  cfg.train.episodes = 32                      # two iterations of 16 episodes
  configured = training.train(cfg, tmp_path / "configured", verbose=False)

  # The same run from plain values: what a caller without a config tree would pass.
  p, t = cfg.ppo, cfg.train
  sysm = system_lib.build(cfg)
  env = sysm.env(float(cfg.alpha), reward=t.reward)
  model = training.make_model(cfg, sysm.featurizer.spec)
  ppo_settings = ppo.PPOSettings(
      learning_rate=p.learning_rate, epochs=p.epochs, num_minibatches=p.num_minibatches,
      clip_eps=p.clip_eps, gamma=p.gamma, gae_lambda=p.gae_lambda, value_coef=p.value_coef,
      entropy_coef=p.entropy_coef, max_grad_norm=p.max_grad_norm,
      value_lr_multiplier=p.value_lr_multiplier)
  optimizer = ppo.make_optimizer(ppo_settings)
  mesh = parallel.make_mesh(0)
  update = ppo.make_update_fn(model, optimizer, ppo_settings, mesh=mesh)
  max_calls = sysm.mdp_cfg.max_calls()
  batch_size = batch_lib.batch_size_for(t.episodes_per_iter, max_calls, p.num_minibatches,
                                        mesh.size)
  settings = rl_loop.LoopSettings(
      episodes=32, episodes_per_iter=16, parallel=16, seed=0, checkpoint_every=1,
      entropy_stop=0.0, max_calls=max_calls, history="transductive",
      history_capacity=400)
  explicit = rl_loop.train(tmp_path / "explicit", env=env, featurizer=sysm.featurizer,
                            queries=sysm.train_queries, model=model, optimizer=optimizer,
                            update=update, batch_size=batch_size, settings=settings,
                            rollout_mesh=parallel.make_mesh(0, local=True), verbose=False)

  assert len(_metrics(tmp_path / "explicit")) == 2
  assert _metrics(tmp_path / "explicit") == _metrics(tmp_path / "configured")
  strip = lambda s: {k: v for k, v in s.items() if k != "train_seconds"}
  assert strip(explicit) == strip(configured)
  assert (tmp_path / "configured" / "config.json").exists()
  assert not (tmp_path / "explicit" / "config.json").exists()   # the run layer records configs
