r"""The routed Graph Counselor: GraphPlanner's router picks the backbone LLM of every agent step.

Built from GraphPlanner's machinery; only the action space and the observation are the
counselor's own (features.py: hubs = (agent kind, LLM), only the step's kind valid):
  network   gp_jax.graph.garnet.GARNet over the workflow graph of the question's calls so far;
  decisions gp_jax.rl.rollout.PolicyRunner (one jitted batched policy, sampling inside the jit)
            behind gp_jax.rl.decisions.DecisionBatcher, which batches the steps of the questions
            in flight (selector.py);
  learner   gp_jax.rl.ppo.make_update_fn (GAE and the clipped-PPO steps in one jitted update) on
            gp_jax.rl.batch batches, a ppo.TrainingState made by gp_jax.rl.loop.init_state and
            passed in and out of `update` and `train`.
Simplification of GraphPlanner: no cross-episode history table (GARNet(use_history=False); the
update gets an empty one), since a question's own calls already show what each hub did.

`Router` holds the fixed pieces (featurizer, network, optimizer, jitted update, batched policy)
and no training state: parameters and optimizer state live in the TrainingState the caller keeps
and passes in (the batched policy only holds the parameters the latest selector decides with).

Training: episodes = one question's calls, per-call reward
    r_t = -alpha * C_t  (+ U at the last call),   U = exact match of the final answer,
batches of questions with sampled LLMs, then PPO on shuffled chunks of `update_size` transitions,
each chunk's update running GAE over all the batch's episodes on one grid of batch_questions x
max_calls cells: one shape, so the update compiles once per run (GAE over empty cells is cheap).
Test time: greedy (argmax of the masked logits).
"""
from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from gp_jax import errors
from gp_jax.counselor.agents import loop as agents
from gp_jax.counselor.agents import records
from gp_jax.counselor.eval import metrics
from gp_jax.counselor.kg import data as data_lib
from gp_jax.counselor.kg import functions as functions_lib
from gp_jax.counselor.routing import features as features_lib
from gp_jax.counselor.routing import selector as selector_lib
from gp_jax.graph import features as graph_features
from gp_jax.graph import garnet as garnet_lib
from gp_jax.llm import base
from gp_jax.llm import catalog as catalog_lib
from gp_jax.rl import batch as batch_lib
from gp_jax.rl import decisions
from gp_jax.rl import ppo
from gp_jax.rl import rollout
from gp_jax.rl import loop as rl_loop
from gp_jax.text import encoder as encoder_lib
from gp_jax.workflow import reward as reward_lib

# The router's PPO settings when none are given: GraphPlanner's, with a faster learning rate and
# no discount (a question's reward comes at its last call).
DEFAULT_PPO = ppo.PPOSettings(learning_rate=1e-3, epochs=4, num_minibatches=4, clip_eps=0.2,
                              gamma=1.0, gae_lambda=0.95, value_coef=0.5, entropy_coef=0.01,
                              max_grad_norm=0.5, value_lr_multiplier=2.0)
COUNSELOR_DEFAULTS = {"max_steps": 10, "max_reflect": 2, "prompt_token_budget": 6000}


