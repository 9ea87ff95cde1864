"""The graph functions of Graph Counselor, with the semantics of the authors' code.

  Retrieve[keyword]                -> id of the top-1 node by embedding similarity of its main text
  Feature[node_id, feature_name]   -> that feature's value
  Neighbor[node_id, neighbor_type] -> list of neighbour ids of that type
  Degree[node_id, neighbor_type]   -> number of such neighbours
  Finish[answer]                   -> ends the trial (handled by the interpreter)

Failures raise FunctionError with a message written for the agent that made the call: it names the
problem and what would be valid.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

from gp_jax.counselor.kg import graph_store
from gp_jax.counselor.kg import retrieval

_MAX_LISTED = 12  # valid names listed in an error message


class FunctionError(Exception):
  """A graph function could not run; str(e) explains why to the calling agent."""


@dataclasses.dataclass(frozen=True)
class FunctionSpec:
  name: str
  params: tuple[str, ...]
  description: str


SPECS = (
    FunctionSpec("Retrieve", ("keyword",),
                 "the id of the node whose main text (name, title, ...) best matches the keyword"),
    FunctionSpec("Feature", ("node_id", "feature_name"), "the value of one feature of a node"),
    FunctionSpec("Neighbor", ("node_id", "neighbor_type"),
                 "the ids of the node's neighbours of that type"),
    FunctionSpec("Degree", ("node_id", "neighbor_type"),
                 "how many neighbours of that type the node has"),
    FunctionSpec("Finish", ("answer",), "gives the final answer and ends the task"),
)
SPEC_BY_KEY = {s.name.lower(): s for s in SPECS}
SPEC_BY_KEY["neighbour"] = SPEC_BY_KEY["neighbor"]


def _listed(names: Sequence[str]) -> str:
  names = list(names)
  more = f", ... ({len(names) - _MAX_LISTED} more)" if len(names) > _MAX_LISTED else ""
  return ", ".join(names[:_MAX_LISTED]) + more if names else "(none)"


class GraphFunctions:
  """The four graph functions over one graph and its retrieval index."""

  def __init__(self, graph: graph_store.KnowledgeGraph, index: retrieval.NodeIndex):
    if index.graph.fingerprint != graph.fingerprint:
      raise ValueError("the retrieval index was built for another graph")
    self.graph = graph
    self.index = index

  # -- node-id checks shared by the functions
  def _node(self, node_id: Any, fn: str) -> str:
    if isinstance(node_id, list):
      raise FunctionError(f"{fn} expects one node id, got a list")
    nid = str(node_id).strip()
    if nid not in self.graph:
      raise FunctionError(f"{nid!r} is not a node id of this graph; get node ids from "
                          "Retrieve[...] or Neighbor[...]")
    return nid

  def retrieve(self, keywords: Sequence[Any]) -> list[str]:
    """Top-1 node id for each keyword, searched as one batch."""
    kws = []
    for kw in keywords:
      if isinstance(kw, (list, dict)):
        raise FunctionError("Retrieve expects a keyword, got a structured value")
      kw = str(kw).strip()
      if not kw:
        raise FunctionError("Retrieve needs a non-empty keyword")
      kws.append(kw)
    return self.index.search(kws)

  def feature(self, node_id: Any, name: Any) -> Any:
    nid = self._node(node_id, "Feature")
    feats = self.graph.features(nid)
    key = str(name).strip()
    if key not in feats:
      ntype = self.graph.node_type(nid)
      valid = sorted(feats) or self.graph.schema[ntype].features
      raise FunctionError(f"node {nid} ({ntype}) has no feature {key!r}; its features: "
                          f"{_listed(valid)}")
    return feats[key]

  def neighbor(self, node_id: Any, neighbor_type: Any) -> list[str]:
    nid = self._node(node_id, "Neighbor")
    return list(self._neighbor_list(nid, neighbor_type))

  def degree(self, node_id: Any, neighbor_type: Any) -> int:
    nid = self._node(node_id, "Degree")
    return len(self._neighbor_list(nid, neighbor_type))

  def _neighbor_list(self, nid: str, neighbor_type: Any) -> list[str]:
    key = str(neighbor_type).strip()
    neigh = self.graph.neighbors(nid)
    if key in neigh:
      return neigh[key]
    ntype = self.graph.node_type(nid)
    valid = self.graph.schema[ntype].neighbor_types
    if key in valid:  # the type exists for this node type; this node just has none
      return []
    raise FunctionError(f"node {nid} ({ntype}) has no neighbour type {key!r}; neighbour types of "
                        f"{ntype} nodes: {_listed(valid)}")

  def scalar_function(self, key: str) -> Callable[..., Any]:
    """The per-element implementation of Feature / Neighbor / Degree."""
    return {"feature": self.feature, "neighbor": self.neighbor, "neighbour": self.neighbor,
            "degree": self.degree}[key]

  def describe_graph(self) -> str:
    """The graph's schema as text for prompts: node types, features and neighbour types."""
    lines = []
    for t, s in self.graph.schema.items():
      text = f"; main text: {s.text_key}" if s.text_key else ""
      lines.append(f"- {t} nodes ({s.count}{text}): features [{', '.join(s.features)}]; "
                   f"neighbour types [{', '.join(s.neighbor_types)}]")
    return "\n".join(lines)


def make_functions(graph: graph_store.KnowledgeGraph, encoder, *, cache_dir=None,
                   k: int = 8) -> GraphFunctions:
  """GraphFunctions over `graph` with its (cached) retrieval index under `encoder`."""
  return GraphFunctions(graph, retrieval.build_index(graph, encoder, cache_dir=cache_dir, k=k))
