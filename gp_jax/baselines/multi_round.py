"""Multi-round baseline routers: several LLM calls per query, each call routed separately.

Every router here is a policy of the same WorkflowEnv as GraphPlanner, so the cost of each call and
the final utility are accounted exactly as for GraphPlanner; each is fitted on the training queries
only and is deterministic given its seed.

  knn        LLMRouter-style KNN-multiround, a decompose-route-merge pipeline: a Planner P splits
             the query; each sub-question's Executor is routed by k-nearest neighbours over labelled
             training sub-questions; a Summarizer and the final root Executor (one merge LLM G)
             merge the answers. The workflow is Planner(P) -> Executor(e_i) per sub-question ->
             Summarizer(G) -> final Executor(G); e_i = argmax_m u_knn(i, m) - alpha * c_knn(i, m).
  llm        LLMRouter-style LLM-multiround: the same pipeline with the router LLM as planner and
             merger and a prompted, untrained router choosing each sub-question's Executor.
  router_r1  Router-R1-style sequential router: a small MLP policy trained with PPO that decides,
             turn by turn, whether the router LLM answers the query (or one pool LLM answers it in
             a single turn), or splits it into turns, then which LLM executes each turn; the router
             LLM summarises and answers.

Labels of the KNN pipeline (`collect_pipeline_labels`, alpha-independent): for every planner P of
the pool and every training query, P plans the query once; then, for every LLM m, m executes every
sub-question P wrote, summarises and gives the final answer (M^2 pipelines per query, the planner
call shared). A sub-question's label for m is, on the simulator, the analytic success probability
world.exec_probability of m on it (no sampling noise, as in labels.py); on real backends
sub-questions have no gold answer, so it is the realised utility of the whole pipeline in which m
executed every sub-question. Its cost label is the cost units of m's Executor call on it. At a
given alpha, (P, G) = argmax over (planner, m) of the mean training reward of the pipeline "P plans,
m does everything else", and the sub-question KNN uses the labels of P's sub-questions.

The routers' own decisions cost nothing in the reward, as for GraphPlanner's policy network; the
prompted router's routing calls on real backends are real LLM calls, counted apart
(LLMMultiRound.routing_calls / routing_cost_units) and not charged in the workflow reward.
"""
from __future__ import annotations

import abc
import asyncio
import copy
import dataclasses
import functools
from typing import Awaitable, Callable, NamedTuple, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from gp_jax import errors
from gp_jax.baselines import regressors
from gp_jax.llm import base
from gp_jax.llm import catalog as catalog_lib
from gp_jax.rl import gae as gae_lib
from gp_jax.rl import ppo as ppo_lib
from gp_jax.sim import simulator as sim
from gp_jax.sim.scoring import Row, optimum_rows, summarize
from gp_jax.types import Query
from gp_jax.util import aio
from gp_jax.workflow import env as env_lib
from gp_jax.workflow import mdp
from gp_jax.workflow import policies
from gp_jax.workflow import reward as reward_lib

ROW_PREFIX = "multi:"


# ---- shared pieces -------------------------------------------------------------------------------

def default_router_llm(catalog: catalog_lib.Catalog, llms: Sequence[str]) -> str:
  """The router LLM when none is configured: the cheapest LLM of the pool (first in pool order).

  On the shipped pools this is qwen2.5-7b-instruct, a 7B Qwen2.5 like Router-R1's router."""
  prices = [catalog[m].price_in + catalog[m].price_out for m in llms]
  return llms[int(np.argmin(prices))]


def resolve_router_llm(system, name: str) -> str:
  llms = list(system.space.llms)
  if not name:
    return default_router_llm(system.catalog, llms)
  if name not in llms:
    raise errors.unknown_name("router LLM", name, llms)
  return name


def pick_action(space: mdp.ActionSpace, mask: np.ndarray, kind: str, llm: str) -> int:
  """Action (first role of `kind`, `llm`) if valid; else a valid action of `llm` in any role, else a
  valid action of `kind` with any LLM, else the first valid action (forced steps, e.g. Phase 1)."""
  col = np.arange(space.size) % space.num_llms == list(space.llms).index(llm)
  of_kind = space.kind_mask([kind])
  for cand in (mask & of_kind & col, mask & col, mask & of_kind, mask):
    nz = np.flatnonzero(cand)
    if nz.size:
      return int(nz[0])
  raise ValueError("no valid action: the episode is finished")


