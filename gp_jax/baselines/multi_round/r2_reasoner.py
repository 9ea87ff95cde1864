"""R2-Reasoner-style router: a decomposer splits the query into sub-questions, a difficulty-aware
subtask allocator gives each sub-question an LLM, and both are trained in stages (SFT, then
group-relative RL, alternating decomposer and allocator).

Source: Shao, Liu, Lin, Xu, Li, "Route-and-Reason: Scaling Large Language Model Reasoning with
Reinforced Model Router" (R2-Reasoner), arXiv 2506.05901 (v1 June 2025, v2); read: its abstract
(v1 and v2) and a public overview of its method. What each part below takes from it, and what is
adapted to GraphPlanner's workflow MDP and simulator:

  Decomposer (faithful in role, adapted in form). R2-Reasoner's task decomposer splits a complex
    query into subtasks in logical order (v1 abstract). Here it is the Planner call of a
    pool LLM (the decomposer LLM P) at the root, which writes one sub-question per step of the
    query up to the MDP's max_width; a flat, one-level decomposition, as R2-Reasoner's list of
    subtasks. R2-Reasoner fine-tunes its own decomposer model; the MDP has no such model, so
    "training" the decomposer is choosing P among the pool LLMs: first from the labels (the
    planner whose plans, executed and merged by one LLM, give the best mean training reward:
    the supervised stage), then again with the refined allocator in the loop (the alternating
    stage, below).
  Subtask allocator (faithful in principle). R2-Reasoner's allocator gives each subtask a model
    of the pool, from small to large, by the subtask's estimated complexity, trading accuracy
    against cost (v1 abstract). Here the allocator estimates one difficulty d(s) per
    sub-question (an MLP over its text embedding) and holds one capability c_m per LLM; the
    predicted success of LLM m on s is sigmoid(c_m - d(s)) (a one-parameter item-response model:
    one difficulty scale, on which the pool is ordered), and the allocation at cost weight alpha
    is argmax_m sigmoid(c_m - d(s)) - alpha * cost_m, cost_m the LLM's mean Executor cost on the
    training sub-questions. R2-Reasoner's allocator is a fine-tuned language model; this is a
    small network with the same inputs (the subtask) and outputs (a model per subtask).
  Staged training (faithful in structure). R2-Reasoner trains its router in stages: supervised
    fine-tuning on task-specific data, then Group Relative Policy Optimization (v1 abstract), the
    decomposer and the allocator in two alternating stages (v2 abstract). Here:
      1. SFT (alpha-independent, once per fit): the allocator is fitted by cross-entropy to the
         soft labels of the training sub-questions (knn.collect_pipeline_labels: every pool
         planner's sub-questions of every training query, each executed by every LLM; the label
         is the simulator's exact success probability, on real backends the realised utility of
         the pipeline), full-batch Adam in one jitted scan.
      2. GRPO (per alpha): for a batch of training queries the decomposer's sub-questions are
         allocated `group` times by sampling the allocator's policy softmax(score / temperature);
         each episode's reward is the environment's (E[U | calls] - alpha * cost on the
         simulator, as for every method here); its advantage is the reward minus its group's
         mean, over the group's standard deviation; the loss is minus the advantage-weighted
         log-probability of the allocations plus kl_coef times the KL divergence to the SFT
         allocator. One gradient step per batch, so the clipped ratio of GRPO is 1 and its clip
         never acts (adapted: a single policy-gradient step per group of rollouts).
      3. Alternation: with the refined allocator, the decomposer is chosen again (the planner of
         the pool whose pipeline, allocated greedily by the allocator, has the best mean reward
         on up to `select_queries` training queries); if it changed, step 2 runs again for it,
         up to `rounds` rounds.
  Merge (adapted). R2-Reasoner answers the subtasks in order and the last one gives the answer;
    the MDP requires a Summarizer and a final Executor after a plan, so the merge LLM G (chosen
    with P in stage 1, from the labels) summarises and answers, as in the KNN-multiround pipeline.
  Not reproduced: the pool (R2-Reasoner routes among 9 models from <1B to hundreds of billions of
    parameters; here the configured pool), its datasets and its reported numbers, and any
    dependency structure between subtasks.

Every call is made through the same WorkflowEnv as GraphPlanner's, so costs and utilities are
accounted identically; fit() and train() see only the training queries; the router is
deterministic given its seed.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from gp_jax import errors
from gp_jax.baselines import regressors
from gp_jax.baselines.multi_round import base
from gp_jax.baselines.multi_round import knn
from gp_jax.types import Query
from gp_jax.util import aio


@dataclasses.dataclass(frozen=True)
class R2Settings:
  """hidden: width of the difficulty MLP's hidden layer. sft_steps, sft_learning_rate,
  weight_decay: stage 1. episodes: GRPO episodes per round (queries x group); batch: queries per
  GRPO step; group: allocations sampled per query; temperature: of the allocation policy
  softmax(score / temperature); kl_coef: weight of the KL divergence to the SFT allocator;
  learning_rate: GRPO's Adam rate; rounds: decomposer/allocator alternations; select_queries:
  training queries used to choose the decomposer in the alternation."""
  hidden: int = 64
  sft_steps: int = 300
  sft_learning_rate: float = 1e-2
  weight_decay: float = 1e-3
  episodes: int = 512
  batch: int = 16
  group: int = 4
  temperature: float = 0.1
  kl_coef: float = 0.04
  learning_rate: float = 3e-3
  rounds: int = 2
  select_queries: int = 256

  def validate(self) -> None:
    ints = dict(hidden=self.hidden, sft_steps=self.sft_steps, episodes=self.episodes,
                batch=self.batch, group=self.group, rounds=self.rounds,
                select_queries=self.select_queries)
    bad = [k for k, v in ints.items() if v < 1]
    if self.group < 2:
      bad.append("group (>= 2: advantages are relative to the group)")
    if self.temperature <= 0 or self.kl_coef < 0 or self.learning_rate <= 0:
      bad.append("temperature, learning_rate (> 0) or kl_coef (>= 0)")
    if bad:
      raise errors.ConfigError(f"r2_reasoner settings out of range: {', '.join(bad)} "
                               "(integers must be >= 1)")


# ---- the allocator: pure functions of its parameters ------------------------------------------

def init_allocator(key: jax.Array, dim: int, num_llms: int, hidden: int) -> dict:
  """{"difficulty": MLP [dim -> hidden -> 1], "capability": [M]} (capabilities start equal)."""
  return dict(difficulty=regressors.init_mlp(key, [dim, hidden, 1]),
              capability=jnp.zeros((num_llms,), jnp.float32))


def difficulty(params: dict, xs: jax.Array) -> jax.Array:
  """[B, D] standardised sub-question features -> [B] estimated difficulty."""
  return regressors.mlp_apply(params["difficulty"], xs)[:, 0]


def success(params: dict, xs: jax.Array) -> jax.Array:
  """[B, M] predicted success of LLM m on sub-question b: sigmoid(c_m - d_b)."""
  return jax.nn.sigmoid(params["capability"][None, :] - difficulty(params, xs)[:, None])


def scores(params: dict, xs: jax.Array, cost: jax.Array, alpha: float) -> jax.Array:
  """[B, M] allocation scores: predicted success - alpha * the LLM's mean cost units."""
  return success(params, xs) - alpha * cost[None, :]


