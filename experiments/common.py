"""Shared runner plumbing: one clear error line and exit 2 for user errors."""
import ast
import errno
import functools
import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from gp_jax import errors

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


def _config_flag_error(e: Exception):
  if isinstance(e, (KeyError, AttributeError)):
    print(f"error: no such config field in the --config.* flags: {_one_line(e)}", file=sys.stderr)
  else:
    print(f"error: cannot apply the command-line flags: {type(e).__name__}: {_one_line(e)}",
          file=sys.stderr)
  sys.exit(2)


def define_config(default: str, help_text: str):
  """config_flags.DEFINE_config_file("config", ...) for a runner module.

  ml_collections applies `--config.<field>=...` overrides on the default config while the flag is
  defined (at import, when no --config is given) and on the given config while flags are parsed
  (see `run`); an unknown or mistyped field raised a traceback in both places. Here it is one
  `error:` line and exit status 2. (absl itself reports bad values and bad config files.)"""
  try:
    return config_flags.DEFINE_config_file("config", default, help_text)
  except (KeyError, AttributeError, TypeError, ValueError) as e:
    _config_flag_error(e)


def run(main) -> None:
  """absl's app.run(main), with an exception raised while the flags are parsed (a --config.*
  override naming no field of the given --config) turned into one `error:` line and exit status
  2. Exceptions raised once the flags are parsed propagate unchanged."""
  try:
    app.run(main)
  except Exception as e:   # only while parsing flags: re-raised otherwise
    if flags.FLAGS.is_parsed():
      raise
    _config_flag_error(e)
