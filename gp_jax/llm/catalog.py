"""The LLM catalog: names, sizes, prices and descriptions of the backbones a pool can route to.

Prices are $ per million tokens, as in GraphPlanner's Table 10. `Catalog.cost_usd` is the one place
where token usage becomes dollars.
"""
from __future__ import annotations

import dataclasses
import pathlib
from typing import Iterable, Sequence

from gp_jax import errors
from gp_jax import paths

DEFAULT_POOL_FILE = paths.DATA_DIR / "llm_pool.json"


@dataclasses.dataclass(frozen=True)
class LLMSpec:
  """One backbone of the pool."""
  name: str
  size_b: float          # parameters, billions
  price_in: float        # $ per million input tokens
  price_out: float       # $ per million output tokens
  description: str       # text embedded into the role-hub features
  held_out: bool = False  # kept out of training for the unseen-LLM experiment
  api_model: str = ""    # model name an OpenAI-compatible server exposes

  def cost_usd(self, input_tokens: int, output_tokens: int) -> float:
    return (input_tokens * self.price_in + output_tokens * self.price_out) / 1e6


@dataclasses.dataclass(frozen=True)
class Catalog:
  """An ordered set of LLMs; the order defines the LLM index of the action space."""
  llms: tuple[LLMSpec, ...]

  def __post_init__(self):
    names = [m.name for m in self.llms]
    if len(set(names)) != len(names):
      raise errors.ConfigError(f"duplicate LLM names in catalog: {names}")

  @property
  def names(self) -> list[str]:
    return [m.name for m in self.llms]

  def __len__(self) -> int:
    return len(self.llms)

  def __getitem__(self, name: str) -> LLMSpec:
    for m in self.llms:
      if m.name == name:
        return m
    raise errors.unknown_name("LLM", name, self.names)

  def index(self, name: str) -> int:
    return self.names.index(self[name].name)

  def select(self, names: Sequence[str]) -> "Catalog":
    """The sub-catalog of `names`, in that order; unknown names raise ConfigError."""
    return Catalog(tuple(self[n] for n in names))

  def cost_usd(self, name: str, input_tokens: int, output_tokens: int) -> float:
    return self[name].cost_usd(input_tokens, output_tokens)


def load_catalog(path: str | pathlib.Path = DEFAULT_POOL_FILE) -> Catalog:
  """Reads a catalog JSON file ({"llms": [{name, size_b, price_in, price_out, description, ...}]})."""
  path = pathlib.Path(path)
  raw = errors.read_json(path, "LLM catalog file")
  rows = raw.get("llms") if isinstance(raw, dict) else None
  if not isinstance(rows, list) or not rows:
    raise errors.DataError(f"{path}: expected an object with a non-empty 'llms' list")
  fields = {f.name for f in dataclasses.fields(LLMSpec)}
  specs = []
  for i, row in enumerate(rows):
    missing = {"name", "size_b", "price_in", "price_out", "description"} - set(row)
    if missing:
      raise errors.DataError(f"{path}: llms[{i}] is missing field(s) {sorted(missing)}")
    unknown = set(row) - fields
    if unknown:
      raise errors.DataError(f"{path}: llms[{i}] has unknown field(s) {sorted(unknown)}")
    for key in ("size_b", "price_in", "price_out"):
      if not isinstance(row[key], (int, float)) or row[key] < 0:
        raise errors.DataError(f"{path}: llms[{i}].{key} must be a non-negative number, got {row[key]!r}")
    specs.append(LLMSpec(**row))
  return Catalog(tuple(specs))


def training_names(catalog: Catalog) -> list[str]:
  """The LLMs not held out: the default training pool."""
  return [m.name for m in catalog.llms if not m.held_out]


def check_names(catalog: Catalog, names: Iterable[str]) -> None:
  for n in names:
    catalog[n]  # raises ConfigError on unknown names
