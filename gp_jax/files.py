"""Writing run outputs so that a crash or a full disk never leaves a half-written file behind.

`atomic_file` gives a temporary file next to the target to write into and renames it over the
target when the writing ends: a reader (or a rerun) sees the old file or the new one, never a
mix. `write_atomic` writes a text or bytes that way; `write_json` and `write_lines` are its JSON
and line forms; writers that stream (rows, numpy's savers) write into `atomic_file` itself. An
OSError (disk full, read-only file system, no permission) becomes a StorageError naming the
file; the temporary file is removed and the old file is untouched. Temporary names are unique
(two processes writing one file do not share one), and the new file gets the mode a plain
open() would give (0666 less the umask).
"""
from __future__ import annotations

import contextlib
import json
import os
import pathlib
import tempfile
from typing import Any, BinaryIO, Iterable, Iterator

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


def current_umask() -> int:
  """The process umask, read without changing it (os.umask would, for every thread)."""
  try:
    with open("/proc/self/status") as f:
      for line in f:
        if line.startswith("Umask:"):
          return int(line.split()[1], 8)
  except (OSError, ValueError, IndexError):
    pass
  mask = os.umask(0o022)   # no /proc: the classic read-and-restore
  os.umask(mask)
  return mask


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, what: str, *, parents: bool = False,
                durable: bool = False) -> Iterator[BinaryIO]:
  """Yields a binary file whose contents replace `path` in one rename when the block ends
  without an error (the block raising: `path` is untouched, the temporary file removed).

  parents: create missing folders first. durable: the new contents survive a power loss once
  the block is left (the temporary file is fsynced before the rename and the folder after it).
  Raises:
    StorageError: the file cannot be written; `path` keeps its previous contents.
  """
  path = pathlib.Path(path)
  with storage_errors(path, what):
    if parents:
      path.parent.mkdir(parents=True, exist_ok=True)
    # mkstemp makes the file 0600; it gets a plain open()'s mode instead.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
      os.fchmod(fd, 0o666 & ~current_umask())
      with os.fdopen(fd, "wb") as f:
        yield f
      if durable:
        fsync_file(tmp)
      os.replace(tmp, path)
    except BaseException:
      with contextlib.suppress(OSError):
        os.unlink(tmp)
      raise
    if durable:
      fsync_folder(path.parent)


def write_atomic(path: str | os.PathLike, text: str | bytes, what: str, *,
                 parents: bool = False, durable: bool = False) -> pathlib.Path:
  """Replaces `path` with `text` (UTF-8; bytes as they are) in one rename (`atomic_file`).

  Raises:
    StorageError: the file cannot be written; `path` keeps its previous contents.
  """
  with atomic_file(path, what, parents=parents, durable=durable) as f:
    f.write(text.encode("utf-8") if isinstance(text, str) else text)
  return pathlib.Path(path)


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
