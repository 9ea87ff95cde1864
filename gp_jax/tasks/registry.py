"""The task registry: the 14 GraphPlanner benchmark tasks plus AIME, in one table.

Each task carries its domain, its metric, the one-line description and the answer-format
instruction used in the role prompts (`{task_description}`, `{answer_format}` in data/roles.json),
and the paper's train/test sizes (GraphPlanner, "Tasks"). LogicGrid, MGSM and CommonGen are
out-of-domain tasks: test only, never seen in training. AIME is evaluated zero-shot.

Names used by the LLMRouter query files (``agentverse-logicgrid``, ``agentverse-mgsm``, ...) are
accepted as aliases of the canonical names.
"""
from __future__ import annotations

import dataclasses

from gp_jax import errors

# Metric names understood by gp_jax.tasks.score.
NUMERIC = "numeric"          # last/declared number, exact rational equality (GSM8K, MGSM).
MATH_EQUIV = "math_equiv"    # \boxed{} answer, LaTeX normalisation + sympy equivalence.
CHOICE = "choice"            # chosen option label among the row's choices.
LOGIC_GRID = "logic_grid"    # choice label, or the house number the label stands for.
CEM = "cem"                  # normalised gold alias contained in the normalised prediction.
CODE_PASS = "code_pass"      # pass@1: the row's tests run in the sandbox.
COVERAGE = "coverage"        # fraction of concepts used (after lemmatising).
METRICS = (NUMERIC, MATH_EQUIV, CHOICE, LOGIC_GRID, CEM, CODE_PASS, COVERAGE)

# Metric names found in LLMRouter-format rows, mapped to ours. Their "f1_score" rows are scored by
# CEM here, as in the paper.
METRIC_ALIASES = {
    "GSM8K": NUMERIC,
    "MATH": MATH_EQUIV,
    "em_mc": CHOICE,
    "f1_score": CEM,
    "code_eval": CODE_PASS,
    "commongen_coverage": COVERAGE,
}

DOMAINS = ("math", "code", "commonsense", "world_knowledge", "knowledge_reasoning", "logic",
           "generation")

_NUMBER_FORMAT = ("Work it out, then write the final answer as a single number on the last line, "
                  "in the form 'Answer: <number>'.")
_BOXED_FORMAT = ("Work it out, then put the final answer, in simplest form, inside \\boxed{...} "
                 "at the end.")
_CHOICE_FORMAT = ("Choose exactly one option and finish with a line of the form 'Answer: X', "
                  "where X is the letter of that option.")
_SHORT_FORMAT = ("Reply with only the short answer (a name, date, number or phrase), "
                 "without explanation.")


@dataclasses.dataclass(frozen=True)
class Task:
  """One benchmark task.

  Attributes:
    name: canonical registry name.
    domain: task family (one of DOMAINS).
    metric: metric name (one of METRICS).
    description: one-line description of the task, for `{task_description}`.
    answer_format: instruction on how to state the answer, for `{answer_format}`.
    train_size: paper train split size (0 for test-only tasks).
    test_size: paper test split size (None: every available row, as for AIME).
    seen_in_training: False for the out-of-domain tasks and zero-shot AIME.
    aliases: other names accepted for this task (LLMRouter file names).
  """
  name: str
  domain: str
  metric: str
  description: str
  answer_format: str
  train_size: int
  test_size: int | None
  seen_in_training: bool = True
  aliases: tuple[str, ...] = ()


