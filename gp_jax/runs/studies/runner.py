"""Study runner: train router variants, evaluate each on its own evaluation system, resumably.

A study (gp_jax/runs/studies/{phases,unseen,ablations,roles}.py) is a list of `Variant`s. For each
seed and variant the runner
  1. trains a router with the variant's training overrides (variants with equal overrides share
     one training run: <workdir>/train/<key>_seed<S>/, resumable from its latest checkpoint);
  2. builds the evaluation system (the training config plus the variant's evaluation overrides:
     more LLMs, other test tasks, more roles, ...) and carries the router over to it: the network
     is size-agnostic in the number of (role, LLM) hubs, and the history memory's hub ids are
     remapped by (role, LLM) name;
  3. optionally adds few-shot episodes of the evaluation system (sampled policy) to the history
     and applies PPO updates on them (fresh Adam state; see few_shot_update for the recipes);
  4. evaluates the greedy router on the evaluation system's test queries, and, once per
     (evaluation system, seed), the reference policies (random, every single LLM, the DP optimum,
     optionally single-round routers fitted on the training queries);
  5. writes <workdir>/<variant>_seed<S>/cell.json atomically. Finished cells are skipped on rerun.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from gp_jax import errors
from gp_jax import files
from gp_jax import progress as progress_lib
from gp_jax.baselines import labels as labels_lib
from gp_jax.baselines import single_round
from gp_jax.graph import garnet
from gp_jax.graph import history as history_lib
from gp_jax.rl import batch as batch_lib
from gp_jax.rl import ppo
from gp_jax.rl import rollout
from gp_jax.runs import evaluate as evaluation
from gp_jax.runs import ppo_config
from gp_jax.runs import system as system_lib
from gp_jax.runs import train as training
from gp_jax.runs import workdir as workdir_config
from gp_jax.sim import optimal
from gp_jax.util import aio
from gp_jax.util import config_overrides
from gp_jax.workflow import policies

CELL_FILE = "cell.json"
ROUTER = "GraphPlanner"


@dataclasses.dataclass(frozen=True)
class Variant:
  """One arm of a study.

  Attributes:
    name: row label (the router's rows are named f"GraphPlanner[{name}]").
    train: dotted config overrides of the training run, e.g. {"mdp.phase1_depth": 1}.
    evaluate: dotted config overrides of the evaluation system (on top of the training config).
    history: "trained" (what the trained mode uses) or "none" (evaluate with an empty history).
    few_shot: training queries of the evaluation system run with the sampled router before
      evaluation, per round; their calls join the history and drive `few_shot_updates` PPO
      updates per round (0: history only, the weights untouched).
    few_shot_updates, few_shot_rounds: the few-shot recipe (few_shot_update).
    routers: single-round routers fitted on the training queries and evaluated next to it.
    held_out: LLMs new at evaluation; the cell records the share of the optimum's and the
      router's calls made with them.
    split_agreement: on the simulator, the router's rows get split recall and precision against
      the DP optimum's splits on the same test queries (the optimum's run cached per evaluation
      system and seed).
  """
  name: str
  train: dict = dataclasses.field(default_factory=dict)
  evaluate: dict = dataclasses.field(default_factory=dict)
  history: str = "trained"
  few_shot: int = 0
  few_shot_updates: int = 1
  few_shot_rounds: int = 1
  routers: tuple = ()
  held_out: tuple = ()
  split_agreement: bool = False


def variant_key(overrides: dict) -> str:
  """A short stable name of a variant's config overrides ("base" for none): its folder names."""
  if not overrides:
    return "base"
  text = json.dumps(overrides, sort_keys=True)
  return hashlib.blake2b(text.encode(), digest_size=4).hexdigest()


def write_cell(path: pathlib.Path, record: dict) -> None:
  """Writes a cell (or cache) record atomically (gp_jax.files), indented as before."""
  files.write_json(path, record, "study cell", indent=1, separators=(",", ": "), ensure_ascii=True)


