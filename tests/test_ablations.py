"""GARNet ablations: encoders (homogeneous, GAT, graph transformer), history as summary text and
as retrieval, against numpy references; exact PPO inputs; end-to-end train + evaluate; config
errors."""
import asyncio

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.configs import test as test_config
from gp_jax import errors
from gp_jax.graph import features as features_lib
from gp_jax.graph import garnet
from gp_jax.graph import history as history_lib
from gp_jax.rl import batch as batch_lib
from gp_jax.rl import ppo
from gp_jax.rl import rollout
from gp_jax.rl import loop as loop_lib
from gp_jax.runs import evaluate as evaluation
from gp_jax.runs import ppo_config
from gp_jax.runs import system as system_lib
from gp_jax.runs import train as training

A, F, D, M = 6, 5, 7, 4


def small_obs(rng, mask, with_retrieval=False):
  obs = dict(task=jnp.asarray(rng.normal(size=D), jnp.float32),
             query=jnp.asarray(rng.normal(size=D), jnp.float32),
             state=jnp.asarray(rng.normal(size=D + 2), jnp.float32),
             rows=jnp.asarray(rng.normal(size=(M, F)), jnp.float32),
             row_hub=jnp.array([0, 2, 2, A]), row_valid=jnp.array([True, True, True, False]),
             mask=jnp.asarray(mask))
  if with_retrieval:
    obs.update(ret_rows=jnp.asarray(rng.normal(size=(2, F)), jnp.float32),
               ret_hub=jnp.array([1, A]), ret_valid=jnp.array([True, False]))
  return obs


@pytest.mark.parametrize("encoder,history_input,retrieval", [
    *[(e, "sums", False) for e in garnet.ENCODERS],
    ("garnet", "summary", False), ("homogeneous", "summary", False), ("gat", "sums", True),
    ("transformer", "sums", True)])
def test_encoder_builds_masks_and_has_finite_gradients(encoder, history_input, retrieval):
  rng = np.random.default_rng(0)
  model = garnet.GARNet(hidden=8, num_layers=2, mlp_hidden=16, encoder=encoder,
                        history_input=history_input, heads=2, input_width=2 * D,
                        use_history=not retrieval)
  mask = np.array([1, 0, 1, 0, 0, 1], bool)
  obs = small_obs(rng, mask, retrieval)
  hub = jnp.asarray(rng.normal(size=(A, 2 * D)), jnp.float32)
  hist_rows = jnp.asarray(rng.normal(size=(3, F)), jnp.float32)
  params = model.init(jax.random.PRNGKey(0), hub, hist_rows, obs)["params"]
  if encoder == "homogeneous":   # one transform for every table: no per-type weights
    per_type = {"hist_hub", "hist_row", "query_in", "value_row", "value_hub"}
    assert "shared_in" in params and not per_type & set(params)
    assert set(params["layers_0"]) == {"beta", "shared"}

  def loss(p):
    logits, value = model.apply({"params": p}, hub, hist_rows, obs)
    return jnp.sum(jnp.where(obs["mask"], jax.nn.log_softmax(logits), 0.0)) + value, logits

  (_, logits), grads = jax.value_and_grad(loss, has_aux=True)(params)
  assert logits.shape == (A,)
  probs = np.asarray(jax.nn.softmax(logits))
  assert (probs[~mask] == 0).all() and probs[mask].sum() == pytest.approx(1.0, abs=1e-5)
  leaves = jax.tree_util.tree_leaves(grads)
  assert all(np.isfinite(g).all() for g in leaves)
  assert sum(float(jnp.abs(g).sum()) > 0 for g in leaves) > len(leaves) // 2


def _table(p, x):
  h = x @ np.asarray(p["Dense_0"]["kernel"]) + np.asarray(p["Dense_0"]["bias"])
  mu, var = h.mean(-1, keepdims=True), h.var(-1, keepdims=True)
  h = (h - mu) / np.sqrt(var + 1e-6) * np.asarray(p["LayerNorm_0"]["scale"]) + np.asarray(
      p["LayerNorm_0"]["bias"])
  return np.maximum(h, 0) + (x if x.shape[-1] == h.shape[-1] else 0)


def _graph(rng, d):
  valid = np.array([1, 1, 1, 1, 1, 0], bool)
  hub_of_row = np.array([0, 2, 2, 2, 3, 0])
  g = garnet.workflow_graph(jnp.asarray(rng.normal(size=d), jnp.float32),
                            jnp.asarray(rng.normal(size=(4, d)), jnp.float32),
                            jnp.asarray(rng.normal(size=(6, d)), jnp.float32),
                            jnp.asarray(np.where(valid, hub_of_row, 4)), jnp.asarray(valid))
  return g, valid, hub_of_row


