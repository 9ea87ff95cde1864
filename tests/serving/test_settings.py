"""The router server's settings: experiments/configs/serve.py read into
gp_jax/serving/settings.ServerSettings, the runner's flags as overrides."""
import json
import subprocess
import sys

import pytest

from experiments.configs import serve as serve_config
from gp_jax import errors
from gp_jax import paths
from gp_jax.serving import settings as settings_lib


def _field(config, dotted):
  section, _, name = dotted.rpartition(".")
  return (config[section] if section else config)[name]


_FLAG_DEFAULTS = """
import json
from absl import flags
from experiments import serve_router
print(json.dumps({f.name: f.default
                  for f in flags.FLAGS.get_flags_for_module(serve_router.__name__)}))
"""


def test_every_flag_names_a_config_field_with_the_same_default():
  """One source of defaults: a flag's default is its config field's (the flag only overrides).
  The runner's flags are read in a child process (importing the runner here would define its
  absl flags beside other runners')."""
  out = subprocess.run([sys.executable, "-c", _FLAG_DEFAULTS], cwd=paths.REPO_ROOT,
                       capture_output=True, text=True, timeout=120, check=True)
  defaults = json.loads(out.stdout.strip().splitlines()[-1])
  config = serve_config.get_config()
  for flag, field in settings_lib.FLAGS.items():
    default = defaults[flag]
    if flag == "allowed_hosts":
      default = ",".join(default)
    assert _field(config, field) == default, (flag, field)
  assert set(defaults) - {"config", "serve_config"} == set(settings_lib.FLAGS)


def test_defaults_give_the_settings_of_a_loopback_frozen_server():
  s = settings_lib.from_config(serve_config.get_config())
  assert (s.http.host, s.http.port, s.http.keys, s.max_queue, s.learn) == (
      "127.0.0.1", 8080, None, None, None)
  assert s.memory_path.endswith("workdirs/alpha0.5/served/memory.npz")
  sc = s.store_config()
  assert sc.route_log.endswith("served/routes.jsonl") and sc.namespace == "alpha0.5"
  assert s.session_kwargs()["versions_dir"] is None


def test_learning_and_ram_only_settings():
  c = serve_config.get_config()
  c.learn.enabled, c.learn.every, c.state.memory_path = True, 8, "none"
  s = settings_lib.from_config(c)
  assert s.learn.every == 8 and s.memory_path is None and s.store_config().route_log is None
  assert s.session_kwargs()["versions_dir"].name == "router_versions"


@pytest.mark.parametrize("field,value,message", [
    ("http.keepalive_s", 0.0, "--keepalive_s must be > 0"),
    ("engine.max_queue", -1, "--max_queue >= 0"),
    ("http.host", "0.0.0.0", "api_keys_file"),
    ("http.rate_limit_rps", -1.0, "rate_limit_rps"),
    ("learn.every", 0, "--learn_every >= 1"),
    ("sim_event.t", 5, "--sim_event_t need --sim_event"),
])
def test_bad_settings_are_one_config_error(field, value, message):
  c = serve_config.get_config()
  section, name = field.split(".")
  if section == "learn":
    c.learn.enabled = True
  c[section][name] = value
  with pytest.raises(errors.ConfigError, match=message):
    settings_lib.from_config(c)


def test_learning_replicas_on_postgresql_are_refused():
  c = serve_config.get_config()
  c.learn.enabled, c.state.memory_url = True, "postgresql://gp@127.0.0.1:5432/gp"
  with pytest.raises(errors.ConfigError, match="--learn with --memory_url is refused"):
    settings_lib.from_config(c)
  c.learn.enabled = False   # replicas that only serve are fine
  assert settings_lib.from_config(c).learn is None


def test_the_cli_reads_the_serve_config_and_a_flag_overrides_it(tmp_path):
  """The real runner: a config file binding a public host without keys is refused before the
  router loads (exit 2, one line); --host on the command line overrides the file's."""
  cfg = tmp_path / "serve_public.py"
  cfg.write_text("from experiments.configs import serve\n\n\ndef get_config():\n"
                 "  c = serve.get_config()\n  c.http.host = '0.0.0.0'\n"
                 "  c.workdir = '/nonexistent'\n  return c\n")
  cmd = [sys.executable, "-m", "experiments.serve_router", f"--serve_config={cfg}"]
  r = subprocess.run(cmd, cwd=paths.REPO_ROOT, capture_output=True, text=True, timeout=120)
  assert r.returncode == 2 and "api_keys_file" in r.stderr, r.stderr
  assert "Traceback" not in r.stderr
  r = subprocess.run(cmd + ["--host=127.0.0.1"], cwd=paths.REPO_ROOT, capture_output=True, text=True,
                     timeout=120)
  # Past the settings: the workdir the file names is read next, and it does not exist.
  assert r.returncode == 2 and "/nonexistent" in r.stderr and "Traceback" not in r.stderr, r.stderr
  r = subprocess.run(cmd[:-1] + [f"--serve_config={tmp_path}/missing.py"], cwd=paths.REPO_ROOT,
                     capture_output=True, text=True, timeout=120)
  assert r.returncode == 2 and "--serve_config: no config file" in r.stderr, r.stderr
