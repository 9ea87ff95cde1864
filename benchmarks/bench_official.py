"""The released GraphPlanner network's math in gp_jax, timed at the released code's shapes, beside
the released PyTorch code itself when it is at hand (`bench_garnet.py --official`).

Shapes (train.py builds RouteAgent(embed_dim=768, hidden_dim=32); route_env.py's memory rows):
768-d query and state rows, 1536-d LLM rows ([role ; LLM]), 1538-d memory rows, hidden 32,
A = 3 roles x --official_llms LLMs, --official_queries rows in the query table, --official_local
workflow rows. Per history size H (rows, padded to a power of two):
  decide: one decision (policy probabilities and value of one observation) on a history encoded
    before (the history part of both networks does not depend on the observation, so it is encoded
    once per snapshot of the history);
  encode: that encoding of the history (both networks), once per snapshot;
  decide+encode: one decision computing everything, as the released select_action does;
  like-for-like: decide + encode / --decisions_per_update (the history is encoded again only when
    the weights or the rows change: once per PPO update with gp_jax's training cadence, about 220
    decisions per update in the default config);
  update32: the released update on 32 transitions, 1 epoch x 1 minibatch of 32 (the settings
    train.py builds: k_epochs 1, batch 32);
  GiB: XLA's memory analysis of the compiled update (arguments + outputs + temporaries).
With --torch_python (a python with torch, scripts/setup_torch_ref.sh) and --official_repo (a
checkout of the authors' repository), benchmarks/bench_official_torch.py times the released code
on the same shapes in a subprocess, and the ratios released / gp_jax are printed: the released
select_action over gp_jax's decide+encode, like-for-like and decide; the released update over
update32.
"""
import json
import pathlib
import subprocess
import time

import jax
import jax.numpy as jnp
import numpy as np

from gp_jax.graph import official
from gp_jax.rl import official_ppo
from gp_jax.util import buckets

HERE = pathlib.Path(__file__).resolve().parent


def _memory(rng, n, d, Q, A, valid_rows):
  rows = rng.normal(size=(n, 2 * d + 2)).astype(np.float32) * 0.5
  return official.Memory(jnp.asarray(rows), jnp.asarray(rng.integers(0, Q, n), jnp.int32),
                         jnp.asarray(rng.integers(0, A, n), jnp.int32),
                         jnp.asarray(np.arange(n) < valid_rows))


def _obs(rng, n, d, Q, A, L):
  local = _memory(rng, n * L, d, Q, A, n * L)
  local = jax.tree_util.tree_map(lambda x: x.reshape((n, L) + x.shape[1:]), local)
  his_index = np.stack([rng.integers(0, Q, n), rng.integers(0, 11, n)], 1)
  return official.Observation(local, jnp.asarray(rng.normal(size=(n, d)), jnp.float32),
                              jnp.asarray(his_index, jnp.int32), jnp.ones((n, A), jnp.float32))


def _timed(fn, repeats):
  jax.block_until_ready(fn())
  ts = []
  for _ in range(repeats):
    t = time.perf_counter()
    jax.block_until_ready(fn())
    ts.append(time.perf_counter() - t)
  return float(np.median(ts))


def _gib(compiled):
  m = compiled.memory_analysis()
  if m is None:
    return float("nan")
  return (m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
          - m.alias_size_in_bytes) / 2 ** 30


def time_ours(sizes, repeats, d=768, hidden=32, llms=9, queries=1000, local=8):
  """One result dict per history size (seconds, GiB)."""
  rng = np.random.default_rng(0)
  A = 3 * llms
  nets = official.networks(hidden)
  query = jnp.asarray(rng.normal(size=(queries, d)), jnp.float32)
  llm = jnp.asarray(rng.normal(size=(A, 2 * d)), jnp.float32)
  one = _obs(rng, 1, d, queries, A, local)
  obs32 = _obs(rng, 32, d, queries, A, local)
  first = jax.tree_util.tree_map(lambda x: x[0], one)
  settings = official_ppo.Settings(batch_size=32)
  encode = jax.jit(official.history_encoding, static_argnums=0)
  decide = jax.jit(official.decide_batch, static_argnums=0)
  full = jax.jit(official.forward, static_argnums=0)
  out = []
  for H in sizes:
    n = buckets.bucket(H, buckets.powers_of_two(H))
    hist = _memory(rng, n, d, queries, A, H)
    params = official.init(nets, jax.random.PRNGKey(0), query, llm, hist, first)
    enc = encode(nets, params, query, llm, hist)
    buffer = official_ppo.Buffer(obs32, jnp.zeros(32, jnp.int32), jnp.ones(32), jnp.full(32, -3.0),
                                 jnp.zeros(32), jnp.zeros(32))
    index, weight = official_ppo.minibatch_plan(np.arange(32)[None], 32)
    opt = official_ppo.init_opt_state(settings, params)
    args = (nets, settings, params, opt, query, llm, hist, buffer, jnp.asarray(index),
            jnp.asarray(weight))
    compiled = official_ppo.update.lower(*args).compile()
    out.append({
        "history_rows": H, "bucket": n,
        "decide": _timed(lambda: decide(nets, params, query, enc, one), repeats),
        "encode": _timed(lambda: encode(nets, params, query, llm, hist), repeats),
        "decide_encode": _timed(lambda: full(nets, params, query, llm, hist, one), repeats),
        "update32": _timed(lambda: official_ppo.update(*args)[2], repeats),
        "gib": _gib(compiled)})
  return out


