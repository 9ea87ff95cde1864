"""The v2 world (gp_jax/sim/world.py): each mechanism changes exactly what it says, the config
switch reaches the simulated data, and the exact optimum still matches brute force."""
import json
import math
import pathlib
import re

import numpy as np
import pytest

from experiments.configs import test as test_config
from gp_jax import errors
from gp_jax.llm import catalog as catalog_lib
from gp_jax.runs import system as system_lib
from gp_jax.sim import simulator as sim
from gp_jax.sim import world as world_lib
from gp_jax.workflow import mdp
from tests.sim import test_optimal

NAMES = ["qwen2.5-7b-instruct", "llama-3.1-8b-instruct", "llama3-chatqa-1.5-70b"]
_WORDS = {w: k for k, w in sim._K_WORDS.items()}


def _world(v1=False, **params):
  profiles = sim.load_profiles(catalog_lib.load_catalog().select(NAMES))
  return sim.SimWorld(profiles, params=None if v1 else world_lib.WorldParams(**params))


def _queries(world, n=300):
  return world.sample_queries(n, seed=0, split="train")


def _stated_steps(text: str) -> int:
  return _WORDS[re.search(r" (\w+)-step ", text).group(1)]


def _logit(p):
  return math.log(p / (1 - p))


def test_v2_with_both_mechanisms_off_has_v1_latents_and_probabilities():
  v1, v2 = _world(v1=True), _world(step_cue_sd=0.0, cluster_offset_sd=0.0)
  for a, b in zip(_queries(v1, 100), _queries(v2, 100)):
    assert (a.meta, a.ground_truth, a.task_name) == (b.meta, b.ground_truth, b.task_name)
    na, nb = v1.lookup(a.query), v2.lookup(b.query)
    assert [v1.exec_probability(na, m) for m in NAMES] == [v2.exec_probability(nb, m) for m in NAMES]
    assert _stated_steps(a.query) == _stated_steps(b.query) == na.complexity


def _params(**changes):
  return {"step_cue_sd": 0.0, "cluster_offset_sd": 0.0, **changes}


def _world_params(**changes):
  return _world(**_params(**changes))


def test_step_cue_noise_changes_only_the_stated_count():
  exact, noisy = _world_params(), _world_params(step_cue_sd=0.8)
  qa, qb = _queries(exact), _queries(noisy)
  stated = np.array([_stated_steps(q.query) for q in qb])
  true_k = np.array([q.meta["complexity"] for q in qb])
  assert all(_stated_steps(q.query) == q.meta["complexity"] for q in qa)
  wrong = np.mean(stated != true_k)
  assert 0.2 < wrong < 0.8                                   # a cue, not the count ...
  assert np.corrcoef(stated, true_k)[0, 1] > 0.5              # ... but an informative one
  assert stated.min() >= 1 and stated.max() <= world_lib.MAX_SHOWN_STEPS
  for a, b in zip(qa, qb):   # the latents and the outcome model do not move
    assert a.meta == b.meta and a.ground_truth == b.ground_truth
    assert ([exact.exec_probability(exact.lookup(a.query), m) for m in NAMES]
            == [noisy.exec_probability(noisy.lookup(b.query), m) for m in NAMES])


def test_cluster_offsets_are_shared_within_a_cluster_and_not_across():
  flat, off = _world_params(), _world_params(cluster_offset_sd=0.8)
  deltas = {}   # (domain, cluster) -> per-LLM logit offsets seen on each of its queries
  for a, b in zip(_queries(flat), _queries(off)):
    na, nb = flat.lookup(a.query), off.lookup(b.query)
    assert na.cluster == nb.cluster >= 0 and a.meta == b.meta
    d = tuple(round(_logit(off.exec_probability(nb, m)) - _logit(flat.exec_probability(na, m)), 6)
              for m in NAMES)
    deltas.setdefault((nb.domain, nb.cluster), set()).add(d)
  assert all(len(v) == 1 for v in deltas.values())           # one offset vector per cluster
  vectors = [next(iter(v)) for v in deltas.values()]
  assert len(set(vectors)) == len(vectors) > 10               # distinct across clusters
  sd = np.std(np.array(vectors))
  assert 0.4 < sd < 1.2                                       # the stated size (0.8) in range
  for domain in {d for d, _ in deltas}:                       # centred per (domain, LLM)
    per = np.array([off.cluster_offset(domain, c, m) for c in range(6) for m in NAMES]).reshape(6, 3)
    np.testing.assert_allclose(per.mean(axis=0), 0.0, atol=1e-12)


def test_clusters_show_in_the_text_only_through_their_theme():
  w = _world_params(cluster_offset_sd=0.8)
  qs = _queries(w, 200)
  for q in qs:
    node = w.lookup(q.query)
    a, b = w.theme(node.domain, node.cluster)
    assert f"about {a} and {b}:" in q.query
    kids = w.children(node, NAMES[0], 3, False)
    assert all(k.cluster == node.cluster and f"about {a} and {b}:" in k.text for k in kids)
    assert all(w.cluster_offset(k.domain, k.cluster, m) == w.cluster_offset(node.domain, node.cluster, m)
               for k in kids for m in NAMES)
  for domain in sim._VOCAB:
    themes = [w.theme(domain, c) for c in range(6)]
    assert len(set(themes)) == 6


