"""The Graph Counselor experiment: data -> pool -> method -> scores, and the dataset generator.

`run_experiment` loads a GRBench graph and question file, builds the text encoder, the retrieval
index and the LLM pool, runs a method on every question, prints per-difficulty scores and writes
predictions as JSON lines; `generate` writes a generated dataset. experiments/counselor.py calls
them through `run_from_config` and `generate_from_config` with its ml_collections config
(experiments/configs/counselor.py). Pools:

  endpoints  OpenAI-compatible servers (vLLM, llama.cpp, ...) listed in an endpoints file
             (gp_jax/llm/openai_pool.py); every selected model must be served.
  oracle     a deterministic stand-in that follows the gold plans of generated questions
             (gp_jax/counselor/synth/oracle.py): a sanity check of the machinery, not a model.
"""
from __future__ import annotations

import asyncio
import pathlib
import time
from typing import Any, Callable, Mapping

from gp_jax import errors
from gp_jax import paths
from gp_jax.counselor.agents import records
from gp_jax.counselor.eval import harness
from gp_jax.counselor.kg import data as data_lib
from gp_jax.counselor.kg import functions as functions_lib
from gp_jax.counselor.kg import graph_store
from gp_jax.counselor.synth import generator
from gp_jax.counselor.synth import oracle as oracle_lib
from gp_jax.llm import base
from gp_jax.llm import catalog as catalog_lib
from gp_jax.text import encoder as encoder_lib

POOLS = ("endpoints", "oracle")
SAMPLE_DIR = paths.DATA_DIR / "counselor"  # committed tiny generated datasets, <domain>-tiny/


def parse_assignments(text: str, what: str) -> dict[str, str]:
  """'a=x,b=y' -> {'a': 'x', 'b': 'y'} (empty text -> {})."""
  out: dict[str, str] = {}
  for part in filter(None, (p.strip() for p in text.split(","))):
    key, sep, value = part.partition("=")
    if not sep or not key.strip() or not value.strip():
      raise errors.ConfigError(f"{what}: expected name=value pairs separated by ',', got {part!r}")
    out[key.strip()] = value.strip()
  return out


def make_selector(model: str, models: str | Mapping[str, str] = "") -> records.LLMSelector:
  """A fixed selector: `model` for every agent kind, overridden per kind by `models`
  ('plan=a,reflect=b' or a dict)."""
  table = parse_assignments(models, "config.models") if isinstance(models, str) else dict(models)
  if model:
    table.setdefault("default", model)
  return records.fixed_selector(table)


def build_pool(kind: str, *, catalog: catalog_lib.Catalog,
               questions: list[data_lib.GraphQuestion], endpoints_file: str = "",
               needed_models: set[str] = frozenset()) -> base.LLMPool:
  """The LLM pool named by `kind` (see the module docstring).

  Raises:
    ConfigError: unknown kind, missing endpoints file flag, models the pool cannot serve, oracle
      on questions without gold plans, or the OpenAI-compatible pool module missing.
    BackendError / DataError: unreachable servers, malformed endpoints file.
  """
  if kind not in POOLS:
    raise errors.unknown_name("pool", kind, POOLS)
  for m in needed_models:
    catalog[m]  # unknown model names: ConfigError listing the catalog
  if kind == "oracle":
    missing = [q.qid for q in questions if q.plan is None]
    if missing:
      raise errors.ConfigError(
          f"the oracle pool follows gold plans, but {len(missing)} question(s) have none (e.g. "
          f"{missing[0]!r}); use generated questions (--mode=generate) or config.pool=endpoints")
    return oracle_lib.OraclePool.from_questions(catalog, questions)
  if not endpoints_file:
    raise errors.ConfigError("config.pool=endpoints needs config.endpoints_file (written by "
                             "experiments/serve_backbones.py)")
  try:
    from gp_jax.llm import openai_pool  # optional: needs aiohttp and the backbones module
  except ImportError as e:
    raise errors.ConfigError(f"config.pool=endpoints needs the OpenAI-compatible pool "
                             f"(gp_jax/llm/openai_pool.py) and its dependencies: {e}") from None
  pool_cls = getattr(openai_pool, "OpenAIPool", None)
  if pool_cls is None:
    raise errors.ConfigError("gp_jax/llm/openai_pool.py defines no OpenAIPool")
  pool = pool_cls(catalog, endpoints_file, check=True)
  served = getattr(pool, "endpoints", None)
  if isinstance(served, Mapping):
    unserved = sorted(set(needed_models) - set(served))
    if unserved:
      raise errors.ConfigError(f"{endpoints_file}: no endpoint serves {unserved}; served: "
                               f"{', '.join(sorted(served))}")
  return pool


