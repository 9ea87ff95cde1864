"""pass@1: HumanEval canonical solutions pass and corrupted ones fail; MBPP references pass."""
from __future__ import annotations

import json
import re

import pytest

from gp_jax import errors
from gp_jax import types
from gp_jax.tasks import code_eval
from gp_jax.tasks import metrics


def _he_query(p: dict, with_entry_point: bool = True) -> types.Query:
  return types.Query(qid=p["task_id"], task_name="human_eval", domain="code", query=p["prompt"],
                     ground_truth=p["test"], metric="code_pass", task_id=p["task_id"],
                     meta={"entry_point": p["entry_point"]} if with_entry_point else {})


def _corrupt(p: dict) -> str:
  """The canonical solution wrapped so that every return value is perturbed."""
  ep = p["entry_point"]
  return (
      "```python\n" + p["prompt"] + p["canonical_solution"] + "\n\n"
      f"_original = {ep}\n\n"
      "def _perturb(v):\n"
      "    if isinstance(v, bool):\n        return not v\n"
      "    if isinstance(v, (int, float)):\n        return v + 1\n"
      "    if isinstance(v, str):\n        return v + 'x'\n"
      "    if isinstance(v, list):\n        return v + [None]\n"
      "    if isinstance(v, tuple):\n        return v + (None,)\n"
      "    if v is None:\n        return 0\n"
      "    return None\n\n"
      f"def {ep}(*args, **kwargs):\n"
      "    return _perturb(_original(*args, **kwargs))\n```\n")


def test_humaneval_canonical_solutions_pass_and_corrupted_fail(humaneval_problems, sandbox):
  probs = humaneval_problems
  assert len(probs) == 164
  qs = [_he_query(p) for p in probs]
  # All 164 in the completion format (body only); every 8th also in the chat format (the whole
  # function in a fenced block, entry point taken from the prompt).
  bodies = code_eval.code_pass_many([p["canonical_solution"] for p in probs], qs,
                                    sandbox=sandbox)
  assert [p["task_id"] for p, s in zip(probs, bodies) if not s] == []
  some = probs[::8]
  fenced = code_eval.code_pass_many(
      [f"Here you go:\n```python\n{p['prompt']}{p['canonical_solution']}\n```\nDone."
       for p in some], [_he_query(p, with_entry_point=False) for p in some], sandbox=sandbox)
  assert sum(fenced) == len(some) == 21
  corrupted = code_eval.code_pass_many([_corrupt(p) for p in probs], qs, sandbox=sandbox)
  assert [p["task_id"] for p, s in zip(probs, corrupted) if s] == []


def test_mbpp_reference_solutions_pass(shared_data, sandbox):
  rows = [json.loads(line) for line in (shared_data / "code" / "mbpp.jsonl").open()]
  assert len(rows) == 974
  qs = [types.Query(qid=str(r["task_id"]), task_name="mbpp", domain="code", query=r["text"],
                    ground_truth=repr(r["test_list"]), metric="code_pass",
                    task_id=str(r["task_id"]),
                    meta={"tests": r["test_list"], "test_setup_code": r["test_setup_code"]})
        for r in rows]
  # A generous wall clock: a few references (e.g. task 123) take seconds on a busy machine.
  scores = code_eval.code_pass_many([r["code"] for r in rows], qs, sandbox=sandbox, wall_s=60.0)
  assert [r["task_id"] for r, s in zip(rows, scores) if not s] == []
  # Wrong code fails: the reference with the tested function redefined to return an object
  # that equals nothing and is false.
  picked = [(r, q) for r, q in zip(rows, qs) if _tested_name(r["test_list"][0])][:60]
  wrong = [r["code"] + "\n\n" + _shadow(_tested_name(r["test_list"][0])) for r, _ in picked]
  assert len(picked) == 60
  assert sum(code_eval.code_pass_many(wrong, [q for _, q in picked], sandbox=sandbox)) == 0


def _tested_name(test: str) -> str | None:
  m = re.match(r"\s*assert\s*\(?\s*([A-Za-z_]\w*)\s*\(", test)
  return m.group(1) if m else None


