r"""The simulated world's version and parameters: `sim.world = v1 | v2` (config section `sim`).

v1 is the world of gp_jax/sim/simulator.py as it was first built: the text states a query's step
count exactly, and every LLM's success probability is a fixed function of features the text shows
(domain, task, a noisy difficulty word, the step count). Nothing a memory of past calls holds is
news to a router that reads the text. `SimWorld(params=None)` is v1, bit for bit
(tests/sim/test_world_v1_pinned.py).

v2 (`WorldParams`) adds hidden structure, each piece a stated parameter:

  step cue      The text states k_shown = clip(round(k + N(0, step_cue_sd^2)), 1, 5) steps, not
                the step count k; the outcome model still uses k. Noise fixed per node key.
                step_cue_sd = 0.7 steps: an ASSUMPTION (no published figure on how well a
                question's wording predicts the number of reasoning steps it needs).
  clusters      Every query belongs to one of `clusters_per_domain` latent clusters of its domain
                (uniform, fixed per query key; its sub-questions inherit it). A cluster has a
                theme, two words of the domain's vocabulary distinct from every other cluster's,
                and its queries' texts are "about <theme>": clusters are visible only through text
                similarity (and through past outcomes). clusters_per_domain = 6: an ASSUMPTION.
  offsets       Executor m on a node of cluster c of domain d has logit skill
                theta[m, d] + delta[d, c, m], delta = cluster_offset_sd * z, z ~ N(0, 1) fixed per
                (domain, cluster, LLM) and centred over the clusters of each (domain, LLM), so the
                domain skill of data/simulator.json is kept on average. Shared by every query of a
                cluster, independent across clusters and LLMs. Planning, summarising, final-answer,
                thinking and verifying qualities do not see the offsets.
                Default size: see docs/simulator.md ("v2: sources and assumptions"); `oracle_gap`
                measures the oracle-over-best-single gap it gives on a pool.

and the parameters the calibration (gp_jax/sim/calibration.py) fits, each with v1's value as its
default (so a v2 world with step_cue_sd = 0 and cluster_offset_sd = 0 has v1's probabilities):

  gamma           logit penalty per extra step answered in one go (v1: 1.2)
  split_penalty   hardness added to a sub-question (context lost by splitting; v1: 0.6)
  summary_shift   logit added to every summarizer's quality sigmoid(2.5 + 0.8 g) (v1: 0)
  final_shift     logit added to every final-answer quality sigmoid(3.0 + 0.8 g) (v1: 0)
  complexity_tilt p(k) proportional to p_v1(k) exp(tilt * (k - 1)), k = 1..4 (v1: 0)
  verbosity_scale factor on every LLM's verbosity (v1: 1)
  skill_shift     {llm: logit added to theta[m, d] on every domain} (v1: none); its planning,
                  summarising, final and thinking qualities follow (they derive from mean skill)
  domain_hardness {domain: shift of the mean root hardness of its tasks} (v1: none; the tasks'
                  hardness offsets in simulator.TASKS are assumptions, and the per-domain
                  targets need them moved: docs/calibration.md)

A world file (JSON, config `sim.world_file`) holds these fields ({"params": {...}} as written by
experiments/calibrate.py, or the fields at top level); a field it omits keeps its default.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import math
import pathlib

import numpy as np

from gp_jax import errors

WORLDS = ("v1", "v2")
V1_COMPLEXITY_PROBS = (0.4, 0.25, 0.2, 0.15)
MAX_SHOWN_STEPS = 5


@dataclasses.dataclass(frozen=True)
class WorldParams:
  """The v2 world (module docstring). Defaults: the v2 mechanisms on, v1's fitted values."""
  step_cue_sd: float = 0.7
  clusters_per_domain: int = 6
  cluster_offset_sd: float = 0.8
  gamma: float = 1.2
  split_penalty: float = 0.6
  summary_shift: float = 0.0
  final_shift: float = 0.0
  complexity_tilt: float = 0.0
  verbosity_scale: float = 1.0
  skill_shift: tuple = ()          # ((llm, logit shift), ...), sorted by name
  domain_hardness: tuple = ()      # ((domain, hardness shift), ...), sorted by name

  def __post_init__(self):
    for name in ("skill_shift", "domain_hardness"):   # {name: shift} is accepted, kept sorted
      value = getattr(self, name)
      if isinstance(value, dict):
        object.__setattr__(self, name, tuple(sorted((str(k), float(v)) for k, v in value.items())))
    checks = [("step_cue_sd", self.step_cue_sd >= 0), ("cluster_offset_sd", self.cluster_offset_sd >= 0),
              ("clusters_per_domain", 1 <= int(self.clusters_per_domain) <= 30),
              ("gamma", self.gamma >= 0), ("verbosity_scale", self.verbosity_scale > 0),
              ("complexity_tilt", abs(self.complexity_tilt) <= 5)]
    for name, ok in checks:
      value = getattr(self, name)
      if not ok or not math.isfinite(float(value)):
        raise errors.ConfigError(f"world parameter {name}={value!r} is out of its range")
    for field in ("skill_shift", "domain_hardness"):
      for name, shift in getattr(self, field):
        if not math.isfinite(float(shift)):
          raise errors.ConfigError(f"world parameter {field}[{name!r}]={shift!r} is not finite")

  @property
  def complexity_probs(self) -> np.ndarray:
    w = np.array(V1_COMPLEXITY_PROBS) * np.exp(self.complexity_tilt * np.arange(4))
    return w / w.sum()

  def shift_of(self, llm: str) -> float:
    return dict(self.skill_shift).get(llm, 0.0)

  def hardness_of(self, domain: str) -> float:
    return dict(self.domain_hardness).get(domain, 0.0)

  def replace(self, **changes) -> "WorldParams":
    return dataclasses.replace(self, **changes)

  def to_json(self) -> dict:
    d = dataclasses.asdict(self)
    d["skill_shift"], d["domain_hardness"] = dict(self.skill_shift), dict(self.domain_hardness)
    return d

  @classmethod
  def from_json(cls, raw: dict, where: str = "world file") -> "WorldParams":
    if not isinstance(raw, dict):
      raise errors.ConfigError(f"{where}: expected a JSON object of world parameters")
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - fields)
    if unknown:
      raise errors.ConfigError(f"{where}: unknown world parameters {unknown} (known: {sorted(fields)})")
    raw = dict(raw)
    for name in ("skill_shift", "domain_hardness"):
      if name in raw and not isinstance(raw[name], dict):
        raise errors.ConfigError(f"{where}: {name} must be an object {{name: shift}}")
    try:
      return cls(**raw)
    except (TypeError, ValueError) as e:
      raise errors.ConfigError(f"{where}: {e}") from None


