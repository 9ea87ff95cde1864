"""Multiple-choice options in the forms found in LLMRouter-format rows.

Rows carry options as {"label": [...], "text": [...]} (CommonsenseQA, ARC, OpenBookQA),
{"labels": [...], "text": [...]} (LogicGrid), a plain list of option texts (MMLU, GPQA; labels
A, B, C, ...), or the Python repr of any of these as a string.
"""
from __future__ import annotations

import ast
import string

from gp_jax import errors


def parse_choices(raw, *, where: str = "row") -> tuple[list[str], list[str]]:
  """(labels, texts) of a row's options.

  Args:
    raw: the row's `choices` value (dict, list, or their repr as a string).
    where: location for error messages (e.g. "file.jsonl:12").

  Raises:
    DataError: not a readable set of options.
  """
  value = raw
  if isinstance(value, str):
    try:
      value = ast.literal_eval(value)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
      raise errors.DataError(f"{where}: field 'choices': not a list or dict literal") from None
  if isinstance(value, dict):
    labels = value.get("label", value.get("labels"))
    texts = value.get("text", value.get("texts"))
    if not isinstance(labels, (list, tuple)) or not isinstance(texts, (list, tuple)):
      raise errors.DataError(f"{where}: field 'choices': dict needs 'label' and 'text' lists")
    if len(labels) != len(texts):
      raise errors.DataError(f"{where}: field 'choices': {len(labels)} labels but "
                             f"{len(texts)} texts")
  elif isinstance(value, (list, tuple)):
    texts = value
    if len(texts) > len(string.ascii_uppercase):
      raise errors.DataError(f"{where}: field 'choices': too many options ({len(texts)})")
    labels = list(string.ascii_uppercase[:len(texts)])
  else:
    raise errors.DataError(f"{where}: field 'choices': expected options, got "
                           f"{type(value).__name__}")
  labels = [str(l).strip() for l in labels]
  texts = [str(t) for t in texts]
  if len(labels) < 2:
    raise errors.DataError(f"{where}: field 'choices': fewer than two options")
  if any(not l for l in labels) or len({l.upper() for l in labels}) != len(labels):
    raise errors.DataError(f"{where}: field 'choices': labels must be distinct and non-empty")
  return labels, texts


def canonical_choices(raw, *, where: str = "row") -> dict:
  """Options as {"label": [...], "text": [...]} (the form written by prepare_data)."""
  labels, texts = parse_choices(raw, where=where)
  return {"label": labels, "text": texts}
