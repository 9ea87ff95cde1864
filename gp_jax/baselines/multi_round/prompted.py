"""LLMRouter-style LLM-multiround router: the router LLM plans and merges, and a prompted, untrained
router picks each sub-question's Executor (package docstring)."""
from __future__ import annotations

import asyncio
from typing import Sequence

import numpy as np

from gp_jax import errors
from gp_jax.baselines import regressors
from gp_jax.baselines.multi_round import base
from gp_jax.llm import base as llm_base
from gp_jax.util import aio
from gp_jax.workflow import reward as reward_lib


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


class LLMMultiRound(base.MultiRoundRouter):
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
    self.router_llm = base.resolve_router_llm(system, self.router_llm_name)
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
                               llm_base.SamplingParams(temperature=0.0, max_tokens=32))
    self.routing_calls += 1
    self.routing_cost_usd += out.cost_usd
    return parse_model_choice(out.text if out.ok else "", self.llms, self.router_llm)

  def _action(self, state, mask):
    return base.pipeline_action(self.space, state, mask, planner=self.router_llm,
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
      return base.pick_action(self.space, mask, "executor", cache[a[1]])
    return act

  def run(self, system, alpha, queries, *, seed):
    if self.simulated:
      return super().run(system, alpha, queries, seed=seed)
    env = system.env(alpha)

    async def one(state, mask):
      a = self._action(state, mask)
      if isinstance(a, int):
        return a
      return base.pick_action(self.space, mask, "executor", await self.prompted_route(a[1], alpha))

    async def decide(active, states, masks):
      return await asyncio.gather(*(one(s, m) for s, m in zip(states, masks)))
    return aio.run(base.lockstep(env, queries, decide, seed_base=seed * 100003))

