"""Single-round routers: KNN against a loop reference, constructed trade-offs, simulated data."""
import numpy as np
import pytest

from experiments.configs import test as test_config
from gp_jax import errors
from gp_jax.baselines import labels as labels_lib
from gp_jax.baselines import regressors
from gp_jax.baselines import routerdc
from gp_jax.baselines import single_round
from gp_jax.llm import catalog as catalog_lib
from gp_jax.runs import evaluate as evaluation
from gp_jax.runs import system as system_lib

LEARNED = ["knn", "linear", "mlp"]
ON_SIMULATOR = LEARNED + ["graph", "routerdc"]


def test_knn_matches_loop_reference():
  rng = np.random.default_rng(0)
  tx, x = rng.normal(size=(30, 5)), rng.normal(size=(7, 5))
  tu, tc = rng.uniform(size=(30, 3)), rng.uniform(size=(30, 3))
  u, c = regressors.knn_predict(tx, tu, tc, x, k=4)
  for b in range(len(x)):
    sims = [x[b] @ t / (np.linalg.norm(x[b]) * np.linalg.norm(t)) for t in tx]
    nn = sorted(range(len(tx)), key=lambda i: -sims[i])[:4]
    np.testing.assert_allclose(u[b], tu[nn].mean(0), rtol=1e-5)
    np.testing.assert_allclose(c[b], tc[nn].mean(0), rtol=1e-5)


