"""The llmrouter stage (scripts/llmrouter_tests.sh): a route log exported by
`experiments.export_routes` trains LLMRouter's own routers.

The route log is written by the server's route-log writer: three kinds of queries (algebra,
Python code, geography), each served by three LLMs as passthrough requests, with feedback 1 for
the LLM that is right on that kind and 0 for the others. The export (rows, embeddings, LLM
descriptions) is converted to LLMRouter's .pt by scripts/llmrouter_convert.py, and
tests/llmrouter/llmrouter_train.py trains LLMRouter's KNN, MLP and hybrid routers on two thirds of
the queries in the LLMRouter venv and routes all of them.
"""
import json
import os
import pathlib
import subprocess
import sys

import pytest

from gp_jax import paths
from tests.util import route_log

pytestmark = pytest.mark.llmrouter

PYTHON_ENV = "GP_JAX_LLMROUTER_PYTHON"
SMALL, MID, LARGE = "qwen2.5-7b-instruct", "llama-3.1-8b-instruct", "llama3-chatqa-1.5-70b"
# kind -> (the LLM that is right on it, query texts)
KINDS = {
    "algebra": (SMALL, [f"Solve the equation {a}x + {b} = {c} for x and show each algebra step."
                        for a, b, c in ((2, 3, 11), (5, 1, 26), (3, 7, 22), (4, 4, 24), (6, 2, 32),
                                        (7, 5, 40), (8, 3, 35), (9, 1, 46), (2, 9, 19))]),
    "code": (MID, [f"Write a Python function {name} that takes a list and returns its {what}; "
                   f"include a docstring and a unit test."
                   for name, what in (("total", "sum"), ("biggest", "largest item"),
                                      ("rev", "reverse"), ("uniq", "distinct items"),
                                      ("evens", "even numbers"), ("avg", "mean"),
                                      ("first", "first item"), ("last", "last item"),
                                      ("count", "length"))]),
    "geography": (LARGE, [f"Which country has {city} as its capital city, and what river or coast "
                          f"is the capital city on?"
                          for city in ("Lima", "Hanoi", "Accra", "Oslo", "Quito", "Rabat",
                                       "Riga", "Doha", "Lusaka")]),
}
HELD_OUT = 3   # the last queries of each kind are not trained on


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
  p = subprocess.run(cmd, cwd=paths.REPO_ROOT, capture_output=True, text=True, **kw)
  assert p.returncode == 0, f"{cmd[:3]} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
  return p


def test_exported_route_log_trains_llmrouter_routers(tmp_path):
  python = os.environ.get(PYTHON_ENV)
  assert python, f"{PYTHON_ENV} is unset: run this stage with `bash scripts/llmrouter_tests.sh`"
  served = [(kind, q, llm, float(llm == right))
            for kind, (right, queries) in KINDS.items() for q in queries
            for llm in (SMALL, MID, LARGE)]
  served += [("algebra", "an unscored request", SMALL, None)]
  log = route_log.passthrough_log(tmp_path / "routes.jsonl", served)

  rows, emb, llms = tmp_path / "rows.jsonl", tmp_path / "emb.npy", tmp_path / "llms.json"
  _run([sys.executable, "-m", "experiments.export_routes", f"--route_log={log}", f"--out={rows}",
        f"--embeddings={emb}", f"--llm_data={llms}"], env=paths.child_env(), timeout=300)
  table = [json.loads(line) for line in rows.read_text().splitlines()]
  assert len(table) == 3 * sum(len(q) for _, q in KINDS.values())   # the unscored one left out
  _run([python, "scripts/llmrouter_convert.py", str(emb), str(tmp_path / "emb.pt")], timeout=300)

  held_out = {q for _, queries in KINDS.values() for q in queries[-HELD_OUT:]}
  train = tmp_path / "train.jsonl"
  train.write_text("".join(json.dumps(r) + "\n" for r in table if r["query"] not in held_out))
  queries = [q for _, qs in KINDS.values() for q in qs]
  right = [llm for llm, qs in KINDS.values() for _ in qs]
  (tmp_path / "queries.json").write_text(json.dumps(queries))
  (tmp_path / "work").mkdir()
  out = tmp_path / "routed.json"
  _run([python, "tests/llmrouter/llmrouter_train.py", f"--train={train}", f"--rows={rows}",
        f"--embeddings={tmp_path / 'emb.pt'}", f"--llm_data={llms}",
        f"--queries={tmp_path / 'queries.json'}", f"--workdir={tmp_path / 'work'}",
        f"--out={out}"], timeout=600)
  routed = json.loads(out.read_text())

  for name in ("knnrouter", "mlprouter"):
    picks = routed[name]
    assert set(picks) <= {SMALL, MID, LARGE}, (name, picks)
    hits = [p == r for p, r, q in zip(picks, right, queries) if q in held_out]
    # Chance is 1/3 on the held-out queries; the routers learnt which LLM is right on each kind.
    assert sum(hits) >= 0.75 * len(hits), (name, picks)
  # The hybrid router routes between the smallest and the largest LLM of --llm_data: the small
  # one where it scores at least as well as the large one (algebra, code), else the large one.
  expected = [LARGE if r == LARGE else SMALL for r in right]
  hits = [p == e for p, e in zip(routed["hybrid_llm"], expected)]
  assert sum(hits) >= 0.75 * len(hits), routed["hybrid_llm"]
