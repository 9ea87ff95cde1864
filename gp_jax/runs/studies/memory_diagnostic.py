"""Memory diagnostic: can the history memory carry a signal, and does the policy read it?

On a frozen trained router, every history row of one LLM's hubs is overwritten with undiluted
evidence against it -- utility 0 (`utility0`), failed = 1 (`failed`, the other columns kept), cost
x 4 (`cost4x`), or the rows a failing LLM leaves (`failing`: failed = 1, utility 0, cost 0) -- and
the router is evaluated (greedy, weights frozen) on the same test queries with that history. For
each injection the diagnostic reports
  share          the share of the router's calls made with the LLM (before: `none`);
  reward         the mean expected reward E[U | calls] - alpha * cost (simulated pools);
  input_change   how far the injection moved what the policy reads of the LLM's hubs: the norm
                 of the change of the per-hub history mean (the transformed rows' mean, GARNet's
                 history input), and for row layout 2 of the per-hub statistics, summed over the
                 LLM's hubs;
  logit_change   the mean absolute change of the LLM's hubs' logits at the first decision of each
                 query (valid actions only);
  margin_change  the mean change of (mean logit of the LLM's valid hubs - mean logit of the other
                 valid hubs) at the first decisions: negative = the policy moves away from it;
  bias_change    (model.memory_bias or model.memory_predictor routers) the mean change of the
                 logit term read from each hub's statistics alone (GARNet.memory_term: the bias
                 b(s_a), kappa x the predicted call reward) over the LLM's hubs: the part of the
                 logit change that this path makes;
and, without injection, the sensitivity of the logits to each hub's history input: the Frobenius
norm of d logits / d (hub a's history mean) (and / d (hub a's statistics), row layout 2) at the
first decision, averaged over the queries, per hub and summed per LLM.
A large input change with no logit change says the policy ignores the memory; a small input
change says the memory cannot carry the signal.
"""
from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from gp_jax import errors
from gp_jax.graph import features as features_lib
from gp_jax.graph import history as history_lib
from gp_jax.rl import rollout
from gp_jax.runs import evaluate as evaluation

INJECTIONS = ("none", "utility0", "failed", "cost4x", "failing")


def llm_hubs(space, llm: str) -> np.ndarray:
  """[A] bool: the (role, LLM) hubs of `llm`."""
  if llm not in space.llms:
    raise errors.unknown_name("LLM", llm, list(space.llms))
  return np.array([space.decode(a)[1] == llm for a in range(space.size)], bool)


def inject(history: history_lib.HistoryMemory, hubs: np.ndarray, kind: str
           ) -> history_lib.HistoryMemory:
  """A copy of `history` with every row of the hubs (bool [A]) overwritten by `kind`'s evidence
  (INJECTIONS; columns utility F-3, cost F-2, failed F-1 of features.memory_row_table)."""
  if kind not in INJECTIONS:
    raise errors.unknown_name("injection", kind, INJECTIONS)
  rows = history.rows.copy()
  sel = np.asarray(hubs, bool)[history.hubs]
  if kind == "utility0":
    rows[sel, -3] = 0.0
  elif kind == "failed":
    rows[sel, -1] = 1.0
  elif kind == "cost4x":
    rows[sel, -2] *= 4.0
  elif kind == "failing":
    rows[sel, -3:] = (0.0, 0.0, 1.0)
  return dataclasses.replace(history, rows=rows, hubs=history.hubs.copy())


def first_observations(system, env, runner: rollout.PolicyRunner, queries) -> dict:
  """The batch of first-decision observations of `queries` (with the runner's hub statistics)."""
  f = system.featurizer
  obs = []
  for q in queries:
    state = env.reset(q)
    t_emb, q_emb = f.encoder.encode([env.describe(q)[0], q.query])
    obs.append(f.observe(state, t_emb, q_emb, np.zeros((0, f.spec.row_dim), np.float32),
                         env.mask(state)))
  return runner.with_stats(features_lib.stack(obs))


def sensitivity(model, params, hub_features, hub_sum, hub_count, obs) -> dict:
  """Per-hub Frobenius norms [A] of d logits / d (hub's history mean) (key `mean`) and, for
  row layout 2, of d logits / d (hub's statistics) (key `stats`), averaged over the batch."""
  count = jnp.asarray(hub_count)
  mean = jnp.asarray(hub_sum) / jnp.maximum(count, 1.0)[:, None]

  def logits(mean, stats, o):
    o = dict(o, hub_stats=stats) if stats is not None else o
    h = model.apply({"params": params}, hub_features, mean * jnp.maximum(count, 1.0)[:, None],
                    count, method=model.history_hubs)
    lg = model.apply({"params": params}, h, o, method=model.policy)
    return jnp.where(o["mask"], lg, 0.0)   # masked entries carry no gradient

  out = {}
  B = len(obs["mask"])
  jm, js = [], []
  for i in range(B):
    o = jax.tree_util.tree_map(lambda x: jnp.asarray(x[i]), obs)
    stats = o.pop("hub_stats", None)
    jm.append(jnp.sqrt(jnp.sum(jax.jacrev(logits, 0)(mean, stats, o) ** 2, axis=(0, 2))))
    if stats is not None:
      js.append(jnp.sqrt(jnp.sum(jax.jacrev(logits, 1)(mean, stats, o) ** 2, axis=(0, 2))))
  out["mean"] = np.asarray(jnp.stack(jm).mean(0))
  if js:
    out["stats"] = np.asarray(jnp.stack(js).mean(0))
  return out


