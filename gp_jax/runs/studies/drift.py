"""Drift study: GraphPlanner when the pool changes during evaluation (simulator pool events).

For each seed the router is trained once on the configured pool (no event). The join event's
router is trained on the pool without the joining LLM: when config.study.drift_join_llm is in the
configured pool (e.g. the LLM the optimum calls most), that pool minus it, a second pre-event
training. For each event (quality_drop, price_rise, fail, join; config.study.drift_*)
the evaluated test stream has the event at query position t, and the cell records the expected
reward of every test query (E[U | calls] - alpha * cost, in stream order) for:
  online      the trained router, its history growing with the evaluated episodes (online memory);
  online_recent  the same with a recency window: the memory starts with the newest
              config.study.drift_recent_rows rows and keeps that many (eval.online_recent_rows);
  frozen      the trained router reading the history the training left (the default evaluation);
  no_history  the trained router with an empty history;
  retrained   the same router trained on the changed pool (the event acts on every training
              query), reading its own training history: the reference a router that knew the
              change could reach;
  optimum     the exact DP optimum of the pool at each query (the ceiling before and after);
  multi:router_r1  the Router-R1-style router (gp_jax/baselines/multi_round/router_r1.py) and
  multi:knn        KNN-multiround (knn.py), fitted once per seed on the training queries of the
                   pre-event pool, as the frozen router was (settings config.study.drift_r1_*
                   and knn_k, read by gp_jax/runs/sweep.py:multi_kwargs_from_config);
  router:<name>    every single-round router of config.study.drift_routers, fitted on the
                   pre-event pool's routing labels of the training queries;
  single:<m>  every single-LLM policy of the evaluated pool.
The baselines fitted on the pre-event pool act in the evaluated one by (role, LLM) name: under the
join event they cannot pick the new LLM (their networks and labels know only the old pool).
Every arm is scored the same way: the expected reward of each evaluated query on the simulator.
The cell also records, for GraphPlanner's arms and the optimum, the share of calls made with the
event's LLM before t, from t on, and from t + drift_closure_after on (does the router move off a
degraded LLM, onto a new one, and where has it settled?).

The metrics (window curves, recovery, gap closure), the summary, the table and the figure are in
gp_jax/runs/studies/drift_report.py. The memory arms run with config.study.drift_online_parallel
episodes in flight (a finished episode's rows reach every decision of a query started after it:
with P in flight a query's first decision misses at most the P - 1 still running), and their
online rows carry what a serving router's memory gets: with row layout 2 each call's credit of the
scored (feedback) utility, recorded in the cell as online_row_utility.
Cells are written atomically to <workdir>/<event>_seed<S>/cell.json; finished cells are skipped on
rerun and training runs resume (as in gp_jax/runs/studies/runner.py). A workdir holding a cell
without one of the current arms (written before the baseline arms existed) is refused with one
error before anything is written: its rewards would be mixed with cells of another arm set.
"""
from __future__ import annotations

import dataclasses
import math
import pathlib
import sys
import time

import ml_collections
import numpy as np

from gp_jax import config_lists
from gp_jax import errors
from gp_jax.baselines import labels as labels_lib
from gp_jax.baselines import multi_round
from gp_jax.baselines import single_round
from gp_jax.graph import features as features_lib
from gp_jax.runs import evaluate as evaluation
from gp_jax.runs import sweep as sweep_lib
from gp_jax.runs import system as system_lib
from gp_jax.runs import train as training
from gp_jax.runs import workdir as workdir_config
from gp_jax.runs.studies import runner as runner_lib
from gp_jax.sim import events as sim_events
from gp_jax.util import config_overrides
from gp_jax.workflow import policies

STUDY = "drift"
EVENTS = ("quality_drop", "price_rise", "fail", "join")
MULTI = ("router_r1", "knn")            # multi-round baselines (gp_jax.baselines.multi_round)
ARMS = ("online", "online_recent", "frozen", "no_history", "retrained") + tuple(
    multi_round.ROW_PREFIX + m for m in MULTI) + ("optimum",)
BEST_SINGLE = "best single LLM (after the fact)"
BEST_ROUTER = "best single-round router (after the fact)"
ROUTER_PREFIX = "router:"
BAND_ARMS = ("online", "retrained")    # arms whose 95% band the figure draws
TITLE = "Drift: the pool changes during evaluation (online memory vs frozen vs retrained)"


