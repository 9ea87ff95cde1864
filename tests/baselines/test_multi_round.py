"""Multi-round routers: valid actions, finished episodes, KNN routing, the heuristic prompt router,
Router-R1's PPO, and their rows in the sweep (the R2-Reasoner-style router's own tests:
test_r2_reasoner.py)."""
import json

import jax
import numpy as np
import pytest

from experiments.configs import sweep as sweep_config
from gp_jax import errors
from gp_jax.baselines import multi_round as mr
from gp_jax.baselines.multi_round import knn
from gp_jax.baselines.multi_round import prompted
from gp_jax.baselines.multi_round import router_r1
from gp_jax.llm import base
from gp_jax.rl import batch as batch_lib
from gp_jax.rl import ppo
from gp_jax.runs import sweep
from gp_jax.runs import system as system_lib
from gp_jax.workflow import policies


def small_config():
  c = sweep_config.get_config("test")
  c.sweep.seeds = "0"
  c.sweep.alphas = "0.9"
  c.train.episodes = 16
  c.data.n_train = 16
  c.data.n_test = 8
  c.compile_cache = ""
  return c


@pytest.fixture(scope="module")
def system():
  return system_lib.build(small_config())


def tiny_r1(**kw):
  return mr.make_multi_router("router_r1", **dict(dict(r1_episodes=32, r1_batch=16), **kw))


@pytest.fixture(scope="module")
def fitted(system):
  return {name: r.fit(system, system.train_queries, seed=0) for name, r in
          dict(knn=mr.make_multi_router("knn", knn_k=3), llm=mr.make_multi_router("llm"),
               router_r1=tiny_r1()).items()}


@pytest.mark.parametrize("name", ["knn", "llm", "router_r1"])
def test_routers_take_valid_actions_and_finish(system, fitted, name):
  router = fitted[name]
  for alpha in (0.0, 0.9):
    act = router.policy(alpha)
    seen = []

    def checked(query, state, mask, rng):
      a = act(query, state, mask, rng)
      assert mask[a], (name, a)
      seen.append(system.space.decode(a)[0].kind)
      return a
    env = system.env(alpha)
    states = policies.run_policy(env, checked, system.test_queries, seed=0)
    assert all(s.done and s.final_answer is not None for s in states)
    assert set(seen) <= {"planner", "executor", "summarizer"}
    # The batched runner takes the same decisions as the per-query policy.
    ran = router.run(system, alpha, system.test_queries, seed=0)
    actions = lambda sts: [[c.action for c in s.calls] for s in sts]
    assert actions(ran) == actions(states)
    if name != "router_r1":      # decompose-route-merge: plan, execute each part, summarise, answer
      for s in states:
        kinds = [c.kind for c in s.calls]
        assert kinds[0] == "planner" and kinds[-2:] == ["summarizer", "executor"]
        assert kinds.count("executor") == len(s.nodes[0].children) + 1


def test_knn_routes_to_label_argmax_with_identical_neighbours(system):
  llms = system.space.llms
  M, D = len(llms), system.encoder.dim
  u_row, c_row = np.array([0.3, 0.8, 0.6]), np.array([0.1, 1.0, 0.2])
  x = np.tile(np.eye(D, dtype=np.float32)[:1], (20, 1))          # every sub-question alike
  subs = knn.SubQuestionLabels(x, np.tile(u_row, (20, 1)).astype(np.float32),
                              np.tile(c_row, (20, 1)).astype(np.float32))
  grid = np.zeros((M, 4, M), np.float32)
  grid[1, :, 2] = 1.0                                              # pipeline: planner 1, merger 2
  router = knn.KNNMultiRound(k=5)
  router.space, router.encoder = system.space, system.encoder
  router.labels = knn.PipelineLabels(tuple(llms), grid, np.zeros_like(grid), (subs,) * M)
  for alpha, want in ((0.0, 1), (0.9, 2)):                         # argmax of u - alpha * c
    assert int(np.argmax(u_row - alpha * c_row)) == want
    q = np.random.default_rng(0).normal(size=(3, D))
    assert list(router.route(subs, q, alpha)) == [want] * 3
    states = router.run(system, alpha, system.test_queries, seed=0)
    for s in states:
      for c in s.calls:
        role_llm = dict(planner=llms[1], summarizer=llms[2])
        if c.kind == "executor":
          assert c.llm == (llms[want] if c.node != 0 else llms[2])
        else:
          assert c.llm == role_llm[c.kind]


