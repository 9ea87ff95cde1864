"""Messages for each role call, built from the role templates and the workflow tree."""
from __future__ import annotations

from gp_jax.workflow import mdp
from gp_jax.workflow import roles as roles_lib


def children_block(state: mdp.WorkflowState, node: mdp.Node) -> str:
  return "\n".join(f"Sub-question: {state.nodes[c].text}\nAnswer: {state.nodes[c].answer}"
                   for c in node.children)


def build_messages(role: roles_lib.Role, state: mdp.WorkflowState, cfg: mdp.MDPConfig,
                   task_description: str, answer_format: str) -> list[dict]:
  """The chat messages of `role` acting on the current node of `state`."""
  node = state.node
  context = ""
  if role.kind == "executor":
    if state.at_final_answer:
      context = f"Draft answer from the team: {node.answer}\n"
    elif node.thought:
      context = f"Notes: {node.thought}\n"
  width = cfg.phase1_width if cfg.phase1 else cfg.max_width
  fields = dict(
      query=node.text,
      task_description=task_description,
      answer_format=answer_format,
      context=context,
      children=children_block(state, node) if role.kind in ("summarizer", "verifier") else "",
      max_width=width,
      width_rule="exactly" if cfg.phase1 else "at most",
  )
  return [{"role": "system", "content": role.system.format(**fields)},
          {"role": "user", "content": role.user.format(**fields)}]