scores_jit = jax.jit(scores)   # scores in one compiled call (R2Reasoner.scores pads its rows)


def sft_loss(params: dict, key, xs: jax.Array, utility: jax.Array, *, weight_decay: float):
  """Cross-entropy of the predicted success to the soft labels [S, M], plus L2 on the MLP."""
  del key
  logits = params["capability"][None, :] - difficulty(params, xs)[:, None]
  ce = optax.sigmoid_binary_cross_entropy(logits, utility).mean()
  return ce + weight_decay * sum(jnp.sum(p["w"] ** 2) for p in params["difficulty"])


def grpo_loss(params: dict, ref_params: dict, xs: jax.Array, chosen: jax.Array, adv: jax.Array,
              valid: jax.Array, cost: jax.Array, alpha: float, *, temperature: float,
              kl_coef: float, num_episodes: int):
  """GRPO with one step per batch: -sum(adv * log pi(chosen)) / episodes + kl_coef * mean KL.

  xs [T, D]: every allocated sub-question of the batch's episodes (padded to a fixed T, so one
  compilation serves every batch); chosen [T] the LLM
  sampled for it; adv [T] its episode's group-relative advantage; valid [T] 1 on real rows."""
  logp = jax.nn.log_softmax(scores(params, xs, cost, alpha) / temperature)
  ref = jax.nn.log_softmax(scores(ref_params, xs, cost, alpha) / temperature)
  taken = jnp.take_along_axis(logp, chosen[:, None], 1)[:, 0]
  pg = -jnp.sum(valid * adv * taken) / num_episodes
  kl = jnp.sum(valid * jnp.sum(jnp.exp(logp) * (logp - jax.lax.stop_gradient(ref)), -1))
  return pg + kl_coef * kl / jnp.maximum(jnp.sum(valid), 1.0)


@functools.lru_cache(maxsize=16)
def make_grpo_step(temperature: float, kl_coef: float, learning_rate: float, num_episodes: int):
  """step(params, opt_state, ref, xs, chosen, adv, valid, cost, alpha) -> (params, opt_state,
  loss): one jitted Adam step of grpo_loss (cached per setting, so sweep cells share it)."""
  opt = optax.adam(learning_rate)
  loss = functools.partial(grpo_loss, temperature=temperature, kl_coef=kl_coef,
                           num_episodes=num_episodes)

  def step(params, opt_state, ref, xs, chosen, adv, valid, cost, alpha):
    value, grads = jax.value_and_grad(loss)(params, ref, xs, chosen, adv, valid, cost, alpha)
    updates, opt_state = opt.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, value
  return opt, jax.jit(step)


