"""scripts/postgres.sh as CI and users run it: a cluster of its own (not the session's) stopped and
started again under a live store, which reconnects and finds everything; usage errors."""
from __future__ import annotations

import pathlib
import shutil
import socket
import subprocess
import tempfile

import numpy as np
import pytest

from gp_jax import errors
from gp_jax.serving.state import postgres
from gp_jax.serving.state import store_api

pytestmark = pytest.mark.pg

SCRIPT = str(pathlib.Path(__file__).resolve().parents[2] / "scripts" / "postgres.sh")


def _sh(*args) -> subprocess.CompletedProcess:
  return subprocess.run(["bash", SCRIPT, *map(str, args)], capture_output=True, text=True,
                        timeout=300)


def _port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_server_restart_under_a_live_store_loses_nothing():
  folder = pathlib.Path(tempfile.mkdtemp(prefix="gp_jax_pg_restart_", dir="/tmp"))
  port = _port()
  try:
    started = _sh("start", folder, port)
    assert started.returncode == 0, started.stderr
    url = started.stdout.strip()
    assert url.startswith("postgresql://gp_jax:") and url.endswith(f"@127.0.0.1:{port}/gp_jax")
    assert _sh("start", folder, port).stdout.strip() == url   # already running: same URL
    assert _sh("url", folder).stdout.strip() == url
    store = postgres.PostgresStore(url, row_dim=3, num_hubs=2, namespace="restart",
                                   connect_timeout_s=2)
    rows = np.ones((2, 3), np.float32)
    assert store.add_feedback(store_api.Feedback(0, "a", None, 1.0, rows,
                                                 np.array([0, 1], np.int32))).seq == 1
    assert _sh("stop", folder).returncode == 0
    with pytest.raises(errors.StorageError, match=f"127.0.0.1:{port}.*cannot be reached") as e:
      store.add_feedback(store_api.Feedback(0, "b", None, 1.0, rows, np.array([0, 1], np.int32)))
    assert url.split(":")[2].split("@")[0] not in str(e.value)   # no password in the message
    assert _sh("start", folder, port).stdout.strip() == url   # the same cluster, data kept
    fb = store.add_feedback(store_api.Feedback(0, "b", None, 1.0, rows, np.array([0, 1], np.int32)))
    assert fb.seq == 2   # the failed attempt stored nothing and took no seq
    assert [f.rid for f in store.feedback_after(0)] == ["a", "b"]
    store.close()
  finally:
    _sh("stop", folder)
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("args, message", [
    (("start", "/tmp/gp_jax_pg_never", "http"), "PORT must be a number"),
    (("start", "/tmp/gp_jax_pg_never"), "usage:"),
    (("stop", "/tmp/gp_jax_pg_never_made"), "holds no cluster"),
    (("url", "/tmp/gp_jax_pg_never_made"), "holds no cluster"),
    (("restart",), "usage:"),
])
def test_usage_errors_are_one_line_and_status_2(args, message):
  out = _sh(*args)
  assert out.returncode == 2 and out.stdout == ""
  assert out.stderr.startswith("error: ") and message in out.stderr
  assert len(out.stderr.strip().splitlines()) == 1
