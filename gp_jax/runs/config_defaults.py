"""Config fields added after configs were first written, and what a config without one means.

A config read from an older workdir record (serving's `load_config`) or an older config file
lacks the fields added since. `complete` adds each missing one, once, where the config is read
(the runners in experiments/, the workdir record load), so that the run layer reads every field
as an attribute and no default is repeated next to its use.

FIELDS holds, per dotted field, the value a config without it runs with. For most fields that is
the value experiments/configs/ sets for new runs (the field was added switched off, or with the
behaviour that came before it). OLDER_BEHAVIOUR names the fields whose absence means the
behaviour before they existed, which differs from what new configs set; tests/runs/
test_config_defaults.py checks both against experiments/configs/.
"""
from __future__ import annotations

import ml_collections

_OFF_EVENT = {"llm": "", "t": 0}

FIELDS: dict[str, object] = {
    "compile_cache": "~/.cache/gp_jax/xla",
    "data.sim_unique_texts": True,
    "data.sim_events.splits": "test",
    **{f"data.sim_events.{kind}.{k}": v for kind in ("quality", "price", "join", "fail")
       for k, v in _OFF_EVENT.items()},
    "data.sim_events.quality.delta": -2.0,
    "data.sim_events.quality.domains": "",
    "data.sim_events.quality.tasks": "",
    "data.sim_events.price.scale": 2.0,
    "model.encoder": "garnet",
    "model.retrieval_k": 5,
    "model.attention_heads": 4,
    "model.memory_bias": False,
    "model.memory_predictor": False,
    "model.memory_predictor_scale": 5.0,
    "model.policy_head": "flat",
    "ppo.lr_schedule": "constant",
    "ppo.lr_final_fraction": 0.0,
    "ppo.entropy_schedule": "constant",
    "ppo.entropy_final_fraction": 0.0,
    "ppo.role_entropy_coef": 0.0,
    "ppo.advantage_norm": "batch",
    "ppo.entropy_stop_min_episodes": 0,
    "train.reward": "sampled",
    "train.padding": "fixed",
    "train.background_checkpoints": False,
    "train.force_planner_episodes": 0,
    "train.root_floor": 0.0,
    "train.root_rollout": 0,
    "train.phase1_episodes": 0,
    "train.phase1_depth": 1,
    "train.phase1_width": 3,
    "eval.online_history": False,
    "eval.online_recent_rows": 0,
    "parallel.devices": 0,
    "parallel.distributed": False,
    "parallel.coordinator": "",
    "parallel.num_processes": 0,
    "parallel.process_id": -1,
    "sweep.router_llm": "",
    "sweep.graph_hidden": 32,
    "sweep.graph_steps": 300,
    "sweep.routerdc_steps": 300,
    "sweep.multi_routers": "",
    "sweep.r1_hidden": 64,
    "sweep.r1_episodes": 512,
    "sweep.r1_batch": 32,
    "sweep.r1_learning_rate": 1e-3,
    "sweep.r1_entropy_coef": 0.01,
    "study.roles_llms": "",
    "study.roles_n_test": 0,
}

# Fields whose absence means what runs did before the field existed, not what new configs set.
OLDER_BEHAVIOUR: dict[str, str] = {
    "train.reward": "configs before the field trained on the sampled score (new ones: auto)",
    "sweep.multi_routers": "sweeps before the field ran no multi-round routers",
    "sweep.r1_episodes": "Router-R1's episodes per cell before the field",
    "sweep.r1_batch": "Router-R1's episodes per update before the field",
    "study.roles_llms": "the roles study ran on config.llms before the field",
    "study.roles_n_test": "the roles study ran on config.data.n_test before the field (0)",
}

# Sections a config may lack altogether (a training config has no sweep or study section): their
# fields are added only to a config that has the section.
OPTIONAL_SECTIONS = ("sweep", "study")


def complete(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Adds every field of FIELDS that `config` lacks (in place; returns `config`). Fields of an
  OPTIONAL_SECTIONS section are added only when the config has that section."""
  for key, value in FIELDS.items():
    *parents, leaf = key.split(".")
    if parents and parents[0] in OPTIONAL_SECTIONS and parents[0] not in config:
      continue
    node = config
    for p in parents:
      if p not in node:
        with node.unlocked():
          setattr(node, p, ml_collections.ConfigDict())
      node = node[p]
    if leaf not in node:
      with node.unlocked():
        setattr(node, leaf, value)
  return config
