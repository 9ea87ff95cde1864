"""Host-side features of GARNet's tables: role hubs, memory rows, observations.

Shapes (D = text embedding width, P = memory projection width, A = number of actions):
  hub features      [A, 2D]    [role description emb ; LLM description emb] per (role, LLM) action
  memory row        [F]        [proj(input-state emb) (P) ; proj(output emb) (P) ; U ; C ; failed]
  observation       task [D], query [D], state [D + S], rows [M, F], row_hub [M], row_valid [M],
                    mask [A]
Memory rows project the two text embeddings to P dims with a fixed random matrix (P = 0 keeps D):
the history table can hold 1e5 rows, and GARNet's first layer costs rows x F x hidden per gradient
step, so F sets the update time (see benchmarks/bench_garnet.py for both settings).
The pieces every featurizer shares are module functions (`projection`, `hub_table`, `memory_row_table`,
`pad_rows`, `stack`): GraphPlanner's `Featurizer` here and the routed Graph Counselor's
(gp_jax/counselor/routing/features.py), whose state vector differs (FeatureSpec.state_extra).
History ablations (docs/ablations.md): `history_summary` writes one sentence per hub about its past
calls and embeds it ([A, D]); `RetrievalIndex` gives each decision the k history rows whose
input-state projection is most cosine-similar to the projected query embedding, as observation
fields ret_rows [k, F], ret_hub [k] (A for padding), ret_valid [k].
"""
from __future__ import annotations

import dataclasses

import numpy as np

from gp_jax.text import encoder as encoder_lib
from gp_jax.workflow import mdp
from gp_jax.workflow import reward as reward_lib

STATE_EXTRA = 8   # structural state features appended to the node-text embedding
# Row layouts (config model.row_layout; docs/memory.md). 1: every row of an episode carries the
# episode's reward utility (the expected utility on the simulator), the policy reads the rows'
# mean only. 2: each row carries its call's credit of the episode's scored utility (`call_credit`,
# the kind a serving router's feedback gives), and the policy and the value network also read
# per-hub statistics (gp_jax/graph/history.py, HubStats). Records made before the field existed
# are layout 1.
ROW_LAYOUTS = (1, 2)
ROW_LAYOUT_OF_OLDER_CONFIGS = 1
ROW_UTILITY = {1: "reward utility of the episode, on every call",
               2: "per-call credit of the scored utility"}


@dataclasses.dataclass(frozen=True)
class FeatureSpec:
  text_dim: int
  mem_proj: int          # 0: no projection
  max_rows: int          # workflow memory rows per observation (= MDP step cap)
  num_actions: int
  state_extra: int = STATE_EXTRA   # structural state features after the state text embedding

  @property
  def mem_text_dim(self) -> int:
    return self.mem_proj or self.text_dim

  @property
  def row_dim(self) -> int:
    return 2 * self.mem_text_dim + 3

  @property
  def state_dim(self) -> int:
    return self.text_dim + self.state_extra


def projection(spec: FeatureSpec, seed: int) -> np.ndarray | None:
  """The fixed random matrix [D, P] projecting memory-row text embeddings (None when P = 0)."""
  if not spec.mem_proj:
    return None
  rng = np.random.default_rng(seed)
  return (rng.normal(size=(spec.text_dim, spec.mem_proj)) / np.sqrt(spec.mem_proj)
          ).astype(np.float32)


def hub_table(role_embs: np.ndarray, llm_embs: np.ndarray) -> np.ndarray:
  """Hub features [R K, 2D]: [role emb ; LLM emb] per (role, LLM) action, index = role x K + llm.

  Args:
    role_embs: [R, D] embeddings of the role (or agent kind) descriptions.
    llm_embs: [K, D] embeddings of the LLM descriptions.
  """
  K = len(llm_embs)
  return np.concatenate([np.repeat(role_embs, K, axis=0), np.tile(llm_embs, (len(role_embs), 1))],
                        axis=1)


def memory_row_table(input_embs: np.ndarray, output_embs: np.ndarray, utility: np.ndarray,
                     cost_usd, failed, proj: np.ndarray | None) -> np.ndarray:
  """Memory rows [n, F] = [proj(input emb) ; proj(output emb) ; U ; C ; failed] of n calls.

  Args:
    input_embs, output_embs: [n, D] embeddings of each call's input state and output.
    utility: [n, 1] the utility each row carries (0 while it is unknown).
    cost_usd: n call costs in dollars (C is in milli-dollars, gp_jax.workflow.reward).
    failed: n booleans, the call failed.
    proj: the projection (`projection`), or None.
  """
  s = input_embs @ proj if proj is not None else input_embs
  o = output_embs @ proj if proj is not None else output_embs
  c = np.array([[reward_lib.cost_units(x)] for x in cost_usd], np.float32)
  f = np.array([[float(x)] for x in failed], np.float32)
  return np.concatenate([s, o, utility, c, f], axis=1).astype(np.float32)


