"""Evaluation of routers: per-domain accuracy, $ cost, reward, LLM calls per query and splits.

Compares the trained router (greedy), a uniformly random valid policy, every single-LLM
executor-only policy and, on the simulator, the exact optimum. On the simulator the reported
reward is the expected reward of each episode's actual decisions, E[U | calls] - alpha * cost,
which removes the simulator's sampling noise; accuracy is the realised one.

"On the simulator" is `System.simulated`, the test training uses too: real backends answering
simulated queries get sampled rewards (scored answers) and no optimum, since the simulator's
expectations say nothing about real answers. The report says which reward it shows, and the
pool's counters over the evaluation (requests, faults by kind, retries, failed calls).

Splits: every row has its policy's split rate, the share of the test queries on which it made at
least one Planner call. Where the optimum is computed, the router's rows also have its split
recall (of the queries the optimum splits, the share the router splits too) and precision (of
the queries the router splits, the share the optimum splits too); None ("—" in eval.md) where
the denominator is 0. The report's numbers also go to a TensorBoard event file beside it
(gp_jax/util/tb_events.py).
"""
from __future__ import annotations

import collections
import dataclasses
import json
import pathlib

import jax
import numpy as np

from gp_jax import errors
from gp_jax import files
from gp_jax import progress as progress_lib
from gp_jax.rl import rollout
from gp_jax.runs import system as system_lib
from gp_jax.sim import optimal
from gp_jax.sim.scoring import Row, episode_stats, optimum_rows, split, summarize  # noqa: F401
from gp_jax.types import Query
from gp_jax.util import aio
from gp_jax.util import tb_events
from gp_jax.workflow import env as env_lib
from gp_jax.workflow import mdp
from gp_jax.workflow import policies


ROUTER = "GraphPlanner"
ONLINE_LABEL = " (online memory)"


def run_router(system, env, model, params, history, queries, *, parallel: int, seed: int,
               online: bool = False, recent_rows: int = 0):
  """Greedy router episodes' final states. history: the memory the router reads (transductive,
  summary and retrieval modes; the model says which), None for inductive. online: the evaluated
  episodes join (a copy of) the history as they finish, within its capacity, weights frozen
  (rollout.run_episodes). recent_rows > 0 (online only): a recency window, the copy starts
  with the newest `recent_rows` rows and keeps at most that many (the oldest evicted as new ones
  join), so each hub's mean reads recent calls only."""
  if recent_rows < 0 or (recent_rows and not online):
    raise errors.ConfigError(f"eval.online_recent_rows={recent_rows} must be >= 0, and > 0 only "
                             "with eval.online_history=True")
  if online:
    if history is None:
      raise errors.ConfigError("eval.online_history needs a router that reads a history memory "
                               "(model.history other than 'inductive')")
    history = (recent_window(history, recent_rows) if recent_rows else
               dataclasses.replace(history, rows=history.rows.copy(), hubs=history.hubs.copy()))
  runner = rollout.PolicyRunner(model, system.featurizer.hub_features, parallel,
                                featurizer=system.featurizer)
  runner.set_params(params, history)
  eps = aio.run(rollout.run_episodes(
      env, system.featurizer, runner, queries, key=jax.random.PRNGKey(seed), greedy=True,
      history=history, grow_history=online, seed_salt=("eval", seed), online=online))
  return [e.state for e in eps]


def recent_window(history, rows: int):
  """A copy of `history` holding its newest `rows` rows, with capacity `rows`."""
  return dataclasses.replace(history, rows=history.rows[-rows:].copy(),
                             hubs=history.hubs[-rows:].copy(), capacity=int(rows))


class _CountingEnv:
  """`env` for running episodes, calling `tick()` as each one finishes (evaluation progress)."""

  def __init__(self, env: env_lib.WorkflowEnv, tick):
    self._env, self._tick = env, tick

  def __getattr__(self, name):
    return getattr(self._env, name)

  async def step(self, *args, **kwargs):
    result = await self._env.step(*args, **kwargs)
    if result.done:
      self._tick()
    return result


class _EvalProgress:
  """"[eval i/n <policy>] done/total queries, ETA" lines: policies differ widely in speed (the
  DP optimum takes most of the time), so the ETA is that of the policy in progress."""

  def __init__(self, num_policies: int, num_queries: int):
    self.bar = progress_lib.Progress("eval", num_queries, unit="queries", write_at_total=False)
    self.num_policies, self.num_queries = num_policies, num_queries
    self.index, self.count = 0, 0

  def env(self, env: env_lib.WorkflowEnv, name: str):
    self.index, self.count = self.index + 1, 0
    self.bar.restart(f"eval {self.index}/{self.num_policies} {name}", self.num_queries)
    return _CountingEnv(env, self._tick)

  def _tick(self) -> None:
    self.count += 1
    self.bar.update(self.count)