def pipeline_action(space: mdp.ActionSpace, state: mdp.WorkflowState, mask: np.ndarray, *,
                    planner: str, merger: str, executor: str | None) -> tuple[str, str] | int:
  """The decompose-route-merge workflow: Planner(planner) at the root, Executor per sub-question,
  Summarizer(merger), final Executor(merger). Returns an action, or ("executor", node text) when the
  current node's Executor must be routed (`executor` None). A root that cannot be planned (no
  planner role, p_max = 0, or a plan with no sub-questions) is answered directly by a routed
  Executor."""
  node = state.node
  if state.at_final_answer:
    return pick_action(space, mask, "executor", merger)
  if node.status == mdp.PLANNING:
    return pick_action(space, mask, "summarizer", merger)
  if node.id == 0 and not node.plan_failed and (mask & space.kind_mask(["planner"])).any():
    return pick_action(space, mask, "planner", planner)
  if executor is not None:
    return pick_action(space, mask, "executor", executor)
  return ("executor", node.text)


# decide(indices of the unfinished episodes, their states, their masks) -> their actions
Decide = Callable[[list[int], list[mdp.WorkflowState], list[np.ndarray]], Awaitable[list[int]]]


async def _lockstep(env: env_lib.WorkflowEnv, queries: list[Query], decide: Decide, *,
                    seed_base: int) -> list[mdp.WorkflowState]:
  """Runs all episodes together: each round, `decide` picks the actions of every unfinished episode
  at once (one batched network call, or concurrent routing prompts), then their LLM calls are made
  concurrently. Episode i samples with seed seed_base + i."""
  states = [env.reset(q) for q in queries]
  while True:
    active = [i for i, s in enumerate(states) if not s.done]
    if not active:
      return states
    masks = [env.mask(states[i]) for i in active]
    actions = await decide(active, [states[i] for i in active], masks)
    await asyncio.gather(*(env.step(states[i], queries[i], int(a), seed=seed_base + i)
                           for i, a in zip(active, actions)))


def _episode_utility(system, env: env_lib.WorkflowEnv, state: mdp.WorkflowState, q: Query) -> float:
  """E[U | calls] on the simulator, the realised score elsewhere (as the evaluation reports)."""
  if not system.simulated:
    return env.utility(state, q)
  return sim.expected_utility(system.world, state)


class MultiRoundRouter(abc.ABC):
  """fit(system, train_queries, seed) once; run(system, alpha, queries, seed) -> finished states."""

  @abc.abstractmethod
  def fit(self, system, queries: list[Query], *, seed: int) -> "MultiRoundRouter":
    """Fits the router on the training queries; returns self."""

  @abc.abstractmethod
  def policy(self, alpha: float) -> policies.Policy:
    """A synchronous policy for gp_jax.workflow.policies.run_policy (tests, single queries)."""

  def run(self, system, alpha: float, queries: list[Query], *, seed: int
          ) -> list[mdp.WorkflowState]:
    env = system.env(alpha)
    act = self.policy(alpha)

    async def decide(active, states, masks):
      return [act(queries[i], s, m, None) for i, s, m in zip(active, states, masks)]
    return aio.run(_lockstep(env, queries, decide, seed_base=seed * 100003))


# ---- pipeline labels and the KNN-multiround router -----------------------------------------------

@dataclasses.dataclass(frozen=True)
class SubQuestionLabels:
  """Labels of the sub-questions one planner wrote for the training queries.

  x: [S, D] float32 embeddings; utility, cost: [S, M] float32 (LLM m executing sub-question s)."""
  x: np.ndarray
  utility: np.ndarray
  cost: np.ndarray


@dataclasses.dataclass(frozen=True)
class PipelineLabels:
  """Alpha-independent training data of the decompose-route-merge pipelines.

  llms: the M LLM names (action-space order).
  utility, cost: [M, N, M] float32; [p, n, m] = utility / cost units of the pipeline in which
    planner p plans training query n and LLM m does everything else.
  subs: per planner p, the labels of its sub-questions.
  """
  llms: tuple[str, ...]
  utility: np.ndarray
  cost: np.ndarray
  subs: tuple[SubQuestionLabels, ...]

  def best_pipeline(self, alpha: float) -> tuple[int, int]:
    """(planner index, merge LLM index) with the best mean training reward at alpha."""
    r = (self.utility - alpha * self.cost).mean(1)          # [P, M]
    p, m = np.unravel_index(int(np.argmax(r)), r.shape)
    return int(p), int(m)


