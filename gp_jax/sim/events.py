r"""Pool events of the simulator: the LLM pool changes from one query of a query stream on.

A simulated query's key is "<split>-<seed>-<i>" and every sub-question's key extends its root's
("<root key>/<planner>/<width>/<j>"), so every node knows its root's position i in its split's
stream. An event acts on the nodes of the followed splits whose root position is i >= t:
  quality  executor skill theta[m, d] += delta on the chosen domains/tasks (all when none are
           chosen); the role qualities derived from the mean skill (planning, summarising, final,
           thinking, verifying) stay as they were: the event changes what the LLM knows, not how
           it writes;
  price    LLM m's input and output prices are multiplied by `scale`;
  join     LLM m is absent before t (its actions are masked, the pool refuses its calls) and
           present from t on; it must be in the evaluated pool (config.llms); to make it new to
           the router, train without it and add it to the evaluated pool (its hubs are built from
           its description, as for the unseen-LLM study);
  fail     every call to m errors from t on (base.failed: no text, no cost); the router is not
           told, its actions stay valid.
Splits the events do not follow (the training split by default) see the configured pool. Several
events may name the same LLM: skill shifts add, price scales multiply. Nothing here is random: the
simulator's outcomes stay functions of (node key, messages, sampling seed), so everything before t
is exactly what the same run without events gives. This module is the one place that knows what
an event does; the pool (simulator.py), the expected utility, the exact optimum
(gp_jax/sim/optimal.py) and the environment's mask ask it.
"""
from __future__ import annotations

import dataclasses
from typing import Iterable, Sequence

import numpy as np

from gp_jax import config_lists
from gp_jax import errors

KINDS = ("quality", "price", "join", "fail")
NEVER = 2 ** 62   # a position no query stream reaches


@dataclasses.dataclass(frozen=True)
class PoolEvent:
  """One change of the pool.

  kind: one of KINDS; llm: the LLM it concerns; t: the first root-query position it acts on;
  delta: quality only, logit shift of the executor skill; domains / tasks: quality only, where it
  acts (both empty: every domain); scale: price only, multiplier of both prices (> 0).
  """
  kind: str
  llm: str
  t: int
  delta: float = 0.0
  domains: tuple[str, ...] = ()
  tasks: tuple[str, ...] = ()
  scale: float = 1.0

  def validate(self, llms: Sequence[str], domains: Iterable[str], tasks: Iterable[str]) -> None:
    """Raises ConfigError for an event the pool `llms` cannot have."""
    where = f"pool event {self.kind}"
    if self.kind not in KINDS:
      raise errors.unknown_name("pool event kind", self.kind, KINDS)
    if self.llm not in llms:
      raise errors.ConfigError(f"{where}: LLM {self.llm!r} is not in the pool {list(llms)}")
    if int(self.t) < 0:
      raise errors.ConfigError(f"{where}: t must be >= 0, got {self.t}")
    for d in self.domains:
      if d not in set(domains):
        raise errors.unknown_name(f"{where} domain", d, sorted(set(domains)))
    for t in self.tasks:
      if t not in set(tasks):
        raise errors.unknown_name(f"{where} task", t, sorted(set(tasks)))
    if self.kind == "price" and not self.scale > 0:
      raise errors.ConfigError(f"{where}: scale must be > 0, got {self.scale}")
    if not np.isfinite(self.delta):
      raise errors.ConfigError(f"{where}: delta must be finite, got {self.delta}")


def query_position(key: str) -> tuple[str, int]:
  """(split, i) of the root query of a simulated node key "<split>-<seed>-<i>[/...]"."""
  root = key.split("/", 1)[0]
  parts = root.rsplit("-", 2)
  if len(parts) != 3 or not parts[2].isdigit():
    raise ValueError(f"{key!r} is not a simulated query key '<split>-<seed>-<i>'")
  return parts[0], int(parts[2])


