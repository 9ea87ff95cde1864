"""Shared fixtures of the Graph Counselor tests: generated datasets and a scripted LLM double."""
from __future__ import annotations

import asyncio
import dataclasses
from typing import Callable

import pytest

from gp_jax.counselor.agents import prompts
from gp_jax.counselor.kg import functions
from gp_jax.counselor.synth import generator
from gp_jax.llm import base
from gp_jax.llm import catalog as catalog_lib
from gp_jax.text import encoder as encoder_lib

MODEL = "llama-3.1-8b-instruct"


@dataclasses.dataclass
class SeenCall:
  kind: str | None
  model: str
  messages: list


class ScriptedPool(base.LLMPool):
  """A deterministic LLM double: `respond(kind, user_message, call_index)` gives the text, or None
  for a failed call (error 'scripted_failure'). Kinds come from the prompts' agent headers."""

  def __init__(self, respond: Callable[[str | None, str, int], str | None],
               catalog: catalog_lib.Catalog | None = None):
    super().__init__(catalog or catalog_lib.load_catalog())
    self.respond = respond
    self.seen: list[SeenCall] = []

  async def chat(self, model, messages, params=base.SamplingParams()):
    spec = self.catalog[model]
    kind = prompts.agent_kind_of(messages)
    self.seen.append(SeenCall(kind, model, list(messages)))
    text = self.respond(kind, messages[-1]["content"], len(self.seen) - 1)
    n_in = prompts.messages_tokens(messages)
    if text is None:
      return base.failed(model, "scripted_failure", input_tokens=n_in)
    n_out = prompts.count_tokens(text)
    return base.Completion(model, text, n_in, n_out, spec.cost_usd(n_in, n_out), 0.001)


@pytest.fixture(scope="session")
def catalog():
  return catalog_lib.load_catalog()


@pytest.fixture(scope="session")
def encoder():
  return encoder_lib.make_encoder("hashing")


@pytest.fixture(scope="session")
def datasets():
  """domain -> (graph, questions): tiny graphs, 3 questions per template."""
  return {d: generator.generate_dataset(d, "tiny", seed=3, per_template=3)
          for d in generator.DOMAINS}


@pytest.fixture(scope="session")
def academic(datasets, encoder):
  graph, questions = datasets["academic"]
  return graph, questions, functions.make_functions(graph, encoder)


def run(coro):
  return asyncio.run(coro)