def collect_pipeline_labels(system, queries: list[Query], *, seed: int = 0,
                            concurrency: int = 64) -> PipelineLabels:
  """Runs the M^2 pipelines per training query (planner call shared) and returns their labels."""
  space, llms = system.space, tuple(system.space.llms)
  env = system.env(0.0)          # utility and cost are recorded separately
  sem = asyncio.Semaphore(concurrency)

  async def finish(state, q, m, s_seed):
    while not state.done:
      a = pipeline_action(space, state, env.mask(state), planner=m, merger=m, executor=m)
      await env.step(state, q, a, seed=s_seed)
    return state

  async def one(p: str, n: int, q: Query):
    async with sem:
      state, s_seed = env.reset(q), seed * 100003 + n
      mask = env.mask(state)
      if not (mask & space.kind_mask(["planner"])).any():
        raise errors.ConfigError("the KNN multi-round router needs a planner role and "
                                 "config.mdp.p_max >= 1")
      await env.step(state, q, pick_action(space, mask, "planner", p), seed=s_seed)
      return await asyncio.gather(*(finish(copy.deepcopy(state), q, m, s_seed) for m in llms))

  async def all_runs():
    return await asyncio.gather(*(one(p, n, q) for p in llms for n, q in enumerate(queries)))

  runs = aio.run(all_runs())
  M, N = len(llms), len(queries)
  utility = np.zeros((M, N, M), np.float32)
  cost = np.zeros_like(utility)
  subs = []
  for p in range(M):
    texts, su, sc = [], [], []
    for n, q in enumerate(queries):
      states = runs[p * N + n]
      for m, s in enumerate(states):
        utility[p, n, m] = _episode_utility(system, env, s, q)
        cost[p, n, m] = env.cost_units(s)
      for c in states[0].nodes[0].children:
        texts.append(states[0].nodes[c].text)
        su.append([_sub_utility(system, s, c, utility[p, n, m]) for m, s in enumerate(states)])
        sc.append([_sub_cost(s, c) for s in states])
    x = (np.asarray(system.encoder.encode(texts), np.float32) if texts
         else np.zeros((0, system.encoder.dim), np.float32))
    subs.append(SubQuestionLabels(x, np.asarray(su, np.float32).reshape(-1, M),
                                  np.asarray(sc, np.float32).reshape(-1, M)))
  return PipelineLabels(llms, utility, cost, tuple(subs))


def _sub_call(state: mdp.WorkflowState, node_id: int) -> mdp.Call | None:
  return next((c for c in state.calls if c.node == node_id and c.kind == "executor"), None)


def _sub_utility(system, state, node_id: int, pipeline_utility: float) -> float:
  call = _sub_call(state, node_id)
  if call is None or call.error is not None:
    return 0.0
  if not system.simulated:
    return float(pipeline_utility)
  info = system.world.lookup(state.nodes[node_id].text)
  return system.world.exec_probability(info, call.llm) if info is not None else 0.0


def _sub_cost(state, node_id: int) -> float:
  call = _sub_call(state, node_id)
  return reward_lib.cost_units(call.cost_usd) if call is not None else 0.0


class KNNMultiRound(MultiRoundRouter):
  """Decompose (planner P) -> route each sub-question by KNN -> merge (G), P and G per alpha."""

  def __init__(self, *, k: int = 10):
    if k < 1:
      raise errors.ConfigError(f"knn k must be >= 1, got {k}")
    self.k = k

  def fit(self, system, queries, *, seed):
    self.space, self.encoder = system.space, system.encoder
    self.labels = collect_pipeline_labels(system, queries, seed=seed)
    return self

  def route(self, subs: SubQuestionLabels, x: np.ndarray, alpha: float) -> np.ndarray:
    """[B, D] sub-question embeddings -> [B] LLM indices, argmax of KNN utility - alpha * cost."""
    u, c = regressors.knn_predict(subs.x, subs.utility, subs.cost, x, k=self.k)
    return np.argmax(u - alpha * c, axis=1)

  def policy(self, alpha):
    p, g = self.labels.best_pipeline(alpha)
    llms, subs = self.labels.llms, self.labels.subs[p]
    cache: dict[str, str] = {}

    def act(query, state, mask, rng):
      a = pipeline_action(self.space, state, mask, planner=llms[p], merger=llms[g], executor=None)
      if isinstance(a, int):
        return a
      text = a[1]
      if text not in cache:
        if len(subs.x) == 0:         # the planner never produced sub-questions in training
          cache[text] = llms[g]
        else:
          cache[text] = llms[int(self.route(subs, self.encoder.encode([text]), alpha)[0])]
      return pick_action(self.space, mask, "executor", cache[text])
    return act


