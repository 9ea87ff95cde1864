"""Where the project's own data files live (the top-level data/ folder) and where generated data goes
(atomic writes: gp_jax/files.py)."""
import os
import pathlib

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
DATA_DIR = pathlib.Path(os.environ.get("GP_JAX_DATA", REPO_ROOT / "data"))
# Generated or downloaded data (prepare_data output, caches) goes here unless a runner says otherwise.
CACHE_DIR = pathlib.Path(os.environ.get("GP_JAX_CACHE", pathlib.Path.home() / ".cache" / "gp_jax"))