def _selected_models(select_llm: records.LLMSelector) -> set[str]:
  return set(getattr(select_llm, "table", {}).values())


def run_experiment(*, graph_path: str, questions_path: str, method: str = "counselor",
                   pool: str = "oracle", endpoints_file: str = "", catalog_path: str = "",
                   model: str = "", models: str = "", judge_model: str = "",
                   llm_judge: bool = True, encoder: str = "hashing", encoder_cache: str = "",
                   index_cache_dir: str = "", text_keys: str = "", on_dangling: str = "error",
                   limit: int = 0, concurrency: int = 8, out_path: str = "",
                   settings: Mapping[str, Any] | None = None,
                   log: Callable[[str], None] = print) -> dict[str, dict[str, float]]:
  """Runs one method on one graph and question file; see the module docstring.

  Args:
    graph_path: GRBench graph.json.
    questions_path: JSONL questions.
    method: one of evaluate.METHODS.
    pool: 'endpoints' or 'oracle'.
    endpoints_file: endpoints file for pool='endpoints'.
    catalog_path: LLM catalog JSON ('' = data/llm_pool.json).
    model: model for every agent kind ('' = the catalog's first model).
    models: per-kind overrides, 'plan=a,thought=b,...'.
    judge_model: model of the LLM-judge metric ('' = the model of the 'judge' agent kind).
    llm_judge: compute the LLM-judge metric.
    encoder: text encoder name (gp_jax.text.encoder registry).
    encoder_cache: SQLite file caching query embeddings ('' = memory only).
    index_cache_dir: folder caching node-embedding matrices ('' = memory only).
    text_keys: main text feature per node type, 'paper=title,author=name'.
    on_dangling: 'error' or 'drop' for neighbour ids that name no node.
    limit: first N questions only (0 = all).
    concurrency: questions in flight at once.
    out_path: predictions JSONL ('' = not written).
    settings: method settings (max_steps, max_reflect, prompt_token_budget, ...).
    log: where progress lines go.

  Returns:
    The per-level summary (evaluate.summarize).
  """
  _check_choices(method, pool, limit)
  catalog = catalog_lib.load_catalog(catalog_path) if catalog_path else catalog_lib.load_catalog()
  select_llm = make_selector(model or catalog.names[0], models)
  judge = (judge_model or select_llm.table["judge"]) if llm_judge else ""
  needed = _selected_models(select_llm) | ({judge} if judge else set())
  questions = data_lib.load_questions(questions_path)
  if limit:
    questions = questions[:limit]
  llm_pool = build_pool(pool, catalog=catalog, questions=questions, endpoints_file=endpoints_file,
                        needed_models=needed)
  funcs = _functions(graph_path, text_keys=text_keys, on_dangling=on_dangling, encoder=encoder,
                     encoder_cache=encoder_cache, index_cache_dir=index_cache_dir,
                     what=f"{len(questions)} questions; method {method}, pool {pool}", log=log)
  preds = _answer(questions, method=method, funcs=funcs, pool=llm_pool, select_llm=select_llm,
                  judge=judge, concurrency=concurrency, settings=settings or {}, log=log)
  summary = harness.summarize(preds)
  log(harness.format_summary(summary))
  if out_path:
    harness.write_predictions(preds, out_path)
    log(f"predictions written to {out_path}")
  return summary


def _check_choices(method: str, pool: str, limit: int) -> None:
  if method not in harness.METHODS:
    raise errors.unknown_name("method", method, harness.METHODS)
  if pool not in POOLS:
    raise errors.unknown_name("pool", pool, POOLS)
  if limit < 0:
    raise errors.ConfigError(f"config.limit must be >= 0, got {limit}")


def _functions(graph_path: str, *, text_keys: str, on_dangling: str, encoder: str,
               encoder_cache: str, index_cache_dir: str, what: str,
               log: Callable[[str], None]) -> functions_lib.GraphFunctions:
  """The graph functions (with the Retrieve index) over the graph file; logs its size."""
  t0 = time.perf_counter()
  graph = graph_store.load_graph(graph_path,
                                 text_keys=parse_assignments(text_keys, "config.data.text_keys"),
                                 on_dangling=on_dangling)
  enc = encoder_lib.make_encoder(encoder, cache_path=encoder_cache or None)
  funcs = functions_lib.make_functions(graph, enc, cache_dir=index_cache_dir or None)
  log(f"graph {graph_path}: {len(graph)} nodes, {graph.num_edges()} neighbour entries; index "
      f"({enc.name}) ready in {time.perf_counter() - t0:.1f}s; {what}")
  return funcs


