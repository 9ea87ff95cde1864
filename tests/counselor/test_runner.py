"""experiments/counselor.py end to end: generate, run on the oracle backend, run on a local
OpenAI-compatible server with faults, and one-line errors with exit status 2 on bad input."""
import json
import pathlib
import subprocess
import sys

import pytest

from experiments.configs import counselor as counselor_config
from gp_jax import errors
from gp_jax.counselor.agents import loop as agents
from gp_jax.runs import counselor as experiment

ROOT = pathlib.Path(__file__).resolve().parents[2]
RUNNER = ROOT / "experiments" / "counselor.py"
ORACLE = f"--config={ROOT / 'experiments' / 'configs' / 'counselor.py'}:oracle"


def cli(*args, timeout=120):
  return subprocess.run([sys.executable, str(RUNNER), *args], capture_output=True, text=True,
                        timeout=timeout, cwd=ROOT)


def test_generate_then_run_with_the_oracle_backend(tmp_path):
  out_dir = tmp_path / "kg"
  r = cli("--mode=generate", "--config.generate.domain=biomedical", "--config.generate.size=tiny",
          "--config.generate.seed=5", "--config.generate.per_template=1", f"--out_dir={out_dir}")
  assert r.returncode == 0, r.stderr
  assert (out_dir / "graph.json").exists() and (out_dir / "questions.jsonl").exists()
  preds = tmp_path / "preds.jsonl"
  r = cli(ORACLE, f"--graph={out_dir / 'graph.json'}", f"--questions={out_dir / 'questions.jsonl'}",
          "--config.method=counselor", f"--out={preds}",
          "--config.models=reflect=mixtral-8x22b-instruct-v0.1",
          "--config.model=qwen2.5-7b-instruct")
  assert r.returncode == 0, r.stderr
  table = r.stdout[r.stdout.index("level"):]
  for level in ("easy", "medium", "hard", "all"):
    assert f"\n{level}" in table
  all_row = next(l for l in table.splitlines() if l.startswith("all")).split()
  assert all_row[2:7] == ["100.0"] * 5  # Rouge-L, EM, BLEU, judge, EM@1
  rows = [json.loads(l) for l in preds.read_text().splitlines()]
  n_questions = len((out_dir / "questions.jsonl").read_text().splitlines())
  assert len(rows) == n_questions
  for row in rows:
    assert row["prediction"] == row["gold"] and row["em"] == 1.0 and row["judge"] == 1.0
    calls = row["result"]["calls"]
    assert {c["model"] for c in calls} == {"qwen2.5-7b-instruct"}
    assert row["result"]["cost_usd"] == pytest.approx(sum(c["cost_usd"] for c in calls))
    assert row["judge_cost_usd"] > 0


def _bad_input_cases(tmp_path):
  """(flags, words the one error line must hold)."""
  tiny = ROOT / "data" / "counselor" / "ecommerce-tiny"
  data = [f"--graph={tiny / 'graph.json'}", f"--questions={tiny / 'questions.jsonl'}"]
  bad_graph = tmp_path / "g.json"
  bad_graph.write_text('{"paper_nodes": {"p1": {"features": {}, "neighbors": {"author": ["a9"]}}}}')
  questions = tmp_path / "q.jsonl"
  questions.write_text('{"qid": 1, "question": "x", "answer": "y"}\n')
  gen = tmp_path / "q2.jsonl"
  gen.write_text((ROOT / "data/counselor/academic-tiny/questions.jsonl").read_text())
  return [
      (data + [ORACLE, "--config.method=nope"], "unknown method 'nope'"),
      (data + ["--config.pool=weird"], "unknown pool 'weird'"),
      (data + [ORACLE, "--config.model=gpt-9"], "unknown LLM 'gpt-9'"),
      (data + [ORACLE, "--config.models=plan"], "config.models: expected name=value pairs"),
      (data, "config.pool=endpoints needs config.endpoints_file"),
      (data + ["--config.endpoints_file=/nonexistent/ep.json"], "endpoints file not found"),
      (data + [ORACLE, "--config.data.text_keys=venue=name"], "unknown node type 'venue'"),
      (data + [ORACLE, "--config.limit=-1"], "config.limit must be >= 0"),
      (data + [ORACLE, "--config.limit=abc"], "--config.limit=abc"),
      (data + [ORACLE, "--config.methd=llm_only"], "no such config field"),
      (data + [f"{ORACLE[:-len(':oracle')]}:tiny"], "unknown counselor config variant 'tiny'"),
      ([f"--graph={bad_graph}", f"--questions={questions}",
        "--config.endpoints_file=/nonexistent"], "endpoints file not found"),
      ([ORACLE, f"--graph={bad_graph}", f"--questions={questions}"], "1 question(s) have none"),
      ([ORACLE, f"--graph={tmp_path / 'none.json'}", f"--questions={questions}"],
       "question(s) have none"),
      ([ORACLE, f"--graph={bad_graph}", f"--questions={gen}"],
       "neighbour id(s) name no node"),
      ([ORACLE, f"--graph={bad_graph}", f"--questions={gen}"], "config.data.drop_dangling"),
      (["--mode=generate", "--config.generate.domain=legal", f"--out_dir={tmp_path / 'o'}"],
       "unknown domain 'legal'"),
      (["--mode=generate"], "--mode=generate needs --out_dir"),
      (["--mode=run"], "--mode=run needs --graph and --questions"),
      ([f"--graph={tiny / 'graph.json'}", f"--questions={tmp_path / 'none.jsonl'}", ORACLE],
       f"error: {tmp_path / 'none.jsonl'}: question file not found"),
  ]


