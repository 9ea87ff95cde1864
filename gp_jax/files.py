"""Writing run outputs so that a crash or a full disk never leaves a half-written file behind.

`write_atomic` writes a temporary file next to the target and renames it over the target: a
reader (or a rerun) sees the old file or the new one, never a mix. An OSError (disk full,
read-only file system, no permission) becomes a StorageError naming the file; the temporary file
is removed and the old file is untouched.
"""
from __future__ import annotations

import contextlib
import os
import pathlib

from gp_jax import errors


def describe_os_error(e: OSError) -> str:
  """"No space left on device" rather than "[Errno 28] No space left on device: '...'"."""
  return e.strerror or str(e)


@contextlib.contextmanager
def storage_errors(path, what: str):
  """Turns an OSError raised inside the block into a StorageError naming `path` and `what`."""
  try:
    yield
  except errors.StorageError:
    raise
  except OSError as e:
    raise errors.StorageError(f"{path}: cannot write {what} ({describe_os_error(e)})") from None


def write_atomic(path: str | os.PathLike, text: str, what: str) -> None:
  """Replaces `path` with `text` (UTF-8) in one rename.

  Raises:
    StorageError: the file cannot be written; `path` keeps its previous contents.
  """
  path = pathlib.Path(path)
  tmp = path.with_name(path.name + ".tmp")
  with storage_errors(path, what):
    try:
      tmp.write_text(text)
      os.replace(tmp, path)
    except BaseException:
      with contextlib.suppress(OSError):
        tmp.unlink()
      raise
