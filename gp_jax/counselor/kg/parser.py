"""The action parser: a tokenizer and a recursive-descent parser for graph-function calls.

An action line holds any number of calls, separated by ',', ';', 'and' or whitespace:

  action  := item*
  item    := call | ',' | ';' | stray text
  call    := NAME '[' [arg (',' arg)*] ']'     (NAME written directly before '[')
  arg     := call | STRING | list | bare
  list    := '[' [arg (',' arg)*] ']'          (a '[' that opens an argument)
  bare    := text up to the next ',' or ']' at bracket depth 0; a '[' inside bare text opens a
             balanced group kept verbatim ("the [x] thing")
  finish  := 'Finish' '[' raw ']'              (raw = source text up to the matching ']')

STRING is a quoted argument ("..." or '...', backslash escapes): a quote opens a string only at the
start of an argument, and closes at the first matching quote followed by ',', ']', ';' or the end,
so apostrophes inside words ("Alzheimer's") and inside single-quoted strings stay text. A quote
with no such closing quote is plain text.

The parser never executes anything: Finish's raw text is kept as written, and is read as a nested
call, a quoted string or a list literal by this module's own grammar (never `eval`). Malformed
calls become `Issue`s that say what is wrong and where; parsing continues with the next call.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Union

MAX_DEPTH = 32  # nested calls/lists; deeper input is malformed, not a reason to overflow the stack

_NAME_BEFORE_BRACKET = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?=\[)")
_WORD = re.compile(r"[A-Za-z0-9_]+")
_SEPARATOR_WORDS = frozenset({"", "and", "then", "also", "&", "&&", "|", "+"})

# Token kinds.
NAME, LBRACK, RBRACK, COMMA, SEMI, STRING, TEXT, END = (
    "NAME", "LBRACK", "RBRACK", "COMMA", "SEMI", "STRING", "TEXT", "END")
_PUNCT = {"[": LBRACK, "]": RBRACK, ",": COMMA, ";": SEMI}


@dataclasses.dataclass(frozen=True)
class Token:
  kind: str
  text: str    # source text (with quotes for STRING)
  start: int
  end: int
  value: str = ""  # unescaped content of a STRING


@dataclasses.dataclass(frozen=True)
class Literal:
  """A bare or quoted argument; always a string."""
  value: str
  quoted: bool = False


@dataclasses.dataclass(frozen=True)
class ListExpr:
  items: tuple["Expr", ...]


@dataclasses.dataclass(frozen=True)
class Call:
  """NAME[args]; `source` is the exact text of the call in the action line."""
  name: str
  args: tuple["Expr", ...]
  source: str
  start: int
  end: int


@dataclasses.dataclass(frozen=True)
class Finish:
  """Finish[raw]. `expr` is set when raw is a single call, a quoted string or a list literal."""
  raw: str
  expr: "Expr | None"
  source: str
  start: int
  end: int


@dataclasses.dataclass(frozen=True)
class Issue:
  """Something in the line that is not a well-formed call, with the offending source text."""
  message: str
  source: str
  start: int


Expr = Union[Literal, ListExpr, Call]
Item = Union[Call, Finish, Issue]


class ParseError(Exception):
  def __init__(self, message: str, pos: int):
    super().__init__(message)
    self.message = message
    self.pos = pos


# ------------------------------------------------------------------------------------ tokenizer
def _quote_closes_at(src: str, i: int) -> int | None:
  """For a quote at src[i], the index just past its closing quote, or None."""
  q = src[i]
  j = i + 1
  n = len(src)
  while j < n:
    c = src[j]
    if c == "\\":
      j += 2
      continue
    if c == q:
      k = j + 1
      while k < n and src[k].isspace():
        k += 1
      if k == n or src[k] in ",];":
        return j + 1
    j += 1
  return None


def _unescape(body: str) -> str:
  out = []
  i = 0
  while i < len(body):
    if body[i] == "\\" and i + 1 < len(body):
      out.append(body[i + 1])
      i += 2
    else:
      out.append(body[i])
      i += 1
  return "".join(out)


def tokenize(src: str) -> list[Token]:
  """Splits an action line into tokens; always ends with an END token. Never raises."""
  toks: list[Token] = []
  text_start: int | None = None
  i, n = 0, len(src)

  def flush(upto: int):
    nonlocal text_start
    if text_start is not None:
      toks.append(Token(TEXT, src[text_start:upto], text_start, upto))
      text_start = None

  while i < n:
    c = src[i]
    if c in _PUNCT:
      flush(i)
      toks.append(Token(_PUNCT[c], c, i, i + 1))
      i += 1
      continue
    if c in "\"'":
      pending_blank = text_start is None or not src[text_start:i].strip()
      at_arg_start = not toks or toks[-1].kind in (LBRACK, COMMA, SEMI)
      end = _quote_closes_at(src, i) if (pending_blank and at_arg_start) else None
      if end is not None:
        flush(i)
        toks.append(Token(STRING, src[i:end], i, end, _unescape(src[i + 1:end - 1])))
        i = end
        continue
    if (c.isalpha() or c == "_") and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")):
      m = _NAME_BEFORE_BRACKET.match(src, i)
      if m:
        flush(i)
        toks.append(Token(NAME, m.group(), i, m.end()))
        i = m.end()
        continue
      m = _WORD.match(src, i)
      if text_start is None:
        text_start = i
      i = m.end()
      continue
    if text_start is None:
      text_start = i
    i += 1
  flush(n)
  toks.append(Token(END, "", n, n))
  return toks


# ------------------------------------------------------------------------------------ parser
class _Parser:
  def __init__(self, src: str):
    self.src = src
    self.toks = tokenize(src)
    self.i = 0

  def peek(self) -> Token:
    return self.toks[self.i]

  def advance(self) -> Token:
    t = self.toks[self.i]
    if t.kind != END:
      self.i += 1
    return t

  def skip_blank(self) -> None:
    while self.peek().kind == TEXT and not self.peek().text.strip():
      self.i += 1

  def col(self, pos: int) -> str:
    return f"column {pos + 1}"

  # ---- top level
  def action(self) -> list[Item]:
    items: list[Item] = []
    while True:
      t = self.peek()
      if t.kind == END:
        return items
      if t.kind == NAME:
        start_i = self.i
        try:
          items.append(self.call(depth=0))
        except ParseError as e:
          end = self.resync(start_i)
          items.append(Issue(e.message, self.src[t.start:end].strip(), t.start))
      elif t.kind in (COMMA, SEMI):
        self.advance()
      elif t.kind == TEXT:
        self.advance()
        words = t.text.strip()
        if words.lower() not in _SEPARATOR_WORDS:
          items.append(Issue("not a function call (ignored)", words, t.start))
      elif t.kind == STRING:
        self.advance()
        items.append(Issue("quoted text outside a function call (ignored)", t.text, t.start))
      elif t.kind == RBRACK:
        self.advance()
        items.append(Issue("']' without a matching '['", "]", t.start))
      else:  # LBRACK with no function name before it
        start_i = self.i
        end = self.resync(start_i - 1)
        items.append(Issue("'[' without a function name directly before it (write Name[...])",
                           self.src[t.start:end].strip(), t.start))

  def resync(self, name_i: int) -> int:
    """Skips past the ']' matching the '[' after token name_i; returns the source end offset."""
    j = name_i + 1
    depth = 0
    while j < len(self.toks):
      tok = self.toks[j]
      if tok.kind == LBRACK:
        depth += 1
      elif tok.kind == RBRACK:
        depth -= 1
        if depth <= 0:
          self.i = j + 1
          return tok.end
      elif tok.kind == END:
        self.i = j
        return tok.start
      j += 1
    self.i = len(self.toks) - 1
    return len(self.src)

  # ---- calls and arguments
  def call(self, depth: int) -> Call | Finish:
    if depth > MAX_DEPTH:
      raise ParseError(f"calls nested deeper than {MAX_DEPTH} levels", self.peek().start)
    name = self.advance()
    lb = self.advance()
    assert lb.kind == LBRACK  # NAME tokens are only emitted directly before '['
    if name.text.lower() == "finish":
      return self.finish(name, lb)
    args: list[Expr] = []
    self.skip_blank()
    if self.peek().kind == RBRACK:
      rb = self.advance()
      return Call(name.text, (), self.src[name.start:rb.end], name.start, rb.end)
    while True:
      args.append(self.arg(depth + 1))
      t = self.advance()
      if t.kind == COMMA:
        continue
      if t.kind == RBRACK:
        return Call(name.text, tuple(args), self.src[name.start:t.end], name.start, t.end)
      if t.kind == END:
        raise ParseError(f"missing ']' to close {name.text}[ (opened at {self.col(lb.start)})",
                         t.start)
      raise ParseError(f"unexpected {t.text.strip()!r} at {self.col(t.start)} in {name.text}[...]; "
                       "separate arguments with ',' and quote text that has brackets or commas",
                       t.start)

  def arg(self, depth: int) -> Expr:
    if depth > MAX_DEPTH:
      raise ParseError(f"arguments nested deeper than {MAX_DEPTH} levels", self.peek().start)
    self.skip_blank()
    t = self.peek()
    if t.kind == NAME:
      expr = self.call(depth)
      if isinstance(expr, Finish):
        raise ParseError("Finish[...] cannot be an argument of another call", expr.start)
    elif t.kind == STRING:
      self.advance()
      expr = Literal(t.value, quoted=True)
    elif t.kind == LBRACK:
      expr = self.list_expr(depth)
    elif t.kind in (COMMA, RBRACK):
      raise ParseError(f"empty argument at {self.col(t.start)}", t.start)
    elif t.kind == END:
      raise ParseError("missing ']' at the end of the line", t.start)
    else:
      return self.bare()
    self.skip_blank()
    nxt = self.peek()
    if nxt.kind not in (COMMA, RBRACK, END):
      raise ParseError(f"unexpected {nxt.text.strip()!r} after an argument at {self.col(nxt.start)}; "
                       "quote the whole argument if it is text", nxt.start)
    return expr

  def list_expr(self, depth: int) -> ListExpr:
    lb = self.advance()
    items: list[Expr] = []
    self.skip_blank()
    if self.peek().kind == RBRACK:
      self.advance()
      return ListExpr(())
    while True:
      items.append(self.arg(depth + 1))
      t = self.advance()
      if t.kind == COMMA:
        continue
      if t.kind == RBRACK:
        return ListExpr(tuple(items))
      raise ParseError(f"missing ']' to close the list opened at {self.col(lb.start)}", t.start)

  def bare(self) -> Literal:
    parts: list[str] = []
    depth = 0
    start = self.peek().start
    while True:
      t = self.peek()
      if t.kind == END or (depth == 0 and t.kind in (COMMA, RBRACK)):
        break
      if t.kind == NAME:
        raise ParseError(
            f"function call {t.text}[ inside the text argument {self.src[start:t.end]!r}; make the "
            "call the whole argument, or quote the text if the brackets are part of it", t.start)
      if t.kind == LBRACK:
        depth += 1
      elif t.kind == RBRACK:
        depth -= 1
      parts.append(t.text)
      self.advance()
    if depth > 0:
      raise ParseError(f"unclosed '[' inside the argument {self.src[start:self.peek().start]!r}",
                       start)
    value = "".join(parts).strip()
    if not value:
      raise ParseError(f"empty argument at {self.col(start)}", start)
    return Literal(value)

  # ---- Finish
  def finish(self, name: Token, lb: Token) -> Finish:
    depth = 1
    while True:
      t = self.advance()
      if t.kind == LBRACK:
        depth += 1
      elif t.kind == RBRACK:
        depth -= 1
        if depth == 0:
          raw = self.src[lb.end:t.start]
          return Finish(raw, _read_finish(raw), self.src[name.start:t.end], name.start, t.end)
      elif t.kind == END:
        raise ParseError(f"missing ']' to close Finish[ (opened at {self.col(lb.start)})", t.start)


def _read_finish(raw: str) -> Expr | None:
  """Reads Finish's text as one call, one quoted string or one list literal, if it is exactly that."""
  if not raw.strip():
    return None
  p = _Parser(raw)
  p.skip_blank()
  first = p.peek()
  try:
    if first.kind == NAME:
      expr = p.call(depth=1)
      if isinstance(expr, Finish):
        return None
    elif first.kind == STRING:
      p.advance()
      expr = Literal(first.value, quoted=True)
    elif first.kind == LBRACK:
      expr = p.list_expr(depth=1)
    else:
      return None
  except ParseError:
    return None
  p.skip_blank()
  return expr if p.peek().kind == END else None


def parse_action(text: str) -> list[Item]:
  """Parses one action line into calls, Finish items and issues, in source order.

  Args:
    text: the action, e.g. 'Feature[Retrieve["Deep nets"], year]; Degree[a1, paper]'.

  Returns:
    Items in the order they appear. A malformed call yields an Issue (message + source) and
    parsing resumes after it; text between calls that is not a separator yields an Issue too.
  """
  return _Parser(text).action()


def strip_label(text: str, label: str) -> str:
  """The first non-empty line of an LLM output with a leading 'Label n:' removed."""
  for line in text.splitlines():
    line = line.strip()
    if line:
      return re.sub(rf"^\**\s*{re.escape(label)}\s*\d*\s*\**\s*:\s*\**\s*", "", line,
                    flags=re.IGNORECASE).strip()
  return ""
