"""Graph Counselor benchmark: Retrieve latency on 10k- and 100k-node graphs, and the agents loop's
own overhead per step (LLM time excluded).

  python benchmarks/bench_counselor.py                      # 10k and 100k, hashing encoder
  python benchmarks/bench_counselor.py --sizes=10k --encoder=minilm

For each size: graph generation time, index build time (embedding every node's main text),
Retrieve latency for one keyword per call (p50 / p95, encoding + jitted top-k + exact-text check,
the per-keyword memo bypassed), per-keyword time in batches of 64, and the jitted top-k alone.
The loop overhead runs Graph Counselor with the oracle backend (which answers instantly) on the
generated questions, after a warm-up run and with the Retrieve memo emptied: overhead per step =
(wall time - time inside LLM calls) / Plan-Thought-Action-Observation steps; it covers prompt
building, token counting, parsing, graph functions (Retrieve included) and observation rendering.
"""
import asyncio
import statistics
import time

import jax
import numpy as np
from absl import app
from absl import flags

from gp_jax.counselor.agents import loop as agents
from gp_jax.counselor.agents import records
from gp_jax.counselor.kg import functions
from gp_jax.counselor.kg import retrieval
from gp_jax.counselor.synth import generator
from gp_jax.counselor.synth import oracle
from gp_jax.llm import catalog as catalog_lib
from gp_jax.text import encoder as encoder_lib

_SIZES = flags.DEFINE_list("sizes", ["10k", "100k"], "Graph sizes (names or node counts).")
_DOMAIN = flags.DEFINE_string("domain", "academic", "Generated domain.")
_ENCODER = flags.DEFINE_string("encoder", "hashing", "Text encoder name.")
_QUERIES = flags.DEFINE_integer("queries", 200, "Single-keyword Retrieve calls timed.")
_PER_TEMPLATE = flags.DEFINE_integer("per_template", 4, "Questions per template for the loop run.")
_SEED = flags.DEFINE_integer("seed", 0, "Generator seed.")


def _pct(xs, q):
  return float(np.percentile(np.asarray(xs), q))


def bench_size(size: str, encoder, catalog) -> None:
  t0 = time.perf_counter()
  graph, questions = generator.generate_dataset(_DOMAIN.value, size, _SEED.value,
                                                _PER_TEMPLATE.value)
  t_gen = time.perf_counter() - t0
  retrieval.clear_cache()
  t0 = time.perf_counter()
  funcs = functions.make_functions(graph, encoder)
  jax.block_until_ready(funcs.index.matrix_t)
  t_index = time.perf_counter() - t0
  print(f"\n== {_DOMAIN.value} {size}: {len(graph)} nodes, {graph.num_edges()} neighbour entries, "
        f"{len(questions)} questions")
  print(f"generate graph + questions  {t_gen:8.2f} s")
  print(f"build index ({encoder.name})  {t_index:8.2f} s  (matrix [dim, n] {funcs.index.matrix_t.shape})")

  rng = np.random.default_rng(1)
  texts = [graph.text(graph.ids[i]) for i in rng.integers(len(graph), size=_QUERIES.value)]
  funcs.index.search(texts[:1], memo=False)  # compile the single-query bucket
  lat = []
  hits = 0
  for t in texts:
    t1 = time.perf_counter()
    nid = funcs.index.search([t], memo=False)[0]
    lat.append(time.perf_counter() - t1)
    hits += graph.text(nid) == t
  print(f"Retrieve, 1 keyword/call   p50 {1e3 * _pct(lat, 50):7.3f} ms   p95 "
        f"{1e3 * _pct(lat, 95):7.3f} ms   (exact node found {hits}/{len(texts)})")
  batch = texts[:64]
  funcs.index.search(batch, memo=False)  # compile the 64 bucket
  reps = []
  for _ in range(10):
    t1 = time.perf_counter()
    funcs.index.search(batch, memo=False)
    reps.append(time.perf_counter() - t1)
  print(f"Retrieve, 64 keywords/call  {1e3 * statistics.median(reps) / 64:7.3f} ms per keyword "
        f"({1e3 * statistics.median(reps):.2f} ms per call)")
  q1 = np.asarray(encoder.encode(texts[:1]), np.float32)
  jax.block_until_ready(retrieval.top_k_inner_product(funcs.index.matrix_t, q1, funcs.index.k))
  reps = []
  for _ in range(50):
    t1 = time.perf_counter()
    jax.block_until_ready(retrieval.top_k_inner_product(funcs.index.matrix_t, q1, funcs.index.k))
    reps.append(time.perf_counter() - t1)
  print(f"jitted top-{funcs.index.k} alone (1 query)   p50 {1e3 * _pct(reps, 50):7.3f} ms "
        f"on {jax.devices()[0].platform}")

  pool = oracle.OraclePool.from_questions(catalog, questions)
  select = records.fixed_selector(catalog.names[0])

  async def run_all():
    return [await agents.run_counselor(q.question, funcs=funcs, pool=pool, select_llm=select,
                                       qid=q.qid) for q in questions]
  asyncio.run(run_all())  # warm-up (compiles the remaining query buckets)
  funcs.index.clear_memo()
  t1 = time.perf_counter()
  results = asyncio.run(run_all())
  wall = time.perf_counter() - t1
  llm = sum(r.llm_latency_s for r in results)
  steps = sum(r.n_steps for r in results)
  calls = sum(r.n_calls for r in results)
  correct = sum(r.final_answer == q.answer for r, q in zip(results, questions))
  print(f"agents loop: {len(results)} questions, {steps} steps, {calls} LLM calls, "
        f"{correct}/{len(results)} answered exactly")
  print(f"loop overhead per step (LLM time excluded)  {1e3 * (wall - llm) / steps:7.3f} ms   "
        f"(wall {wall:.2f} s, inside the stand-in LLM {llm:.3f} s)")


def main(argv):
  del argv
  catalog = catalog_lib.load_catalog()
  encoder = encoder_lib.make_encoder(_ENCODER.value)
  print(f"devices: {jax.devices()}")
  for size in _SIZES.value:
    bench_size(size, encoder, catalog)


if __name__ == "__main__":
  app.run(main)