# ---- the LLM-multiround router -------------------------------------------------------------------

ROUTER_PROMPT = (
    "You route questions to language models. Candidates (name: description; price in $ per "
    "million tokens):\n{candidates}\n"
    "Cost weight: {alpha:g} (0: only answer quality matters; larger: prefer cheaper models).\n"
    "Question: {question}\n"
    "Reply with the name of the one candidate that should answer the question, and nothing else.")


def parse_model_choice(text: str, names: Sequence[str], default: str) -> str:
  """The candidate named earliest in `text` (case-insensitive; at one position the longest name
  wins); `default` when no candidate is named."""
  low = text.lower()
  found = [(low.find(n.lower()), -len(n), n) for n in names if n.lower() in low]
  return min(found)[2] if found else default


def heuristic_scores(x: np.ndarray, llm_x: np.ndarray, price_scale: np.ndarray,
                     alpha: float) -> np.ndarray:
  """Zero-shot stand-in of the prompted router on the simulator.

  score[b, m] = cos(x_b, llm_x_m) - alpha * price_scale_m, with x [B, D] the sub-question
  embeddings, llm_x [M, D] the embeddings of the LLMs' catalog descriptions and price_scale [M] =
  the LLM's mean $/M-token price over the largest in the pool (in (0, 1]). Returns [B, M]; the
  router takes the argmax (ties: pool order)."""
  return regressors._unit(x) @ regressors._unit(llm_x).T - alpha * price_scale[None, :]


class LLMMultiRound(MultiRoundRouter):
  """Decompose (router LLM) -> a prompted router picks each sub-question's Executor -> merge (router
  LLM). Untrained: it never looks at the training labels.

  On real backends the router is the router LLM, prompted (ROUTER_PROMPT) with the sub-question, the
  cost weight and the pool's names, descriptions and prices; its reply is parsed by
  parse_model_choice, and a reply that names no pool LLM falls back to the router LLM itself. The
  simulator cannot answer such a prompt (it only simulates the workflow roles), so there the
  "prompted router" is a stand-in: the untrained heuristic of `heuristic_scores` (cosine of the
  sub-question and description embeddings minus alpha times the price scale). Its numbers describe
  that heuristic, not an LLM prompted to route.
  """

  def __init__(self, *, router_llm: str = ""):
    self.router_llm_name = router_llm

  def fit(self, system, queries, *, seed):
    del queries, seed   # untrained
    self.space, self.encoder, self.pool = system.space, system.encoder, system.pool
    self.simulated = system.simulated
    self.router_llm = resolve_router_llm(system, self.router_llm_name)
    self.llms = list(system.space.llms)
    specs = [system.catalog[m] for m in self.llms]
    self.llm_x = np.asarray(self.encoder.encode([s.description for s in specs]), np.float32)
    price = np.array([(s.price_in + s.price_out) / 2 for s in specs], np.float32)
    self.price_scale = price / price.max()
    self.candidates = "\n".join(
        f"{s.name}: {s.description}; {s.price_in:g} in / {s.price_out:g} out" for s in specs)
    self.routing_calls, self.routing_cost_usd = 0, 0.0
    return self

  @property
  def routing_cost_units(self) -> float:
    return reward_lib.cost_units(self.routing_cost_usd)

  def heuristic_route(self, text: str, alpha: float) -> str:
    x = np.asarray(self.encoder.encode([text]), np.float32)
    return self.llms[int(np.argmax(heuristic_scores(x, self.llm_x, self.price_scale, alpha)[0]))]

  async def prompted_route(self, text: str, alpha: float) -> str:
    """Real backends: asks the router LLM which pool LLM should answer `text`."""
    msg = ROUTER_PROMPT.format(candidates=self.candidates, alpha=alpha, question=text)
    out = await self.pool.chat(self.router_llm, [{"role": "user", "content": msg}],
                               base.SamplingParams(temperature=0.0, max_tokens=32))
    self.routing_calls += 1
    self.routing_cost_usd += out.cost_usd
    return parse_model_choice(out.text if out.ok else "", self.llms, self.router_llm)

  def _action(self, state, mask):
    return pipeline_action(self.space, state, mask, planner=self.router_llm,
                           merger=self.router_llm, executor=None)

  def policy(self, alpha):
    if not self.simulated:
      raise errors.ConfigError("the synchronous LLM-multiround policy is the simulator's "
                               "heuristic; on real backends use run(), which prompts the router "
                               "LLM")
    cache: dict[str, str] = {}

    def act(query, state, mask, rng):
      a = self._action(state, mask)
      if isinstance(a, int):
        return a
      if a[1] not in cache:
        cache[a[1]] = self.heuristic_route(a[1], alpha)
      return pick_action(self.space, mask, "executor", cache[a[1]])
    return act

  def run(self, system, alpha, queries, *, seed):
    if self.simulated:
      return super().run(system, alpha, queries, seed=seed)
    env = system.env(alpha)

    async def one(state, mask):
      a = self._action(state, mask)
      if isinstance(a, int):
        return a
      return pick_action(self.space, mask, "executor", await self.prompted_route(a[1], alpha))

    async def decide(active, states, masks):
      return await asyncio.gather(*(one(s, m) for s, m in zip(states, masks)))
    return aio.run(_lockstep(env, queries, decide, seed_base=seed * 100003))


