"""The per-key memory share on the real router (in process): a key flooding feedback churns only
its own served rows, the decisions' per-hub sums stay exact, and the memory restarts the same."""
import asyncio

import numpy as np

from experiments.configs import test as test_config
from gp_jax.serving.engine import config as served_config
from gp_jax.serving.engine import session as session_lib
from gp_jax.serving.state import memory as memory_lib

QUERY = "How many moons does Jupiter have?"


def _session(workdir, tmp_path, share=0.25):
  return session_lib.RouterSession(served_config.load_config(workdir, {}), workdir,
                                   max_concurrency=4, memory_path=tmp_path / "memory.npz",
                                   route_log=tmp_path / "routes.jsonl", max_key_share=share)


def test_a_flooding_key_cannot_flush_the_training_history(workdir, tmp_path):
  s = _session(workdir, tmp_path)
  capacity = s.history.capacity
  cap = int(0.25 * capacity)
  training0 = len(s.history)

  async def run():
    for i, key in enumerate(["alice", None, "alice"]):
      c = await s.complete(f"{QUERY} (user {i})")
      await s.feedback(c.record["id"], 1.0, key=key)
      rows_of[key] += len(c.record["calls"])
    flood = 0
    while flood < 2 * capacity:   # twice the whole memory, from one key
      c = await s.complete(f"{QUERY} flood #{flood}")
      await s.feedback(c.record["id"], 1.0, key="mallory")
      flood += len(c.record["calls"])
    return flood

  rows_of = {"alice": 0, None: 0}
  flood = asyncio.run(run())
  per_key = s.memory.per_key()
  assert cap - 10 <= per_key["mallory"] <= cap   # her newest rows, within one request of the cap
  assert per_key["alice"] == rows_of["alice"]   # other keys' rows are all still there
  untouched = int((s.memory.owners == memory_lib.NO_KEY).sum())
  # Without the cap, 2 x capacity flooded rows would have evicted everything else; with it the
  # training history and the keyless feedback are all still there.
  assert training0 + rows_of[None] + rows_of["alice"] + cap <= capacity
  assert untouched == training0 + rows_of[None]
  assert s.memory.served_rows >= flood
  # The decisions' sums followed every eviction (the key's own rows from the middle).
  kept_sum, kept_count = s.runner.hub_sum.copy(), s.runner.hub_count.copy()
  s.runner.set_params(s.params, s.history)
  np.testing.assert_allclose(kept_count, s.runner.hub_count)
  np.testing.assert_allclose(kept_sum, s.runner.hub_sum, rtol=1e-4, atol=1e-4)
  rows, hubs = s.history.rows.copy(), s.history.hubs.copy()
  asyncio.run(s.aclose())
  # A restart holds the same rows with the same keys.
  again = _session(workdir, tmp_path)
  try:
    np.testing.assert_array_equal(again.history.rows, rows)
    np.testing.assert_array_equal(again.history.hubs, hubs)
    assert again.memory.per_key() == per_key
  finally:
    asyncio.run(again.aclose())


def test_without_keys_the_memory_evicts_oldest_first(workdir, tmp_path):
  s = _session(workdir, tmp_path)
  capacity = s.history.capacity

  async def run():
    added = []
    while sum(len(r) for r in added) < capacity:
      c = await s.complete(f"{QUERY} #{len(added)}")
      out = await s.feedback(c.record["id"], 0.5)
      added.append(c.record["calls"])
      assert out["rows_added"] == len(c.record["calls"])
    await s.aclose()
    return sum(len(r) for r in added)

  served = asyncio.run(run())
  assert served >= capacity and len(s.history) == capacity
  assert s.memory.per_key() == {} and (s.memory.owners == memory_lib.NO_KEY).all()
  assert s.memory.served_rows == served
  # Only served rows are left (utility 0.5): the oldest, the training ones, were evicted first.
  utility = s.history.rows[:, 2 * test_config.get_config().model.mem_proj]
  assert np.all(utility == 0.5)


def test_following_the_memory_compiles_nothing_while_serving(workdir, tmp_path):
  # The row transforms are compiled before serving (every size the memory can grow to): a first
  # compile in a feedback or a weight swap would stall the event loop, and every request on it.
  s = _session(workdir, tmp_path, share=None)
  fns = (s.runner._rows_chunk, s.runner._rows_all)
  compiled = [f._cache_size() for f in fns]
  assert min(compiled) >= 1

  async def run():
    served = 0
    while served < 2 * s.history.capacity:   # incremental sums, evictions, full recomputes
      c = await s.complete(f"{QUERY} #{served}")
      await s.feedback(c.record["id"], 1.0)
      served += len(c.record["calls"])
    s._swap(s.params, "v-same")
    await s.aclose()

  asyncio.run(run())
  assert s.counters["swaps"] == 1
  assert [f._cache_size() for f in fns] == compiled
