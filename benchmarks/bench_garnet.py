"""GARNet speed and memory: decision latency and PPO update time vs history size, on a device mesh.

  python benchmarks/bench_garnet.py [--sizes=1000,10000,100000] [--mem_proj=128]
  XLA_FLAGS=--xla_force_host_platform_device_count=4 python benchmarks/bench_garnet.py \
      --sizes=1000000 --devices=4 --skip_decisions      # the update on 4 (forced CPU) devices
  python benchmarks/bench_garnet.py --sizes=10000000 --compile_only   # memory without running

Per history size, minimum and median over --repeats timed calls (after one warm-up call):
  decide1 / decide64: one policy decision (one observation; per observation in a batch of 64);
  refresh: the history hub sums recomputed after an update (sharded over the mesh like the
    learner's encode);
  like-for-like: decide64 per observation + refresh / --decisions_per_update, what one decision
    costs counting its share of the refresh (decisions read incrementally kept sums, so decide
    alone does not grow with the history; the refresh does);
  update32: the PPO update of 32 transitions, 4 epochs x 1 minibatch (the history encoded once per
    minibatch: 4 encodes);
  update_train: the real training layout of the default config, --train_transitions real
    transitions padded to --train_padded slots in 4 epochs x 4 minibatches (16 encodes), up to
    --train_layout_max_rows rows (it is 4x the encodes of update32).
compiles: programs compiled so far by update32 / update_train / the refresh (cumulative over the
sizes: each history bucket compiles once). Memory: per device, from XLA's analysis of the compiled sharded update (arguments + outputs +
temporaries, minus donated aliases), and the process's peak RSS (all forced CPU devices share it).
--compile_only lowers and compiles the update on abstract inputs (no history array is allocated),
to size runs that do not fit this machine.
--official times the released code's network and update (gp_jax/graph/official.py) at the
released code's shapes instead, beside the released PyTorch code when --torch_python and
--official_repo are given (benchmarks/bench_official.py says what each column is).
"""
import dataclasses
import resource
import statistics
import sys
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import bench_official
from experiments.configs import default
from gp_jax.graph import history as history_lib
from gp_jax.rl import batch as batch_lib
from gp_jax.rl import parallel
from gp_jax.rl import ppo
from gp_jax.rl import rollout
from gp_jax.rl import loop as loop_lib
from gp_jax.runs import system as system_lib
from gp_jax.runs import train as training

_SIZES = flags.DEFINE_list("sizes", ["1000", "10000", "100000"], "History sizes (rows).")
_PROJ = flags.DEFINE_integer("mem_proj", 128, "Memory-row text projection (0 = none).")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed repeats (minimum and median printed).")
_DEVICES = flags.DEFINE_integer("devices", 0, "Mesh size (0 = all devices).")
_DECISIONS = flags.DEFINE_integer("decisions_per_update", 220,
                                  "Decisions per PPO update (default config: ~220 transitions).")
_TRAIN_N = flags.DEFINE_integer("train_transitions", 220, "Real transitions of update_train.")
_TRAIN_PAD = flags.DEFINE_integer("train_padded", 640,
                                  "Padded slots of update_train (640 fixed padding; 256 bucket).")
_TRAIN_MAX = flags.DEFINE_integer("train_layout_max_rows", 100_000,
                                  "Largest history timed with the training layout.")
_SKIP_DECIDE = flags.DEFINE_bool("skip_decisions", False, "Time only the updates.")
_OFFICIAL = flags.DEFINE_bool("official", False,
                              "Time the released code's math (bench_official.py) instead.")
_TORCH_PY = flags.DEFINE_string("torch_python", "",
                                "--official: a python with torch (scripts/setup_torch_ref.sh).")
_REPO = flags.DEFINE_string("official_repo", "", "--official: a checkout of the authors' code.")
_TORCH_THREADS = flags.DEFINE_integer("torch_threads", 0,
                                      "--official: the released code's torch threads (0: default).")
_TORCH_CAP = flags.DEFINE_float("torch_cap_s", 600.0,
                                "--official: longest one released-code measurement may take (s).")
_COMPILE_ONLY = flags.DEFINE_bool("compile_only", False,
                                  "Only compile the update32 on abstract inputs; print memory.")


def rss_gib() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20


def timed(fn, repeats):
  """(minimum, median) seconds of `repeats` calls after one warm-up call."""
  fn()
  ts = []
  for _ in range(repeats):
    t = time.perf_counter()
    fn()
    ts.append(time.perf_counter() - t)
  return min(ts), statistics.median(ts)


