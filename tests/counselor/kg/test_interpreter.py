"""Graph function semantics, element-wise application, Finish, and the observation text."""
import json

import pytest

from gp_jax.counselor.kg import functions
from gp_jax.counselor.kg import graph_store
from gp_jax.counselor.kg import interpreter
from gp_jax.text import encoder as encoder_lib

RAW = {
    "author_nodes": {
        "a1": {"features": {"name": "Ann Lee", "h_index": 12}, "neighbors": {"paper": ["p1", "p2"]}},
        "a2": {"features": {"name": "Bo Chen", "h_index": 3}, "neighbors": {"paper": ["p2", "p3"]}},
    },
    "paper_nodes": {
        "p1": {"features": {"title": "Deep Nets, Revisited [v2]", "year": 2019},
               "neighbors": {"author": ["a1"], "venue": ["v1"]}},
        "p2": {"features": {"title": "Graph Agents", "year": 2021},
               "neighbors": {"author": ["a1", "a2"], "venue": ["v1"]}},
        "p3": {"features": {"title": "Quiet Solvers", "year": 2022},
               "neighbors": {"author": ["a2"]}},
    },
    "venue_nodes": {
        "v1": {"features": {"name": "Neural Meeting"}, "neighbors": {"paper": ["p1", "p2"]}},
    },
}


@pytest.fixture(scope="module")
def interp():
  g = graph_store.from_json_dict(RAW)
  return interpreter.Interpreter(functions.make_functions(g, encoder_lib.HashingEncoder(dim=128)))


def one(interp, action):
  r = interp.execute(action)
  assert len(r.results) == 1, r.results
  return r.results[0]


@pytest.mark.parametrize("action, value", [
    ("Retrieve[Ann Lee]", "a1"),
    ('Retrieve["Deep Nets, Revisited [v2]"]', "p1"),
    ("Feature[p2, year]", 2021),
    ("Feature[Retrieve[Graph Agents], title]", "Graph Agents"),
    ("Neighbor[p2, author]", ["a1", "a2"]),
    ("Degree[Retrieve[Bo Chen], paper]", 2),
    ("Degree[p3, venue]", 0),                     # p3 has no venue entry: the type exists
    ("Neighbor[v1, paper]", ["p1", "p2"]),
    # element-wise: lists map, results keep their shape and order
    ("Feature[Neighbor[Retrieve[Ann Lee], paper], year]", [2019, 2021]),
    ("Degree[Neighbor[Retrieve[Graph Agents], author], paper]", [2, 2]),
    ("Neighbor[Neighbor[Retrieve[Ann Lee], paper], author]", [["a1"], ["a1", "a2"]]),
    ("Feature[Neighbor[Neighbor[Retrieve[Bo Chen], paper], author], name]",
     [["Ann Lee", "Bo Chen"], ["Bo Chen"]]),
    ("Feature[[p1, p3], year]", [2019, 2022]),
    ("Feature[p1, [year, title]]", [2019, "Deep Nets, Revisited [v2]"]),
    ("Feature[[p1, p2], [year]]", [[2019], [2021]]),
    ("Retrieve[[Ann Lee, Bo Chen, Neural Meeting]]", ["a1", "a2", "v1"]),
    ("Feature[Retrieve[[Ann Lee, Bo Chen]], h_index]", [12, 3]),
    ("neighbour[p1, venue]", ["v1"]),
    ("Retrieve[[]]", []),
])
def test_function_values(interp, action, value):
  r = one(interp, action)
  assert r.ok, r.error
  assert r.value == value


@pytest.mark.parametrize("action, message", [
    ("Feature[p9, year]", "'p9' is not a node id of this graph"),
    ("Feature[Ann Lee, name]", "'Ann Lee' is not a node id"),
    ("Feature[p1, yr]", "node p1 (paper) has no feature 'yr'; its features: title, year"),
    ("Neighbor[p1, authors]", "no neighbour type 'authors'; neighbour types of paper nodes: author, venue"),
    ("Degree[p1]", "Degree takes 2 argument(s) (node_id, neighbor_type), got 1"),
    ("Retrieve[a, b]", "Retrieve takes 1 argument(s)"),
    ("Lookup[p1]", "unknown function 'Lookup'; functions: Retrieve, Feature, Neighbor, Degree, Finish"),
    ("Feature[Neighbor[p9, paper], year]", "in Neighbor[p9, paper]: 'p9' is not a node id"),
    ("Feature[Neighbor[Retrieve[Ann Lee], paper], venue]", "node p1 (paper) has no feature 'venue'"),
])
def test_errors_explain_themselves(interp, action, message):
  r = interp.execute(action)
  err = [x for x in r.results if not x.ok]
  assert err and message in err[0].error, r.results


