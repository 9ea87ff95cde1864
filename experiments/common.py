"""Shared runner plumbing: one clear error line and exit 2 for user errors.

Flag values absl cannot parse, a --config file that is missing or does not load, a --config.*
override naming no field, and a workdir that cannot be used (`check_workdir`) are all reported
before the runner creates anything."""
import ast
import errno
import functools
import importlib.util
import os
import pathlib
import re
import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from gp_jax import errors
from gp_jax.runs import config_defaults

# OSErrors about the storage rather than about the program: reported in one line, exit 2.
_STORAGE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM,
                   errno.ENOTDIR, errno.EISDIR, errno.EIO)


def user_errors_exit_2(main):
  @functools.wraps(main)
  def wrapped(argv):
    logging.set_verbosity(logging.WARNING)   # keep library INFO chatter (orbax) off the console
    try:
      return main(argv)
    except errors.GpJaxError as e:
      print(f"error: {e}", file=sys.stderr)
      sys.exit(2)
    except OSError as e:   # a write the library does not wrap (disk full, read-only, no access)
      if e.errno not in _STORAGE_ERRNOS:
        raise
      where = f"{e.filename}: " if e.filename else ""
      print(f"error: {where}{e.strerror or e}", file=sys.stderr)
      sys.exit(2)
  return wrapped


def _one_line(e: Exception) -> str:
  """An exception's message on one line (ml_collections quotes its KeyError messages)."""
  text = str(e)
  for _ in range(2):             # a KeyError inside an AttributeError is quoted twice at most
    try:
      value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
      break
    if not isinstance(value, str):
      break
    text = value
  return " ".join(text.split())


REPO = pathlib.Path(__file__).resolve().parents[1]


def _fail(message: str):
  print(f"error: {message}", file=sys.stderr)
  sys.exit(2)


def _config_flag_error(e: Exception):
  if isinstance(e, (KeyError, AttributeError)):
    print(f"error: no such config field in the --config.* flags: {_one_line(e)}", file=sys.stderr)
  else:
    print(f"error: cannot apply the command-line flags: {type(e).__name__}: {_one_line(e)}",
          file=sys.stderr)
  sys.exit(2)


# Whether the runner's --config is a GraphPlanner config, completed once parsed (define_config).
_COMPLETE_CONFIG = False


def define_config(default: str, help_text: str, *, complete: bool = False):
  """config_flags.DEFINE_config_file("config", ...) for a runner module.

  complete: a GraphPlanner config (experiments/configs/default.py and those made from it): once
  the flags are parsed, the fields an older config file lacks are added with their values
  (gp_jax/runs/config_defaults.py), so the library reads every field as an attribute.

  `default` is relative to the repository root (so a runner works from any directory).
  ml_collections applies `--config.<field>=...` overrides on the default config while the flag is
  defined (at import, when no --config is given) and on the given config while flags are parsed
  (see `run`); an unknown or mistyped field raised a traceback in both places. Here it is one
  `error:` line and exit status 2."""
  global _COMPLETE_CONFIG
  _COMPLETE_CONFIG = complete
  if not pathlib.Path(default).is_absolute():
    default = str(REPO / default)
  try:
    return config_flags.DEFINE_config_file("config", default, help_text)
  except (KeyError, AttributeError, TypeError, ValueError) as e:
    _config_flag_error(e)


def load_config_file(path, what: str):
  """get_config() of the Python config file at `path` (relative to the repository root when it
  is not found from here). Raises ConfigError (one line) when it is missing or fails."""
  path = pathlib.Path(path)
  if not path.is_absolute() and not path.exists():
    path = REPO / path
  if not path.is_file():
    raise errors.ConfigError(f"{what}: no config file {path}")
  spec = importlib.util.spec_from_file_location(f"_config_{path.stem}", path)
  module = importlib.util.module_from_spec(spec)
  try:
    spec.loader.exec_module(module)
    return module.get_config()
  except Exception as e:
    raise errors.ConfigError(f"{what}: cannot load {path}: {type(e).__name__}: {e}") from None


def _flag_error_text(e: Exception) -> str:
  """absl's flag error on one line: its first line, and the last line of an embedded traceback
  (ml_collections puts the config file's traceback in the message)."""
  lines = [l.strip() for l in str(e).splitlines() if l.strip()]
  if not lines:
    return type(e).__name__
  if len(lines) > 1:
    return f"{lines[0].rstrip(':')}: {lines[-1]}"
  return lines[0]


def _config_argument(argv) -> str:
  """The --config value of the command line (absl also accepts -config and a separate value)."""
  for i, arg in enumerate(argv):
    for prefix in ("--config=", "-config="):
      if arg.startswith(prefix):
        return arg[len(prefix):]
    if arg in ("--config", "-config") and i + 1 < len(argv):
      return argv[i + 1]
  return ""


