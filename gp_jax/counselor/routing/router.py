r"""A GraphPlanner-style router for Graph Counselor: picks the backbone LLM of every agent step.

Action space: hubs = (counselor agent kind, LLM) pairs, kinds = plan, thought, action, judge,
reflect (GraphPlanner roles planner, thinker, executor, verifier, verifier), A = 5 K for K LLMs.
Before each call the agents loop hands the router an AgentStep; only the K hubs of that step's
kind are valid, so the router's action is the LLM.

Network: gp_jax.graph.garnet.GARNet over the workflow graph of the question's calls so far --
query node, A hubs, one memory row per earlier call, each row linked to the query and to the hub
(kind, LLM) that made it. Inductive: hubs are features of text, not ids:
  hub features   [A, 2D]  [kind description emb ; LLM description emb] (catalog descriptions)
  memory row     [F]      [proj(emb 'kind trial step') (P) ; proj(emb output) (P) ; U=0 ; C ; failed]
                          (C = the call's cost in milli-dollars, gp_jax.workflow.reward)
  task [D]  emb of the step's system prompt (agent job + graph schema)
  query [D] emb of the question
  state [D + 12]  emb of the end of the step's prompt ; one-hot kind (5), trial, step, calls so
                  far, last call failed, prompt characters / (4 budget), reflections read, judged before
Simplification of GraphPlanner: no cross-episode history table (GARNet(use_history=False); the
PPO update gets an empty one), since a question's own calls already show what each hub did.

Training: PPO with rl/'s one learner (gp_jax.rl.ppo.make_update_fn -- GAE and the clipped-PPO
steps in one jitted update -- on gp_jax.rl.batch batches) on episodes = one question's calls,
per-call reward
    r_t = -alpha * C_t  (+ U at the last call),   U = exact match of the final answer.
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

from gp_jax import errors
from gp_jax.counselor.agents import loop as agents
from gp_jax.counselor.agents import records
from gp_jax.counselor.eval import metrics
from gp_jax.counselor.kg import data as data_lib
from gp_jax.counselor.kg import functions as functions_lib
from gp_jax.graph import garnet as garnet_lib
from gp_jax.llm import base
from gp_jax.llm import catalog as catalog_lib
from gp_jax.rl import batch as batch_lib
from gp_jax.rl import ppo
from gp_jax.text import encoder as encoder_lib
from gp_jax.workflow import reward as reward_lib

KINDS = ("plan", "thought", "action", "judge", "reflect")
KIND_DESCRIPTIONS = {
    "plan": "Planning agent, the planner role: decides which information is still missing from "
            "the knowledge graph and which graph functions to call next.",
    "thought": "Thought agent, the thinker role: reasons over the latest plan and observations "
               "and decides exactly what the next action must do.",
    "action": "Execution agent, the executor role: writes the exact graph function calls, or "
              "Finish with the final answer.",
    "judge": "Evaluation agent, a verifier role: judges whether the proposed answer is correct "
             "and supported by the observations.",
    "reflect": "Reflection agent, a verifier role: analyses a failed attempt and writes an "
               "improved strategy for the next trial.",
}
STATE_EXTRA = 12
# The router's PPO settings when none are given: GraphPlanner's, with a faster learning rate and
# no discount (a question's reward comes at its last call).
DEFAULT_PPO = ppo.PPOSettings(learning_rate=1e-3, epochs=4, num_minibatches=4, clip_eps=0.2,
                              gamma=1.0, gae_lambda=0.95, value_coef=0.5, entropy_coef=0.01,
                              max_grad_norm=0.5, value_lr_multiplier=2.0)


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
  forward_batch: int = 8       # observations per jitted policy forward during rollouts

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


class Featurizer:
  """AgentSteps -> fixed-shape numpy observations (module docstring)."""

  def __init__(self, encoder: encoder_lib.TextEncoder, catalog: catalog_lib.Catalog,
               llms: Sequence[str], cfg: RouterConfig, *, max_steps: int, max_reflect: int,
               prompt_token_budget: int, seed: int = 0):
    self.encoder, self.cfg, self.llms = encoder, cfg, list(llms)
    self.K = len(self.llms)
    self.A = len(KINDS) * self.K
    self.max_steps, self.max_reflect, self.budget = max_steps, max_reflect, prompt_token_budget
    D = encoder.dim
    rng = np.random.default_rng(seed)
    self.proj = ((rng.normal(size=(D, cfg.mem_proj)) / np.sqrt(cfg.mem_proj)).astype(np.float32)
                 if cfg.mem_proj else None)
    kinds = encoder.encode([KIND_DESCRIPTIONS[k] for k in KINDS])
    llm_emb = encoder.encode([catalog[m].description for m in self.llms])
    self.hub_features = np.concatenate([np.repeat(kinds, self.K, 0), np.tile(llm_emb, (len(KINDS), 1))],
                                       axis=1).astype(np.float32)          # [A, 2D]
    self.masks = {k: np.arange(self.A) // self.K == i for i, k in enumerate(KINDS)}
    self.row_dim = 2 * (cfg.mem_proj or D) + 3
    self._text_cache: dict[str, np.ndarray] = {}

  def action(self, kind: str, model: str) -> int:
    return KINDS.index(kind) * self.K + self.llms.index(model)

  def _emb(self, text: str) -> np.ndarray:
    e = self._text_cache.get(text)
    if e is None:
      if len(self._text_cache) > 50_000:
        self._text_cache.clear()
      e = self._text_cache[text] = self.encoder.encode([text])[0]
    return e

  def _project(self, emb: np.ndarray) -> np.ndarray:
    return emb @ self.proj if self.proj is not None else emb

  def rows(self, calls: Sequence[records.CallRecord]) -> tuple[np.ndarray, np.ndarray]:
    """[n, F] memory rows and [n] hub indices of calls (A for calls by LLMs outside the router)."""
    if not calls:
      return np.zeros((0, self.row_dim), np.float32), np.zeros(0, np.int32)
    inp = self.encoder.encode([f"{c.kind} agent trial {c.trial} step {c.step}" for c in calls])
    out = self.encoder.encode([c.output or "(no output)" for c in calls])
    extra = np.array([[0.0, reward_lib.cost_units(c.cost_usd), float(c.error is not None)]
                      for c in calls], np.float32)
    rows = np.concatenate([self._project(inp), self._project(out), extra], 1).astype(np.float32)
    hubs = np.array([self.action(c.kind, c.model) if c.model in self.llms and c.kind in KINDS
                     else self.A for c in calls], np.int32)
    return rows, hubs

  def observe(self, step: records.AgentStep, rows: np.ndarray, hubs: np.ndarray) -> dict:
    """One observation; rows / hubs are those of step.calls_so_far (kept by the caller)."""
    M = self.cfg.max_rows
    system = step.messages[0]["content"] if step.messages else ""
    prompt = step.prompt
    tail = prompt[-400:].rsplit("\n", 1)[0] if "\n" in prompt[-400:] else prompt[-400:]
    calls = step.calls_so_far
    onehot = np.zeros(len(KINDS), np.float32)
    onehot[KINDS.index(step.kind)] = 1.0
    extra = np.concatenate([onehot, np.array([
        step.trial / max(1, self.max_reflect),
        step.step / max(1, self.max_steps),
        min(len(calls), M) / M,
        float(bool(calls) and calls[-1].error is not None),
        min(2.0, sum(len(m["content"]) for m in step.messages) / (4.0 * max(1, self.budget))),
        prompt.count("\nReflection ") / max(1, self.max_reflect),
        float(any(c.kind == "judge" for c in calls)),
    ], np.float32)])
    n = min(len(rows), M)
    padded = np.zeros((M, self.row_dim), np.float32)
    hub = np.full(M, self.A, np.int32)
    valid = np.zeros(M, bool)
    if n:
      padded[:n], hub[:n], valid[:n] = rows[-n:], hubs[-n:], True
    return dict(task=self._emb(system), query=self._emb(step.question),
                state=np.concatenate([self.encoder.encode([tail])[0], extra]).astype(np.float32),
                rows=padded, row_hub=hub, row_valid=valid, mask=self.masks[step.kind])


@dataclasses.dataclass
class Transition:
  obs: dict
  action: int
  logp: float
  value: float


class RouterSelector:
  """An LLMSelector over a Router: greedy, or sampling and recording transitions (training).

  Asynchronous: the questions in flight submit their observations to one batch, evaluated by one
  jitted forward of fixed size `router.batch` (padded) once the batch is full or no new step has
  arrived for a few event-loop turns. Keeps each question's memory rows (keyed by qid), so one
  selector serves many questions at once.
  """

  _IDLE_TURNS = 3

  def __init__(self, router: "Router", *, sample: bool = False, seed: int = 0,
               record: bool = False):
    self.router, self.sample, self.record = router, sample, record
    self.rng = np.random.default_rng(seed)
    self._rows: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    self._pending: list[tuple[dict, asyncio.Future]] = []
    self._idle = 0
    self._scheduled = False
    self.transitions: dict[str, list[Transition]] = {}
    self.choices: dict[str, dict[str, int]] = {k: {} for k in KINDS}

  async def __call__(self, step: records.AgentStep) -> str:
    if step.kind not in KINDS:
      raise errors.ConfigError(f"the counselor router routes {KINDS}, not {step.kind!r} steps")
    f = self.router.featurizer
    rows, hubs = self._rows.get(step.qid, (np.zeros((0, f.row_dim), np.float32),
                                           np.zeros(0, np.int32)))
    if len(rows) < len(step.calls_so_far):
      new_rows, new_hubs = f.rows(step.calls_so_far[len(rows):])
      rows, hubs = np.concatenate([rows, new_rows]), np.concatenate([hubs, new_hubs])
      self._rows[step.qid] = rows, hubs
    obs = f.observe(step, rows, hubs)
    logits, value = await self._submit(obs)
    if self.sample:
      z = logits - logits.max()
      p = np.exp(z) * obs["mask"]
      p /= p.sum()
      a = int(self.rng.choice(len(p), p=p))
    else:
      a = int(np.argmax(logits))
    if self.record:
      logp = float(logits[a] - logits.max() - np.log(np.sum(np.exp(logits - logits.max()))))
      self.transitions.setdefault(step.qid, []).append(Transition(obs, a, logp, float(value)))
    model = f.llms[a % f.K]
    self.choices[step.kind][model] = self.choices[step.kind].get(model, 0) + 1
    return model

  def _submit(self, obs: dict) -> asyncio.Future:
    fut = asyncio.get_running_loop().create_future()
    self._pending.append((obs, fut))
    self._idle = 0
    if len(self._pending) >= self.router.batch:
      self._flush()
    elif not self._scheduled:
      self._scheduled = True
      asyncio.get_running_loop().call_soon(self._tick)
    return fut

  def _tick(self) -> None:
    self._scheduled = False
    if not self._pending:
      return
    self._idle += 1
    if self._idle >= self._IDLE_TURNS:
      self._flush()
    if self._pending:
      self._scheduled = True
      asyncio.get_running_loop().call_soon(self._tick)

  def _flush(self) -> None:
    items, self._pending = self._pending[:self.router.batch], self._pending[self.router.batch:]
    self._idle = 0
    if not items:
      return
    logits, values = self.router.forward_batch([o for o, _ in items])
    for (_, fut), l, v in zip(items, logits, values):
      if not fut.done():
        fut.set_result((l, float(v)))


class Router:
  """GARNet policy + value over (kind, LLM) hubs; `selector()` makes LLMSelectors of it."""

  def __init__(self, featurizer: Featurizer, cfg: RouterConfig, seed: int = 0):
    self.featurizer, self.cfg = featurizer, cfg.validate()
    self.batch = cfg.forward_batch
    self.model = garnet_lib.GARNet(hidden=cfg.hidden, num_layers=cfg.num_layers,
                                   mlp_hidden=cfg.mlp_hidden, use_history=False)
    self.hub_features = jnp.asarray(featurizer.hub_features)
    self._hist = self._empty_history()
    dummy = self._dummy_obs()
    params = jax.jit(self.model.init)(jax.random.PRNGKey(seed), self.hub_features,
                                      self._hist["rows"], dummy)["params"]
    self.optimizer = ppo.make_optimizer(cfg.ppo)
    self.state = ppo.TrainingState(params, self.optimizer.init(params),
                                   jax.random.PRNGKey(seed + 1), jnp.zeros((), jnp.int32))
    model = self.model

    def forward(params, hub_features, obs):
      h = model.apply({"params": params}, hub_features, jnp.zeros((hub_features.shape[0],
                      cfg.hidden)), jnp.zeros(hub_features.shape[0]), method=model.history_hubs)
      logits = model.apply({"params": params}, h, obs, method=model.policy)
      return logits, model.apply({"params": params}, hub_features, obs, method=model.value)
    self._forward = jax.jit(jax.vmap(forward, in_axes=(None, None, 0)))
    self._update = ppo.make_update_fn(model, self.optimizer, cfg.ppo, num_chunks=1)

  def _empty_history(self) -> dict:
    """An empty history table for ppo.make_update_fn (one padding row in the dropped segment)."""
    A = self.featurizer.A
    return {"rows": jnp.zeros((1, self.featurizer.row_dim), jnp.float32),
            "segment": jnp.full((1,), A, jnp.int32)}

  def _dummy_obs(self) -> dict:
    f = self.featurizer
    D, M = f.encoder.dim, self.cfg.max_rows
    return dict(task=np.zeros(D, np.float32), query=np.zeros(D, np.float32),
                state=np.zeros(D + STATE_EXTRA, np.float32),
                rows=np.zeros((M, f.row_dim), np.float32), row_hub=np.full(M, f.A, np.int32),
                row_valid=np.zeros(M, bool), mask=f.masks["plan"])

  def forward_batch(self, observations: Sequence[dict]) -> tuple[np.ndarray, np.ndarray]:
    """(masked logits [n, A], values [n]) of n <= batch observations (one fixed-size forward)."""
    obs = list(observations)
    n = len(obs)
    obs = obs + [obs[-1]] * (self.batch - n)
    stacked = {k: np.stack([o[k] for o in obs]) for k in obs[0]}
    logits, values = self._forward(self.state.params, self.hub_features, stacked)
    return np.asarray(logits, np.float64)[:n], np.asarray(values)[:n]

  def selector(self, *, sample: bool = False, seed: int = 0, record: bool = False
               ) -> RouterSelector:
    return RouterSelector(self, sample=sample, seed=seed, record=record)

  def update(self, episodes: Sequence[tuple[list[Transition], np.ndarray]]) -> dict[str, float]:
    """PPO on episodes [(transitions, rewards [T])]: updates on shuffled chunks of `update_size`
    transitions (packed batches, the last one padded with zero weights), so the jitted update sees
    one shape per episode grid (episodes and steps rounded up to powers of two); each update runs
    GAE over all the episodes. Returns the mean of the chunks' metrics."""
    cfg, A = self.cfg, self.featurizer.A
    episodes = [(tr, r) for tr, r in episodes if tr]
    if not episodes:
      return {}
    flat = [t for tr, _ in episodes for t in tr]
    n = len(flat)
    transitions = dict(obs={k: np.stack([t.obs[k] for t in flat]) for k in flat[0].obs},
                       actions=np.array([t.action for t in flat], np.int32),
                       old_logp=np.array([t.logp for t in flat], np.float32),
                       hist_chunk=np.zeros(n, np.int32), hist_count=np.zeros((n, A), np.float32))
    rewards = [r for _, r in episodes]
    values = [[t.value for t in tr] for tr, _ in episodes]
    T = _bucket(max(len(tr) for tr, _ in episodes), 16)
    E = _bucket(len(episodes), 8)
    perm = np.random.default_rng(int(self.state.update_step)).permutation(n)
    N = cfg.update_size
    out: list[dict] = []
    for start in range(0, n, N):
      batch = batch_lib.build(transitions, rewards, values, size=N,
                              num_episodes=E, num_steps=T, order=perm[start:start + N])
      self.state, m = self._update(self.state, self.hub_features, self._hist, batch)
      out.append({k: float(v) for k, v in m.items()})
    return {k: float(np.mean([m[k] for m in out])) for k in out[0]}

  def probabilities(self, kind: str) -> dict[str, float]:
    """The policy's LLM distribution for a `kind` step at the start of a question (no calls yet,
    neutral prompt) -- a summary of what it learned, not what it does on every step."""
    obs = self._dummy_obs()
    obs["mask"] = self.featurizer.masks[kind]
    obs["state"][self.featurizer.encoder.dim + KINDS.index(kind)] = 1.0
    logits = self.forward_batch([obs])[0][0]
    z = np.exp(logits - logits.max()) * obs["mask"]
    z /= z.sum()
    K = self.featurizer.K
    i = KINDS.index(kind)
    return dict(zip(self.featurizer.llms, z[i * K:(i + 1) * K].tolist()))