def time_released(torch_python, repo, sizes, repeats, llms, queries, local, timeout, threads=0,
                  cap_s=600):
  """The released code's timings (bench_official_torch.py's JSON), or None with a reason."""
  cmd = [torch_python, str(HERE / "bench_official_torch.py"), f"--repo={repo}",
         f"--num_llms={llms}", f"--num_queries={queries}", f"--local_rows={local}",
         f"--history_rows={','.join(map(str, sizes))}", f"--repeats={repeats}",
         f"--threads={threads}", f"--cap_s={cap_s}"]
  try:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
  except subprocess.TimeoutExpired:
    return None, f"the released code's timing took over {timeout} s"
  if done.returncode != 0:
    return None, f"the released code's timing failed: {done.stderr.strip().splitlines()[-1:]}"
  return json.loads(done.stdout.strip().splitlines()[-1]), ""


def report(sizes, repeats, torch_python="", repo="", llms=9, queries=1000, local=8, timeout=3600,
           threads=0, cap_s=600, decisions_per_update=220):
  ours = time_ours(sizes, repeats, llms=llms, queries=queries, local=local)
  theirs, why = (time_released(torch_python, repo, sizes, repeats, llms, queries, local, timeout,
                               threads, cap_s)
                 if torch_python and repo else (None, "no --torch_python/--official_repo"))
  print(f"released math at its shapes: d=768, hidden 32, A={3 * llms}, {queries} queries, "
        f"{local} workflow rows; {jax.devices()[0].platform} ({jax.device_count()} device(s)); "
        f"median of {repeats}, ms")
  by_h = {r["history_rows"]: r for r in (theirs or {}).get("results", [])}
  head = (f"{'H':>7} {'decide':>8} {'encode':>8} {'dec+enc':>8} {'like4like':>9} {'update32':>9} "
          f"{'GiB':>6}")
  if theirs:
    head += (f" | {'released dec':>12} {'released upd':>12} {'x dec+enc':>9} {'x like4l':>9} "
             f"{'x decide':>9} {'x update':>9}")
  print(head)
  for r in ours:
    r["like_for_like"] = r["decide"] + r["encode"] / decisions_per_update
    line = (f"{r['history_rows']:>7} {r['decide'] * 1e3:8.2f} {r['encode'] * 1e3:8.2f} "
            f"{r['decide_encode'] * 1e3:8.2f} {r['like_for_like'] * 1e3:9.2f} "
            f"{r['update32'] * 1e3:9.2f} {r['gib']:6.3f}")
    t = by_h.get(r["history_rows"])
    if theirs and t:
      dec, upd = t.get("decision_ms"), t.get("update_ms")
      line += (f" | {_ms(dec):>12} {_ms(upd):>12} {_ratio(dec, r['decide_encode']):>9} "
               f"{_ratio(dec, r['like_for_like']):>9} {_ratio(dec, r['decide']):>9} "
               f"{_ratio(upd, r['update32']):>9}")
      if t.get("note"):
        line += f"  ({t['note']})"
    print(line)
  if theirs:
    print(f"released code: torch {theirs.get('torch')}, {theirs.get('threads')} threads")
  else:
    print(f"released code not timed: {why}")
  return ours, theirs


def _ms(v):
  return "-" if v is None else f"{v:.1f}"


def _ratio(theirs_ms, ours_s):
  return "-" if theirs_ms is None else f"{theirs_ms / (ours_s * 1e3):.0f}x"
