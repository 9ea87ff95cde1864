"""The memory predictor (model.memory_predictor): its examples are the history rows, each read
against the statistics of its hub's earlier rows; its prediction enters the logits as kappa x P(s_a)
with no policy gradient; its regression loss teaches it what the statistics say."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from gp_jax.graph import garnet as garnet_lib
from gp_jax.graph import history as history_lib
from gp_jax.rl import ppo

F = 7   # [s (2) ; o (2) ; U ; C ; failed]


def _rows(rng, n):
  r = rng.normal(size=(n, F)).astype(np.float32)
  r[:, -3] = rng.uniform(size=n)
  r[:, -2] = rng.uniform(0, 2, size=n)
  r[:, -1] = rng.uniform(size=n) < 0.3
  return r


def _obs(rng, A, D=8, M=3):
  return dict(task=rng.normal(size=D).astype(np.float32),
              query=rng.normal(size=D).astype(np.float32),
              state=rng.normal(size=D + 2).astype(np.float32), rows=np.zeros((M, F), np.float32),
              row_hub=np.full(M, A, np.int32), row_valid=np.zeros(M, bool),
              mask=np.ones(A, bool),
              hub_stats=rng.uniform(size=(A, history_lib.STAT_DIM)).astype(np.float32))


def test_each_rows_example_reads_the_statistics_of_its_hubs_earlier_rows():
  rng = np.random.default_rng(0)
  A, n = 4, 50
  rows = _rows(rng, n)
  hubs = rng.integers(0, A + 1, n)   # some rows of the padding hub A: no example
  pairs = history_lib.predictor_pairs(rows, hubs, A, size=64)
  assert rows[(hubs < A) & (rows[:, -1] == 1)].size   # failed rows are exercised
  assert pairs["pred_stats"].shape == (64, history_lib.STAT_DIM)
  for i in range(n):
    if hubs[i] == A:
      assert pairs["pred_weight"][i] == 0
      continue
    before = history_lib.HubStats.of(rows[:i], hubs[:i], A).table()[hubs[i]]
    np.testing.assert_allclose(pairs["pred_stats"][i], before, rtol=1e-5, atol=1e-6)
    assert pairs["pred_weight"][i] == (rows[i, -1] == 0)    # failed rows are no examples
    assert pairs["pred_target"][i] == pytest.approx(rows[i, -3], abs=1e-6)
  assert np.all(pairs["pred_weight"][n:] == 0)
  # a hub's first row has no evidence: the statistics of an empty hub
  first = [int(np.flatnonzero(hubs == a)[0]) for a in range(A) if np.any(hubs == a)]
  np.testing.assert_array_equal(pairs["pred_stats"][first],
                                history_lib.HubStats(A).table()[:len(first)])
  with pytest.raises(ValueError, match="padded size"):
    history_lib.predictor_pairs(rows, hubs, A, size=n - 1)


def test_the_logits_get_kappa_times_the_prediction_and_no_policy_gradient_reaches_it():
  rng = np.random.default_rng(1)
  A, D, kappa, alpha = 5, 8, 3.0, 0.5
  with_pred = garnet_lib.GARNet(hidden=8, num_layers=1, mlp_hidden=8, row_layout=2,
                                memory_predictor=True, predictor_scale=kappa,
                                predictor_alpha=alpha)
  without = garnet_lib.GARNet(hidden=8, num_layers=1, mlp_hidden=8, row_layout=2)
  hf = jnp.asarray(rng.normal(size=(A, 2 * D)).astype(np.float32))
  obs = _obs(rng, A, D)
  params = with_pred.init(jax.random.PRNGKey(0), hf, jnp.zeros((2, F)), obs)["params"]
  shared = {k: v for k, v in params.items() if not k.startswith("pred_")}
  assert set(params) - set(shared) == {"pred_hidden", "pred_out"}

  def logits(model, p):
    h = model.apply({"params": p}, hf, jnp.zeros((A, 8)), jnp.ones(A), method=model.history_hubs)
    return model.apply({"params": p}, h, obs, method=model.policy)
  def apply(method):
    return np.asarray(with_pred.apply({"params": params}, jnp.asarray(obs["hub_stats"]),
                                      method=method))
  pred = apply(with_pred.predict_reward)
  assert pred.shape == (A,) and np.ptp(pred) > 0
  # the predicted reward: (1 - 2 x failure rate) x predicted utility - alpha x mean cost
  cost = np.expm1(obs["hub_stats"][:, history_lib.STAT_NAMES.index("cost")])
  fail = obs["hub_stats"][:, history_lib.STAT_NAMES.index("failure")]
  np.testing.assert_allclose(pred, (1 - 2 * fail) * apply(with_pred.predict_utility) - alpha * cost,
                             rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(logits(with_pred, params) - logits(without, shared)),
                             kappa * pred, rtol=1e-5, atol=1e-5)
  grads = jax.grad(lambda p: jax.nn.log_softmax(logits(with_pred, p))[2])(params)
  for name in ("pred_hidden", "pred_out"):
    assert all(float(jnp.abs(g).max()) == 0.0 for g in jax.tree_util.tree_leaves(grads[name]))
  assert float(jnp.abs(grads["policy_mlp"]["Dense_0"]["kernel"]).max()) > 0


def test_the_regression_learns_answered_utility_and_failures_can_only_lower_the_reward():
  """Hubs 0-2 answer (utility ~0.8); hub 3 answers half its calls with utility ~0.2 and fails the
  other half: trained on the history's answered rows, the predictor gives each its answered
  utility, and hub 3's failure rate lowers its predicted reward further."""
  rng = np.random.default_rng(2)
  A, n = 4, 400
  hubs = rng.integers(0, A, n)
  rows = _rows(rng, n)
  bad = hubs == 3
  failed = bad & (rng.uniform(size=n) < 0.5)
  rows[:, -3] = np.where(bad, 0.2, 0.8) + 0.05 * rng.normal(size=n)
  rows[failed, -3] = 0.0
  rows[:, -1] = failed
  rows[:, -2] = 1.0
  model = garnet_lib.GARNet(hidden=16, num_layers=1, mlp_hidden=8, row_layout=2,
                            memory_predictor=True, predictor_scale=1.0, predictor_alpha=0.1)
  hf = jnp.zeros((A, 16))
  params = model.init(jax.random.PRNGKey(0), hf, jnp.zeros((2, F)), _obs(rng, A))["params"]
  hist = {k: jnp.asarray(v) for k, v in
          history_lib.predictor_pairs(rows, hubs, A, size=512).items()}
  opt = optax.adam(1e-2)
  state = opt.init(params)

  @jax.jit
  def step(params, state):
    (loss, _), g = jax.value_and_grad(lambda p: ppo.predictor_loss(model, p, hist),
                                      has_aux=True)(params)
    updates, state = opt.update(g, state, params)
    return optax.apply_updates(params, updates), state, loss
  first = None
  for _ in range(300):
    params, state, loss = step(params, state)
    first = float(loss) if first is None else first
  assert float(loss) < 0.2 * first
  table = history_lib.HubStats.of(rows, hubs, A).table()
  def apply(method, stats):
    return np.asarray(model.apply({"params": params}, jnp.asarray(stats), method=method))
  utility = apply(model.predict_utility, table)
  np.testing.assert_allclose(utility, [0.8, 0.8, 0.8, 0.2], atol=0.1)   # answered calls only
  f = table[3, history_lib.STAT_NAMES.index("failure")]
  assert 0.2 < f < 0.8
  pred = apply(model.predict_reward, table)
  assert pred[3] == pytest.approx((1 - 2 * f) * utility[3] - 0.1, abs=1e-5)
  assert np.all(pred[:3] > pred[3] + 0.5)
  # a higher failure rate, all else equal, lowers the predicted reward: U does not read it
  worse = table.copy()
  worse[:, history_lib.STAT_NAMES.index("failure")] = 1.0
  np.testing.assert_array_equal(apply(model.predict_utility, worse), utility)
  assert np.all(apply(model.predict_reward, worse) < pred)


def test_the_memory_predictor_needs_row_layout_2():
  rng = np.random.default_rng(0)
  obs = _obs(rng, 3)
  with pytest.raises(ValueError, match="memory_predictor reads the per-hub statistics"):
    garnet_lib.GARNet(hidden=8, memory_predictor=True).init(
        jax.random.PRNGKey(0), jnp.zeros((3, 16)), jnp.zeros((2, F)), obs)