def test_several_calls_each_get_a_line_and_errors_do_not_stop_others(interp):
  r = interp.execute("Retrieve[Ann Lee]; Feature[p1, yr]; Degree[a1, paper] and junk")
  assert [x.ok for x in r.results] == [True, False, True, False]
  obs = r.observation()
  lines = obs.split("\n")
  assert lines[0] == '- Retrieve[Ann Lee] = "a1"'
  assert lines[1].startswith("- Feature[p1, yr] -> error: node p1 (paper) has no feature 'yr'")
  assert lines[2] == "- Degree[a1, paper] = 2"
  assert lines[3] == "- and junk -> error: not a function call (ignored)"
  assert not r.finished


def test_single_call_observation_is_one_line(interp):
  assert interp.execute("Neighbor[p2, author]").observation() == 'Neighbor[p2, author] = ["a1", "a2"]'
  assert "No function call found" in interp.execute("").observation()
  assert "No function call found" in interp.execute("   ").observation()


@pytest.mark.parametrize("action, answer, value", [
    ("Finish[Ann Lee, Bo Chen]", "Ann Lee, Bo Chen", "Ann Lee, Bo Chen"),
    ('Finish["2019"]', "2019", "2019"),
    ("Finish[Feature[p1, year]]", "2019", 2019),
    ("Finish[Feature[Neighbor[p2, author], name]]", "Ann Lee, Bo Chen", ["Ann Lee", "Bo Chen"]),
    ('Finish[["x", "y"]]', "x, y", ["x", "y"]),
    ("Finish[__import__('os').getcwd()]", "__import__('os').getcwd()", "__import__('os').getcwd()"),
])
def test_finish(interp, action, answer, value):
  r = interp.execute(action)
  assert r.finished and r.answer == answer and r.answer_value == value


def test_calls_after_finish_do_not_run_and_a_failed_finish_does_not_end(interp):
  r = interp.execute("Degree[a1, paper]; Finish[two]; Feature[p9, x]")
  assert r.finished and r.answer == "two" and len(r.results) == 2
  r = interp.execute("Finish[Feature[p9, year]]")
  assert not r.finished and "not a node id" in r.results[0].error
  r = interp.execute("Finish[]")
  assert not r.finished and "needs an answer" in r.results[0].error


def test_long_lists_are_cut_in_observations():
  v = list(range(120))
  text = interpreter.render_value(v, max_items=50)
  assert text.startswith("[0, 1, 2") and text.endswith("49, ... 70 more]")
  assert json.loads(interpreter.render_value(v[:50], max_items=50)) == v[:50]
  assert interpreter.render_value([["a"], ["b", "c"]]) == '[["a"], ["b", "c"]]'


def test_element_budget_stops_explosions():
  g = graph_store.from_json_dict(RAW)
  small = interpreter.Interpreter(functions.make_functions(g, encoder_lib.HashingEncoder(dim=128)),
                                  max_element_calls=3)
  r = small.execute("Feature[Neighbor[Neighbor[Retrieve[Ann Lee], paper], author], name]")
  assert "element-wise evaluations" in r.results[0].error
  assert small.execute("Feature[p1, year]").results[0].value == 2019  # budget is per call


@pytest.mark.parametrize("value, text", [
    (None, ""), (3, "3"), (3.0, "3"), (2.5, "2.5"), (12.99, "12.99"), (True, "yes"),
    (["a", ["b", 2]], "a, b, 2"), ("  x ", "x"), ({"b": 1, "a": 2}, '{"a": 2, "b": 1}'),
])
def test_format_answer(value, text):
  assert interpreter.format_answer(value) == text


def test_describe_graph_lists_types_features_and_neighbours(interp):
  text = interp.funcs.describe_graph()
  assert "- paper nodes (3; main text: title): features [title, year]; neighbour types [author, venue]" in text
  assert text.count("\n") == 2