def evaluate(system: system_lib.System, alpha: float, *, router=None, baselines: bool = True,
             optimum: bool = True, parallel: int = 64, seed: int = 0,
             online_history: bool = False, online_recent_rows: int = 0,
             progress: bool = False) -> list[Row]:
  """Rows for every policy on the system's test queries. router = (model, params, history|None);
  online_history: its row is "GraphPlanner (online memory)" (run_router's online mode, with the
  recency window online_recent_rows when > 0).

  progress: report "[eval]" lines (gp_jax/progress.py) as the policies' episodes finish."""
  env = system.env(alpha)
  queries = system.test_queries
  optimum = optimum and system.simulated
  names = ((["GraphPlanner"] if router is not None else [])
           + (["random"] + [f"single:{llm}" for llm in system.space.llms] if baselines else [])
           + (["optimum (DP)"] if optimum else []))
  bar = _EvalProgress(len(names), len(queries)) if progress and names else None
  run_env = (lambda name: bar.env(env, name)) if bar else (lambda name: env)
  rows: list[Row] = []
  router_states = None
  if router is not None:
    model, params, history = router
    name = ROUTER + (ONLINE_LABEL if online_history else "")
    router_states = run_router(system, run_env(name), model, params, history, queries,
                               parallel=parallel, seed=seed, online=online_history,
                               recent_rows=online_recent_rows)
    rows += summarize(name, system, env, queries, router_states)
  if baselines:
    rows += summarize("random", system, env, queries,
                      policies.run_policy(run_env("random"), policies.random_policy, queries,
                                          seed=seed))
    for llm in system.space.llms:
      rows += summarize(f"single:{llm}", system, env, queries,
                        policies.run_policy(run_env(f"single:{llm}"),
                                            policies.single_llm_policy(system.space, llm),
                                            queries, seed=seed))
  if optimum:
    opt_env = run_env("optimum (DP)")
    opt_states = optimum_states(system, opt_env, queries, seed=seed)
    rows += summarize("optimum (DP)", system, opt_env, queries, opt_states)
    if router_states is not None:
      rows = with_split_agreement(rows, name, queries, router_states, opt_states)
  if bar:
    bar.bar.close()
  return rows


def optimum_states(system, env: env_lib.WorkflowEnv, queries: list[Query], *, seed: int) -> list:
  """Final states of the exact DP optimum (simulator only) followed through the MDP on `env`."""
  solver = optimal.OptimalSolver(system.world, system.space, system.mdp_cfg, env.alpha,
                                 system.describe)
  return policies.run_policy(env, policies.oracle_policy(optimal.OraclePolicy(solver)), queries,
                             seed=seed)


def split_agreement(router: list[bool], optimum: list[bool]) -> tuple[float | None, float | None]:
  """(recall, precision) of per-query split flags against the optimum's: recall = queries both
  split / queries the optimum splits, precision = queries both split / queries the router splits;
  None where the denominator is 0."""
  if len(router) != len(optimum):
    raise ValueError(f"{len(router)} router flags against {len(optimum)} optimum flags")
  both = sum(r and o for r, o in zip(router, optimum))
  n_opt, n_router = sum(map(bool, optimum)), sum(map(bool, router))
  return (both / n_opt if n_opt else None), (both / n_router if n_router else None)


def with_split_agreement(rows: list[Row], policy: str, queries: list[Query], states,
                         opt_states) -> list[Row]:
  """`rows` with the split recall and precision of `policy`'s rows (per domain and "all") against
  the optimum's splits on the same queries (states, opt_states: the final states of the policy's
  and the optimum's episodes, in query order)."""
  router = [split(s) for s in states]
  opt = [split(s) for s in opt_states]
  out = []
  for r in rows:
    if r.policy == policy:
      keep = [i for i, q in enumerate(queries) if r.domain in ("all", q.domain)]
      recall, precision = split_agreement([router[i] for i in keep], [opt[i] for i in keep])
      r = dataclasses.replace(r, split_recall=recall, split_precision=precision)
    out.append(r)
  return out


def overall(rows: list[Row]) -> dict[str, Row]:
  return {r.policy: r for r in rows if r.domain == "all"}


def _share(x: float | None) -> str:
  """A share in a table cell: two decimals, "—" where there is none."""
  return "—" if x is None else f"{x:.2f}"


