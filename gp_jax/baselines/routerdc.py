"""A RouterDC-style router: a query encoder and LLM embeddings trained by dual contrastive learning.

RouterDC (Chen et al., 2024) scores query x against LLM m by the cosine similarity of an encoded
query E(x) and a learned LLM embedding k_m, trained with two InfoNCE losses:
  sample-LLM:    the LLM with the best label is the positive, the worse half of the pool the
                 negatives: -log(e^{s+} / (e^{s+} + sum_- e^{s-})), s = cos(E(x), k_m) / tau;
  sample-sample: a query of the same task is the positive, the queries of other tasks the
                 negatives (RouterDC clusters queries; the task is the cluster here).
RouterDC picks argmax similarity and has no cost model. To choose by utility - alpha * cost like
every router here, the similarity is mapped to a utility by a per-LLM least-squares line fitted on
the training queries, and the cost of an LLM is its mean training cost.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from gp_jax import errors
from gp_jax.baselines import regressors
from gp_jax.baselines import router as router_lib


def _cos(a, b):
  a = a / (jnp.linalg.norm(a, axis=-1, keepdims=True) + 1e-6)
  b = b / (jnp.linalg.norm(b, axis=-1, keepdims=True) + 1e-6)
  return a @ b.T


def scores(params: dict, x: jax.Array) -> jax.Array:
  """[B, D] standardised embeddings -> [B, M] cosine similarities to the LLM embeddings."""
  return _cos(regressors.mlp_apply(params["encoder"], x), params["llm"])


def dual_contrastive_loss(params, x, utility, task, key, *, tau: float, sample_weight: float):
  """Sample-LLM plus weighted sample-sample InfoNCE.

  Args:
    x: [N, D] features; utility: [N, M] labels; task: [N] int cluster ids.
  Returns:
    (scalar loss, metrics dict).
  """
  s = scores(params, x) / tau                                     # [N, M]
  m = utility.shape[1]
  order = jnp.argsort(-utility, axis=1)
  pos = jnp.take_along_axis(s, order[:, :1], 1)[:, 0]            # [N]
  neg = jnp.take_along_axis(s, order[:, m - max(1, m // 2):], 1)  # [N, m//2] worst LLMs
  l_llm = jnp.mean(jax.nn.logsumexp(jnp.concatenate([pos[:, None], neg], 1), 1) - pos)
  h = regressors.mlp_apply(params["encoder"], x)
  z = _cos(h, h) / tau                                            # [N, N]
  same = task[:, None] == task[None, :]
  not_self = ~jnp.eye(len(x), dtype=bool)
  # One random same-task partner per query (itself when it is alone in its task).
  logits = jnp.where(same & not_self, jax.random.gumbel(key, z.shape), -jnp.inf)
  partner = jnp.where(jnp.any(same & not_self, 1), jnp.argmax(logits, 1), jnp.arange(len(x)))
  zp = jnp.take_along_axis(z, partner[:, None], 1)[:, 0]
  zn = jnp.where(same, -jnp.inf, z)
  l_ss = jnp.mean(jnp.logaddexp(zp, jax.nn.logsumexp(zn, 1)) - zp)
  return l_llm + sample_weight * l_ss, dict(sample_llm=l_llm, sample_sample=l_ss)


class RouterDC(router_lib.PredictiveRouter):
  """Dual contrastive router with a per-LLM calibration of similarity to utility."""

  def __init__(self, *, hidden: int = 64, out: int = 32, steps: int = 300, learning_rate: float = 3e-3,
               tau: float = 0.2, sample_weight: float = 1.0, seed: int = 0):
    if steps < 1 or learning_rate <= 0 or tau <= 0 or sample_weight < 0:
      raise errors.ConfigError("routerdc needs steps >= 1, learning_rate > 0, tau > 0, "
                               "sample_weight >= 0")
    self.hidden, self.out, self.steps, self.lr = hidden, out, steps, learning_rate
    self.tau, self.sample_weight, self.seed = tau, sample_weight, seed

  def fit(self, data, catalog):
    if len(data.tasks) != len(data.x):
      raise errors.ConfigError("routerdc needs labels with task names (gp_jax.baselines.labels.collect)")
    self.scale = regressors.Standardizer.fit(data.x, data.cost)
    x = jnp.asarray(self.scale.features(data.x))
    names = sorted(set(data.tasks))
    task = jnp.asarray([names.index(t) for t in data.tasks])
    u = jnp.asarray(data.utility)
    m = u.shape[1]
    key = jax.random.PRNGKey(self.seed)
    k_enc, k_llm, k_run = jax.random.split(key, 3)
    params = dict(encoder=regressors.init_mlp(k_enc, [x.shape[1], self.hidden, self.out]),
                  llm=jax.random.normal(k_llm, (m, self.out)))
    opt = optax.adam(self.lr)
    loss = lambda p, k, x, u, task: dual_contrastive_loss(
        p, x, u, task, k, tau=self.tau, sample_weight=self.sample_weight)[0]

    self.params, losses = regressors.train_full_batch(
        loss, params, opt, jax.random.split(k_run, self.steps), x, u, task)
    self.final_loss = float(losses[-1])
    s = np.asarray(scores(self.params, x))
    # Per-LLM line utility ~ a * s + b (least squares) turns similarities into utilities.
    self.calib = np.stack([np.polyfit(s[:, j], data.utility[:, j], 1) for j in range(m)])
    self.mean_cost = data.cost.mean(0)
    return self

  def predict(self, x, tasks=None):
    s = np.asarray(scores(self.params, jnp.asarray(self.scale.features(x))))
    u = np.clip(s * self.calib[:, 0] + self.calib[:, 1], 0.0, 1.0)
    return u, np.tile(self.mean_cost, (len(x), 1))