def test_routerdc_losses_match_loop_reference():
  import jax
  rng = np.random.default_rng(1)
  n, d, m, tau = 6, 4, 4, 0.5
  params = dict(encoder=regressors.init_mlp(jax.random.PRNGKey(0), [d, 5, 3]),
                llm=rng.normal(size=(m, 3)).astype(np.float32))
  x = rng.normal(size=(n, d)).astype(np.float32)
  u = rng.uniform(size=(n, m)).astype(np.float32)
  task = np.array([0, 0, 1, 1, 2, 2])   # pairs: each query's same-task partner is fixed
  _, met = routerdc.dual_contrastive_loss(params, x, u, task, jax.random.PRNGKey(3), tau=tau,
                                          sample_weight=1.0)
  s = np.asarray(routerdc.scores(params, x)) / tau
  ref = []
  for i in range(n):
    order = np.argsort(-u[i])
    pos, neg = s[i, order[0]], s[i, order[m - m // 2:]]
    ref.append(-np.log(np.exp(pos) / (np.exp(pos) + np.exp(neg).sum())))
  np.testing.assert_allclose(float(met["sample_llm"]), np.mean(ref), rtol=1e-5)
  h = np.asarray(regressors.mlp_apply(params["encoder"], x))
  h = h / np.linalg.norm(h, axis=1, keepdims=True)
  z = h @ h.T / tau
  ref = []
  for i in range(n):
    p = z[i, i ^ 1]
    ref.append(-np.log(np.exp(p) / (np.exp(p) + np.exp(z[i, task != task[i]]).sum())))
  np.testing.assert_allclose(float(met["sample_sample"]), np.mean(ref), rtol=1e-4)


def constructed_data(n=120, seed=0):
  """Two query clusters. LLM 0: utility 0.9 on cluster A, 0.2 on B, cost 2. LLM 1: 0.6, cost 0.2."""
  rng = np.random.default_rng(seed)
  cluster = rng.integers(0, 2, n)
  centers = np.eye(8)[:2] * 3.0
  x = (centers[cluster] + 0.3 * rng.normal(size=(n, 8))).astype(np.float32)
  u = np.stack([np.where(cluster == 0, 0.9, 0.2), np.full(n, 0.6)], 1).astype(np.float32)
  c = np.stack([np.full(n, 2.0), np.full(n, 0.2)], 1).astype(np.float32)
  c *= rng.uniform(0.9, 1.1, size=c.shape).astype(np.float32)
  return labels_lib.RoutingData(x, u, c, ("big", "small")), cluster


class FakeCatalog:
  def __getitem__(self, name):
    return dict(big=catalog_lib.LLMSpec("big", 70, 0.9, 0.9, ""),
                small=catalog_lib.LLMSpec("small", 7, 0.2, 0.2, ""))[name]


@pytest.mark.parametrize("name", LEARNED)
def test_router_learns_constructed_tradeoff(name):
  train, _ = constructed_data(seed=0)
  test, cluster = constructed_data(n=60, seed=1)
  router = single_round.make_router(name, steps=300, seed=0).fit(train, FakeCatalog())
  u, c = router.predict(test.x)
  assert np.abs(u - test.utility).mean() < 0.1
  assert np.abs(c - test.cost).mean() < 0.3
  rng = np.random.default_rng(0)
  # alpha = 0: the big LLM where it is better (cluster A), the small one elsewhere.
  np.testing.assert_array_equal(router.choose(test.x, 0.0, rng), np.where(cluster == 0, 0, 1))
  # alpha = 0.9: 0.9 - 1.8 < 0.6 - 0.18, so always the cheap LLM.
  np.testing.assert_array_equal(router.choose(test.x, 0.9, rng), np.ones(len(test.x)))


def test_fixed_rules_on_constructed_data():
  data, _ = constructed_data()
  fitted = single_round.fit_routers(["largest", "cheapest", "best_single", "random"], data,
                                    FakeCatalog())
  x = data.x[:10]
  rng = np.random.default_rng(0)
  assert set(fitted["largest"].choose(x, 0.9, rng)) == {0}
  assert set(fitted["cheapest"].choose(x, 0.0, rng)) == {1}
  # best on average at alpha 0: big 0.9/0.2 mix vs small 0.6 depends on the mix; computed here.
  mean_u = data.utility.mean(0)
  assert set(fitted["best_single"].choose(x, 0.0, rng)) == {int(np.argmax(mean_u))}
  assert set(fitted["best_single"].choose(x, 0.9, rng)) == {1}
  picks = fitted["random"].choose(np.zeros((400, 8)), 0.0, rng)
  assert 150 < np.sum(picks == 0) < 250


def test_unknown_router_and_bad_settings():
  with pytest.raises(errors.ConfigError, match="unknown router 'svm'"):
    single_round.make_router("svm")
  with pytest.raises(errors.ConfigError):
    single_round.make_router("knn", knn_k=0)


@pytest.fixture(scope="module")
def simulated():
  c = test_config.get_config()
  c.data.n_train, c.data.n_test = 300, 200
  system = system_lib.build(c)
  data = labels_lib.collect(system, system.train_queries, seed=0)
  fitted = single_round.fit_routers(list(single_round.ROUTERS), data, system.catalog, steps=300,
                                    graph_steps=300)
  return system, data, fitted


def test_labels_on_the_simulator(simulated, tmp_path):
  system, data, _ = simulated
  assert data.utility.shape == data.cost.shape == (300, 3)
  assert data.x.shape == (300, system.encoder.dim)
  assert data.llm_x.shape == (3, system.encoder.dim) and len(data.tasks) == 300
  assert np.all((data.utility >= 0) & (data.utility <= 1)) and np.all(data.cost > 0)
  # Per-query labels differ: the router has something to learn beyond the LLM's mean.
  assert np.all(data.utility.std(0) > 0.05)
  data.save(tmp_path / "l.npz")
  back = labels_lib.RoutingData.load(tmp_path / "l.npz")
  np.testing.assert_array_equal(back.utility, data.utility)
  assert back.llms == data.llms and back.tasks == data.tasks
  np.testing.assert_array_equal(back.llm_x, data.llm_x)


def test_graph_router_needs_tasks_and_uses_them(simulated):
  system, data, fitted = simulated
  g = fitted["graph"]
  # Held-out BCE (floored by the soft labels' entropy) + log-cost MSE; 20 steps leave it at 0.66.
  assert np.isfinite(g.final_loss) and g.final_loss < 0.6
  x = labels_lib.embed(system, system.test_queries[:5])
  with pytest.raises(ValueError, match="task name"):
    g.predict(x)
  u, c = g.predict(x, tasks=[q.task_name for q in system.test_queries[:5]])
  assert u.shape == c.shape == (5, 3) and np.all((u > 0) & (u < 1)) and np.all(c > 0)
  bare = labels_lib.RoutingData(data.x, data.utility, data.cost, data.llms)
  with pytest.raises(errors.ConfigError, match="task names"):
    single_round.make_router("graph").fit(bare, system.catalog)


def test_learned_routers_beat_random_and_best_single(simulated):
  system, _, fitted = simulated
  for alpha in (0.0, 0.5):
    rows, picks = single_round.evaluate_routers(system, alpha, fitted, system.test_queries, seed=0)
    o = {k[len("router:"):]: v for k, v in evaluation.overall(rows).items()}
    assert o["random"].n == 200
    for name in ON_SIMULATOR:   # expected rewards (no sampling noise) on 200 held-out queries
      assert o[name].reward > o["random"].reward + 0.02, (alpha, name, o[name], o["random"])
      assert o[name].reward > o["best_single"].reward, (alpha, name, o[name], o["best_single"])
      assert len(picks[name]) >= 2     # it really routes, not one LLM for all
    assert o["largest"].cost > o["cheapest"].cost


def test_cost_falls_as_alpha_grows(simulated):
  system, _, fitted = simulated
  x = labels_lib.embed(system, system.test_queries)
  tasks = [q.task_name for q in system.test_queries]
  llm_cost = np.array([system.catalog[m].price_in for m in system.space.llms])
  for name in ON_SIMULATOR:
    prices = [llm_cost[fitted[name].choose(x, a, np.random.default_rng(0), tasks=tasks)].mean()
              for a in (0.0, 0.5, 2.0)]
    assert prices[0] > prices[1] > prices[2], (name, prices)
