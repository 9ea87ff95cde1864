"""GARNet in jraph + flax linen: the policy and value networks of GraphPlanner.

Tables: query nodes, role-hub nodes (one per (role, LLM) action) and memory rows (one per LLM call),
each row linked to its query node (sender) and its role-LLM hub (receiver) -- a jraph GraphsTuple
whose edges are the memory rows. One GARNet layer:
    h = ReLU(LayerNorm(W x + b)) per table (+ x when widths match)
    hub_out   = h_hub   + beta * segment_mean(h_rows, receivers)
    query_out = h_query + beta * segment_mean(h_rows, senders)
    rows_out  = h_rows  + beta * (query_out[senders] + hub_out[receivers])
with beta learnable, initialised to 1.
Two graphs. The history graph (memory rows of past training episodes) is encoded first; with one
layer its hub outputs are  H_hist = T_hub(x_hub) + beta_h * mean_{rows r of hub} T_row(x_r),
which needs only per-hub sums of transformed rows: the rollout keeps those sums incrementally and
the PPO update rebuilds them per transition from prefix sums (gp_jax/graph/history.py). H_hist
replaces the hub features of the workflow graph (this episode's calls), encoded second with
`num_layers` layers into H [A, d].
Policy: z = MLP([task ; query ; state]);  logits = z . H^T, invalid actions masked.
Value: a separate encoder of the same inputs plus mean-pooled workflow rows and hub table.
"""
from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import jraph

NEG_INF = -1e9


class TableTransform(nn.Module):
  """h = ReLU(LayerNorm(W x + b)), plus x when the widths match."""
  features: int

  @nn.compact
  def __call__(self, x):
    h = nn.relu(nn.LayerNorm()(nn.Dense(self.features)(x)))
    return h + x if x.shape[-1] == self.features else h


class GARNetLayer(nn.Module):
  """One heterogeneous message-passing layer over a single (unbatched) GraphsTuple.

  graph.nodes: [1 + A + 1, *] (query node, A hubs, one padding node), graph.edges: [M, F] rows,
  senders/receivers: [M] (padding rows point at the padding node).
  """
  hidden: int

  @nn.compact
  def __call__(self, graph: jraph.GraphsTuple, num_hubs: int) -> jraph.GraphsTuple:
    beta = self.param("beta", nn.initializers.ones, ())
    n_nodes = num_hubs + 2
    q = TableTransform(self.hidden, name="query")(graph.nodes[:1])
    hubs = TableTransform(self.hidden, name="hub")(graph.nodes[1:1 + num_hubs])
    nodes = jnp.concatenate([q, hubs, jnp.zeros((1, self.hidden), q.dtype)], 0)
    rows = TableTransform(self.hidden, name="row")(graph.edges)
    to_hub = jraph.segment_mean(rows, graph.receivers, n_nodes)
    to_query = jraph.segment_mean(rows, graph.senders, n_nodes)
    node_out = nodes + beta * (to_hub + to_query)
    row_out = rows + beta * (node_out[graph.senders] + node_out[graph.receivers])
    node_out = node_out.at[-1].set(0.0)
    return graph._replace(nodes=node_out, edges=row_out)


class MLP(nn.Module):
  features: Sequence[int]
  last_scale: float = 1.0   # small for a policy head, so the initial policy is near uniform

  @nn.compact
  def __call__(self, x):
    for i, f in enumerate(self.features):
      last = i == len(self.features) - 1
      init = (nn.initializers.variance_scaling(self.last_scale, "fan_in", "truncated_normal")
              if last else nn.initializers.lecun_normal())
      x = nn.Dense(f, kernel_init=init)(x)
      if not last:
        x = nn.relu(nn.LayerNorm()(x))
    return x