def all_domain_rows(cell: dict) -> dict[str, dict]:
  """A cell record's rows over all domains, keyed by policy."""
  return {r["policy"]: r for r in cell["rows"] if r["domain"] == "all"}


def expected_accuracy(row: dict, cell: dict) -> float:
  """A row's expected accuracy: on the simulator reward + alpha x cost (its expected utility);
  on a real backend the sampled accuracy (no expectation exists there)."""
  return row["reward"] + cell["alpha"] * row["cost"] if cell.get("simulated") else row["accuracy"]


def remap_history(history: history_lib.HistoryMemory, src, dst) -> history_lib.HistoryMemory:
  """The history with hub ids of action space `src` renumbered for action space `dst` by
  (role, LLM) name; rows whose action does not exist in `dst` are dropped."""
  index = {}
  names = [r.name for r in dst.roles.roles]
  for a in range(src.size):
    role, llm = src.decode(a)
    if role.name in names and llm in dst.llms:
      index[a] = dst.encode(role.name, llm)
  keep = np.array([int(h) in index for h in history.hubs], bool)
  out = history_lib.HistoryMemory(history.row_dim, dst.size, capacity=history.capacity,
                                  headroom=history.headroom)
  out.add(history.rows[keep], np.array([index[int(h)] for h in history.hubs[keep]], np.int32))
  return out


def same_space(a, b) -> bool:
  return ([r.name for r in a.roles.roles], tuple(a.llms)) == ([r.name for r in b.roles.roles],
                                                              tuple(b.llms))


def history_for(config, history):
  """The history evaluation reads for a trained mode (mirrors gp_jax.runs.pipeline)."""
  return None if config.model.history == "inductive" else history


def few_shot_update(config, system, model, params, history, n: int, seed: int, *,
                    updates: int = 1, rounds: int = 1):
  """The few-shot recipe: `rounds` times, the next n training queries of `system` (cycling
  through them when they run out) run with the sampled router (current weights); their calls
  join `history` (when it is not None) and `updates` PPO updates are applied on them. The Adam
  state starts fresh and is carried across rounds and updates. updates=0: history only. Returns
  the new params.

  rounds=1, updates=1 is the roles study's original recipe (50 episodes, one update); n beyond
  the training queries runs each of them once per round."""
  check_few_shot(n, updates, rounds)
  queries = system.train_queries
  per_round = min(n, len(queries))
  chunks = [[queries[(r * per_round + i) % len(queries)] for i in range(per_round)]
            for r in range(rounds)]
  runner = rollout.PolicyRunner(model, system.featurizer.hub_features, int(config.train.parallel))
  env = system.env(float(config.alpha), reward=config.train.reward)
  optimizer = ppo_config.make_optimizer(config)
  update, batch_size = ppo_config.make_update(config, system, model, optimizer, len(chunks[0]))
  params = jax.tree_util.tree_map(jnp.copy, params)   # the update donates its state's buffers
  state = ppo.TrainingState(params=params, opt_state=optimizer.init(params),
                            rng=jax.random.PRNGKey(seed), update_step=jnp.zeros((), jnp.int32))
  for r in range(rounds):
    runner.set_params(state.params, history)
    key = jax.random.PRNGKey(seed + 7)
    episodes = aio.run(rollout.run_episodes(
        env, system.featurizer, runner, chunks[r],
        key=key if r == 0 else jax.random.fold_in(key, r), greedy=False, history=history,
        grow_history=history is not None,
        seed_salt=("few-shot", seed) if r == 0 else ("few-shot", seed, r)))
    if not updates:
      continue
    batch, hist_inputs = batch_lib.build_batch(episodes, history,
                                               batch_size=batch_size,
                                               num_episodes=len(chunks[r]),
                                               max_calls=ppo_config.max_calls(system),
                                               num_hubs=system.space.size,
                                               predictor=bool(config.model.memory_predictor))
    for _ in range(updates):
      state, _ = update(state, jnp.asarray(system.featurizer.hub_features), hist_inputs, batch)
  return state.params


