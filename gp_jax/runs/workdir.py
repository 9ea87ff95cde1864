"""The config a workdir was run with, recorded so that a rerun cannot mix two configs' results.

Training, the alpha sweep and the studies resume: rerunning a command skips what is finished and
continues what is not. Without a record, rerunning into the same workdir with another config
(a different width, training-set size or PPO setting) would silently continue a checkpoint under
new settings, or put cells of two configs into one report. `check_or_record` writes
<workdir>/config.json on first use (flattened, dotted keys) and, on every later run, refuses a
config that differs from it in any field that changes results, naming the fields, before anything
is written.

Fields that do not change results (caches, timeouts, server addresses) are never compared; each
runner adds the fields it may legitimately vary (the sweep's grid, the study's seeds). A workdir
made before this record existed has none: its first rerun records the config it is run with.
"""
from __future__ import annotations

import json
import pathlib

from gp_jax import errors
from gp_jax import files

CONFIG_FILE = "config.json"
# Never compared: where caches and servers are, how long to wait, whether replies are replayed,
# which devices and processes run the learner (docs/scaling.md: same numbers up to float rounding),
# whether checkpoints are written in the background.
RUNTIME_FIELDS = ("compile_cache", "request_timeout_s", "endpoints_file", "replay", "text.cache",
                  "parallel", "train.background_checkpoints")
# Sections added after workdirs were recorded, with the test that says the current config leaves
# them off (then it runs exactly as before they existed): a record without the section matches.
SWITCHED_OFF_WHEN = {
    "data.sim_events": lambda flat: all(
        not str(flat.get(f"data.sim_events.{kind}.llm", "")).strip()
        for kind in ("quality", "price", "join", "fail")),
    "eval.online_history": lambda flat: not flat.get("eval.online_history", False),
    "eval.online_recent_rows": lambda flat: not flat.get("eval.online_recent_rows", 0),
    "train.padding": lambda flat: flat.get("train.padding", "fixed") == "fixed",
    "train.force_planner_episodes": lambda flat: not flat.get("train.force_planner_episodes", 0),
    "train.root_floor": lambda flat: not flat.get("train.root_floor", 0),
    "train.root_rollout": lambda flat: not flat.get("train.root_rollout", 0),
    "train.phase1_episodes": lambda flat: not flat.get("train.phase1_episodes", 0),
    "train.phase1_depth": lambda flat: not flat.get("train.phase1_episodes", 0),
    "train.phase1_width": lambda flat: not flat.get("train.phase1_episodes", 0),
    "model.policy_head": lambda flat: flat.get("model.policy_head", "flat") == "flat",
    "ppo.role_entropy_coef": lambda flat: not flat.get("ppo.role_entropy_coef", 0),
    "ppo.advantage_norm": lambda flat: flat.get("ppo.advantage_norm", "batch") == "batch",
    "ppo.entropy_stop_min_episodes": lambda flat: not flat.get("ppo.entropy_stop_min_episodes", 0),
    "sim": lambda flat: flat.get("sim.world", "v1") == "v1" and not flat.get("sim.world_file", ""),
    "train.pool_perturb": lambda flat: not flat.get("train.pool_perturb.enabled", False),
    "model.row_layout": lambda flat: flat.get("model.row_layout", 1) == 1,
    "model.memory_bias": lambda flat: not flat.get("model.memory_bias", False),
    "model.memory_predictor": lambda flat: not flat.get("model.memory_predictor", False),
    "model.memory_predictor_scale": lambda flat: not flat.get("model.memory_predictor", False),
}


def flatten(config) -> dict:
  """{dotted key: JSON value} of a ConfigDict (or nested dict); tuples become lists."""
  tree = config.to_dict() if hasattr(config, "to_dict") else dict(config)
  out = {}

  def walk(prefix, node):
    for k, v in node.items():
      key = f"{prefix}{k}"
      if isinstance(v, dict):
        walk(key + ".", v)
      else:
        out[key] = v

  walk("", tree)
  return json.loads(json.dumps(out, sort_keys=True))


def _ignored(key: str, ignore) -> bool:
  return any(key == p or key.startswith(p + ".") for p in ignore)


def differences(recorded: dict, current: dict, ignore=()) -> list[tuple[str, object, object]]:
  """(key, recorded value, current value) of every compared field that differs; a field that
  one side lacks shows as "<absent>" there. A section of SWITCHED_OFF_WHEN that the record lacks
  is not compared while the current config leaves it off (a record made before it existed)."""
  ignore = tuple(RUNTIME_FIELDS) + tuple(ignore)
  absent = "<absent>"
  ignore += tuple(prefix for prefix, off in SWITCHED_OFF_WHEN.items()
                  if not any(_ignored(k, (prefix,)) for k in recorded) and off(current))
  out = []
  for key in sorted(set(recorded) | set(current)):
    if _ignored(key, ignore):
      continue
    a, b = recorded.get(key, absent), current.get(key, absent)
    if a != b:
      out.append((key, a, b))
  return out


def check_or_record(workdir, config, *, ignore=(), what: str = "run") -> None:
  """Records `config` in workdir/config.json, or checks it against the recorded one.

  Args:
    workdir: the run's directory (created if missing).
    config: the ConfigDict the run uses.
    ignore: dotted keys (or section prefixes) this runner may vary between reruns.
    what: the kind of run, for the message ("training run", "sweep", ...).
  Raises:
    ConfigError: the recorded config differs in a compared field, or config.json is malformed.
    StorageError: the workdir cannot be created or config.json not written.
  """
  workdir = pathlib.Path(workdir)
  path = workdir / CONFIG_FILE
  current = flatten(config)
  if path.exists():
    try:
      recorded = json.loads(path.read_text())
    except json.JSONDecodeError as e:
      raise errors.ConfigError(f"{path}: line {e.lineno}: not valid JSON ({e.msg}); it records "
                               f"the config this {what} was run with") from None
    if not isinstance(recorded, dict):
      raise errors.ConfigError(f"{path}: not a config record (expected a JSON object)")
    diff = differences(recorded, current, ignore)
    if diff:
      shown = "; ".join(f"{k}: recorded {a!r}, now {b!r}" for k, a, b in diff[:6])
      more = f"; and {len(diff) - 6} more" if len(diff) > 6 else ""
      raise errors.ConfigError(
          f"{workdir} holds a {what} made with another config ({shown}{more}); rerun with the "
          f"recorded values ({path}) or use a new workdir")
    return
  with files.storage_errors(workdir, f"the {what}'s folder"):
    workdir.mkdir(parents=True, exist_ok=True)
  files.write_atomic(path, json.dumps(current, indent=1, sort_keys=True) + "\n",
                     f"the config record of this {what}")