# The one table: name, domain, metric, prompts, paper sizes, seen flag.
TASKS: tuple[Task, ...] = (
    Task("gsm8k", "math", NUMERIC,
         "Solve a grade-school math word problem.", _NUMBER_FORMAT, 500, 50),
    Task("math", "math", MATH_EQUIV,
         "Solve a competition mathematics problem.", _BOXED_FORMAT, 500, 50),
    Task("mgsm", "math", NUMERIC,
         "Solve a grade-school math word problem.", _NUMBER_FORMAT, 0, 50,
         seen_in_training=False, aliases=("agentverse-mgsm",)),
    Task("aime", "math", MATH_EQUIV,
         "Solve an AIME problem; the answer is an integer from 0 to 999.", _BOXED_FORMAT, 0, None,
         seen_in_training=False),
    Task("mbpp", "code", CODE_PASS,
         "Write a Python function that does what the text asks and passes the given tests.",
         "Reply with the complete Python function, including any imports it needs, in one "
         "```python fenced code block, using the function name and arguments from the tests.",
         374, 50),
    Task("human_eval", "code", CODE_PASS,
         "Complete the Python function from its signature and docstring.",
         "Reply with the complete function (signature and body, with any imports it needs) in one "
         "```python fenced code block.",
         120, 44, aliases=("humaneval", "openai_humaneval")),
    Task("commonsense_qa", "commonsense", CHOICE,
         "Answer a multiple-choice question that needs everyday commonsense knowledge.",
         _CHOICE_FORMAT, 500, 50),
    Task("arc_challenge", "commonsense", CHOICE,
         "Answer a multiple-choice grade-school science question.", _CHOICE_FORMAT, 500, 50,
         aliases=("arc",)),
    Task("openbook_qa", "commonsense", CHOICE,
         "Answer a multiple-choice question about elementary science facts.", _CHOICE_FORMAT,
         500, 50, aliases=("openbookqa",)),
    Task("natural_qa", "world_knowledge", CEM,
         "Answer a factual question as people ask search engines.", _SHORT_FORMAT, 500, 50,
         aliases=("natural_questions", "nq")),
    Task("trivia_qa", "world_knowledge", CEM,
         "Answer a trivia question.", _SHORT_FORMAT, 500, 50, aliases=("triviaqa",)),
    Task("mmlu", "knowledge_reasoning", CHOICE,
         "Answer a multiple-choice exam question from one of many academic subjects.",
         _CHOICE_FORMAT, 500, 50),
    Task("gpqa", "knowledge_reasoning", CHOICE,
         "Answer a graduate-level multiple-choice question in biology, physics or chemistry.",
         _CHOICE_FORMAT, 400, 44),
    Task("logic_grid", "logic", LOGIC_GRID,
         "Solve a logic grid puzzle about people living in a row of houses.",
         "Reason through the clues, then finish with a line of the form 'Answer: N', where N is "
         "the number of the house.", 0, 50,
         seen_in_training=False, aliases=("agentverse-logicgrid", "logicgrid")),
    Task("commongen", "generation", COVERAGE,
         "Write a coherent sentence or short paragraph that uses all the given concepts.",
         "Reply with only the text, using every one of the given concepts (inflected forms such "
         "as plurals or past tenses count).", 0, 50,
         seen_in_training=False, aliases=("common_gen", "commongen_hard")),
)

_BY_NAME: dict[str, Task] = {}
for _task in TASKS:
  for _name in (_task.name,) + _task.aliases:
    assert _name not in _BY_NAME, _name
    _BY_NAME[_name] = _task
  assert _task.domain in DOMAINS and _task.metric in METRICS, _task


def get_task(name: str) -> Task:
  """Returns the task called `name` (a canonical name or an LLMRouter alias).

  Raises:
    ConfigError: unknown task name.
  """
  try:
    return _BY_NAME[name]
  except (KeyError, TypeError):
    raise errors.unknown_name("task", name, _BY_NAME) from None


def task_names() -> list[str]:
  """Canonical task names, in table order."""
  return [t.name for t in TASKS]


def canonical_metric(name: str) -> str:
  """Maps a metric name (ours or an LLMRouter one) to ours.

  Raises:
    ConfigError: unknown metric name.
  """
  if name in METRICS:
    return name
  if name in METRIC_ALIASES:
    return METRIC_ALIASES[name]
  raise errors.unknown_name("metric", name, METRICS + tuple(METRIC_ALIASES))


def is_known_task(name: str) -> bool:
  return name in _BY_NAME