def check_few_shot(n: int, updates: int, rounds: int) -> None:
  if n < 1 or updates < 0 or rounds < 1:
    raise errors.ConfigError(f"few-shot recipe: need episodes >= 1, updates >= 0 and rounds >= 1; "
                             f"got {n}, {updates}, {rounds}")


def train_seconds(train_dir: pathlib.Path) -> float:
  """Rollout + update seconds of a training run from its metrics (exact across resumes)."""
  path = train_dir / "metrics.jsonl"
  if not path.exists():
    return 0.0
  recs = [json.loads(l) for l in path.read_text().splitlines() if l.strip()]
  return float(sum(r.get("rollout_s", 0.0) + r.get("update_s", 0.0) for r in recs))


def training_return_tail(train_dir: pathlib.Path, fraction: float = 0.1) -> float | None:
  """Mean training `episode_return` over the last `fraction` of a run's iterations (at least
  one), from its metrics.jsonl; None without iterations. Training queries only: a selection
  rule may read it, where it may not read a test number."""
  path = train_dir / "metrics.jsonl"
  if not path.exists():
    return None
  recs = [json.loads(l) for l in path.read_text().splitlines() if l.strip()]
  rets = [float(r["episode_return"]) for r in recs if "episode_return" in r]
  if not rets:
    return None
  k = max(1, int(round(len(rets) * fraction)))
  return float(np.mean(rets[-k:]))


def action_shares(system, states) -> dict:
  """Share of the calls made with each LLM and with each role, over finished states."""
  llms, roles, n = {}, {}, 0
  for s in states:
    for c in s.calls:
      llms[c.llm] = llms.get(c.llm, 0) + 1
      roles[c.role] = roles.get(c.role, 0) + 1
      n += 1
  n = max(n, 1)
  return dict(llm={k: v / n for k, v in sorted(llms.items())},
              role={k: v / n for k, v in sorted(roles.items())})


def optimum_states(system, alpha: float, seed: int) -> list:
  """Final states of the exact DP optimum on the system's test queries (simulated pools)."""
  env = system.env(alpha)
  solver = optimal.OptimalSolver(system.world, system.space, system.mdp_cfg, env.alpha,
                                 system.describe)
  return policies.run_policy(env, policies.oracle_policy(optimal.OraclePolicy(solver)),
                             system.test_queries, seed=seed)


