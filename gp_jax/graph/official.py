"""The released GraphPlanner network in flax: the authors' PolicyNetwork and ValueNetwork
(github.com/ulab-uiuc/GraphPlanner, router_planner/dynamic_router/network.py, `dblayer` backbone),
computed as that code computes them, on padded tables.

Tables (the released code's names; d the text width, h the hidden width):
  query table  [Q, d]      one row per query, its id = its row;
  LLM table    [A, 2d]     one row per (role, LLM) action, [role embedding ; LLM embedding],
                           id = action;
  memory table [M, 2d + 2] one row per LLM call, [n_i ; n_o ; score ; cost], with the ids of its
                           query and of its action; padded rows carry valid = False.
One DBLayer over the three tables (T_t = ReLU(LayerNorm(W x + b)), plus x when widths match):
  k_query[i] = (T_q(q_i) + mean_{rows r of query i} T_m(m_r)) / n_query
  k_llm[a]   = (T_l(l_a) + mean_{rows r of action a} T_m(m_r)) / n_llm
  q_out = T_q(q) + s k_query,  l_out = T_l(l) + s k_llm,
  m_out = T_m(m) + s (k_query[q(r)] + k_llm[a(r)])
with s a learnable scalar and n_key the number of non-empty tables that carry the key (the memory
table counts only when it has a valid row; a key absent from the memory gets 0 from it, as
torch_scatter's mean gives). Ids are used as they are: the released code maps them through their
sorted order first, a bijection that changes no output.
Policy: l_his = his_dbl(query, LLM, history).LLM; L = local_dbl(query, l_his, workflow).LLM;
  z = ReLU(W [ReLU(E[task]) ; tower_q(query[i]) ; tower_s(state)]), p = softmax(mask ? L z : -1e9).
Value: its own his_dbl and local_dbl; the mean of each table's output rows (zeros for an empty one)
  goes through table_aggregator (workflow) and his_aggregator (history); with
  s' = ReLU(W [tower_s(state) ; tower_q(query[i]) ; ReLU(E[task])]) (note the order),
  v = value_head(fusion([s' ; local_agg ; his_agg])).
Nothing in the history part depends on the observation, so `history` encodes it once per snapshot
of the history (the released code recomputes it at every decision) and `decide` reads it.
Parameters load from and save to the released code's state_dict names (`from_state_dict`,
`to_state_dict`); docs/parity.md has the checks against the released code.
"""
from __future__ import annotations

from typing import Mapping, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from gp_jax import errors

NEG_FILL = -1e9          # the released code's masked_fill value
LN_EPS = 1e-5            # torch.nn.LayerNorm's default epsilon
NUM_CLASSES = 11         # nn.Embedding(11, h): the released task-class embedding
TABLES = ("query_table", "LLM_table", "memory_table")


class Memory(NamedTuple):
  """A padded memory table: rows [M, 2d + 2], their query ids and actions [M], valid [M]."""
  rows: jax.Array
  query: jax.Array
  action: jax.Array
  valid: jax.Array


class Observation(NamedTuple):
  """One decision: its workflow (local) memory, state [d], his_index [2] (query row, task class)
  and action mask [A] (nonzero = valid)."""
  local: Memory
  state: jax.Array
  his_index: jax.Array
  mask: jax.Array


class TableLayer(nn.Module):
  """Linear -> LayerNorm -> ReLU, plus the input when its width is the output's."""
  features: int

  @nn.compact
  def __call__(self, x):
    h = nn.Dense(self.features, name="layer")(x)
    h = nn.relu(nn.LayerNorm(epsilon=LN_EPS, use_fast_variance=False, name="layer_post_0")(h))
    return x + h if x.shape[-1] == self.features else h


def _segment_mean(x, ids, valid, n):
  """[n, F] mean of the valid rows of x per id (0 where an id has none), and [n] counts."""
  w = valid.astype(x.dtype)
  total = jax.ops.segment_sum(x * w[:, None], ids, n)
  count = jax.ops.segment_sum(w, ids, n)
  return total / jnp.maximum(count, 1.0)[:, None], count


class DBLayer(nn.Module):
  """The released DBLayer over (query, LLM, memory) tables (module notes)."""
  features: int

  @nn.compact
  def __call__(self, query, llm, memory: Memory):
    skip = self.param("skip_ratio", nn.initializers.ones, ())
    hq = TableLayer(self.features, name="query_table")(query)
    hl = TableLayer(self.features, name="LLM_table")(llm)
    hm = TableLayer(self.features, name="memory_table")(memory.rows)
    Q, A = query.shape[0], llm.shape[0]
    has_rows = jnp.any(memory.valid).astype(hq.dtype)
    mq, _ = _segment_mean(hm, memory.query, memory.valid, Q)
    ma, _ = _segment_mean(hm, memory.action, memory.valid, A)
    k_query = (hq + mq) / (1.0 + has_rows)
    k_llm = (hl + ma) / (1.0 + has_rows)
    q_out = hq + k_query * skip
    l_out = hl + k_llm * skip
    m_out = hm + k_query[memory.query] * skip + k_llm[memory.action] * skip
    return q_out, l_out, m_out


