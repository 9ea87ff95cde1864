"""The one asynchronous interface every LLM backend implements.

The workflow environment (GraphPlanner) and the Graph Counselor agents reach LLMs only through
`LLMPool.chat`. Backends: the simulator (embedded default), an OpenAI-compatible HTTP pool (vLLM,
llama.cpp, ...), and the replay cache that wraps either. Backends know nothing of workflows or roles
beyond the messages they are given.

A failed call never raises out of `chat`: it returns a Completion with `error` set (and empty text),
so an episode can carry on or end with utility 0. Only misconfiguration (unknown model) raises.
"""
from __future__ import annotations

import abc
import dataclasses
from typing import Callable, Mapping, Sequence

from gp_jax.llm import catalog as catalog_lib

Message = Mapping[str, str]  # {"role": "system" | "user" | "assistant", "content": str}


@dataclasses.dataclass(frozen=True)
class SamplingParams:
  temperature: float = 0.0
  max_tokens: int = 512
  top_p: float = 1.0
  seed: int | None = 0
  stop: tuple[str, ...] = ()

  def as_dict(self) -> dict:
    return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Completion:
  """The result of one chat call. cost_usd comes from the catalog prices and the token usage."""
  model: str
  text: str
  input_tokens: int
  output_tokens: int
  cost_usd: float
  latency_s: float = 0.0
  error: str | None = None   # None on success; a short kind ('timeout', 'http_500', 'malformed', ...)
  finish_reason: str | None = None   # the backend's reason ('stop', 'length', ...); None: unknown

  @property
  def ok(self) -> bool:
    return self.error is None


class LLMPool(abc.ABC):
  """Asynchronous chat completions over a catalog of named LLMs."""

  def __init__(self, catalog: catalog_lib.Catalog):
    self.catalog = catalog

  @abc.abstractmethod
  async def chat(self, model: str, messages: Sequence[Message],
                 params: SamplingParams = SamplingParams()) -> Completion:
    """One chat completion from `model` (a catalog name). Never raises for backend faults."""

  async def chat_stream(self, model: str, messages: Sequence[Message], params: SamplingParams,
                        on_delta: Callable[[str], None]) -> Completion:
    """`chat`, handing the answer's text to `on_delta` as it comes. The default (a backend that
    cannot stream) hands the whole text over once, after the call; never on a failed call."""
    out = await self.chat(model, messages, params)
    if out.error is None and out.text:
      on_delta(out.text)
    return out

  async def aclose(self) -> None:
    """Releases connections; the default has nothing to release."""

  def stats(self) -> dict:
    """Counters for metrics (calls, failures by kind, tokens...)."""
    return {}


def failed(model: str, kind: str, latency_s: float = 0.0, input_tokens: int = 0) -> Completion:
  """A Completion that records a failed call (no text, no output tokens)."""
  return Completion(model=model, text="", input_tokens=input_tokens, output_tokens=0,
                    cost_usd=0.0, latency_s=latency_s, error=kind)
