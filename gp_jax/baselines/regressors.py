"""Small per-(query, LLM) utility and cost predictors: k-nearest neighbours, linear, MLP.

Each fit maps query embeddings x [N, D] to a utility [N, M] in [0, 1] and a cost [N, M] per LLM.
Utility heads use a sigmoid with cross-entropy on the soft labels (logistic, the smooth cousin of the
hinge loss); cost heads regress standardised log costs with squared error (costs span ~2 orders of
magnitude across the pool). Training is full-batch Adam inside one jitted `lax.scan`.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

_EPS = 1e-6


def _unit(x: np.ndarray) -> np.ndarray:
  return x / (np.linalg.norm(x, axis=-1, keepdims=True) + _EPS)


def knn_predict(train_x: np.ndarray, train_u: np.ndarray, train_c: np.ndarray, x: np.ndarray, *,
                k: int) -> tuple[np.ndarray, np.ndarray]:
  """Mean utility and cost of the k most cosine-similar training queries.

  Args:
    train_x: [N, D] training embeddings; train_u, train_c: [N, M] labels.
    x: [B, D] queries to predict.
    k: neighbours (clipped to N).
  Returns:
    ([B, M] utility, [B, M] cost).
  """
  k = max(1, min(int(k), len(train_x)))
  sim = _unit(x) @ _unit(train_x).T                     # [B, N]
  idx = np.argsort(-sim, axis=1, kind="stable")[:, :k]  # [B, k]
  return train_u[idx].mean(1), train_c[idx].mean(1)


@dataclasses.dataclass(frozen=True)
class Standardizer:
  """Feature and log-cost scaling fitted on the training set."""
  x_mean: np.ndarray   # [D]
  x_std: np.ndarray    # [D]
  c_mean: np.ndarray   # [M] mean log cost
  c_std: np.ndarray    # [M]

  @classmethod
  def fit(cls, x: np.ndarray, cost: np.ndarray) -> "Standardizer":
    lc = np.log(cost + _EPS)
    return cls(x.mean(0), x.std(0) + 1e-3, lc.mean(0), lc.std(0) + 1e-3)

  def features(self, x: np.ndarray) -> np.ndarray:
    return ((x - self.x_mean) / self.x_std).astype(np.float32)

  def cost_target(self, cost: np.ndarray) -> np.ndarray:
    return ((np.log(cost + _EPS) - self.c_mean) / self.c_std).astype(np.float32)

  def cost_from(self, z: np.ndarray) -> np.ndarray:
    return np.exp(z * self.c_std + self.c_mean) - _EPS


def init_mlp(key: jax.Array, sizes: list[int]) -> list[dict]:
  """Dense layers [{w: [in, out], b: [out]}] with LeCun-normal weights."""
  params = []
  for k, (a, b) in zip(jax.random.split(key, len(sizes) - 1), zip(sizes[:-1], sizes[1:])):
    params.append(dict(w=jax.random.normal(k, (a, b)) / jnp.sqrt(a), b=jnp.zeros(b)))
  return params


def mlp_apply(params: list[dict], x: jax.Array) -> jax.Array:
  """[B, D] -> [B, out]; ReLU between layers, none after the last."""
  for layer in params[:-1]:
    x = jax.nn.relu(x @ layer["w"] + layer["b"])
  return x @ params[-1]["w"] + params[-1]["b"]


def loss_fn(params, x, u, c, *, weight_decay: float):
  """Cross-entropy on soft utility labels plus squared error on standardised log cost.

  Args:
    x: [N, D] features; u: [N, M] utility in [0, 1]; c: [N, M] standardised log cost.
  Returns:
    (scalar loss, metrics dict).
  """
  out = mlp_apply(params, x)
  m = u.shape[1]
  logits, c_hat = out[:, :m], out[:, m:]
  ce = optax.sigmoid_binary_cross_entropy(logits, u).mean()
  mse = jnp.mean((c_hat - c) ** 2)
  l2 = sum(jnp.sum(p["w"] ** 2) for p in params)
  return ce + mse + weight_decay * l2, dict(ce=ce, mse=mse)


@dataclasses.dataclass
class FittedNet:
  """A trained utility/cost network and its scaling."""
  params: list[dict]
  scale: Standardizer
  num_llms: int
  final_loss: float

  def predict(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[B, D] -> ([B, M] utility, [B, M] cost)."""
    out = np.asarray(_apply_jit(self.params, jnp.asarray(self.scale.features(x))))
    m = self.num_llms
    return 1.0 / (1.0 + np.exp(-out[:, :m])), self.scale.cost_from(out[:, m:])


_apply_jit = jax.jit(mlp_apply)


def fit_net(x: np.ndarray, utility: np.ndarray, cost: np.ndarray, *, hidden: tuple[int, ...],
            steps: int, learning_rate: float, weight_decay: float, seed: int) -> FittedNet:
  """Full-batch training of a utility/cost network (hidden=() is the linear model).

  Args:
    x: [N, D] embeddings; utility, cost: [N, M] labels.
    hidden: hidden layer widths.
    steps: Adam steps.
  """
  scale = Standardizer.fit(x, cost)
  xs, ct = jnp.asarray(scale.features(x)), jnp.asarray(scale.cost_target(cost))
  u = jnp.asarray(utility, jnp.float32)
  m = utility.shape[1]
  params = init_mlp(jax.random.PRNGKey(seed), [x.shape[1], *hidden, 2 * m])
  opt = optax.adam(learning_rate)
  params, loss = _train(params, xs, u, ct, opt=opt, steps=int(steps),
                        weight_decay=float(weight_decay))
  return FittedNet(params, scale, m, float(loss))


def train_full_batch(loss, params, opt: optax.GradientTransformation, keys, *args):
  """One `opt` step on loss(params, key, *args) per entry of `keys`, all in one jitted scan.

  Returns (params, losses [len(keys)]). Shared by the baselines' full-batch trainers.
  """
  def run(p, s, keys, *args):
    def step(carry, k):
      p, s = carry
      l, g = jax.value_and_grad(loss)(p, k, *args)
      upd, s = opt.update(g, s, p)
      return (optax.apply_updates(p, upd), s), l
    return jax.lax.scan(step, (p, s), keys)

  (params, _), losses = jax.jit(run)(params, opt.init(params), keys, *args)
  return params, losses


def _train(params, x, u, c, *, opt, steps: int, weight_decay: float):
  loss = lambda p, _k, x, u, c: loss_fn(p, x, u, c, weight_decay=weight_decay)[0]
  params, losses = train_full_batch(loss, params, opt, jnp.zeros(steps), x, u, c)
  return params, losses[-1]
