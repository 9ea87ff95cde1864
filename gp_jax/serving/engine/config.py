"""The served router's config: the one a training workdir recorded, with the few fields a served
workdir may change, and a simulated pool event when the server is asked to serve one.

`load_config` is the one place that reads a recorded config; it refuses command-line overrides
of fields that changed what was trained.
"""
from __future__ import annotations

import pathlib

import ml_collections

from gp_jax import errors
from gp_jax.runs import config_defaults
from gp_jax.runs import system as system_lib
from gp_jax.runs import workdir as workdir_config
from gp_jax.sim import events as sim_events
from gp_jax.sim import served_events
from gp_jax.sim import simulator as sim
from gp_jax.util import config_overrides

# Config fields a served workdir may take from the command line: where backbones are and how
# long to wait for them, caches, replay, and the output cap of each call. Anything else changes
# the trained router and is refused.
SERVE_OVERRIDABLE = ("backend", "endpoints_file", "request_timeout_s", "replay", "text.cache",
                     "compile_cache", "sampling.max_tokens")

def _unflatten(flat: dict) -> ml_collections.ConfigDict:
  tree: dict = {}
  for key, value in flat.items():
    node = tree
    *parents, leaf = key.split(".")
    for p in parents:
      node = node.setdefault(p, {})
    node[leaf] = value
  return ml_collections.ConfigDict(tree)


def _overridable(key: str) -> bool:
  return any(key == p or key.startswith(p + ".") for p in SERVE_OVERRIDABLE)


def load_config(workdir, overrides: dict | None = None) -> ml_collections.ConfigDict:
  """The config a training workdir recorded, with runtime overrides applied (and the fields
  added since it was recorded: config_defaults.complete).

  Args:
    workdir: a training run's directory (config.json, checkpoints/).
    overrides: {dotted field: value} given on the command line (--config.backend=...).
  Raises:
    ConfigError: no recorded config, or an override of a field that changes the trained router.
  """
  path = pathlib.Path(workdir) / workdir_config.CONFIG_FILE
  if not path.exists():
    raise errors.ConfigError(f"{workdir} has no {workdir_config.CONFIG_FILE}: not a training "
                             "workdir (train it with experiments/train.py first)")
  flat = errors.read_json(path, "recorded training config")
  if not isinstance(flat, dict):
    raise errors.ConfigError(f"{path}: not a config record (expected a JSON object)")
  for key, value in (overrides or {}).items():
    if not _overridable(key):
      raise errors.ConfigError(
          f"--config.{key} changes the trained router; a served workdir keeps its recorded "
          f"value ({flat.get(key, '<absent>')!r}). Overridable when serving: "
          f"{', '.join(SERVE_OVERRIDABLE)}")
    if isinstance(value, (tuple, list)):
      value = list(value)
    flat[key] = value
  return config_defaults.complete(_unflatten(flat))


def with_pool_event(config, event: served_events.ServedEvent, *, t: int | None = None):
  """A copy of the served `config` with `event` (at `t`, default event.t) as its only pool event
  (gp_jax/sim/served_events.py).

  Raises:
    ConfigError: not a simulator config, an unknown kind or LLM, t < 0.
  """
  if event.kind not in served_events.KINDS:
    raise errors.unknown_name("served pool event", event.kind, served_events.KINDS)
  if config.data.source != "simulated" or config.get("backend", "simulator") != "simulator":
    raise errors.ConfigError(
        "--sim_event changes the simulated pool: it needs the simulator backend and a router "
        f"trained on simulated data (this config: backend={config.get('backend')!r}, "
        f"data.source={config.data.source!r})")
  if config.replay.mode != "off":
    raise errors.ConfigError("--sim_event cannot be used with a replay cache (replay.mode="
                             f"{config.replay.mode!r}): the events change the answers to the "
                             "same messages")
  out = config_overrides.apply(config, event.overrides(t=t))
  # Validated here, before the router loads: the LLM must be in the served pool, t >= 0.
  sim_events.from_config(out.data.sim_events, llms=system_lib.configured_llms(out),
                         domains={v[0] for v in sim.TASKS.values()}, tasks=sim.TASKS)
  return out
