"""Equivalence of two final answers written in LaTeX (MATH, AIME).

`normalize_answer` applies the usual string normalisation (spaces, \\left/\\right, \\dfrac,
degrees, percent, dollars, text units, "x = 5" -> "5", ...). `answers_equivalent` compares the
normalised strings, then tuples/intervals element by element, then single expressions through
sympy: numbers are compared numerically (so 0.5 == \\frac{1}{2} and 2\\sqrt{2} == \\sqrt{8}),
expressions with variables at random points. Only a whitelisted, size-bounded subset of LaTeX is
handed to sympy (its parser evaluates Python), so hostile or huge answers fall back to string
comparison instead of running code or exhausting memory.
"""
from __future__ import annotations

import functools
import random
import re

_MAX_LEN = 200  # longer answers are compared as strings only.
_MAX_EXPONENT = 64
_FUNCS = {"sqrt", "pi", "log", "ln", "sin", "cos", "tan", "exp"}

_UNIT_WORDS = (
    "units", "unit", "square", "sq", "cubic", "cm", "mm", "km", "m", "meters", "meter", "inches",
    "inch", "in", "feet", "foot", "ft", "yards", "yd", "miles", "mi", "degrees", "degree", "cents",
    "cent", "dollars", "dollar", "hours", "hour", "minutes", "minute", "seconds", "second", "days",
    "day", "mph", "pounds", "lbs", "grams", "g", "kg", "liters", "l", "ml", "points", "people",
    "students", "ways", "times", "percent")


def _strip_text_wrappers(s: str) -> str:
  """\\text{abc} -> abc, \\mbox{abc} -> abc (no nesting inside)."""
  return re.sub(r"\\(?:text|textbf|textrm|mathrm|mbox|mathbf)\s*\{([^{}]*)\}", r"\1", s)


def _fix_fracs(s: str) -> str:
  """\\frac12 -> \\frac{1}{2}; \\frac1{x} -> \\frac{1}{x}."""
  s = re.sub(r"\\frac\s*(\d)\s*(\d)", r"\\frac{\1}{\2}", s)
  s = re.sub(r"\\frac\s*(\d)\s*\{", r"\\frac{\1}{", s)
  s = re.sub(r"\\frac\s*\{([^{}]*)\}\s*(\d)", r"\\frac{\1}{\2}", s)
  return s


def _fix_sqrt(s: str) -> str:
  """\\sqrt3 -> \\sqrt{3}."""
  return re.sub(r"\\sqrt\s*(\w)", r"\\sqrt{\1}", s)