def call_credit(failed, utility: float) -> np.ndarray:
  """Per-call credit [n, 1] of an episode's utility U over its n calls (row layout 2).

  A failed call returned nothing, so it contributed nothing: credit 0. The k calls that answered
  share U equally: U / k each. So an episode's credits sum to U whenever a call answered (and an
  episode whose calls all failed has no answer, U = 0, and credits 0).
  """
  ok = ~np.asarray(failed, bool).reshape(-1)
  k = int(ok.sum())
  credit = np.where(ok, float(utility) / k, 0.0) if k else np.zeros(len(ok))
  return credit.reshape(-1, 1).astype(np.float32)


def pad_rows(rows: np.ndarray, hubs, spec: FeatureSpec) -> tuple[np.ndarray, np.ndarray,
                                                                np.ndarray]:
  """The last max_rows memory rows of a workflow, padded: rows [M, F], row_hub [M] (A for
  padding), row_valid [M].

  Args:
    rows: [n, F] the workflow's memory rows so far. hubs: the action (hub) of each of the n rows.
  """
  M, A = spec.max_rows, spec.num_actions
  n = min(len(rows), M)
  padded = np.zeros((M, spec.row_dim), np.float32)
  padded[:n] = rows[-n:] if n else 0
  hub = np.full(M, A, np.int32)
  hub[:n] = list(hubs)[-n:] if n else []
  valid = np.zeros(M, bool)
  valid[:n] = True
  return padded, hub, valid


class Featurizer:
  """Turns workflow states and calls into fixed-shape numpy features."""

  def __init__(self, spec: FeatureSpec, encoder: encoder_lib.TextEncoder, space: mdp.ActionSpace,
               descriptions: dict[str, str], cfg: mdp.MDPConfig, seed: int = 0):
    if encoder.dim != spec.text_dim:
      raise ValueError(f"encoder width {encoder.dim} != spec.text_dim {spec.text_dim}")
    self.spec, self.encoder, self.space, self.cfg = spec, encoder, space, cfg
    self.proj = projection(spec, seed)
    roles = encoder.encode([r.description for r in space.roles.roles])
    llms = encoder.encode([descriptions[m] for m in space.llms])
    self.hub_features = hub_table(roles, llms)   # [A, 2D]

  def _project(self, emb: np.ndarray) -> np.ndarray:
    return emb @ self.proj if self.proj is not None else emb

  def project(self, emb: np.ndarray) -> np.ndarray:
    """Text embeddings [..., D] -> the memory rows' projection [..., P]."""
    return self._project(emb)

  def history_summary(self, rows: np.ndarray, hubs: np.ndarray) -> tuple[list[str], np.ndarray]:
    """The history memory as text: one sentence per (role, LLM) hub, and its embedding.

    Args:
      rows: [N, F] history rows (utility and cost at columns 2P and 2P + 1). hubs: [N] action ids.
    Returns:
      (A sentences, [A, D] float32 embeddings), e.g. "Executor with qwen2.5-7b-instruct: 412 past
      calls, mean utility 0.61, mean cost 0.05 milli-dollars".
    """
    A, P = self.spec.num_actions, self.spec.mem_text_dim
    hubs = np.asarray(hubs, np.int64)
    rows = np.asarray(rows, np.float64).reshape(-1, self.spec.row_dim)
    n = np.bincount(hubs, minlength=A)[:A]
    u = np.bincount(hubs, weights=rows[:, 2 * P], minlength=A)[:A] / np.maximum(n, 1)
    c = np.bincount(hubs, weights=rows[:, 2 * P + 1], minlength=A)[:A] / np.maximum(n, 1)
    texts = []
    for a in range(A):
      role, llm = self.space.decode(a)
      head = f"{role.name.capitalize()} with {llm}"
      texts.append(f"{head}: no past calls" if n[a] == 0 else
                   f"{head}: {n[a]} past call{'s' if n[a] != 1 else ''}, mean utility {u[a]:.2f}, "
                   f"mean cost {c[a]:.3g} milli-dollars")
    return texts, self.encoder.encode(texts).astype(np.float32)

  def memory_rows(self, calls: list[mdp.Call], utility: float | None) -> np.ndarray:
    """[len(calls), F] rows; utility None for the running workflow (not known yet)."""
    if not calls:
      return np.zeros((0, self.spec.row_dim), np.float32)
    return memory_row_table(
        self.encoder.encode([c.input_text for c in calls]),
        self.encoder.encode([c.output_text or "(no output)" for c in calls]),
        np.full((len(calls), 1), 0.0 if utility is None else utility, np.float32),
        [x.cost_usd for x in calls], [x.error is not None for x in calls], self.proj)

  def episode_rows(self, calls: list[mdp.Call], utility: float, row_layout: int) -> np.ndarray:
    """The history rows [len(calls), F] of a finished episode whose utility is `utility`:
    layout 1 copies it onto every row, layout 2 gives each row its call's credit (call_credit).
    The one function for rows joining a history (training, online evaluation, serving)."""
    if row_layout not in ROW_LAYOUTS:
      raise ValueError(f"unknown row layout {row_layout!r}; known: {ROW_LAYOUTS}")
    if row_layout == 1 or not calls:
      return self.memory_rows(calls, utility)
    return memory_row_table(
        self.encoder.encode([c.input_text for c in calls]),
        self.encoder.encode([c.output_text or "(no output)" for c in calls]),
        call_credit([c.error is not None for c in calls], utility),
        [x.cost_usd for x in calls], [x.error is not None for x in calls], self.proj)

  def state_vector(self, state: mdp.WorkflowState, node_emb: np.ndarray) -> np.ndarray:
    node, cfg = state.node, self.cfg
    final = state.at_final_answer
    extra = np.array([
        float(node.status == mdp.PENDING and not final),
        float(node.status == mdp.PLANNING and not final),
        float(final),
        node.depth / max(1, cfg.max_depth),
        (cfg.p_max - state.planner_calls) / max(1, cfg.p_max),
        float(bool(node.thought)),
        float(node.verified),
        state.steps / cfg.step_cap,
    ], np.float32)
    return np.concatenate([node_emb, extra]).astype(np.float32)

  def observe(self, state: mdp.WorkflowState, task_emb: np.ndarray, query_emb: np.ndarray,
              rows: np.ndarray, mask: np.ndarray) -> dict:
    """One observation; `rows` are the workflow memory rows of the calls so far (cached by caller)."""
    node_emb = self.encoder.encode([state.node.text])[0]
    padded, hub, valid = pad_rows(rows, [c.action for c in state.calls], self.spec)
    return dict(task=task_emb, query=query_emb, state=self.state_vector(state, node_emb),
                rows=padded, row_hub=hub, row_valid=valid, mask=mask.astype(bool))


