"""Bad input through the real runners: one `error:` line, exit status 2, nothing created."""
import os
import pathlib
import subprocess
import sys

import pytest

from experiments import common
from gp_jax import errors

REPO = pathlib.Path(__file__).resolve().parents[1]
TEST_CONFIG = str(REPO / "experiments/configs/test.py")


def _cases(tmp: pathlib.Path):
  """(name, runner, flags, words the error line must hold); every case runs from `tmp`."""
  (tmp / "a_file").write_text("x\n")
  (tmp / "broken.py").write_text("def get_config():\n  return undefined_name\n")
  (tmp / "syntax.py").write_text("def get_config(:\n")
  (tmp / "untrained").mkdir()
  w = f"--workdir={tmp / 'w'}"
  return [
      ("config missing", "train", [f"--config={tmp / 'none.py'}", w],
       ["--config: cannot load", "none.py", "No such file or directory"]),
      ("config raises", "train", [f"--config={tmp / 'broken.py'}", w],
       ["cannot load", "NameError", "undefined_name"]),
      ("config syntax", "train", [f"--config={tmp / 'syntax.py'}", w],
       ["cannot load", "SyntaxError"]),
      ("config argument", "train", [f"--config={TEST_CONFIG}:tiny", w],
       ["cannot load", "get_config() takes 0 positional arguments"]),
      ("bad float", "train", ["--config.alpha=abc", w],
       ["--config.alpha=abc", "could not convert string to float: 'abc'"]),
      ("bad bool", "train", [f"--config={TEST_CONFIG}", "--evaluate=maybe", w],
       ["--evaluate=maybe", "Non-boolean"]),
      ("unknown flag", "train", [f"--config={TEST_CONFIG}", "--episodes=3", w],
       ["Unknown command line flag 'episodes'"]),
      ("workdir under a file", "train", [f"--config={TEST_CONFIG}",
                                         f"--workdir={tmp / 'a_file' / 'run'}"],
       ["cannot be created", "a_file is not a directory"]),
      ("sweep workdir under a file", "sweep", [f"--workdir={tmp / 'a_file' / 'sweep'}"],
       ["cannot be created"]),
      ("other runners: a bad value", "prepare_data", ["--seed=abc", f"--out_dir={tmp / 'o'}"],
       ["--seed=abc", "invalid literal for int()"]),
      ("other runners: an unknown flag", "counselor", ["--methodd=llm_only"],
       ["Unknown command line flag 'methodd'"]),
      ("evaluate: missing workdir", "evaluate", [f"--workdir={tmp / 'nope' / 'run'}"],
       ["no such directory"]),
      ("evaluate: a file", "evaluate", [f"--workdir={tmp / 'a_file'}"],
       ["not a directory"]),
      ("evaluate: untrained", "evaluate", [f"--workdir={tmp / 'untrained'}"],
       ["no checkpoints", "train first"]),
  ]


def test_bad_input_is_one_line_exit_2_and_creates_nothing(tmp_path):
  # Run from a directory outside the clone: the default config must still be found.
  cwd = tmp_path / "cwd"
  cwd.mkdir()
  cases = _cases(tmp_path)
  before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
  env = dict(os.environ, PYTHONPATH=str(REPO))
  procs = [(name, words, subprocess.Popen(
      [sys.executable, "-m", f"experiments.{runner}", *argv], cwd=cwd, env=env,
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
           for name, runner, argv, words in cases]
  for name, words, proc in procs:
    out, err = proc.communicate(timeout=180)
    lines = [l for l in err.splitlines() if l.strip()]
    assert proc.returncode == 2, (name, err[-3000:])
    assert len(lines) == 1 and lines[0].startswith("error: "), (name, err[-3000:])
    assert all(w in lines[0] for w in words), (name, lines[0])
    assert out == "", (name, out)
  assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
  assert not (cwd / "workdirs").exists()


def test_check_workdir(tmp_path, monkeypatch):
  (tmp_path / "f").write_text("")
  assert common.check_workdir(tmp_path / "a" / "b", must_exist=False) == tmp_path / "a" / "b"
  assert not (tmp_path / "a").exists()
  for path, must_exist, words in [(tmp_path / "f", False, "not a directory"),
                                  (tmp_path / "f" / "x", False, "f is not a directory"),
                                  (tmp_path / "a", True, "no such directory"),
                                  ("", False, "empty")]:
    with pytest.raises(errors.ConfigError, match=words):
      common.check_workdir(path, must_exist=must_exist)
  # Not writable (as root every folder is, so the permission answer is simulated).
  monkeypatch.setattr(common.os, "access", lambda p, mode: pathlib.Path(p) != tmp_path)
  with pytest.raises(errors.ConfigError, match=f"{tmp_path} is not writable"):
    common.check_workdir(tmp_path / "new" / "run", must_exist=False)
  with pytest.raises(errors.ConfigError, match="is not writable"):
    common.check_workdir(tmp_path, must_exist=True)