# ---- the study ----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Settings:
  """config.study.drift_*, validated."""
  llm: str
  join_llm: str
  t: int
  delta: float
  price_scale: float
  window: int
  recovery_after: int
  events: tuple[str, ...]
  routers: tuple[str, ...]        # single-round routers (arms "router:<name>")
  recent_rows: int                # online_recent's window (rows)
  closure_after: int = 50         # gap closure over [t + closure_after, + closure_len)
  closure_len: int = 150
  online_parallel: int = 4        # episodes in flight of the memory arms


def settings(config) -> Settings:
  s = config.study
  if config.backend != "simulator" or config.data.source != "simulated":
    raise errors.ConfigError("the drift study changes the simulated pool (and scores every arm by "
                             "the simulator's expected reward): it needs backend='simulator' and "
                             "data.source='simulated'")
  events = config_lists.names(s.drift_events)
  for e in events:
    if e not in EVENTS:
      raise errors.unknown_name("drift event", e, EVENTS)
  if not events:
    raise errors.ConfigError("config.study.drift_events is empty")
  routers = config_lists.names(s.drift_routers)
  for r in routers:
    single_round.make_router(r)
  out = Settings(str(s.drift_llm), str(s.drift_join_llm), int(s.drift_t), float(s.drift_delta),
                 float(s.drift_price_scale), int(s.drift_window), int(s.drift_recovery_after),
                 events, routers, int(s.drift_recent_rows),
                 int(s.get("drift_closure_after", 50)), int(s.get("drift_closure_len", 150)),
                 int(s.get("drift_online_parallel", 4)))
  if out.online_parallel < 1:
    raise errors.ConfigError(f"config.study.drift_online_parallel={out.online_parallel} must be "
                             ">= 1")
  if (out.closure_after < 0 or out.closure_len < 1
      or out.t + out.closure_after + out.closure_len > int(config.data.n_test)):
    raise errors.ConfigError(
        f"the gap-closure window [t + drift_closure_after, + drift_closure_len) = "
        f"[{out.t + out.closure_after}, {out.t + out.closure_after + out.closure_len}) must fit "
        f"the {int(config.data.n_test)} test queries (and drift_closure_len >= 1)")
  if out.recent_rows < 1:
    raise errors.ConfigError(f"config.study.drift_recent_rows={out.recent_rows} must be >= 1")
  n = int(config.data.n_test)
  if not 0 < out.t < n:
    raise errors.ConfigError(f"config.study.drift_t={out.t} must lie inside the test stream "
                             f"(0 < t < data.n_test={n})")
  if out.window < 1 or out.t + out.recovery_after + out.window > n or out.recovery_after < 0:
    raise errors.ConfigError(
        f"the recovery window [t + drift_recovery_after, + drift_window) = "
        f"[{out.t + out.recovery_after}, {out.t + out.recovery_after + out.window}) must fit the "
        f"{n} test queries (and drift_window >= 1)")
  train_llms = system_lib.configured_llms(config)
  if "join" in events:
    known = system_lib.full_catalog(config).names
    if out.join_llm not in known:
      raise errors.unknown_name("drift_join_llm", out.join_llm, known)
    if len([m for m in train_llms if m != out.join_llm]) < 1:
      raise errors.ConfigError("the join event's pre-event pool (config.llms without "
                               f"{out.join_llm}) is empty")
  if str(s.drift_router_llm) and str(s.drift_router_llm) not in train_llms:
    raise errors.unknown_name("router LLM", str(s.drift_router_llm), train_llms)
  for m in MULTI:                  # bad Router-R1 settings fail before any work
    multi_round.make_multi_router(m, **multi_kwargs(config))
  return out


