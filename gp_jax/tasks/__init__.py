"""The 14 GraphPlanner benchmark tasks and AIME: rows, prompts, answer extraction and metrics.

  from gp_jax import tasks
  rows = tasks.load_queries("test.jsonl")          # list[gp_jax.types.Query], validated
  fields = tasks.prompt_fields(rows[0])             # {query, task_description, answer_format}
  tasks.score(reply, rows[0])                       # float in [0, 1]
  tasks.score_many(replies, rows)                   # code rows run in parallel in the sandbox
"""
from gp_jax.tasks.loader import load_queries, row_to_query, write_queries
from gp_jax.tasks.metrics import (choice_score, cem_score, coverage_score, logic_grid_score,
                                  math_score, metric_of, numeric_score, score, score_many)
from gp_jax.tasks.code_eval import code_pass, code_pass_many
from gp_jax.tasks.prompts import answer_format, prompt_fields, render_question, task_description
from gp_jax.tasks.registry import DOMAINS, METRICS, TASKS, Task, get_task, task_names
from gp_jax.tasks.sandbox import Sandbox, SandboxResult, default_sandbox