def _tower(features, name):
  return nn.Sequential([nn.Dense(features, name=f"{name}_l0"), nn.relu,
                        nn.Dense(features, name=f"{name}_l2"), nn.relu], name=name)


def _masked_mean(x, valid):
  w = valid.astype(x.dtype)[:, None]
  return (x * w).sum(0) / jnp.maximum(w.sum(), 1.0)


class OfficialPolicy(nn.Module):
  """The released PolicyNetwork. `history` -> l_his [A, h]; `decide` -> probabilities [A]."""
  hidden: int
  num_classes: int = NUM_CLASSES

  def setup(self):
    self.his_dbl = DBLayer(self.hidden)
    self.local_dbl = DBLayer(self.hidden)
    self.state_tower = _tower(self.hidden, "state_tower")
    self.state_tower_query = _tower(self.hidden, "state_tower_query")
    self.class_embedding = nn.Embed(self.num_classes, self.hidden, name="class_embedding")
    self.state_transform = nn.Dense(self.hidden, name="state_transform_l0")

  def history(self, query, llm, history: Memory):
    return self.his_dbl(query, llm, history)[1]

  def decide(self, query, l_his, obs: Observation):
    scores = self.logits(query, l_his, obs)
    return jax.nn.softmax(scores)

  def logits(self, query, l_his, obs: Observation):
    """The masked scores (masked_fill(mask == 0, -1e9) of state @ LLM rows^T)."""
    llm = self.local_dbl(query, l_his, obs.local)[1]
    task = nn.relu(self.class_embedding(obs.his_index[1]))
    q = self.state_tower_query(query[obs.his_index[0]])
    s = self.state_tower(obs.state)
    z = nn.relu(self.state_transform(jnp.concatenate([task, q, s])))
    return jnp.where(obs.mask == 0, NEG_FILL, llm @ z)

  def __call__(self, query, llm, history: Memory, obs: Observation):
    return self.decide(query, self.history(query, llm, history), obs)


def _aggregator(hidden, name):
  return nn.Sequential([nn.Dense(hidden, name=f"{name}_l0"), nn.relu,
                        nn.LayerNorm(epsilon=LN_EPS, use_fast_variance=False, name=f"{name}_l2"),
                        nn.Dense(hidden, name=f"{name}_l3"), nn.relu], name=name)


class OfficialValue(nn.Module):
  """The released ValueNetwork. `history` -> (l_his [A, h], his_agg [h]); `decide` -> value."""
  hidden: int
  num_classes: int = NUM_CLASSES

  def setup(self):
    h = self.hidden
    self.his_dbl = DBLayer(h)
    self.local_dbl = DBLayer(h)
    self.state_tower = _tower(h, "state_tower")
    self.state_tower_query = _tower(h, "state_tower_query")
    self.class_embedding = nn.Embed(self.num_classes, h, name="class_embedding")
    self.state_transform = nn.Dense(h, name="state_transform_l0")
    self.table_aggregator = _aggregator(h, "table_aggregator")
    self.his_aggregator = _aggregator(h, "his_aggregator")
    self.fusion_layer = nn.Sequential([
        nn.Dense(h, name="fusion_layer_l0"), nn.relu,
        nn.LayerNorm(epsilon=LN_EPS, use_fast_variance=False, name="fusion_layer_l2")],
        name="fusion_layer")
    self.value_head = nn.Sequential([nn.Dense(h, name="value_head_l0"), nn.relu,
                                     nn.Dense(1, name="value_head_l2")], name="value_head")

  def _pooled(self, q_out, l_out, m_out, valid):
    return jnp.concatenate([q_out.mean(0), l_out.mean(0), _masked_mean(m_out, valid)])

  def history(self, query, llm, history: Memory):
    q_out, l_out, m_out = self.his_dbl(query, llm, history)
    return l_out, self.his_aggregator(self._pooled(q_out, l_out, m_out, history.valid))

  def decide(self, query, l_his, his_agg, obs: Observation):
    q_out, l_out, m_out = self.local_dbl(query, l_his, obs.local)
    local_agg = self.table_aggregator(self._pooled(q_out, l_out, m_out, obs.local.valid))
    q = self.state_tower_query(query[obs.his_index[0]])
    task = nn.relu(self.class_embedding(obs.his_index[1]))
    s = self.state_tower(obs.state)
    fused = nn.relu(self.state_transform(jnp.concatenate([s, q, task])))
    x = self.fusion_layer(jnp.concatenate([fused, local_agg, his_agg]))
    return self.value_head(x)[0]

  def __call__(self, query, llm, history: Memory, obs: Observation):
    l_his, his_agg = self.history(query, llm, history)
    return self.decide(query, l_his, his_agg, obs)