def test_gat_attention_matches_numpy_and_sums_to_one_per_node():
  rng = np.random.default_rng(1)
  d, nh = 5, 4
  g, valid, hub_of_row = _graph(rng, d)
  layer = garnet.GARNetLayer(hidden=d, aggregate="gat")
  params = layer.init(jax.random.PRNGKey(2), g, nh)
  out, inter = layer.apply(params, g, nh, mutable=["intermediates"])
  alpha = np.asarray(inter["intermediates"]["attention"][0])
  p = params["params"]
  nodes, rows = np.asarray(g.nodes), np.asarray(g.edges)
  hq, hh = _table(p["query"], nodes[:1]), _table(p["hub"], nodes[1:1 + nh])
  hr = _table(p["row"], rows)
  W, a = np.asarray(p["gat_w"]["kernel"]), np.asarray(p["gat_a"])[:, 0]
  gn = np.concatenate([hq, hh, np.zeros((1, d))]) @ W
  gr = hr @ W
  beta = float(p["beta"])
  want_nodes = np.concatenate([hq, hh])
  for v in range(1 + nh):   # node 0: the query (all valid rows); node 1 + a: the rows of hub a
    rows_v = np.flatnonzero(valid) if v == 0 else np.flatnonzero(valid & (hub_of_row == v - 1))
    if not len(rows_v):
      continue
    e = gn[v] @ a[:d] + gr[rows_v] @ a[d:]
    e = np.where(e > 0, e, 0.2 * e)
    w = np.exp(e - e.max()) / np.exp(e - e.max()).sum()
    entries = [r + (6 if v == 0 else 0) for r in rows_v]   # the query's copies follow the hubs'
    np.testing.assert_allclose(alpha[entries], w, rtol=1e-5, atol=1e-6)
    assert alpha[entries].sum() == pytest.approx(1.0, abs=1e-6)
    want_nodes[v] += beta * (w[:, None] * gr[rows_v]).sum(0)
  np.testing.assert_allclose(out.nodes[:1 + nh], want_nodes, rtol=1e-4, atol=1e-4)


def test_transformer_attention_is_a_softmax_per_node_and_head():
  rng = np.random.default_rng(3)
  g, valid, hub_of_row = _graph(rng, 8)
  layer = garnet.GARNetLayer(hidden=8, aggregate="transformer", heads=4)
  params = layer.init(jax.random.PRNGKey(0), g, 4)
  _, inter = layer.apply(params, g, 4, mutable=["intermediates"])
  alpha = np.asarray(inter["intermediates"]["attention"][0])    # [2M, H]
  targets = np.concatenate([np.where(valid, hub_of_row + 1, 5), np.where(valid, 0, 5)])
  assert alpha.shape == (12, 4)
  for v in range(5):
    if (targets == v).any():
      np.testing.assert_allclose(alpha[targets == v].sum(0), 1.0, rtol=1e-5)
  assert not np.allclose(alpha[targets == 0], alpha[targets == 0][:1])   # not a plain mean


@pytest.fixture(scope="module")
def sysm():
  return system_lib.build(test_config.get_config())


def test_retrieval_picks_top_k_by_cosine(sysm):
  rng = np.random.default_rng(4)
  feat = sysm.featurizer
  spec = feat.spec
  P, A = spec.mem_text_dim, spec.num_actions
  rows = rng.normal(size=(40, spec.row_dim)).astype(np.float32)
  hubs = rng.integers(0, A, 40).astype(np.int32)
  queries = rng.normal(size=(3, spec.text_dim)).astype(np.float32)
  index = features_lib.RetrievalIndex(feat, 5)
  index.sync(rows[:25], hubs[:25])
  index.sync(rows, hubs)        # incremental sync == one sync of everything
  got = index.fields(queries)
  for q, f in zip(queries, got):
    qp = q @ feat.proj
    cos = rows[:, :P] @ qp / np.linalg.norm(rows[:, :P], axis=1) / np.linalg.norm(qp)
    best = np.argsort(-cos.astype(np.float64), kind="stable")[:5]
    np.testing.assert_array_equal(f["ret_rows"], rows[best])
    np.testing.assert_array_equal(f["ret_hub"], hubs[best])
    assert f["ret_valid"].all() and f["ret_rows"].shape == (5, spec.row_dim)
  few = features_lib.RetrievalIndex(feat, 5)
  few.sync(rows[:2], hubs[:2])
  f = few.fields(queries[:1])[0]
  assert f["ret_valid"].tolist() == [True, True, False, False, False]
  assert (f["ret_hub"][2:] == A).all() and not f["ret_rows"][2:].any()
  assert sorted(f["ret_hub"][:2].tolist()) == sorted(hubs[:2].tolist())


def test_history_summary_text_and_embeddings(sysm):
  feat = sysm.featurizer
  spec = feat.spec
  P = spec.mem_text_dim
  rows = np.zeros((3, spec.row_dim), np.float32)
  rows[:, 2 * P] = [1.0, 0.25, 0.5]       # utility
  rows[:, 2 * P + 1] = [0.1, 0.3, 2.0]    # cost (milli-dollars)
  executor_qwen = sysm.space.encode("executor", "qwen2.5-7b-instruct")
  planner_70b = sysm.space.encode("planner", "llama3-chatqa-1.5-70b")
  hubs = np.array([executor_qwen, executor_qwen, planner_70b])
  texts, emb = feat.history_summary(rows, hubs)
  assert len(texts) == spec.num_actions and emb.shape == (spec.num_actions, spec.text_dim)
  assert texts[executor_qwen] == ("Executor with qwen2.5-7b-instruct: 2 past calls, mean utility "
                                  "0.62, mean cost 0.2 milli-dollars")
  assert texts[planner_70b] == ("Planner with llama3-chatqa-1.5-70b: 1 past call, mean utility "
                                "0.50, mean cost 2 milli-dollars")
  assert sum(t.endswith(": no past calls") for t in texts) == spec.num_actions - 2
  np.testing.assert_allclose(emb, feat.encoder.encode(texts))


