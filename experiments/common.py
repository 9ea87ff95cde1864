"""Shared runner plumbing: one clear error line and exit 2 for user errors."""
import functools
import sys

from absl import logging

from gp_jax import errors


def user_errors_exit_2(main):
  @functools.wraps(main)
  def wrapped(argv):
    logging.set_verbosity(logging.WARNING)   # keep library INFO chatter (orbax) off the console
    try:
      return main(argv)
    except errors.GpJaxError as e:
      print(f"error: {e}", file=sys.stderr)
      sys.exit(2)
  return wrapped