def _shadow(name: str) -> str:
  return ("class _Nothing:\n    def __eq__(self, other): return False\n"
          "    def __bool__(self): return False\n"
          f"def {name}(*args, **kwargs):\n    return _Nothing()\n")


def _mbpp(tests, setup=""):
  return types.Query(qid="mbpp/test/0", task_name="mbpp", domain="code", query="Add numbers.",
                     ground_truth=repr(tests), metric="code_pass", task_id="1",
                     meta={"tests": tests, "test_setup_code": setup})


def test_code_pass_cases(sandbox):
  q = _mbpp(["assert add(1, 2) == 3", "assert add(-1, 1) == 0"])
  good = "def add(a, b):\n    return a + b\n"
  cases = [
      (good, 1),
      (f"Sure!\n```python\n{good}```\nThis adds.", 1),
      (f"```py\n{good}```", 1),
      (f"```python\n{good}\nif __name__ == '__main__':\n    raise SystemExit(1)\n```", 1),
      ("def add(a, b):\n    return a - b\n", 0),
      ("def plus(a, b):\n    return a + b\n", 0),  # wrong name
      ("def add(a, b)\n    return a + b\n", 0),  # syntax error
      ("import os\nos._exit(0)\n" + good, 0),  # exits before the tests run
      ("import sys\nsys.exit(0)\n" + good, 0),
      ("while True:\n    pass\n", 0),
      ("I cannot write this function.", 0),
      ("", 0),
  ]
  scores = code_eval.code_pass_many([c for c, _ in cases], [q] * len(cases), sandbox=sandbox,
                                    wall_s=3.0)
  assert scores == [float(w) for _, w in cases]


def test_setup_code_runs_after_solution(sandbox):
  q = _mbpp(["assert depth(root) == 2"], setup="root = Node(Node(None))")
  code = ("class Node:\n    def __init__(self, child):\n        self.child = child\n"
          "def depth(n):\n    return 0 if n is None else 1 + depth(n.child)\n")
  assert code_eval.code_pass(code, q, sandbox=sandbox) == 1.0


def test_code_rows_through_score_many(humaneval_problems, sandbox):
  p = humaneval_problems[0]
  llmrouter_row = types.Query(qid="h", task_name="human_eval", domain="code", query=p["prompt"],
                              ground_truth=p["test"], metric="code_eval", task_id=p["task_id"])
  gsm = types.Query(qid="g", task_name="gsm8k", domain="math", query="?", ground_truth="#### 4",
                    metric="GSM8K")
  preds = [p["canonical_solution"], "Answer: 4", "    return True\n"]
  assert metrics.score_many(preds, [llmrouter_row, gsm, llmrouter_row], sandbox=sandbox) == [
      1.0, 1.0, 0.0]


def test_extract_code():
  assert code_eval.extract_code("```python\nx = 1\n```") == "x = 1\n"
  reply = "```text\nnot code\n```\n```python\ndef helper():\n    pass\n```\n```python\n" \
          "def f():\n    return 1\n```"
  assert code_eval.extract_code(reply, "f").startswith("def f()")
  assert code_eval.extract_code(reply).startswith("def helper()")
  assert code_eval.extract_code("def f(): return 1") == "def f(): return 1"
  assert code_eval.extract_code("```python\ndef f():\n    return 1") == "def f():\n    return 1"


def test_code_rows_need_tests():
  with pytest.raises(errors.DataError, match="no test list"):
    code_eval.build_program("x", _mbpp([]), "tok")
  with pytest.raises(errors.ConfigError, match="no code tests"):
    code_eval.build_program("x", types.Query(qid="q", task_name="gsm8k", domain="math",
                                             query="?", ground_truth="1", metric="numeric"), "t")


def test_reply_that_silences_stdout_still_passes(sandbox):
  q = _mbpp(["assert add(1, 2) == 3"])
  reply = ("import io, sys\nsys.stdout = io.StringIO()\nprint = lambda *a, **k: None\n"
           "def add(a, b):\n    return a + b\n")
  assert code_eval.code_pass(reply, q, sandbox=sandbox) == 1.0