def normalize_answer(ans: str) -> str:
  """Canonical string form of a final answer (used for exact comparison)."""
  s = str(ans).strip()
  s = s.replace("\n", " ").replace("\\!", "").replace("\\,", "").replace("\\;", "")
  s = s.replace("\\:", "").replace("\\ ", " ").replace("~", " ")
  s = s.replace("\\displaystyle", "").replace("\\left", "").replace("\\right", "")
  s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
  s = re.sub(r"\^\s*\{?\s*\\circ\s*\}?", "", s).replace("\u00b0", "")
  s = s.replace("\\%", "").replace("%", "").replace("\\$", "").replace("$", "")
  s = s.strip()
  # Trailing units: "10 \text{ cm}", "10 inches", "5\mbox{ square units}".
  s = re.sub(r"\\(?:text|mbox|mathrm)\s*\{\s*[A-Za-z ]+\}\s*(?:\^\s*\{?\d\}?)?\s*$",
             lambda m: "" if s[:m.start()].strip() else m.group(0), s)
  s = _strip_text_wrappers(s).strip()
  words = s.split()
  while len(words) > 1 and words[-1].lower().strip(".") in _UNIT_WORDS:
    words = words[:-1]
  s = " ".join(words)
  s = s.rstrip(".").strip()
  # "x = 5", "k=\frac12": keep the value when the left side is a lone variable.
  m = re.fullmatch(r"[A-Za-z](?:_\{?\w+\}?)?\s*=\s*(.+)", s)
  if m and "=" not in m.group(1):
    s = m.group(1)
  s = s.replace(" ", "")
  s = _fix_sqrt(_fix_fracs(s))
  if re.fullmatch(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?", s):
    s = s.replace(",", "")
  s = re.sub(r"(?<![\d.])\.(\d)", r"0.\1", s)
  if re.fullmatch(r"-?\d+\.0+", s):
    s = s.split(".")[0]
  if s.startswith("{") and s.endswith("}") and _balanced(s[1:-1]):
    s = s[1:-1]
  return s


def _balanced(s: str) -> bool:
  depth = 0
  for ch in s:
    depth += ch in "({["
    depth -= ch in ")}]"
    if depth < 0:
      return False
  return depth == 0


def _split_top_level(s: str) -> list[str]:
  parts, depth, cur = [], 0, []
  for ch in s:
    if ch in "({[":
      depth += 1
    elif ch in ")}]":
      depth -= 1
    if ch == "," and depth == 0:
      parts.append("".join(cur))
      cur = []
    else:
      cur.append(ch)
  parts.append("".join(cur))
  return parts


def _brace_arg(s: str, i: int) -> tuple[str, int] | None:
  """The {...} group starting at s[i] ('{'); returns (inner, index after '}')."""
  if i >= len(s) or s[i] != "{":
    return None
  depth = 0
  for j in range(i, len(s)):
    if s[j] == "{":
      depth += 1
    elif s[j] == "}":
      depth -= 1
      if depth == 0:
        return s[i + 1:j], j + 1
  return None


def latex_to_expr(s: str) -> str | None:
  """Converts a small LaTeX subset to a sympy-parsable string; None if anything else remains."""
  out, i = [], 0
  while i < len(s):
    if s.startswith("\\frac", i):
      a = _brace_arg(s, i + 5)
      b = a and _brace_arg(s, a[1])
      if not b:
        return None
      na, nb = latex_to_expr(a[0]), latex_to_expr(b[0])
      if na is None or nb is None:
        return None
      out.append(f"(({na})/({nb}))")
      i = b[1]
    elif s.startswith("\\sqrt", i):
      j = i + 5
      index = None
      if j < len(s) and s[j] == "[":
        k = s.find("]", j)
        if k < 0:
          return None
        index = latex_to_expr(s[j + 1:k])
        j = k + 1
      a = _brace_arg(s, j)
      if not a:
        return None
      na = latex_to_expr(a[0])
      if na is None:
        return None
      out.append(f"sqrt({na})" if index is None else f"(({na})**(1/({index})))")
      i = a[1]
    elif s[i] == "\\":
      m = re.match(r"\\([A-Za-z]+)", s[i:])
      name = m.group(1) if m else ""
      table = {"pi": "pi", "cdot": "*", "times": "*", "div": "/", "ln": "log", "log": "log",
               "sin": "sin", "cos": "cos", "tan": "tan", "exp": "exp"}
      if name not in table:
        return None
      out.append(f" {table[name]} " if name not in ("cdot", "times", "div") else table[name])
      i += len(name) + 1
    elif s[i] == "^":
      out.append("**")
      i += 1
    elif s[i] == "{":
      out.append("(")
      i += 1
    elif s[i] == "}":
      out.append(")")
      i += 1
    else:
      out.append(s[i])
      i += 1
  expr = "".join(out)
  if not re.fullmatch(r"[0-9A-Za-z+\-*/().= ]*", expr):
    return None
  # Multi-letter names other than known functions are products of single-letter variables.
  def split_name(m):
    name = m.group(0)
    return name if name in _FUNCS else "*".join(name)
  expr = re.sub(r"[A-Za-z]+", split_name, expr)
  expr = re.sub(r"(?<![\d.])0+(\d)", r"\1", expr)  # "070" is not valid Python.
  return expr


@functools.lru_cache(maxsize=1)
def _sympy():
  import sympy
  from sympy.parsing import sympy_parser
  transformations = sympy_parser.standard_transformations + (
      sympy_parser.implicit_multiplication_application, sympy_parser.convert_xor)
  return sympy, sympy_parser, transformations


def _to_sympy(s: str):
  """Parses a normalised answer with sympy; None when unsafe or unparsable."""
  if len(s) > _MAX_LEN:
    return None
  expr = latex_to_expr(s)
  if expr is None or not expr.strip() or "=" in expr:
    return None
  sympy, sympy_parser, transformations = _sympy()
  local = {"e": sympy.E, "i": sympy.I, "pi": sympy.pi, "E": sympy.E, "I": sympy.I,
           "ln": sympy.log}
  try:
    val = sympy_parser.parse_expr(expr, local_dict=local, transformations=transformations,
                                  evaluate=False)
  except Exception:  # sympy raises many types (SyntaxError, TokenError, TypeError, ...).
    return None
  if not isinstance(val, sympy.Basic) or not _bounded(val, sympy):
    return None
  return val


def _bounded(expr, sympy) -> bool:
  """Rejects what would not evaluate quickly: towers like 9^{9^{9}}, big powers, factorials."""
  for node in sympy.preorder_traversal(expr):
    if isinstance(node, sympy.Pow):
      if node.exp.has(sympy.Pow):
        return False
      if node.exp.is_Number and abs(node.exp) > _MAX_EXPONENT:
        return False
    elif isinstance(node, sympy.Integer) and abs(node) > 10**30:
      return False
    elif isinstance(node, sympy.factorial):
      return False
  return True


def _numeric_close(a, b, sympy) -> bool:
  try:
    va, vb = complex(sympy.N(a, 30)), complex(sympy.N(b, 30))
  except (TypeError, ValueError, OverflowError, ZeroDivisionError, AttributeError):
    return False
  if va != va or vb != vb:  # NaN
    return False
  return abs(va - vb) <= 1e-9 * max(1.0, abs(vb))


def _expr_equivalent(a, b) -> bool:
  sympy = _sympy()[0]
  free = sorted(a.free_symbols | b.free_symbols, key=str)
  if not free:
    return _numeric_close(a, b, sympy)
  if len(free) > 4:
    return False
  rng = random.Random(0)
  for _ in range(3):
    point = {s: sympy.Rational(rng.randint(1, 97), rng.randint(1, 13)) for s in free}
    try:
      if not _numeric_close(a.subs(point), b.subs(point), sympy):
        return False
    except Exception:  # substitution can fail inside sympy on odd expressions.
      return False
  return True


def _single_equivalent(p: str, g: str) -> bool:
  if p == g:
    return True
  if p.count("=") == 1 and g.count("=") == 1:
    pl, pr = p.split("=")
    gl, gr = g.split("=")
    a = _to_sympy(f"({pl})-({pr})") if pl and pr else None
    b = _to_sympy(f"({gl})-({gr})") if gl and gr else None
    return a is not None and b is not None and _expr_equivalent(a, b)
  a, b = _to_sympy(p), _to_sympy(g)
  if a is None or b is None:
    return False
  return _expr_equivalent(a, b)


def answers_equivalent(pred: str | None, gold: str | None) -> bool:
  """True when two final answers are the same mathematical object.

  Args:
    pred: the predicted answer (e.g. the \\boxed{} content), or None.
    gold: the reference answer.
  """
  if pred is None or gold is None:
    return False
  p, g = normalize_answer(pred), normalize_answer(gold)
  if not p or not g:
    return False
  if p == g:
    return True
  ps, gs = _set_elements(p), _set_elements(g)
  if ps is not None or gs is not None:
    # A LaTeX set \{...\} is unordered; it equals another set, or a bare list, of the same
    # elements (never a tuple or an interval).
    if ps is None:
      ps = _split_top_level(p) if p[0] not in "([{" else None
    if gs is None:
      gs = _split_top_level(g) if g[0] not in "([{" else None
    return ps is not None and gs is not None and _same_multiset(ps, gs)
  pp, gp = _split_top_level(p), _split_top_level(g)
  if len(pp) != len(gp):
    return False
  if len(pp) > 1:
    # Tuples, intervals and lists: same brackets, same elements in order.
    if p[0] in "([{" and g[0] in "([{":
      if p[0] != g[0] or p[-1] != g[-1]:
        return False
      pp = _split_top_level(p[1:-1])
      gp = _split_top_level(g[1:-1])
      if len(pp) != len(gp):
        return False
      return all(_single_equivalent(x, y) for x, y in zip(pp, gp))
    # A bare list of values ("the solutions are 2, -3") is unordered.
    return _same_multiset(pp, gp)
  return _single_equivalent(p, g)


def _set_elements(s: str) -> list[str] | None:
  """The top-level elements of a normalized LaTeX set "\\{a,b\\}", else None."""
  if s.startswith("\\{") and s.endswith("\\}") and _balanced(s[2:-2]):
    inner = s[2:-2]
    return _split_top_level(inner) if inner else []
  return None


def _same_multiset(pp: list[str], gp: list[str]) -> bool:
  """Whether two element lists are equal up to order (each element matched once)."""
  if len(pp) != len(gp):
    return False
  left = list(gp)
  for x in pp:
    hit = next((k for k, y in enumerate(left) if _single_equivalent(x, y)), None)
    if hit is None:
      return False
    left.pop(hit)
  return True
