"""Reading and writing task rows (LLMRouter JSONL format plus domain, split, qid and meta).

Every row is validated when read; the first bad row raises DataError naming the file, the line and
the field. Rows are normalised on the way in: task names become canonical, the metric becomes the
task's own, options become {"label": [...], "text": [...]}, MBPP test lists move to meta["tests"].
"""
from __future__ import annotations

import ast
import json
import pathlib
from typing import Iterable

from gp_jax import errors
from gp_jax import files
from gp_jax import types
from gp_jax.tasks import code_eval
from gp_jax.tasks import metrics
from gp_jax.tasks import registry
from gp_jax.tasks import schema
from gp_jax.tasks import text_match

SPLITS = ("train", "test")
_REQUIRED = ("task_name", "query", "ground_truth")


def _field_error(where: str, field: str, msg: str) -> errors.DataError:
  return errors.DataError(f"{where}: field '{field}': {msg}")


def row_to_query(row, *, where: str, index: int = 0, split: str | None = None,
                 known_tasks_only: bool = True) -> types.Query:
  """Validates one row (a dict parsed from JSON) and returns it as a Query.

  Args:
    row: the parsed JSON object.
    where: "file:line" for error messages.
    index: position of the row, used in the default qid.
    split: split to assign when the row has none ("train" if neither is given).
    known_tasks_only: reject task names missing from the registry.

  Raises:
    DataError: naming `where` and the offending field.
  """
  if not isinstance(row, dict):
    raise errors.DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
  for field in _REQUIRED:
    if field not in row:
      raise _field_error(where, field, "missing")
  name = row["task_name"]
  if not isinstance(name, str) or not name.strip():
    raise _field_error(where, "task_name", "must be a non-empty string")
  task = registry.get_task(name) if registry.is_known_task(name) else None
  if task is None and known_tasks_only:
    raise _field_error(where, "task_name",
                       f"unknown task {name!r}; known: {', '.join(registry.task_names())}")
  query = row["query"]
  if not isinstance(query, str) or not query.strip():
    raise _field_error(where, "query", "must be a non-empty string")
  gold = row["ground_truth"]
  if isinstance(gold, (int, float)) and not isinstance(gold, bool):
    gold = str(gold)
  if not isinstance(gold, str) or not gold.strip():
    raise _field_error(where, "ground_truth", "must be a non-empty string")

  metric_raw = row.get("metric")
  if metric_raw is not None:
    if not isinstance(metric_raw, str):
      raise _field_error(where, "metric", "must be a string")
    try:
      registry.canonical_metric(metric_raw)
    except errors.ConfigError as e:
      raise _field_error(where, "metric", str(e)) from None
  if task is not None:
    metric = task.metric
  elif metric_raw is not None:
    metric = registry.canonical_metric(metric_raw)
  else:
    raise _field_error(where, "metric", "missing (required for tasks outside the registry)")

  domain = row.get("domain")
  if task is not None:
    if domain is not None and domain != task.domain:
      raise _field_error(where, "domain", f"{domain!r} but task {task.name} is {task.domain!r}")
    domain = task.domain
  elif not isinstance(domain, str) or not domain:
    raise _field_error(where, "domain", "missing (required for tasks outside the registry)")

  row_split = row.get("split")
  if row_split is not None and row_split not in SPLITS:
    raise _field_error(where, "split", f"{row_split!r} is not one of {SPLITS}")
  split = row_split or split or "train"
  if split not in SPLITS:
    raise errors.ConfigError(f"split {split!r} is not one of {SPLITS}")

  task_id = row.get("task_id")
  if isinstance(task_id, bool) or not (task_id is None or isinstance(task_id, (str, int))):
    raise _field_error(where, "task_id", "must be a string, an integer or null")
  task_id = None if task_id is None else str(task_id)

  meta = row.get("meta", {})
  if meta is None:
    meta = {}
  if not isinstance(meta, dict):
    raise _field_error(where, "meta", "must be an object")
  meta = dict(meta)

  task_name = task.name if task is not None else name
  choices = row.get("choices")
  if metric in (registry.CHOICE, registry.LOGIC_GRID):
    if choices is None:
      raise _field_error(where, "choices", "multiple-choice row without options")
    choices = schema.canonical_choices(choices, where=where)
    if gold.strip() not in choices["label"]:
      raise _field_error(where, "ground_truth",
                         f"{gold!r} is not one of the option labels {choices['label']}")
    gold = gold.strip()
  elif metric == registry.CODE_PASS and task_name == "mbpp":
    if "tests" not in meta:
      source = choices if choices is not None else gold
      try:
        tests = ast.literal_eval(source) if isinstance(source, str) else source
      except (ValueError, SyntaxError, MemoryError, RecursionError):
        tests = None
      if not isinstance(tests, list) or not tests or not all(isinstance(t, str) for t in tests):
        raise _field_error(where, "ground_truth", "MBPP row needs a list of test assertions")
      meta["tests"] = tests
    choices = None
  elif choices is not None and not isinstance(choices, (list, dict, str)):
    raise _field_error(where, "choices", "must be a list, an object, a string or null")

  qid = row.get("qid")
  if qid is None:
    qid = f"{task_name}/{split}/{index}"
  elif not isinstance(qid, str) or not qid:
    raise _field_error(where, "qid", "must be a non-empty string")

  q = types.Query(qid=qid, task_name=task_name, domain=domain, query=query, ground_truth=gold,
                  metric=metric, choices=choices, task_id=task_id, split=split, meta=meta)
  _check_gold(q, where)
  return q


