"""GRBench question files: JSON lines {qid, question, answer} (+ optional level, template, plan).

Real GRBench files carry only qid, question and answer; the difficulty level ('easy', 'medium',
'hard') is read from a 'level' or 'difficulty' field when present, else 'unknown'. Generated files
(gp_jax/counselor/synth/generator.py) add the template name and the gold plan that the oracle
backend follows.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Any, Iterable

from gp_jax import errors
from gp_jax import files

LEVELS = ("easy", "medium", "hard")


@dataclasses.dataclass(frozen=True)
class GraphQuestion:
  """One question over a knowledge graph.

  Attributes:
    qid: unique id within the file.
    question: the question text.
    answer: the gold answer (lists as 'a, b, c').
    level: 'easy' | 'medium' | 'hard' | 'unknown'.
    template: the generator template that wrote it ('' for real data).
    plan: the gold tool-call plan of generated questions (gp_jax/counselor/synth/plans.py), else
      None.
  """
  qid: str
  question: str
  answer: str
  level: str = "unknown"
  template: str = ""
  plan: dict | None = dataclasses.field(default=None, compare=False)

  def to_json(self) -> dict:
    row: dict[str, Any] = {"qid": self.qid, "question": self.question, "answer": self.answer}
    if self.level != "unknown":
      row["level"] = self.level
    if self.template:
      row["template"] = self.template
    if self.plan is not None:
      row["plan"] = self.plan
    return row


def _answer_text(value: Any, where: str) -> str:
  if isinstance(value, str):
    return value
  if isinstance(value, bool):
    raise errors.DataError(f"{where}: 'answer' must be a string, number or list, got {value!r}")
  if isinstance(value, (int, float)):
    return str(value)
  if isinstance(value, list) and all(isinstance(v, (str, int, float)) for v in value):
    return ", ".join(str(v) for v in value)
  raise errors.DataError(f"{where}: 'answer' must be a string, number or list, got {value!r}")


def parse_question(row: Any, where: str) -> GraphQuestion:
  """Validates one decoded row."""
  if not isinstance(row, dict):
    raise errors.DataError(f"{where}: expected a JSON object")
  for field in ("qid", "question", "answer"):
    if field not in row:
      raise errors.DataError(f"{where}: missing field {field!r}")
  qid = row["qid"]
  if isinstance(qid, bool) or not isinstance(qid, (str, int)) or str(qid) == "":
    raise errors.DataError(f"{where}: 'qid' must be a non-empty string or integer")
  question = row["question"]
  if not isinstance(question, str) or not question.strip():
    raise errors.DataError(f"{where}: 'question' must be a non-empty string")
  level = row.get("level", row.get("difficulty", "unknown"))
  if not isinstance(level, str) or level not in LEVELS + ("unknown",):
    raise errors.DataError(f"{where}: 'level' must be one of {LEVELS + ('unknown',)}, got {level!r}")
  plan = row.get("plan")
  if plan is not None and not isinstance(plan, dict):
    raise errors.DataError(f"{where}: 'plan' must be an object")
  template = row.get("template", "")
  if not isinstance(template, str):
    raise errors.DataError(f"{where}: 'template' must be a string")
  return GraphQuestion(qid=str(qid), question=question.strip(),
                       answer=_answer_text(row["answer"], where), level=level, template=template,
                       plan=plan)


def load_questions(path: str | os.PathLike) -> list[GraphQuestion]:
  """Reads a GRBench question file (JSON lines; blank lines skipped).

  Raises:
    DataError: missing file, a line that is not JSON, a bad field (file and line named), or a
      duplicate qid.
  """
  path = pathlib.Path(path)
  try:
    text = path.read_text(encoding="utf-8")
  except FileNotFoundError:
    raise errors.DataError(f"{path}: question file not found") from None
  except IsADirectoryError:
    raise errors.DataError(f"{path}: is a directory, expected a JSONL question file") from None
  except UnicodeDecodeError as e:
    raise errors.DataError(f"{path}: not UTF-8 text ({e.reason})") from None
  out: list[GraphQuestion] = []
  seen: dict[str, int] = {}
  for lineno, line in enumerate(text.splitlines(), 1):
    if not line.strip():
      continue
    where = f"{path}: line {lineno}"
    try:
      row = json.loads(line)
    except json.JSONDecodeError as e:
      raise errors.DataError(f"{where}: not valid JSON ({e.msg})") from None
    q = parse_question(row, where)
    if q.qid in seen:
      raise errors.DataError(f"{where}: duplicate qid {q.qid!r} (first on line {seen[q.qid]})")
    seen[q.qid] = lineno
    out.append(q)
  if not out:
    raise errors.DataError(f"{path}: no questions in the file")
  return out


def save_questions(questions: Iterable[GraphQuestion], path: str | os.PathLike) -> pathlib.Path:
  """Writes a question file atomically."""
  return files.write_lines(
      path, (json.dumps(q.to_json(), ensure_ascii=False, sort_keys=False) for q in questions),
      "the questions")
