"""Row layout 2: per-call credit, per-hub statistics, and that both reach the logits."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from gp_jax.graph import features as features_lib
from gp_jax.graph import garnet as garnet_lib
from gp_jax.graph import history as history_lib

F = 7   # [s (2) ; o (2) ; U ; C ; failed]


def _rows(rng, n, failed=None):
  r = rng.normal(size=(n, F)).astype(np.float32)
  r[:, -3] = rng.uniform(size=n)
  r[:, -2] = rng.uniform(0, 2, size=n)
  r[:, -1] = rng.uniform(size=n) < 0.3 if failed is None else failed
  return r


def test_call_credit_sums_to_the_episode_utility_and_failed_calls_get_nothing():
  c = features_lib.call_credit([False, True, False, False], 0.9)
  assert c.shape == (4, 1)
  np.testing.assert_allclose(c[:, 0], [0.3, 0.0, 0.3, 0.3], rtol=1e-6)
  assert c.sum() == pytest.approx(0.9)
  # every call failed: no answer, utility 0, credits 0
  np.testing.assert_array_equal(features_lib.call_credit([True, True], 0.0)[:, 0], [0.0, 0.0])
  rng = np.random.default_rng(0)
  for _ in range(20):
    n = int(rng.integers(1, 9))
    failed = rng.uniform(size=n) < 0.4
    u = float(rng.uniform())
    credit = features_lib.call_credit(failed, u)[:, 0]
    assert np.all(credit[failed] == 0)
    assert credit.sum() == pytest.approx(u if not failed.all() else 0.0, abs=1e-6)


def _reference(rows, hubs, A, d):
  """Direct definition: weights d ** (later rows of the same hub)."""
  out = np.zeros((A, history_lib.STAT_DIM))
  for a in range(A):
    r = rows[hubs == a]
    n = len(r)
    out[a, 0] = n / (n + history_lib.CONFIDENCE_ROWS)
    out[a, 1] = float(n == 0)
    if n:
      w = d ** np.arange(n - 1, -1, -1)
      out[a, 2] = (w * r[:, -3]).sum() / w.sum()
      out[a, 3] = np.log1p((w * r[:, -2]).sum() / w.sum())
      out[a, 4] = (w * r[:, -1]).sum() / w.sum()
  return out


def test_hub_stats_incremental_equal_the_definition_through_adds_and_evictions():
  rng = np.random.default_rng(1)
  A = 5
  rows = _rows(rng, 300)
  hubs = rng.integers(0, A, 300)
  hubs[hubs == 4] = 3          # hub 4 stays empty
  s = history_lib.HubStats(A)
  for lo in range(0, 300, 37):   # join in chunks
    s.add(rows[lo:lo + 37], hubs[lo:lo + 37])
  np.testing.assert_allclose(s.table(), _reference(rows, hubs, A, history_lib.RECENCY),
                             rtol=1e-5, atol=1e-6)
  s.remove(rows[:120], hubs[:120])   # the oldest rows leave
  np.testing.assert_allclose(s.table(), _reference(rows[120:], hubs[120:], A,
                                                   history_lib.RECENCY), rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(
      s.table(), history_lib.HubStats.of(rows[120:], hubs[120:], A).table(), rtol=1e-4, atol=1e-5)
  t = s.table()
  assert t[4, 1] == 1 and t[4, 0] == 0       # empty hub: flagged, no confidence
  assert (t[:4, 1] == 0).all() and (t[:4, 0] > 0).all()
  # padding rows (hub id A) are ignored
  s2 = history_lib.HubStats.of(np.concatenate([rows[:10], rows[:3]]),
                               np.concatenate([hubs[:10], np.full(3, A)]), A)
  np.testing.assert_allclose(s2.table(), history_lib.HubStats.of(rows[:10], hubs[:10], A).table())
  s.remove(rows[120:], hubs[120:])
  assert (s.table()[:, 1] == 1).all() and (s.sums == 0).all()


def test_an_empty_hub_differs_from_a_bad_one():
  rng = np.random.default_rng(2)
  bad = _rows(rng, 4, failed=np.ones(4))
  bad[:, -3] = 0
  t = history_lib.HubStats.of(bad, np.zeros(4, int), 2).table()
  assert not np.allclose(t[0], t[1])          # hub 1 is empty, hub 0 failed 4 times
  assert t[0, 4] == pytest.approx(1.0) and t[1, 4] == 0 and t[1, 1] == 1 and t[0, 1] == 0


def _obs(rng, A, D=8, M=3):
  return dict(task=rng.normal(size=D).astype(np.float32), query=rng.normal(size=D).astype(np.float32),
              state=rng.normal(size=D + 2).astype(np.float32), rows=np.zeros((M, F), np.float32),
              row_hub=np.full(M, A, np.int32), row_valid=np.zeros(M, bool),
              mask=np.ones(A, bool))


@pytest.mark.parametrize("memory_bias", [False, True])
def test_failed_flag_and_hub_statistics_reach_the_decision_of_a_trained_toy_router(memory_bias):
  """A toy layout-2 router is trained (policy cross-entropy) to pick the hub with the best
  recent record; rows with the failed flag set, turned into statistics, then move its choice."""
  rng = np.random.default_rng(3)
  A, D = 4, 8
  model = garnet_lib.GARNet(hidden=16, num_layers=1, mlp_hidden=16, row_layout=2,
                            memory_bias=memory_bias)
  hub_features = jnp.asarray(rng.normal(size=(A, 2 * D)).astype(np.float32))
  zero_sum, ones = jnp.zeros((A, 16)), jnp.ones(A)
  obs0 = _obs(rng, A, D)
  params = model.init(jax.random.PRNGKey(0), hub_features, jnp.zeros((2, F)), obs0)["params"]

  def stats_of(fail_rate, util):
    n = 20
    rows, hubs = [], []
    for a in range(A):
      r = np.zeros((n, F), np.float32)
      r[:, -1] = np.arange(n) < round(fail_rate[a] * n)
      r[:, -3] = np.where(r[:, -1] > 0, 0.0, util[a])
      rows.append(r)
      hubs.append(np.full(n, a))
    return history_lib.HubStats.of(np.concatenate(rows), np.concatenate(hubs), A).table()

  def sample(n):
    fails = rng.uniform(size=(n, A)) < 0.5
    util = rng.uniform(0.3, 1.0, size=(n, A))
    tables = np.stack([stats_of(f.astype(float), u) for f, u in zip(fails, util)])
    score = (1 - fails) * util
    return tables, np.argmax(score, 1)

  tables, labels = sample(256)
  obs = {k: np.broadcast_to(v, (256,) + v.shape) for k, v in obs0.items()}

  def loss(p, st, y):
    def one(o, s):
      h = model.apply({"params": p}, hub_features, zero_sum, ones, method=model.history_hubs)
      return model.apply({"params": p}, h, dict(o, hub_stats=s), method=model.policy)
    lg = jax.vmap(one)(obs, st)
    return optax.softmax_cross_entropy_with_integer_labels(lg, y).mean(), lg

  opt = optax.adam(3e-3)
  state = opt.init(params)

  @jax.jit
  def step(p, s, st, y):
    (l, _), g = jax.value_and_grad(loss, has_aux=True)(p, st, y)
    u, s = opt.update(g, s)
    return optax.apply_updates(p, u), s, l

  for _ in range(400):
    params, state, _ = step(params, state, tables, labels)
  test_tables, test_labels = sample(256)
  _, lg = loss(params, test_tables, test_labels)
  assert float((np.argmax(lg, 1) == test_labels).mean()) > 0.8   # it did learn to read them

  def choice(table):
    _, lg = loss(params, table[None].repeat(256, 0), np.zeros(256, np.int32))
    return int(np.argmax(lg[0]))
  good = stats_of(np.zeros(A), np.array([0.9, 0.5, 0.5, 0.5]))
  assert choice(good) == 0
  failing = stats_of(np.array([1.0, 0.0, 0.0, 0.0]), np.array([0.9, 0.5, 0.5, 0.5]))
  assert choice(failing) != 0                 # hub 0's calls now fail: the router moves off it

  # the value network reads the statistics too
  def value(s):
    return model.apply({"params": params}, hub_features, dict(obs0, hub_stats=s),
                       method=model.value)
  g = jax.grad(value)(jnp.asarray(good))
  assert float(jnp.abs(g).sum()) > 0


def test_a_layout_2_policy_without_hub_statistics_is_an_error():
  rng = np.random.default_rng(4)
  A = 3
  model = garnet_lib.GARNet(hidden=8, num_layers=1, mlp_hidden=8, row_layout=2)
  hf = jnp.asarray(rng.normal(size=(A, 16)).astype(np.float32))
  obs = _obs(rng, A)
  params = model.init(jax.random.PRNGKey(0), hf, jnp.zeros((2, F)), obs)["params"]
  h = model.apply({"params": params}, hf, jnp.zeros((A, 8)), jnp.ones(A), method=model.history_hubs)
  with pytest.raises(ValueError, match="hub_stats"):
    model.apply({"params": params}, h, obs, method=model.policy)


def test_the_memory_bias_reads_each_hubs_own_statistics_and_starts_at_zero():
  rng = np.random.default_rng(5)
  A, D = 5, 8
  with_bias = garnet_lib.GARNet(hidden=8, num_layers=1, mlp_hidden=8, row_layout=2,
                                memory_bias=True)
  without = garnet_lib.GARNet(hidden=8, num_layers=1, mlp_hidden=8, row_layout=2)
  hf = jnp.asarray(rng.normal(size=(A, 2 * D)).astype(np.float32))
  obs = dict(_obs(rng, A, D), hub_stats=rng.uniform(size=(A, history_lib.STAT_DIM))
             .astype(np.float32))
  params = with_bias.init(jax.random.PRNGKey(0), hf, jnp.zeros((2, F)), obs)["params"]
  shared = {k: v for k, v in params.items() if not k.startswith("bias_")}
  assert set(params) - set(shared) == {"bias_hidden", "bias_out"}

  def logits(model, p, o):
    h = model.apply({"params": p}, hf, jnp.zeros((A, 8)), jnp.ones(A), method=model.history_hubs)
    return np.asarray(model.apply({"params": p}, h, o, method=model.policy))

  # initialised to add nothing: the same logits as the model without it, same other weights
  np.testing.assert_array_equal(logits(with_bias, params, obs), logits(without, shared, obs))

  # once trained (here: random output weights), hub a's bias is b(s_a), one function for all hubs
  params = dict(params, bias_out=dict(
      kernel=jnp.asarray(rng.normal(size=(8, 1)).astype(np.float32)), bias=jnp.ones(1)))

  def bias(stats):
    return np.asarray(with_bias.apply({"params": params}, jnp.asarray(stats),
                                      method=with_bias.stats_bias))
  b = bias(obs["hub_stats"])
  assert b.shape == (A,) and np.ptp(b) > 0
  perm = rng.permutation(A)
  np.testing.assert_allclose(bias(obs["hub_stats"][perm]), b[perm], rtol=1e-6)
  changed = obs["hub_stats"].copy()
  changed[2] = 1.0 - changed[2]
  moved = bias(changed) - b
  assert abs(moved[2]) > 0 and np.all(moved[np.arange(A) != 2] == 0)
  np.testing.assert_allclose(logits(with_bias, params, obs) - logits(without, shared, obs), b,
                             rtol=1e-5, atol=1e-6)


def test_the_memory_bias_needs_row_layout_2():
  obs = _obs(np.random.default_rng(0), 3)
  with pytest.raises(ValueError, match="row layout 2"):
    garnet_lib.GARNet(hidden=8, memory_bias=True).init(
        jax.random.PRNGKey(0), jnp.zeros((3, 16)), jnp.zeros((2, F)), obs)
