r"""The routed Graph Counselor's observations: GraphPlanner's tables over (agent kind, LLM) hubs.

Action space: hubs = (counselor agent kind, LLM) pairs, kinds = plan, thought, action, judge,
reflect (GraphPlanner roles planner, thinker, executor, verifier, verifier), A = 5 K for K LLMs,
index = kind x K + llm. Before each call the agents loop hands the router an AgentStep; only the
K hubs of that step's kind are valid (`mask`), so the router's action is the LLM.

The layout is gp_jax.graph.features' (FeatureSpec, hub table, memory rows, padding), built from
agent steps instead of workflow states (D = text width, P = memory projection width):
  hub features   [A, 2D]  [kind description emb ; LLM description emb] (catalog descriptions)
  memory row     [F]      [proj(emb 'kind trial step') (P) ; proj(emb output) (P) ; U=0 ; C ; failed]
                          (C = the call's cost in milli-dollars; a question's own calls only, so
                          U is not known yet)
  task [D]  emb of the step's system prompt (agent job + graph schema)
  query [D] emb of the question
  state [D + 12]  emb of the end of the step's prompt ; one-hot kind (5), trial, step, calls so
                  far, last call failed, prompt characters / (4 budget), reflections read, judged
                  before (GraphPlanner's state has 8 structural features; FeatureSpec.state_extra)
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from gp_jax import errors
from gp_jax.counselor.agents import records
from gp_jax.graph import features as features_lib
from gp_jax.llm import catalog as catalog_lib
from gp_jax.text import encoder as encoder_lib

KINDS = ("plan", "thought", "action", "judge", "reflect")
KIND_DESCRIPTIONS = {
    "plan": "Planning agent, the planner role: decides which information is still missing from "
            "the knowledge graph and which graph functions to call next.",
    "thought": "Thought agent, the thinker role: reasons over the latest plan and observations "
               "and decides exactly what the next action must do.",
    "action": "Execution agent, the executor role: writes the exact graph function calls, or "
              "Finish with the final answer.",
    "judge": "Evaluation agent, a verifier role: judges whether the proposed answer is correct "
             "and supported by the observations.",
    "reflect": "Reflection agent, a verifier role: analyses a failed attempt and writes an "
               "improved strategy for the next trial.",
}
STATE_EXTRA = 12      # structural features of a counselor step's state (module docstring)
TEXT_CACHE = 50_000   # embeddings of repeated texts (system prompts, questions) kept at most


class CounselorFeaturizer:
  """AgentSteps -> fixed-shape numpy observations in gp_jax.graph.features' layout.

  Args:
    encoder: the text encoder (width D).
    catalog: where the LLM descriptions come from.
    llms: the K LLMs the router picks from (catalog names, in action order).
    mem_proj: P (0: no projection); max_rows: M, the last M calls of a question are its rows.
    max_steps, max_reflect, prompt_token_budget: the counselor run's settings (state scales).
    seed: the projection matrix's seed.
  """

  def __init__(self, encoder: encoder_lib.TextEncoder, catalog: catalog_lib.Catalog,
               llms: Sequence[str], *, mem_proj: int, max_rows: int, max_steps: int,
               max_reflect: int, prompt_token_budget: int, seed: int = 0):
    if not llms:
      raise errors.ConfigError("the router needs at least one LLM")
    catalog_lib.check_names(catalog, llms)
    if len(set(llms)) != len(llms):
      raise errors.ConfigError(f"duplicate LLMs in {list(llms)}")
    self.encoder, self.llms = encoder, list(llms)
    self.K = len(self.llms)
    self.spec = features_lib.FeatureSpec(text_dim=encoder.dim, mem_proj=mem_proj,
                                         max_rows=max_rows, num_actions=len(KINDS) * self.K,
                                         state_extra=STATE_EXTRA)
    self.max_steps, self.max_reflect, self.budget = max_steps, max_reflect, prompt_token_budget
    self.proj = features_lib.projection(self.spec, seed)
    self.hub_features = features_lib.hub_table(
        encoder.encode([KIND_DESCRIPTIONS[k] for k in KINDS]),
        encoder.encode([catalog[m].description for m in self.llms])).astype(np.float32)
    A = self.spec.num_actions
    self.masks = {k: np.arange(A) // self.K == i for i, k in enumerate(KINDS)}
    self._text_cache: dict[str, np.ndarray] = {}

  @property
  def num_actions(self) -> int:
    return self.spec.num_actions

  def action(self, kind: str, model: str) -> int:
    """The hub (action index) of `model` as agent `kind`."""
    return KINDS.index(kind) * self.K + self.llms.index(model)

  def model(self, action: int) -> str:
    """The LLM of an action."""
    return self.llms[action % self.K]

  def _emb(self, text: str) -> np.ndarray:
    e = self._text_cache.get(text)
    if e is None:
      if len(self._text_cache) > TEXT_CACHE:
        self._text_cache.clear()
      e = self._text_cache[text] = self.encoder.encode([text])[0]
    return e

  def rows(self, calls: Sequence[records.CallRecord]) -> tuple[np.ndarray, np.ndarray]:
    """[n, F] memory rows and [n] hub indices of calls (A for calls by LLMs outside the router)."""
    if not calls:
      return np.zeros((0, self.spec.row_dim), np.float32), np.zeros(0, np.int32)
    rows = features_lib.memory_row_table(
        self.encoder.encode([f"{c.kind} agent trial {c.trial} step {c.step}" for c in calls]),
        self.encoder.encode([c.output or "(no output)" for c in calls]),
        np.zeros((len(calls), 1), np.float32), [c.cost_usd for c in calls],
        [c.error is not None for c in calls], self.proj)
    hubs = np.array([self.action(c.kind, c.model) if c.model in self.llms and c.kind in KINDS
                     else self.num_actions for c in calls], np.int32)
    return rows, hubs

  def state_vector(self, step: records.AgentStep) -> np.ndarray:
    """[D + 12]: the end of the step's prompt, embedded, and the step's structure."""
    prompt = step.prompt
    tail = prompt[-400:].rsplit("\n", 1)[0] if "\n" in prompt[-400:] else prompt[-400:]
    calls = step.calls_so_far
    onehot = np.zeros(len(KINDS), np.float32)
    onehot[KINDS.index(step.kind)] = 1.0
    M = self.spec.max_rows
    extra = np.concatenate([onehot, np.array([
        step.trial / max(1, self.max_reflect),
        step.step / max(1, self.max_steps),
        min(len(calls), M) / M,
        float(bool(calls) and calls[-1].error is not None),
        min(2.0, sum(len(m["content"]) for m in step.messages) / (4.0 * max(1, self.budget))),
        prompt.count("\nReflection ") / max(1, self.max_reflect),
        float(any(c.kind == "judge" for c in calls)),
    ], np.float32)])
    return np.concatenate([self.encoder.encode([tail])[0], extra]).astype(np.float32)

  def observe(self, step: records.AgentStep, rows: np.ndarray, hubs: np.ndarray) -> dict:
    """One observation; rows / hubs are those of step.calls_so_far (kept by the caller)."""
    if step.kind not in KINDS:
      raise errors.ConfigError(f"the counselor router routes {KINDS}, not {step.kind!r} steps")
    system = step.messages[0]["content"] if step.messages else ""
    padded, hub, valid = features_lib.pad_rows(rows, hubs, self.spec)
    return dict(task=self._emb(system), query=self._emb(step.question),
                state=self.state_vector(step), rows=padded, row_hub=hub, row_valid=valid,
                mask=self.masks[step.kind])

  def blank(self, kind: str) -> dict:
    """An observation of a `kind` step with no text and no calls (shapes, compilation)."""
    D, spec = self.spec.text_dim, self.spec
    state = np.zeros(spec.state_dim, np.float32)
    state[D + KINDS.index(kind)] = 1.0
    padded, hub, valid = features_lib.pad_rows(np.zeros((0, spec.row_dim), np.float32), [], spec)
    return dict(task=np.zeros(D, np.float32), query=np.zeros(D, np.float32), state=state,
                rows=padded, row_hub=hub, row_valid=valid, mask=self.masks[kind])