def test_fitted_parameters_move_what_they_name():
  base = _world_params()
  q = _queries(base, 40)
  steep = _world_params(gamma=2.0)
  shifted = _world_params(skill_shift={"qwen2.5-7b-instruct": 0.5})
  for qq, qs, qh in zip(q, _queries(steep, 40), _queries(shifted, 40)):
    nb = base.lookup(qq.query)
    k = nb.complexity
    ns, nh = steep.lookup(qs.query), shifted.lookup(qh.query)
    assert qq.meta == qs.meta == qh.meta
    for m in NAMES:
      assert _logit(base.exec_probability(nb, m)) - _logit(steep.exec_probability(ns, m)) == \
          pytest.approx(0.8 * (k - 1), abs=1e-9)
      want = 0.5 if m == "qwen2.5-7b-instruct" else 0.0
      assert _logit(shifted.exec_probability(nh, m)) - _logit(base.exec_probability(nb, m)) == \
          pytest.approx(want, abs=1e-9)
  harder = _world_params(domain_hardness={"math": 0.7})
  for qq, qd in zip(q, _queries(harder, 40)):
    want = 0.7 if qq.domain == "math" else 0.0
    assert qd.meta["hardness"] - qq.meta["hardness"] == pytest.approx(want, abs=1e-9)
    assert qd.meta["complexity"] == qq.meta["complexity"] and qd.ground_truth == qq.ground_truth
  tilted = world_lib.WorldParams(complexity_tilt=1.0).complexity_probs
  assert tilted.sum() == pytest.approx(1.0) and tilted[3] > 0.15 and tilted[0] < 0.4
  s = _world_params(summary_shift=1.0, final_shift=-1.0)
  for m in NAMES:
    assert s.profiles[m].summary_quality > base.profiles[m].summary_quality
    assert s.profiles[m].final_quality < base.profiles[m].final_quality


def test_oracle_gap_grows_with_the_offsets():
  gaps = []
  for size in (0.0, 0.8, 1.6):
    w = _world_params(cluster_offset_sd=size)
    g = world_lib.oracle_gap(w, _queries(w, 300), NAMES)
    assert 0 <= g["best_single"] <= g["oracle_expected"] <= g["oracle"] <= 1
    gaps.append(g["oracle_expected"] - g["best_single"])
  assert gaps[0] < gaps[1] < gaps[2]


def test_config_switch(tmp_path):
  cfg = test_config.get_config()
  assert system_lib.build(cfg).world.params is None           # v1 is the default
  cfg.sim.world = "v2"
  world = system_lib.build(cfg).world
  assert world.params == world_lib.WorldParams()
  assert all(world.lookup(q.query).cluster >= 0 for q in world.sample_queries(5, seed=0, split="x"))
  path = tmp_path / "world.json"
  path.write_text(json.dumps({"params": {"gamma": 0.9, "skill_shift": {NAMES[0]: -0.25}}}))
  cfg.sim.world_file = str(path)
  params = system_lib.build(cfg).world.params
  assert params.gamma == 0.9 and params.shift_of(NAMES[0]) == -0.25
  assert params.step_cue_sd == world_lib.WorldParams().step_cue_sd
  for bad, message in [({"world": "v3"}, "sim.world"), ({"world": "v1", "world_file": str(path)}, "needs"),
                       ({"world": "v2", "world_file": str(tmp_path / "nope.json")}, "does not exist")]:
    c = test_config.get_config()
    c.sim.update(bad)
    with pytest.raises(errors.ConfigError, match=message):
      system_lib.build(c)
  c = test_config.get_config()
  c.sim.world, c.data.source = "v2", "files"
  with pytest.raises(errors.ConfigError, match="data.source='simulated'"):
    system_lib.build(c)
  committed = world_lib.load_world_file(pathlib.Path(__file__).parents[2] / "data" / "world_v2.json")
  assert committed.domain_hardness and committed.skill_shift and committed.cluster_offset_sd == 0.8
  path.write_text(json.dumps({"gama": 1.0}))
  with pytest.raises(errors.ConfigError, match="unknown world parameters"):
    world_lib.load_world_file(path)
  with pytest.raises(errors.ConfigError, match="out of its range"):
    world_lib.WorldParams(cluster_offset_sd=-1.0)


@pytest.mark.parametrize("alpha", [0.0, 0.5])
@pytest.mark.parametrize("cfg", [
    mdp.MDPConfig(p_max=2, max_width=2, max_depth=2, step_cap=16),
    mdp.MDPConfig(phase1_depth=1, phase1_width=2, step_cap=16),
])
def test_dp_matches_brute_force_on_v2(tiny_world, cfg, alpha):
  names = tiny_world["names"]
  world = sim.SimWorld(sim.load_profiles(tiny_world["catalog"]),
                       params=world_lib.WorldParams(cluster_offset_sd=1.2, step_cue_sd=0.8,
                                                    gamma=1.0, split_penalty=0.3, summary_shift=0.5,
                                                    skill_shift={names[0]: 0.4}))
  v2 = dict(tiny_world, world=world, pool=sim.SimulatorPool(tiny_world["catalog"], tiny_world["roles"], world))
  env, solver = test_optimal.make(v2, ["planner", "executor", "summarizer"], cfg, alpha)
  queries = world.sample_queries(3, seed=1, split="bf")
  for q in queries:
    assert world.lookup(q.query).cluster >= 0
    assert solver.value(q) == pytest.approx(test_optimal.brute_force(env, world, q, alpha), abs=1e-9)