def test_knn_pipeline_labels(system, fitted):
  lab = fitted["knn"].labels
  M, N = len(system.space.llms), len(system.train_queries)
  assert lab.utility.shape == lab.cost.shape == (M, N, M)
  assert np.all((lab.utility >= 0) & (lab.utility <= 1)) and np.all(lab.cost > 0)
  for subs in lab.subs:       # every sub-question labelled for every LLM, on the simulator exactly
    assert len(subs.x) >= N and subs.utility.shape == subs.cost.shape == (len(subs.x), M)
    assert np.all((subs.utility > 0) & (subs.utility < 1)) and np.all(subs.cost > 0)
  # Cost units rise with the price: the 70B (0.90 $/M) executes dearer than the 7-8B (0.20 $/M).
  big = list(system.space.llms).index("llama3-chatqa-1.5-70b")
  assert np.all(np.argmax(lab.subs[0].cost, 1) == big)
  p, g = lab.best_pipeline(0.0)
  r = lab.utility.mean(1)
  assert r[p, g] == r.max()
  again = knn.KNNMultiRound(k=3).fit(system, system.train_queries, seed=0).labels
  np.testing.assert_array_equal(again.utility, lab.utility)        # deterministic


def test_heuristic_prompt_router_ranks_as_documented(system, fitted):
  rng = np.random.default_rng(0)
  x, llm_x = rng.normal(size=(4, 6)), rng.normal(size=(3, 6))
  price = np.array([1.0, 0.25, 0.5])
  got = prompted.heuristic_scores(x, llm_x, price, 0.7)
  for b in range(4):
    for m in range(3):
      cos = x[b] @ llm_x[m] / np.linalg.norm(x[b]) / np.linalg.norm(llm_x[m])
      assert got[b, m] == pytest.approx(cos - 0.7 * price[m], abs=1e-5)
  router = fitted["llm"]
  assert router.router_llm == "qwen2.5-7b-instruct"              # the pool's cheapest, pool order
  for m in system.space.llms:     # a text equal to an LLM's description: cosine 1, that LLM wins
    assert router.heuristic_route(system.catalog[m].description, 0.0) == m
  # A large alpha outweighs any cosine difference: the cheapest price scale wins.
  cheapest = [m for m in system.space.llms if router.price_scale[list(system.space.llms).index(m)]
              == router.price_scale.min()]
  big = system.catalog["llama3-chatqa-1.5-70b"].description
  assert router.heuristic_route(big, 50.0) == cheapest[0]


def test_parse_model_choice():
  names = ["qwen2.5-7b-instruct", "llama-3.1-8b-instruct", "llama3-chatqa-1.5-70b"]
  assert prompted.parse_model_choice("Use llama3-chatqa-1.5-70b.", names, "d") == "llama3-chatqa-1.5-70b"
  assert prompted.parse_model_choice("LLAMA-3.1-8B-Instruct, not qwen2.5-7b-instruct", names, "d") == \
      "llama-3.1-8b-instruct"
  assert prompted.parse_model_choice("gpt-4o would be best", names, "qwen2.5-7b-instruct") == \
      "qwen2.5-7b-instruct"
  assert prompted.parse_model_choice("", names, "d") == "d"


class RoutingReplies(base.LLMPool):
  """Answers routing prompts with a fixed reply (a real backend's router LLM)."""

  def __init__(self, catalog, reply):
    super().__init__(catalog)
    self.reply, self.prompts = reply, []

  async def chat(self, model, messages, params=base.SamplingParams()):
    self.prompts.append((model, messages[-1]["content"]))
    return base.Completion(model, self.reply, 100, 5, self.catalog.cost_usd(model, 100, 5))


@pytest.mark.parametrize("reply,want", [
    ("Route it to llama3-chatqa-1.5-70b.", "llama3-chatqa-1.5-70b"),
    ("no idea", "qwen2.5-7b-instruct")])             # a reply naming no LLM: the router LLM
def test_prompted_router_on_a_real_backend_path(system, reply, want):
  router = mr.make_multi_router("llm").fit(system, system.train_queries, seed=0)
  router.simulated, router.pool = False, RoutingReplies(system.catalog, reply)
  states = router.run(system, 0.3, system.test_queries, seed=0)
  subs = [c for s in states for c in s.calls if c.kind == "executor" and c.node != 0]
  assert subs and all(c.llm == want for c in subs)
  assert router.routing_calls == len(subs) == len(router.pool.prompts)
  model, prompt = router.pool.prompts[0]
  assert model == "qwen2.5-7b-instruct" and "Cost weight: 0.3" in prompt
  assert all(m in prompt for m in system.space.llms)
  assert router.routing_cost_units == pytest.approx(len(subs) * 105 * 0.2 / 1e6 / 1e-3)


