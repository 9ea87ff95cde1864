"""Every transition and mask rule of the routing MDP."""
import numpy as np
import pytest

from gp_jax import errors
from gp_jax.workflow import mdp
from gp_jax.workflow import roles as roles_lib

LLMS = ("a", "b")


def space(names=("planner", "executor", "summarizer")):
  return mdp.ActionSpace(roles_lib.load_roles().select(list(names)), LLMS)


def call(state, sp, role, llm="a", text="out", error=None):
  a = sp.encode(role, llm)
  r, _ = sp.decode(a)
  return mdp.Call(step=state.steps, action=a, role=r.name, kind=r.kind, llm=llm, node=state.current,
                  input_text=state.node.text, output_text=text, input_tokens=1, output_tokens=1,
                  cost_usd=0.0, latency_s=0.0, error=error)


def allowed(state, sp, cfg):
  m = mdp.action_mask(state, sp, cfg)
  return sorted({sp.decode(int(a))[0].name for a in np.flatnonzero(m)})


def test_action_index_is_role_times_k_plus_llm():
  sp = space()
  assert sp.size == 6
  assert sp.encode("summarizer", "b") == 2 * 2 + 1
  assert sp.decode(3)[0].name == "executor" and sp.decode(3)[1] == "b"


def test_full_episode_plan_execute_summarize_final():
  sp, cfg = space(), mdp.MDPConfig(p_max=2, max_width=3, max_depth=3)
  s = mdp.new_state("root q")
  assert allowed(s, sp, cfg) == ["executor", "planner"]
  mdp.apply(s, call(s, sp, "planner", text="sub one\nsub two\n\n"), cfg)
  assert s.nodes[0].status == mdp.PLANNING and s.planner_calls == 1
  assert [s.nodes[c].text for c in s.nodes[0].children] == ["sub one", "sub two"]
  assert s.current == 1
  mdp.apply(s, call(s, sp, "executor", text="ans1"), cfg)
  assert s.nodes[1].status == mdp.COMPLETED and s.current == 2   # next pending sibling
  mdp.apply(s, call(s, sp, "executor", text="ans2"), cfg)
  assert s.current == 0                                            # parent: all children done
  assert allowed(s, sp, cfg) == ["summarizer"]
  mdp.apply(s, call(s, sp, "summarizer", text="summary"), cfg)
  assert s.root_summarized and not s.done
  assert allowed(s, sp, cfg) == ["executor"]                     # final root executor only
  mdp.apply(s, call(s, sp, "executor", "b", text="final"), cfg)
  assert s.done and s.final_answer == "final"
  assert not mdp.action_mask(s, sp, cfg).any()


def test_direct_answer_ends_episode():
  sp, cfg = space(), mdp.MDPConfig()
  s = mdp.new_state("q")
  mdp.apply(s, call(s, sp, "executor", text="42"), cfg)
  assert s.done and s.final_answer == "42" and s.steps == 1


def test_planner_budget_and_depth_masks():
  sp = space()
  cfg = mdp.MDPConfig(p_max=1, max_width=2, max_depth=3)
  s = mdp.new_state("q")
  mdp.apply(s, call(s, sp, "planner", text="x\ny"), cfg)
  assert allowed(s, sp, cfg) == ["executor"]       # budget used up
  cfg2 = mdp.MDPConfig(p_max=5, max_width=2, max_depth=1)
  s = mdp.new_state("q")
  mdp.apply(s, call(s, sp, "planner", text="x\ny"), cfg2)
  assert allowed(s, sp, cfg2) == ["executor"]      # children at max depth


def test_planner_only_keeps_the_planners_the_mask_allows():
  sp, cfg = space(("planner", "executor", "summarizer", "thinker")), mdp.MDPConfig()
  root = mdp.action_mask(mdp.new_state("q"), sp, cfg)
  forced = mdp.planner_only(root, sp)
  assert sorted({sp.decode(int(a))[0].name for a in np.flatnonzero(forced)}) == ["planner"]
  assert np.array_equal(forced, root & sp.kind_mask(["planner"]))
  root[sp.encode("planner", "a")] = False           # an LLM the mask leaves out stays out
  assert np.flatnonzero(mdp.planner_only(root, sp)).tolist() == [sp.encode("planner", "b")]
  no_planner = mdp.action_mask(mdp.new_state("q"), sp, mdp.MDPConfig(p_max=0))
  assert np.array_equal(mdp.planner_only(no_planner, sp), no_planner)   # nothing to force there