def group_advantages(rewards: np.ndarray) -> np.ndarray:
  """[Q, G] episode rewards -> [Q, G] (reward - group mean) / group std (0 where the std is 0)."""
  mean = rewards.mean(1, keepdims=True)
  std = rewards.std(1, keepdims=True)
  return np.where(std > 1e-8, (rewards - mean) / np.maximum(std, 1e-8), 0.0).astype(np.float32)


class R2Reasoner(base.MultiRoundRouter):
  """Decomposer (Planner P) -> difficulty-aware allocator per sub-question -> merge (G)."""

  def __init__(self, settings: R2Settings = R2Settings()):
    settings.validate()
    self.settings = settings

  # ---- stage 1: labels and SFT (alpha-independent) -------------------------------------------
  def fit(self, system, queries, *, seed):
    self.system, self.queries, self.seed = system, list(queries), seed
    self.space, self.encoder = system.space, system.encoder
    self.llms = tuple(system.space.llms)
    self.labels = knn.collect_pipeline_labels(system, self.queries, seed=seed)
    xs = [s.x for s in self.labels.subs if len(s.x)]
    if not xs:
      raise errors.ConfigError("r2_reasoner: no planner of the pool wrote a sub-question for the "
                               "training queries; nothing to train the allocator on")
    x = np.concatenate(xs)
    utility = np.concatenate([s.utility for s in self.labels.subs if len(s.x)])
    sub_cost = np.concatenate([s.cost for s in self.labels.subs if len(s.x)])
    self.scale = regressors.Standardizer.fit(x, sub_cost)
    self.cost = jnp.asarray(sub_cost.mean(0), jnp.float32)             # [M] cost units
    s = self.settings
    params = init_allocator(jax.random.PRNGKey(seed), x.shape[1], len(self.llms), s.hidden)
    loss = functools.partial(sft_loss, weight_decay=s.weight_decay)
    self.sft_params, losses = regressors.train_full_batch(
        loss, params, optax.adam(s.sft_learning_rate), jnp.zeros(s.sft_steps),
        jnp.asarray(self.scale.features(x)), jnp.asarray(utility, jnp.float32))
    self.sft_loss = np.asarray(losses)
    self._feat: dict[str, np.ndarray] = {}
    self.trained: dict[float, dict] = {}
    return self

  def features(self, texts: list[str]) -> np.ndarray:
    """[len(texts), D] standardised embeddings (cached per text)."""
    new = [t for t in dict.fromkeys(texts) if t not in self._feat]
    if new:
      x = np.asarray(self.encoder.encode(new), np.float32)
      self._feat.update(zip(new, self.scale.features(x)))
    return np.stack([self._feat[t] for t in texts]) if texts else np.zeros(
        (0, len(self.scale.x_mean)), np.float32)

  def scores(self, params: dict, texts: list[str], alpha: float) -> np.ndarray:
    """[len(texts), M] allocation scores. The rows are padded to a power of two (at least 8), so
    the jitted scoring compiles once per size class, not once per number of texts."""
    x = self.features(texts)
    size = max(8, 1 << max(0, len(texts) - 1).bit_length())
    padded = np.zeros((size, x.shape[1]), np.float32)
    padded[:len(texts)] = x
    sc = scores_jit(params, jnp.asarray(padded), self.cost, jnp.float32(alpha))
    return np.asarray(sc)[:len(texts)]

  def allocate(self, params: dict, texts: list[str], alpha: float) -> list[str]:
    """The greedy allocation: per sub-question text, the LLM of the highest score."""
    return [self.llms[int(i)] for i in np.argmax(self.scores(params, texts, alpha), 1)]

  # ---- rollouts of the decompose-allocate-merge pipeline ------------------------------------
  def _rollout(self, env, queries: list[Query], planner: str, merger: str, choose, *,
               seed_base: int) -> tuple[list, list[list[tuple[str, int]]]]:
    """Runs the pipeline on `queries`; choose(texts) -> LLM indices for the sub-questions to
    allocate this round. Returns (finished states, per episode its (text, LLM index) choices)."""
    picks: list[list[tuple[str, int]]] = [[] for _ in queries]

    async def decide(active, states, masks):
      acts: list = [base.pipeline_action(self.space, s, m, planner=planner, merger=merger,
                                         executor=None) for s, m in zip(states, masks)]
      todo = [j for j, a in enumerate(acts) if not isinstance(a, int)]
      if todo:
        chosen = choose([acts[j][1] for j in todo])
        for j, c in zip(todo, chosen):
          picks[active[j]].append((acts[j][1], int(c)))
          acts[j] = base.pick_action(self.space, masks[j], "executor", self.llms[int(c)])
      return acts

    states = aio.run(base.lockstep(env, queries, decide, seed_base=seed_base))
    return states, picks

  def _episode_reward(self, env, state, q: Query) -> float:
    return env.reward_utility(state, q) - env.alpha * env.cost_units(state)

  def _mean_reward(self, env, params, planner: str, merger: str, queries: list[Query],
                   alpha: float) -> float:
    choose = lambda texts: [self.llms.index(m) for m in self.allocate(params, texts, alpha)]
    states, _ = self._rollout(env, queries, planner, merger, choose,
                              seed_base=self.seed * 100003)
    return float(np.mean([self._episode_reward(env, s, q) for s, q in zip(states, queries)]))

  # ---- stages 2 and 3: GRPO and the decomposer/allocator alternation (per alpha) ------------
  def _grpo(self, env, params, planner: str, merger: str, alpha: float, round_: int
            ) -> tuple[dict, list[float], list[float]]:
    s = self.settings
    opt, step = make_grpo_step(s.temperature, s.kl_coef, s.learning_rate, s.batch * s.group)
    opt_state = opt.init(params)
    rows = s.batch * s.group * self.system.mdp_cfg.step_cap   # >= the Executor calls of a batch
    rng = np.random.default_rng([self.seed, round_, int(round(alpha * 1e6))])
    order: list[int] = []
    mean_rewards, losses = [], []
    for it in range(max(1, s.episodes // (s.batch * s.group))):
      while len(order) < s.batch:
        order += list(rng.permutation(len(self.queries)))
      idx, order = order[:s.batch], order[s.batch:]
      batch = [self.queries[i] for i in idx for _ in range(s.group)]

      def choose(texts, params=params):
        z = self.scores(params, texts, alpha).astype(np.float64) / s.temperature
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        return [int(rng.choice(len(self.llms), p=row)) for row in p]

      states, picks = self._rollout(env, batch, planner, merger, choose,
                                    seed_base=(self.seed * 1009 + round_ * 97 + it) * 100003)
      rewards = np.array([self._episode_reward(env, st, q) for st, q in zip(states, batch)],
                         np.float32).reshape(s.batch, s.group)
      adv = group_advantages(rewards).reshape(-1)
      xs = np.zeros((rows, self.features([]).shape[1]), np.float32)
      chosen = np.zeros(rows, np.int32)
      advs, valid = np.zeros(rows, np.float32), np.zeros(rows, np.float32)
      r = 0
      for e, ep in enumerate(picks):
        for text, c in ep:
          xs[r], chosen[r], advs[r], valid[r] = self.features([text])[0], c, adv[e], 1.0
          r += 1
      params, opt_state, loss = step(params, opt_state, self.sft_params, xs, chosen, advs, valid,
                                     self.cost, jnp.float32(alpha))
      mean_rewards.append(float(rewards.mean()))
      losses.append(float(loss))
    return params, mean_rewards, losses

  def train(self, alpha: float) -> dict:
    """Stages 2-3 at `alpha` (cached per alpha): {"params", "planner", "merger",
    "planners" [per round], "mean_reward" [per GRPO step], "loss" [...]}."""
    if alpha in self.trained:
      return self.trained[alpha]
    env = self.system.env(alpha)
    p, g = self.labels.best_pipeline(alpha)
    planner, merger = self.llms[p], self.llms[g]
    params = self.sft_params
    planners, rewards, losses = [planner], [], []
    select = self.queries[:self.settings.select_queries]
    for round_ in range(self.settings.rounds):
      params, r, l = self._grpo(env, params, planner, merger, alpha, round_)
      rewards += r
      losses += l
      if round_ + 1 == self.settings.rounds:
        break
      means = [self._mean_reward(env, params, m, merger, select, alpha) for m in self.llms]
      best = self.llms[int(np.argmax(means))]
      if best == planner:
        break
      planner = best
      planners.append(planner)
    self.trained[alpha] = dict(params=params, planner=planner, merger=merger, planners=planners,
                               mean_reward=rewards, loss=losses)
    return self.trained[alpha]

  def policy(self, alpha):
    t = self.train(alpha)
    cache: dict[str, str] = {}

    def act(query, state, mask, rng):
      a = base.pipeline_action(self.space, state, mask, planner=t["planner"], merger=t["merger"],
                               executor=None)
      if isinstance(a, int):
        return a
      if a[1] not in cache:
        cache[a[1]] = self.allocate(t["params"], [a[1]], alpha)[0]
      return base.pick_action(self.space, mask, "executor", cache[a[1]])
    return act
