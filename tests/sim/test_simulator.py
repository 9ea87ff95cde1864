"""The simulator's sub-question texts: colliding texts, and the order-independent tagged mode."""
import pytest

from experiments.configs import test as test_config
from gp_jax.llm import catalog as catalog_lib
from gp_jax.runs import system as system_lib
from gp_jax.sim import simulator as sim
from gp_jax.workflow import policies

PLANNER = "qwen2.5-7b-instruct"


def _children_texts(unique: bool, order: str, monkeypatch) -> dict[str, list[str]]:
  """Texts of the sub-questions of two queries, planned in `order`, when every sub-question the
  planner writes has the same words (forced through _query_text)."""
  world = sim.SimWorld(sim.load_profiles(catalog_lib.load_catalog()), unique_texts=unique)
  roots = world.sample_queries(2, seed=0, split="train")
  nodes = {"a": world.lookup(roots[0].query), "b": world.lookup(roots[1].query)}
  monkeypatch.setattr(world, "_query_text", lambda *args: "the same words.")
  for name in order:
    world.children(nodes[name], PLANNER, 3, True)
  return {name: [k.text for k in world.children(nodes[name], PLANNER, 3, True)] for name in "ab"}


def test_colliding_texts_are_renamed_in_registration_order(monkeypatch):
  """The known limitation: without tags, who gets "(variant n)" depends on what ran first."""
  ab = _children_texts(False, "ab", monkeypatch)
  ba = _children_texts(False, "ba", monkeypatch)
  assert ab["a"][0] == "the same words." and ba["b"][0] == "the same words."
  assert ab["a"] != ba["a"] and ab["b"] != ba["b"]


def test_tagged_texts_do_not_depend_on_order(monkeypatch):
  ab = _children_texts(True, "ab", monkeypatch)
  ba = _children_texts(True, "ba", monkeypatch)
  assert ab == ba
  texts = ab["a"] + ab["b"]
  assert len(set(texts)) == 6
  assert all(t.startswith("the same words. (ref ") and "variant" not in t for t in texts)


@pytest.mark.parametrize("unique", [False, True])
def test_config_switch_reaches_the_workflow(unique):
  """data.sim_unique_texts: executors are asked the tagged sub-questions, and the pool still
  recognises them (no failed call)."""
  cfg = test_config.get_config()
  cfg.data.sim_unique_texts = unique
  system = system_lib.build(cfg)
  env = system.env(0.0)
  single = policies.single_llm_policy(system.space, system.space.llms[0])
  planner = system.space.encode("planner", system.space.llms[0])

  def plan_then_execute(query, state, mask, rng):
    return planner if state.steps == 0 and mask[planner] else single(query, state, mask, rng)

  states = policies.run_policy(env, plan_then_execute, system.train_queries[:4], seed=0)
  subs = [c.input_text for s in states for c in s.calls if c.kind == "executor" and c.node != 0]
  assert subs and all(c.error is None for s in states for c in s.calls)
  assert all(("(ref " in t) == unique for t in subs)
