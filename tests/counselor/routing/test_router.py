"""The routed Graph Counselor on GraphPlanner's machinery: its observations in graph/features'
layout, batched decisions equal to unbatched ones, seeded sampling, training that moves the
policy (the shared learner itself: tests/rl/test_learners.py)."""
import dataclasses

import jax
import numpy as np
import pytest

from gp_jax import errors
from gp_jax.counselor.agents import records
from gp_jax.counselor.routing import features as routing_features
from gp_jax.counselor.routing import router as routing
from gp_jax.counselor.synth import sim_pool
from gp_jax.graph import features as graph_features
from gp_jax.rl import rollout
from gp_jax.sim import simulator
from gp_jax.text import encoder as encoder_lib
from tests.counselor.conftest import run

SMALL, BIG = "qwen2.5-7b-instruct", "llama-3.3-nemotron-super-49b-v1"
SETTINGS = {"max_steps": 4, "max_reflect": 1}


@pytest.fixture(scope="module")
def tiny(catalog):
  """make(seed) -> (router, initial state) over two LLMs, small network."""
  llms = [SMALL, BIG]
  cfg = routing.RouterConfig(hidden=16, num_layers=1, mlp_hidden=16, mem_proj=8, max_rows=8,
                             update_size=64, ppo=dataclasses.replace(
                                 routing.DEFAULT_PPO, learning_rate=3e-3, entropy_coef=0.0))
  encoder = encoder_lib.make_encoder("hashing", dim=64)
  routers = {}

  def make(seed=0):
    if seed not in routers:
      routers[seed] = routing.make_router(catalog=catalog.select(llms), llms=llms,
                                          encoder=encoder, cfg=cfg, counselor_settings=SETTINGS,
                                          seed=seed)
    router = routers[seed]
    return router, routing.init_state(router, seed)
  return make


def _decisions(router, params, questions, funcs, pool, *, key=None, concurrency=8):
  """Runs the questions with a sampled (key) or greedy selector; returns the selector and, per
  question, its decisions' actions."""
  sel = routing.selector(router, params, greedy=key is None, key=key, record=True)
  run(routing.run_episodes(questions, select_llm=sel, funcs=funcs, pool=pool,
                           counselor_settings=SETTINGS, concurrency=concurrency))
  return sel, {q: [t.action for t in tr] for q, tr in sel.transitions.items()}


def test_observations_have_graph_features_layout(academic, catalog, tiny):
  router, state = tiny()
  f = router.featurizer
  assert isinstance(f.spec, graph_features.FeatureSpec)
  assert f.spec.num_actions == len(routing_features.KINDS) * 2
  assert f.spec.state_dim == f.spec.text_dim + routing_features.STATE_EXTRA
  assert f.hub_features.shape == (f.spec.num_actions, 2 * f.spec.text_dim)
  graph, questions, funcs = academic
  pool = sim_pool.SimCounselorPool(catalog, questions, seed=0)
  sel, _ = _decisions(router, state.params, questions[:2], funcs, pool)
  obs = [t.obs for tr in sel.transitions.values() for t in tr]
  assert obs
  for o in obs:
    assert o["rows"].shape == (f.spec.max_rows, f.spec.row_dim)
    assert o["state"].shape == (f.spec.state_dim,)
    assert o["mask"].sum() == f.K   # only the step's kind is valid
  # the rows of a question's later steps are the earlier calls, in graph/features' row layout
  last = sel.transitions[questions[0].qid][-1].obs
  n = int(last["row_valid"].sum())
  assert 0 < n <= f.spec.max_rows and set(last["row_hub"][:n]) <= set(range(f.spec.num_actions))
  assert np.all(last["row_hub"][n:] == f.spec.num_actions)


def test_router_returns_only_its_llms(academic, catalog, tiny):
  graph, questions, funcs = academic
  router, state = tiny()
  pool = sim_pool.SimCounselorPool(catalog, questions, seed=0)
  for key in (jax.random.PRNGKey(1), None):
    sel, _ = _decisions(router, state.params, questions[:8], funcs, pool, key=key)
    assert sel.choices and {m for c in sel.choices.values() for m in c} <= {SMALL, BIG}
  step = records.AgentStep(kind="answer", role="executor", qid="x", question="q", trial=0, step=0,
                           messages=())
  with pytest.raises(errors.ConfigError, match="routes"):
    run(routing.selector(router, state.params)(step))


