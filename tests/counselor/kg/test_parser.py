"""The action parser: nesting, several calls per line, lists, quoting, malformed input, Finish."""
import pytest

from gp_jax.counselor.kg import parser as P


def calls(text):
  return P.parse_action(text)


def shape(expr):
  """A compact, comparable form of a parsed expression."""
  if isinstance(expr, P.Literal):
    return expr.value
  if isinstance(expr, P.ListExpr):
    return [shape(e) for e in expr.items]
  if isinstance(expr, P.Call):
    return (expr.name, *[shape(a) for a in expr.args])
  if isinstance(expr, P.Finish):
    return ("Finish", expr.raw, shape(expr.expr) if expr.expr is not None else None)
  return ("Issue", expr.message, expr.source)


@pytest.mark.parametrize("text, expected", [
    ("Retrieve[machine learning]", [("Retrieve", "machine learning")]),
    ("Feature[Retrieve[x], name]", [("Feature", ("Retrieve", "x"), "name")]),
    ("Degree[Neighbor[Retrieve[x], paper], author]",
     [("Degree", ("Neighbor", ("Retrieve", "x"), "paper"), "author")]),
    # depth 5
    ("Feature[Neighbor[Neighbor[Neighbor[Retrieve[a], paper], author], paper], title]",
     [("Feature", ("Neighbor", ("Neighbor", ("Neighbor", ("Retrieve", "a"), "paper"), "author"),
                   "paper"), "title")]),
    ("  Retrieve[  spaced   words  ]  ", [("Retrieve", "spaced   words")]),
    ("Degree[]", [("Degree",)]),
])
def test_nesting(text, expected):
  assert [shape(c) for c in calls(text)] == expected


@pytest.mark.parametrize("text", [
    "Retrieve[a]; Retrieve[b]; Degree[c, paper]",
    "Retrieve[a], Retrieve[b], Degree[c, paper]",
    "Retrieve[a] and Retrieve[b] then Degree[c, paper]",
    "Retrieve[a] Retrieve[b]Degree[c, paper]",
])
def test_several_calls_on_one_line_keep_source_order(text):
  got = [shape(c) for c in calls(text)]
  assert got == [("Retrieve", "a"), ("Retrieve", "b"), ("Degree", "c", "paper")]


def test_simple_calls_next_to_compound_ones_are_kept():
  # The authors' parser drops simple calls that share a line with a compound one.
  got = [shape(c) for c in calls("Feature[Retrieve[x], year]; Degree[p1, author]")]
  assert got == [("Feature", ("Retrieve", "x"), "year"), ("Degree", "p1", "author")]


def test_sources_are_exact_slices():
  text = 'Feature[Retrieve["a, b"], title] ; Degree[p1,author]'
  items = calls(text)
  assert [c.source for c in items] == ['Feature[Retrieve["a, b"], title]', "Degree[p1,author]"]
  assert all(text[c.start:c.end] == c.source for c in items)


@pytest.mark.parametrize("text, expected", [
    ('Retrieve["Smith, J. [ed.]"]', [("Retrieve", "Smith, J. [ed.]")]),
    ("Retrieve['a; b, c']", [("Retrieve", "a; b, c")]),
    (r'Retrieve["say \"hi\", then go"]', [("Retrieve", 'say "hi", then go')]),
    ("Retrieve[Alzheimer's disease]", [("Retrieve", "Alzheimer's disease")]),
    ("Retrieve['Alzheimer's disease']", [("Retrieve", "Alzheimer's disease")]),
    ('Feature["p 1", "first name"]', [("Feature", "p 1", "first name")]),
    ('Retrieve["Deep [Nets]"]; Retrieve[Deep Nets]', [("Retrieve", "Deep [Nets]"),
                                                     ("Retrieve", "Deep Nets")]),
    # brackets in bare text are kept verbatim when balanced and not a call
    ("Retrieve[the [x] thing]", [("Retrieve", "the [x] thing")]),
    # a lone quote is plain text
    ('Retrieve["unterminated]', [("Retrieve", '"unterminated')]),
    ("Retrieve[5'10\" tall]", [("Retrieve", "5'10\" tall")]),
    # a quote closes only before ',', ']', ';' or the end; otherwise it is text
    ('Feature["a" b, c]', [("Feature", '"a" b', "c")]),
])
def test_quoting(text, expected):
  assert [shape(c) for c in calls(text)] == expected


