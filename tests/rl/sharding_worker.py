"""Run in a subprocess with XLA_FLAGS=--xla_force_host_platform_device_count=4 (tests/rl/
test_sharding.py): one PPO update of real test-config rollouts on a 1-device and a 4-device mesh,
and a short training run on each; prints JSON for the test to compare."""
import asyncio
import json
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

from experiments.configs import test as test_config
from gp_jax.graph import history as history_lib
from gp_jax.rl import batch as batch_lib
from gp_jax.rl import rollout
from gp_jax.rl import loop as loop_lib
from gp_jax.runs import ppo_config
from gp_jax.runs import system as system_lib
from gp_jax.runs import train as training


def update_params(devices: int, history_capacity: int):
  """Parameters after two PPO updates on the same real batches, on a mesh of `devices`."""
  cfg = test_config.get_config()
  cfg.parallel.devices = devices
  cfg.model.history_capacity = history_capacity
  sysm = system_lib.build(cfg)
  model = training.make_model(cfg, sysm.featurizer.spec)
  opt = ppo_config.make_optimizer(cfg)
  state = loop_lib.init_state(model, sysm.featurizer, opt, 0)
  mesh = training.make_mesh(cfg)
  update, bsz = ppo_config.make_update(cfg, sysm, model, opt, 16, mesh)
  runner = rollout.PolicyRunner(model, sysm.featurizer.hub_features, 16,
                                mesh=training.make_mesh(cfg, local=True))
  history = history_lib.HistoryMemory(sysm.featurizer.spec.row_dim, sysm.space.size,
                                      capacity=history_capacity, headroom=bsz)
  runner.set_params(state.params, history)
  env = sysm.env(0.5)
  hub = jnp.asarray(sysm.featurizer.hub_features)
  out = {"metrics": [], "hub_sum": []}
  for it in range(2):
    eps = asyncio.run(rollout.run_episodes(
        env, sysm.featurizer, runner, sysm.train_queries[it * 16:(it + 1) * 16],
        key=jax.random.PRNGKey(it), greedy=False, history=history, grow_history=True,
        seed_salt=it))
    batch, hist = batch_lib.build_batch(eps, history, batch_size=bsz, num_episodes=16,
                                        max_calls=ppo_config.max_calls(sysm),
                                        num_hubs=sysm.space.size)
    state, m = update(state, hub, hist, batch)
    out["metrics"].append({k: float(v) for k, v in jax.device_get(m).items()})
    history.evict()
    runner.set_params(state.params, history)
    out["hub_sum"].append(runner.hub_sum.tolist())
  leaves = jax.tree_util.tree_leaves(jax.device_get(state.params))
  out["params"] = [np.asarray(x).ravel().tolist() for x in leaves]
  out["param_sharding"] = str(jax.tree_util.tree_leaves(state.params)[0].sharding)
  out["batch_size"] = bsz
  out["history_rows"] = len(history)
  return out


def train_metrics(devices: int):
  """A short training run's metrics and the device count of each mesh the run built (the
  learner's and the rollout's), so the test can check the run used `devices` devices."""
  cfg = test_config.get_config()
  cfg.parallel.devices = devices
  meshes, make_mesh = [], training.make_mesh

  def recording_make_mesh(config, **kw):
    mesh = make_mesh(config, **kw)
    meshes.append(int(mesh.devices.size))
    return mesh
  training.make_mesh = recording_make_mesh
  try:
    with tempfile.TemporaryDirectory() as wd:
      training.train(cfg, wd, verbose=False)
      lines = open(f"{wd}/metrics.jsonl").read().splitlines()
  finally:
    training.make_mesh = make_mesh
  return {"meshes": meshes,
          "metrics": [{k: v for k, v in json.loads(l).items() if k not in ("rollout_s", "update_s")}
                      for l in lines]}


if __name__ == "__main__":
  assert len(jax.devices()) == 4, jax.devices()
  what = sys.argv[1]
  if what == "update":
    res = {d: update_params(d, int(sys.argv[2])) for d in (1, 4)}
  else:
    res = {d: train_metrics(d) for d in (1, 4)}
  print("RESULT " + json.dumps(res))