@pytest.mark.parametrize("mode", ["summary", "retrieval"])
def test_update_sees_what_decisions_saw_without_retracing(sysm, mode):
  """Old log-probs recomputed from the PPO batch equal those of the decisions, as the history
  grows over iterations; nothing retraces inside the bucket."""
  chex.clear_trace_counter()
  cfg = test_config.get_config()
  cfg.model.history = mode
  feat, A = sysm.featurizer, sysm.space.size
  bsz = batch_lib.batch_size_for(8, sysm.mdp_cfg.max_calls(), 2)
  model = training.make_model(cfg, feat.spec)
  settings = ppo.PPOSettings(learning_rate=1e-2, epochs=1, num_minibatches=2, clip_eps=0.2,
                             gamma=0.99, gae_lambda=0.95, value_coef=0.5, entropy_coef=0.0,
                             max_grad_norm=0.5, value_lr_multiplier=2.0)
  opt = ppo.make_optimizer(settings)
  update = ppo.make_update_fn(model, opt, settings, num_chunks=bsz + 1, max_traces=1)
  state = loop_lib.init_state(model, feat, opt, 0)
  history = history_lib.HistoryMemory(feat.spec.row_dim, A, capacity=400)
  runner = rollout.PolicyRunner(model, feat.hub_features, 8, max_traces=1, featurizer=feat)
  runner.set_params(state.params, history)
  env = sysm.env(0.3)
  hub = jnp.asarray(feat.hub_features)
  forward = jax.jit(lambda p, hist, b: ppo.forward_batch(model, p, hub, hist, b, bsz + 1))
  for it in range(3):
    queries = sysm.train_queries[8 * it:8 * it + 8]
    eps = asyncio.run(rollout.run_episodes(env, feat, runner, queries, key=jax.random.PRNGKey(it),
                                           greedy=False, history=history, grow_history=True,
                                           seed_salt=("ablation", it)))
    batch, hist = batch_lib.build_batch(eps, None, batch_size=bsz, num_episodes=8,
                                        max_calls=ppo_config.max_calls(sysm), num_hubs=A)
    tr = batch.transitions
    if mode == "summary":
      hist["summary"] = runner.history_input_array()
      assert it == 0 or "past calls," in " ".join(runner.summary_texts)
    else:
      assert it == 0 or tr["obs"]["ret_valid"].any()
    logits, _ = forward(state.params, hist, tr)
    logp = jnp.take_along_axis(jax.nn.log_softmax(logits), tr["actions"][:, None], 1)[:, 0]
    n = int(tr["weights"].sum())
    np.testing.assert_allclose(logp[:n], tr["old_logp"][:n], rtol=1e-5, atol=1e-5)
    state, _ = update(state, hub, hist, batch)
    runner.set_params(state.params, history)
  assert 0 < len(history) <= history_lib.MIN_BUCKET


@pytest.mark.parametrize("encoder,history", [("gat", "summary"), ("transformer", "retrieval"),
                                             ("homogeneous", "transductive")])
def test_train_and_evaluate_each_ablation(tmp_path, sysm, encoder, history):
  cfg = test_config.get_config()
  cfg.model.encoder, cfg.model.history = encoder, history
  cfg.train.episodes = 32
  summary = training.train(cfg, tmp_path, system=sysm, verbose=False)
  assert summary["episodes"] == 32
  model, params, hist = training.load_router(cfg, tmp_path, sysm)
  assert model.encoder == encoder and len(hist) > 0
  rows = evaluation.evaluate(sysm, float(cfg.alpha), router=(model, params, hist), baselines=False,
                             optimum=False, parallel=8)
  row = evaluation.overall(rows)["GraphPlanner"]
  assert row.n == cfg.data.n_test and np.isfinite(row.reward) and row.calls >= 1


@pytest.mark.parametrize("field,value,message", [
    ("encoder", "gcn", "config.model.encoder must be one of garnet, homogeneous, gat, transformer"),
    ("history", "sometimes", "config.model.history must be one of transductive, inductive"),
    ("retrieval_k", 0, "config.model.retrieval_k must be an integer >= 1"),
    ("attention_heads", 5, "must divide config.model.hidden"),
])
def test_bad_model_config_is_one_config_error(field, value, message):
  cfg = test_config.get_config()
  cfg.model[field] = value
  if field == "attention_heads":
    cfg.model.encoder = "transformer"
  with pytest.raises(errors.ConfigError, match=message):
    training.make_model(cfg)
