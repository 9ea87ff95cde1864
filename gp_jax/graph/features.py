"""Host-side features of GARNet's tables: role hubs, memory rows, observations.

Shapes (D = text embedding width, P = memory projection width, A = number of actions):
  hub features      [A, 2D]    [role description emb ; LLM description emb] per (role, LLM) action
  memory row        [F]        [proj(input-state emb) (P) ; proj(output emb) (P) ; U ; C ; failed]
  observation       task [D], query [D], state [D + S], rows [M, F], row_hub [M], row_valid [M],
                    mask [A]
Memory rows project the two text embeddings to P dims with a fixed random matrix (P = 0 keeps D):
the history table can hold 1e5 rows, and GARNet's first layer costs rows x F x hidden per gradient
step, so F sets the update time (see benchmarks/bench_garnet.py for both settings).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from gp_jax.text import encoder as encoder_lib
from gp_jax.workflow import mdp
from gp_jax.workflow import reward as reward_lib

STATE_EXTRA = 8   # structural state features appended to the node-text embedding


@dataclasses.dataclass(frozen=True)
class FeatureSpec:
  text_dim: int
  mem_proj: int          # 0: no projection
  max_rows: int          # workflow memory rows per observation (= MDP step cap)
  num_actions: int

  @property
  def mem_text_dim(self) -> int:
    return self.mem_proj or self.text_dim

  @property
  def row_dim(self) -> int:
    return 2 * self.mem_text_dim + 3

  @property
  def state_dim(self) -> int:
    return self.text_dim + STATE_EXTRA


class Featurizer:
  """Turns workflow states and calls into fixed-shape numpy features."""

  def __init__(self, spec: FeatureSpec, encoder: encoder_lib.TextEncoder, space: mdp.ActionSpace,
               descriptions: dict[str, str], cfg: mdp.MDPConfig, seed: int = 0):
    if encoder.dim != spec.text_dim:
      raise ValueError(f"encoder width {encoder.dim} != spec.text_dim {spec.text_dim}")
    self.spec, self.encoder, self.space, self.cfg = spec, encoder, space, cfg
    rng = np.random.default_rng(seed)
    self.proj = (rng.normal(size=(spec.text_dim, spec.mem_proj)) / np.sqrt(spec.mem_proj)
                 ).astype(np.float32) if spec.mem_proj else None
    roles = encoder.encode([r.description for r in space.roles.roles])
    llms = encoder.encode([descriptions[m] for m in space.llms])
    K = space.num_llms
    self.hub_features = np.concatenate(
        [np.repeat(roles, K, axis=0), np.tile(llms, (len(space.roles), 1))], axis=1)  # [A, 2D]

  def _project(self, emb: np.ndarray) -> np.ndarray:
    return emb @ self.proj if self.proj is not None else emb

  def memory_rows(self, calls: list[mdp.Call], utility: float | None) -> np.ndarray:
    """[len(calls), F] rows; utility None for the running workflow (not known yet)."""
    if not calls:
      return np.zeros((0, self.spec.row_dim), np.float32)
    s = self._project(self.encoder.encode([c.input_text for c in calls]))
    o = self._project(self.encoder.encode([c.output_text or "(no output)" for c in calls]))
    u = np.full((len(calls), 1), 0.0 if utility is None else utility, np.float32)
    c = np.array([[reward_lib.cost_units(x.cost_usd)] for x in calls], np.float32)
    f = np.array([[float(x.error is not None)] for x in calls], np.float32)
    return np.concatenate([s, o, u, c, f], axis=1).astype(np.float32)

  def state_vector(self, state: mdp.WorkflowState, node_emb: np.ndarray) -> np.ndarray:
    node, cfg = state.node, self.cfg
    final = node.id == 0 and state.root_summarized
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
    M, A = self.spec.max_rows, self.spec.num_actions
    node_emb = self.encoder.encode([state.node.text])[0]
    n = min(len(rows), M)
    padded = np.zeros((M, self.spec.row_dim), np.float32)
    padded[:n] = rows[-n:] if n else 0
    hub = np.full(M, A, np.int32)
    hub[:n] = [c.action for c in state.calls[-n:]] if n else []
    valid = np.zeros(M, bool)
    valid[:n] = True
    return dict(task=task_emb, query=query_emb, state=self.state_vector(state, node_emb),
                rows=padded, row_hub=hub, row_valid=valid, mask=mask.astype(bool))


def stack(observations: list[dict], pad_to: int | None = None) -> dict:
  """Stacks observations into a batch, repeating the last one up to `pad_to` (fixed shapes)."""
  obs = list(observations)
  if pad_to is not None and len(obs) < pad_to:
    obs = obs + [obs[-1]] * (pad_to - len(obs))
  return {k: np.stack([o[k] for o in obs]) for k in obs[0]}