def _check_gold(q: types.Query, where: str):
  """The reference answer must be usable by the row's metric."""
  m = q.metric
  if m == registry.NUMERIC and metrics.gold_number(q.ground_truth) is None:
    raise _field_error(where, "ground_truth", "no reference number")
  if m == registry.MATH_EQUIV and not metrics.gold_math_answer(q.ground_truth):
    raise _field_error(where, "ground_truth", "empty reference answer")
  if m == registry.CEM:
    aliases = [q.ground_truth] + list(q.meta.get("aliases", ()))
    if not any(text_match.normalize_text(str(a)) for a in aliases):
      raise _field_error(where, "ground_truth",
                         "reference answer is empty once normalised (e.g. only an article)")
  if m == registry.COVERAGE and not text_match.split_concepts(
      q.meta.get("concepts") or q.ground_truth):
    raise _field_error(where, "ground_truth", "no concepts")
  if m == registry.CODE_PASS:
    try:
      if q.task_name == "human_eval":
        if "def check(" not in q.ground_truth:
          raise errors.DataError("HumanEval ground truth must define check(candidate)")
        code_eval.humaneval_entry_point(q)
      elif q.task_name == "mbpp":
        code_eval.mbpp_tests(q)
    except errors.DataError as e:
      raise _field_error(where, "ground_truth", str(e)) from None


def load_queries(path, *, split: str | None = None,
                 known_tasks_only: bool = True) -> list[types.Query]:
  """Reads and validates a JSONL file of task rows.

  Args:
    path: the .jsonl file (one JSON object per line; blank lines are skipped).
    split: split for rows that do not name one (default "train").
    known_tasks_only: reject task names missing from the registry.

  Returns:
    The rows as gp_jax.types.Query, in file order.

  Raises:
    DataError: missing/unreadable/empty file, or the first bad row (file, line and field).
  """
  path = pathlib.Path(path)
  try:
    handle = path.open(encoding="utf-8")
  except OSError as e:
    raise errors.DataError(f"{path}: cannot read ({e.strerror or e})") from None
  out: list[types.Query] = []
  seen: dict[str, int] = {}
  with handle:
    try:
      for lineno, line in enumerate(handle, start=1):
        if not line.strip():
          continue
        where = f"{path}:{lineno}"
        try:
          row = json.loads(line)
        except ValueError as e:
          raise errors.DataError(f"{where}: not valid JSON ({e.msg})") from None
        q = row_to_query(row, where=where, index=len(out), split=split,
                         known_tasks_only=known_tasks_only)
        if q.qid in seen:
          raise _field_error(where, "qid", f"duplicate of line {seen[q.qid]}")
        seen[q.qid] = lineno
        out.append(q)
    except UnicodeDecodeError:
      raise errors.DataError(f"{path}: not UTF-8 text") from None
  if not out:
    raise errors.DataError(f"{path}: no rows")
  return out


def query_to_row(q: types.Query) -> dict:
  """The JSON object written for a Query (LLMRouter fields first)."""
  return {"qid": q.qid, "task_name": q.task_name, "domain": q.domain, "split": q.split,
          "query": q.query, "ground_truth": q.ground_truth, "metric": q.metric,
          "choices": q.choices, "task_id": q.task_id, "meta": dict(q.meta)}


def write_queries(path, queries: Iterable[types.Query]) -> int:
  """Writes rows as JSONL atomically (files.atomic_file). Returns the row count.

  Raises:
    StorageError: the file cannot be written; `path` keeps its previous contents.
  """
  n = 0
  with files.atomic_file(path, "the task rows", parents=True) as f:
    for q in queries:
      f.write((json.dumps(query_to_row(q), ensure_ascii=False) + "\n").encode("utf-8"))
      n += 1
  return n