def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path):
  cases = _bad_input_cases(tmp_path)
  before = sorted(tmp_path.rglob("*"))
  procs = [(args, words, subprocess.Popen([sys.executable, str(RUNNER), *args], cwd=ROOT,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True))
           for args, words in cases]
  for args, words, proc in procs:
    out, err = proc.communicate(timeout=180)
    lines = [l for l in err.splitlines() if l.strip()]
    assert proc.returncode == 2, (args, err[-2000:])
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], (args, err)
    assert out == "", (args, out)
  assert sorted(tmp_path.rglob("*")) == before


def test_endpoints_pool_against_a_local_server_with_faults(tmp_path):
  from gp_jax.llm import testing_server
  folder = ROOT / "data" / "counselor" / "academic-tiny"
  config = testing_server.ServerConfig(fault_rate=0.25, faults=("malformed", "empty"), seed=1,
                                       models=("echo",))
  with testing_server.FakeOpenAIServer(config) as server:
    ep = tmp_path / "endpoints.json"
    ep.write_text(json.dumps({"qwen2.5-7b-instruct": [{"base_url": server.url, "model": "echo"}]}))
    preds = tmp_path / "p.jsonl"
    logs = []
    config = counselor_config.get_config()
    config.endpoints_file, config.model = str(ep), "qwen2.5-7b-instruct"
    config.limit, config.concurrency = 4, 2
    config.agents.max_steps, config.agents.max_reflect = 2, 1
    summary = experiment.run_from_config(
        config, graph_path=str(folder / "graph.json"),
        questions_path=str(folder / "questions.jsonl"), out_path=str(preds), log=logs.append)
    requests = server.requests
  rows = [json.loads(l) for l in preds.read_text().splitlines()]
  assert len(rows) == 4 and summary["all"]["n"] == 4
  calls = [c for r in rows for c in r["result"]["calls"]]
  assert len(calls) + sum(1 for r in rows if r["judge_cost_usd"]) <= requests
  failed = [c for c in calls if c["error"]]
  assert failed and {c["error"] for c in failed} <= {"malformed", "empty"}
  assert summary["all"]["failed_calls"] == len(failed)
  ok = [c for c in calls if not c["error"]]
  assert ok and all(c["output"].startswith("echo: ") and c["input_tokens"] > 0 for c in ok)
  assert all(c["cost_usd"] == pytest.approx((c["input_tokens"] + c["output_tokens"]) * 0.2 / 1e6)
             for c in ok)
  # an echoing model never calls Finish: every trial halts at the step limit or on failures
  for r in rows:
    assert r["prediction"] is None
    assert {t["end_reason"] for t in r["result"]["trials"]} <= {"max_steps", "llm_error"}
  assert any("questions in" in l for l in logs)


def test_endpoints_pool_rejects_unserved_models(tmp_path):
  from gp_jax.llm import testing_server
  folder = ROOT / "data" / "counselor" / "academic-tiny"
  with testing_server.FakeOpenAIServer(models=("x",)) as server:
    ep = tmp_path / "endpoints.json"
    ep.write_text(json.dumps({"qwen2.5-7b-instruct": [{"base_url": server.url, "model": "x"}]}))
    with pytest.raises(errors.ConfigError, match=r"no endpoint serves \['gemma-2-9b-it'\]"):
      experiment.run_experiment(
          graph_path=str(folder / "graph.json"), questions_path=str(folder / "questions.jsonl"),
          pool="endpoints", endpoints_file=str(ep), model="qwen2.5-7b-instruct",
          models="reflect=gemma-2-9b-it", log=lambda s: None)


def test_sample_trial_over_http(tmp_path):
  from gp_jax.llm import catalog as catalog_lib
  from gp_jax.llm import openai_pool
  from gp_jax.llm import testing_server
  import asyncio
  with testing_server.FakeOpenAIServer(models=("tiny",)) as server:
    pool = openai_pool.OpenAIPool(
        catalog_lib.load_catalog(),
        {"llama-3.3-nemotron-super-49b-v1": [{"base_url": server.url, "model": "tiny"}]}, check=True)

    async def go():
      try:
        return await experiment.sample_trial(pool, "llama-3.3-nemotron-super-49b-v1", max_steps=2)
      finally:
        await pool.aclose()
    pred = asyncio.run(go())
  r = pred.result
  assert [c.kind for c in r.calls] == ["plan", "thought", "action"] * 2
  assert all(c.error is None and c.input_tokens > 0 and c.output_tokens > 0 for c in r.calls)
  # the server echoes the prompt, cut at the agent's max_tokens (in words)
  assert all(("echo: " + " ".join(c.prompt.split())).startswith(" ".join(c.output.split()))
             and c.output_tokens <= agents.DEFAULT_SAMPLING[c.kind].max_tokens for c in r.calls)
  assert r.cost_usd == pytest.approx(sum((c.input_tokens + c.output_tokens) * 0.9e-6 for c in r.calls))
  assert r.trials[0].end_reason == "max_steps" and pred.scores["em"] == 0.0
  assert pred.judge_call is None  # no answer: the judge metric needs no call