def _answer(questions: list[data_lib.GraphQuestion], *, method: str,
            funcs: functions_lib.GraphFunctions, pool: base.LLMPool,
            select_llm: records.LLMSelector, judge: str, concurrency: int,
            settings: Mapping[str, Any], log: Callable[[str], None]
            ) -> list[harness.Prediction]:
  """The method's scored predictions on every question (progress every tenth); closes the pool."""
  done = [0]

  def progress(_):
    done[0] += 1
    if done[0] % max(1, len(questions) // 10) == 0 or done[0] == len(questions):
      log(f"  {done[0]}/{len(questions)} questions")

  async def go():
    try:
      return await harness.evaluate(
          questions, method=method, funcs=funcs, pool=pool, select_llm=select_llm,
          judge_model=judge or None, concurrency=concurrency, settings=settings,
          on_done=progress)
    finally:
      await pool.aclose()
  t0 = time.perf_counter()
  preds = asyncio.run(go())
  log(f"{method} on {len(preds)} questions in {time.perf_counter() - t0:.1f}s")
  return preds


def run_from_config(config, *, graph_path: str, questions_path: str, out_path: str = "",
                    log: Callable[[str], None] = print) -> dict[str, dict[str, float]]:
  """`run_experiment` with the settings of an ml_collections config
  (experiments/configs/counselor.py)."""
  return run_experiment(
      graph_path=graph_path, questions_path=questions_path, method=config.method,
      pool=config.pool, endpoints_file=config.endpoints_file, catalog_path=config.catalog_file,
      model=config.model, models=config.models, judge_model=config.judge_model,
      llm_judge=config.llm_judge, encoder=config.text.encoder, encoder_cache=config.text.cache,
      index_cache_dir=config.text.index_cache_dir, text_keys=config.data.text_keys,
      on_dangling="drop" if config.data.drop_dangling else "error", limit=config.limit,
      concurrency=config.concurrency, out_path=out_path, log=log,
      settings={"max_steps": config.agents.max_steps, "max_reflect": config.agents.max_reflect,
                "prompt_token_budget": config.agents.prompt_token_budget,
                "context_token_budget": config.agents.context_token_budget})


def generate(*, domain: str, size: str, seed: int, per_template: int, out_dir: str,
             log: Callable[[str], None] = print) -> tuple[pathlib.Path, pathlib.Path]:
  """Writes a generated graph.json and questions.jsonl into out_dir."""
  t0 = time.perf_counter()
  graph, questions = generator.generate_dataset(domain, size, seed, per_template)
  g, q = generator.write_dataset(out_dir, graph, questions)
  levels = {l: sum(x.level == l for x in questions) for l in data_lib.LEVELS}
  log(f"{domain}: {len(graph)} nodes, {graph.num_edges()} neighbour entries, {len(questions)} "
      f"questions {levels} in {time.perf_counter() - t0:.1f}s -> {g}, {q}")
  return g, q


def generate_from_config(config, out_dir: str, *, log: Callable[[str], None] = print
                         ) -> tuple[pathlib.Path, pathlib.Path]:
  """`generate` with the settings of config.generate (experiments/configs/counselor.py)."""
  g = config.generate
  return generate(domain=g.domain, size=g.size, seed=g.seed, per_template=g.per_template,
                  out_dir=out_dir, log=log)


async def sample_trial(pool: base.LLMPool, model: str, *, domain: str = "academic",
                       question_index: int = 0, max_steps: int = 3, max_reflect: int = 0,
                       judge: bool = True, encoder: str = "hashing") -> harness.Prediction:
  """One Graph Counselor run on a committed sample question, scored: the smoke test of a backend.

  Args:
    pool: any LLM pool (e.g. an OpenAIPool over a real vLLM server).
    model: catalog name used for every agent kind (and the LLM judge when `judge`).
    domain: which data/counselor/<domain>-tiny sample.
    question_index: which of its questions.
    max_steps, max_reflect: loop limits (small: tiny real models rarely finish).
    judge: also score with the LLM judge.
    encoder: text encoder for Retrieve.
  """
  folder = SAMPLE_DIR / f"{domain}-tiny"
  questions = data_lib.load_questions(folder / "questions.jsonl")
  if not 0 <= question_index < len(questions):
    raise errors.ConfigError(f"question_index must be in [0, {len(questions)}), got {question_index}")
  q = questions[question_index]
  funcs = functions_lib.make_functions(graph_store.load_graph(folder / "graph.json"),
                                       encoder_lib.make_encoder(encoder))
  result = await harness.run_method(
      "counselor", q.question, funcs=funcs, pool=pool, select_llm=records.fixed_selector(model),
      qid=q.qid, max_steps=max_steps, max_reflect=max_reflect, record_prompts=True)
  return await harness.score(q, result, pool=pool, judge_model=model if judge else None)