@pytest.mark.parametrize("sampled", [True, False])
def test_batched_decisions_are_the_unbatched_ones(academic, catalog, tiny, sampled):
  graph, questions, funcs = academic
  router, state = tiny()
  pool = sim_pool.SimCounselorPool(catalog, questions, seed=2)
  key = jax.random.PRNGKey(11) if sampled else None
  batched_sel, batched = _decisions(router, state.params, questions[:8], funcs, pool, key=key,
                                    concurrency=8)
  alone_sel, alone = _decisions(router, state.params, questions[:8], funcs, pool, key=key,
                                concurrency=1)
  # the batched run did batch (several decisions per policy call); the other never did
  assert batched_sel.batcher.decisions > 1.5 * batched_sel.batcher.calls
  assert alone_sel.batcher.calls == alone_sel.batcher.decisions
  assert batched == alone and sum(map(len, batched.values())) > 20
  if sampled:   # and both sampled: the greedy choice is not what every decision took
    greedy = {}
    for qid, tr in batched_sel.transitions.items():
      probs = routing.policy_probabilities(router, state.params, [t.obs for t in tr])
      greedy[qid] = probs.argmax(1).tolist()
    assert greedy != batched


def test_sampling_is_seeded(academic, catalog, tiny):
  graph, questions, funcs = academic
  router, state = tiny()
  pool = sim_pool.SimCounselorPool(catalog, questions, seed=3)
  runs = [_decisions(router, state.params, questions[:8], funcs, pool, key=jax.random.PRNGKey(k))
          for k in (5, 5, 6)]
  (sel_a, a), (sel_b, b), (_, c) = runs
  assert a == b and a != c
  assert [t.logp for tr in sel_a.transitions.values() for t in tr] == \
      [t.logp for tr in sel_b.transitions.values() for t in tr]


def test_decision_keys_fold_every_id():
  key = jax.random.PRNGKey(0)
  ids = np.array([[7, 0], [7, 1], [8, 0], [7, 0]], np.uint32)
  keys = [rollout.decision_key(key, i) for i in ids]
  assert np.array_equal(keys[0], keys[3])
  assert len({tuple(np.asarray(k).tolist()) for k in keys}) == 3
  assert np.array_equal(keys[1], jax.random.fold_in(jax.random.fold_in(key, 7), 1))


def test_training_moves_the_policy_to_the_dominant_llm(academic, catalog, tiny):
  graph, questions, funcs = academic
  router, state = tiny(seed=3)
  # the big model is made far better than the small one, at the same price
  profiles = simulator.load_profiles(catalog)
  profiles[BIG] = dataclasses.replace(profiles[BIG], theta={"knowledge_reasoning": 3.0})
  profiles[SMALL] = dataclasses.replace(profiles[SMALL], theta={"knowledge_reasoning": -3.0})
  pool = sim_pool.SimCounselorPool(catalog.select([SMALL, BIG]), questions, profiles=profiles)
  settings = {"max_steps": 4, "max_reflect": 0}
  big = router.featurizer.action("action", BIG)

  def big_probability(params):   # mean policy probability of BIG on the action steps of real runs
    sel = routing.selector(router, params, greedy=False, key=jax.random.PRNGKey(5), record=True)
    run(routing.run_episodes(questions, select_llm=sel, funcs=funcs, pool=pool,
                             counselor_settings=settings))
    obs = [t.obs for tr in sel.transitions.values() for t in tr if t.obs["mask"][big]]
    return float(np.mean(routing.policy_probabilities(router, params, obs)[:, big]))
  p0 = big_probability(state.params)
  state, history = routing.train(
      router, state, questions, funcs=funcs, pools=lambda seed: pool,
      counselor_settings=settings,
      settings=routing.TrainSettings(alpha=0.0, episodes=256, batch_questions=16),
      log=lambda s: None)
  p1 = big_probability(state.params)
  assert len(history) == 16 and history[-1]["episodes"] == 256
  assert int(state.update_step) >= 16
  assert p1 > 0.8 and p1 > p0 + 0.25, (p0, p1)
  assert history[-1]["utility"] > history[0]["utility"]