class PoolEvents:
  """The events of one run and the splits whose query streams they follow."""

  def __init__(self, events: Sequence[PoolEvent], splits: Sequence[str] = ("test",)):
    self.events = tuple(events)
    self.splits = tuple(splits)

  def __bool__(self) -> bool:
    return bool(self.events)

  def _on(self, e: PoolEvent, key: str) -> bool:
    split, i = query_position(key)
    return split in self.splits and i >= e.t

  def _active(self, kind: str, llm: str, key: str):
    return [e for e in self.events if e.kind == kind and e.llm == llm and self._on(e, key)]

  def skill_shift(self, llm: str, key: str, domain: str, task: str) -> float:
    """Logit added to theta[llm, domain] on the node `key` (of task `task`)."""
    shift = 0.0
    for e in self._active("quality", llm, key):
      if (not e.domains and not e.tasks) or domain in e.domains or task in e.tasks:
        shift += float(e.delta)
    return shift

  def price_scale(self, llm: str, key: str) -> float:
    """Multiplier of llm's prices on the node `key`."""
    s = 1.0
    for e in self._active("price", llm, key):
      s *= float(e.scale)
    return s

  def failed(self, llm: str, key: str) -> bool:
    return bool(self._active("fail", llm, key))

  def absent(self, llm: str, key: str) -> bool:
    """True before the join of `llm` in a followed split."""
    split, i = query_position(key)
    return split in self.splits and any(
        e.kind == "join" and e.llm == llm and i < e.t for e in self.events)

  def has_joins(self) -> bool:
    return any(e.kind == "join" for e in self.events)

  def present_mask(self, llms: Sequence[str], key: str) -> np.ndarray:
    """bool [len(llms)]: the LLMs in the pool at the query of `key` (joins not yet made are not)."""
    return np.array([not self.absent(m, key) for m in llms], bool)

  def at(self, key: str, splits: Sequence[str]) -> "PoolEvents | None":
    """The pool as it is at the node `key`, as events on every query of `splits`: each event
    that acts at `key` from position 0, each join not yet made there as a join that never comes
    (its LLM absent throughout); None when the pool at `key` is the configured one."""
    split, i = query_position(key)
    out = []
    for e in self.events:
      if e.kind == "join":
        if split in self.splits and i < e.t:
          out.append(dataclasses.replace(e, t=NEVER))
      elif self._on(e, key):
        out.append(dataclasses.replace(e, t=0))
    return PoolEvents(out, splits) if out else None


def from_config(c, *, llms: Sequence[str], domains: Iterable[str], tasks: Iterable[str]
                ) -> PoolEvents | None:
  """The events of config section `data.sim_events` (None when every event is off).

  Args:
    c: the section (ConfigDict or None): splits, and quality / price / join / fail subsections,
      each off while its `llm` is "" (experiments/configs/default.py documents every field).
    llms: the run's pool; domains / tasks: the simulated ones (for validation).
  Raises:
    ConfigError: an event names an LLM outside the pool, an unknown domain or task, t < 0, ...
  """
  if c is None:
    return None
  events = []
  for kind in KINDS:
    sec = c.get(kind)
    if sec is None or not str(sec.get("llm", "")).strip():
      continue
    kw = {}
    if kind == "quality":
      kw = dict(delta=float(sec.delta), domains=config_lists.names(sec.domains),
                tasks=config_lists.names(sec.tasks))
    elif kind == "price":
      kw = dict(scale=float(sec.scale))
    try:
      t = int(sec.t)
    except (TypeError, ValueError):
      raise errors.ConfigError(f"config.data.sim_events.{kind}.t must be an integer, got "
                               f"{sec.t!r}") from None
    e = PoolEvent(kind, str(sec.llm).strip(), t, **kw)
    e.validate(llms, domains, tasks)
    events.append(e)
  if not events:
    return None
  splits = config_lists.names(c.get("splits", "test"))
  if not splits:
    raise errors.ConfigError("config.data.sim_events.splits is empty (name the query streams the "
                             "events follow, e.g. 'test')")
  return PoolEvents(events, splits)


# The drift study's names of the events (gp_jax/runs/studies/drift.py) and the section each sets.
STUDY_EVENTS = {"quality_drop": "quality", "price_rise": "price", "fail": "fail", "join": "join"}


def config_overrides(event: str, llm: str, t: int, splits: str, *, delta: float = 0.0,
                     price_scale: float = 1.0) -> dict:
  """The dotted data.sim_events keys of one event, named as the drift study names it: `llm`
  changes from position `t` of the streams of `splits` on (quality_drop shifts its skill by
  `delta`, price_rise multiplies its prices by `price_scale`).

  Raises:
    ConfigError: an unknown event name.
  """
  if event not in STUDY_EVENTS:
    raise errors.unknown_name("pool event", event, tuple(STUDY_EVENTS))
  sec = f"data.sim_events.{STUDY_EVENTS[event]}"
  extra = {"quality_drop": {"delta": delta}, "price_rise": {"scale": price_scale}}.get(event, {})
  return {f"{sec}.llm": llm, **{f"{sec}.{k}": v for k, v in extra.items()}, f"{sec}.t": int(t),
          "data.sim_events.splits": splits}


def cleared_overrides() -> dict:
  """Dotted keys that turn every configured event off."""
  return {f"data.sim_events.{k}.llm": "" for k in KINDS}
