"""The prompt contract (gp_jax/workflow/prompts.py) both ways: every prompt the workflow renders is
read back by the simulated pool into the right kind and fields, every marker the pool relies on is
in the rendered prompts (pinned to the exact text), and a roles file without them is refused."""
import dataclasses
import json

import numpy as np
import pytest

from experiments.configs import test as test_config
from gp_jax import errors
from gp_jax.llm import base
from gp_jax.runs import system as system_lib
from gp_jax.sim import simulator as sim
from gp_jax.workflow import mdp
from gp_jax.workflow import policies
from gp_jax.workflow import prompts
from gp_jax.workflow import roles as roles_lib

LINE_MARKERS = ("QUESTION", "MAIN_QUESTION", "NOTES", "DRAFT", "SUBQUESTION", "ANSWER")


class _Recording(base.LLMPool):
  """Passes every call to the simulated pool and keeps (messages, what the pool read, output)."""

  def __init__(self, inner: sim.SimulatorPool):
    super().__init__(inner.catalog)
    self.inner, self.seen = inner, []

  async def chat(self, model, messages, params=base.SamplingParams()):
    out = await self.inner.chat(model, messages, params)
    self.seen.append((messages, self.inner.read(messages), out))
    return out


def _every_kind_policy(space: mdp.ActionSpace, expected: list):
  """Verifier, summarizer, planner at the root, thinker, executor: the first the mask allows,
  with the LLMs in turn. Records what the pool should read from the call it chooses."""
  order = ["verifier", "summarizer", "planner", "thinker", "executor"]

  def act(query, state, mask, rng):
    node = state.node
    for kind in order:
      if kind == "planner" and node.depth > 0:
        continue
      allowed = np.flatnonzero(mask & space.kind_mask([kind]))
      if len(allowed):
        action = int(allowed[state.steps % len(allowed)])
        break
    else:
      raise AssertionError("no action allowed")
    role, _ = space.decode(action)
    children = tuple((state.nodes[c].text, state.nodes[c].answer) for c in node.children)
    expected.append(dict(
        kind=role.kind, question=node.text,
        draft=f"{prompts.DRAFT}{node.answer}" if state.at_final_answer else None,
        notes=node.thought if role.kind == "executor" and node.thought and
        not state.at_final_answer else None,
        children=children if role.kind in prompts.CHILDREN_KINDS else ()))
    return action
  return act


def _run(phase1: bool):
  cfg = test_config.get_config()
  if phase1:
    cfg.mdp.phase1_depth, cfg.mdp.phase1_width = 1, 2
  else:
    cfg.roles = "planner,executor,summarizer,thinker,verifier"
    cfg.mdp.step_cap = 24
  system = system_lib.build(cfg)
  env = system.env(0.0)
  env.pool = _Recording(env.pool)
  expected = []
  states = policies.run_policy(env, _every_kind_policy(system.space, expected),
                               system.train_queries[:3], seed=0, concurrency=1)
  return system, states, env.pool.seen, expected


@pytest.fixture(scope="module", params=["phase1", "phase2"])
def episodes(request):
  return (request.param,) + _run(request.param == "phase1")


def test_every_rendered_prompt_is_read_back(episodes):
  phase, system, states, seen, expected = episodes
  assert len(seen) == len(expected) == sum(len(s.calls) for s in states)
  kinds = {e["kind"] for e in expected}
  assert kinds == ({"planner", "executor", "summarizer"} if phase == "phase1" else
                   {"planner", "executor", "summarizer", "thinker", "verifier"})
  for (messages, reading, out), want in zip(seen, expected):
    assert out.error is None, (want["kind"], out.error)
    assert reading.kind == want["kind"] and reading.question == want["question"]
    assert reading.draft == want["draft"] and reading.notes == want["notes"]
    assert reading.children == want["children"]
    if reading.kind == "planner":
      width = system.mdp_cfg.phase1_width if phase == "phase1" else system.mdp_cfg.max_width
      assert (reading.width, reading.exact) == (width, phase == "phase1")
  # The episodes met every context: notes, a final answer's draft, verified children.
  assert any(w["notes"] for w in expected) == (phase == "phase2")
  assert any(w["draft"] for w in expected) and any(w["children"] for w in expected)
  assert all(s.final_answer is not None for s in states)


def test_every_marker_is_in_the_rendered_prompts(episodes):
  phase, system, _, seen, _ = episodes
  users = [m[1]["content"] for m, _, _ in seen]
  systems = [m[0]["content"] for m, _, _ in seen]
  markers = LINE_MARKERS if phase == "phase2" else ("QUESTION", "MAIN_QUESTION", "DRAFT",
                                                     "SUBQUESTION", "ANSWER")
  for name in markers:
    marker = getattr(prompts, name)
    assert any(line.startswith(marker) for u in users for line in u.splitlines()), name
  width = prompts.PLANNER_WIDTH.format(
      width_rule=prompts.EXACTLY if phase == "phase1" else prompts.AT_MOST,
      max_width=system.mdp_cfg.phase1_width if phase == "phase1" else system.mdp_cfg.max_width)
  assert any(width in s for s in systems)
  for role in system.space.roles.roles:
    assert any(s.startswith(prompts.system_prefix(role)) for s in systems), role.name