class Networks(NamedTuple):
  policy: OfficialPolicy
  value: OfficialValue


def networks(hidden: int, num_classes: int = NUM_CLASSES) -> Networks:
  return Networks(OfficialPolicy(hidden, num_classes), OfficialValue(hidden, num_classes))


def history_encoding(nets: Networks, params, query, llm, history: Memory):
  """What both networks read of the history: (policy l_his, value l_his, value his_agg)."""
  l_pol = nets.policy.apply({"params": params["policy"]}, query, llm, history,
                            method=OfficialPolicy.history)
  l_val, his_agg = nets.value.apply({"params": params["value"]}, query, llm, history,
                                    method=OfficialValue.history)
  return l_pol, l_val, his_agg


def decide_batch(nets: Networks, params, query, encoding, obs: Observation):
  """Probabilities [B, A] and values [B] of a batch of observations (leading axis B) on one
  history encoding."""
  l_pol, l_val, his_agg = encoding
  probs = jax.vmap(lambda o: nets.policy.apply({"params": params["policy"]}, query, l_pol, o,
                                               method=OfficialPolicy.decide))(obs)
  values = jax.vmap(lambda o: nets.value.apply({"params": params["value"]}, query, l_val,
                                               his_agg, o, method=OfficialValue.decide))(obs)
  return probs, values


def forward(nets: Networks, params, query, llm, history: Memory, obs: Observation):
  """Both networks on a batch of observations: (probs [B, A], values [B])."""
  return decide_batch(nets, params, query, history_encoding(nets, params, query, llm, history), obs)


def init(nets: Networks, key, query, llm, history: Memory, obs: Observation):
  """Fresh parameters {"policy", "value"} for one (unbatched) observation's shapes."""
  kp, kv = jax.random.split(key)
  return {"policy": nets.policy.init(kp, query, llm, history, obs)["params"],
          "value": nets.value.init(kv, query, llm, history, obs)["params"]}


# --- the released code's state_dict names --------------------------------------------------------

def _torch_key(path: tuple[str, ...]) -> tuple[str, bool]:
  """(state_dict key, transposed) of one flax parameter path.

  Flax names follow torch's: a DBLayer's table layers sit under `<dbl>.layer.<table>`; a
  Sequential's entry i is `<name>_l<i>`; `layer_post_0` is torch's `layer_post.0`.
  """
  *mods, leaf = path
  parts = []
  for i, m in enumerate(mods):
    if m.endswith("_dbl"):
      parts.append(m)
      if i + 1 < len(mods):
        parts.append("layer")
    elif m == "layer_post_0":
      parts.extend(["layer_post", "0"])
    elif "_l" in m and m.rsplit("_l", 1)[1].isdigit():
      parts.extend(m.rsplit("_l", 1))
    else:
      parts.append(m)
  parts.append({"kernel": "weight", "scale": "weight", "embedding": "weight"}.get(leaf, leaf))
  return ".".join(parts), leaf == "kernel"


def _flat(tree, prefix=()):
  for k, v in tree.items():
    if isinstance(v, Mapping):
      yield from _flat(v, prefix + (k,))
    else:
      yield prefix + (k,), v


def _unflat(items):
  out: dict = {}
  for path, v in items:
    d = out
    for k in path[:-1]:
      d = d.setdefault(k, {})
    d[path[-1]] = v
  return out


def to_state_dict(params) -> dict[str, np.ndarray]:
  """One network's flax params -> the released code's state_dict arrays (numpy, torch layout)."""
  out = {}
  for path, v in _flat(params):
    key, transposed = _torch_key(path)
    a = np.asarray(v, np.float32)
    out[key] = a.T.copy() if transposed else a
  return out


def from_state_dict(state_dict: Mapping[str, np.ndarray], template) -> dict:
  """The released code's state_dict -> flax params shaped like `template` (one network's params,
  from `init`). Missing, extra or mis-shaped entries are a DataError naming them."""
  items, used = [], set()
  for path, ref in _flat(template):
    key, transposed = _torch_key(path)
    if key not in state_dict:
      raise errors.DataError(f"state_dict has no {key!r}")
    a = np.asarray(state_dict[key], np.float32)
    a = a.T if transposed else a
    if a.shape != tuple(np.shape(ref)):
      want = tuple(np.shape(ref))[::-1] if transposed else tuple(np.shape(ref))
      raise errors.DataError(f"state_dict {key!r} has shape {np.shape(state_dict[key])}, "
                             f"expected {want}")
    items.append((path, jnp.asarray(a)))
    used.add(key)
  extra = sorted(set(state_dict) - used)
  if extra:
    raise errors.DataError("state_dict has entries this network does not have: "
                           + ", ".join(extra[:5]))
  return _unflat(items)