def load_world_file(path) -> WorldParams:
  path = pathlib.Path(path).expanduser()
  if not path.is_file():
    raise errors.ConfigError(f"sim.world_file {str(path)!r} does not exist")
  try:
    raw = json.loads(path.read_text())
  except (OSError, ValueError) as e:
    raise errors.ConfigError(f"sim.world_file {str(path)!r} is not readable JSON: {e}") from None
  if isinstance(raw, dict) and "params" in raw:
    raw = raw["params"]
  return WorldParams.from_json(raw, where=f"sim.world_file {str(path)!r}")


def from_config(sim_cfg) -> WorldParams | None:
  """The world of config section `sim` (None or world = v1: v1, None returned)."""
  if sim_cfg is None:
    return None
  world = str(sim_cfg.get("world", "v1"))
  world_file = str(sim_cfg.get("world_file", "") or "")
  if world not in WORLDS:
    raise errors.ConfigError(f"config.sim.world must be one of {WORLDS}, got {world!r}")
  if world == "v1":
    if world_file:
      raise errors.ConfigError("config.sim.world_file needs sim.world='v2' (v1 has no parameters)")
    return None
  return load_world_file(world_file) if world_file else WorldParams()


def themes(vocab: list[str], domain: str, n: int, rng_factory) -> list[tuple[str, str]]:
  """n distinct word pairs of a domain's vocabulary, fixed per domain (the clusters' themes)."""
  pairs = list(itertools.combinations(vocab, 2))
  if n > len(pairs):
    raise errors.ConfigError(f"{n} clusters need more themes than domain {domain!r} has")
  order = rng_factory("themes", domain).permutation(len(pairs))
  return [pairs[i] for i in order[:n]]


def cluster_offsets(domain: str, llms, params: WorldParams, rng_factory) -> dict[str, np.ndarray]:
  """{llm: offsets over the domain's clusters}, centred per LLM (module docstring)."""
  out = {}
  for m in llms:
    z = rng_factory("offset", domain, m).standard_normal(params.clusters_per_domain)
    z = z - z.mean() if params.clusters_per_domain > 1 else np.zeros(1)
    out[m] = params.cluster_offset_sd * z
  return out


def oracle_gap(world, queries, llms) -> dict:
  """Per-query oracle over single LLMs against the best single LLM, on direct answers.

  best_single: max over LLMs of the mean P(correct); oracle: the mean over queries of
  P(at least one LLM answers correctly) = 1 - prod_m (1 - p_m), the expected accuracy of the
  per-query oracle over recorded outcomes (outcomes are independent draws given the latents, as
  the simulated pool samples them); oracle_expected: the mean of max_m p_m (an oracle that knows
  each LLM's success probability, not its outcome). All in [0, 1]."""
  p = np.array([[world.exec_probability(world.lookup(q.query), m) for m in llms] for q in queries])
  best = p.mean(axis=0)
  return {"best_single": float(best.max()), "best_llm": llms[int(best.argmax())],
          "oracle": float(np.mean(1.0 - np.prod(1.0 - p, axis=1))),
          "oracle_expected": float(np.mean(p.max(axis=1))), "n_queries": len(queries)}
