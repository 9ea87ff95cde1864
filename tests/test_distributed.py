"""Two local processes joined by jax.distributed (2 CPU devices each, gloo collectives) train like
one process with the same 4 devices: same metrics (process 0 alone writes them) and parameters.

Tolerance: the rollouts are the one-process rollouts exactly (same queries per slot, same
sampling noise, history rows exchanged in slot order), so integer metrics and returns are equal;
the update is the same SPMD program over 4 devices, but the cross-process all-reduce (gloo) adds
in another order than the in-process one, so metrics are compared at rtol 1e-5 and parameters,
after 16 Adam steps (which amplify last-bit differences of near-zero gradients), at
atol 5e-5 + rtol 1e-4 (measured: max |diff| 2e-5, on a parameter near 0).
"""
import json
import os
import pathlib
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

from gp_jax.runs import system as system_lib
from gp_jax.runs import train as training

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
import distributed_worker  # noqa: E402


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def launch(devices: int, n: int, workdir, port: int):
  env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
             JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
  return [subprocess.Popen([sys.executable, str(REPO / "tests" / "distributed_worker.py"),
                            str(port), str(n), str(rank), str(workdir)], cwd=REPO, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
          for rank in range(n)]


def finish(procs):
  outs = []
  for p in procs:
    try:
      out, err = p.communicate(timeout=400)
    except subprocess.TimeoutExpired:
      for q in procs:
        q.kill()
      raise
    assert p.returncode == 0, err[-3000:]
    outs.append(out)
  return outs


def metrics(workdir):
  lines = (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines()
  return [{k: v for k, v in json.loads(l).items() if k not in ("rollout_s", "update_s")}
          for l in lines]


def params(workdir):
  cfg = distributed_worker.config(0, 1, 0)
  _, p, history = training.load_router(cfg, workdir, system_lib.build(cfg), best=False)
  return [np.asarray(x) for x in jax.tree_util.tree_leaves(p)], len(history)


def test_two_processes_train_like_one_with_the_same_devices(tmp_path):
  two = launch(2, 2, tmp_path / "two", free_port())
  one = launch(4, 1, tmp_path / "one", free_port())
  outs = finish(two) + finish(one)
  assert "DONE process 0 of 2, 2 of 4 devices" in outs[0]
  assert "DONE process 1 of 2, 2 of 4 devices" in outs[1]
  assert "DONE process 0 of 1, 4 of 4 devices" in outs[2]
  m1, m2 = metrics(tmp_path / "one"), metrics(tmp_path / "two")
  assert len(m1) == len(m2) == 2
  for a, b in zip(m1, m2):
    assert a.keys() == b.keys()
    for k, v in a.items():
      if isinstance(v, float):
        assert b[k] == pytest.approx(v, rel=1e-5, abs=1e-7), (a["iteration"], k)
      else:
        assert b[k] == v, (a["iteration"], k)
  (p1, h1), (p2, h2) = params(tmp_path / "one"), params(tmp_path / "two")
  assert h1 == h2 > 0
  for a, b in zip(p1, p2):
    np.testing.assert_allclose(b, a, atol=5e-5, rtol=1e-4)
