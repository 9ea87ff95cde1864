"""experiments.export_routes's files for LLMRouter: embedding ids in the rows, the query embeddings
(.npy), the LLM descriptions (.json), and bad input (one `error:` line, exit 2, nothing written).
The route logs are written by the server's own route-log writer (tests/util/route_log.py)."""
import csv
import json
import subprocess
import sys

import numpy as np

from gp_jax import paths
from gp_jax.llm import catalog as catalog_lib
from gp_jax.serving.state import llmrouter_export
from gp_jax.text import encoder as encoder_lib
from tests.util import route_log

SMALL, LARGE = "qwen2.5-7b-instruct", "llama3-chatqa-1.5-70b"
Q1, Q2, Q3 = "How many moons does Mars have?", "Sort a list in Python.", "Plan: answer the question."


def _served_log(path):
  """Q1 served by two LLMs; a routed request whose planner reads a new text (Q3) and whose
  executor reads Q1 again; Q2 once; one request without feedback (left out of the export)."""
  routed = route_log.route("routed", "qa", Q1, [route_log.call("planner", LARGE, Q3),
                                               route_log.call("executor", SMALL, Q1, step=1)])
  return route_log.write(path, [
      (route_log.route("a", "qa", Q1, [route_log.call("passthrough", SMALL, Q1)]), 1.0),
      (route_log.route("b", "qa", Q1, [route_log.call("passthrough", LARGE, Q1)]), 0.0),
      (routed, 0.5),
      (route_log.route("c", "code", Q2, [route_log.call("passthrough", SMALL, Q2)]), 1.0),
      (route_log.route("d", "code", "never scored", [route_log.call("passthrough", SMALL, "x")]),
       None),
  ])


def _export(*flags):
  return subprocess.Popen([sys.executable, "-m", "experiments.export_routes", *flags],
                          cwd=paths.REPO_ROOT, env=paths.child_env(), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)


def _finish(proc) -> subprocess.CompletedProcess:
  out, err = proc.communicate(timeout=180)
  return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_embedding_ids_are_dense_in_first_seen_order_and_shared_by_equal_queries():
  rows, queries = llmrouter_export.with_embedding_ids(
      [dict(query=q, n=i) for i, q in enumerate(["b", "a", "b", "c", "a"])])
  assert [r["embedding_id"] for r in rows] == [0, 1, 0, 2, 1]
  assert queries == ["b", "a", "c"] and [r["n"] for r in rows] == [0, 1, 2, 3, 4]
  assert llmrouter_export.with_embedding_ids([]) == ([], [])


def test_export_writes_embedding_ids_embeddings_and_llm_descriptions(tmp_path):
  log = _served_log(tmp_path / "routes.jsonl")
  runs = [_export(f"--route_log={log}", f"--out={tmp_path / 'rows.jsonl'}", "--encoder_dim=64",
                  f"--embeddings={tmp_path / 'out' / 'emb.npy'}",
                  f"--llm_data={tmp_path / 'out' / 'llms.json'}"),
          _export(f"--route_log={log}", f"--out={tmp_path / 'rows.csv'}")]
  for run in map(_finish, runs):
    assert run.returncode == 0, run.stderr
  rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
  assert [(r["query"], r["model_name"], r["embedding_id"]) for r in rows] == [
      (Q1, SMALL, 0), (Q1, LARGE, 0), (Q3, LARGE, 1), (Q1, SMALL, 0), (Q2, SMALL, 2)]
  assert set(rows[0]) == set(llmrouter_export.FIELDS)
  matrix = np.load(tmp_path / "out" / "emb.npy")
  assert matrix.dtype == np.float32 and matrix.shape == (3, 64)   # one row per embedding_id
  np.testing.assert_array_equal(matrix, encoder_lib.HashingEncoder(64).encode([Q1, Q3, Q2]))
  with open(tmp_path / "rows.csv", newline="") as f:
    table = list(csv.DictReader(f))
  assert list(table[0]) == list(llmrouter_export.FIELDS)
  assert [int(r["embedding_id"]) for r in table] == [r["embedding_id"] for r in rows]
  llms = json.loads((tmp_path / "out" / "llms.json").read_text())
  catalog = catalog_lib.load_catalog()
  assert list(llms) == [SMALL, LARGE]
  assert llms[LARGE]["size"] == f"{catalog[LARGE].size_b:g}B" == "70B"
  assert llms[SMALL]["feature"] == catalog[SMALL].description
  assert llms[SMALL]["input_price"] == catalog[SMALL].price_in


def test_bad_input_is_one_error_line_exit_2_and_writes_nothing(tmp_path):
  log = _served_log(tmp_path / "routes.jsonl")
  (tmp_path / "a_file").write_text("x\n")
  (tmp_path / "folder.npy").mkdir()
  catalog = tmp_path / "catalog.json"
  catalog.write_text(json.dumps({"llms": [dict(name=SMALL, size_b=7, price_in=0.2, price_out=0.2,
                                               description="small")]}))
  out = tmp_path / "out"
  cases = [
      (["--embeddings=emb.csv"], "--embeddings=emb.csv: must name a .npy file"),
      ([f"--embeddings={tmp_path}/a_file/emb.npy"],
       f"--embeddings={tmp_path}/a_file/emb.npy: cannot be written, {tmp_path}/a_file is not a "
       f"directory"),
      ([f"--embeddings={tmp_path}/folder.npy"], f"--embeddings={tmp_path}/folder.npy: is a directory"),
      ([f"--out={tmp_path}/a_file/rows.jsonl"],
       f"--out={tmp_path}/a_file/rows.jsonl: cannot be written, {tmp_path}/a_file is not a "
       f"directory"),
      ([f"--embeddings={out}/e.npy", "--encoder=nope"],
       "unknown text encoder 'nope'; known text encoders: hashing"),
      ([f"--embeddings={out}/e.npy", "--encoder=vllm_embed"],
       "--encoder=vllm_embed needs --encoder_url and --encoder_model"),
      ([f"--embeddings={out}/e.npy", "--encoder_dim=0"], "hashing encoder dim must be positive, got 0"),
      ([f"--llm_data={out}/llms.yaml"], f"--llm_data={out}/llms.yaml: must name a .json file"),
      ([f"--llm_data={out}/llms.json", f"--llm_catalog={catalog}"],
       f"LLM {LARGE!r} of the route log is not in the catalog {catalog}; give the server's "
       f"catalog with --llm_catalog"),
  ]
  runs = [_export(f"--route_log={log}", f"--out={out}/rows.jsonl", *flags) for flags, _ in cases]
  for (flags, message), run in zip(cases, map(_finish, runs)):
    errors = [l for l in run.stderr.splitlines() if l.startswith("error:")]
    assert run.returncode == 2 and errors == [f"error: {message}"], (flags, run.stderr)
  assert not out.exists()


def test_an_export_without_rows_has_an_empty_matrix(tmp_path):
  log = route_log.passthrough_log(tmp_path / "routes.jsonl", [("qa", Q1, SMALL, None)])
  run = _finish(_export(f"--route_log={log}", f"--out={tmp_path / 'rows.jsonl'}",
                        f"--embeddings={tmp_path / 'emb.npy'}"))
  assert run.returncode == 0, run.stderr
  assert np.load(tmp_path / "emb.npy").shape == (0, 384)   # the default: hashing, 384 wide
  assert (tmp_path / "rows.jsonl").read_text() == ""