def multi_kwargs(config) -> dict:
  """The multi-round routers' settings as the sweep reads them (sweep.multi_kwargs_from_config,
  learner.router_r1_settings), from config.study's knn_k and drift_r1_* / drift_router_llm."""
  s = config.study
  view = ml_collections.ConfigDict(dict(
      train=config.train.to_dict(), ppo=config.ppo.to_dict(),
      sweep=dict(knn_k=int(s.knn_k), router_llm=str(s.drift_router_llm),
                 r1_hidden=int(s.drift_r1_hidden), r1_episodes=int(s.drift_r1_episodes),
                 r1_batch=int(s.drift_r1_batch), r1_learning_rate=float(s.drift_r1_learning_rate),
                 r1_entropy_coef=float(s.drift_r1_entropy_coef))))
  return sweep_lib.multi_kwargs_from_config(view)


def arms(s: Settings) -> tuple[str, ...]:
  """The arms every cell of a run with settings `s` holds (besides the single LLMs)."""
  return ARMS + tuple(ROUTER_PREFIX + r for r in s.routers)


def missing_arms(cell: dict, wanted) -> list[str]:
  return [a for a in wanted if a not in cell.get("rewards", {})]


def event_overrides(kind: str, s: Settings, config) -> tuple[dict, dict]:
  """(evaluation overrides: the event at s.t of the test stream, retraining overrides: the event
  on every training query) as dotted config keys (gp_jax/sim/events.config_overrides)."""
  llm = s.join_llm if kind == "join" else s.llm
  kw = dict(delta=s.delta, price_scale=s.price_scale)
  ev = sim_events.config_overrides(kind, llm, s.t, "test", **kw)
  re = sim_events.config_overrides(kind, llm, 0, "train", **kw)
  if kind == "join":   # evaluated (and retrained) on the pool with the new LLM
    pool = system_lib.configured_llms(config)
    ev["llms"] = re["llms"] = ",".join(pool + [llm] if llm not in pool else pool)
  return ev, re


def pre_event_overrides(kind: str, s: Settings, config) -> dict:
  """Training overrides of the router that meets the event: none, except for a join event whose
  LLM is in the configured pool (the router is then trained on the pool without it)."""
  pool = system_lib.configured_llms(config)
  if kind == "join" and s.join_llm in pool:
    return {"llms": ",".join(m for m in pool if m != s.join_llm)}
  return {}


def llm_share(states, llm: str, lo: int, hi: int) -> float:
  """Share of the calls made with `llm` by the episodes states[lo:hi] (NaN without calls)."""
  calls = [c.llm for st in states[lo:hi] for c in st.calls]
  return float(np.mean([c == llm for c in calls])) if calls else math.nan


def per_query_rewards(system, env, states) -> list[float]:
  """E[U | calls] - alpha * cost of each finished state of system.test_queries, in order."""
  return [evaluation.episode_stats(system, env, q, st)[2]
          for q, st in zip(system.test_queries, states)]


def carried_policy(policy, src, dst):
  """A policy of action space `src` acting in `dst` (same roles; dst may hold more LLMs, e.g. the
  join event's): it sees dst's mask restricted to src's (role, LLM) pairs, and its action is
  renamed to dst's index of the same pair. The identity when the spaces are equal."""
  to_dst = np.array([dst.encode(src.decode(a)[0].name, src.decode(a)[1])
                     for a in range(src.size)], np.int64)

  def act(query, state, mask, rng):
    return int(to_dst[policy(query, state, np.asarray(mask)[to_dst], rng)])
  return act


