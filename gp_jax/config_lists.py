"""Lists in configs, read one way: a comma-separated string ("a, b") or a sequence.

ml_collections flags make comma strings the easy form on the command line
(`--config.llms=qwen2.5-7b-instruct,gemma-2-9b-it`), and a config file may hold a tuple; every
reader of a list field goes through `names` or `numbers`, so both forms mean the same everywhere.
"""
from __future__ import annotations

from typing import Callable

from gp_jax import errors


def names(value, field: str | None = None) -> tuple[str, ...]:
  """The names of a list field, blanks dropped, in order.

  field: when given, an empty list is a ConfigError naming config.<field>.
  """
  if value is None:
    parts = []
  elif isinstance(value, str):
    parts = value.split(",")
  else:
    parts = [str(v) for v in value]
  out = tuple(p.strip() for p in parts if p.strip())
  if field is not None and not out:
    raise errors.ConfigError(f"config.{field} is empty")
  return out


def numbers(value, field: str, cast: Callable = float) -> list:
  """'0,0.1' (or (0, 0.1)) -> [0.0, 0.1]; a ConfigError naming config.<field> on a bad or empty
  list."""
  parts = names(value, field)
  try:
    return [cast(p) for p in parts]
  except ValueError:
    raise errors.ConfigError(f"config.{field}={value!r} is not a comma list of numbers") from None


def seeds(text, flag: str = "seeds") -> list[int]:
  """'0,1,2' -> [0, 1, 2]; a ConfigError for an empty list, a non-integer, a negative or a
  repeated seed."""
  parts = [p.strip() for p in str(text).split(",")]
  if not any(parts):
    raise errors.ConfigError(f"--{flag} is empty; give a comma list of seeds, e.g. --{flag}=0,1")
  try:
    out = [int(p) for p in parts]
  except ValueError:
    raise errors.ConfigError(f"--{flag}={text}: not a comma list of integers") from None
  if any(s < 0 for s in out):
    raise errors.ConfigError(f"--{flag}={text}: seeds must be >= 0")
  if len(set(out)) != len(out):
    raise errors.ConfigError(f"--{flag}={text}: a seed is repeated")
  return out