def device_gib(compiled) -> float:
  """Per-device bytes of a compiled program (XLA's memory analysis), GiB."""
  m = compiled.memory_analysis()
  if m is None:
    return float("nan")
  total = (m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
           - m.alias_size_in_bytes)
  return total / 2 ** 30


def fmt(pair, scale=1.0, digits=3):
  return f"{pair[0] * scale:.{digits}f}/{pair[1] * scale:.{digits}f}"


def main(argv):
  del argv
  if _OFFICIAL.value:
    bench_official.report([int(s) for s in _SIZES.value], _REPEATS.value, _TORCH_PY.value,
                          _REPO.value, threads=_TORCH_THREADS.value, cap_s=_TORCH_CAP.value,
                          decisions_per_update=_DECISIONS.value)
    return
  c = default.get_config()
  c.data.n_train, c.data.n_test = 8, 8
  c.model.mem_proj = _PROJ.value
  sysm = system_lib.build(c)
  spec = sysm.featurizer.spec
  A = sysm.space.size
  model = training.make_model(c)
  settings = ppo.PPOSettings(learning_rate=3e-4, epochs=4, num_minibatches=1, clip_eps=0.2,
                             gamma=0.99, gae_lambda=0.95, value_coef=0.5, entropy_coef=0.01,
                             max_grad_norm=0.5, value_lr_multiplier=2.0)
  opt = ppo.make_optimizer(settings)
  state0 = loop_lib.init_state(model, sysm.featurizer, opt, 0)
  mesh = parallel.make_mesh(_DEVICES.value)
  local_mesh = parallel.make_mesh(_DEVICES.value, local=True)
  T = 32
  upd = ppo.make_update_fn(model, opt, settings, mesh=mesh)
  upd_train = ppo.make_update_fn(model, opt, dataclasses.replace(settings, num_minibatches=4),
                                 mesh=mesh)
  hub = jnp.asarray(sysm.featurizer.hub_features)
  rng = np.random.default_rng(0)
  print(f"A={A} actions, row width F={spec.row_dim} (mem_proj={_PROJ.value}), hidden={c.model.hidden}, "
        f"mesh of {mesh.size} {jax.devices()[0].platform} devices; times in s (ms where marked), "
        f"min/median of {_REPEATS.value}")
  print(f"{'rows':>9} {'bucket':>9} {'decide1 ms':>13} {'decide64 ms/obs':>15} {'refresh':>13} "
        f"{'like-for-like ms':>16} {'update32':>13} {'update_train':>13} {'GiB/dev':>7} "
        f"{'peak RSS':>8} {'compiles':>9}")

  def obs_batch(T):
    return dict(task=rng.normal(size=(T, spec.text_dim)).astype(np.float32),
                query=rng.normal(size=(T, spec.text_dim)).astype(np.float32),
                state=rng.normal(size=(T, spec.state_dim)).astype(np.float32),
                rows=rng.normal(size=(T, spec.max_rows, spec.row_dim)).astype(np.float32),
                row_hub=rng.integers(0, A, (T, spec.max_rows)).astype(np.int32),
                row_valid=np.ones((T, spec.max_rows), bool), mask=np.ones((T, A), bool))

  def make_batch(N, real, num_chunks, n, hist):
    """N slots (real of them transitions) reading snapshots of an n-row history."""
    inputs = hist.update_inputs(np.sort(rng.integers(0, n + 1, real)), num_chunks=num_chunks)
    chunk, count = inputs.pop("chunk"), inputs.pop("count")
    transitions = dict(obs=obs_batch(real), actions=rng.integers(0, A, real).astype(np.int32),
                       old_logp=np.full(real, -3.0, np.float32), hist_chunk=chunk,
                       hist_count=count)
    # one-step episodes with random rewards and values: GAE gives A = r - V
    batch = batch_lib.build(transitions, rng.normal(size=(real, 1)), rng.normal(size=(real, 1)),
                            size=N, num_episodes=real, num_steps=1)
    return inputs, batch

  def time_update(fn, inputs, batch):
    holder = [jax.tree_util.tree_map(jnp.array, state0)]

    def one():
      holder[0], m = fn(holder[0], hub, inputs, batch)
      jax.block_until_ready(m)
    return timed(one, _REPEATS.value)

  for n in [int(s) for s in _SIZES.value]:
    if _COMPILE_ONLY.value:
      H = history_lib.bucket(n, n)
      empty = history_lib.HistoryMemory(spec.row_dim, A, capacity=0)
      batch = make_batch(T, T, T + 1, 0, empty)[1]
      hist = dict(rows=jax.ShapeDtypeStruct((H, spec.row_dim), jnp.float32),
                  segment=jax.ShapeDtypeStruct((H,), jnp.int32))
      t = time.perf_counter()
      mem = update_gib(upd, mesh, state0, hub, hist, batch)
      print(f"{n:>9} {H:>9} update32 compiled in {time.perf_counter() - t:.1f}s: {mem:.2f} GiB "
            f"per device (XLA memory analysis, {mesh.size} devices)")
      continue
    hist = history_lib.HistoryMemory(spec.row_dim, A, capacity=n)
    hist.add(rng.normal(size=(n, spec.row_dim)).astype(np.float32), rng.integers(0, A, n))
    d1 = d64 = refresh = (float("nan"),) * 2
    r1 = r64 = None
    if not _SKIP_DECIDE.value:
      r1 = rollout.PolicyRunner(model, sysm.featurizer.hub_features, 1, mesh=local_mesh)
      r64 = rollout.PolicyRunner(model, sysm.featurizer.hub_features, 64, mesh=local_mesh)
      refresh = timed(lambda: r1.set_params(state0.params, hist), max(1, _REPEATS.value // 2))
      r64.set_params(state0.params, hist)
      o1, o64 = obs_batch(1), obs_batch(64)
      key = jax.random.PRNGKey(0)
      d1 = timed(lambda: r1.act(o1, key, False), _REPEATS.value * 20)
      d64 = timed(lambda: r64.act(o64, key, False), _REPEATS.value)
    like = tuple(d / 64 + r / _DECISIONS.value for d, r in zip(d64, refresh))
    inputs, batch = make_batch(T, T, T + 1, n, hist)
    u = time_update(upd, inputs, batch)
    mem = update_gib(upd, mesh, state0, hub, inputs, batch)
    ut = (float("nan"),) * 2
    if n <= _TRAIN_MAX.value:
      N = _TRAIN_PAD.value
      inputs_t, batch_t = make_batch(N, min(_TRAIN_N.value, N), N + 1, n, hist)
      ut = time_update(upd_train, inputs_t, batch_t)
    compiles = (ppo.compile_count(upd), ppo.compile_count(upd_train),
                0 if r1 is None else r1._rows_all._cache_size() + r64._rows_all._cache_size())
    print(f"{n:>9} {hist.padded()[0].shape[0]:>9} {fmt(d1, 1e3):>13} {fmt(d64, 1e3 / 64, 4):>15} "
          f"{fmt(refresh):>13} {fmt(like, 1e3, 4):>16} {fmt(u):>13} {fmt(ut):>13} {mem:>7.2f} "
          f"{rss_gib():>8.2f} {str(compiles):>9}")
    sys.stdout.flush()


def update_gib(update, mesh, state, hub, hist, batch) -> float:
  """Per-device GiB of the update compiled for these shapes (abstract: nothing is allocated),
  with the shardings the sharded update gives its inputs (history rows padded like it pads)."""
  sharded = parallel.is_sharded(mesh)
  rows_s = parallel.rows_sharding(mesh) if sharded else None
  rep = parallel.replicated(mesh) if sharded else None

  def spec(x, sharding):
    return jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=sharding)
  hist = dict(hist)
  if sharded:
    H = hist["rows"].shape[0] + (-hist["rows"].shape[0] % mesh.size)
    hist = dict(rows=jax.ShapeDtypeStruct((H, hist["rows"].shape[1]), jnp.float32),
                segment=jax.ShapeDtypeStruct((H,), jnp.int32))
  args = (jax.tree_util.tree_map(lambda x: spec(jnp.asarray(x), rep), state), spec(hub, rep),
          {k: spec(v, rows_s) for k, v in hist.items()},
          batch.replace(transitions=jax.tree_util.tree_map(lambda x: spec(x, rows_s),
                                                           batch.transitions),
                        **{k: spec(getattr(batch, k), rep) for k in batch_lib.EPISODE_FIELDS}))
  return device_gib(getattr(update, "jitted", update).lower(*args).compile())


if __name__ == "__main__":
  app.run(main)
