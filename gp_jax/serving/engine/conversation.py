"""The conversation of a chat request as workflow context: what the prompts see besides the query.

A chat request's last user message is the query: the workflow plans, executes and answers it,
and on the simulator it names the simulated query. Every other message (the system prompt, the
earlier turns, anything after the query) is context. `render` turns the context into one block
of lines that the role prompts start their user message with (workflow/prompts.build_messages):

  Conversation before this question (oldest first):
  System: <the system prompt, on one line>
  User: <an earlier user turn>
  Assistant: <an earlier answer>

Each message is one line (its whitespace collapsed), so no line of the block starts with a
marker of the prompt contract (every line starts with the header or a label above) and the
simulator reads the question it always read. The block holds at most `max_chars` characters:
system and developer messages first, then the newest other turns that fit; older turns are left
out (the header then says how many) and a message longer than its share is cut with "...".
"""
from __future__ import annotations

HEADER = "Conversation before this question (oldest first):"
LABELS = {"system": "System", "developer": "System", "user": "User", "assistant": "Assistant"}
MAX_CHARS = 4000   # the block's default size cap
_CUT = "..."


def query_index(messages: list[dict]) -> int:
  """The index of the last user message (the query)."""
  return max(i for i, m in enumerate(messages) if m["role"] == "user")


def _line(m: dict, limit: int) -> str:
  text = " ".join(m["content"].split())
  line = f"{LABELS[m['role']]}: {text}"
  if len(line) > limit:
    line = line[:max(0, limit - len(_CUT))] + _CUT
  return line


def render(messages: list[dict], max_chars: int = MAX_CHARS) -> str:
  """The context block of `messages` (roles in LABELS, text contents), "" when the query is the
  only message with text. Its length is at most `max_chars` (plus the header)."""
  q = query_index(messages)
  context = [(i, m) for i, m in enumerate(messages) if i != q and m["content"].strip()]
  if not context or max_chars <= 0:
    return ""
  system = [(i, m) for i, m in context if LABELS[m["role"]] == "System"]
  turns = [(i, m) for i, m in context if LABELS[m["role"]] != "System"]
  kept: dict[int, str] = {}
  budget = max_chars
  for i, m in system:   # the system prompt first, at most half the block
    line = _line(m, max(len(_CUT) + 1, min(budget, max_chars // 2) - 1))
    if len(line) + 1 > budget:
      break
    kept[i] = line
    budget -= len(line) + 1
  for i, m in reversed(turns):   # then the newest turns
    if budget <= len(_CUT) + 12:
      break
    line = _line(m, budget - 1)
    kept[i] = line
    budget -= len(line) + 1
  if not kept:
    return ""
  left_out = len(context) - len(kept)
  header = HEADER
  if left_out:
    header = (f"Conversation before this question (oldest first, {left_out} older "
              f"message{'s' if left_out > 1 else ''} left out):")
  return "\n".join([header] + [kept[i] for i in sorted(kept)])
