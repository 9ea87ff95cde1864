"""Task registry, row loader (validation naming file/line/field) and prompts."""
from __future__ import annotations

import json

import pytest

from gp_jax import errors
from gp_jax import paths
from gp_jax import types
from gp_jax.tasks import loader
from gp_jax.tasks import metrics
from gp_jax.tasks import prompts
from gp_jax.tasks import registry

LLMROUTER_NAMES = ["gsm8k", "math", "mbpp", "human_eval", "commonsense_qa", "arc_challenge",
                   "openbook_qa", "natural_qa", "trivia_qa", "mmlu", "gpqa",
                   "agentverse-logicgrid", "agentverse-mgsm", "commongen", "aime"]
DOMAINS = {"math": {"gsm8k", "math", "mgsm", "aime"}, "code": {"mbpp", "human_eval"},
           "commonsense": {"commonsense_qa", "arc_challenge", "openbook_qa"},
           "world_knowledge": {"natural_qa", "trivia_qa"},
           "knowledge_reasoning": {"mmlu", "gpqa"}, "logic": {"logic_grid"},
           "generation": {"commongen"}}


def test_registry_names_domains_and_sizes():
  assert len(registry.TASKS) == 15
  for name in LLMROUTER_NAMES:
    assert registry.get_task(name).name in registry.task_names()
  got = {}
  for t in registry.TASKS:
    got.setdefault(t.domain, set()).add(t.name)
    assert t.description and t.answer_format
  assert got == DOMAINS
  assert {t.name for t in registry.TASKS if not t.seen_in_training} == {
      "logic_grid", "mgsm", "commongen", "aime"}
  sizes = {t.name: (t.train_size, t.test_size) for t in registry.TASKS}
  assert sizes["mbpp"] == (374, 50) and sizes["human_eval"] == (120, 44)
  assert sizes["gpqa"] == (400, 44) and sizes["gsm8k"] == (500, 50)
  assert sizes["logic_grid"] == (0, 50) and sizes["aime"] == (0, None)


def test_registry_unknown_names():
  with pytest.raises(errors.ConfigError, match="unknown task 'gsm9k'"):
    registry.get_task("gsm9k")
  with pytest.raises(errors.ConfigError, match="unknown metric 'bleu'"):
    registry.canonical_metric("bleu")
  assert registry.canonical_metric("em_mc") == registry.CHOICE


GOOD = {"task_name": "commonsense_qa", "query": "Where?", "ground_truth": "B", "metric": "em_mc",
        "choices": "{'label': ['A', 'B'], 'text': ['x', 'y']}", "task_id": None}

# (change to GOOD, field named in the error)
BAD_ROWS = [
    ({"task_name": "no_such_task"}, "task_name"),
    ({"task_name": ""}, "task_name"),
    ({"query": ""}, "query"),
    ({"query": 3}, "query"),
    ({"ground_truth": None}, "ground_truth"),
    ({"ground_truth": "C"}, "ground_truth"),  # not one of the labels
    ({"metric": "bleu"}, "metric"),
    ({"choices": None}, "choices"),
    ({"choices": "{'label': ['A', 'B'], 'text': ['x']}"}, "choices"),
    ({"choices": "[not python"}, "choices"),
    ({"choices": "{'label': ['A', 'A'], 'text': ['x', 'y']}"}, "choices"),
    ({"domain": "math"}, "domain"),
    ({"split": "dev"}, "split"),
    ({"task_id": [1]}, "task_id"),
    ({"meta": [1]}, "meta"),
    ({"qid": ""}, "qid"),
]


@pytest.mark.parametrize("change,field", BAD_ROWS)
def test_loader_names_file_line_and_field(tmp_path, change, field):
  path = tmp_path / "rows.jsonl"
  bad = dict(GOOD, **change)
  path.write_text(json.dumps(GOOD) + "\n\n" + json.dumps(GOOD) + "\n" + json.dumps(bad) + "\n")
  with pytest.raises(errors.DataError) as e:
    loader.load_queries(path)
  assert f"{path}:4: field '{field}'" in str(e.value)


@pytest.mark.parametrize("text,match", [
    ('{"task_name": "gsm8k", ', ":1: not valid JSON"),
    ('["a list"]', ":1: expected a JSON object"),
    ('{"query": "q", "ground_truth": "1"}', ":1: field 'task_name': missing"),
    ('{"task_name": "gsm8k", "query": "q", "ground_truth": "no number"}',
     ":1: field 'ground_truth': no reference number"),
    ('{"task_name": "trivia_qa", "query": "q", "ground_truth": "The"}',
     ":1: field 'ground_truth': reference answer is empty"),
    ('{"task_name": "mbpp", "query": "q", "ground_truth": "not tests"}',
     ":1: field 'ground_truth': MBPP row needs"),
    ('{"task_name": "human_eval", "query": "def f():\\n", "ground_truth": "assert 1"}',
     ":1: field 'ground_truth': HumanEval ground truth must define check"),
    ('{"task_name": "quiz", "query": "q", "ground_truth": "1", "metric": "numeric"}',
     ":1: field 'task_name': unknown task"),
])
def test_loader_rejects_malformed(tmp_path, text, match):
  path = tmp_path / "bad.jsonl"
  path.write_text(text + "\n")
  with pytest.raises(errors.DataError, match=match):
    loader.load_queries(path)


