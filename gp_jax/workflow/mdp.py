"""GraphPlanner's agentic routing MDP over a tree of query nodes (paper-notes section 1).

State: the tree of query nodes of one episode, the node under resolution, counters.
Action: index = role_idx * K + llm_idx over the selected roles x LLMs.
Transitions (by role kind, see gp_jax/workflow/roles.py):
  planner    on a pending node: its output lines become 1..max_width children; the node becomes
             'planning'; control moves to the first child.
  executor   on a pending node: the node is answered ('completed'); control moves to the next
             pending node in DFS order, or to the parent once all its children are completed.
             At the root after the summary it gives the final answer and ends the episode.
  summarizer on a planning node whose children are all completed: condenses their answers into the
             node's answer; at the root a final executor follows, elsewhere the node is completed.
  thinker    on a pending node (once): attaches analysis notes; the node stays current.
  verifier   on a planning node with completed children (once, before the summary): replaces the
             children's answers by checked ones; the node stays current.
Masks: pending -> executors (+ planners while planner_calls < p_max and depth < max_depth;
+ thinker if not yet used); planning with completed children -> summarizer (+ verifier if unused);
root after its summary -> executors only. A forced-planner training episode's first decision
allows only the planners of that mask (`planner_only`). Phase 1 fixes the structure: nodes above
phase1_depth must plan with width phase1_width, nodes at phase1_depth must execute; only the LLM
is chosen.
The episode ends after the final answer, or at step_cap with no answer (utility 0).

This module is plain Python (host side); it never calls an LLM.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from gp_jax import errors
from gp_jax.workflow import roles as roles_lib

PENDING, PLANNING, COMPLETED = "pending", "planning", "completed"


@dataclasses.dataclass(frozen=True)
class MDPConfig:
  p_max: int = 2            # planner calls per episode
  max_width: int = 3        # sub-queries kept per planner call
  max_depth: int = 3        # nodes at this depth cannot be planned
  step_cap: int = 16        # LLM calls per episode
  phase1_depth: int = 0     # >0: Phase-1 fixed workflow of this depth ...
  phase1_width: int = 0     # ... and this width (router picks only LLMs)

  def validate(self) -> None:
    if self.p_max < 0 or self.max_width < 1 or self.max_depth < 0 or self.step_cap < 1:
      raise errors.ConfigError(f"invalid MDP settings {self}: need p_max>=0, max_width>=1, "
                               "max_depth>=0, step_cap>=1")
    if (self.phase1_depth > 0) != (self.phase1_width > 0):
      raise errors.ConfigError("phase1_depth and phase1_width must be set together")
    if self.phase1_depth < 0 or self.phase1_width < 0:
      raise errors.ConfigError("phase1_depth and phase1_width must be >= 0")

  @property
  def phase1(self) -> bool:
    return self.phase1_depth > 0

  def max_calls(self, thinker: bool = False, verifier: bool = False) -> int:
    """Upper bound on the LLM calls of a complete episode."""
    if self.phase1:
      w, d = self.phase1_width, self.phase1_depth
      planned = sum(w ** i for i in range(d))
      leaves = w ** d
      return 2 * planned + leaves + 1
    # Each planner call adds <= max_width children; each planned node also needs a summary.
    planned = self.p_max
    nodes = 1 + planned * self.max_width
    return (nodes - planned) + 2 * planned + 1 + thinker * nodes + verifier * planned


@dataclasses.dataclass(frozen=True)
class ActionSpace:
  """roles x LLMs; index = role_idx * num_llms + llm_idx."""
  roles: roles_lib.RoleSet
  llms: tuple[str, ...]

  @property
  def num_llms(self) -> int:
    return len(self.llms)

  @property
  def size(self) -> int:
    return len(self.roles) * len(self.llms)

  def decode(self, action: int) -> tuple[roles_lib.Role, str]:
    if not 0 <= action < self.size:
      raise IndexError(f"action {action} outside [0, {self.size})")
    return self.roles.roles[action // self.num_llms], self.llms[action % self.num_llms]

  def encode(self, role_name: str, llm: str) -> int:
    return self.roles.names.index(self.roles[role_name].name) * self.num_llms + list(self.llms).index(llm)

  def kind_mask(self, kinds: Sequence[str]) -> np.ndarray:
    m = np.zeros(self.size, bool)
    for i, r in enumerate(self.roles.roles):
      if r.kind in kinds:
        m[i * self.num_llms:(i + 1) * self.num_llms] = True
    return m


@dataclasses.dataclass
class Node:
  id: int
  text: str
  depth: int
  parent: int | None
  status: str = PENDING
  children: list[int] = dataclasses.field(default_factory=list)
  answer: str = ""
  thought: str = ""
  verified: bool = False
  plan_failed: bool = False   # a planner call on it returned no sub-queries


@dataclasses.dataclass
class Call:
  """One LLM call of an episode: a row of the workflow memory."""
  step: int
  action: int
  role: str
  kind: str
  llm: str
  node: int
  input_text: str      # the state the call acted on (the node's question)
  output_text: str
  input_tokens: int
  output_tokens: int
  cost_usd: float
  latency_s: float
  error: str | None


@dataclasses.dataclass
class WorkflowState:
  """Everything the MDP needs about one episode (host-side, mutable)."""
  nodes: list[Node]
  current: int = 0
  planner_calls: int = 0
  root_summarized: bool = False
  done: bool = False
  final_answer: str | None = None
  calls: list[Call] = dataclasses.field(default_factory=list)

  @property
  def steps(self) -> int:
    return len(self.calls)

  @property
  def node(self) -> Node:
    return self.nodes[self.current]

  @property
  def at_final_answer(self) -> bool:
    """The root's last step: summarised, waiting for its final Executor. (The root's status is
    still PLANNING then, so test this before the status.)"""
    return self.current == 0 and self.root_summarized


def new_state(query_text: str) -> WorkflowState:
  return WorkflowState(nodes=[Node(id=0, text=query_text, depth=0, parent=None)])


def action_mask(state: WorkflowState, space: ActionSpace, cfg: MDPConfig) -> np.ndarray:
  """Valid actions at the current node, bool [space.size]. All False once done."""
  if state.done:
    return np.zeros(space.size, bool)
  node = state.node
  if state.at_final_answer:
    return space.kind_mask(["executor"])
  if node.status == PENDING:
    if cfg.phase1:
      plan = node.depth < cfg.phase1_depth and not node.plan_failed
      return space.kind_mask(["planner" if plan else "executor"])
    kinds = ["executor"]
    if state.planner_calls < cfg.p_max and node.depth < cfg.max_depth:
      kinds.append("planner")
    if not node.thought:
      kinds.append("thinker")
    return space.kind_mask(kinds)
  if node.status == PLANNING:
    kinds = ["summarizer"]
    if not node.verified and not cfg.phase1:
      kinds.append("verifier")
    return space.kind_mask(kinds)
  raise AssertionError(f"current node {node.id} is {node.status}")


def planner_only(mask: np.ndarray, space: ActionSpace) -> np.ndarray:
  """`mask` restricted to its planner actions, bool [space.size]; `mask` itself when it allows no
  planner (nothing to force there). A forced-planner episode's first decision (training's
  force_planner_episodes) reads this mask, and so does its PPO update."""
  return kind_only(mask, space, "planner")


def kind_only(mask: np.ndarray, space: ActionSpace, kind: str) -> np.ndarray:
  """`mask` restricted to the actions of role kind `kind`, bool [space.size]; `mask` itself when
  it allows none of them (planner_only; the root-credit continuations of gp_jax/rl/root_credit.py
  restrict the root to the planners or to the executors)."""
  kept = mask & space.kind_mask([kind])
  return kept if kept.any() else mask


def split_plan(text: str, max_width: int) -> list[str]:
  """Planner output -> sub-queries: one per non-empty line, list markers stripped, <= max_width."""
  subs = []
  for line in text.splitlines():
    line = line.strip().lstrip("-*•").strip()
    # Tolerate "1." / "1)" numbering although the prompt asks for none.
    head, _, rest = line.partition(" ")
    if rest and head.rstrip(".)").isdigit():
      line = rest.strip()
    if line:
      subs.append(line)
  return subs[:max_width]


def _advance_from_completed(state: WorkflowState, node: Node) -> None:
  """After `node` is completed: next pending sibling (DFS), else the parent, else done."""
  if node.parent is None:
    state.done = True
    return
  parent = state.nodes[node.parent]
  for cid in parent.children:
    if state.nodes[cid].status == PENDING:
      state.current = cid
      return
  state.current = parent.id  # all children completed: the parent needs its summary


def apply(state: WorkflowState, call: Call, cfg: MDPConfig) -> None:
  """Applies the transition of `call` (already made) to the state, in place."""
  node = state.node
  state.calls.append(call)
  kind = call.kind
  if kind == "planner":
    state.planner_calls += 1
    width = cfg.phase1_width if cfg.phase1 else cfg.max_width
    subs = split_plan(call.output_text, width) if call.error is None else []
    if subs:
      node.status = PLANNING
      for s in subs:
        child = Node(id=len(state.nodes), text=s, depth=node.depth + 1, parent=node.id)
        state.nodes.append(child)
        node.children.append(child.id)
      state.current = node.children[0]
    else:
      node.plan_failed = True  # Phase 1 then answers the node directly instead of re-planning
  elif kind == "executor":
    if node.id == 0 and state.root_summarized:
      state.final_answer = call.output_text
      state.done = True
    else:
      node.answer = call.output_text
      node.status = COMPLETED
      if node.id == 0:
        state.final_answer = call.output_text
      _advance_from_completed(state, node)
  elif kind == "summarizer":
    node.answer = call.output_text
    if node.id == 0:
      state.root_summarized = True
    else:
      node.status = COMPLETED
      _advance_from_completed(state, node)
  elif kind == "thinker":
    node.thought = call.output_text
  elif kind == "verifier":
    node.verified = True
    checked = [l.strip() for l in call.output_text.splitlines() if l.strip()]
    if call.error is None and len(checked) == len(node.children):
      for cid, ans in zip(node.children, checked):
        state.nodes[cid].answer = ans
  else:
    raise AssertionError(kind)
  if not state.done and state.steps >= cfg.step_cap:
    state.done = True  # step cap: no final answer
  if state.done and not (state.root_summarized or state.nodes[0].status == COMPLETED):
    state.final_answer = None
