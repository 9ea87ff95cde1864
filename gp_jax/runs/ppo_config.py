"""PPO learners from a config: GraphPlanner's settings, optimizer and jitted update of a run, and
the Router-R1-style router's settings in a sweep.

The run layer's one reading of `config.ppo` (gp_jax.rl.ppo.PPOSettings), and the sizes the
library's learner takes explicitly: the run's number of updates (schedules), the MDP's call bound
and the padded batch size of an update over a number of episodes.

Options of the choice of role, off by default (gp_jax/rl/ppo.py module notes):
ppo.role_entropy_coef (a bonus on the entropy of the role marginal) and ppo.advantage_norm =
"per_type" (advantages standardised per decision type); the update reads the system's action
space for them.
"""
from __future__ import annotations

import math

from gp_jax.rl import batch as batch_lib
from gp_jax.rl import ppo


def ppo_settings(config) -> ppo.PPOSettings:
  """config.ppo as PPOSettings (a bad value: ConfigError naming the field)."""
  p = config.ppo
  return ppo.PPOSettings(
      learning_rate=float(p.learning_rate), epochs=int(p.epochs),
      num_minibatches=int(p.num_minibatches), clip_eps=float(p.clip_eps), gamma=float(p.gamma),
      gae_lambda=float(p.gae_lambda), value_coef=float(p.value_coef),
      entropy_coef=float(p.entropy_coef), max_grad_norm=float(p.max_grad_norm),
      value_lr_multiplier=float(p.value_lr_multiplier),
      lr_schedule=p.lr_schedule, lr_final_fraction=float(p.lr_final_fraction),
      entropy_schedule=p.entropy_schedule,
      entropy_final_fraction=float(p.entropy_final_fraction),
      entropy_stop=float(p.entropy_stop), role_entropy_coef=float(p.role_entropy_coef),
      advantage_norm=str(p.advantage_norm))


def router_r1_settings(config) -> ppo.PPOSettings:
  """The Router-R1-style router's PPO settings in a sweep: config.ppo's epochs, minibatches, clip,
  gamma, lambda, value weight and gradient clip, with its own learning rate and entropy weight
  (config.sweep.r1_learning_rate, r1_entropy_coef); one learning rate, constant schedules."""
  s, p = config.sweep, config.ppo
  return ppo.PPOSettings(
      learning_rate=float(s.r1_learning_rate), epochs=int(p.epochs),
      num_minibatches=int(p.num_minibatches), clip_eps=float(p.clip_eps), gamma=float(p.gamma),
      gae_lambda=float(p.gae_lambda), value_coef=float(p.value_coef),
      entropy_coef=float(s.r1_entropy_coef), max_grad_norm=float(p.max_grad_norm))


def num_updates(config) -> int:
  """PPO updates (iterations) of a training run: ceil(train.episodes / train.episodes_per_iter)."""
  return max(1, math.ceil(config.train.episodes / config.train.episodes_per_iter))


def make_optimizer(config):
  """The PPO optimizer of config.ppo (Adam, value lr multiplier, global-norm clipping, and with
  ppo.lr_schedule = "linear" a linear decay to ppo.lr_final_fraction over the run's gradient steps:
  num_updates(config) x epochs x num_minibatches)."""
  return ppo.make_optimizer(ppo_settings(config), num_updates=num_updates(config))


def max_calls(system) -> int:
  """The MDP's bound on the LLM calls (= transitions) of one episode of `system`."""
  roles = system.space.roles
  return system.mdp_cfg.max_calls(thinker=bool(roles.indices_of_kind("thinker")),
                                  verifier=bool(roles.indices_of_kind("verifier")))


def make_update(config, system, model, optimizer, episodes: int, mesh=None, *,
                calls: int | None = None):
  """(jitted PPO update, padded batch size) for updates over `episodes` episodes of `system`.

  mesh: the learner's device mesh (gp_jax.runs.train.make_mesh); None = one device.
  calls: the bound on one episode's calls the batch must hold (default max_calls(system); a
  Phase-1 warm start may need more)."""
  settings = ppo_settings(config)
  calls = max_calls(system) if calls is None else int(calls)
  batch_size = batch_lib.batch_size_for(episodes, calls, settings.num_minibatches,
                                        mesh.size if mesh is not None else 1)
  # num_chunks follows the padded size (batch_size + 1 with fixed padding; per bucket otherwise).
  update = ppo.make_update_fn(model, optimizer, settings, num_updates=num_updates(config),
                              num_chunks=None, mesh=mesh, space=system.space)
  return update, batch_size