def test_r1_mask_is_router_r1s_action_set(system):
  space, router_llm = system.space, "qwen2.5-7b-instruct"
  env = system.env(0.0)
  q = system.train_queries[0]
  state = env.reset(q)
  m = router_r1.r1_mask(space, router_llm, state, env.mask(state))
  allowed = {space.decode(a) for a in np.flatnonzero(m)}
  assert {(r.kind, llm) for r, llm in allowed} == (
      {("executor", x) for x in space.llms} | {("planner", router_llm)})
  policies.aio.run(env.step(state, q, space.encode("planner", "llama3-chatqa-1.5-70b"), seed=0))
  m = router_r1.r1_mask(space, router_llm, state, env.mask(state))   # a turn: any executor, no re-planning
  assert {space.decode(a)[0].kind for a in np.flatnonzero(m)} == {"executor"}
  assert m.sum() == space.num_llms
  # Every turn executed: the router LLM summarises, then gives the final answer itself.
  while not state.root_summarized:
    m = router_r1.r1_mask(space, router_llm, state, env.mask(state))
    if state.node.status == "planning":
      assert {(space.decode(a)[0].kind, space.decode(a)[1]) for a in np.flatnonzero(m)} == {
          ("summarizer", router_llm)}
    policies.aio.run(env.step(state, q, int(np.flatnonzero(m)[-1]), seed=0))
  m = router_r1.r1_mask(space, router_llm, state, env.mask(state))
  assert [space.decode(a)[1] for a in np.flatnonzero(m)] == [router_llm]
  assert space.decode(int(np.flatnonzero(m)[0]))[0].kind == "executor"


def batch_loss(r, params, batch) -> float:
  """The clipped-PPO loss of Router-R1's net on a whole batch (as ppo.learn computes it)."""
  adv, returns = batch_lib.advantages(batch, r.settings.gamma, r.settings.gae_lambda)
  tr = batch.transitions
  logits, values, mask = router_r1.forward(r.net, params, tr)
  return float(ppo.ppo_loss(logits, values, tr["actions"], tr["old_logp"],
                            ppo.normalize_advantages(adv, tr["weights"]), returns, mask,
                            tr["weights"], clip_eps=r.settings.clip_eps,
                            value_coef=r.settings.value_coef,
                            entropy_coef=r.settings.entropy_coef)[0])


def test_router_r1_ppo_update_lowers_loss_and_training_raises_reward(system):
  r = tiny_r1(r1_episodes=16 * 24, r1_batch=16).fit(system, system.train_queries, seed=0)
  env = system.env(0.9, reward="expected")
  params = r.init_params()
  episodes, _ = r.rollout(env, system.train_queries, params, jax.random.PRNGKey(0),
                          greedy=False, seed_base=0)
  batch = r.make_batch(episodes)
  before = batch_loss(r, params, batch)
  update = router_r1.make_update(r.net, r.settings)
  new, _, _ = update(params, router_r1.make_optimizer(r.settings).init(params),
                     jax.random.PRNGKey(1), batch)
  after = batch_loss(r, new, batch)
  assert after < before - 1e-3
  out = r.train(0.9)
  ret = out["mean_return"]
  assert len(ret) == 24 and np.mean(ret[-4:]) > np.mean(ret[:4]) + 0.03
  again = tiny_r1(r1_episodes=16 * 24, r1_batch=16).fit(system, system.train_queries, seed=0)
  assert again.train(0.9)["mean_return"] == ret                 # deterministic given the seed


def test_sweep_writes_multi_round_rows(tmp_path):
  c = small_config()
  c.sweep.routers = "best_single"
  c.sweep.r1_episodes, c.sweep.r1_batch = 32, 16
  c.sweep.r2_episodes, c.sweep.r2_batch, c.sweep.r2_rounds = 32, 8, 1
  sweep.sweep_from_config(c, tmp_path, verbose=False)
  rec = json.loads((tmp_path / "alpha0.9_seed0" / "cell.json").read_text())
  rows = {r["policy"]: r for r in rec["rows"] if r["domain"] == "all"}
  for name in ("knn", "llm", "router_r1", "r2_reasoner"):
    row = rows[f"multi:{name}"]
    assert row["n"] == rec["n_test"] and row["calls"] >= 1
    assert row["reward"] <= rows["optimum (DP)"]["reward"] + 1e-9
    assert sum(rec["router_picks"][f"multi:{name}"].values()) == round(row["calls"] * row["n"])


def test_unknown_names_are_config_errors(tmp_path):
  with pytest.raises(errors.ConfigError, match="unknown multi-round router 'nope'"):
    mr.make_multi_router("nope")
  c = small_config()
  c.sweep.multi_routers = "knn,nope"
  with pytest.raises(errors.ConfigError, match="unknown multi-round router 'nope'"):
    sweep.sweep_from_config(c, tmp_path / "w", verbose=False)
  c = small_config()
  c.sweep.router_llm = "gpt-9"
  with pytest.raises(errors.ConfigError, match="unknown router LLM 'gpt-9'"):
    sweep.sweep_from_config(c, tmp_path / "w", verbose=False)
  assert not (tmp_path / "w").exists()          # nothing written before the checks
  with pytest.raises(errors.ConfigError, match="multiple of num_minibatches"):
    mr.make_multi_router("router_r1", r1_batch=3)