class DriftRunner:
  """Runs the drift study's (event, seed) cells into a workdir (resumable)."""

  def __init__(self, config, workdir, *, verbose: bool = True):
    self.config, self.workdir, self.verbose = config, pathlib.Path(workdir), verbose
    self.s = settings(config)
    self._runs: dict[tuple, tuple] = {}
    self._fitted: dict[tuple, tuple] = {}
    for kind in self.s.events:    # fail fast on bad overrides
      for o in event_overrides(kind, self.s, config):
        config_overrides.apply(config, o)

  def _log(self, msg: str) -> None:
    if self.verbose:
      print(msg, file=sys.stderr, flush=True)

  def check_cells(self) -> None:
    """DataError for a finished cell of this workdir without one of the current arms (written
    before the baseline arms existed): its rewards must not be mixed with new cells."""
    wanted = arms(self.s)
    for path in sorted(self.workdir.glob(f"*/{runner_lib.CELL_FILE}")):
      cell = errors.read_json(path, "drift cell")
      missing = missing_arms(cell, wanted) if isinstance(cell, dict) else list(wanted)
      if missing:
        raise errors.DataError(
            f"{path} has no {', '.join(missing)} arm (written by an older drift study or other "
            "settings); its rewards cannot be mixed with new cells: use a new --workdir")

  def run(self, seeds: list[int]) -> dict:
    self.check_cells()
    workdir_config.check_or_record(self.workdir, self.config, ignore=("study.seeds",),
                                   what="drift study")
    t0, ran, skipped = time.time(), [], []
    for seed in seeds:
      for index, kind in enumerate(self.s.events):
        out = self.workdir / f"{kind}_seed{seed}"
        if (out / runner_lib.CELL_FILE).exists():
          skipped.append((kind, seed))
          continue
        out.mkdir(parents=True, exist_ok=True)
        rec = dict(self.run_cell(kind, seed), index=index)
        runner_lib.write_cell(out / runner_lib.CELL_FILE, rec)
        ran.append((kind, seed))
        post = {a: float(np.mean(rec["rewards"][a][self.s.t:])) for a in arms(self.s)}
        self._log(f"[drift] {kind} seed={seed}: post-event reward " +
                  ", ".join(f"{a} {v:.3f}" for a, v in post.items()) + f" ({rec['seconds']:.0f}s)")
    return dict(ran=ran, skipped=skipped, seconds=time.time() - t0)

  def _trained(self, overrides: dict, seed: int):
    """(config, system, model, params, history, dir) of the training run with `overrides`
    (trained or resumed once per process)."""
    key = (runner_lib.variant_key(overrides), seed)
    if key not in self._runs:
      self._runs[key] = self._train(overrides, seed)
    return self._runs[key]

  def _train(self, overrides: dict, seed: int):
    cfg = config_overrides.apply(self.config, {"seed": int(seed), **overrides})
    sysm = system_lib.build(cfg)
    tdir = self.workdir / "train" / f"{runner_lib.variant_key(overrides)}_seed{seed}"
    training.train(cfg, tdir, system=sysm, verbose=self.verbose)
    model, params, history = training.load_router(cfg, tdir, sysm)
    return cfg, sysm, model, params, runner_lib.history_for(cfg, history), tdir

  def _baselines(self, seed: int, tsys) -> tuple[dict, dict, float]:
    """(multi-round routers, single-round routers, seconds) fitted once per seed and pre-event
    pool on its training queries (Router-R1 trains at the study's alpha on first use)."""
    key = (seed, tuple(tsys.space.llms))
    if key not in self._fitted:
      t0 = time.time()
      multi = multi_round.fit_multi_routers(list(MULTI), tsys, tsys.train_queries, seed=seed,
                                            **multi_kwargs(self.config))
      for r in multi.values():
        r.policy(float(self.config.alpha))
      data = labels_lib.collect(tsys, tsys.train_queries, seed=seed)
      s = self.config.study
      single = single_round.fit_routers(
          list(self.s.routers), data, tsys.catalog, knn_k=int(s.knn_k),
          mlp_hidden=int(s.mlp_hidden), steps=int(s.router_steps), seed=seed)
      self._fitted[key] = (multi, single, time.time() - t0)
    return self._fitted[key]

  def run_cell(self, kind: str, seed: int) -> dict:
    t0 = time.time()
    ev, re = event_overrides(kind, self.s, self.config)
    pre = pre_event_overrides(kind, self.s, self.config)
    tcfg, tsys, model, params, hist, tdir = self._trained(pre, seed)
    esys = system_lib.build(config_overrides.apply(
        config_overrides.apply(self.config, {"seed": int(seed)}), ev))
    alpha = float(tcfg.alpha)
    env = esys.env(alpha)
    event_llm = self.s.join_llm if kind == "join" else self.s.llm
    states = self._garnet_arms(esys, env, tsys, model, params, hist, seed)
    rcfg, rsys, _, rparams, rhist, rdir = self._trained(re, seed)
    states["retrained"] = self._garnet_arms(esys, env, rsys, model, rparams, rhist, seed,
                                            only_frozen=True)["frozen"]
    multi, single, fit_seconds = self._baselines(seed, tsys)
    rewards = {a: per_query_rewards(esys, env, st) for a, st in states.items()}
    rewards.update(self._baseline_arms(esys, env, tsys, multi, single, seed))
    optimum_states, singles = self._reference_arms(esys, env, seed)
    rewards["optimum"] = per_query_rewards(esys, env, optimum_states)
    rewards.update(singles)
    states["optimum"] = optimum_states
    t = self.s.t
    settled = t + self.s.closure_after   # shares: before, after, and from t + closure_after on
    shares = {a: [llm_share(st, event_llm, 0, t), llm_share(st, event_llm, t, len(st)),
                  llm_share(st, event_llm, settled, len(st))]
              for a, st in states.items()}
    return dict(study=STUDY, variant=kind, seed=seed, alpha=alpha, t=self.s.t,
                window=self.s.window, recovery_after=self.s.recovery_after, eval_overrides=ev,
                retrain_overrides=re, pre_event_overrides=pre, event_llm=event_llm,
                event_llm_share=shares, recent_rows=self.s.recent_rows,
                closure_after=self.s.closure_after, closure_len=self.s.closure_len,
                online_parallel=self.s.online_parallel,
                online_row_utility=features_lib.ROW_UTILITY[int(model.row_layout)],
                llms=list(esys.space.llms), n_test=len(esys.test_queries),
                online_history=hist is not None, rewards=rewards,
                train=dict(episodes=int(tcfg.train.episodes),
                           seconds=runner_lib.train_seconds(tdir),
                           retrained_seconds=runner_lib.train_seconds(rdir),
                           baselines_fit_seconds=fit_seconds),
                seconds=time.time() - t0)

  def _garnet_arms(self, esys, env, tsys, model, params, hist, seed: int, *,
                   only_frozen: bool = False) -> dict:
    """online, online_recent, frozen and no_history final states of a trained GARNet on the
    evaluated stream (its history's hub ids renamed for the evaluated pool)."""
    if hist is not None and not runner_lib.same_space(esys.space, tsys.space):
      hist = runner_lib.remap_history(hist, tsys.space, esys.space)
    parallel = int(self.config.train.parallel)

    def router(h, online=False, recent_rows=0):
      return evaluation.run_router(esys, env, model, params, h, esys.test_queries,
                                   parallel=self.s.online_parallel if online else parallel,
                                   seed=seed, online=online,
                                   recent_rows=recent_rows)

    out = {"frozen": router(hist)}
    if not only_frozen:
      out["no_history"] = router(None)
      out["online"] = router(hist, online=True) if hist is not None else out["frozen"]
      out["online_recent"] = (router(hist, online=True, recent_rows=self.s.recent_rows)
                              if hist is not None else out["frozen"])
    return out

  def _baseline_arms(self, esys, env, tsys, multi: dict, single: dict, seed: int) -> dict:
    """multi:<name> and router:<name> rewards of the routers fitted on the pre-event pool, acting
    in the evaluated pool by (role, LLM) name."""
    alpha, queries, out = env.alpha, esys.test_queries, {}
    for name, r in multi.items():
      act = carried_policy(r.policy(alpha), tsys.space, esys.space)
      out[multi_round.ROW_PREFIX + name] = per_query_rewards(
          esys, env, policies.run_policy(env, act, queries, seed=seed))
    x, tasks = labels_lib.embed(esys, queries), [q.task_name for q in queries]
    for i, (name, r) in enumerate(single.items()):
      choice = r.choose(x, alpha, np.random.default_rng([seed, i]), tasks=tasks)
      llm_of = {q.qid: tsys.space.llms[int(c)] for q, c in zip(queries, choice)}
      out[ROUTER_PREFIX + name] = per_query_rewards(esys, env, policies.run_policy(
          env, single_round.routed_policy(esys.space, llm_of), queries, seed=seed))
    return out

  def _reference_arms(self, esys, env, seed: int) -> tuple[list, dict]:
    """(the DP optimum's final states, the pool at each query; the rewards of every single LLM
    of the evaluated pool)."""
    queries = esys.test_queries
    best = runner_lib.optimum_states(esys, env.alpha, seed)
    out = {}
    for m in esys.space.llms:
      out[f"single:{m}"] = per_query_rewards(esys, env, policies.run_policy(
          env, policies.single_llm_policy(esys.space, m), queries, seed=seed))
    return best, out
