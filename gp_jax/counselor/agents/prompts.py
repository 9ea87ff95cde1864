"""Prompts of the Graph Counselor agents and the baselines, and the trial scratchpad.

Turn-taking follows the paper: one shared scratchpad

  Question: ...
  Plan 1: ...      <- planning agent
  Thought 1: ...   <- thought agent
  Action 1: ...    <- execution agent
  Observation 1: ...  <- the graph functions
  Plan 2: ...

Each agent gets its own system message (its job + the graph schema + the functions) and the
scratchpad ending with its own label, and writes one line. Reflections from earlier trials are put
between the question and the scratchpad.

Token counts here are approximate (words and punctuation marks; no model tokenizer is assumed):
they drive the prompt budget, which is a guard, not an accounting. Costs come from the pool.
"""
from __future__ import annotations

import re
from typing import Sequence

from gp_jax.counselor.kg import functions as functions_lib

_TOKEN = re.compile(r"\w+|[^\w\s]")

# The first line of each system prompt names the agent; backends that must tell agents apart
# (the oracle backend) read it.
HEADERS = {
    "plan": "You are the Planning agent of a team that answers questions over a knowledge graph.",
    "thought": "You are the Thought agent of a team that answers questions over a knowledge graph.",
    "action": "You are the Execution agent of a team that answers questions over a knowledge graph.",
    "judge": "You are the Evaluation agent of a team that answers questions over a knowledge graph.",
    "reflect": ("You are the Reflection agent of a team that answers questions over a knowledge "
                "graph."),
    "answer": "You answer questions about a knowledge graph.",
    "metric_judge": "You grade answers to questions against a reference answer.",
}

LABELS = {"plan": "Plan", "thought": "Thought", "action": "Action"}

_JOBS = {
    "plan": (
        "Write the next step of the plan: one line saying which information is still missing and "
        "which graph functions to use to get it (combine at most two functions in one step). If "
        "the observations already answer the question, say that the answer can be given now."),
    "thought": (
        "Write one line of reasoning for the next step: read the latest plan and observations, "
        "say what they show, and decide exactly what the next action must do."),
    "action": (
        "Write the next action: one line with one or more function calls, and nothing else. When "
        "the observations answer the question, write Finish[answer] with the answer only."),
}

_FUNCTION_HELP = """Graph functions (write them exactly like this):
1. Retrieve[keyword]: {retrieve}.
2. Feature[node_id, feature_name]: {feature}.
3. Neighbor[node_id, neighbor_type]: {neighbor}.
4. Degree[node_id, neighbor_type]: {degree}.
5. Finish[answer]: {finish}.
Calls can be nested, e.g. Feature[Retrieve[some title], year] or
Degree[Neighbor[Retrieve[some name], paper], author]. Several calls on one line are separated by ';'.
A function given a list of ids applies to each of them and returns a list.
Quote an argument that contains commas or brackets: Retrieve["Smith, J. [ed.]"]."""


def count_tokens(text: str) -> int:
  """Approximate token count: words and punctuation marks."""
  return len(_TOKEN.findall(text))


def messages_tokens(messages: Sequence[dict]) -> int:
  return sum(count_tokens(m["content"]) for m in messages) + 4 * len(messages)


def function_help() -> str:
  d = {s.name.lower(): s.description for s in functions_lib.SPECS}
  return _FUNCTION_HELP.format(**d)


class Scratchpad:
  """The trial's Plan/Thought/Action/Observation lines, with oldest-first observation truncation."""

  TRUNCATED = "[earlier observation removed to fit the prompt budget]"

  def __init__(self):
    self.entries: list[list] = []  # [label, step, text]

  def add(self, label: str, step: int, text: str) -> None:
    self.entries.append([label, step, text])

  def render(self) -> str:
    return "\n".join(f"{label} {step}: {text}" for label, step, text in self.entries)

  def observations(self) -> list[str]:
    return [t for label, _, t in self.entries if label == "Observation"]

  def truncate_oldest_observation(self) -> bool:
    """Replaces the oldest untruncated observation; False when none is left to truncate."""
    for e in self.entries:
      if e[0] == "Observation" and e[2] != self.TRUNCATED:
        e[2] = self.TRUNCATED
        return True
    return False


