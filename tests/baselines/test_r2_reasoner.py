"""The R2-Reasoner-style router: it runs, decomposes multi-step queries, allocates sub-questions by
estimated difficulty, trains by SFT then GRPO on the training split only, and is deterministic."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.configs import sweep as sweep_config
from gp_jax import errors
from gp_jax.baselines import multi_round as mr
from gp_jax.baselines.multi_round import r2_reasoner as r2
from gp_jax.runs import sweep
from gp_jax.runs import system as system_lib
from gp_jax.sim import simulator as sim
from gp_jax.workflow import policies

SETTINGS = r2.R2Settings(episodes=64, batch=8, group=4, sft_steps=200, select_queries=16)


def small_config():
  c = sweep_config.get_config("test")
  c.sweep.seeds, c.sweep.alphas = "0", "0.9"
  c.train.episodes = 16
  c.data.n_train, c.data.n_test = 32, 16
  c.compile_cache = ""
  return c


@pytest.fixture(scope="module")
def system():
  return system_lib.build(small_config())


@pytest.fixture(scope="module")
def router(system):
  return mr.make_multi_router("r2_reasoner", r2=SETTINGS).fit(system, system.train_queries, seed=0)


def test_runs_valid_pipelines_to_the_end(system, router):
  for alpha in (0.0, 0.9):
    act = router.policy(alpha)

    def checked(query, state, mask, rng):
      a = act(query, state, mask, rng)
      assert mask[a]
      return a
    states = policies.run_policy(system.env(alpha), checked, system.test_queries, seed=0)
    assert all(s.done and s.final_answer is not None for s in states)
    for s in states:                 # decompose, one Executor per sub-question, merge, answer
      kinds = [c.kind for c in s.calls]
      assert kinds[0] == "planner" and kinds[-2:] == ["summarizer", "executor"]
      assert kinds.count("executor") == len(s.nodes[0].children) + 1
    ran = router.run(system, alpha, system.test_queries, seed=0)
    assert [[c.action for c in s.calls] for s in ran] == [[c.action for c in s.calls]
                                                          for s in states]


def test_scoring_compiles_once_per_size_class(system, router):
  params = router.train(0.0)["params"]
  texts = [q.query for q in system.train_queries[:8]]
  router.scores(params, texts[:1], 0.0)
  size = r2.scores_jit._cache_size()
  for n in range(1, 9):              # 1..8 texts: one padded size; alpha is traced, not static
    router.scores(params, texts[:n], 0.1 * n)
  assert r2.scores_jit._cache_size() == size
  np.testing.assert_allclose(router.scores(params, texts[:3], 0.2),
                             router.scores(params, texts[:8], 0.2)[:3], rtol=1e-6)


def test_multi_step_queries_are_decomposed_into_several_sub_questions(system, router):
  states = router.run(system, 0.0, system.test_queries, seed=0)
  width = system.mdp_cfg.max_width
  multi = [(q, s) for q, s in zip(system.test_queries, states) if q.meta["complexity"] >= 2]
  assert multi
  for q, s in multi:
    assert len(s.nodes[0].children) == min(q.meta["complexity"], width) >= 2


def test_the_allocation_rule_sends_harder_sub_questions_to_more_capable_llms():
  """Two sub-questions that differ only in difficulty get different LLMs, the harder the stronger
  one; with no cost weight both get the strongest."""
  dim, hidden = 4, 3
  params = r2.init_allocator(jax.random.PRNGKey(0), dim, 3, hidden)
  w1 = jnp.zeros((dim, hidden)).at[0, 0].set(1.0)               # d = relu(x_0) - 3
  w2 = jnp.zeros((hidden, 1)).at[0, 0].set(1.0)
  params = dict(difficulty=[dict(w=w1, b=jnp.zeros(hidden)), dict(w=w2, b=jnp.full(1, -3.0))],
                capability=jnp.array([0.0, -1.0, 3.0]))           # cheap, weak, strong
  cost = jnp.array([0.04, 0.04, 0.14])
  xs = jnp.zeros((2, dim)).at[1, 0].set(5.0)                     # easy: d = -3, hard: d = 2
  np.testing.assert_allclose(r2.difficulty(params, xs), [-3.0, 2.0], atol=1e-6)
  assert list(np.argmax(r2.scores(params, xs, cost, 1.0), 1)) == [0, 2]
  assert list(np.argmax(r2.scores(params, xs, cost, 0.0), 1)) == [2, 2]


def test_the_trained_router_sends_harder_sub_questions_to_the_larger_llm(system, router):
  """On the simulator's latent difficulty (hardness + gamma * (steps - 1)), which the router never
  sees: where it uses both the cheapest and the most expensive LLM, the sub-questions it gives the
  most expensive one are harder on average."""
  prices = {m: system.catalog[m].price_in + system.catalog[m].price_out for m in system.space.llms}
  mixed = 0
  for alpha in (0.1, 0.3, 0.5):
    by_llm: dict[str, list[float]] = {}
    for s in router.run(system, alpha, system.train_queries + system.test_queries, seed=0):
      for c in s.calls:
        if c.kind == "executor" and c.node != 0:
          info = system.world.lookup(s.nodes[c.node].text)
          by_llm.setdefault(c.llm, []).append(info.hardness + sim.GAMMA * (info.complexity - 1))
    if len(by_llm) < 2:
      continue
    mixed += 1
    cheap, dear = min(by_llm, key=prices.get), max(by_llm, key=prices.get)
    assert np.mean(by_llm[dear]) > np.mean(by_llm[cheap]), (alpha, by_llm)
  assert mixed >= 1


def test_training_sees_the_training_split_only_and_evaluation_changes_nothing():
  system = system_lib.build(small_config())
  seen = []
  make_env = system.env

  def spying_env(alpha, **kw):
    env = make_env(alpha, **kw)
    reset = env.reset
    env.reset = lambda q: seen.append(q) or reset(q)
    return env
  system.env = spying_env
  router = mr.make_multi_router("r2_reasoner", r2=SETTINGS).fit(system, system.train_queries,
                                                                seed=0)
  trained = router.train(0.5)
  train_ids = {q.qid for q in system.train_queries}
  assert seen and {q.qid for q in seen} <= train_ids and {q.split for q in seen} == {"train"}
  before = jax.tree_util.tree_map(np.asarray, trained["params"])
  router.run(system, 0.5, system.test_queries, seed=0)
  after = jax.tree_util.tree_map(np.asarray, router.train(0.5)["params"])
  assert jax.tree_util.tree_all(jax.tree_util.tree_map(np.array_equal, before, after))


def test_sft_then_grpo_are_trained_and_deterministic_given_the_seed(system, router):
  assert router.sft_loss[-1] < router.sft_loss[0] - 0.05
  t = router.train(0.9)
  assert len(t["mean_reward"]) == len(t["planners"]) * 2 and t["planner"] == t["planners"][-1]
  again = mr.make_multi_router("r2_reasoner", r2=SETTINGS).fit(system, system.train_queries,
                                                               seed=0)
  t2 = again.train(0.9)
  assert t2["mean_reward"] == t["mean_reward"] and t2["planners"] == t["planners"]
  assert jax.tree_util.tree_all(jax.tree_util.tree_map(
      lambda a, b: np.array_equal(np.asarray(a), np.asarray(b)), t["params"], t2["params"]))
  act = lambda states: [[(c.kind, c.llm) for c in s.calls] for s in states]
  assert act(again.run(system, 0.9, system.test_queries, seed=0)) == act(
      router.run(system, 0.9, system.test_queries, seed=0))
  other = mr.make_multi_router("r2_reasoner", r2=SETTINGS).fit(system, system.train_queries,
                                                               seed=1)
  assert other.train(0.9)["mean_reward"] != t["mean_reward"]


def test_a_grpo_step_raises_the_probability_of_a_better_than_average_allocation():
  dim, M = 4, 3
  params = r2.init_allocator(jax.random.PRNGKey(1), dim, M, 8)
  cost = jnp.array([0.04, 0.04, 0.14])
  xs = jax.random.normal(jax.random.PRNGKey(2), (4, dim))
  chosen = jnp.array([2, 0, 2, 0])
  adv = jnp.array([1.0, -1.0, 1.0, -1.0])     # LLM 2 did better than the group, LLM 0 worse
  valid = jnp.ones(4)
  opt, step = r2.make_grpo_step(0.1, 0.0, 1e-2, 4)
  p = lambda prm: jax.nn.softmax(r2.scores(prm, xs, cost, 0.3) / 0.1)
  new, _, _ = step(params, opt.init(params), params, xs, chosen, adv, valid, cost, 0.3)
  assert np.all(np.asarray(p(new)[:, 2]) > np.asarray(p(params)[:, 2]))
  # padded rows (valid 0) change nothing
  same, _, _ = step(params, opt.init(params), params, xs, chosen, adv, jnp.zeros(4), cost, 0.3)
  np.testing.assert_allclose(p(same), p(params), atol=1e-6)


def test_group_advantages():
  adv = r2.group_advantages(np.array([[1.0, 0.0, 0.5, 0.5], [0.3, 0.3, 0.3, 0.3]]))
  np.testing.assert_allclose(adv[0].mean(), 0.0, atol=1e-6)
  np.testing.assert_allclose(adv[0].std(), 1.0, atol=1e-5)
  assert adv[0, 0] > adv[0, 2] > adv[0, 1] and not adv[1].any()


def test_bad_settings_are_config_errors():
  for bad in (dict(group=1), dict(episodes=0), dict(temperature=0.0), dict(kl_coef=-1.0)):
    with pytest.raises(errors.ConfigError, match="r2_reasoner settings"):
      mr.make_multi_router("r2_reasoner", r2=r2.R2Settings(**bad))


def test_the_sweep_settings_come_from_the_config():
  c = small_config()
  c.sweep.r2_group = 6
  s = sweep.r2_settings_from_config(c)
  assert s.group == 6 and s.episodes == 128 and s.batch == 8 and isinstance(s.temperature, float)
