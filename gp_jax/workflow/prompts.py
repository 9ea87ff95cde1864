"""Messages for each role call, built from the role templates and the workflow tree.

The prompt contract. Two readers depend on the exact text of these messages: the simulated pool
(gp_jax/sim/simulator.py), an LLM that reads every call back from its messages alone, and the exact
optimum (gp_jax/sim/optimal.py), which counts their tokens from the templates and the markers
without building the messages. The markers below are the only prompt text they know, and they take
them from here:

  marker          written by                               the simulated pool reads
  system_prefix   roles.json system template, up to its    the role's kind: the first role whose
                  first field                              prefix starts the system message
  PLANNER_WIDTH   roles.json planner system template,      the width, and whether it is exact
                  {width_rule} = EXACTLY or AT_MOST        (Phase 1) or a maximum
  QUESTION        roles.json user templates of planner,    the node: the rest of the last line
                  executor and thinker                     that starts with the marker
  MAIN_QUESTION   roles.json user templates of the         the node: the rest of the first line
                  CHILDREN_KINDS (summarizer, verifier)    that starts with the marker
  NOTES           executor context after a thinker         the notes (their author's quality)
  DRAFT           executor context at the root's final     that a final answer is asked, and the
                  answer                                   draft it restates
  SUBQUESTION,    children block of the CHILDREN_KINDS     (sub-question, answer) pairs, in order
  ANSWER

A served request's conversation (serving/conversation.py) may precede the template text of a
root call's user message: its lines start with its header or a role label ("System: ", "User: ",
"Assistant: "), never with a marker, so the readers above read the same fields.

QUESTION to ANSWER each start a line; the node's text and the notes are one line each (the
simulator's texts are). The optimum adds the tokens of NOTES, DRAFT, SUBQUESTION and ANSWER to
those of the rendered templates, so it counts exactly what `build_messages` sends.
`roles.load_roles` checks that every template of data/roles.json carries its markers (a DataError
naming the template otherwise), and tests/sim/test_prompt_contract.py renders every kind's prompts
and reads them back. A changed marker changes every prompt's token count, so every simulated cost
and documented number, and makes replay caches (keyed by the messages) miss.
"""
from __future__ import annotations

from gp_jax.workflow import mdp
from gp_jax.workflow import roles as roles_lib

# Markers of the roles.json templates (checked by roles.load_roles).
QUESTION = roles_lib.QUESTION
MAIN_QUESTION = roles_lib.MAIN_QUESTION
CHILDREN_KINDS = roles_lib.CHILDREN_KINDS
PLANNER_WIDTH = roles_lib.PLANNER_WIDTH
system_prefix = roles_lib.system_prefix
# The two values of {width_rule}: Phase 1 asks for exactly the width, Phase 2 for at most.
EXACTLY, AT_MOST = "exactly", "at most"
# Markers this module writes.
NOTES = "Notes: "                          # executor context: the thinker's notes on the node
DRAFT = "Draft answer from the team: "     # executor context at the root's final answer
SUBQUESTION = "Sub-question: "             # children block: one sub-question ...
ANSWER = "Answer: "                        # ... and its answer on the next line


def children_block(state: mdp.WorkflowState, node: mdp.Node) -> str:
  return "\n".join(f"{SUBQUESTION}{state.nodes[c].text}\n{ANSWER}{state.nodes[c].answer}"
                   for c in node.children)


def width_fields(cfg: mdp.MDPConfig) -> dict:
  """The template fields {max_width} and {width_rule} under `cfg` (Phase 1: exactly the width)."""
  return dict(max_width=cfg.phase1_width if cfg.phase1 else cfg.max_width,
              width_rule=EXACTLY if cfg.phase1 else AT_MOST)


def build_messages(role: roles_lib.Role, state: mdp.WorkflowState, cfg: mdp.MDPConfig,
                   task_description: str, answer_format: str, *,
                   conversation: str = "") -> list[dict]:
  """The chat messages of `role` acting on the current node of `state`.

  conversation: a served request's earlier turns (serving/conversation.py renders them; no line
  of it starts with a marker); the user message starts with it. Empty: the messages are exactly
  the role templates'."""
  node = state.node
  context = ""
  if role.kind == "executor":
    if state.at_final_answer:
      context = f"{DRAFT}{node.answer}\n"
    elif node.thought:
      context = f"{NOTES}{node.thought}\n"
  fields = dict(
      query=node.text,
      task_description=task_description,
      answer_format=answer_format,
      context=context,
      children=children_block(state, node) if role.kind in CHILDREN_KINDS else "",
      **width_fields(cfg),
  )
  user = role.user.format(**fields)
  if conversation:
    user = f"{conversation}\n\n{user}"
  return [{"role": "system", "content": role.system.format(**fields)},
          {"role": "user", "content": user}]
