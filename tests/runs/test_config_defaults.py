"""Config defaults in one place (gp_jax/runs/config_defaults.py): they agree with the configs in
experiments/configs/ (or are listed as an older behaviour), and a config recorded before the
fields existed loads with them and runs as before."""
import json
import pathlib
import subprocess
import sys

import ml_collections
import pytest

from experiments.configs import default as default_config
from experiments.configs import study as study_config
from experiments.configs import sweep as sweep_config
from experiments.configs import test as test_config
from gp_jax.runs import config_defaults
from gp_jax.runs import ppo_config
from gp_jax.runs import train as training
from gp_jax.runs import workdir as workdir_config
from gp_jax.serving.engine import config as served_config

REPO = pathlib.Path(__file__).resolve().parents[2]
FIELDS = config_defaults.FIELDS


def _configs_for(key: str) -> list[tuple[str, dict]]:
  """(name, flattened config) of every experiments/configs/ config that sets `key`'s section."""
  if key.startswith("sweep."):
    return [(f"sweep.py:{a}", workdir_config.flatten(sweep_config.get_config(a)))
            for a in ("", "test")]
  if key.startswith("study."):
    return [(f"study.py:{a}", workdir_config.flatten(study_config.get_config(a)))
            for a in ("", "test")]
  return [("default.py", workdir_config.flatten(default_config.get_config()))]


@pytest.mark.parametrize("key", sorted(FIELDS))
def test_each_default_agrees_with_the_configs(key):
  """A field's value without it is what the configs set, unless it is an older behaviour; then
  some config sets another value (else the entry would be a plain default)."""
  expected = json.loads(json.dumps(FIELDS[key]))
  configs = _configs_for(key)
  for name, flat in configs:
    assert key in flat, f"{key} is in no field of {name}: a default of nothing"
  values = {name: flat[key] for name, flat in configs}
  if key in config_defaults.OLDER_BEHAVIOUR:
    assert any(v != expected for v in values.values()), (
        f"{key}: every config sets {expected!r}: not an older behaviour, a plain default")
  else:
    assert all(v == expected for v in values.values()), (key, expected, values)


def test_older_behaviours_are_fields():
  assert set(config_defaults.OLDER_BEHAVIOUR) <= set(FIELDS)


def _old_record(tmp_path):
  """A workdir whose config.json was recorded before every field of FIELDS existed."""
  flat = workdir_config.flatten(test_config.get_config())
  old = {k: v for k, v in flat.items() if k not in FIELDS}
  assert len(old) < len(flat) and not any(k.startswith("parallel.") for k in old)
  (tmp_path / workdir_config.CONFIG_FILE).write_text(json.dumps(old))
  return flat


def test_an_old_workdir_record_loads_with_the_defaults(tmp_path):
  _old_record(tmp_path)
  config = served_config.load_config(tmp_path, {})
  flat = workdir_config.flatten(config)
  for key, value in FIELDS.items():
    if key.split(".")[0] in config_defaults.OPTIONAL_SECTIONS:
      assert key not in flat           # no sweep or study section grows on a training config
    else:
      assert flat[key] == json.loads(json.dumps(value)), key
  assert "sweep" not in config and "study" not in config
  # What the run layer reads of it, as attributes.
  training.validate(config)
  assert config.train.reward == "sampled"    # trained on the sampled score before the field
  assert training.make_model(config).encoder == "garnet"
  settings = ppo_config.ppo_settings(config)
  assert (settings.lr_schedule, settings.entropy_schedule) == ("constant", "constant")
  assert training.loop_settings(config, 8).background_checkpoints is False


def test_complete_keeps_what_a_config_sets():
  c = test_config.get_config()
  c.model.encoder = "gat"
  c.train.reward = "expected"
  before = workdir_config.flatten(c)
  after = workdir_config.flatten(config_defaults.complete(c))
  assert after == before    # a current config has every field: nothing added, nothing changed


def test_complete_fills_a_sweep_section_that_lacks_fields():
  c = ml_collections.ConfigDict(dict(sweep=dict(knn_k=3, router_llm="x")))
  config_defaults.complete(c)
  assert c.sweep.router_llm == "x" and c.sweep.r1_episodes == 512 and c.sweep.multi_routers == ""
  assert "study" not in c and c.parallel.devices == 0 and c.train.padding == "fixed"


def test_the_runner_completes_an_older_config_file(tmp_path):
  """experiments/evaluate.py given a config file without the newer fields: the flags parse and
  the run gets as far as the workdir check (no AttributeError on a missing field)."""
  path = tmp_path / "old_config.py"
  path.write_text(
      "from experiments.configs import test\n"
      "def get_config():\n"
      "  c = test.get_config()\n"
      "  del c.model['encoder'], c.train['reward'], c.eval['online_history'], c['parallel']\n"
      "  return c\n")
  out = subprocess.run([sys.executable, "-c",
                        "from experiments import common, evaluate\n"
                        "from absl import flags\n"
                        f"common._parse_flags(['x', '--config={path}'])\n"
                        "c = flags.FLAGS['config'].value\n"
                        "print(c.model.encoder, c.train.reward, c.eval.online_history, "
                        "c.parallel.devices)\n"],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.split() == ["garnet", "sampled", "False", "0"]
