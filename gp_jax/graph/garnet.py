"""GARNet in jraph + flax linen: the policy and value networks of GraphPlanner, and its ablations.

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

Ablations (docs/ablations.md), all behind the same methods so rollout and PPO code is shared:
  encoder="homogeneous": one transform S for every table (query, hubs, rows; history rows and hubs
    too): S(x) = ReLU(LayerNorm(W [x ; 0] + b)) with x zero-padded to `input_width` (computed as
    x W[:width(x)], the same numbers without the padding), then layers with one shared T.
  encoder="gat": workflow-graph layers weight the rows of each node by attention instead of the
    mean: e_{v,r} = LeakyReLU(a^T [W h_v ; W h_r]), alpha = softmax of e over the rows of node v,
    node_out = h_v + beta * sum_r alpha_{v,r} W h_r.
  encoder="transformer": workflow-graph layers with multi-head scaled dot-product attention of each
    node (queries) over its rows (keys, values), then node_out = LN(n + FFN(n)), n = LN(h_v + attn).
  history_input="summary": the history input of each hub is the text embedding of a sentence
    summarising its past calls: H_hist = T_hub(x_hub) + beta_h * T_sum(e_summary).
  Retrieved rows (observation fields ret_rows [k, F], ret_hub [k], ret_valid [k]) join the
    workflow rows when present (history mode "retrieval", with use_history=False).
Row layout 2 (row_layout=2, docs/memory.md): the observation also holds hub_stats [A, S], the
per-hub statistics of the history (gp_jax/graph/history.py, HubStats: confidence, empty, recency-
weighted utility, cost and failure rate). The policy adds T_stats(hub_stats) to H_hist; the value
network pools T_value_hub(hub features) + T_value_stats(hub_stats) over the hubs (mean and max), so both read
what the history says of each hub.
Memory bias (memory_bias=True, row layout 2 only; docs/memory.md): each hub's logit also gets
    b(s_a) = w2 . ReLU(W1 s_a + b1) + b2,   logits_a = H_a . z + b(s_a),
one small network shared by every hub, reading only that hub's statistics s_a (not its identity,
role or description), with w2 and b2 initialised to 0 (so it starts as the model without it). It
can only express what the statistics say of a hub, whichever hub it is, so weights cannot learn
it as a function of hub identity: its one use is to follow the evidence in the memory.
Memory predictor (memory_predictor=True, row layout 2 only; docs/memory.md): a small network
    U(s_a) = sigmoid(w2 . ReLU(W1 s'_a + b1) + b2),   s'_a = s_a with its failure rate set to 0,
shared by every hub and reading only that hub's statistics, is trained by regression (not by
PPO) to predict the utility the hub's next call brings when it answers, from the statistics of
its earlier calls (history.predictor_pairs: every answered history row is one example). With
f(s_a) and c(s_a) the hub's recency-weighted failure rate and mean call cost (read from its
statistics), the predicted reward of its next call enters the logit with a fixed weight kappa
(predictor_scale):
    r(s_a) = (1 - f) U - f U - alpha c,   logits_a = H_a . z + kappa * stop_gradient(r(s_a)):
the call answers with probability 1 - f and brings U; it fails with probability f, and then the
episode loses the answer the call should have given, charged U. So what the memory says of a hub
moves its logit by an amount the policy gradient does not have to discover, and a higher failure
rate can only lower it (U in (0, 1) does not read f). alpha = predictor_alpha, the reward's.
The history graph always aggregates with the mean: its per-hub sums must stay prefix-summable so
that the PPO update can rebuild every decision's exact snapshot; attention over history rows would
need each snapshot's softmax normaliser, which prefix sums of rows cannot give.
Policy heads (policy_head):
  "flat" (default): one softmax over the A = R x K (role, LLM) actions, as above.
  "factored": the policy first picks a role, then an LLM within it,
      log p(a) = log p(r(a)) + log p(l(a) | r(a)),   r(a) = a // K, l(a) = a mod K
    (mdp.ActionSpace's index = role x K + LLM),
    LLM within role: the hub scores s_a = H_a . z (+ the memory term), softmaxed over the valid
      actions of each role;
    role: a pooled readout of the role's hub rows, s_r = mean_{valid a of r}(H_a) . z_r, with
      z_r = MLP_r([task ; query ; state]) (a second small head, initialised near 0, so the first
      policy is near uniform over the valid roles), softmaxed over the roles with a valid action.
  It reads no fixed number of roles (a new role is one more pooled readout), only K = num_llms,
  the LLMs per role of the space it scores: a router scoring a pool of another size (new LLMs)
  is `for_action_space(model, space)`, with the same parameters.
  `policy` returns the joint log-probabilities as the masked logits [A] (invalid actions and
  roles without a valid action: probability 0), so sampling, log-probabilities, the PPO ratio
  (then exactly the product of the two heads' ratios) and the entropy (of the joint: H(role) +
  E[H(LLM | role)]) need no other code. Greedy decisions (`greedy_actions`, every greedy caller)
  take the most probable role, then its most probable LLM; "flat" takes the argmax action.
"""
from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import jraph
import numpy as np