def test_list_arguments():
  assert [shape(c) for c in calls("Feature[[p1, p2, 'p 3'], title]")] == [
      ("Feature", ["p1", "p2", "p 3"], "title")]
  assert [shape(c) for c in calls("Retrieve[[]]")] == [("Retrieve", [])]
  assert [shape(c) for c in calls("Degree[[Retrieve[a], Retrieve[b]], paper]")] == [
      ("Degree", [("Retrieve", "a"), ("Retrieve", "b")], "paper")]


@pytest.mark.parametrize("text, message", [
    ("Retrieve[x", "missing ']' to close Retrieve["),
    ("Feature[Retrieve[x], name", "missing ']' to close Feature["),
    ("Feature[Retrieve[x] y, name]", "unexpected 'y' after an argument"),
    ("Feature[, name]", "empty argument"),
    ("Feature[p1, ]", "empty argument"),
    ("Retrieve[Graph Nets[2]]", "function call Nets[ inside the text argument"),
    ("Retrieve[a [b c]", "missing ']'"),
    ("Feature[Finish[x], y]", "Finish[...] cannot be an argument"),
])
def test_malformed_calls_become_issues(text, message):
  items = calls(text)
  assert len(items) == 1 and isinstance(items[0], P.Issue), items
  assert message in items[0].message
  assert items[0].source == text.strip()


def test_parsing_resumes_after_a_malformed_call():
  items = calls("Feature[Retrieve[x] y, z]; Degree[p1, author]")
  assert isinstance(items[0], P.Issue)
  assert shape(items[1]) == ("Degree", "p1", "author")


def test_stray_text_and_brackets_are_reported():
  items = calls("I will look up Retrieve[x] now ] [oops]")
  kinds = [type(i).__name__ for i in items]
  assert kinds == ["Issue", "Call", "Issue", "Issue", "Issue"]
  assert items[0].source == "I will look up" and "not a function call" in items[0].message
  assert "']' without a matching '['" in items[3].message
  assert "without a function name" in items[4].message and items[4].source == "[oops]"


def test_separator_words_are_not_reported():
  assert all(isinstance(i, P.Call) for i in calls("Retrieve[a] and Retrieve[b] then Retrieve[c]"))


def test_deep_nesting_is_an_issue_not_a_crash():
  text = "Retrieve[" * 500 + "x" + "]" * 500
  items = calls(text)
  assert len(items) == 1 and isinstance(items[0], P.Issue)
  assert "nested deeper than" in items[0].message


@pytest.mark.parametrize("text, raw, expr", [
    ("Finish[Alice, Bob]", "Alice, Bob", None),
    ("Finish[ 42 ]", " 42 ", None),
    ('Finish["a, b [c]"]', '"a, b [c]"', "a, b [c]"),
    ("Finish[Feature[p1, title]]", "Feature[p1, title]", ("Feature", "p1", "title")),
    ('Finish[["x", "y"]]', '["x", "y"]', ["x", "y"]),
    ("Finish[the [2019] edition]", "the [2019] edition", None),
    ("Finish[Feature[p1, title] and more]", "Feature[p1, title] and more", None),
    ("finish[__import__('os').system('x')]", "__import__('os').system('x')", None),
])
def test_finish_is_parsed_safely(text, raw, expr):
  items = calls(text)
  assert len(items) == 1 and isinstance(items[0], P.Finish)
  assert items[0].raw == raw
  assert (shape(items[0].expr) if items[0].expr is not None else None) == expr


def test_finish_unclosed_is_an_issue():
  items = calls("Finish[x")
  assert isinstance(items[0], P.Issue) and "missing ']' to close Finish[" in items[0].message


def test_tokenizer_positions_cover_the_input():
  text = 'Feature[Retrieve["a, b"], title]; x'
  toks = P.tokenize(text)
  assert toks[-1].kind == P.END
  assert "".join(t.text for t in toks) == text
  assert [t.kind for t in toks[:4]] == [P.NAME, P.LBRACK, P.NAME, P.LBRACK]
  assert toks[4].kind == P.STRING and toks[4].value == "a, b"


@pytest.mark.parametrize("raw, label, out", [
    ("Action 3: Retrieve[x]\nObservation 3: junk", "Action", "Retrieve[x]"),
    ("\n\n  **Action 2:** Degree[a, b]", "Action", "Degree[a, b]"),
    ("plan 1: find the author", "Plan", "find the author"),
    ("Retrieve[x]", "Action", "Retrieve[x]"),
    ("", "Thought", ""),
])
def test_strip_label(raw, label, out):
  assert P.strip_label(raw, label) == out