# ---- the Router-R1-style PPO router --------------------------------------------------------------

class R1Net(nn.Module):
  """Policy and value MLPs over one observation [..., F]: logits [..., A] and value [...]."""
  num_actions: int
  hidden: int

  @nn.compact
  def __call__(self, obs):
    h = nn.relu(nn.Dense(self.hidden, name="pi_0")(obs))
    h = nn.relu(nn.Dense(self.hidden, name="pi_1")(h))
    logits = nn.Dense(self.num_actions, name="pi_out",
                      kernel_init=nn.initializers.variance_scaling(0.01, "fan_in", "normal"))(h)
    v = nn.relu(nn.Dense(self.hidden, name="v_0")(obs))
    v = nn.relu(nn.Dense(self.hidden, name="v_1")(v))
    return logits, nn.Dense(1, name="v_out")(v)[..., 0]


class PPOSettings(NamedTuple):
  """Router-R1's PPO hyperparameters (hashable: they key the cached jitted update)."""
  learning_rate: float = 1e-3
  epochs: int = 4
  num_minibatches: int = 2
  clip_eps: float = 0.2
  gamma: float = 0.99
  gae_lambda: float = 0.95
  value_coef: float = 0.5
  entropy_coef: float = 0.01
  max_grad_norm: float = 0.5


def _masked(logits, mask):
  return jnp.where(mask, logits, -1e9)


@functools.partial(jax.jit, static_argnums=(0, 5))
def _act(net: R1Net, params, obs, mask, key, greedy: bool):
  """obs [B, F], mask [B, A] -> actions [B], their log-probabilities [B], values [B]."""
  logits, values = net.apply(params, obs)
  logits = _masked(logits, mask)
  actions = jnp.argmax(logits, -1) if greedy else jax.random.categorical(key, logits)
  logp = jnp.take_along_axis(jax.nn.log_softmax(logits), actions[:, None], 1)[:, 0]
  return actions, logp, values


def prepare_batch(traj: dict, hp: PPOSettings) -> dict:
  """Trajectories [B, T] (obs [B, T, F], mask [B, T, A], actions, logp, values, rewards, dones,
  weights) -> flat transitions [B*T] with GAE advantages (normalised over real steps) and returns
  A + V. The value after the last step of an episode is 0 (discount gamma * (1 - done))."""
  B, T = traj["rewards"].shape
  values = jnp.concatenate([traj["values"], jnp.zeros((B, 1))], 1)
  adv = gae_lib.batched_gae(traj["rewards"], hp.gamma * (1.0 - traj["dones"]), values,
                            hp.gae_lambda)
  ret = adv + traj["values"]
  w = traj["weights"].reshape(-1)
  adv = adv.reshape(-1)
  mean = jnp.sum(adv * w) / jnp.maximum(w.sum(), 1.0)
  std = jnp.sqrt(jnp.sum(jnp.square(adv - mean) * w) / jnp.maximum(w.sum(), 1.0))
  flat = lambda a: a.reshape((B * T,) + a.shape[2:])
  return dict(obs=flat(traj["obs"]), mask=flat(traj["mask"]), actions=flat(traj["actions"]),
              old_logp=flat(traj["logp"]), advantages=(adv - mean) / (std + 1e-8),
              returns=ret.reshape(-1), weights=w)


def batch_loss(net: R1Net, hp: PPOSettings, params, batch: dict):
  """gp_jax.rl.ppo.ppo_loss of the net on flat transitions -> (loss, metrics)."""
  logits, values = net.apply(params, batch["obs"])
  return ppo_lib.ppo_loss(_masked(logits, batch["mask"]), values, batch["actions"],
                          batch["old_logp"], batch["advantages"], batch["returns"], batch["mask"],
                          batch["weights"], clip_eps=hp.clip_eps, value_coef=hp.value_coef,
                          entropy_coef=hp.entropy_coef)


