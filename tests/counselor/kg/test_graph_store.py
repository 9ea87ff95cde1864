"""Loading and validating GRBench graph.json files."""
import json

import pytest

from gp_jax import errors
from gp_jax.counselor.kg import graph_store

GRAPH = {
    "author_nodes": {
        "a1": {"features": {"name": "Ann Lee", "organization": "MIT"}, "neighbors": {"paper": ["p1", "p2"]}},
        "a2": {"features": {"name": "Bo Chen"}, "neighbors": {"paper": ["p2"]}},
    },
    "paper_nodes": {
        "p1": {"features": {"title": "Deep Nets", "year": 2019}, "neighbors": {"author": ["a1"]}},
        "p2": {"features": {"title": "Graph Agents", "year": 2021},
               "neighbors": {"author": ["a1", "a2"], "cited_by": []}},
    },
}


def write(tmp_path, obj, name="graph.json"):
  p = tmp_path / name
  p.write_text(obj if isinstance(obj, str) else json.dumps(obj))
  return p


def test_load_and_query(tmp_path):
  g = graph_store.load_graph(write(tmp_path, GRAPH))
  assert len(g) == 4 and g.node_types == ("author", "paper")
  assert g.ids == ["a1", "a2", "p1", "p2"]
  assert g.node_type("p2") == "paper" and g.features("p1")["year"] == 2019
  assert g.neighbors("p2")["author"] == ["a1", "a2"]
  assert g.text("a1") == "Ann Lee" and g.text("p2") == "Graph Agents"
  assert g.text_keys == {"author": "name", "paper": "title"}
  s = g.schema
  assert s["author"].features == ("name", "organization") and s["author"].count == 2
  assert s["paper"].neighbor_types == ("author", "cited_by")
  assert g.num_edges() == 6


def test_save_roundtrip_and_fingerprint(tmp_path):
  g = graph_store.load_graph(write(tmp_path, GRAPH))
  out = graph_store.save_graph(g, tmp_path / "sub" / "copy.json")
  g2 = graph_store.load_graph(out)
  assert json.loads(out.read_text()) == GRAPH
  assert g2.fingerprint == g.fingerprint
  changed = json.loads(json.dumps(GRAPH))
  changed["paper_nodes"]["p1"]["features"]["title"] = "Deeper Nets"
  assert graph_store.from_json_dict(changed).fingerprint != g.fingerprint
  assert not list((tmp_path / "sub").glob("*.tmp"))


def test_configured_and_fallback_text_keys():
  raw = {"x_nodes": {"x1": {"features": {"code": "ABC", "size": 3}, "neighbors": {}}},
         "y_nodes": {"y1": {"features": {"n": 1}, "neighbors": {}}}}
  g = graph_store.from_json_dict(raw)
  assert g.text_keys == {"x": "code", "y": None}
  assert g.text("x1") == "ABC" and g.text("y1") == "y1"
  g = graph_store.from_json_dict(GRAPH, text_keys={"author": "organization"})
  assert g.text("a1") == "MIT" and g.text("a2") == "a2"  # missing key -> the id
  with pytest.raises(errors.ConfigError, match="unknown node type 'venue'"):
    graph_store.from_json_dict(GRAPH, text_keys={"venue": "name"})


def test_duplicate_ids_across_types():
  raw = json.loads(json.dumps(GRAPH))
  raw["paper_nodes"]["a2"] = {"features": {"title": "Clash"}, "neighbors": {}}
  with pytest.raises(errors.DataError, match="'a2' appears in both author_nodes and paper_nodes"):
    graph_store.from_json_dict(raw)


def test_dangling_neighbours_error_or_drop():
  raw = json.loads(json.dumps(GRAPH))
  raw["paper_nodes"]["p1"]["neighbors"]["author"] = ["a1", "a9", "a8"]
  with pytest.raises(errors.DataError, match=r"2 neighbour id\(s\).*p1.neighbors\['author'\] -> 'a9'"):
    graph_store.from_json_dict(raw)
  g = graph_store.from_json_dict(raw, on_dangling="drop")
  assert g.neighbors("p1")["author"] == ["a1"]
  with pytest.raises(errors.ConfigError, match="unknown on_dangling mode"):
    graph_store.from_json_dict(raw, on_dangling="ignore")


@pytest.mark.parametrize("raw, message", [
    ("[1, 2]", "non-empty object"),
    ("{}", "non-empty object"),
    ('{"authors": {}}', "'authors' is not of the form '<type>_nodes'"),
    ('{"a_nodes": []}', "a_nodes: expected an object mapping node ids"),
    ('{"a_nodes": {"x": 3}}', r"a_nodes\['x'\]: expected an object"),
    ('{"a_nodes": {"x": {"neighbors": {}}}}', "missing 'features'"),
    ('{"a_nodes": {"x": {"features": [], "neighbors": {}}}}', "features: expected an object"),
    ('{"a_nodes": {"x": {"features": {}, "neighbors": []}}}', "neighbors: expected an object"),
    ('{"a_nodes": {"x": {"features": {}, "neighbors": {"t": "y"}}}}', "expected a list of node ids"),
    ('{"a_nodes": {"x": {"features": {}, "neighbors": {"t": [null]}}}}', "must be strings"),
    ('{"a_nodes": {"x": {"features": {}, "extra": 1}}}', "unknown field"),
    ('{"a_nodes": {', "line 1: not valid JSON"),
])
def test_malformed_files(tmp_path, raw, message):
  with pytest.raises(errors.DataError, match=message):
    graph_store.load_graph(write(tmp_path, raw))


def test_missing_file_and_directory(tmp_path):
  with pytest.raises(errors.DataError, match="graph file not found"):
    graph_store.load_graph(tmp_path / "none.json")
  with pytest.raises(errors.DataError, match="is a directory"):
    graph_store.load_graph(tmp_path)


def test_integer_neighbour_ids_are_read_as_strings():
  raw = {"a_nodes": {"1": {"features": {"name": "one"}, "neighbors": {"a": [2]}},
                     "2": {"features": {"name": "two"}, "neighbors": {"a": [1]}}}}
  g = graph_store.from_json_dict(raw)
  assert g.neighbors("1")["a"] == ["2"]
