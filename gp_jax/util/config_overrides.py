"""Dotted-key overrides of an ml_collections config ({"ppo.gamma": 1.0, ...}), checked."""
from __future__ import annotations

from gp_jax import errors


def apply(config, overrides: dict):
  """A copy of `config` with dotted-key overrides applied; unknown keys are a ConfigError."""
  cfg = config.copy_and_resolve_references()
  for key, value in overrides.items():
    parent, parts = cfg, key.split(".")
    for p in parts[:-1]:
      if p not in parent:
        raise errors.ConfigError(f"unknown config field {key!r}")
      parent = parent[p]
    name = parts[-1]
    if name not in parent:
      raise errors.ConfigError(f"unknown config field {key!r}")
    parent[name] = value
  return cfg
