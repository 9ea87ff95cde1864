"""Shared record types used across tasks, workflow, baselines and Graph Counselor."""
from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class Query:
  """One benchmark query (the LLMRouter JSONL row schema plus domain and split).

  Attributes:
    qid: unique id within a dataset (e.g. "gsm8k/train/17").
    task_name: task registry name ("gsm8k", "mmlu", ... or a simulated task).
    domain: task family ("math", "code", "commonsense", "world_knowledge", "knowledge_reasoning", ...).
    query: the question text shown to the LLMs.
    ground_truth: gold answer (string; a letter for multiple choice, code tests' reference, ...).
    metric: metric name understood by gp_jax.tasks.score (or the simulator's own metric).
    choices: multiple-choice options (list or dict) or None.
    task_id: pointer to the full problem (MBPP/HumanEval task id) or None.
    split: "train" or "test".
    meta: free-form extras (e.g. test code for code tasks, simulator latents).
  """
  qid: str
  task_name: str
  domain: str
  query: str
  ground_truth: str
  metric: str
  choices: Any = None
  task_id: str | None = None
  split: str = "train"
  meta: dict = dataclasses.field(default_factory=dict, compare=False, hash=False)