def _state_with(cfg: mdp.MDPConfig, outputs: list[tuple[str, str]]) -> mdp.WorkflowState:
  """A workflow state after the calls (kind, output) on 'Q?' (task 'T')."""
  state = mdp.new_state("Q?")
  for i, (kind, output) in enumerate(outputs):
    mdp.apply(state, mdp.Call(step=i, action=0, role=kind, kind=kind, llm="m", node=state.current,
                              input_text=state.node.text, output_text=output, input_tokens=0,
                              output_tokens=0, cost_usd=0.0, latency_s=0.0, error=None), cfg)
  return state


def test_rendered_prompts_are_pinned():
  """The exact text of each kind's messages: changing a marker (or a template) changes every
  prompt's token count, hence every simulated cost and documented number."""
  roles = roles_lib.load_roles()
  cfg = mdp.MDPConfig()

  def render(kind, state, c=cfg):
    m = prompts.build_messages(roles[kind], state, c, "T", "F")
    return m[0]["content"], m[1]["content"]

  system, user = render("planner", _state_with(cfg, []))
  assert system == ("You are the Planner in a team of language-model agents. Break the user's "
                    "question into at most 3 simpler sub-questions that together answer it. Write "
                    "exactly one sub-question per line, with no numbering and no other text.")
  assert user == "Task: T\nQuestion: Q?"
  phase1 = dataclasses.replace(cfg, phase1_depth=1, phase1_width=2)
  assert "question into exactly 2 simpler sub-questions" in render("planner", _state_with(cfg, []),
                                                                   phase1)[0]
  assert render("executor", _state_with(cfg, [("thinker", "n1 n2")]))[1] == (
      "Task: T\nNotes: n1 n2\nQuestion: Q?")
  assert render("thinker", _state_with(cfg, []))[1] == "Task: T\nQuestion: Q?"
  planned = [("planner", "A?\nB?"), ("executor", "x Answer: 1"), ("executor", "y Answer: 2")]
  children = ("Main question: Q?\nSub-question: A?\nAnswer: x Answer: 1\nSub-question: B?\n"
              "Answer: y Answer: 2")
  assert render("summarizer", _state_with(cfg, planned))[1] == children
  assert render("verifier", _state_with(cfg, planned))[1] == children
  final = _state_with(cfg, planned + [("summarizer", "z Answer: 3")])
  assert final.at_final_answer
  system, user = render("executor", final)
  assert system == ("You are the Executor in a team of language-model agents. Answer the question "
                    "directly. F")
  assert user == "Task: T\nDraft answer from the team: z Answer: 3\nQuestion: Q?"


def _roles_file(tmp_path, edit):
  raw = json.loads(roles_lib.DEFAULT_ROLES_FILE.read_text())
  by_name = {r["name"]: r for r in raw["roles"]}
  edit(by_name)
  path = tmp_path / "roles.json"
  path.write_text(json.dumps(raw))
  return path


@pytest.mark.parametrize("edit, message", [
    (lambda r: r["executor"].update(user="Task: {task_description}\n{context}Q: {query}"),
     r"roles\[1\].user \(executor\) needs a line 'Question: \{query\}'"),
    (lambda r: r["planner"].update(user="Question: {query} ({task_description})"),
     r"roles\[0\].user \(planner\) needs a line 'Question: \{query\}'"),
    (lambda r: r["summarizer"].update(user="Question: {query}\n{children}"),
     r"roles\[2\].user \(summarizer\) needs a line 'Main question: \{query\}'"),
    (lambda r: r["planner"].update(system="Split the question into {max_width} parts."),
     r"roles\[0\].system \(planner\) needs 'into \{width_rule\} \{max_width\} simpler'"),
    (lambda r: r["thinker"].update(system="{answer_format} Think."),
     r"roles\[3\].system starts with a field"),
    (lambda r: r["verifier"].update(system="You are the Summarizer in a team of language-model "
                                           "agents. {children}"),
     r"roles\[4\].system \(verifier\) and roles\[2\].system \(summarizer\) start alike"),
])
def test_a_roles_file_without_its_markers_is_refused(tmp_path, edit, message):
  with pytest.raises(errors.DataError, match=message):
    roles_lib.load_roles(_roles_file(tmp_path, edit))


def test_the_shipped_roles_file_keeps_the_contract(tmp_path):
  names = roles_lib.load_roles().names
  assert roles_lib.load_roles(_roles_file(tmp_path, lambda r: None)).names == names
  # A template may move its question line, as long as the marker starts it.
  path = _roles_file(tmp_path, lambda r: r["executor"].update(
      user="{context}Question: {query}\nTask: {task_description}"))
  assert roles_lib.load_roles(path)["executor"].user.startswith("{context}Question: ")