from gp_jax.graph import history as history_lib

NEG_INF = -1e9
ENCODERS = ("garnet", "homogeneous", "gat", "transformer")
HISTORY_INPUTS = ("sums", "summary")
POLICY_HEADS = ("flat", "factored")


def action_roles(num_actions: int, num_llms: int) -> np.ndarray:
  """The role index of every action, int32 [A] (index = role x num_llms + llm, mdp.ActionSpace)."""
  if num_llms < 1 or num_actions % num_llms:
    raise ValueError(f"{num_actions} actions are not roles x {num_llms} LLMs")
  return (np.arange(num_actions) // num_llms).astype(np.int32)


def _by_role(x, num_llms: int):
  """[..., A] -> [..., R, K] (actions are role-major: index = role x K + llm)."""
  A = x.shape[-1]
  if num_llms < 1 or A % num_llms:
    raise ValueError(f"{A} actions are not roles x {num_llms} LLMs")
  return x.reshape(x.shape[:-1] + (A // num_llms, num_llms))


def role_readout(hubs, mask, num_llms: int):
  """[R, d] the mean of each role's valid hub rows (hubs [A, d], mask [A]); 0 for a role without
  a valid action."""
  w = _by_role(mask, num_llms).astype(hubs.dtype)                          # [R, K]
  rows = hubs.reshape(w.shape + hubs.shape[-1:])                            # [R, K, d]
  return jnp.sum(rows * w[..., None], -2) / jnp.maximum(w.sum(-1), 1.0)[:, None]


def factored_log_probs(llm_scores, role_scores, mask, num_llms: int):
  """Joint log-probabilities [A] of the factored policy, NEG_INF on invalid actions.

  Args:
    llm_scores: [A] the score of each action's LLM within its role (softmaxed per role over the
      role's valid actions).
    role_scores: [R] the score of each role (softmaxed over the roles with a valid action).
    mask: [A] valid actions.
    num_llms: K (A = R x K, role-major).
  """
  m = _by_role(mask, num_llms)
  llm = jax.nn.log_softmax(jnp.where(m, _by_role(llm_scores, num_llms), NEG_INF), -1)
  role = jax.nn.log_softmax(jnp.where(m.any(-1), role_scores, NEG_INF))
  joint = (role[:, None] + llm).reshape(mask.shape)
  return jnp.where(mask, joint, NEG_INF)


def for_action_space(model, space):
  """`model` for scoring the actions of `space` (gp_jax.workflow.mdp.ActionSpace): the factored
  head with that space's LLMs per role (the same parameters: nothing in them counts the LLMs or
  roles); any other model unchanged. For a router evaluated on another pool than it was trained
  on (new LLMs: another K)."""
  if getattr(model, "policy_head", "flat") != "factored":
    return model
  return model.clone(num_llms=int(space.num_llms))


def greedy_actions(model, logits):
  """The greedy actions [...] of masked logits [..., A] under `model`'s policy head: "flat" (or
  any model without one) the argmax action; "factored" the most probable role, then the most
  probable LLM within it (the role's total probability decides, not its best action's)."""
  if getattr(model, "policy_head", "flat") != "factored":
    return jnp.argmax(logits, -1)
  K = int(model.num_llms)
  g = _by_role(logits, K)                                                   # [..., R, K]
  role = jnp.argmax(jax.nn.logsumexp(g, -1), -1)                            # [...]
  within = jnp.take_along_axis(g, role[..., None, None], -2)[..., 0, :]     # [..., K]
  return role * K + jnp.argmax(within, -1)


class TableTransform(nn.Module):
  """h = ReLU(LayerNorm(W x + b)), plus x when the widths match."""
  features: int

  @nn.compact
  def __call__(self, x):
    h = nn.relu(nn.LayerNorm()(nn.Dense(self.features)(x)))
    return h + x if x.shape[-1] == self.features else h


class SharedTransform(nn.Module):
  """One input transform for tables of any width <= `width` (homogeneous ablation).

  S(x) = ReLU(LayerNorm(W [x ; 0] + b)), W [width, features]: x zero-padded to `width`, computed
  as x W[:width(x)] (identical numbers, no padded copy of large tables).
  """
  width: int
  features: int

  @nn.compact
  def __call__(self, x):
    w = x.shape[-1]
    if w > self.width:
      raise ValueError(f"table width {w} exceeds the shared input width {self.width}")
    kernel = self.param("kernel", nn.initializers.lecun_normal(), (self.width, self.features))
    bias = self.param("bias", nn.initializers.zeros, (self.features,))
    return nn.relu(nn.LayerNorm()(x @ kernel[:w] + bias))


def incoming(graph: jraph.GraphsTuple):
  """Each row twice, once towards its hub and once towards its query node.

  Returns (targets [2M] node index, source [2M] row index): every node's incoming rows are the
  entries with its index in `targets` (hubs: rows of that action; the query node: all rows).
  """
  M = graph.edges.shape[0]
  rows = jnp.arange(M)
  return jnp.concatenate([graph.receivers, graph.senders]), jnp.concatenate([rows, rows])


class GARNetLayer(nn.Module):
  """One heterogeneous message-passing layer over a single (unbatched) GraphsTuple.

  graph.nodes: [1 + A + 1, *] (query node, A hubs, one padding node), graph.edges: [M, F] rows,
  senders/receivers: [M] (padding rows point at the padding node).
  aggregate: "mean" (GARNet), "gat" or "transformer" (ablations); shared: one transform for the
  three tables (homogeneous ablation; the inputs must then have one width).
  """
  hidden: int
  aggregate: str = "mean"
  shared: bool = False
  heads: int = 4

  @nn.compact
  def __call__(self, graph: jraph.GraphsTuple, num_hubs: int) -> jraph.GraphsTuple:
    beta = self.param("beta", nn.initializers.ones, ())
    n_nodes = num_hubs + 2
    if self.shared:
      t = TableTransform(self.hidden, name="shared")
      tq = th = tr = t
    else:
      tq = TableTransform(self.hidden, name="query")
      th = TableTransform(self.hidden, name="hub")
      tr = TableTransform(self.hidden, name="row")
    q = tq(graph.nodes[:1])
    hubs = th(graph.nodes[1:1 + num_hubs])
    nodes = jnp.concatenate([q, hubs, jnp.zeros((1, self.hidden), q.dtype)], 0)
    rows = tr(graph.edges)
    if self.aggregate == "mean":
      to_hub = jraph.segment_mean(rows, graph.receivers, n_nodes)
      to_query = jraph.segment_mean(rows, graph.senders, n_nodes)
      node_out = nodes + beta * (to_hub + to_query)
    elif self.aggregate == "gat":
      node_out = nodes + beta * self._gat(graph, nodes, rows, n_nodes)
    elif self.aggregate == "transformer":
      node_out = self._transformer(graph, nodes, rows, n_nodes)
    else:
      raise ValueError(f"unknown aggregate {self.aggregate!r}")
    row_out = rows + beta * (node_out[graph.senders] + node_out[graph.receivers])
    node_out = node_out.at[-1].set(0.0)
    return graph._replace(nodes=node_out, edges=row_out)

  def _gat(self, graph, nodes, rows, n_nodes):
    """sum_r alpha_{v,r} W h_r, alpha = segment softmax of LeakyReLU(a^T [W h_v ; W h_r])."""
    w = nn.Dense(self.hidden, use_bias=False, name="gat_w")
    a = self.param("gat_a", nn.initializers.lecun_normal(), (2 * self.hidden, 1))
    g_nodes, g_rows = w(nodes), w(rows)
    targets, source = incoming(graph)
    score = (g_nodes @ a[:self.hidden])[targets, 0] + (g_rows @ a[self.hidden:])[source, 0]
    alpha = jraph.segment_softmax(nn.leaky_relu(score, 0.2), targets, n_nodes)
    self.sow("intermediates", "attention", alpha)
    return jax.ops.segment_sum(alpha[:, None] * g_rows[source], targets, n_nodes)

  def _transformer(self, graph, nodes, rows, n_nodes):
    """LN(n + FFN(n)), n = LN(h_v + W_o MultiHead(q = h_v, k = v = rows of v))."""
    H = self.heads
    dh = self.hidden // H
    q = nn.Dense(self.hidden, name="att_q")(nodes).reshape(-1, H, dh)
    k = nn.Dense(self.hidden, name="att_k")(rows).reshape(-1, H, dh)
    v = nn.Dense(self.hidden, name="att_v")(rows).reshape(-1, H, dh)
    targets, source = incoming(graph)
    score = jnp.sum(q[targets] * k[source], -1) / jnp.sqrt(float(dh))      # [2M, H]
    alpha = jraph.segment_softmax(score, targets, n_nodes)
    self.sow("intermediates", "attention", alpha)
    att = jax.ops.segment_sum(alpha[..., None] * v[source], targets, n_nodes)
    n = nn.LayerNorm(name="ln_att")(nodes + nn.Dense(self.hidden, name="att_o")(
        att.reshape(-1, self.hidden)))
    ffn = nn.relu(nn.Dense(2 * self.hidden, name="ffn_in")(n))
    ffn = nn.Dense(self.hidden, name="ffn_out")(ffn)
    return nn.LayerNorm(name="ln_ffn")(n + ffn)


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


def _hub_stats(obs):
  if "hub_stats" not in obs:
    raise ValueError("a row-layout-2 GARNet reads the observation field hub_stats [A, S] (the "
                     "PolicyRunner adds it)")
  return obs["hub_stats"]


def memory_rows(obs):
  """(rows [M', F], row_hub [M'], row_valid [M']) of an observation: its workflow rows, followed
  by its retrieved history rows when the observation has them (retrieval ablation)."""
  if "ret_rows" not in obs:
    return obs["rows"], obs["row_hub"], obs["row_valid"]
  return (jnp.concatenate([obs["rows"], obs["ret_rows"]], -2),
          jnp.concatenate([obs["row_hub"], obs["ret_hub"]], -1),
          jnp.concatenate([obs["row_valid"], obs["ret_valid"]], -1))


class GARNet(nn.Module):
  """Policy + value networks. Methods are called with `apply(..., method=...)`.

  encoder: one of ENCODERS (workflow-graph layer; "homogeneous" needs input_width >= the widest
  table: hub features, rows, query). history_input: "sums" (per-hub sums of transformed history
  rows) or "summary" (per-hub summary text embeddings [A, D] passed in place of the sums).
  retrieval_k > 0: the rollout adds k retrieved history rows to each observation.
  policy_head: one of POLICY_HEADS (module notes); "factored" needs num_llms, the K of the action
  space it scores (actions role-major; the number of roles may differ from training's).
  """
  hidden: int = 32
  num_layers: int = 2
  mlp_hidden: int = 64
  use_history: bool = True
  encoder: str = "garnet"
  history_input: str = "sums"
  retrieval_k: int = 0
  heads: int = 4
  input_width: int = 0
  row_layout: int = 1
  memory_bias: bool = False
  memory_predictor: bool = False
  predictor_scale: float = 0.0
  predictor_alpha: float = 0.0
  policy_head: str = "flat"
  num_llms: int = 0

  @property
  def has_memory_term(self) -> bool:
    """The logits get a term read from each hub's statistics alone (memory_term)."""
    return self.memory_bias or self.memory_predictor

  @property
  def reads_stats(self) -> bool:
    """Row layout 2: the observations carry hub_stats [A, S], which both networks read."""
    return self.row_layout >= 2

  def setup(self):
    if self.encoder not in ENCODERS:
      raise ValueError(f"unknown encoder {self.encoder!r}")
    if self.history_input not in HISTORY_INPUTS:
      raise ValueError(f"unknown history input {self.history_input!r}")
    if self.policy_head not in POLICY_HEADS:
      raise ValueError(f"unknown policy head {self.policy_head!r}")
    if self.policy_head == "factored" and self.num_llms < 1:
      raise ValueError("the factored policy head needs num_llms (LLMs per role) >= 1")
    homogeneous = self.encoder == "homogeneous"
    if homogeneous:
      if self.input_width <= 0:
        raise ValueError("the homogeneous encoder needs input_width (the widest table)")
      self.shared_in = SharedTransform(self.input_width, self.hidden)
    else:
      self.hist_hub = TableTransform(self.hidden)
      self.hist_row = TableTransform(self.hidden)
    self.hist_beta = self.param("hist_beta", nn.initializers.ones, ())
    if self.history_input == "summary" and not homogeneous:
      self.hist_summary = TableTransform(self.hidden)
    if not homogeneous:
      self.query_in = nn.Dense(self.hidden)
    aggregate = {"gat": "gat", "transformer": "transformer"}.get(self.encoder, "mean")
    self.layers = [GARNetLayer(self.hidden, aggregate=aggregate, shared=homogeneous,
                               heads=self.heads) for _ in range(self.num_layers)]
    for flag in ("memory_bias", "memory_predictor"):
      if getattr(self, flag) and not self.reads_stats:
        raise ValueError(f"{flag} reads the per-hub statistics of row layout 2; "
                         f"row_layout is {self.row_layout}")
    if self.reads_stats:
      self.hist_stats = TableTransform(self.hidden)
    if self.memory_bias:
      self.bias_hidden = nn.Dense(self.hidden)
      self.bias_out = nn.Dense(1, kernel_init=nn.initializers.zeros)
    if self.memory_predictor:
      self.pred_hidden = nn.Dense(self.hidden)
      self.pred_out = nn.Dense(1)
    self.policy_mlp = MLP((self.mlp_hidden, self.hidden), last_scale=0.01)
    if self.policy_head == "factored":
      self.role_mlp = MLP((self.mlp_hidden, self.hidden), last_scale=0.01)
    if homogeneous:
      self.value_shared = SharedTransform(self.input_width, self.hidden)
    else:
      self.value_row = TableTransform(self.hidden)
      self.value_hub = TableTransform(self.hidden)
    if self.reads_stats:
      self.value_stats = TableTransform(self.hidden)
    self.value_mlp = MLP((self.mlp_hidden, self.mlp_hidden, 1))

  @property
  def _homogeneous(self) -> bool:
    return self.encoder == "homogeneous"

  def history_rows(self, rows):
    """[N, F] history memory rows -> [N, d] transformed rows (summed per hub by the caller)."""
    return self.shared_in(rows) if self._homogeneous else self.hist_row(rows)

  def history_hubs(self, hub_features, hub_sum, hub_count):
    """H_hist [A, d] from hub features [A, 2D] and per-hub sums [A, d] / counts [A].

    history_input="summary": hub_sum is the summary embedding [A, D] of each hub (counts unused).
    """
    h = self.shared_in(hub_features) if self._homogeneous else self.hist_hub(hub_features)
    if not self.use_history:
      return h
    if self.history_input == "summary":
      s = self.shared_in(hub_sum) if self._homogeneous else self.hist_summary(hub_sum)
      return h + self.hist_beta * s
    mean = hub_sum / jnp.maximum(hub_count, 1.0)[:, None]
    return h + self.hist_beta * mean

  def policy(self, h_hist, obs):
    """Masked logits [A] for one observation given H_hist [A, d] (factored head: the joint
    log-probabilities, module notes)."""
    if self.reads_stats:
      h_hist = h_hist + self.hist_stats(_hub_stats(obs))
    rows, row_hub, row_valid = memory_rows(obs)
    if self._homogeneous:
      q, rows = self.shared_in(obs["query"]), self.shared_in(rows)
    else:
      q = self.query_in(obs["query"])
    graph = workflow_graph(q, h_hist, rows, row_hub, row_valid)
    for layer in self.layers:
      graph = layer(graph, h_hist.shape[0])
    H = graph.nodes[1:1 + h_hist.shape[0]]
    x = jnp.concatenate([obs["task"], obs["query"], obs["state"]])
    z = self.policy_mlp(x)
    logits = H @ z
    if self.has_memory_term:
      logits = logits + self.memory_term(_hub_stats(obs))
    if self.policy_head == "factored":
      role_scores = role_readout(H, obs["mask"], self.num_llms) @ self.role_mlp(x)
      return factored_log_probs(logits, role_scores, obs["mask"], self.num_llms)
    return jnp.where(obs["mask"], logits, NEG_INF)

  def stats_bias(self, hub_stats):
    """b(s_a) [A]: each hub's logit bias from its own statistics only (module notes)."""
    return self.bias_out(nn.relu(self.bias_hidden(hub_stats)))[:, 0]

  def predict_utility(self, hub_stats):
    """U(s) [...] in (0, 1): the predicted utility (credit) of a hub's next call if it answers,
    from its statistics [..., S] without the failure rate."""
    keep = jnp.arange(hub_stats.shape[-1]) != history_lib.STAT_NAMES.index("failure")
    x = jnp.where(keep, hub_stats, 0.0)
    return jax.nn.sigmoid(self.pred_out(nn.relu(self.pred_hidden(x)))[..., 0])

  def predict_reward(self, hub_stats):
    """(1 - 2 f(s)) U(s) - alpha c(s) [...]: the predicted reward of a hub's next call, f(s) and
    c(s) its recency-weighted failure rate and mean call cost (the statistics hold log(1 + c))."""
    cost = jnp.expm1(hub_stats[..., history_lib.STAT_NAMES.index("cost")])
    fail = hub_stats[..., history_lib.STAT_NAMES.index("failure")]
    return (1.0 - 2.0 * fail) * self.predict_utility(hub_stats) - self.predictor_alpha * cost

  def memory_term(self, hub_stats):
    """[A] what the logits get from each hub's statistics alone: the memory bias b(s_a) and
    kappa x the predicted reward (no policy gradient reaches the predictor through it)."""
    term = jnp.zeros(hub_stats.shape[:-1])
    if self.memory_bias:
      term = term + self.stats_bias(hub_stats)
    if self.memory_predictor:
      term = term + self.predictor_scale * jax.lax.stop_gradient(self.predict_reward(hub_stats))
    return term

  def value(self, hub_features, obs):
    """Scalar state value for one observation."""
    rows, _, valid = memory_rows(obs)
    t_row, t_hub = ((self.value_shared, self.value_shared) if self._homogeneous
                    else (self.value_row, self.value_hub))
    rows = t_row(rows)
    w = valid.astype(rows.dtype)[:, None]
    pooled_rows = (rows * w).sum(0) / jnp.maximum(w.sum(), 1.0)
    if self.reads_stats:
      hubs = t_hub(hub_features) + self.value_stats(_hub_stats(obs))
      pooled_hubs = jnp.concatenate([hubs.mean(0), hubs.max(0)])
    else:
      pooled_hubs = t_hub(hub_features).mean(0)
    x = jnp.concatenate([obs["task"], obs["query"], obs["state"], pooled_rows, pooled_hubs])
    return self.value_mlp(x)[0]

  def __call__(self, hub_features, hist_rows, obs):
    """Touches every parameter (used by init)."""
    h = self.history_rows(hist_rows)
    A = hub_features.shape[0]
    if self.reads_stats and "hub_stats" not in obs:
      obs = dict(obs, hub_stats=jnp.zeros((A, history_lib.STAT_DIM)))
    if self.history_input == "summary":
      hub_in = jnp.zeros((A, obs["query"].shape[-1]))
    else:
      hub_in = jnp.zeros((A, self.hidden)).at[0].add(h.sum(0))
    h_hist = self.history_hubs(hub_features, hub_in, jnp.ones(A))
    return self.policy(h_hist, obs), self.value(hub_features, obs)