def test_loader_file_level_errors(tmp_path):
  with pytest.raises(errors.DataError, match="cannot read"):
    loader.load_queries(tmp_path / "missing.jsonl")
  (tmp_path / "empty.jsonl").write_text("\n\n")
  with pytest.raises(errors.DataError, match="no rows"):
    loader.load_queries(tmp_path / "empty.jsonl")
  (tmp_path / "bin.jsonl").write_bytes(b"\xff\xfe\x00garbage\n")
  with pytest.raises(errors.DataError, match="not UTF-8"):
    loader.load_queries(tmp_path / "bin.jsonl")
  row = dict(GOOD, qid="a")
  (tmp_path / "dup.jsonl").write_text(json.dumps(row) + "\n" + json.dumps(row) + "\n")
  with pytest.raises(errors.DataError, match=r"dup.jsonl:2: field 'qid': duplicate of line 1"):
    loader.load_queries(tmp_path / "dup.jsonl")


def test_loader_normalises_and_round_trips(tmp_path):
  rows = [GOOD,
          {"task_name": "agentverse-mgsm", "query": "How many?", "ground_truth": "28",
           "metric": "MATH", "choices": None, "task_id": None},
          {"task_name": "mbpp", "query": "Write f.", "ground_truth": "['assert f(1) == 2']",
           "metric": "code_eval", "choices": "['assert f(1) == 2']", "task_id": "617"},
          {"task_name": "quiz", "query": "q", "ground_truth": "7", "metric": "GSM8K",
           "domain": "toy"}]
  path = tmp_path / "in.jsonl"
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  qs = loader.load_queries(path, split="test", known_tasks_only=False)
  assert [q.task_name for q in qs] == ["commonsense_qa", "mgsm", "mbpp", "quiz"]
  assert [q.metric for q in qs] == ["choice", "numeric", "code_pass", "numeric"]
  assert [q.domain for q in qs] == ["commonsense", "math", "code", "toy"]
  assert qs[0].choices == {"label": ["A", "B"], "text": ["x", "y"]}
  assert qs[2].meta["tests"] == ["assert f(1) == 2"] and qs[2].choices is None
  assert qs[1].qid == "mgsm/test/1" and all(q.split == "test" for q in qs)
  out = tmp_path / "out.jsonl"
  assert loader.write_queries(out, qs) == 4
  again = loader.load_queries(out, known_tasks_only=False)
  assert again == qs and [q.meta for q in again] == [q.meta for q in qs]


def test_llmrouter_files_load_and_gold_scores_one(shared_data):
  qs = []
  for name, split in (("default_query_train.jsonl", "train"),
                      ("default_query_test.jsonl", "test")):
    qs += loader.load_queries(shared_data / "router_queries" / name, split=split)
  assert len(qs) == 5616 + 706
  assert {q.task_name for q in qs} == set(registry.task_names()) - {"aime"}
  for q in qs:
    m = metrics.metric_of(q)
    if m == registry.CODE_PASS:
      continue
    if m in (registry.CHOICE, registry.LOGIC_GRID):
      pred = f"Answer: {q.ground_truth}"
    elif m == registry.NUMERIC:
      pred = f"The answer is {metrics.gold_number(q.ground_truth)}"
    elif m == registry.MATH_EQUIV:
      pred = f"\\boxed{{{metrics.gold_math_answer(q.ground_truth)}}}"
    else:
      pred = q.ground_truth
    assert metrics.score(pred, q) == 1.0, q.qid


def _query(**kw):
  base = dict(qid="t/test/0", task_name="gsm8k", domain="math", query="How many?",
              ground_truth="1", metric="numeric")
  base.update(kw)
  return types.Query(**base)


def test_prompt_fields_per_task():
  roles = paths.DATA_DIR / "roles.json"
  templates = [r["system"] + r["user"] for r in json.loads(roles.read_text())["roles"]]
  assert any("{answer_format}" in t for t in templates)
  assert any("{task_description}" in t for t in templates)
  mc = _query(task_name="mmlu", domain="knowledge_reasoning", ground_truth="B", metric="choice",
              choices={"label": ["A", "B", "C"], "text": ["x", "y", "z"]})
  f = prompts.prompt_fields(mc)
  assert f["query"].endswith("Options:\nA) x\nB) y\nC) z")
  assert "one of A, B, C" in f["answer_format"]
  mbpp = _query(task_name="mbpp", domain="code", metric="code_pass",
                meta={"tests": ["assert add(1, 2) == 3"]})
  assert "assert add(1, 2) == 3" in prompts.render_question(mbpp)
  assert "```python" in prompts.answer_format(mbpp)
  assert "\\boxed" in prompts.answer_format(_query(task_name="math", metric="math_equiv"))
  assert "Answer: <number>" in prompts.answer_format(_query())
  cg = _query(task_name="commongen", domain="generation", metric="coverage",
              query="dog, ball", ground_truth="dog, ball")
  assert prompts.render_question(cg) == "Concepts: dog, ball"
  for t in registry.TASKS:
    assert t.description.endswith(".") and len(t.description.splitlines()) == 1