@dataclasses.dataclass(frozen=True)
class RouterConfig:
  """Router network, its PPO settings and the update's shapes."""
  hidden: int = 32
  num_layers: int = 2
  mlp_hidden: int = 64
  mem_proj: int = 32           # P: memory-row text projection width
  max_rows: int = 24           # M: the last M calls are the workflow graph's rows
  ppo: ppo.PPOSettings = DEFAULT_PPO
  update_size: int = 256       # transitions per jitted PPO update (one shape)
  forward_batch: int = 8       # the largest decision batch (batches padded to 4 or 8)

  def validate(self) -> "RouterConfig":
    for name in ("hidden", "num_layers", "mlp_hidden", "max_rows", "update_size",
                 "forward_batch"):
      if getattr(self, name) < 1:
        raise errors.ConfigError(f"router {name} must be >= 1, got {getattr(self, name)}")
    if self.update_size % self.ppo.num_minibatches:
      raise errors.ConfigError(f"update_size {self.update_size} must be a multiple of "
                               f"num_minibatches {self.ppo.num_minibatches}")
    if self.mem_proj < 0:
      raise errors.ConfigError(f"router mem_proj must be >= 0, got {self.mem_proj}")
    return self

  @property
  def decision_buckets(self) -> list[int]:
    """Padded decision batch sizes: a few, the largest forward_batch."""
    return batch_lib.padding_buckets(self.forward_batch, max(1, self.forward_batch // 2))


def max_calls(max_steps: int, max_reflect: int) -> int:
  """The most LLM calls (= routing decisions) of one question: max_reflect + 1 trials of
  max_steps (plan, thought, action) steps, a judge and a reflection after every trial but the
  last, and a judge of the last trial (with run_counselor's judge_final_trial)."""
  return (max_reflect + 1) * 3 * max_steps + 2 * max_reflect + 1


@dataclasses.dataclass(frozen=True)
class Router:
  """The routed counselor's fixed pieces (module docstring); no training state.

  Attributes:
    config: the network and update settings.
    featurizer: agent steps -> observations.
    model: the GARNet policy-value network.
    optimizer: the PPO optimizer (ppo.make_optimizer of config.ppo).
    update_fn: the jitted PPO update, (state, hub_features, hist, batch) -> (state, metrics).
    runner: the batched policy of the decisions (its parameters are set per selector).
  """
  config: RouterConfig
  featurizer: features_lib.CounselorFeaturizer
  model: garnet_lib.GARNet
  optimizer: optax.GradientTransformation
  update_fn: Callable
  runner: rollout.PolicyRunner

  @property
  def hub_features(self) -> jax.Array:
    return self.runner.hub_features

  def empty_history(self) -> dict:
    """An empty history table for the update (one padding row in the dropped segment)."""
    return {"rows": jnp.zeros((1, self.featurizer.spec.row_dim), jnp.float32),
            "segment": jnp.full((1,), self.featurizer.num_actions, jnp.int32)}


def make_router(*, catalog: catalog_lib.Catalog, llms: Sequence[str],
                encoder: encoder_lib.TextEncoder, cfg: RouterConfig = RouterConfig(),
                counselor_settings: Mapping[str, Any] | None = None, seed: int = 0) -> Router:
  """The router's pieces over `llms` (catalog names) for a counselor run with
  `counselor_settings` (max_steps, max_reflect, prompt_token_budget; COUNSELOR_DEFAULTS else).

  seed: the memory-row projection's seed (the parameters come from `init_state`)."""
  cfg = cfg.validate()
  s = dict(COUNSELOR_DEFAULTS, **(counselor_settings or {}))
  feat = features_lib.CounselorFeaturizer(
      encoder, catalog, llms, mem_proj=cfg.mem_proj, max_rows=cfg.max_rows,
      max_steps=s["max_steps"], max_reflect=s["max_reflect"],
      prompt_token_budget=s["prompt_token_budget"], seed=seed)
  model = garnet_lib.GARNet(hidden=cfg.hidden, num_layers=cfg.num_layers,
                            mlp_hidden=cfg.mlp_hidden, use_history=False)
  optimizer = ppo.make_optimizer(cfg.ppo)
  return Router(config=cfg, featurizer=feat, model=model, optimizer=optimizer,
                update_fn=ppo.make_update_fn(model, optimizer, cfg.ppo, num_chunks=1),
                runner=rollout.PolicyRunner(model, feat.hub_features, cfg.forward_batch))


def init_state(router: Router, seed: int) -> ppo.TrainingState:
  """Fresh parameters and optimizer state (gp_jax.rl.loop.init_state)."""
  return rl_loop.init_state(router.model, router.featurizer, router.optimizer, seed)


def selector(router: Router, params, *, greedy: bool = True, key: jax.Array | None = None,
             record: bool = False) -> selector_lib.CounselorSelector:
  """An LLMSelector deciding with `params`: greedy, or sampled with per-decision keys from `key`.

  The router's batched policy holds one parameter version: a new selector replaces the
  parameters of the earlier ones."""
  router.runner.set_params(params, None)
  batcher = decisions.DecisionBatcher(router.runner, router.config.decision_buckets, key=key,
                                      greedy=greedy, num_ids=2)
  return selector_lib.CounselorSelector(router.featurizer, batcher, record=record)


def policy_probabilities(router: Router, params, observations: Sequence[dict]) -> np.ndarray:
  """The policy's action probabilities [n, A] at n observations (batches of forward_batch)."""
  router.runner.set_params(params, None)
  out = []
  B = router.config.forward_batch
  for i in range(0, len(observations), B):
    part = list(observations[i:i + B])
    logits, _ = router.runner.scores(graph_features.stack(part, pad_to=B))
    out.append(np.asarray(jax.nn.softmax(jnp.asarray(logits[:len(part)]), -1)))
  return np.concatenate(out) if out else np.zeros((0, router.featurizer.num_actions))


def episode_rewards(calls: Sequence[records.CallRecord], utility: float, alpha: float
                    ) -> np.ndarray:
  """r_t = -alpha * C_t (milli-dollars), plus the utility at the last call."""
  r = np.array([reward_lib.step_reward(c.cost_usd, alpha) for c in calls], np.float32)
  if len(r):
    r[-1] += utility
  return r


Episode = tuple[Sequence[selector_lib.Transition], np.ndarray]   # (decisions, rewards [T])


def update(router: Router, state: ppo.TrainingState, episodes: Sequence[Episode], *,
           num_episodes: int, num_steps: int, seed: int = 0
           ) -> tuple[ppo.TrainingState, dict[str, float]]:
  """PPO on finished episodes: shuffled chunks of `update_size` transitions (packed batches, the
  last one padded with zero weights), one jitted update each, every update running GAE over all
  the episodes on a num_episodes x num_steps grid.

  Args:
    state: the TrainingState before (donated to the jitted update: use the returned one).
    episodes: [(transitions, rewards [T])] in a fixed order, at most num_episodes of at most
      num_steps decisions (the run's batch_questions and max_calls: one shape per run).
    seed: the run's seed; with state.update_step it seeds the chunks' shuffle.
  Returns:
    (the new state, the mean of the chunks' metrics; {} when no episode made a decision).
  """
  episodes = [(tr, r) for tr, r in episodes if len(tr)]
  if not episodes:
    return state, {}
  if any(len(tr) != len(r) for tr, r in episodes):
    raise ValueError("every decision of an episode needs its reward")
  flat = [t for tr, _ in episodes for t in tr]
  n, A = len(flat), router.featurizer.num_actions
  transitions = dict(obs={k: np.stack([t.obs[k] for t in flat]) for k in flat[0].obs},
                     actions=np.array([t.action for t in flat], np.int32),
                     old_logp=np.array([t.logp for t in flat], np.float32),
                     hist_chunk=np.zeros(n, np.int32), hist_count=np.zeros((n, A), np.float32))
  rewards = [r for _, r in episodes]
  values = [[t.value for t in tr] for tr, _ in episodes]
  perm = np.random.default_rng([seed, int(state.update_step)]).permutation(n)
  N = router.config.update_size
  hist = router.empty_history()
  out: list[dict] = []
  for start in range(0, n, N):
    batch = batch_lib.build(transitions, rewards, values, size=N, num_episodes=num_episodes,
                            num_steps=num_steps, order=perm[start:start + N])
    state, m = router.update_fn(state, router.hub_features, hist, batch)
    out.append({k: float(v) for k, v in jax.device_get(m).items()})
  return state, {k: float(np.mean([m[k] for m in out])) for k in out[0]}


@dataclasses.dataclass(frozen=True)
class TrainSettings:
  """What the training loop needs besides the router."""
  alpha: float = 0.05
  episodes: int = 1600
  batch_questions: int = 16
  concurrency: int = 8

  def validate(self) -> "TrainSettings":
    if not (self.alpha >= 0 and math.isfinite(self.alpha)):
      raise errors.ConfigError(f"alpha must be a finite number >= 0, got {self.alpha}")
    if self.episodes < 1 or self.batch_questions < 1 or self.concurrency < 1:
      raise errors.ConfigError("episodes, batch_questions and concurrency must be >= 1")
    return self


async def run_episodes(questions: Sequence[data_lib.GraphQuestion], *, select_llm,
                       funcs: functions_lib.GraphFunctions, pool: base.LLMPool,
                       counselor_settings: Mapping[str, Any], concurrency: int = 8
                       ) -> list[records.CounselorResult]:
  """Graph Counselor on every question (at most `concurrency` in flight), in question order."""
  sem = asyncio.Semaphore(concurrency)

  async def one(q):
    async with sem:
      return await agents.run_counselor(q.question, funcs=funcs, pool=pool,
                                        select_llm=select_llm, qid=q.qid, **counselor_settings)
  # A batched selector's batching task ends with the event loop (asyncio.run cancels it).
  return list(await asyncio.gather(*(one(q) for q in questions)))


def _batch_order(rng: np.random.Generator, order: list[int], n_questions: int, b: int
                 ) -> tuple[list[int], list[int]]:
  """b distinct question indices from a stream of seeded shuffles; repeats wait for the next
  batch. Returns (picked, the stream's rest)."""
  picked: list[int] = []
  later: list[int] = []
  while len(picked) < b:
    if not order:
      order = rng.permutation(n_questions).tolist()
    i = order.pop(0)
    (later if i in picked else picked).append(i)
  return picked, later + order


def train(router: Router, state: ppo.TrainingState,
          questions: Sequence[data_lib.GraphQuestion], *, funcs: functions_lib.GraphFunctions,
          pools: Callable[[int], base.LLMPool], counselor_settings: Mapping[str, Any],
          settings: TrainSettings, seed: int = 0, log: Callable[[str], None] = print
          ) -> tuple[ppo.TrainingState, list[dict]]:
  """PPO on training questions: batches of `batch_questions` questions (cycled in a seeded
  shuffled order), sampled LLMs, one round of updates per batch (host loop, not jittable: LLM
  calls).

  Args:
    state: the TrainingState to start from (init_state).
    pools: the LLM pool of a batch, given a seed drawn per batch (the simulated pool's
      `with_seed` for fresh draws; `lambda _: pool` for one pool).
    counselor_settings: run_counselor's settings (max_steps, max_reflect, ...).
    seed: the run's seed: question order, pool seeds, sampling keys, chunk shuffles.
  Returns:
    (the trained state, per-update logs: episodes done, mean utility, mean $ per question, mean
    reward, PPO metrics).
  """
  settings.validate()
  if not questions:
    raise errors.ConfigError("no training questions")
  s = dict(COUNSELOR_DEFAULTS, **counselor_settings)
  most_calls = max_calls(s["max_steps"], s["max_reflect"])
  rng = np.random.default_rng([seed, 7])
  key = jax.random.PRNGKey(seed)
  order: list[int] = []
  history = []
  done, it, t0 = 0, 0, time.perf_counter()
  n_updates = math.ceil(settings.episodes / settings.batch_questions)
  while done < settings.episodes:
    b = min(settings.batch_questions, settings.episodes - done, len(questions))
    picked, order = _batch_order(rng, order, len(questions), b)
    batch = [questions[i] for i in picked]
    sel = selector(router, state.params, greedy=False, key=jax.random.fold_in(key, it),
                   record=True)
    results = asyncio.run(run_episodes(batch, select_llm=sel, funcs=funcs,
                                       pool=pools(int(rng.integers(2 ** 31))),
                                       counselor_settings=counselor_settings,
                                       concurrency=settings.concurrency))
    episodes, utils, costs, rets = [], [], [], []
    for q, res in zip(batch, results):
      tr = sel.transitions.get(q.qid, [])
      if len(tr) != len(res.calls):
        raise AssertionError(f"{q.qid}: {len(tr)} routing decisions for {len(res.calls)} calls")
      u = metrics.exact_match(res.final_answer, q.answer)
      r = episode_rewards(res.calls, u, settings.alpha)
      episodes.append((tr, r))
      utils.append(u)
      costs.append(res.cost_usd)
      rets.append(float(r.sum()))
    state, m = update(router, state, episodes, num_episodes=settings.batch_questions,
                      num_steps=most_calls, seed=seed)
    done += len(batch)
    it += 1
    row = dict(episodes=done, utility=float(np.mean(utils)), cost_usd=float(np.mean(costs)),
               reward=float(np.mean(rets)),
               **{k: m.get(k, math.nan) for k in ("entropy", "approx_kl", "value_loss")})
    history.append(row)
    if it % max(1, n_updates // 10) == 0 or done >= settings.episodes:
      recent = history[-max(1, n_updates // 10):]
      log(f"  update {it}/{n_updates}: {done} episodes, EM {np.mean([h['utility'] for h in recent]):.3f}"
          f", $/q {np.mean([h['cost_usd'] for h in recent]):.5f}, reward "
          f"{np.mean([h['reward'] for h in recent]):+.3f}, entropy {row['entropy']:.3f}"
          f" ({time.perf_counter() - t0:.0f}s)")
  return state, history
