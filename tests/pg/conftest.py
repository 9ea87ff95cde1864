"""PostgreSQL stage: a throwaway cluster started by scripts/postgres.sh for the whole session (and
always stopped and deleted afterwards). Run with `bash scripts/pg_tests.sh`, which sets
GP_JAX_PG=1; without it the tests marked `pg` (all of tests/pg) are skipped
(tests/conftest.STAGES)."""
from __future__ import annotations

import pathlib
import shutil
import socket
import subprocess
import tempfile
import uuid

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.fixture(scope="session")
def pg_server():
  """(URL, cluster folder) of a running throwaway PostgreSQL on 127.0.0.1."""
  # Under /tmp: as root the server runs as `postgres`, which cannot enter pytest's tmp_path.
  folder = pathlib.Path(tempfile.mkdtemp(prefix="gp_jax_pg_", dir="/tmp"))
  script = str(REPO / "scripts" / "postgres.sh")
  try:
    out = subprocess.run(["bash", script, "start", str(folder), str(_free_port())],
                         capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
      pytest.fail(f"scripts/postgres.sh start failed ({out.returncode}):\n{out.stderr[-3000:]}")
    url = out.stdout.strip().splitlines()[-1]
    assert url.startswith("postgresql://"), out.stdout
    yield url, folder
  finally:
    subprocess.run(["bash", script, "stop", str(folder)], capture_output=True, timeout=120)
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_url(pg_server) -> str:
  return pg_server[0]


@pytest.fixture
def namespace() -> str:
  """A namespace of its own for each test (one cluster serves the session)."""
  return "t-" + uuid.uuid4().hex[:12]
