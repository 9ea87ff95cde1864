"""Where the project's own data files live (the top-level data/ folder), and atomic writes."""
import os
import pathlib
import tempfile

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
DATA_DIR = pathlib.Path(os.environ.get("GP_JAX_DATA", REPO_ROOT / "data"))
# Generated or downloaded data (prepare_data output, caches) goes here unless a runner says otherwise.
CACHE_DIR = pathlib.Path(os.environ.get("GP_JAX_CACHE", pathlib.Path.home() / ".cache" / "gp_jax"))


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


def mkstemp_beside(path: pathlib.Path, suffix: str = ".tmp") -> tuple[int, str]:
  """(fd, name) of a new temporary file next to `path`, for writing it atomically (write, then
  os.replace). mkstemp makes it 0600; it gets the mode a plain open() would give instead
  (0666 less the umask), so the replaced file is readable like every other output."""
  path = pathlib.Path(path)
  fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix)
  os.fchmod(fd, 0o666 & ~current_umask())
  return fd, tmp
