"""GARNet speed and memory: decision latency and PPO update time vs history size.

  python benchmarks/bench_garnet.py [--sizes=1000,10000,100000] [--mem_proj=128]

Prints, per history size: policy decision latency (one observation; and per observation in a
batch of 64), the time to refresh the history hub sums after an update, the 32-transition PPO
update time (4 epochs x 1 minibatch, history encoded once per minibatch), peak RSS, and how many
times each jitted function was compiled. Decisions read incrementally kept per-hub sums, so their
cost does not grow with the history.
"""
import resource
import sys
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from experiments.configs import default
from gp_jax import system as system_lib
from gp_jax.graph import history as history_lib
from gp_jax.rl import ppo
from gp_jax.rl import rollout
from gp_jax.rl import train as train_lib

_SIZES = flags.DEFINE_list("sizes", ["1000", "10000", "100000"], "History sizes (rows).")
_PROJ = flags.DEFINE_integer("mem_proj", 128, "Memory-row text projection (0 = none).")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed repeats (the minimum is printed).")


def rss_gib() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20


def timed(fn, repeats):
  fn()   # warm-up / compile
  ts = []
  for _ in range(repeats):
    t = time.perf_counter()
    fn()
    ts.append(time.perf_counter() - t)
  return min(ts)


def main(argv):
  del argv
  c = default.get_config()
  c.data.n_train, c.data.n_test = 8, 8
  c.model.mem_proj = _PROJ.value
  sysm = system_lib.build(c)
  spec = sysm.featurizer.spec
  A = sysm.space.size
  model = train_lib.make_model(c)
  opt = ppo.make_optimizer(learning_rate=3e-4, value_lr_multiplier=2.0, max_grad_norm=0.5)
  state0 = train_lib.init_state(model, sysm.featurizer, opt, 0)
  traces = {"act": 0, "update": 0}
  T = 32
  upd = ppo.make_update_fn(model, opt, epochs=4, num_minibatches=1, clip_eps=0.2, value_coef=0.5,
                           entropy_coef=0.01, num_chunks=T + 1)
  hub = jnp.asarray(sysm.featurizer.hub_features)
  rng = np.random.default_rng(0)
  print(f"A={A} actions, row width F={spec.row_dim} (mem_proj={_PROJ.value}), hidden={c.model.hidden}, "
        f"devices={jax.devices()}")
  print(f"{'rows':>8} {'bucket':>8} {'decide1 ms':>10} {'decide64 ms/obs':>15} {'refresh s':>9} "
        f"{'update32 s':>10} {'peak GiB':>8} {'compiles act/rows/update':>24}")

  def obs_batch(T):
    return dict(task=rng.normal(size=(T, spec.text_dim)).astype(np.float32),
                query=rng.normal(size=(T, spec.text_dim)).astype(np.float32),
                state=rng.normal(size=(T, spec.state_dim)).astype(np.float32),
                rows=rng.normal(size=(T, spec.max_rows, spec.row_dim)).astype(np.float32),
                row_hub=rng.integers(0, A, (T, spec.max_rows)).astype(np.int32),
                row_valid=np.ones((T, spec.max_rows), bool), mask=np.ones((T, A), bool))

  for n in [int(s) for s in _SIZES.value]:
    hist = history_lib.HistoryMemory(spec.row_dim, A, capacity=n)
    hist.add(rng.normal(size=(n, spec.row_dim)).astype(np.float32), rng.integers(0, A, n))
    r1 = rollout.PolicyRunner(model, sysm.featurizer.hub_features, 1)
    r64 = rollout.PolicyRunner(model, sysm.featurizer.hub_features, 64)
    refresh = timed(lambda: r1.set_params(state0.params, hist), 1)
    r64.set_params(state0.params, hist)
    o1, o64 = obs_batch(1), obs_batch(64)
    key = jax.random.PRNGKey(0)
    d1 = timed(lambda: r1.act(o1, key, False), _REPEATS.value * 20)
    d64 = timed(lambda: r64.act(o64, key, False), _REPEATS.value)
    inputs = hist.update_inputs(np.sort(rng.integers(0, n + 1, T)), num_chunks=T + 1)
    chunk, count = inputs.pop("chunk"), inputs.pop("count")
    batch = dict(obs=obs_batch(T), actions=rng.integers(0, A, T).astype(np.int32),
                 old_logp=np.full(T, -3.0, np.float32), advantages=rng.normal(size=T).astype(np.float32),
                 returns=rng.normal(size=T).astype(np.float32), weights=np.ones(T, np.float32),
                 hist_chunk=chunk, hist_count=count)
    st = jax.tree_util.tree_map(jnp.array, state0)
    holder = [st]

    def one_update():
      holder[0], m = upd(holder[0], hub, inputs, batch)
      jax.block_until_ready(m)
    u = timed(one_update, _REPEATS.value)
    compiles = (r1._act._cache_size() + r64._act._cache_size(),
                r1._rows_all._cache_size() + r64._rows_all._cache_size(), upd._cache_size())
    print(f"{n:>8} {hist.padded()[0].shape[0]:>8} {d1 * 1e3:>10.3f} {d64 * 1e3 / 64:>15.4f} "
          f"{refresh:>9.3f} {u:>10.3f} {rss_gib():>8.2f} {str(compiles):>24}")
    sys.stdout.flush()


if __name__ == "__main__":
  app.run(main)
