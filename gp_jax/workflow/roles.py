"""Role registry: the agent roles a router can assign, read from data/roles.json.

A role has a `kind` that fixes its transition in the routing MDP (gp_jax/workflow/mdp.py):
  planner    pending node -> split into sub-queries (children), node becomes 'planning'
  executor   pending node -> answer it, node 'completed'; also the final answer at the root
  summarizer planning node whose children are all completed -> condense their answers
  thinker    pending node, once -> analysis notes that the next executor of the node reads
  verifier   planning node whose children are completed, once, before the summary -> checks and
             corrects the children's answers
Adding a role with one of these kinds is adding an entry to roles.json.

The templates carry the markers of the prompt contract (gp_jax/workflow/prompts.py): the user
template names the node on a `Question: {query}` line (summarizer, verifier: `Main question:
{query}`), the planner's system template states its width as `into {width_rule} {max_width}
simpler`, and the text of a system template before its first field tells its kind apart from the
other kinds'. `load_roles` checks every template for them.
"""
from __future__ import annotations

import dataclasses
import pathlib
from typing import Sequence

from gp_jax import errors
from gp_jax import paths

KINDS = ("planner", "executor", "summarizer", "thinker", "verifier")
# Fields each role's templates may use (filled by gp_jax/workflow/prompts.py).
TEMPLATE_FIELDS = ("query", "task_description", "answer_format", "context", "children",
                   "max_width", "width_rule")
DEFAULT_ROLES_FILE = paths.DATA_DIR / "roles.json"
# Template markers of the prompt contract (gp_jax/workflow/prompts.py exports them with its own).
QUESTION = "Question: "            # starts the line naming the node (user templates)
MAIN_QUESTION = "Main question: "  # the same for the kinds shown the children's answers:
CHILDREN_KINDS = ("summarizer", "verifier")
PLANNER_WIDTH = "into {width_rule} {max_width} simpler"   # in the planner's system template


@dataclasses.dataclass(frozen=True)
class Role:
  name: str
  kind: str
  description: str   # embedded into the role-hub features
  system: str        # system-message template
  user: str          # user-message template
  default: bool = False


@dataclasses.dataclass(frozen=True)
class RoleSet:
  """The roles of an action space, in order (the order defines the role index)."""
  roles: tuple[Role, ...]

  @property
  def names(self) -> list[str]:
    return [r.name for r in self.roles]

  def __len__(self) -> int:
    return len(self.roles)

  def __getitem__(self, name: str) -> Role:
    for r in self.roles:
      if r.name == name:
        return r
    raise errors.unknown_name("role", name, self.names)

  def indices_of_kind(self, kind: str) -> list[int]:
    return [i for i, r in enumerate(self.roles) if r.kind == kind]

  def select(self, names: Sequence[str]) -> "RoleSet":
    return RoleSet(tuple(self[n] for n in names))


def load_roles(path: str | pathlib.Path = DEFAULT_ROLES_FILE) -> RoleSet:
  """Reads and validates the roles file."""
  path = pathlib.Path(path)
  raw = errors.read_json(path, "roles file")
  roles = []
  for i, row in enumerate(raw.get("roles", [])):
    missing = {"name", "kind", "description", "system", "user"} - set(row)
    if missing:
      raise errors.DataError(f"{path}: roles[{i}] is missing field(s) {sorted(missing)}")
    if row["kind"] not in KINDS:
      raise errors.DataError(f"{path}: roles[{i}].kind {row['kind']!r} is not one of {KINDS}")
    for key in ("system", "user"):
      _check_template(path, i, key, row[key])
    roles.append(Role(**{k: row[k] for k in ("name", "kind", "description", "system", "user")},
                      default=bool(row.get("default", False))))
  if not roles:
    raise errors.DataError(f"{path}: no roles defined")
  _check_markers(path, roles)
  return RoleSet(tuple(roles))


def _check_template(path, i, key, template: str) -> None:
  import string
  for _, field, _, _ in string.Formatter().parse(template):
    if field is not None and field not in TEMPLATE_FIELDS:
      raise errors.DataError(f"{path}: roles[{i}].{key} uses unknown field {{{field}}}; "
                             f"allowed: {', '.join(TEMPLATE_FIELDS)}")


def system_prefix(role: Role) -> str:
  """The text of the role's system template before its first field (tells its kind apart)."""
  return role.system.split("{")[0]


def _check_markers(path, roles: Sequence[Role]) -> None:
  """The templates carry the markers the simulated pool reads (module docstring)."""
  for i, r in enumerate(roles):
    marker = MAIN_QUESTION if r.kind in CHILDREN_KINDS else QUESTION
    # {context} renders as whole lines (or nothing), so it may open the node's line.
    if not any(line.removeprefix("{context}") == marker + "{query}"
               for line in r.user.split("\n")):
      raise errors.DataError(f"{path}: roles[{i}].user ({r.kind}) needs a line "
                             f"'{marker}{{query}}' (the prompt contract, "
                             f"gp_jax/workflow/prompts.py)")
    if r.kind == "planner" and PLANNER_WIDTH not in r.system:
      raise errors.DataError(f"{path}: roles[{i}].system (planner) needs "
                             f"'{PLANNER_WIDTH}' (the prompt contract, gp_jax/workflow/prompts.py)")
    if not system_prefix(r):
      raise errors.DataError(f"{path}: roles[{i}].system starts with a field; it must start "
                             "with text that names its role")
    for j, other in enumerate(roles[:i]):
      a, b = system_prefix(r), system_prefix(other)
      if other.kind != r.kind and (a.startswith(b) or b.startswith(a)):
        raise errors.DataError(f"{path}: roles[{i}].system ({r.kind}) and roles[{j}].system "
                               f"({other.kind}) start alike; the text before the first field "
                               "must tell the kinds apart")


def validate_role_selection(roles: RoleSet) -> None:
  """A routing action space needs an executor and, with a planner, a summarizer."""
  kinds = {r.kind for r in roles.roles}
  if "executor" not in kinds:
    raise errors.ConfigError("the selected roles need at least one role of kind 'executor'")
  if "planner" in kinds and "summarizer" not in kinds:
    raise errors.ConfigError("a planner role needs a summarizer role to combine its sub-answers")
  if "verifier" in kinds and "planner" not in kinds:
    raise errors.ConfigError("a verifier role only acts on planned nodes; select a planner too")
  for kind in ("planner", "summarizer", "thinker", "verifier"):
    if len(roles.indices_of_kind(kind)) > 1:
      raise errors.ConfigError(f"at most one role of kind {kind!r} may be selected")
  if len(roles.indices_of_kind("executor")) > 1:
    raise errors.ConfigError("at most one role of kind 'executor' may be selected")