class StudyRunner:
  """Runs the variants of one study over seeds into a workdir (resumable)."""

  def __init__(self, config, workdir, study: str, variants: list[Variant], *,
               router_kwargs: dict | None = None, verbose: bool = True):
    names = [v.name for v in variants]
    if len(set(names)) != len(names):
      raise errors.ConfigError(f"duplicate variant names in study {study!r}: {names}")
    for v in variants:
      if v.history not in ("trained", "none"):
        raise errors.ConfigError(f"variant {v.name}: history must be 'trained' or 'none'")
      if v.few_shot:
        check_few_shot(int(v.few_shot), int(v.few_shot_updates), int(v.few_shot_rounds))
      for r in v.routers:
        single_round.make_router(r, **(router_kwargs or {}))
      config_overrides.apply(config_overrides.apply(config, v.train), v.evaluate)   # fail fast on bad keys
    self.config, self.study, self.variants = config, study, variants
    self.workdir = pathlib.Path(workdir)
    self.router_kwargs = router_kwargs or {}
    self.verbose = verbose
    self._systems: dict[tuple, Any] = {}
    self._optimum_shares: dict[tuple, dict] = {}   # (pool, seed) -> the optimum's LLM shares
    self._optimum_runs: dict[tuple, list] = {}     # (pool, seed) -> the optimum's final states

  def _system(self, cfg, key: tuple):
    if key not in self._systems:
      self._systems[key] = system_lib.build(cfg)
    return self._systems[key]

  def _log(self, msg: str) -> None:
    if self.verbose:
      progress_lib.note(msg)

  def run(self, seeds: list[int]) -> dict:
    # Every cell of a study workdir comes from one config; more seeds may be added later.
    # The drift study's settings (gp_jax/runs/studies/drift.py) do not change the other studies.
    drift_fields = tuple(f"study.{k}" for k in self.config.study if k.startswith("drift_"))
    # study.learner_combined only adds a variant (its overrides are recorded in its cells).
    workdir_config.check_or_record(self.workdir, self.config,
                                   ignore=("study.seeds", "study.learner_combined") + drift_fields,
                                   what=f"{self.study} study")
    t0 = time.time()
    ran, skipped = [], []
    total = sum(not (self.workdir / f"{v.name}_seed{seed}" / CELL_FILE).exists()
                for seed in seeds for v in self.variants)
    cells = (progress_lib.Progress(f"{self.study} study", total, unit="cells",
                                   eta_from_start=True)
             if self.verbose and total else None)
    for seed in seeds:
      for index, v in enumerate(self.variants):
        out = self.workdir / f"{v.name}_seed{seed}"
        if (out / CELL_FILE).exists():
          skipped.append((v.name, seed))
          continue
        out.mkdir(parents=True, exist_ok=True)
        self._log(f"[{self.study} study] cell {len(ran) + 1}/{total}: {v.name} seed={seed}")
        rec = dict(self.run_cell(v, seed), index=index)
        write_cell(out / CELL_FILE, rec)
        ran.append((v.name, seed))
        if cells is not None:
          cells.update(len(ran), last=f"{v.name} seed={seed}")
        r = {x["policy"]: x["reward"] for x in rec["rows"] if x["domain"] == "all"}
        opt = r.get("optimum (DP)", float("nan"))
        mine = r[f"{ROUTER}[{v.name}]"]
        self._log(f"[{self.study}] {v.name} seed={seed}: reward {mine:.3f} "
                  f"(optimum {opt:.3f}, ratio {mine / opt if opt else float('nan'):.3f}) "
                  f"{rec['seconds']:.0f}s")
    return dict(ran=ran, skipped=skipped, seconds=time.time() - t0)

  def run_cell(self, v: Variant, seed: int) -> dict:
    t0 = time.time()
    base = config_overrides.apply(self.config, {"seed": int(seed)})
    tcfg = config_overrides.apply(base, v.train)
    tsys = self._system(tcfg, ("train", variant_key(v.train), seed))
    tdir = self.workdir / "train" / f"{variant_key(v.train)}_seed{seed}"
    summary = training.train(tcfg, tdir, system=tsys, verbose=self.verbose)
    model, params, history = training.load_router(tcfg, tdir, tsys)
    ecfg = config_overrides.apply(tcfg, v.evaluate)
    ekey = ("eval", variant_key(v.train), variant_key(v.evaluate), seed)
    esys = self._system(ecfg, ekey) if v.evaluate else tsys
    model = garnet.for_action_space(model, esys.space)   # a factored head counts LLMs per role
    hist = history_for(tcfg, history)
    if hist is not None and not same_space(esys.space, tsys.space):
      hist = remap_history(hist, tsys.space, esys.space)
    if v.history == "none":
      hist = None
    t_eval = time.time()
    if v.few_shot:
      params = few_shot_update(ecfg, esys, model, params, hist, int(v.few_shot), seed,
                               updates=int(v.few_shot_updates), rounds=int(v.few_shot_rounds))
    alpha = float(tcfg.alpha)
    env = esys.env(alpha)
    states = evaluation.run_router(esys, env, model, params, hist, esys.test_queries,
                                   parallel=int(ecfg.train.parallel), seed=seed)
    rows = evaluation.summarize(f"{ROUTER}[{v.name}]", esys, env, esys.test_queries, states)
    if v.split_agreement and esys.simulated:
      rows = evaluation.with_split_agreement(rows, f"{ROUTER}[{v.name}]", esys.test_queries,
                                             states, self._optimum_run(esys, alpha, seed))
    rows = [dataclasses.asdict(r) for r in rows]
    rows += self._reference(ecfg, esys, tsys, v, seed, alpha)
    return dict(study=self.study, variant=v.name, seed=seed, alpha=alpha,
                simulated=esys.simulated, train_overrides=v.train,
                eval_overrides=v.evaluate, history=v.history, few_shot=v.few_shot,
                few_shot_updates=v.few_shot_updates, few_shot_rounds=v.few_shot_rounds,
                held_out=list(v.held_out),
                held_out_share=self._held_out_share(esys, states, v, seed, alpha),
                llms=list(esys.space.llms), roles=[r.name for r in esys.space.roles.roles],
                n_test=len(esys.test_queries), shares=action_shares(esys, states),
                train=dict(episodes=summary["episodes"], seconds=train_seconds(tdir),
                           final_return=training_return_tail(tdir)),
                eval_seconds=time.time() - t_eval, seconds=time.time() - t0, rows=rows)

  def _optimum_run(self, esys, alpha: float, seed: int) -> list:
    """The DP optimum's final states on the evaluation system's test queries, cached per pool,
    test queries and seed."""
    key = (tuple(esys.space.llms), tuple(q.qid for q in esys.test_queries), seed)
    if key not in self._optimum_runs:
      self._optimum_runs[key] = optimum_states(esys, alpha, seed)
    return self._optimum_runs[key]

  def _held_out_share(self, esys, states, v: Variant, seed: int, alpha: float) -> dict | None:
    """{router, optimum}: share of each one's calls made with the variant's held-out LLMs (the
    optimum's run cached per evaluation system and seed; optimum None off the simulator, where
    there is no exact optimum); None without held-out LLMs."""
    if not v.held_out:
      return None
    unknown = [m for m in v.held_out if m not in esys.space.llms]
    if unknown:
      raise errors.ConfigError(f"variant {v.name}: held-out LLMs {unknown} are not in its "
                               "evaluation pool")
    router = action_shares(esys, states)["llm"]
    share = dict(router=sum(router.get(m, 0.0) for m in v.held_out), optimum=None)
    if not esys.simulated:
      return share
    key = (tuple(esys.space.llms), tuple(q.qid for q in esys.test_queries), seed)
    if key not in self._optimum_shares:
      self._optimum_shares[key] = action_shares(esys, self._optimum_run(esys, alpha, seed))["llm"]
    share["optimum"] = sum(self._optimum_shares[key].get(m, 0.0) for m in v.held_out)
    return share

  def _reference(self, ecfg, esys, tsys, v: Variant, seed: int, alpha: float) -> list[dict]:
    """Random, single-LLM and optimum rows of an evaluation system (cached per system and seed),
    plus the variant's single-round routers fitted on the training system's queries."""
    ref_dir = self.workdir / "reference"
    ref_dir.mkdir(parents=True, exist_ok=True)
    # Everything the reference rows depend on: the evaluation system, not the router.
    key = variant_key(dict(llms=ecfg.llms, roles=ecfg.roles, mdp=ecfg.mdp.to_dict(),
                    data=ecfg.data.to_dict(), alpha=ecfg.alpha, catalog=ecfg.catalog_file,
                    reward=ecfg.train.reward))
    path = ref_dir / f"{key}_seed{seed}.json"
    if path.exists():
      rows = json.loads(path.read_text())["rows"]
    else:
      rows = [dataclasses.asdict(r) for r in evaluation.evaluate(
          esys, alpha, router=None, baselines=True, optimum=esys.simulated,
          parallel=int(ecfg.train.parallel), seed=seed, progress=self.verbose)]
      write_cell(path, dict(rows=rows))
    if v.routers:
      if tuple(esys.space.llms) != tuple(tsys.space.llms):
        raise errors.ConfigError(f"variant {v.name}: single-round routers need the training LLMs")
      data = labels_lib.collect(tsys, tsys.train_queries, seed=seed)
      fitted = single_round.fit_routers(list(v.routers), data, tsys.catalog,
                                        **dict(self.router_kwargs, seed=seed))
      r_rows, _ = single_round.evaluate_routers(esys, alpha, fitted, esys.test_queries, seed=seed)
      rows += [dataclasses.asdict(r) for r in r_rows]
    return rows