def _bucket(n: int, least: int) -> int:
  """The smallest power of two >= max(n, least)."""
  return 1 << max(0, math.ceil(math.log2(max(n, least, 1))))


def episode_rewards(calls: Sequence[records.CallRecord], utility: float, alpha: float
                    ) -> np.ndarray:
  """r_t = -alpha * C_t (milli-dollars), plus the utility at the last call."""
  r = np.array([reward_lib.step_reward(c.cost_usd, alpha) for c in calls], np.float32)
  if len(r):
    r[-1] += utility
  return r


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
  return list(await asyncio.gather(*(one(q) for q in questions)))


def train(router: Router, questions: Sequence[data_lib.GraphQuestion], *,
          funcs: functions_lib.GraphFunctions, pool: base.LLMPool,
          counselor_settings: Mapping[str, Any], settings: TrainSettings, seed: int = 0,
          log: Callable[[str], None] = print) -> list[dict]:
  """PPO on training questions: batches of `batch_questions` questions (cycled in a seeded
  shuffled order), sampled LLMs, one update per batch. With a pool that has `with_seed` (the
  simulated pool), each batch gets fresh draws.

  Returns:
    Per-update logs: episodes done, mean utility, mean $ per question, mean reward, PPO metrics.
  """
  settings.validate()
  if not questions:
    raise errors.ConfigError("no training questions")
  rng = np.random.default_rng([seed, 7])
  order: list[int] = []
  history = []
  done, it, t0 = 0, 0, time.perf_counter()
  n_updates = math.ceil(settings.episodes / settings.batch_questions)
  while done < settings.episodes:
    b = min(settings.batch_questions, settings.episodes - done, len(questions))
    picked: list[int] = []
    later: list[int] = []
    while len(picked) < b:        # b distinct questions; repeats wait for the next batch
      if not order:
        order = rng.permutation(len(questions)).tolist()
      i = order.pop(0)
      (later if i in picked else picked).append(i)
    order = later + order
    batch = [questions[i] for i in picked]
    sel = router.selector(sample=True, seed=int(rng.integers(2 ** 31)), record=True)
    it_pool = pool.with_seed(int(rng.integers(2 ** 31))) if hasattr(pool, "with_seed") else pool
    results = asyncio.run(run_episodes(batch, select_llm=sel, funcs=funcs, pool=it_pool,
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
    m = router.update(episodes)
    done += len(batch)
    it += 1
    row = dict(episodes=done, utility=float(np.mean(utils)), cost_usd=float(np.mean(costs)),
               reward=float(np.mean(rets)), **{k: m[k] for k in ("entropy", "approx_kl",
                                                                  "value_loss")})
    history.append(row)
    if it % max(1, n_updates // 10) == 0 or done >= settings.episodes:
      recent = history[-max(1, n_updates // 10):]
      log(f"  update {it}/{n_updates}: {done} episodes, EM {np.mean([h['utility'] for h in recent]):.3f}"
          f", $/q {np.mean([h['cost_usd'] for h in recent]):.5f}, reward "
          f"{np.mean([h['reward'] for h in recent]):+.3f}, entropy {row['entropy']:.3f}"
          f" ({time.perf_counter() - t0:.0f}s)")
  return history


def make_router(*, catalog: catalog_lib.Catalog, llms: Sequence[str],
                encoder: encoder_lib.TextEncoder, cfg: RouterConfig = RouterConfig(),
                counselor_settings: Mapping[str, Any] | None = None, seed: int = 0) -> Router:
  """A fresh router over `llms` (catalog names) for a counselor run with `counselor_settings`
  (max_steps, max_reflect, prompt_token_budget; run_counselor's defaults otherwise)."""
  if not llms:
    raise errors.ConfigError("the router needs at least one LLM")
  catalog_lib.check_names(catalog, llms)
  if len(set(llms)) != len(llms):
    raise errors.ConfigError(f"duplicate LLMs in {list(llms)}")
  s = dict(counselor_settings or {})
  feat = Featurizer(encoder, catalog, llms, cfg.validate(), max_steps=s.get("max_steps", 10),
                    max_reflect=s.get("max_reflect", 2),
                    prompt_token_budget=s.get("prompt_token_budget", 6000), seed=seed)
  return Router(feat, cfg, seed=seed)

