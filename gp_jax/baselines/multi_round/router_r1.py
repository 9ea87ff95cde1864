"""Router-R1-style sequential router: an MLP policy trained with PPO (rl/'s one learner) that
decides, turn by turn, whether the router LLM answers the query (or one pool LLM answers it in a
single turn), or splits it into turns, then which LLM executes each turn; the router LLM
summarises and answers (package docstring).

Learning: the rollouts of a batch of queries give a grid batch (gp_jax.rl.batch, layout "grid":
batch x step_cap cells, empty cells padding) and one jitted update (gp_jax.rl.ppo.learn: GAE and
epochs x minibatches of clipped-PPO steps) per batch, with DEFAULT_PPO or the given settings.
"""
from __future__ import annotations

import functools
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from gp_jax import errors
from gp_jax.baselines.multi_round import base
from gp_jax.rl import batch as batch_lib
from gp_jax.rl import ppo
from gp_jax.sim.scoring import Row, optimum_rows
from gp_jax.types import Query
from gp_jax.util import aio
from gp_jax.workflow import mdp
from gp_jax.workflow import reward as reward_lib

# Router-R1's PPO settings when none are given (the sweep's come from its config:
# gp_jax.runs.ppo_config.router_r1_settings).
DEFAULT_PPO = ppo.PPOSettings(learning_rate=1e-3, epochs=4, num_minibatches=2, clip_eps=0.2,
                              gamma=0.99, gae_lambda=0.95, value_coef=0.5, entropy_coef=0.01,
                              max_grad_norm=0.5)


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


def forward(net: R1Net, params, transitions: dict):
  """ppo.learn's forward pass: (masked logits [B, A], values [B], mask [B, A]) of transitions
  with obs [B, F] and mask [B, A]."""
  logits, values = net.apply(params, transitions["obs"])
  return _masked(logits, transitions["mask"]), values, transitions["mask"]


def make_optimizer(settings: ppo.PPOSettings) -> optax.GradientTransformation:
  """ppo.make_optimizer with one learning rate for the whole net (no separate value rate)."""
  return ppo.make_optimizer(settings, value_modules=())


@functools.lru_cache(maxsize=16)
def make_update(net: R1Net, settings: ppo.PPOSettings):
  """update(params, opt_state, key, batch) -> (params, opt_state, metrics): ppo.learn in one jit
  (cached per net and settings, so sweep cells share it)."""
  optimizer = make_optimizer(settings)
  entropy_coef = functools.partial(ppo.entropy_coefficient, 0, settings.entropy_coef, 0, 1.0)

  def update(params, opt_state, key, batch: batch_lib.Batch):
    return ppo.learn(functools.partial(forward, net), optimizer, settings, params, opt_state, key,
                     batch, entropy_coef=entropy_coef())
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


class RouterR1(base.MultiRoundRouter):
  """Router-R1-style sequential router: an MLP policy (R1Net) over r1_mask, trained with PPO on the
  training queries at each alpha (reward U - alpha * cost of the same environment), greedy at test
  time. Training: `episodes` episodes in batches of `batch` queries (a fresh permutation of the
  training queries per pass), one jitted update (GAE + PPO, `settings`) per batch; the last
  parameters are kept.
  """

  def __init__(self, *, router_llm: str = "", hidden: int = 64, episodes: int = 512,
               batch: int = 32, reward: str = "auto", settings: ppo.PPOSettings = DEFAULT_PPO):
    if hidden < 1 or episodes < 1 or batch < 1:
      raise errors.ConfigError("router_r1 needs hidden, episodes and batch >= 1")
    if batch % settings.num_minibatches:
      raise errors.ConfigError(f"router_r1 batch {batch} is not a multiple of "
                               f"num_minibatches {settings.num_minibatches}")
    self.router_llm_name, self.hidden = router_llm, hidden
    self.episodes, self.batch = episodes, batch
    self.reward, self.settings = reward, settings

  def fit(self, system, queries, *, seed):
    self.system, self.queries, self.seed = system, list(queries), seed
    self.router_llm = base.resolve_router_llm(system, self.router_llm_name)
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

  def rollout(self, env, queries: list[Query], params, key, *, greedy: bool, seed_base: int
              ) -> tuple[list[dict], list[mdp.WorkflowState]]:
    """<= batch episodes in lock step -> (per episode its steps: obs [n, F], mask [n, A],
    actions, logp, values, rewards [n]; the finished states)."""
    if len(queries) > self.batch:
      raise ValueError(f"{len(queries)} queries > batch {self.batch}")
    steps = [dict(obs=[], mask=[], actions=[], logp=[], values=[]) for _ in queries]
    keys = iter(jax.random.split(key, self.system.mdp_cfg.step_cap + 1))

    async def decide(active, states, masks):
      obs, mk = self._observe(states, masks)
      a, logp, v = (np.asarray(z) for z in _act(self.net, params, obs, mk, next(keys), greedy))
      for j, i in enumerate(active):
        for k, x in (("obs", obs), ("mask", mk), ("actions", a), ("logp", logp), ("values", v)):
          steps[i][k].append(x[j])
      return [int(x) for x in a[:len(states)]]

    states = aio.run(base.lockstep(env, queries, decide, seed_base=seed_base))
    episodes = []
    for q, s, st in zip(queries, states, steps):
      n = s.steps
      rewards = np.zeros(n, np.float32)
      rewards[:] = [reward_lib.step_reward(c.cost_usd, env.alpha) for c in s.calls]
      rewards[n - 1] += env.reward_utility(s, q)
      episodes.append(dict({k: np.asarray(x) for k, x in st.items()}, rewards=rewards))
    return episodes, states

  def make_batch(self, episodes: list[dict]) -> batch_lib.Batch:
    """The grid batch of <= batch episodes: batch x step_cap cells."""
    T = self.system.mdp_cfg.step_cap
    transitions = dict(obs=np.concatenate([e["obs"] for e in episodes]),
                       mask=np.concatenate([e["mask"] for e in episodes]),
                       actions=np.concatenate([e["actions"] for e in episodes]).astype(np.int32),
                       old_logp=np.concatenate([e["logp"] for e in episodes]))
    return batch_lib.build(transitions, [e["rewards"] for e in episodes],
                           [e["values"] for e in episodes], size=self.batch * T, num_episodes=self.batch, num_steps=T,
                           layout="grid")

  def train(self, alpha: float) -> dict:
    """PPO at `alpha` (cached per alpha): {"params", "mean_return" [iterations], "loss" [...]}."""
    if alpha in self.trained:
      return self.trained[alpha]
    env = self.system.env(alpha, reward=self.reward)
    update = make_update(self.net, self.settings)
    params = self.init_params()
    opt_state = make_optimizer(self.settings).init(params)
    rng = np.random.default_rng([self.seed, 17])
    key = jax.random.PRNGKey(self.seed + 1)
    order: list[int] = []
    returns, losses = [], []
    for it in range(max(1, self.episodes // self.batch)):
      while len(order) < self.batch:
        order += list(rng.permutation(len(self.queries)))
      idx, order = order[:self.batch], order[self.batch:]
      key, k_roll, k_upd = jax.random.split(key, 3)
      episodes, _ = self.rollout(env, [self.queries[i] for i in idx], params, k_roll,
                                 greedy=False, seed_base=(self.seed * 1009 + it) * 100003)
      batch = self.make_batch(episodes)
      returns.append(float(batch.rewards.sum() / self.batch))
      params, opt_state, met = update(params, opt_state, k_upd, batch)
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
