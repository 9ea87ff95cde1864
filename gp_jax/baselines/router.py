"""The single-round router interface: one LLM per query, chosen from the query's embedding.

Implemented by the routers of single_round.py, graph_router.py and routerdc.py; every router is
fitted on the same RoutingData (gp_jax.baselines.labels) and chooses, per query, the LLM with the
best predicted utility - alpha * cost (or by a fixed rule).
"""
from __future__ import annotations

import abc

import numpy as np

from gp_jax.baselines import labels as labels_lib
from gp_jax.llm import catalog as catalog_lib


class Router(abc.ABC):
  """Chooses one LLM index per query from its embedding."""

  def fit(self, data: labels_lib.RoutingData, catalog: catalog_lib.Catalog) -> "Router":
    return self

  @abc.abstractmethod
  def choose(self, x: np.ndarray, alpha: float, rng: np.random.Generator,
             tasks: list[str] | None = None) -> np.ndarray:
    """[B, D] embeddings (and the B task names, used by graph routers) -> [B] int LLM indices."""


class PredictiveRouter(Router):
  """Routers that predict per-(query, LLM) utility and cost, then take argmax U - alpha * C."""

  @abc.abstractmethod
  def predict(self, x: np.ndarray, tasks: list[str] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """[B, D] -> ([B, M] predicted utility, [B, M] predicted cost units)."""

  def choose(self, x, alpha, rng, tasks=None):
    u, c = self.predict(x, tasks=tasks)
    return np.argmax(u - alpha * c, axis=1)
