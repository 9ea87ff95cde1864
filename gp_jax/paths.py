"""Where the project's own data files live (the top-level data/ folder) and where generated data goes
(atomic writes: gp_jax/files.py)."""
import os
import pathlib

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
DATA_DIR = pathlib.Path(os.environ.get("GP_JAX_DATA", REPO_ROOT / "data"))
# Generated or downloaded data (prepare_data output, caches) goes here unless a runner says otherwise.
CACHE_DIR = pathlib.Path(os.environ.get("GP_JAX_CACHE", pathlib.Path.home() / ".cache" / "gp_jax"))


def child_env() -> dict[str, str]:
  """The environment of a `python -m gp_jax...` / `experiments...` child process: this one's, with
  the repository root first on PYTHONPATH (no empty entry added)."""
  rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
  return dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT)] + rest))