def share(states, llm: str) -> float:
  calls = [c.llm for s in states for c in s.calls]
  return float(np.mean([c == llm for c in calls])) if calls else math.nan


def diagnose(system, env, model, params, history: history_lib.HistoryMemory, llm: str, queries,
             *, parallel: int, seed: int) -> dict:
  """The diagnostic of the module docstring for `llm` on `queries` (a JSON-able dict)."""
  if history is None or not len(history):
    raise errors.ConfigError("the memory diagnostic needs a router that reads a non-empty "
                             "history memory (model.history=transductive)")
  hubs = llm_hubs(system.space, llm)
  runner = rollout.PolicyRunner(model, system.featurizer.hub_features, parallel,
                                featurizer=system.featurizer)
  runner.set_params(params, history)
  base_obs = first_observations(system, env, runner, queries)
  base_logits, _ = runner.scores(base_obs)
  base_mean = runner.hub_sum / np.maximum(runner.hub_count, 1.0)[:, None]
  base_stats = runner.stats_table()
  sens = sensitivity(model, runner.params, runner.hub_features, runner.hub_sum, runner.hub_count,
                     base_obs)
  mask = np.asarray(base_obs["mask"], bool)
  valid = mask & hubs[None, :]

  def margin(lg):
    own, other = mask & hubs[None, :], mask & ~hubs[None, :]
    ok = own.any(1) & other.any(1)
    m = (np.where(own, lg, 0).sum(1) / np.maximum(own.sum(1), 1)
         - np.where(other, lg, 0).sum(1) / np.maximum(other.sum(1), 1))
    return m[ok]
  base_margin = margin(base_logits)

  def bias(stats):
    return np.asarray(model.apply({"params": runner.params}, jnp.asarray(stats),
                                  method=model.memory_term))
  base_bias = bias(base_stats) if model.has_memory_term else None
  rows = {}
  for kind in INJECTIONS:
    h = inject(history, hubs, kind)
    states = evaluation.run_router(system, env, model, params, h, queries, parallel=parallel,
                                   seed=seed)
    runner.set_params(params, h)
    mean = runner.hub_sum / np.maximum(runner.hub_count, 1.0)[:, None]
    obs = dict(base_obs)
    obs.pop("hub_stats", None)
    logits, _ = runner.scores(runner.with_stats(obs))
    rec = dict(share=share(states, llm),
               reward=float(np.mean([evaluation.episode_stats(system, env, q, s)[2]
                                     for q, s in zip(queries, states)])) if system.simulated
               else math.nan,
               input_change_mean=float(np.linalg.norm((mean - base_mean)[hubs])),
               logit_change=float(np.abs(logits - base_logits)[valid].mean()) if valid.any()
               else math.nan,
               margin_change=float((margin(logits) - base_margin).mean()) if len(base_margin)
               else math.nan)
    if base_stats is not None:
      rec["input_change_stats"] = float(np.linalg.norm((runner.stats_table() - base_stats)[hubs]))
    if model.has_memory_term:
      rec["bias_change"] = float((bias(runner.stats_table()) - base_bias)[hubs].mean())
    rows[kind] = rec
  sens_out = {k: dict(per_hub=v.tolist(), llm=float(v[hubs].sum()),
                      all_hubs=float(v.sum())) for k, v in sens.items()}
  return dict(llm=llm, queries=len(queries), history_rows=len(history),
              llm_rows=int(hubs[history.hubs].sum()), row_layout=int(runner.row_layout),
              injections=rows, sensitivity=sens_out)


def report_lines(d: dict) -> list[str]:
  """A small markdown table of a diagnose() result."""
  lines = [f"memory diagnostic: {d['llm']}, {d['queries']} test queries, {d['history_rows']} "
           f"history rows ({d['llm_rows']} of its hubs), row layout {d['row_layout']}", "",
           "| injection | share | reward | input change (mean) | input change (stats) | "
           "logit change | margin change | bias change |", "|---|---|---|---|---|---|---|---|"]
  for k, r in d["injections"].items():
    bias = f"{r['bias_change']:+.3g}" if "bias_change" in r else "-"
    lines.append(f"| {k} | {r['share']:.3f} | {r['reward']:.3f} | {r['input_change_mean']:.3g} | "
                 f"{r.get('input_change_stats', math.nan):.3g} | {r['logit_change']:.3g} | "
                 f"{r['margin_change']:+.3g} | {bias} |")
  for k, s in d["sensitivity"].items():
    lines.append(f"\n|d logits / d {k}|: {s['llm']:.3g} over the LLM's hubs, {s['all_hubs']:.3g} "
                 "over all hubs (mean over first decisions)")
  return lines