def test_width_cap_and_numbered_lines():
  assert mdp.split_plan("1. a\n2) b\n- c\n* d", 3) == ["a", "b", "c"]


def test_nested_planning_dfs_order():
  sp, cfg = space(), mdp.MDPConfig(p_max=2, max_width=2, max_depth=3)
  s = mdp.new_state("q")
  mdp.apply(s, call(s, sp, "planner", text="c1\nc2"), cfg)
  mdp.apply(s, call(s, sp, "planner", text="g1\ng2"), cfg)        # plan child c1
  assert s.nodes[s.current].text == "g1" and s.nodes[s.current].depth == 2
  mdp.apply(s, call(s, sp, "executor"), cfg)
  mdp.apply(s, call(s, sp, "executor"), cfg)
  assert s.nodes[s.current].text == "c1" and allowed(s, sp, cfg) == ["summarizer"]
  mdp.apply(s, call(s, sp, "summarizer"), cfg)
  assert s.nodes[1].status == mdp.COMPLETED
  assert s.nodes[s.current].text == "c2"                          # DFS moves to the sibling
  mdp.apply(s, call(s, sp, "executor"), cfg)
  assert s.current == 0 and allowed(s, sp, cfg) == ["summarizer"]


def test_step_cap_ends_without_answer():
  sp, cfg = space(), mdp.MDPConfig(step_cap=3)
  s = mdp.new_state("q")
  mdp.apply(s, call(s, sp, "planner", text="a\nb\nc"), cfg)
  mdp.apply(s, call(s, sp, "executor"), cfg)
  mdp.apply(s, call(s, sp, "executor"), cfg)
  assert s.done and s.final_answer is None


def test_failed_planner_keeps_node_pending():
  sp, cfg = space(), mdp.MDPConfig(p_max=2)
  s = mdp.new_state("q")
  mdp.apply(s, call(s, sp, "planner", text="", error="timeout"), cfg)
  assert s.nodes[0].status == mdp.PENDING and s.planner_calls == 1 and not s.done
  assert "planner" in allowed(s, sp, cfg)


def test_thinker_and_verifier_rules():
  sp = space(("planner", "executor", "summarizer", "thinker", "verifier"))
  cfg = mdp.MDPConfig()
  s = mdp.new_state("q")
  assert allowed(s, sp, cfg) == ["executor", "planner", "thinker"]
  mdp.apply(s, call(s, sp, "thinker", text="notes"), cfg)
  assert s.current == 0 and s.nodes[0].thought == "notes"
  assert allowed(s, sp, cfg) == ["executor", "planner"]           # thinker once per node
  mdp.apply(s, call(s, sp, "planner", text="a\nb"), cfg)
  mdp.apply(s, call(s, sp, "executor", text="x"), cfg)
  mdp.apply(s, call(s, sp, "executor", text="y"), cfg)
  assert allowed(s, sp, cfg) == ["summarizer", "verifier"]
  mdp.apply(s, call(s, sp, "verifier", text="x2\ny2"), cfg)
  assert [s.nodes[c].answer for c in s.nodes[0].children] == ["x2", "y2"]
  assert allowed(s, sp, cfg) == ["summarizer"]


def test_phase1_fixed_structure():
  sp = space()
  cfg = mdp.MDPConfig(phase1_depth=2, phase1_width=2, step_cap=20)
  s = mdp.new_state("q")
  assert allowed(s, sp, cfg) == ["planner"]
  mdp.apply(s, call(s, sp, "planner", text="a\nb\nc"), cfg)
  assert len(s.nodes[0].children) == 2                            # width forced
  assert allowed(s, sp, cfg) == ["planner"]                       # depth 1 < 2 plans again
  mdp.apply(s, call(s, sp, "planner", text="g\nh"), cfg)
  assert allowed(s, sp, cfg) == ["executor"]
  assert cfg.max_calls() == 2 * 3 + 4 + 1


def test_config_validation():
  with pytest.raises(errors.ConfigError):
    mdp.MDPConfig(max_width=0).validate()
  with pytest.raises(errors.ConfigError):
    mdp.MDPConfig(phase1_depth=1).validate()


def test_role_selection_rules():
  roles = roles_lib.load_roles()
  with pytest.raises(errors.ConfigError, match="executor"):
    roles_lib.validate_role_selection(roles.select(["planner", "summarizer"]))
  with pytest.raises(errors.ConfigError, match="unknown role"):
    roles.select(["critic"])