def format_table(rows: list[Row], alpha: float) -> str:
  """Markdown tables: one per domain, policies as rows (split recall and precision: the router's
  splits against the optimum's, "—" for other policies and where undefined)."""
  out = []
  domains = sorted({r.domain for r in rows}, key=lambda d: (d == "all", d))
  for d in domains:
    out.append(f"\n### {d} (alpha = {alpha})\n")
    out.append("| policy | n | accuracy | cost (m$) | reward | calls/query | split rate "
               "| split recall | split precision |")
    out.append("|---|---|---|---|---|---|---|---|---|")
    for r in sorted((r for r in rows if r.domain == d), key=lambda r: -r.reward):
      out.append(f"| {r.policy} | {r.n} | {r.accuracy:.3f} | {r.cost:.3f} | {r.reward:.3f} | "
                 f"{r.calls:.2f} | {_share(r.split_rate)} | {_share(r.split_recall)} | "
                 f"{_share(r.split_precision)} |")
  return "\n".join(out)


def verdict(rows: list[Row]) -> dict:
  """Router vs optimum and vs the best single-LLM policy (on 'all')."""
  o = overall(rows)
  res = {}
  router = next((k for k in (ROUTER, ROUTER + ONLINE_LABEL) if k in o), None)
  if router is not None:
    r = o[router].reward
    singles = {k: v.reward for k, v in o.items() if k.startswith("single:")}
    if "optimum (DP)" in o:
      res["ratio_to_optimum"] = r / o["optimum (DP)"].reward if o["optimum (DP)"].reward else float("nan")
    if singles:
      best = max(singles, key=singles.get)
      res["best_single"] = best
      res["best_single_reward"] = singles[best]
      res["beats_every_single"] = all(r > v for v in singles.values())
    res["router_reward"] = r
  return res


REWARD_KINDS = {
    True: "expected: E[U | the calls made] - alpha x cost under the simulator (its answers)",
    False: "sampled: the scored final answer - alpha x cost (real LLM answers; the simulator's "
           "expectations and optimum do not apply)",
}


SPLIT_NOTE = ("Split rate: share of the queries with at least one Planner call; split recall and "
              "precision: the router's splits against the optimum's (recall: of the queries the "
              "optimum splits, the share the router splits too; precision: of the queries the "
              "router splits, the share the optimum splits too; — where not computed or the "
              "denominator is 0).")


def pool_counters(before: dict, after: dict) -> dict:
  """The numeric pool counters (LLMPool.stats()) accumulated between two snapshots: calls, ok,
  failed, retries, errors/<kind>, faults/<kind>, requests/<replica>, tokens, cost..."""
  out = {}
  for k, v in sorted(after.items()):
    if isinstance(v, (int, float)) and not isinstance(v, bool):
      d = v - before.get(k, 0)
      out[k] = round(d, 6) if isinstance(d, float) else d
  return out


def format_pool(counters: dict) -> str:
  """Markdown table of the pool counters (or a line saying the pool keeps none)."""
  out = ["\n### LLM pool during the evaluation\n"]
  if not counters:
    out.append("No counters: the simulator answers in-process (no requests, no faults).")
    return "\n".join(out)
  out += ["| counter | value |", "|---|---|"]
  for k, v in counters.items():
    out.append(f"| {k} | {v:.3f} |" if isinstance(v, float) else f"| {k} | {v} |")
  return "\n".join(out)


def write(rows: list[Row], alpha: float, path: str | pathlib.Path, *, simulated: bool,
          pool: dict | None = None, step: int = 0) -> dict:
  """Writes <path>.json and <path>.md: the rows, the verdict, which reward the rows hold
  (`simulated`: expected under the simulator, else sampled) and the pool counters; returns the
  verdict. The numbers of the "all" rows and of the verdict also go to a TensorBoard event file
  in path's folder at `step`, tags <path's name>/<policy>/<column> and <path's name>/verdict/<key>
  (the report's one event file, replaced as the report is: tb_events.replace_report)."""
  path = pathlib.Path(path)
  v = verdict(rows)
  pool = dict(pool or {})
  files.write_atomic(path.with_suffix(".json"), json.dumps(
      dict(alpha=alpha, simulated=simulated, reward=REWARD_KINDS[simulated], verdict=v,
           rows=[dataclasses.asdict(r) for r in rows], pool=pool), indent=1),
      "the evaluation report")
  md = (f"Reward: {REWARD_KINDS[simulated]}.\n{SPLIT_NOTE}\n" + format_table(rows, alpha) + "\n"
        + format_pool(pool) + "\n")
  files.write_atomic(path.with_suffix(".md"), md, "the evaluation report")
  numbers = tb_events.numbers(v, f"{path.name}/verdict/")
  for r in rows:
    if r.domain == "all":
      numbers.update(tb_events.numbers(
          {k: x for k, x in dataclasses.asdict(r).items() if k not in ("policy", "domain")},
          f"{path.name}/{r.policy}/"))
  tb_events.replace_report(path.parent, path.name, step, numbers)
  return v
