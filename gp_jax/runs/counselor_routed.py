"""The routed Graph Counselor experiment: a trained router vs fixed LLMs for the agents.

Per seed s: the questions are shuffled with s and split into n_train training and n_test test
questions; a router (gp_jax/counselor/routing/router.py, on GraphPlanner's machinery) is trained
with PPO on the training questions against the simulated counselor backend
(counselor/synth/sim_pool.py, draws seeded from s). Two fixed baselines:
  - Graph Counselor with each single LLM for all five agent kinds;
  - the per-kind table: one LLM per agent kind (plan, thought, action, judge, reflect), the table
    found by coordinate ascent on the training questions (start from the best single LLM there,
    then per kind the LLM of the best reward with the others held, `table_passes` passes) -- the
    best static router the training data shows.
Then the routed counselor (greedy), the table and every single LLM answer the test questions on
one evaluation pool (same seed for every method). Per method: mean exact match, mean $ per
question, calls per question, and the reward U - alpha * C (C in milli-dollars).

Each finished seed is written to <workdir>/seeds/seed_<s>.json with the experiment's settings;
a rerun skips those seeds (and refuses a workdir holding results of other settings), then writes
<workdir>/results.json and <workdir>/results.md: per method the mean over seeds with its 95%
t-interval (gp_jax.stats), and the paired per-seed differences of the routed counselor's reward
to the best single LLM and to the per-kind table (best by mean test reward, chosen after the
fact), with their intervals.

`run_from_config` is what experiments/counselor_routed.py calls with its ml_collections config
(experiments/configs/counselor_routed.py); `run` takes the settings as an ExperimentConfig.
"""
from __future__ import annotations

import asyncio
import dataclasses
import math
import pathlib
import time
from typing import Callable, Sequence

import numpy as np

from gp_jax import config_lists
from gp_jax import errors
from gp_jax import files
from gp_jax import stats
from gp_jax.counselor.agents import records
from gp_jax.counselor.eval import metrics
from gp_jax.counselor.kg import data as data_lib
from gp_jax.counselor.kg import functions as functions_lib
from gp_jax.counselor.kg import graph_store
from gp_jax.counselor.routing.features import KINDS
from gp_jax.counselor.synth import generator
from gp_jax.counselor.synth import sim_pool as sim_pool_lib
from gp_jax.llm import catalog as catalog_lib
from gp_jax.sim import simulator
from gp_jax.text import encoder as encoder_lib
from gp_jax.workflow import reward as reward_lib

ROUTED = "routed"
TABLE = "per-kind table"
METRICS = ("em", "cost_usd_per_q", "calls_per_q", "reward")
SEARCH_POOL_SEED = 2_000_003   # + seed: the draws of the table search on the training questions
EVAL_POOL_SEED = 1_000_003     # + seed: the draws of the test evaluation


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
  """Everything that decides a seed's numbers (the workdir fingerprint)."""
  domain: str = "academic"
  size: str = "small"
  graph_seed: int = 0
  per_template: int = 20
  graph: str = ""               # a GRBench graph.json instead of a generated one
  questions: str = ""           # its questions (with gold plans)
  n_train: int = 150
  n_test: int = 70
  llms: tuple[str, ...] = ()    # () = the catalog's training LLMs
  catalog: str = ""
  alpha: float = 0.05
  episodes: int = 3200
  batch_questions: int = 32
  learning_rate: float = 1e-3
  entropy_coef: float = 0.02
  gae_lambda: float = 0.8
  max_steps: int = 10
  max_reflect: int = 2
  skill_domain: str = sim_pool_lib.SKILL_DOMAIN
  skill_scale: float = sim_pool_lib.SKILL_SCALE
  encoder: str = "hashing"
  table_passes: int = 2         # coordinate-ascent passes of the per-kind table baseline

  def validate(self) -> "ExperimentConfig":
    if not (math.isfinite(self.alpha) and self.alpha >= 0):
      raise errors.ConfigError(f"config.alpha must be a finite number >= 0, got {self.alpha}")
    if self.n_train < 1 or self.n_test < 1:
      raise errors.ConfigError(f"config.data.n_train and config.data.n_test must be >= 1, got "
                               f"{self.n_train}, {self.n_test}")
    if self.episodes < 1 or self.batch_questions < 1 or self.per_template < 1:
      raise errors.ConfigError("config.train.episodes, config.train.batch_questions and "
                               "config.data.per_template must be >= 1")
    if self.table_passes < 1:
      raise errors.ConfigError(f"config.table_passes must be >= 1, got {self.table_passes}")
    if self.max_steps < 1 or self.max_reflect < 0:
      raise errors.ConfigError("config.counselor.max_steps must be >= 1 and "
                               "config.counselor.max_reflect >= 0")
    if bool(self.graph) != bool(self.questions):
      raise errors.ConfigError("config.data.graph and config.data.questions go together")
    if not self.graph and self.domain not in generator.DOMAINS:
      raise errors.unknown_name("domain", self.domain, generator.DOMAINS)
    if len(set(self.llms)) != len(self.llms):
      raise errors.ConfigError(f"config.llms names an LLM twice: {list(self.llms)}")
    return self

  def to_json(self) -> dict:
    d = dataclasses.asdict(self)
    d["llms"] = list(self.llms)
    return d


