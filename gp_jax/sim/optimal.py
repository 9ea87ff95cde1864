"""Exact optimal routing policy on the simulator, by dynamic programming over the workflow tree.

The simulator's success probabilities are affine in the children's (gp_jax/sim/simulator.py), its
token counts are deterministic and additive, and its texts reveal nothing about correctness, so the
best policy is a fixed plan per query and its expected return decomposes:
  V(node, depth, budget; lam, mu) = max over ways to resolve the node of
      lam * P(node correct) - alpha * E[cost of the calls on it] - mu * tokens(node's answer)
where lam is what one unit of the node's success probability is worth to its ancestors and mu the
price (reward units per token) of its answer text inside the parent's next prompt. Executing with LLM
m (optionally after a thinker) is a leaf option; planning with m_p enumerates verifier/summarizer
(and, at the root, final-executor) LLMs, each fixing the children's (lam, mu); the children share the
remaining planner budget in DFS order. Everything is vectorised over arrays of (lam, mu).

The optimum knows each node's latent hardness; a router sees it only through the text.

Pool events (gp_jax/sim/events.py) make the pool a function of the query's position: `_prepare`
sets, per query, the prices, the LLMs that can be called (not failed, already joined) and, when an
LLM of the space has failed, the option to call it anyway: a failed call costs nothing and answers
nothing, so executing a node with a failed LLM is worth exactly 0 (an abstention, which beats every
real answer whose expected cost exceeds what its success is worth), and in Phase 1 a failed
planner call lets the node be executed directly (the MDP's plan_failed rule). Every other use of a
failed LLM is dominated (same value as skipping the call, or worse), so the optimum ignores it.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from gp_jax.sim import simulator as sim
from gp_jax.types import Query
from gp_jax.workflow import mdp
from gp_jax.workflow import prompts
from gp_jax.workflow import reward as reward_lib


@dataclasses.dataclass
class PlanNode:
  """The optimal way to resolve one node."""
  kind: str                      # "exec" or "plan"
  llm: str = ""                  # executor (exec) / planner (plan)
  thinker: str | None = None     # exec only
  verifier: str | None = None    # plan only
  summarizer: str = ""           # plan only
  final: str = ""                # plan at the root only
  children: list["PlanNode"] = dataclasses.field(default_factory=list)


class OptimalSolver:
  """Exact optimum of E[U] - alpha E[C] for simulated queries under a given action space.

  The optional restrictions give the optimum of a smaller policy class (e.g. Router-R1's action
  mask: `planners=mergers=(router LLM,)`, `max_plan_depth=1`):
    planners: the LLMs allowed to plan (default: every LLM of the space);
    mergers: the LLMs allowed to summarise and to give the root's final answer (default: every);
    max_plan_depth: nodes at this depth or deeper are never planned (default: cfg.max_depth).
  """

  def __init__(self, world: sim.SimWorld, space: mdp.ActionSpace, cfg: mdp.MDPConfig, alpha: float,
               describe: Callable[[Query], tuple[str, str]], *, planners=None, mergers=None,
               max_plan_depth: int | None = None):
    self.world, self.space, self.cfg, self.alpha = world, space, cfg, alpha
    self.describe = describe
    self.llms = list(space.llms)
    for name, given in (("planners", planners), ("mergers", mergers)):
      unknown = sorted(set(given or ()) - set(self.llms))
      if unknown or (given is not None and not given):
        raise ValueError(f"{name} must be a non-empty subset of the space's LLMs, got {given!r}")
    self.planner_llms = list(planners) if planners is not None else self.llms
    self.merger_llms = list(mergers) if mergers is not None else self.llms
    self.max_plan_depth = cfg.max_depth if max_plan_depth is None else int(max_plan_depth)
    kinds = {r.kind for r in space.roles.roles}
    self.role = {r.kind: r for r in space.roles.roles}
    self.can_plan = "planner" in kinds
    self.can_think = "thinker" in kinds and not cfg.phase1
    self.can_verify = "verifier" in kinds and not cfg.phase1
    prof = [world.profiles[m] for m in self.llms]
    self.price_in = np.array([p.price_in for p in prof]) / 1e6 / reward_lib.COST_UNIT_USD
    self.price_out = np.array([p.price_out for p in prof]) / 1e6 / reward_lib.COST_UNIT_USD
    self._base_prices = (self.price_in, self.price_out)
    # The pool at the current query (pool events; set by _prepare): callable LLMs per use, and a
    # failed LLM of the space whose call is a free abstention (None: no LLM has failed).
    self._usable = set(self.llms)
    self._planners, self._mergers = self.planner_llms, self.merger_llms
    self._failed = None
    self.rho = np.array([p.summary_quality for p in prof])
    self.phi = np.array([p.final_quality for p in prof])
    self.tau = np.array([p.think_quality for p in prof])
    self.rv = np.array([p.verify_quality for p in prof])
    self.width = cfg.phase1_width if cfg.phase1 else cfg.max_width
    self._base_cache: dict[str, int] = {}
    self._exec_cache: dict[tuple, tuple] = {}
    self._combo_cache: dict[tuple, tuple] = {}

  # ---- token accounting (what gp_jax/workflow/prompts.py renders; its docstring: the contract) --
  def _base(self, kind: str) -> int:
    if kind not in self._base_cache:
      self._base_cache[kind] = self._render_base(kind)
    return self._base_cache[kind]

  def _render_base(self, kind: str) -> int:
    role = self.role[kind]
    f = dict(query="", task_description="", answer_format="", context="", children="",
             **prompts.width_fields(self.cfg))
    return sim.count_tokens(role.system.format(**f)) + sim.count_tokens(role.user.format(**f))

  def _fields_tokens(self, kind: str, node_text: str) -> int:
    role = self.role[kind]
    n = sim.count_tokens(node_text)
    tmpl = role.system + role.user
    n += self._desc if "{task_description}" in tmpl else 0
    n += self._fmt if "{answer_format}" in tmpl else 0
    return self._base(kind) + n

  def _cost(self, in_tok, out_tok):
    """Reward-unit cost of one call per LLM: arrays [K]."""
    return self.price_in * in_tok + self.price_out * out_tok

  # ---- public API ------------------------------------------------------------------------------
  def value(self, query: Query) -> float:
    """Expected return of the optimal policy on `query`."""
    self._prepare(query)
    root = self.world.lookup(query.query)
    return float(self._solve(root, 0, self.cfg.p_max, np.ones(1), np.zeros(1), True)[0])

  def plan(self, query: Query) -> tuple[float, PlanNode]:
    self._prepare(query)
    root = self.world.lookup(query.query)
    return self._best(root, 0, self.cfg.p_max, 1.0, 0.0, True)

  def failed_llm(self, query: Query) -> str | None:
    """The failed LLM the optimum calls to abstain at `query` (None when no LLM has failed)."""
    self._prepare(query)
    return self._failed

  def _prepare(self, query: Query) -> None:
    desc, fmt = self.describe(query)
    self._desc, self._fmt = sim.count_tokens(desc), sim.count_tokens(fmt)
    root = self.world.lookup(query.query)
    if root is None:
      raise ValueError(f"query {query.qid} is not a simulated query")
    events = self.world.events
    if events is not None:   # the pool as it is at this query (every node of it shares the root's)
      scale = np.array([events.price_scale(m, root.key) for m in self.llms])
      self.price_in, self.price_out = self._base_prices[0] * scale, self._base_prices[1] * scale
      failed = [m for m in self.llms if events.failed(m, root.key)]
      self._usable = {m for m in self.llms if m not in failed and not events.absent(m, root.key)}
      self._planners = [m for m in self.planner_llms if m in self._usable]
      self._mergers = [m for m in self.merger_llms if m in self._usable]
      self._failed = failed[0] if failed else None

  # ---- options ---------------------------------------------------------------------------------
  def _exec_options(self, node, root):
    """(p, cost, out_tokens, labels) over exec options [(thinker, executor) pairs], cached."""
    key = (node.key, self._desc, self._fmt)
    if key not in self._exec_cache:
      self._exec_cache[key] = self._exec_options_uncached(node)
    return self._exec_cache[key]

  def _exec_options_uncached(self, node):
    K = len(self.llms)
    p = np.array([self.world.exec_probability(node, m) for m in self.llms])
    out = np.array([self.world.output_tokens("executor", node, m) for m in self.llms], float)
    in_e = self._fields_tokens("executor", node.text)
    cost = self._cost(in_e, out)
    opts = [(p, cost, out, [(None, m) for m in self.llms])]
    if self.can_think:
      in_t = self._fields_tokens("thinker", node.text)
      for ti, t in enumerate(self.llms):
        out_t = self.world.output_tokens("thinker", node, t)
        cost_t = self._cost(in_t, out_t)[ti]
        p_t = np.array([self.world.exec_probability(node, m, self.tau[ti]) for m in self.llms])
        c = self._cost(in_e + sim.count_tokens(prompts.NOTES) + out_t, out) + cost_t
        opts.append((p_t, c, out, [(t, m) for m in self.llms]))
    p = np.concatenate([o[0] for o in opts]); cost = np.concatenate([o[1] for o in opts])
    out = np.concatenate([o[2] for o in opts]); labels = sum((o[3] for o in opts), [])
    assert len(p) == len(labels) and len(p) % K == 0
    if self.world.events is not None:
      keep = [i for i, (t, m) in enumerate(labels)
              if m in self._usable and (t is None or t in self._usable)]
      p, cost, out, labels = p[keep], cost[keep], out[keep], [labels[i] for i in keep]
      if self._failed is not None:   # the free abstention (module docstring)
        p, cost, out = (np.append(x, 0.0) for x in (p, cost, out))
        labels.append((None, self._failed))
    return p, cost, out, labels

  def _plan_combos(self, node, m_p, root):
    key = (node.key, m_p, root, self._desc, self._fmt)
    if key not in self._combo_cache:
      self._combo_cache[key] = self._plan_combos_uncached(node, m_p, root)
    return self._combo_cache[key]

  def _plan_combos_uncached(self, node, m_p, root):
    """Children and per-combo constants for planner m_p.

    Returns kids, plan_cost, and arrays over combos c = (verifier or none, summarizer[, final]):
    a[c] (children weight factor before lam), const[c] (lam-proportional constant), fixed[c]
    (reward-unit cost of verifier/summarizer/final calls excluding children answer tokens),
    mu_c[c] (price per child answer token), out_s[c] (summary tokens, charged by the parent),
    labels[c].
    """
    exact = self.cfg.phase1
    kids = self.world.children(node, m_p, self.width, exact)
    w = len(kids)
    pi = self.llms.index(m_p)
    plan_out = sim.count_tokens("\n".join(k.text for k in kids))
    plan_cost = self._cost(self._fields_tokens("planner", node.text), plan_out)[pi]
    child_q = sum(sim.count_tokens(prompts.SUBQUESTION) + sim.count_tokens(k.text)
                  + sim.count_tokens(prompts.ANSWER) for k in kids)
    ver_out = sum(sim.count_tokens(sim.answer_line(k.gold)) for k in kids)
    a, const, fixed, mu_c, out_s, labels = [], [], [], [], [], []
    verifiers = [None] + ([m for m in self.llms if m in self._usable] if self.can_verify else [])
    finals = self._mergers if root else [None]
    for v in verifiers:
      vi = None if v is None else self.llms.index(v)
      r = 0.0 if v is None else self.rv[vi]
      if v is None:
        ver_cost, mu_child, ans_tok = 0.0, None, 0
      else:
        in_v = self._fields_tokens("verifier", node.text) + child_q
        ver_cost = self._cost(in_v, ver_out)[vi]
        mu_child = self.price_in[vi]
        ans_tok = ver_out   # the summary then reads the verifier's answer lines
      for s in self._mergers:
        si = self.llms.index(s)
        o_s = self.world.output_tokens("summarizer", node, s)
        in_s = self._fields_tokens("summarizer", node.text) + child_q + ans_tok
        sum_cost = self._cost(in_s, o_s)[si]
        for f in finals:
          if f is None:
            fin_cost, phi = 0.0, 1.0
          else:
            fi = self.llms.index(f)
            in_f = (self._fields_tokens("executor", node.text) + sim.count_tokens(prompts.DRAFT)
                    + o_s)
            o_f = self.world.output_tokens("executor", node, f, final=True)
            fin_cost, phi = self._cost(in_f, o_f)[fi], self.phi[fi]
          a.append(self.rho[si] * (1 - r) / w * phi)
          const.append(self.rho[si] * r * phi)
          fixed.append(ver_cost + sum_cost + fin_cost)
          mu_c.append(self.price_in[si] if mu_child is None else mu_child)
          out_s.append(0.0 if root else o_s)
          labels.append((v, s, f))
    arr = lambda x: np.asarray(x, float)
    return kids, plan_cost, arr(a), arr(const), arr(fixed), arr(mu_c), arr(out_s), labels

  def _may_plan(self, depth, budget):
    if self.cfg.phase1:
      return depth < self.cfg.phase1_depth
    return (self.can_plan and budget > 0 and depth < self.cfg.max_depth
            and depth < self.max_plan_depth)

  def _may_exec(self, depth):
    return not (self.cfg.phase1 and depth < self.cfg.phase1_depth) or self._phase1_escape()

  def _phase1_escape(self) -> bool:
    """Phase 1 with a failed LLM that may plan: its failed planner call (free) leaves the node to
    be executed directly."""
    return self.cfg.phase1 and self._failed is not None and self._failed in self.planner_llms

  # ---- vectorised values -------------------------------------------------------------------------
  def _solve(self, node, depth, budget, lam, mu, root=False, dedup=True):
    if dedup and len(lam) > 64:  # many (lam, mu) pairs repeat: solve each distinct pair once
      pairs = np.stack([lam, mu], 1)
      uniq, inv = np.unique(pairs, axis=0, return_inverse=True)
      return self._solve(node, depth, budget, uniq[:, 0], uniq[:, 1], root, False)[inv.ravel()]
    lam_u, mu_u = lam, mu
    best = np.full(len(lam), -np.inf)
    al = self.alpha
    if self._may_exec(depth):
      p, cost, out, _ = self._exec_options(node, root)
      vals = lam_u[:, None] * p[None] - al * cost[None] - mu_u[:, None] * out[None]
      best = np.maximum(best, vals.max(1))
    if self._may_plan(depth, budget):
      for m_p in self._planners:
        kids, plan_cost, a, const, fixed, mu_c, out_s, _ = self._plan_combos(node, m_p, root)
        if not len(a):   # no LLM left to summarise (pool events)
          continue
        lam_c = (lam_u[:, None] * a[None]).ravel()
        mu_cc = np.broadcast_to(al * mu_c[None], (len(lam), len(a))).ravel()
        kid_vals = self._children(kids, depth + 1, budget - 1, lam_c, mu_cc).reshape(len(lam), len(a))
        vals = (kid_vals + lam_u[:, None] * const[None] - al * fixed[None]
                - mu_u[:, None] * out_s[None] - al * plan_cost)
        best = np.maximum(best, vals.max(1))
    return best

  def _children(self, kids, depth, budget, lam, mu):
    """Sum of children values with the planner budget shared in DFS order."""
    if self.cfg.phase1 or budget <= 0:
      return sum(self._solve(k, depth, 0, lam, mu) for k in kids)
    vals = [[self._solve(k, depth, b, lam, mu) for b in range(budget + 1)] for k in kids]
    # f[b] = best value of the remaining children with b planner calls left.
    f = [np.zeros_like(lam) for _ in range(budget + 1)]
    for i in reversed(range(len(kids))):
      f = [np.max([vals[i][b] + f[rem - b] for b in range(rem + 1)], axis=0) for rem in range(budget + 1)]
    return f[budget]

  # ---- argmax extraction (scalar lam, mu) --------------------------------------------------------
  def _best(self, node, depth, budget, lam, mu, root=False) -> tuple[float, PlanNode]:
    al = self.alpha
    best_v, best_plan = -np.inf, None
    if self._may_exec(depth):
      p, cost, out, labels = self._exec_options(node, root)
      vals = lam * p - al * cost - mu * out
      i = int(np.argmax(vals))
      best_v, best_plan = float(vals[i]), PlanNode("exec", llm=labels[i][1], thinker=labels[i][0])
    if self._may_plan(depth, budget):
      for m_p in self._planners:
        kids, plan_cost, a, const, fixed, mu_c, out_s, labels = self._plan_combos(node, m_p, root)
        if not len(a):
          continue
        kid_vals = self._children(kids, depth + 1, budget - 1, lam * a, al * mu_c)
        vals = kid_vals + lam * const - al * fixed - mu * out_s - al * plan_cost
        c = int(np.argmax(vals))
        if vals[c] > best_v + 1e-12:
          v, s, f = labels[c]
          children = self._best_children(kids, depth + 1, budget - 1, lam * a[c], al * mu_c[c])
          best_v = float(vals[c])
          best_plan = PlanNode("plan", llm=m_p, verifier=v, summarizer=s, final=f or "",
                               children=children)
    return best_v, best_plan

  def _best_children(self, kids, depth, budget, lam, mu) -> list[PlanNode]:
    if self.cfg.phase1 or budget <= 0:
      return [self._best(k, depth, 0, lam, mu)[1] for k in kids]
    one = lambda k, b: float(self._solve(k, depth, b, np.array([lam]), np.array([mu]))[0])
    plans, left = [], budget
    for i, k in enumerate(kids):
      rest = kids[i + 1:]
      def total(b):
        r = self._children(rest, depth, left - b, np.array([lam]), np.array([mu]))[0] if rest else 0.0
        return one(k, b) + r
      b = max(range(left + 1), key=lambda b: (round(total(b), 12), -b))
      plans.append(self._best(k, depth, b, lam, mu)[1])
      left -= b
    return plans


class OraclePolicy:
  """Follows the optimal plan of each query through the MDP (for tests and as the ceiling)."""

  def __init__(self, solver: OptimalSolver):
    self.solver = solver
    self._plans: dict[str, PlanNode] = {}

  def act(self, query: Query, state: mdp.WorkflowState) -> int:
    if query.qid not in self._plans:
      self._plans[query.qid] = self.solver.plan(query)[1]
    plan = self._plans[query.qid]
    # Walk from the root to the current node along child indices.
    path, n = [], state.node
    while n.parent is not None:
      path.append(state.nodes[n.parent].children.index(n.id))
      n = state.nodes[n.parent]
    for i in reversed(path):
      plan = plan.children[i]
    node, space = state.node, self.solver.space
    kinds = {r.kind: r.name for r in space.roles.roles}
    if node.status == mdp.PENDING:
      if plan.kind == "plan":
        return space.encode(kinds["planner"], plan.llm)
      cfg = self.solver.cfg
      if cfg.phase1 and node.depth < cfg.phase1_depth and not node.plan_failed:
        # Executing a node Phase 1 would plan: first the failed LLM's (free) planner call.
        return space.encode(kinds["planner"], self.solver.failed_llm(query))
      if plan.thinker and not node.thought:
        return space.encode(kinds["thinker"], plan.thinker)
      return space.encode(kinds["executor"], plan.llm)
    if state.at_final_answer:
      return space.encode(kinds["executor"], plan.final)
    if plan.verifier and not node.verified:
      return space.encode(kinds["verifier"], plan.verifier)
    return space.encode(kinds["summarizer"], plan.summarizer)
