"""Multi-round baseline routers: several LLM calls per query, each call routed separately.

One module per router -- knn.py, prompted.py (llm), router_r1.py, r2_reasoner.py -- over their shared base
(base.py: the router interface, the lock-step runner, the workflow's action helpers); here the
registry and the evaluation rows.

Every router here is a policy of the same WorkflowEnv as GraphPlanner, so the cost of each call and
the final utility are accounted exactly as for GraphPlanner; each is fitted on the training queries
only and is deterministic given its seed.

  knn        LLMRouter-style KNN-multiround, a decompose-route-merge pipeline: a Planner P splits
             the query; each sub-question's Executor is routed by k-nearest neighbours over labelled
             training sub-questions; a Summarizer and the final root Executor (one merge LLM G)
             merge the answers. The workflow is Planner(P) -> Executor(e_i) per sub-question ->
             Summarizer(G) -> final Executor(G); e_i = argmax_m u_knn(i, m) - alpha * c_knn(i, m).
  llm        LLMRouter-style LLM-multiround: the same pipeline with the router LLM as planner and
             merger and a prompted, untrained router choosing each sub-question's Executor.
  router_r1  Router-R1-style sequential router: a small MLP policy trained with PPO that decides,
             turn by turn, whether the router LLM answers the query (or one pool LLM answers it in
             a single turn), or splits it into turns, then which LLM executes each turn; the router
             LLM summarises and answers.
  r2_reasoner R2-Reasoner-style decompose-then-allocate router: a decomposer (the Planner call of
             a pool LLM chosen on the training queries) splits the query; a difficulty-aware
             allocator (an estimated difficulty per sub-question, a capability per LLM) gives
             each sub-question an LLM; trained by SFT on the pipeline labels, then GRPO per
             alpha, alternating with the choice of the decomposer; a merge LLM summarises and
             answers (r2_reasoner.py documents what is faithful to the paper and what adapted).

Labels of the KNN pipeline (`collect_pipeline_labels`, alpha-independent): for every planner P of
the pool and every training query, P plans the query once; then, for every LLM m, m executes every
sub-question P wrote, summarises and gives the final answer (M^2 pipelines per query, the planner
call shared). A sub-question's label for m is, on the simulator, the analytic success probability
world.exec_probability of m on it (no sampling noise, as in labels.py); on real backends
sub-questions have no gold answer, so it is the realised utility of the whole pipeline in which m
executed every sub-question. Its cost label is the cost units of m's Executor call on it. At a
given alpha, (P, G) = argmax over (planner, m) of the mean training reward of the pipeline "P plans,
m does everything else", and the sub-question KNN uses the labels of P's sub-questions.

The routers' own decisions cost nothing in the reward, as for GraphPlanner's policy network; the
prompted router's routing calls on real backends are real LLM calls, counted apart
(LLMMultiRound.routing_calls / routing_cost_units) and not charged in the workflow reward.
"""
from __future__ import annotations

from typing import Callable

from gp_jax import errors
from gp_jax.baselines.multi_round import base
from gp_jax.baselines.multi_round import knn
from gp_jax.baselines.multi_round import prompted
from gp_jax.baselines.multi_round import r2_reasoner
from gp_jax.baselines.multi_round import router_r1
from gp_jax.sim.scoring import Row, summarize
from gp_jax.types import Query

ROW_PREFIX = "multi:"

MULTI_ROUTERS: dict[str, Callable[..., base.MultiRoundRouter]] = {
    "knn": lambda *, knn_k=10, **kw: knn.KNNMultiRound(k=knn_k),
    "llm": lambda *, router_llm="", **kw: prompted.LLMMultiRound(router_llm=router_llm),
    "router_r1": lambda *, router_llm="", r1_hidden=64, r1_episodes=512, r1_batch=32,
                        r1_reward="auto", r1_ppo=router_r1.DEFAULT_PPO, **kw: router_r1.RouterR1(
        router_llm=router_llm, hidden=r1_hidden, episodes=r1_episodes, batch=r1_batch,
        reward=r1_reward, settings=r1_ppo),
    "r2_reasoner": lambda *, r2=r2_reasoner.R2Settings(), **kw: r2_reasoner.R2Reasoner(r2),
}


def make_multi_router(name: str, **kwargs) -> base.MultiRoundRouter:
  """A multi-round router by registry name. kwargs: knn_k, router_llm, r1_hidden, r1_episodes,
  r1_batch, r1_reward, r1_ppo (gp_jax.rl.ppo.PPOSettings), r2 (r2_reasoner.R2Settings)."""
  if name not in MULTI_ROUTERS:
    raise errors.unknown_name("multi-round router", name, MULTI_ROUTERS)
  return MULTI_ROUTERS[name](**kwargs)


def fit_multi_routers(names: list[str], system, queries: list[Query], *, seed: int,
                      **kwargs) -> dict[str, base.MultiRoundRouter]:
  """Builds (all names checked first) and fits each named router on the training queries."""
  routers = {n: make_multi_router(n, **kwargs) for n in names}
  return {n: r.fit(system, queries, seed=seed) for n, r in routers.items()}


def evaluate_multi(system, alpha: float, routers: dict[str, base.MultiRoundRouter],
                   queries: list[Query], *, seed: int = 0) -> tuple[list[Row], dict]:
  """Rows 'multi:<name>' of each router on `queries`, and
  {row name: {"<role kind>:<llm>": number of calls}}. With a Router-R1-style router on the
  simulator (outside Phase 1), also the optimum within its mask (router_r1.router_r1_optimum)."""
  env = system.env(alpha)
  rows, picks = [], {}
  for name, router in routers.items():
    states = router.run(system, alpha, queries, seed=seed)
    rows += summarize(ROW_PREFIX + name, system, env, queries, states)
    if isinstance(router, router_r1.RouterR1) and system.simulated and not system.mdp_cfg.phase1:
      rows += router_r1.router_r1_optimum(system, env, router.router_llm, queries, seed=seed)
    counts: dict[str, int] = {}
    for s in states:
      for c in s.calls:
        counts[f"{c.kind}:{c.llm}"] = counts.get(f"{c.kind}:{c.llm}", 0) + 1
    picks[ROW_PREFIX + name] = counts
  return rows, picks