def load_catalog(cfg: ExperimentConfig) -> catalog_lib.Catalog:
  """The catalog restricted to the experiment's LLMs (unknown names: ConfigError)."""
  full = catalog_lib.load_catalog(cfg.catalog) if cfg.catalog else catalog_lib.load_catalog()
  names = list(cfg.llms) or catalog_lib.training_names(full)
  return full.select(names)


def load_data(cfg: ExperimentConfig) -> tuple[graph_store.KnowledgeGraph,
                                              list[data_lib.GraphQuestion]]:
  if cfg.graph:
    return graph_store.load_graph(cfg.graph), data_lib.load_questions(cfg.questions)
  return generator.generate_dataset(cfg.domain, cfg.size, cfg.graph_seed, cfg.per_template)


def split(questions: Sequence[data_lib.GraphQuestion], cfg: ExperimentConfig, seed: int):
  if cfg.n_train + cfg.n_test > len(questions):
    raise errors.ConfigError(f"config.data.n_train + n_test = {cfg.n_train + cfg.n_test} exceeds "
                             f"the {len(questions)} questions (raise config.data.per_template or "
                             "config.data.size)")
  perm = np.random.default_rng([seed, 11]).permutation(len(questions))
  train = [questions[i] for i in perm[:cfg.n_train]]
  test = [questions[i] for i in perm[cfg.n_train:cfg.n_train + cfg.n_test]]
  return train, test


def counselor_settings(cfg: ExperimentConfig) -> dict:
  return {"max_steps": cfg.max_steps, "max_reflect": cfg.max_reflect}


def score_results(test, results, alpha: float) -> dict:
  """Mean EM, $ per question, calls per question and reward of one method's test results."""
  em = [metrics.exact_match(r.final_answer, q.answer) for q, r in zip(test, results)]
  cost = [r.cost_usd for r in results]
  return {"em": float(np.mean(em)), "cost_usd_per_q": float(np.mean(cost)),
          "calls_per_q": float(np.mean([r.n_calls for r in results])),
          "reward": float(np.mean(em) - alpha * reward_lib.cost_units(float(np.mean(cost))))}