def top_k_cosine(unit_keys: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
  """Indices [Q, min(k, N)] of the rows of unit_keys [N, P] (L2-normalised) most cosine-similar
  to each of queries [Q, P], most similar first (equal scores: lower index first)."""
  queries = queries / np.maximum(np.linalg.norm(queries, axis=-1, keepdims=True), 1e-12)
  sims = queries @ unit_keys.T                                    # [Q, N]
  N = unit_keys.shape[0]
  kk = min(k, N)
  if kk == 0:
    return np.zeros((len(queries), 0), np.int64)
  if kk < N:
    cand = np.argpartition(-sims, kk - 1, axis=1)[:, :kk]
  else:
    cand = np.tile(np.arange(N), (len(queries), 1))
  out = np.empty((len(queries), kk), np.int64)
  for i in range(len(queries)):
    c = cand[i]
    out[i] = c[np.lexsort((c, -sims[i, c]))]
  return out


class RetrievalIndex:
  """k-nearest history rows by cosine of their input-state projection (columns 0..P-1) against
  the projected query embedding. Sync it before each lookup; the history must only grow between
  syncs (true within one rollout: rows are evicted between iterations only)."""

  def __init__(self, featurizer: Featurizer, k: int):
    self.featurizer, self.k = featurizer, k
    P = featurizer.spec.mem_text_dim
    self.unit = np.zeros((0, P), np.float32)
    self.rows = np.zeros((0, featurizer.spec.row_dim), np.float32)
    self.hubs = np.zeros((0,), np.int32)

  def sync(self, rows: np.ndarray, hubs: np.ndarray) -> None:
    n = len(self.rows)
    if len(rows) < n:   # not an extension: rebuild
      n, self.unit = 0, self.unit[:0]
    new = rows[n:, :self.featurizer.spec.mem_text_dim]
    unit = new / np.maximum(np.linalg.norm(new, axis=1, keepdims=True), 1e-12)
    self.unit = np.concatenate([self.unit, unit.astype(np.float32)])
    self.rows, self.hubs = rows, hubs

  def fields(self, query_embs: np.ndarray) -> list[dict]:
    """Per query embedding [D]: ret_rows [k, F], ret_hub [k], ret_valid [k] (best first)."""
    k, F, A = self.k, self.featurizer.spec.row_dim, self.featurizer.spec.num_actions
    idx = top_k_cosine(self.unit, self.featurizer.project(np.asarray(query_embs, np.float32)), k)
    out = []
    for ix in idx:
      n = len(ix)
      rows = np.zeros((k, F), np.float32)
      rows[:n] = self.rows[ix]
      hub = np.full(k, A, np.int32)
      hub[:n] = self.hubs[ix]
      valid = np.zeros(k, bool)
      valid[:n] = True
      out.append(dict(ret_rows=rows, ret_hub=hub, ret_valid=valid))
    return out


def stack(observations: list[dict], pad_to: int | None = None) -> dict:
  """Stacks observations into a batch, repeating the last one up to `pad_to` (fixed shapes)."""
  obs = list(observations)
  if pad_to is not None and len(obs) < pad_to:
    obs = obs + [obs[-1]] * (pad_to - len(obs))
  return {k: np.stack([o[k] for o in obs]) for k in obs[0]}
