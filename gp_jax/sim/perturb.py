r"""Pool perturbations for training: the training pool changes every few iterations.

With `train.pool_perturb.enabled` (docs/memory.md, "Training under changing pools") the training
run is cut into phases of `every` iterations; in phase k = iteration // every each LLM m of the pool is,
independently, drawn from a generator seeded by (seed, k, m):
  skill    with probability skill_prob: its executor skill theta[m, d] shifts by delta ~
           U[delta_low, delta_high] logits on each domain d drawn with probability 1/2 (at least
           one), the same delta on all of them;
  price    with probability price_prob: both its prices are scaled by a factor drawn uniformly
           from PRICE_SCALES;
  fail     with probability fail_prob: every call to it fails (no text, no cost);
  absent   with probability absent_prob: it is not in the pool (masked, calls refused); it joins
           again in the next phase unless drawn absent again.
At least one LLM stays present and working in each phase: when every LLM would be absent or
failing, the lowest-indexed one is kept present and working. The perturbations act on the
training split only (keys of split "train"); every other split sees the configured pool and its
configured events (the wrapped PoolEvents). The object here answers what gp_jax/sim/events.py's
PoolEvents answers (skill_shift, price_scale, failed, absent, present_mask, has_joins), so the
simulator, the expected utility and the exact optimum follow the current phase's pool: set the
phase with `set_iteration` before an iteration's rollouts.
"""
from __future__ import annotations

import dataclasses
import hashlib
from typing import Sequence

import numpy as np

from gp_jax import errors
from gp_jax.sim import events as events_lib
from gp_jax.sim import simulator

PRICE_SCALES = (0.25, 0.5, 2.0, 4.0)
SPLIT = "train"


@dataclasses.dataclass(frozen=True)
class PerturbSettings:
  """The distribution of the module docstring (config section train.pool_perturb)."""
  every: int = 2
  skill_prob: float = 0.3
  delta_low: float = -3.0
  delta_high: float = 1.0
  price_prob: float = 0.2
  fail_prob: float = 0.1
  absent_prob: float = 0.1
  seed: int = 0

  def validate(self) -> None:
    if self.every < 1:
      raise errors.ConfigError(f"train.pool_perturb.every must be >= 1, got {self.every}")
    for name in ("skill_prob", "price_prob", "fail_prob", "absent_prob"):
      p = getattr(self, name)
      if not 0.0 <= p <= 1.0:
        raise errors.ConfigError(f"train.pool_perturb.{name} must lie in [0, 1], got {p}")
    if not self.delta_low <= self.delta_high:
      raise errors.ConfigError("train.pool_perturb.delta_low must be <= delta_high")


def simulated_domains() -> tuple[str, ...]:
  """The simulated domains (gp_jax/sim/simulator.py TASKS)."""
  return tuple(sorted({v[0] for v in simulator.TASKS.values()}))


def _rng(*keys) -> np.random.Generator:
  digest = hashlib.blake2b(repr(keys).encode(), digest_size=8).digest()
  return np.random.default_rng(int.from_bytes(digest, "little"))


def phase_events(s: PerturbSettings, phase: int, llms: Sequence[str],
                 domains: Sequence[str]) -> list[events_lib.PoolEvent]:
  """The perturbation of phase `phase` as pool events (t = 0) on the training split."""
  domains = sorted(domains)
  out, gone = [], []
  for m in llms:
    rng = _rng("perturb", s.seed, int(phase), m)
    u = rng.uniform(size=4)
    if u[0] < s.skill_prob:
      pick = rng.uniform(size=len(domains)) < 0.5
      if not pick.any():
        pick[rng.integers(len(domains))] = True
      delta = float(rng.uniform(s.delta_low, s.delta_high))
      out.append(events_lib.PoolEvent("quality", m, 0, delta=delta,
                                      domains=tuple(d for d, p in zip(domains, pick) if p)))
    if u[1] < s.price_prob:
      out.append(events_lib.PoolEvent("price", m, 0,
                                      scale=float(PRICE_SCALES[rng.integers(len(PRICE_SCALES))])))
    if u[2] < s.fail_prob:
      out.append(events_lib.PoolEvent("fail", m, 0))
      gone.append(m)
    if u[3] < s.absent_prob:
      out.append(events_lib.PoolEvent("join", m, 1 << 62))   # absent for the whole phase
      gone.append(m)
  if set(gone) >= set(llms) and llms:   # keep one LLM present and working
    keep = llms[0]
    out = [e for e in out if not (e.llm == keep and e.kind in ("fail", "join"))]
  return out


class PerturbedPool:
  """The configured events (any split) plus the current phase's perturbation (training split)."""

  def __init__(self, settings: PerturbSettings, llms: Sequence[str], domains: Sequence[str],
               base: events_lib.PoolEvents | None = None):
    settings.validate()
    self.settings, self.llms, self.domains = settings, tuple(llms), tuple(sorted(domains))
    self.base = base
    self.phase = -1
    self.current = events_lib.PoolEvents([], (SPLIT,))
    self.set_phase(0)

  def set_phase(self, phase: int) -> None:
    if phase != self.phase:
      self.phase = int(phase)
      self.current = events_lib.PoolEvents(
          phase_events(self.settings, self.phase, self.llms, self.domains), (SPLIT,))

  def set_iteration(self, iteration: int) -> None:
    """The phase of training iteration `iteration` (0-based)."""
    self.set_phase(int(iteration) // self.settings.every)

  def events(self) -> tuple[events_lib.PoolEvent, ...]:
    return self.current.events

  def __bool__(self) -> bool:
    return True

  def skill_shift(self, llm: str, key: str, domain: str, task: str) -> float:
    b = self.base.skill_shift(llm, key, domain, task) if self.base is not None else 0.0
    return b + self.current.skill_shift(llm, key, domain, task)

  def price_scale(self, llm: str, key: str) -> float:
    b = self.base.price_scale(llm, key) if self.base is not None else 1.0
    return b * self.current.price_scale(llm, key)

  def failed(self, llm: str, key: str) -> bool:
    return (self.base is not None and self.base.failed(llm, key)) or self.current.failed(llm, key)

  def absent(self, llm: str, key: str) -> bool:
    return (self.base is not None and self.base.absent(llm, key)) or self.current.absent(llm, key)

  def has_joins(self) -> bool:
    return True   # LLMs may be absent in some phase: the environment must ask

  def present_mask(self, llms: Sequence[str], key: str) -> np.ndarray:
    return np.array([not self.absent(m, key) for m in llms], bool)