def _check_config_loads(argv) -> None:
  """ml_collections loads a --config file lazily: a missing or failing file only shows (as a
  chained traceback) when the runner first reads the config. Read it here instead."""
  if "config" not in flags.FLAGS:
    return
  value = flags.FLAGS["config"].value
  try:
    if value is not None:
      value.keys()    # any access: an unloadable file's placeholder raises here
  except Exception as e:   # the file's own exception, re-raised by ml_collections
    path = _config_argument(argv).split(":", 1)[0] or "the default config"
    cause = e.__cause__ or e
    if isinstance(cause, OSError) and "Failed loading config file" in str(cause):
      # its last line: "[Errno 2] No such file or directory: '<path>'"
      last = str(cause).strip().splitlines()[-1].strip()
      m = re.fullmatch(r"\[Errno \d+\] (.*?)(?:: '.*')?", last)
      _fail(f"--config: cannot load {path}: {m.group(1) if m else last}")
    _fail(f"--config: cannot load {path}: {type(cause).__name__}: {_one_line(cause)}")


def _parse_flags(argv):
  """absl's flag parsing (app.run's flags_parser), every failure one `error:` line and exit 2:
  absl's own errors (a bad value: "--config.alpha=abc", an unknown flag) otherwise print two
  "FATAL Flags parsing error" lines and exit 1."""
  try:
    rest = flags.FLAGS(argv)
  except flags.Error as e:
    if "Error whilst parsing config file" in str(e):   # get_config raised TypeError/ValueError
      last = [l.strip() for l in str(e).splitlines() if l.strip()][-1]
      _fail(f"--config: cannot load {_config_argument(argv)}: {last}")
    _fail(f"{_flag_error_text(e)} (see --helpshort)")
  except (KeyError, AttributeError) as e:   # a --config.* override naming no field
    _config_flag_error(e)
  except Exception as e:   # executing the --config file raised (the only user code run here)
    if "config" not in flags.FLAGS:
      _fail(f"cannot parse the flags: {type(e).__name__}: {_one_line(e)}")
    path = _config_argument(argv).split(":", 1)[0] or "the default config"
    _fail(f"--config: cannot load {path}: {type(e).__name__}: {_one_line(e)}")
  _check_config_loads(argv)
  if _COMPLETE_CONFIG and flags.FLAGS["config"].value is not None:
    config_defaults.complete(flags.FLAGS["config"].value)
  return rest


def run(main) -> None:
  """absl's app.run(main) with the flags parsed by `_parse_flags`: any error in the flags (a bad
  value, an unknown flag, a --config file that is missing or fails, a --config.* override naming
  no field) is one `error:` line and exit status 2, before `main` runs."""
  app.run(main, flags_parser=_parse_flags)


def _nearest_existing(p: pathlib.Path) -> pathlib.Path:
  """`p` or its nearest existing parent (the folder a later mkdir would create under)."""
  while not p.exists() and p.parent != p:
    p = p.parent
  return p


def check_workdir(path, *, must_exist: bool, what: str = "workdir") -> pathlib.Path:
  """Checks, creating nothing, that `path` can serve as a run's directory; returns it.

  must_exist: the directory must already be there (evaluation reads a finished run), else it or
  its nearest existing parent must be a directory this process can write into (it is created
  later, by the run). Raises errors.ConfigError naming the problem."""
  if not str(path):
    raise errors.ConfigError(f"--{what} is empty")
  p = pathlib.Path(path).expanduser()
  if p.exists() and not p.is_dir():
    raise errors.ConfigError(f"--{what}={path}: exists and is not a directory")
  if must_exist:
    if not p.is_dir():
      raise errors.ConfigError(f"--{what}={path}: no such directory")
    probe = p
  else:
    probe = _nearest_existing(p)
    if not probe.is_dir():
      raise errors.ConfigError(f"--{what}={path}: cannot be created, {probe} is not a directory")
  if not os.access(probe, os.W_OK | os.X_OK):
    raise errors.ConfigError(f"--{what}={path}: {probe} is not writable")
  return p


def check_output_file(value, flag: str, suffix: str = "") -> pathlib.Path:
  """Checks, creating nothing, that --`flag`=`value` names a file this process can write (its
  folder, or the nearest existing parent, writable; `suffix` e.g. ".npy" required when given);
  returns the path. Raises errors.ConfigError naming the problem."""
  if not str(value):
    raise errors.ConfigError(f"--{flag} is empty")
  path = pathlib.Path(value).expanduser()
  if suffix and path.suffix.lower() != suffix:
    raise errors.ConfigError(f"--{flag}={value}: must name a {suffix} file")
  if path.is_dir() or path.name in ("", ".", ".."):
    raise errors.ConfigError(f"--{flag}={value}: is a directory")
  probe = _nearest_existing(path.parent)
  if not probe.is_dir():
    raise errors.ConfigError(f"--{flag}={value}: cannot be written, {probe} is not a directory")
  if not os.access(probe, os.W_OK | os.X_OK):
    raise errors.ConfigError(f"--{flag}={value}: cannot be written, {probe} is not writable")
  return path


def check_trained_workdir(path) -> pathlib.Path:
  """check_workdir for evaluation: an existing, writable directory holding a run's checkpoints
  (evaluation reads them and writes its reports there; it never creates directories)."""
  p = check_workdir(path, must_exist=True)
  ckpt = p / "checkpoints"
  if not any((ckpt / kind).is_dir() and any(c.name.isdigit() for c in (ckpt / kind).iterdir())
             for kind in ("best", "latest")):
    raise errors.ConfigError(f"--workdir={path}: no checkpoints in {ckpt}: train first "
                             f"(python -m experiments.train --workdir={path})")
  return p