def run_seed(cfg: ExperimentConfig, seed: int, *, concurrency: int = 8,
             log: Callable[[str], None] = print) -> dict:
  """Trains and evaluates one seed; returns its JSON record (module docstring)."""
  from gp_jax.counselor.routing import router as routing  # JAX: imported only when a seed runs

  t0 = time.perf_counter()
  catalog = load_catalog(cfg)
  graph, questions = load_data(cfg)
  train_q, test_q = split(questions, cfg, seed)
  enc = encoder_lib.make_encoder(cfg.encoder)
  funcs = functions_lib.make_functions(graph, enc)
  pool = sim_pool_lib.SimCounselorPool(catalog, questions, seed=seed,
                                       skill_domain=cfg.skill_domain, skill_scale=cfg.skill_scale)
  settings = counselor_settings(cfg)
  router = routing.make_router(
      catalog=catalog, llms=catalog.names, encoder=enc, seed=seed, counselor_settings=settings,
      cfg=routing.RouterConfig(ppo=dataclasses.replace(
          routing.DEFAULT_PPO, learning_rate=cfg.learning_rate, entropy_coef=cfg.entropy_coef,
          gae_lambda=cfg.gae_lambda)))
  log(f"seed {seed}: {len(graph)} nodes, {len(train_q)} train / {len(test_q)} test questions, "
      f"{len(catalog)} LLMs; training {cfg.episodes} episodes")
  t1 = time.perf_counter()
  state, history = routing.train(
      router, routing.init_state(router, seed), train_q, funcs=funcs, pools=pool.with_seed,
      counselor_settings=settings,
      settings=routing.TrainSettings(alpha=cfg.alpha, episodes=cfg.episodes,
                                     batch_questions=cfg.batch_questions, concurrency=concurrency),
      seed=seed, log=log)
  train_s = time.perf_counter() - t1
  t2 = time.perf_counter()
  table, searched = best_table(train_q, catalog.names, funcs=funcs,
                               pool=pool.with_seed(SEARCH_POOL_SEED + seed),
                               counselor_settings=settings, alpha=cfg.alpha,
                               passes=cfg.table_passes, concurrency=concurrency)
  search_s = time.perf_counter() - t2
  log(f"seed {seed}: per-kind table {table} ({searched} tables tried on the training questions, "
      f"{search_s:.0f}s)")
  eval_pool = pool.with_seed(EVAL_POOL_SEED + seed)
  methods = {}
  t3 = time.perf_counter()
  selector = routing.selector(router, state.params)
  selectors = ([(ROUTED, selector), (TABLE, table_selector(table))]
               + [(m, records.fixed_selector(m)) for m in catalog.names])
  for name, sel in selectors:
    results = asyncio.run(routing.run_episodes(test_q, select_llm=sel, funcs=funcs, pool=eval_pool,
                                               counselor_settings=settings,
                                               concurrency=concurrency))
    methods[name] = score_results(test_q, results, cfg.alpha)
  eval_s = time.perf_counter() - t3
  r = methods[ROUTED]
  log(f"seed {seed}: routed EM {r['em']:.3f}, $/q {r['cost_usd_per_q']:.5f}; train {train_s:.0f}s, "
      f"table search {search_s:.0f}s, eval {eval_s:.0f}s")
  stride = max(1, len(history) // 20)
  return {"seed": seed, "config": cfg.to_json(), "methods": methods,
          "routed_choices": selector.choices, "table": table,
          "train_log": history[::stride] + ([history[-1]] if (len(history) - 1) % stride else []),
          "train_s": train_s, "search_s": search_s, "eval_s": eval_s,
          "wall_s": time.perf_counter() - t0}


def best_table(questions: Sequence[data_lib.GraphQuestion], llms: Sequence[str], *, funcs, pool,
               counselor_settings: dict, alpha: float, passes: int, concurrency: int = 8
               ) -> tuple[dict[str, str], int]:
  """The per-kind table {agent kind: LLM} of the best reward on `questions`, by coordinate ascent:
  the best single LLM first, then, `passes` times over the kinds (fewer when a pass changes
  nothing), each kind's LLM replaced by the one of the best reward with the others held (only a
  strictly better reward replaces it). Returns (the table, the number of tables evaluated)."""
  from gp_jax.counselor.routing import router as routing
  rewards: dict[tuple[str, ...], float] = {}

  def reward(table: tuple[str, ...]) -> float:
    if table not in rewards:
      select = table_selector(dict(zip(KINDS, table)))
      results = asyncio.run(routing.run_episodes(questions, select_llm=select, funcs=funcs,
                                                 pool=pool, counselor_settings=counselor_settings,
                                                 concurrency=concurrency))
      rewards[table] = score_results(questions, results, alpha)["reward"]
    return rewards[table]

  current = max(((m,) * len(KINDS) for m in llms), key=reward)
  for _ in range(passes):
    changed = False
    for i in range(len(KINDS)):
      best = max((current[:i] + (m,) + current[i + 1:] for m in llms), key=reward)
      if reward(best) > reward(current):
        current, changed = best, True
    if not changed:
      break
  return dict(zip(KINDS, current)), len(rewards)


def table_selector(table: dict[str, str]) -> records.LLMSelector:
  """The fixed selector of a per-kind table (the one-shot 'answer' kind, never called by the
  counselor loop, takes the action agent's LLM)."""
  return records.fixed_selector(dict(table, default=table["action"]))


def _interval(xs: Sequence[float]) -> dict:
  """mean, sample std and 95% t half-width (None below two seeds) of per-seed values."""
  mean, std, n = stats.mean_std(xs)
  half = stats.ci95(xs)[1]
  return {"mean": mean, "std": std, "ci95": None if math.isnan(half) else half, "n": n}


def aggregate(cfg: ExperimentConfig, runs: Sequence[dict]) -> dict:
  """Per method and metric the mean over seeds with its 95% interval, and the routed
  counselor's paired per-seed differences to the best single LLM and to the per-kind table."""
  names = list(runs[0]["methods"])
  out = {name: {key: _interval([r["methods"][name][key] for r in runs]) for key in METRICS}
         for name in names}
  singles = [k for k in names if k not in (ROUTED, TABLE)]
  best_single = max(singles, key=lambda k: out[k]["reward"]["mean"])
  differences = {}
  for label, other in (("best_single", best_single), ("table", TABLE)):
    differences[label] = {"method": other, **{
        key: _interval([r["methods"][ROUTED][key] - r["methods"][other][key] for r in runs])
        for key in ("em", "reward")}}
  choices: dict[str, dict[str, int]] = {}
  for r in runs:
    for kind, counts in r["routed_choices"].items():
      for m, n in counts.items():
        choices.setdefault(kind, {})[m] = choices.setdefault(kind, {}).get(m, 0) + n
  return {"config": cfg.to_json(), "seeds": [r["seed"] for r in runs], "methods": out,
          "differences": differences, "tables": {str(r["seed"]): r["table"] for r in runs},
          "routed_choices": choices,
          "wall_s_per_seed": float(np.mean([r["wall_s"] for r in runs]))}


def _pm(x: dict, scale: float = 1.0, digits: int = 1, sign: bool = False) -> str:
  """'mean ± 95% half-width' (the mean alone for one seed)."""
  fmt = f"{{:{'+' if sign else ''}.{digits}f}}"
  text = fmt.format(x["mean"] * scale)
  return text if x["ci95"] is None else f"{text} ± {x['ci95'] * scale:.{digits}f}"


def markdown(summary: dict) -> str:
  """The results table (routed, the per-kind table, then the single LLMs by $ per question), the
  paired differences and the routed counselor's choices."""
  cfg = summary["config"]
  m = summary["methods"]
  firsts = [ROUTED, TABLE]
  order = firsts + sorted((k for k in m if k not in firsts),
                          key=lambda k: m[k]["cost_usd_per_q"]["mean"])
  seeds = summary["seeds"]
  spread = ("mean ± half-width of the 95% t-interval over seeds" if len(seeds) > 1
            else "one seed: no interval")
  lines = [f"Routed Graph Counselor vs fixed LLMs for the agents: "
           f"{cfg['domain'] if not cfg['graph'] else cfg['graph']}"
           f" graph, {cfg['n_train']} train / {cfg['n_test']} test questions, alpha = "
           f"{cfg['alpha']}, {cfg['episodes']} training episodes, seeds {seeds} "
           f"({spread}; simulated counselor backend).", "",
           "| method | EM (%) | $ per 1k questions | calls / question | U - alpha C |",
           "|---|---|---|---|---|"]
  for k in order:
    label = f"**{k}**" if k == ROUTED else k
    lines.append(f"| {label} | {_pm(m[k]['em'], 100)} | {_pm(m[k]['cost_usd_per_q'], 1000, 2)} | "
                 f"{_pm(m[k]['calls_per_q'])} | {_pm(m[k]['reward'], 1, 3)} |")
  lines += ["", "Routed minus a reference, paired by seed (the best single LLM is the one of the "
            "best mean test reward, chosen after the fact):", ""]
  for label, d in summary["differences"].items():
    what = (f"the best single LLM ({d['method']})" if label == "best_single"
            else "the per-kind table")
    lines.append(f"- vs {what}: EM {_pm(d['em'], 100, sign=True)} points, "
                 f"U - alpha C {_pm(d['reward'], 1, 3, sign=True)}")
  lines += ["", "Per-kind tables found on the training questions:", ""]
  for seed, table in summary["tables"].items():
    lines.append(f"- seed {seed}: " + ", ".join(f"{k} {v}" for k, v in table.items()))
  lines += ["", "Routed choices on the test questions (calls per agent kind and LLM, all seeds):", ""]
  for kind, counts in summary["routed_choices"].items():
    total = sum(counts.values())
    if total:
      parts = ", ".join(f"{mname} {100 * n / total:.0f}%" for mname, n in
                        sorted(counts.items(), key=lambda kv: -kv[1]))
      lines.append(f"- {kind}: {parts}")
  return "\n".join(lines) + "\n"


def run(cfg: ExperimentConfig, seeds: Sequence[int], workdir: str, *, concurrency: int = 8,
        log: Callable[[str], None] = print) -> dict:
  """Runs the missing seeds, then writes results.json and results.md; returns the summary."""
  cfg.validate()
  if not seeds:
    raise errors.ConfigError("config.seeds names no seed")
  if len(set(seeds)) != len(seeds):
    raise errors.ConfigError(f"config.seeds repeats a seed: {list(seeds)}")
  if concurrency < 1:
    raise errors.ConfigError(f"config.concurrency must be >= 1, got {concurrency}")
  if not workdir:
    raise errors.ConfigError("--workdir is required")
  catalog = load_catalog(cfg)  # unknown LLMs fail before any work
  profiles = simulator.load_profiles(catalog)
  for name, prof in profiles.items():
    if cfg.skill_domain not in prof.theta:
      raise errors.unknown_name("simulator domain", cfg.skill_domain, prof.theta)
  root = pathlib.Path(workdir)
  runs = []
  for seed in seeds:
    path = root / "seeds" / f"seed_{seed}.json"
    if path.exists():
      done = errors.read_json(path, "seed result")
      if done.get("config") != cfg.to_json():
        raise errors.ConfigError(f"{path} holds results of other settings; use another --workdir "
                                 "or delete it")
      log(f"seed {seed}: done already ({path})")
    else:
      done = run_seed(cfg, seed, concurrency=concurrency, log=log)
      files.write_json(path, done, "a seed's results")
    runs.append(done)
  summary = aggregate(cfg, runs)
  files.write_json(root / "results.json", summary, "the results")
  table = markdown(summary)
  files.write_lines(root / "results.md", table.rstrip("\n").split("\n"), "the results table")
  log(table)
  return summary


def parse_seeds(value) -> list[int]:
  """config.seeds ('0,1,2' or a sequence) as integers."""
  try:
    return [int(s) for s in config_lists.names(value)]
  except ValueError:
    raise errors.ConfigError(f"config.seeds must be comma-separated integers, got {value!r}"
                             ) from None


def experiment_config(config) -> ExperimentConfig:
  """The settings of config (experiments/configs/counselor_routed.py) that decide the numbers."""
  return ExperimentConfig(
      domain=str(config.data.domain), size=str(config.data.size),
      graph_seed=int(config.data.graph_seed), per_template=int(config.data.per_template),
      graph=str(config.data.graph), questions=str(config.data.questions),
      n_train=int(config.data.n_train), n_test=int(config.data.n_test),
      llms=config_lists.names(config.llms),
      catalog=str(config.catalog_file), alpha=float(config.alpha),
      episodes=int(config.train.episodes), batch_questions=int(config.train.batch_questions),
      learning_rate=float(config.ppo.learning_rate), entropy_coef=float(config.ppo.entropy_coef),
      gae_lambda=float(config.ppo.gae_lambda), max_steps=int(config.counselor.max_steps),
      max_reflect=int(config.counselor.max_reflect), skill_domain=str(config.sim.skill_domain),
      skill_scale=float(config.sim.skill_scale), encoder=str(config.text.encoder),
      table_passes=int(config.table_passes))


def run_from_config(config, workdir: str, *, log: Callable[[str], None] = print) -> dict:
  """`run` with the settings, seeds and concurrency of an ml_collections config."""
  return run(experiment_config(config), parse_seeds(config.seeds), workdir,
             concurrency=int(config.concurrency), log=log)