def make_optimizer(hp: PPOSettings) -> optax.GradientTransformation:
  return optax.chain(optax.clip_by_global_norm(hp.max_grad_norm), optax.adam(hp.learning_rate))


@functools.lru_cache(maxsize=16)
def make_update(net: R1Net, hp: PPOSettings):
  """update(params, opt_state, key, traj) -> (params, opt_state, metrics): GAE and epochs x
  minibatches of PPO steps in one jit (cached per net and settings, so sweep cells share it)."""
  opt = make_optimizer(hp)

  def update(params, opt_state, key, traj):
    batch = prepare_batch(traj, hp)
    n = batch["actions"].shape[0]
    mb = n // hp.num_minibatches

    def epoch(carry, k):
      perm = jax.random.permutation(k, n)[:mb * hp.num_minibatches]
      shuffled = jax.tree_util.tree_map(
          lambda x: x[perm].reshape((hp.num_minibatches, mb) + x.shape[1:]), batch)

      def step(carry, b):
        params, opt_state = carry
        (_, met), g = jax.value_and_grad(lambda p: batch_loss(net, hp, p, b), has_aux=True)(params)
        upd, opt_state = opt.update(g, opt_state, params)
        return (optax.apply_updates(params, upd), opt_state), met
      return jax.lax.scan(step, carry, shuffled)

    (params, opt_state), met = jax.lax.scan(epoch, (params, opt_state),
                                            jax.random.split(key, hp.epochs))
    return params, opt_state, jax.tree_util.tree_map(jnp.mean, met)
  return jax.jit(update)


def r1_mask(space: mdp.ActionSpace, router_llm: str, state: mdp.WorkflowState,
            mask: np.ndarray) -> np.ndarray:
  """Router-R1's actions within the MDP's mask: at the root, the router LLM plans (splits the query
  into turns) or an Executor answers in one turn (the router LLM itself, or one pool LLM it hands
  the whole query to); at a sub-question (turn), any LLM executes it; the router LLM summarises and
  gives the final answer. Thinker, verifier and deeper planning are never offered. Where this leaves
  nothing valid (Phase-1 configs), the MDP's own mask is used."""
  node = state.node
  col = np.arange(space.size) % space.num_llms == list(space.llms).index(router_llm)
  if state.at_final_answer:
    allowed = space.kind_mask(["executor"]) & col
  elif node.status == mdp.PLANNING:
    allowed = space.kind_mask(["summarizer"]) & col
  elif node.id == 0:
    allowed = space.kind_mask(["executor"]) | (space.kind_mask(["planner"]) & col)
  else:
    allowed = space.kind_mask(["executor"])
  out = mask & allowed
  return out if out.any() else mask


NUM_SCALARS = 6


def r1_observation(state: mdp.WorkflowState, embed: Callable[[str], np.ndarray],
                   cfg: mdp.MDPConfig) -> np.ndarray:
  """[2 D + 6] float32: embedding of the current node's text, of the query, and scalars (at root,
  root summarised, node planning, siblings / max_width, turn index / max_width, steps / step_cap).
  No workflow graph and no history."""
  node = state.node
  sibs = state.nodes[node.parent].children if node.parent is not None else []
  turn = sibs.index(node.id) + 1 if sibs else 0
  scalars = np.array([node.id == 0, state.root_summarized, node.status == mdp.PLANNING,
                      len(sibs) / cfg.max_width, turn / cfg.max_width, state.steps / cfg.step_cap],
                     np.float32)
  return np.concatenate([embed(node.text), embed(state.nodes[0].text), scalars])


