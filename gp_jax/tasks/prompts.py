"""Task prompts: the question text shown to the LLMs and the fields of the role templates.

The role templates in data/roles.json use `{task_description}`, `{answer_format}` and `{query}`.
`prompt_fields(query)` returns all three for a row: the task's one-line description, its answer
format instruction (naming the row's option labels for multiple choice), and the question as it
should be shown -- with its options listed (multiple choice), its tests (MBPP: the function name
comes from them, as in the MBPP paper's prompt) or its concept list (CommonGen).
"""
from __future__ import annotations

from gp_jax import types
from gp_jax.tasks import code_eval
from gp_jax.tasks import registry
from gp_jax.tasks import schema


def _task(q: types.Query) -> registry.Task | None:
  return registry.get_task(q.task_name) if registry.is_known_task(q.task_name) else None


def render_question(q: types.Query) -> str:
  """The question text of a row as the LLMs should see it."""
  task = _task(q)
  metric = task.metric if task else registry.canonical_metric(q.metric)
  name = task.name if task else q.task_name
  if metric == registry.CHOICE:
    labels, texts = schema.parse_choices(q.choices, where=f"query {q.qid}")
    options = "\n".join(f"{l}) {t.strip()}" for l, t in zip(labels, texts))
    return f"{q.query.rstrip()}\n\nOptions:\n{options}"
  if name == "mbpp":
    tests, _ = code_eval.mbpp_tests(q)
    return f"{q.query.rstrip()}\nYour code should pass these tests:\n" + "\n".join(tests)
  if metric == registry.COVERAGE:
    return f"Concepts: {q.query.strip()}"
  return q.query


def answer_format(q: types.Query) -> str:
  """The answer-format instruction for a row (`{answer_format}`)."""
  task = _task(q)
  metric = task.metric if task else registry.canonical_metric(q.metric)
  if metric == registry.CHOICE:
    labels, _ = schema.parse_choices(q.choices, where=f"query {q.qid}")
    return ("Choose exactly one option and finish with a line of the form 'Answer: X', where X is "
            f"one of {', '.join(labels)}.")
  if task is not None:
    return task.answer_format
  return ""


def task_description(q: types.Query) -> str:
  """The one-line task description for a row (`{task_description}`)."""
  task = _task(q)
  return task.description if task else q.task_name


def prompt_fields(q: types.Query) -> dict[str, str]:
  """{"query", "task_description", "answer_format"} for the role templates."""
  return {"query": render_question(q), "task_description": task_description(q),
          "answer_format": answer_format(q)}
