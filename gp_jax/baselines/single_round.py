"""Single-round routers: one LLM per query, answered by the Executor alone (the interface:
gp_jax/baselines/router.py; the graph and RouterDC-style routers have their own modules).

Every router is fitted on the same `RoutingData` (per-(query, LLM) utility and cost of the training
queries) and chooses, for each test query, the LLM with the highest predicted utility - alpha * cost.
Fixed rules (random, largest, cheapest) ignore the labels; `best_single` picks the one LLM that
maximises that objective on average over the training queries. Predictions do not depend on alpha,
so one fitted router serves every alpha of a sweep.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from gp_jax import errors
from gp_jax.baselines import graph_router
from gp_jax.baselines import labels as labels_lib
from gp_jax.baselines import regressors
from gp_jax.baselines import router as router_lib
from gp_jax.baselines import routerdc
from gp_jax.llm import catalog as catalog_lib
from gp_jax.sim.scoring import Row, summarize
from gp_jax.types import Query
from gp_jax.workflow import mdp
from gp_jax.workflow import policies


class RandomRouter(router_lib.Router):
  """A uniformly random LLM per query."""

  def fit(self, data, catalog):
    self.m = len(data.llms)
    return self

  def choose(self, x, alpha, rng, tasks=None):
    return rng.integers(0, self.m, size=len(x))


class BestSingleRouter(router_lib.PredictiveRouter):
  """The LLM with the best mean utility - alpha * cost on the training queries, for every query."""

  def fit(self, data, catalog):
    self.u, self.c = data.utility.mean(0), data.cost.mean(0)
    return self

  def predict(self, x, tasks=None):
    return np.tile(self.u, (len(x), 1)), np.tile(self.c, (len(x), 1))


class CatalogRuleRouter(router_lib.Router):
  """Always the same LLM, picked from the catalog by a key (largest or cheapest)."""

  def __init__(self, key: Callable[[catalog_lib.LLMSpec], tuple]):
    self.key = key

  def fit(self, data, catalog):
    specs = [catalog[n] for n in data.llms]
    self.index = max(range(len(specs)), key=lambda i: self.key(specs[i]))
    return self

  def choose(self, x, alpha, rng, tasks=None):
    return np.full(len(x), self.index)


class KNNRouter(router_lib.PredictiveRouter):
  """Mean labels of the k training queries nearest in embedding (cosine) space."""

  def __init__(self, *, k: int = 10):
    if k < 1:
      raise errors.ConfigError(f"knn k must be >= 1, got {k}")
    self.k = k

  def fit(self, data, catalog):
    self.data = data
    return self

  def predict(self, x, tasks=None):
    d = self.data
    return regressors.knn_predict(d.x, d.utility, d.cost, x, k=self.k)


class NetRouter(router_lib.PredictiveRouter):
  """A linear model (hidden=()) or an MLP with logistic utility and log-cost heads."""

  def __init__(self, *, hidden: tuple[int, ...] = (), steps: int = 500, learning_rate: float = 1e-2,
               weight_decay: float = 1e-4, seed: int = 0):
    if steps < 1 or learning_rate <= 0 or weight_decay < 0:
      raise errors.ConfigError("router training needs steps >= 1, learning_rate > 0, weight_decay >= 0")
    self.kw = dict(hidden=tuple(hidden), steps=steps, learning_rate=learning_rate,
                   weight_decay=weight_decay, seed=seed)

  def fit(self, data, catalog):
    self.net = regressors.fit_net(data.x, data.utility, data.cost, **self.kw)
    return self

  def predict(self, x, tasks=None):
    return self.net.predict(x)


def _price(s: catalog_lib.LLMSpec) -> float:
  return s.price_in + s.price_out


ROUTERS: dict[str, Callable[..., router_lib.Router]] = {
    "random": lambda **kw: RandomRouter(),
    "best_single": lambda **kw: BestSingleRouter(),
    "largest": lambda **kw: CatalogRuleRouter(lambda s: (s.size_b, _price(s))),
    "cheapest": lambda **kw: CatalogRuleRouter(lambda s: (-_price(s), s.size_b)),
    "knn": lambda *, knn_k=10, **kw: KNNRouter(k=knn_k),
    "linear": lambda *, steps=500, learning_rate=1e-2, weight_decay=1e-3, seed=0, **kw: NetRouter(
        hidden=(), steps=steps, learning_rate=learning_rate, weight_decay=weight_decay, seed=seed),
    "mlp": lambda *, mlp_hidden=64, steps=500, learning_rate=1e-2, weight_decay=1e-3, seed=0, **kw:
        NetRouter(hidden=(mlp_hidden,), steps=steps, learning_rate=learning_rate,
                  weight_decay=weight_decay, seed=seed),
    "graph": lambda *, graph_hidden=32, graph_steps=300, seed=0, **kw: graph_router.GraphRouter(
        hidden=graph_hidden, steps=graph_steps, seed=seed),
    "routerdc": lambda *, routerdc_steps=300, seed=0, **kw: routerdc.RouterDC(steps=routerdc_steps,
                                                                                 seed=seed),
}


def make_router(name: str, **kwargs) -> router_lib.Router:
  """A router by registry name. kwargs: knn_k, mlp_hidden, steps, learning_rate, weight_decay,
  graph_hidden, graph_steps, routerdc_steps, seed."""
  if name not in ROUTERS:
    raise errors.unknown_name("router", name, ROUTERS)
  return ROUTERS[name](**kwargs)


def fit_routers(names: list[str], data: labels_lib.RoutingData, catalog: catalog_lib.Catalog,
                **kwargs) -> dict[str, router_lib.Router]:
  """Builds (all names checked first) and fits each named router on the same labels."""
  routers = {n: make_router(n, **kwargs) for n in names}
  return {n: r.fit(data, catalog) for n, r in routers.items()}


def routed_policy(space: mdp.ActionSpace, llm_of: dict[str, str]) -> policies.Policy:
  """Answers query q directly with LLM llm_of[q.qid] (Executor only), like single_llm_policy."""
  per_llm = {m: policies.single_llm_policy(space, m) for m in set(llm_of.values())}
  return lambda query, state, mask, rng: per_llm[llm_of[query.qid]](query, state, mask, rng)


def evaluate_routers(system, alpha: float, routers: dict[str, router_lib.Router], queries: list[Query], *,
                     seed: int = 0, x: np.ndarray | None = None) -> tuple[list[Row], dict]:
  """Runs each router's choices through the environment; rows named 'router:<name>'.

  Args:
    system: gp_jax.runs.system.System.
    alpha: cost weight of the choice and of the reported reward.
    routers: fitted routers by name.
    queries: the B test queries.
    x: [B, D] embeddings of the queries (computed when None).
  Returns:
    (evaluation rows, {router name: {llm: number of queries routed to it}}).
  """
  env = system.env(alpha)
  x = labels_lib.embed(system, queries) if x is None else x
  tasks = [q.task_name for q in queries]
  llms = list(system.space.llms)
  rows, picks = [], {}
  for i, (name, router) in enumerate(routers.items()):
    choice = router.choose(x, alpha, np.random.default_rng([seed, i]), tasks=tasks)
    llm_of = {q.qid: llms[int(c)] for q, c in zip(queries, choice)}
    picks[name] = {m: int(np.sum(choice == j)) for j, m in enumerate(llms) if np.any(choice == j)}
    states = policies.run_policy(env, routed_policy(system.space, llm_of), queries, seed=seed)
    rows += summarize(f"router:{name}", system, env, queries, states)
  return rows, picks