class RouterR1(MultiRoundRouter):
  """Router-R1-style sequential router: an MLP policy (R1Net) over r1_mask, trained with PPO on the
  training queries at each alpha (reward U - alpha * cost of the same environment), greedy at test
  time. Training: `episodes` episodes in batches of `batch` queries (a fresh permutation of the
  training queries per pass), one jitted update (GAE + PPO) per batch; the last parameters are kept.
  """

  def __init__(self, *, router_llm: str = "", hidden: int = 64, episodes: int = 512,
               batch: int = 32, reward: str = "auto", ppo: PPOSettings = PPOSettings()):
    if hidden < 1 or episodes < 1 or batch < 1:
      raise errors.ConfigError("router_r1 needs hidden, episodes and batch >= 1")
    if batch % ppo.num_minibatches:
      raise errors.ConfigError(f"router_r1 batch {batch} is not a multiple of "
                               f"num_minibatches {ppo.num_minibatches}")
    self.router_llm_name, self.hidden = router_llm, hidden
    self.episodes, self.batch = episodes, batch
    self.reward, self.hp = reward, ppo

  def fit(self, system, queries, *, seed):
    self.system, self.queries, self.seed = system, list(queries), seed
    self.router_llm = resolve_router_llm(system, self.router_llm_name)
    self.net = R1Net(system.space.size, self.hidden)
    self._emb: dict[str, np.ndarray] = {}
    self.trained: dict[float, dict] = {}
    return self

  def embed(self, text: str) -> np.ndarray:
    if text not in self._emb:
      self._emb[text] = np.asarray(self.system.encoder.encode([text])[0], np.float32)
    return self._emb[text]

  @property
  def obs_dim(self) -> int:
    return 2 * self.system.encoder.dim + NUM_SCALARS

  def init_params(self):
    return self.net.init(jax.random.PRNGKey(self.seed), jnp.zeros((1, self.obs_dim)))

  def _observe(self, states, masks):
    """Padded [batch, F] observations and [batch, A] masks of up to `batch` states."""
    obs = np.zeros((self.batch, self.obs_dim), np.float32)
    mk = np.zeros((self.batch, self.system.space.size), bool)
    mk[:, 0] = True                          # padding rows
    for j, (s, m) in enumerate(zip(states, masks)):
      obs[j] = r1_observation(s, self.embed, self.system.mdp_cfg)
      mk[j] = r1_mask(self.system.space, self.router_llm, s, m)
    return obs, mk

  def rollout(self, env, queries: list[Query], params, key, *, greedy: bool, seed_base: int):
    """<= batch episodes in lock step -> (trajectory arrays [batch, T], finished states)."""
    if len(queries) > self.batch:
      raise ValueError(f"{len(queries)} queries > batch {self.batch}")
    T, A = self.system.mdp_cfg.step_cap, self.system.space.size
    B = self.batch
    tr = dict(obs=np.zeros((B, T, self.obs_dim), np.float32), mask=np.zeros((B, T, A), bool),
              actions=np.zeros((B, T), np.int32), logp=np.zeros((B, T), np.float32),
              values=np.zeros((B, T), np.float32))
    tr["mask"][:, :, 0] = True
    keys = iter(jax.random.split(key, T + 1))

    async def decide(active, states, masks):
      obs, mk = self._observe(states, masks)
      a, logp, v = (np.asarray(z) for z in _act(self.net, params, obs, mk, next(keys), greedy))
      for j, (i, s) in enumerate(zip(active, states)):
        t = s.steps
        tr["obs"][i, t], tr["mask"][i, t], tr["actions"][i, t] = obs[j], mk[j], a[j]
        tr["logp"][i, t], tr["values"][i, t] = logp[j], v[j]
      return [int(x) for x in a[:len(states)]]

    states = aio.run(_lockstep(env, queries, decide, seed_base=seed_base))
    rewards = np.zeros((self.batch, T), np.float32)
    dones, weights = np.zeros_like(rewards), np.zeros_like(rewards)
    for i, (q, s) in enumerate(zip(queries, states)):
      n = s.steps
      rewards[i, :n] = [reward_lib.step_reward(c.cost_usd, env.alpha) for c in s.calls]
      rewards[i, n - 1] += env.reward_utility(s, q)
      dones[i, n - 1], weights[i, :n] = 1.0, 1.0
    tr.update(rewards=rewards, dones=dones, weights=weights)
    return tr, states

  def train(self, alpha: float) -> dict:
    """PPO at `alpha` (cached per alpha): {"params", "mean_return" [iterations], "loss" [...]}."""
    if alpha in self.trained:
      return self.trained[alpha]
    env = self.system.env(alpha, reward=self.reward)
    update = make_update(self.net, self.hp)
    params = self.init_params()
    opt_state = make_optimizer(self.hp).init(params)
    rng = np.random.default_rng([self.seed, 17])
    key = jax.random.PRNGKey(self.seed + 1)
    order: list[int] = []
    returns, losses = [], []
    for it in range(max(1, self.episodes // self.batch)):
      while len(order) < self.batch:
        order += list(rng.permutation(len(self.queries)))
      idx, order = order[:self.batch], order[self.batch:]
      key, k_roll, k_upd = jax.random.split(key, 3)
      tr, _ = self.rollout(env, [self.queries[i] for i in idx], params, k_roll, greedy=False,
                           seed_base=(self.seed * 1009 + it) * 100003)
      returns.append(float((tr["rewards"] * tr["weights"]).sum() / self.batch))
      params, opt_state, met = update(params, opt_state, k_upd, tr)
      losses.append(float(met["loss"]))
    self.trained[alpha] = dict(params=params, mean_return=returns, loss=losses)
    return self.trained[alpha]

  def policy(self, alpha):
    params = self.train(alpha)["params"]

    def act(query, state, mask, rng):
      obs, mk = self._observe([state], [mask])
      return int(_act(self.net, params, obs, mk, jax.random.PRNGKey(0), True)[0][0])
    return act

  def run(self, system, alpha, queries, *, seed):
    params = self.train(alpha)["params"]
    env = system.env(alpha)
    out = []
    for start in range(0, len(queries), self.batch):
      _, states = self.rollout(env, queries[start:start + self.batch], params,
                               jax.random.PRNGKey(seed), greedy=True,
                               seed_base=seed * 100003 + start)
      out += states
    return out


# ---- registry and evaluation ---------------------------------------------------------------------

MULTI_ROUTERS: dict[str, Callable[..., MultiRoundRouter]] = {
    "knn": lambda *, knn_k=10, **kw: KNNMultiRound(k=knn_k),
    "llm": lambda *, router_llm="", **kw: LLMMultiRound(router_llm=router_llm),
    "router_r1": lambda *, router_llm="", r1_hidden=64, r1_episodes=512, r1_batch=32,
                        r1_reward="auto", r1_ppo=PPOSettings(), **kw: RouterR1(
        router_llm=router_llm, hidden=r1_hidden, episodes=r1_episodes, batch=r1_batch,
        reward=r1_reward, ppo=r1_ppo),
}


def make_multi_router(name: str, **kwargs) -> MultiRoundRouter:
  """A multi-round router by registry name. kwargs: knn_k, router_llm, r1_hidden, r1_episodes,
  r1_batch, r1_reward, r1_ppo (PPOSettings)."""
  if name not in MULTI_ROUTERS:
    raise errors.unknown_name("multi-round router", name, MULTI_ROUTERS)
  return MULTI_ROUTERS[name](**kwargs)


def fit_multi_routers(names: list[str], system, queries: list[Query], *, seed: int,
                      **kwargs) -> dict[str, MultiRoundRouter]:
  """Builds (all names checked first) and fits each named router on the training queries."""
  routers = {n: make_multi_router(n, **kwargs) for n in names}
  return {n: r.fit(system, queries, seed=seed) for n, r in routers.items()}


R1_OPTIMUM = "optimum (DP, Router-R1 mask)"


def router_r1_optimum(system, env, router_llm: str, queries: list[Query], *,
                      seed: int = 0) -> list[Row]:
  """Rows R1_OPTIMUM: the exact optimum within Router-R1's action set (r1_mask), simulator only.

  The best any policy restricted to that mask could do, knowing each query's latent hardness as
  the full optimum does: the router LLM alone plans (the root only), summarises and answers.
  The full optimum minus this is what the mask itself costs; this minus the trained
  Router-R1-style router is what its learning leaves."""
  return optimum_rows(R1_OPTIMUM, system, env, queries, seed=seed, planners=[router_llm],
                      mergers=[router_llm], max_plan_depth=1)


def evaluate_multi(system, alpha: float, routers: dict[str, MultiRoundRouter],
                   queries: list[Query], *, seed: int = 0) -> tuple[list[Row], dict]:
  """Rows 'multi:<name>' of each router on `queries`, and
  {row name: {"<role kind>:<llm>": number of calls}}. With a Router-R1-style router on the
  simulator (outside Phase 1), also the optimum within its mask (router_r1_optimum)."""
  env = system.env(alpha)
  rows, picks = [], {}
  for name, router in routers.items():
    states = router.run(system, alpha, queries, seed=seed)
    rows += summarize(ROW_PREFIX + name, system, env, queries, states)
    if isinstance(router, RouterR1) and system.simulated and not system.mdp_cfg.phase1:
      rows += router_r1_optimum(system, env, router.router_llm, queries, seed=seed)
    counts: dict[str, int] = {}
    for s in states:
      for c in s.calls:
        counts[f"{c.kind}:{c.llm}"] = counts.get(f"{c.kind}:{c.llm}", 0) + 1
    picks[ROW_PREFIX + name] = counts
  return rows, picks
