"""Writing run outputs so that a crash or a full disk never leaves a half-written file behind.

`write_atomic` writes a temporary file next to the target and renames it over the target: a
reader (or a rerun) sees the old file or the new one, never a mix (`write_json` and `write_lines`
are its JSON and line forms). An OSError (disk full, read-only file system, no permission)
becomes a StorageError naming the file; the temporary file is removed and the old file is
untouched.
"""
from __future__ import annotations

import contextlib
import json
import os
import pathlib
from typing import Any, Iterable

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


def write_atomic(path: str | os.PathLike, text: str | bytes, what: str, *,
                 parents: bool = False, durable: bool = False) -> pathlib.Path:
  """Replaces `path` with `text` (UTF-8; bytes as they are) in one rename; parents: create
  missing folders first. durable: the new contents survive a power loss once this returns (the
  temporary file is fsynced before the rename and the folder after it).

  Raises:
    StorageError: the file cannot be written; `path` keeps its previous contents.
  """
  path = pathlib.Path(path)
  tmp = path.with_name(path.name + ".tmp")
  with storage_errors(path, what):
    if parents:
      path.parent.mkdir(parents=True, exist_ok=True)
    try:
      if isinstance(text, str):
        tmp.write_text(text, encoding="utf-8")
      else:
        tmp.write_bytes(text)
      if durable:
        fsync_file(tmp)
      os.replace(tmp, path)
    except BaseException:
      with contextlib.suppress(OSError):
        tmp.unlink()
      raise
    if durable:
      fsync_folder(path.parent)
  return path


def fsync_file(path: str | os.PathLike) -> None:
  """Makes a written file's contents durable."""
  fd = os.open(path, os.O_RDONLY)
  try:
    os.fsync(fd)
  finally:
    os.close(fd)


def fsync_folder(path: str | os.PathLike) -> None:
  """Makes the folder's entries (a rename, a new file) durable."""
  fsync_file(path)


def write_json(path: str | os.PathLike, obj: Any, what: str, *, parents: bool = True,
               **dump_kwargs) -> pathlib.Path:
  """write_atomic of json.dumps(obj, **dump_kwargs) (compact, non-ASCII kept, by default)."""
  dump_kwargs = {"ensure_ascii": False, "separators": (",", ":"), **dump_kwargs}
  return write_atomic(path, json.dumps(obj, **dump_kwargs), what, parents=parents)


def write_lines(path: str | os.PathLike, lines: Iterable[str], what: str, *,
                parents: bool = True) -> pathlib.Path:
  """write_atomic of text lines, each followed by a newline."""
  return write_atomic(path, "".join(f"{line}\n" for line in lines), what, parents=parents)