def _context_block(question: str, reflections: Sequence[str]) -> str:
  parts = [f"Question: {question}"]
  if reflections:
    parts.append("Reflections on earlier attempts at this question (use them to avoid the same "
                 "mistakes):")
    parts.extend(f"Reflection {i + 1}: {r.strip()}" for i, r in enumerate(reflections))
  return "\n".join(parts)


def agent_messages(kind: str, *, schema: str, question: str, reflections: Sequence[str],
                   scratchpad: Scratchpad, step: int) -> list[dict]:
  """Messages for the plan / thought / action agent at `step` (1-based)."""
  system = "\n".join([HEADERS[kind], _JOBS[kind], "", "The knowledge graph:", schema, "",
                      function_help()])
  pad = scratchpad.render()
  user = _context_block(question, reflections) + "\n" + (pad + "\n" if pad else "")
  user += f"{LABELS[kind]} {step}:"
  return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def judge_messages(*, schema: str, question: str, scratchpad: Scratchpad, answer: str) -> list[dict]:
  """Messages for the evaluation agent that judges one trial's answer."""
  system = "\n".join([
      HEADERS["judge"],
      "Read the question, the steps taken and the proposed answer. Decide whether the answer is "
      "correct, complete and supported by the observations. Reply with one line "
      "'Judgment: [Yes]' or 'Judgment: [No]', then one sentence giving the reason.",
      "", "The knowledge graph:", schema])
  user = f"Question: {question}\n{scratchpad.render()}\nProposed answer: {answer}\nJudgment:"
  return [{"role": "system", "content": system}, {"role": "user", "content": user}]


REFLECTION_SECTIONS = (
    "Recap: what was tried and what answer it gave.",
    "Question understanding: the core goal of the question; information that was missed; "
    "anything that was misunderstood.",
    "Analysis of the selected graph information: how relevant it was; insights that were missed; "
    "redundant calls.",
    "Alignment and adjustments: where the steps drifted from the question and how to correct them.",
    "Improved strategy: the concrete steps for the next attempt, with at most two functions "
    "combined in one step.",
)


def reflect_messages(*, schema: str, question: str, scratchpad: Scratchpad, answer: str | None,
                     judgment: str) -> list[dict]:
  """Messages for the reflection agent after a trial judged wrong (or without an answer)."""
  sections = "\n".join(f"{i + 1}. {s}" for i, s in enumerate(REFLECTION_SECTIONS))
  system = "\n".join([
      HEADERS["reflect"],
      "An earlier attempt at the question failed. Reflect on it from several perspectives so that "
      "the next attempt succeeds. Write these five parts, each one or two sentences:",
      sections, "", "The knowledge graph:", schema, "", function_help()])
  shown = answer if answer else "(no answer was given)"
  user = (f"Question: {question}\n{scratchpad.render()}\nAnswer of this attempt: {shown}\n"
          f"Evaluation: {judgment.strip() or '(none)'}\nReflection:")
  return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def answer_messages(*, question: str, context: str | None) -> list[dict]:
  """Single-call baselines: the question alone (LLM-only) or with retrieved graph text."""
  system = (HEADERS["answer"] + " Answer with the answer only (a name, a number or a short list), "
            "no explanation.")
  if context:
    user = f"Information from the knowledge graph:\n{context}\n\nQuestion: {question}\nAnswer:"
  else:
    user = f"Question: {question}\nAnswer:"
  return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def metric_judge_messages(*, question: str, gold: str, prediction: str) -> list[dict]:
  """The LLM-judge metric: does the prediction match the reference answer?"""
  system = (HEADERS["metric_judge"] + " Reply [Yes] if the predicted answer means the same as the "
            "reference answer (order of list items and formatting do not matter), else [No].")
  user = (f"Question: {question}\nReference answer: {gold}\nPredicted answer: {prediction}\n"
          "Is the predicted answer correct? Reply [Yes] or [No].")
  return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def agent_kind_of(messages: Sequence[dict]) -> str | None:
  """The agent kind whose header opens the system message, or None."""
  if not messages or messages[0].get("role") != "system":
    return None
  first = messages[0]["content"].split("\n", 1)[0]
  for kind, header in HEADERS.items():
    if first.startswith(header):
      return kind
  return None
