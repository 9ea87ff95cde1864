"""A GraphRouter-style router: a GNN over task, query and LLM nodes predicting edge utility and cost.

The graph (one per fit or prediction) has a node per task, per query and per LLM. Every query is
linked to its task and to every LLM; the query-LLM edges of training queries carry their observed
labels (utility, standardised log cost, an 'observed' flag), the others carry only the flag at 0.
Message passing (jraph GraphNetwork layers, mean aggregation, residual) lets a new query borrow what
similar queries of its task learned about each LLM; a decoder maps each (query, LLM) edge to a
utility logit and a standardised log cost. Training hides the labels of a random part of the
training queries at every step and predicts them (the inductive set-up of GraphRouter, Feng et al.
2024); prediction adds the test queries as label-less nodes to the full training graph.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from gp_jax.util import jraph_compat as _jraph_compat  # noqa: F401  (jax aliases jraph still calls)
import jraph

from gp_jax import errors
from gp_jax.baselines import labels as labels_lib
from gp_jax.baselines import regressors
from gp_jax.baselines import router as router_lib

TASK, QUERY, LLM = 0, 1, 2
EDGE_DIM = 5     # utility, standardised log cost, observed flag, is-task-edge, is-llm-edge


def _mlp(hidden: int):
  return jraph.concatenated_args(nn.Sequential([nn.Dense(hidden), nn.relu, nn.Dense(hidden)]))


class GraphRouterNet(nn.Module):
  """Typed-node GNN with an edge decoder.

  Inputs: graph with nodes [V, F] and edges [E, EDGE_DIM]; node_type [V] int; pair_q, pair_m [P]
  node indices of the (query, LLM) pairs to score. Returns [P, 2] (utility logit, log-cost z).
  """
  hidden: int = 32
  num_layers: int = 2

  @nn.compact
  def __call__(self, graph: jraph.GraphsTuple, node_type, pair_q, pair_m, pair_e):
    nodes = nn.Dense(self.hidden)(graph.nodes) + nn.Embed(3, self.hidden)(node_type)
    g = graph._replace(nodes=nodes, edges=nn.Dense(self.hidden)(graph.edges))
    for _ in range(self.num_layers):
      out = jraph.GraphNetwork(update_edge_fn=_mlp(self.hidden), update_node_fn=_mlp(self.hidden),
                               aggregate_edges_for_nodes_fn=jraph.segment_mean)(g)
      g = g._replace(nodes=nn.LayerNorm()(g.nodes + out.nodes),
                     edges=nn.LayerNorm()(g.edges + out.edges))
    h = jnp.concatenate([g.nodes[pair_q], g.nodes[pair_m], g.edges[pair_e]], -1)
    return nn.Sequential([nn.Dense(self.hidden), nn.relu, nn.Dense(2)])(h)


def _pad(a: np.ndarray, width: int) -> np.ndarray:
  return np.pad(a, ((0, 0), (0, width - a.shape[1])))


class GraphLayout:
  """Static structure of one routing graph: T task, N query and M LLM nodes, both edge directions.

  Attributes (numpy): nodes [V, F], node_type [V], senders/receivers [E], pair_q/pair_m/pair_e [N*M]
  (query node, LLM node and query->LLM edge of each pair, query-major), and task_edges/llm_edges
  for building the edge features.
  """

  def __init__(self, task_x: np.ndarray, query_x: np.ndarray, query_task: np.ndarray,
               llm_x: np.ndarray):
    T, N, M = len(task_x), len(query_x), len(llm_x)
    width = max(task_x.shape[1], query_x.shape[1], llm_x.shape[1])
    self.nodes = np.concatenate([_pad(task_x, width), _pad(query_x, width), _pad(llm_x, width)]
                                ).astype(np.float32)
    self.node_type = np.array([TASK] * T + [QUERY] * N + [LLM] * M, np.int32)
    q = T + np.arange(N)
    m = T + N + np.arange(M)
    pq, pm = np.repeat(q, M), np.tile(m, N)
    tq = query_task.astype(np.int64)
    # Edge blocks: query->LLM (N*M), LLM->query (N*M), query->task (N), task->query (N).
    self.senders = np.concatenate([pq, pm, q, tq]).astype(np.int32)
    self.receivers = np.concatenate([pm, pq, tq, q]).astype(np.int32)
    self.pair_q, self.pair_m = pq.astype(np.int32), pm.astype(np.int32)
    self.pair_e = np.arange(N * M, dtype=np.int32)
    self.N, self.M = N, M

  def edges(self, u: np.ndarray, cz: np.ndarray, observed: np.ndarray):
    """Edge features [E, EDGE_DIM] (jnp) from [N, M] labels and an [N] observed mask (jnp ok)."""
    obs = jnp.asarray(observed, jnp.float32)[:, None] * jnp.ones((1, self.M))
    pair = jnp.stack([u * obs, cz * obs, obs, jnp.zeros_like(obs), jnp.ones_like(obs)], -1)
    pair = pair.reshape(self.N * self.M, EDGE_DIM)
    task = jnp.tile(jnp.array([[0, 0, 0, 1, 0]], jnp.float32), (2 * self.N, 1))
    return jnp.concatenate([pair, pair, task])

  def arrays(self) -> dict:
    """The structure as arrays, passed to jitted code as arguments (not baked-in constants)."""
    return dict(nodes=self.nodes, senders=self.senders, receivers=self.receivers,
                node_type=self.node_type, pair_q=self.pair_q, pair_m=self.pair_m, pair_e=self.pair_e)


def _apply(net: GraphRouterNet, params, arr: dict, edges) -> jax.Array:
  graph = jraph.GraphsTuple(nodes=arr["nodes"], edges=edges, senders=arr["senders"],
                            receivers=arr["receivers"], n_node=jnp.array([arr["nodes"].shape[0]]),
                            n_edge=jnp.array([arr["senders"].shape[0]]), globals=None)
  return net.apply(params, graph, arr["node_type"], arr["pair_q"], arr["pair_m"], arr["pair_e"])


class GraphRouter(router_lib.PredictiveRouter):
  """GNN over task/query/LLM nodes; fit on RoutingData with tasks and llm_x set."""

  def __init__(self, *, hidden: int = 32, num_layers: int = 2, steps: int = 300,
               learning_rate: float = 3e-3, hide_fraction: float = 0.3, seed: int = 0):
    if steps < 1 or learning_rate <= 0 or not 0 < hide_fraction < 1:
      raise errors.ConfigError("graph router needs steps >= 1, learning_rate > 0, "
                               "0 < hide_fraction < 1")
    self.net = GraphRouterNet(hidden=hidden, num_layers=num_layers)
    self.steps, self.lr, self.hide, self.seed = steps, learning_rate, hide_fraction, seed

  def _task_ids(self, tasks) -> np.ndarray:
    return np.array([self.task_index.get(t, len(self.task_index)) for t in tasks])

  def fit(self, data: labels_lib.RoutingData, catalog):
    if data.llm_x is None or len(data.tasks) != len(data.x):
      raise errors.ConfigError("the graph router needs labels with task names and LLM embeddings "
                               "(gp_jax.baselines.labels.collect writes them)")
    self.data = data
    self.task_index = {t: i for i, t in enumerate(sorted(set(data.tasks)))}
    tid = self._task_ids(data.tasks)
    # Task nodes: the mean training-query embedding of the task; one extra node for unseen tasks.
    self.task_x = np.stack([data.x[tid == i].mean(0) for i in range(len(self.task_index))]
                           + [np.zeros(data.x.shape[1], np.float32)])
    self.scale = regressors.Standardizer.fit(data.x, data.cost)
    price = np.array([[np.log(catalog[m].price_in + catalog[m].price_out), np.log(catalog[m].size_b)]
                      for m in data.llms], np.float32)
    self.llm_x = np.concatenate([data.llm_x, price], 1)
    layout = GraphLayout(self.task_x, self.scale.features(data.x), tid, self.llm_x)
    u = jnp.asarray(data.utility)
    cz = jnp.asarray(self.scale.cost_target(data.cost))
    key = jax.random.PRNGKey(self.seed)
    arr = layout.arrays()
    net, hide = self.net, self.hide
    graph0 = jraph.GraphsTuple(nodes=arr["nodes"], edges=layout.edges(u, cz, np.ones(layout.N)),
                               senders=arr["senders"], receivers=arr["receivers"],
                               n_node=np.array([len(arr["nodes"])]),
                               n_edge=np.array([len(arr["senders"])]), globals=None)
    params = net.init(key, graph0, arr["node_type"], arr["pair_q"], arr["pair_m"], arr["pair_e"])
    opt = optax.adam(self.lr)

    def loss(p, k, arr, u, cz):
      hidden = jax.random.uniform(k, (layout.N,)) < hide
      out = _apply(net, p, arr, layout.edges(u, cz, ~hidden)).reshape(layout.N, layout.M, 2)
      w = hidden.astype(jnp.float32)[:, None]
      per = optax.sigmoid_binary_cross_entropy(out[..., 0], u) + (out[..., 1] - cz) ** 2
      return jnp.sum(per * w) / (jnp.sum(w) * layout.M + 1e-6)

    keys = jax.random.split(jax.random.fold_in(key, 1), self.steps)
    self.params, losses = regressors.train_full_batch(loss, params, opt, keys, arr, u, cz)
    self.final_loss = float(losses[-1])
    return self

  def predict(self, x, tasks=None):
    if tasks is None or len(tasks) != len(x):
      raise ValueError("the graph router needs the task name of every query")
    d = self.data
    layout = GraphLayout(self.task_x, self.scale.features(np.concatenate([d.x, x])),
                         self._task_ids(list(d.tasks) + list(tasks)), self.llm_x)
    n = len(d.x)
    u = jnp.concatenate([jnp.asarray(d.utility), jnp.zeros((len(x), layout.M))])
    cz = jnp.concatenate([jnp.asarray(self.scale.cost_target(d.cost)), jnp.zeros((len(x), layout.M))])
    observed = np.arange(layout.N) < n
    out = np.asarray(jax.jit(_apply, static_argnums=0)(self.net, self.params, layout.arrays(),
                                                        layout.edges(u, cz, observed)))
    out = out.reshape(layout.N, layout.M, 2)[n:]
    return 1.0 / (1.0 + np.exp(-out[..., 0])), self.scale.cost_from(out[..., 1])