def workflow_graph(query_emb, hubs, rows, row_hub, row_valid) -> jraph.GraphsTuple:
  """The workflow graph of one observation as a padded GraphsTuple (query, hubs, padding node).

  Args:
    query_emb: [d_q] query node features. hubs: [A, d] hub features (history output).
    rows: [M, F] memory rows. row_hub: [M] int action of each row (A for padding). row_valid: [M].
  """
  A = hubs.shape[0]
  pad = A + 1
  d = max(query_emb.shape[-1], hubs.shape[-1])
  def widen(x):
    return jnp.pad(x, [(0, 0), (0, d - x.shape[-1])])
  nodes = jnp.concatenate([widen(query_emb[None]), widen(hubs), jnp.zeros((1, d))], 0)
  receivers = jnp.where(row_valid, row_hub + 1, pad).astype(jnp.int32)
  senders = jnp.where(row_valid, 0, pad).astype(jnp.int32)
  M = rows.shape[0]
  return jraph.GraphsTuple(nodes=nodes, edges=rows * row_valid[:, None], senders=senders,
                           receivers=receivers, n_node=jnp.array([A + 2]),
                           n_edge=jnp.array([M]), globals=None)


class GARNet(nn.Module):
  """Policy + value networks. Methods are called with `apply(..., method=...)`."""
  hidden: int = 32
  num_layers: int = 2
  mlp_hidden: int = 64
  use_history: bool = True

  def setup(self):
    self.hist_hub = TableTransform(self.hidden)
    self.hist_row = TableTransform(self.hidden)
    self.hist_beta = self.param("hist_beta", nn.initializers.ones, ())
    self.query_in = nn.Dense(self.hidden)
    self.layers = [GARNetLayer(self.hidden) for _ in range(self.num_layers)]
    self.policy_mlp = MLP((self.mlp_hidden, self.hidden), last_scale=0.01)
    self.value_row = TableTransform(self.hidden)
    self.value_hub = TableTransform(self.hidden)
    self.value_mlp = MLP((self.mlp_hidden, self.mlp_hidden, 1))

  def history_rows(self, rows):
    """[N, F] history memory rows -> [N, d] transformed rows (summed per hub by the caller)."""
    return self.hist_row(rows)

  def history_hubs(self, hub_features, hub_sum, hub_count):
    """H_hist [A, d] from hub features [A, 2D] and per-hub sums [A, d] / counts [A]."""
    h = self.hist_hub(hub_features)
    if not self.use_history:
      return h
    mean = hub_sum / jnp.maximum(hub_count, 1.0)[:, None]
    return h + self.hist_beta * mean

  def policy(self, h_hist, obs):
    """Masked logits [A] for one observation given H_hist [A, d]."""
    graph = workflow_graph(self.query_in(obs["query"]), h_hist, obs["rows"], obs["row_hub"],
                           obs["row_valid"])
    for layer in self.layers:
      graph = layer(graph, h_hist.shape[0])
    H = graph.nodes[1:1 + h_hist.shape[0]]
    z = self.policy_mlp(jnp.concatenate([obs["task"], obs["query"], obs["state"]]))
    logits = H @ z
    return jnp.where(obs["mask"], logits, NEG_INF)

  def value(self, hub_features, obs):
    """Scalar state value for one observation."""
    rows = self.value_row(obs["rows"])
    w = obs["row_valid"].astype(rows.dtype)[:, None]
    pooled_rows = (rows * w).sum(0) / jnp.maximum(w.sum(), 1.0)
    pooled_hubs = self.value_hub(hub_features).mean(0)
    x = jnp.concatenate([obs["task"], obs["query"], obs["state"], pooled_rows, pooled_hubs])
    return self.value_mlp(x)[0]

  def __call__(self, hub_features, hist_rows, obs):
    """Touches every parameter (used by init)."""
    h = self.history_rows(hist_rows)
    hub_sum = jnp.zeros((hub_features.shape[0], self.hidden)).at[0].add(h.sum(0))
    h_hist = self.history_hubs(hub_features, hub_sum, jnp.ones(hub_features.shape[0]))
    return self.policy(h_hist, obs), self.value(hub_features, obs)
