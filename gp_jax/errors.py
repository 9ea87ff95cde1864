"""Errors that runners turn into one clear message and exit status 2."""


class GpJaxError(Exception):
  """Base class for user-facing errors (bad config, bad data, unknown names)."""


class ConfigError(GpJaxError, ValueError):
  """A configuration value is invalid or names something unknown."""


class DataError(GpJaxError, ValueError):
  """An input file is missing or malformed. The message names file, line and field."""


class StorageError(GpJaxError, OSError):
  """A file or folder cannot be written (disk full, read-only or unwritable location). The
  message names the path and says what was kept."""


class BackendError(GpJaxError, RuntimeError):
  """An LLM backend cannot be reached or answered unusably at start-up."""


def unknown_name(kind: str, name: str, known) -> ConfigError:
  """Builds the standard 'unknown X' error listing the valid names."""
  known = sorted(known)
  return ConfigError(f"unknown {kind} {name!r}; known {kind}s: {', '.join(known)}")


def read_json(path, what: str):
  """Parses a JSON file; a missing or malformed file is a DataError naming the file (and line)."""
  import json
  import pathlib
  path = pathlib.Path(path)
  try:
    return json.loads(path.read_text())
  except FileNotFoundError:
    raise DataError(f"{path}: {what} not found") from None
  except json.JSONDecodeError as e:
    raise DataError(f"{path}: line {e.lineno}: not valid JSON ({e.msg})") from None
