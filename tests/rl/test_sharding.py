"""The learner on a 4-device mesh gives the 1-device numbers (CPU devices forced with XLA_FLAGS).

jax fixes its device count when it starts, so each check runs tests/rl/sharding_worker.py in a
subprocess with --xla_force_host_platform_device_count=4 and compares its 1- and 4-device results.
Tolerance: the 4-device program sums history rows and transitions in another order (per-device
partial sums, then an all-reduce), so float32 results differ in the last bits; after 16 Adam
steps parameters agree to atol 5e-5 + rtol 1e-4 (measured: max |diff| 1.1e-5), metrics to rtol 1e-4.
"""
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


def run_worker(*args):
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
             JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
  out = subprocess.run([sys.executable, str(REPO / "tests" / "rl" / "sharding_worker.py"), *args],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  line = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")][-1]
  return json.loads(line[len("RESULT "):])


def test_update_on_4_devices_matches_1_device():
  res = run_worker("update", "400")
  one, four = res["1"], res["4"]
  assert "'data': 4" in four["param_sharding"] and "P()" in four["param_sharding"]
  assert "SingleDevice" in one["param_sharding"]
  assert one["batch_size"] == four["batch_size"] and one["history_rows"] > 100
  for a, b in zip(one["params"], four["params"]):
    np.testing.assert_allclose(b, a, atol=5e-5, rtol=1e-4)
  for ma, mb in zip(one["metrics"], four["metrics"]):
    assert ma.keys() == mb.keys()
    for k in ma:
      assert mb[k] == pytest.approx(ma[k], rel=1e-4, abs=1e-6), k
  # The rollout's history refresh, sharded the same way, gives the same per-hub sums.
  np.testing.assert_allclose(four["hub_sum"], one["hub_sum"], atol=1e-4, rtol=1e-5)


def test_training_run_on_4_devices_matches_1_device():
  res = run_worker("train")
  # The runs built their meshes (learner, rollout) over 1 and 4 devices as asked.
  assert res["1"]["meshes"] and set(res["1"]["meshes"]) == {1}, res["1"]["meshes"]
  assert res["4"]["meshes"] and set(res["4"]["meshes"]) == {4}, res["4"]["meshes"]
  one, four = res["1"]["metrics"], res["4"]["metrics"]
  assert len(one) == len(four) == 3
  for ma, mb in zip(one, four):
    assert ma.keys() == mb.keys()
    for k, v in ma.items():
      if isinstance(v, float):
        assert mb[k] == pytest.approx(v, rel=1e-4, abs=1e-6), (ma["iteration"], k)
      else:
        assert mb[k] == v, (ma["iteration"], k)
