"""The knowledge-graph store: GRBench graph.json files, loaded, validated and indexed.

GRBench format (Graph-CoT / Graph Counselor):

  {"<type>_nodes": {"<node id>": {"features": {name: value, ...},
                                  "neighbors": {"<neighbor type>": ["<node id>", ...], ...}},
                    ...},
   ...}

Node ids are unique across all types (the graph functions address a node by id alone). Each node
type has one main text feature (e.g. a paper's title, an author's name): the text Retrieve matches.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import pathlib
from typing import Any, Mapping

from gp_jax import errors
from gp_jax import files

# Feature names tried, in order, as a node type's main text when none is configured. The GRBench
# graphs use 'name' or 'title' for most types.
TEXT_KEY_PREFERENCE = ("name", "title", "full_name", "case_name", "plain_text", "syllabus")

ON_DANGLING = ("error", "drop")


@dataclasses.dataclass(frozen=True)
class TypeSchema:
  """What nodes of one type carry: feature names and neighbour types (sorted), and the text key."""
  node_type: str
  count: int
  text_key: str | None  # None: the node id is the main text
  features: tuple[str, ...]
  neighbor_types: tuple[str, ...]


class KnowledgeGraph:
  """A validated heterogeneous graph. Nodes are addressed by id; positions follow file order.

  Attributes:
    name: a label for messages and cache keys (the file path for loaded graphs).
    node_types: type names in file order.
    ids: node ids, position i -> id (types in file order, nodes in file order).
  """

  def __init__(self, nodes_by_type: Mapping[str, Mapping[str, Mapping[str, Any]]], *,
               name: str = "<graph>", text_keys: Mapping[str, str] | None = None,
               on_dangling: str = "error"):
    """Validates and indexes a decoded graph.

    Args:
      nodes_by_type: node type (without the '_nodes' suffix) -> id -> {"features", "neighbors"}.
      name: label used in error messages.
      text_keys: node type -> main text feature; other types use TEXT_KEY_PREFERENCE.
      on_dangling: 'error' rejects neighbour ids that are not nodes; 'drop' removes them.

    Raises:
      DataError: malformed nodes, duplicate ids across types, dangling neighbour ids.
      ConfigError: unknown on_dangling, text key for an unknown type.
    """
    if on_dangling not in ON_DANGLING:
      raise errors.unknown_name("on_dangling mode", on_dangling, ON_DANGLING)
    self.name = name
    self.node_types: tuple[str, ...] = tuple(nodes_by_type)
    self.ids: list[str] = []
    self._type_idx: list[int] = []
    self._features: list[dict] = []
    self._neighbors: list[dict[str, list[str]]] = []
    self._pos: dict[str, int] = {}
    first_type: dict[str, str] = {}
    for t_idx, (ntype, nodes) in enumerate(nodes_by_type.items()):
      where_t = f"{name}: {ntype}_nodes"
      if not isinstance(nodes, Mapping):
        raise errors.DataError(f"{where_t}: expected an object mapping node ids to nodes")
      for nid, node in nodes.items():
        where = f"{where_t}[{nid!r}]"
        if nid in first_type:
          raise errors.DataError(
              f"{name}: node id {nid!r} appears in both {first_type[nid]}_nodes and {ntype}_nodes; "
              "ids must be unique across node types")
        first_type[nid] = ntype
        feats, neigh = _check_node(node, where)
        self._pos[nid] = len(self.ids)
        self.ids.append(nid)
        self._type_idx.append(t_idx)
        self._features.append(feats)
        self._neighbors.append(neigh)
    self._check_dangling(on_dangling)
    self.text_keys = self._resolve_text_keys(text_keys or {})

  # ---------------------------------------------------------------- construction helpers
  def _check_dangling(self, on_dangling: str) -> None:
    bad: list[tuple[str, str, str]] = []
    n_bad = 0
    for pos, neigh in enumerate(self._neighbors):
      for ntype, ids in neigh.items():
        if all(i in self._pos for i in ids):
          continue
        if on_dangling == "drop":
          neigh[ntype] = [i for i in ids if i in self._pos]
          continue
        for i in ids:
          if i not in self._pos:
            n_bad += 1
            if len(bad) < 3:
              bad.append((self.ids[pos], ntype, i))
    if n_bad:
      shown = "; ".join(f"{src}.neighbors[{t!r}] -> {dst!r}" for src, t, dst in bad)
      raise errors.DataError(
          f"{self.name}: {n_bad} neighbour id(s) name no node of the graph, e.g. {shown} "
          "(to remove them: on_dangling='drop', or --config.data.drop_dangling=true of "
          "experiments/counselor.py)")

  def _resolve_text_keys(self, configured: Mapping[str, str]) -> dict[str, str | None]:
    unknown = set(configured) - set(self.node_types)
    if unknown:
      raise errors.unknown_name("node type", sorted(unknown)[0], self.node_types)
    keys: dict[str, str | None] = {}
    for ntype in self.node_types:
      if ntype in configured:
        keys[ntype] = configured[ntype]
        continue
      feats = self._type_stats[ntype][1]
      pick = next((k for k in TEXT_KEY_PREFERENCE if k in feats), None)
      if pick is None:
        first = self._first_of_type(ntype)
        if first is not None:
          pick = next((k for k, v in self._features[first].items() if isinstance(v, str)), None)
      keys[ntype] = pick
    return keys

  def _first_of_type(self, ntype: str) -> int | None:
    t = self.node_types.index(ntype)
    return next((p for p, ti in enumerate(self._type_idx) if ti == t), None)

  # ---------------------------------------------------------------- queries
  def __len__(self) -> int:
    return len(self.ids)

  def __contains__(self, node_id: object) -> bool:
    return node_id in self._pos

  def position(self, node_id: str) -> int:
    """Index of a node; KeyError for unknown ids."""
    return self._pos[node_id]

  def node_type(self, node_id: str) -> str:
    return self.node_types[self._type_idx[self._pos[node_id]]]

  def features(self, node_id: str) -> dict:
    return self._features[self._pos[node_id]]

  def neighbors(self, node_id: str) -> dict[str, list[str]]:
    return self._neighbors[self._pos[node_id]]

  def text(self, node_id: str) -> str:
    """The node's main text (its text-key feature as a string, else its id)."""
    pos = self._pos[node_id]
    key = self.text_keys[self.node_types[self._type_idx[pos]]]
    value = self._features[pos].get(key) if key is not None else None
    return node_id if value is None else str(value)

  def texts(self) -> list[str]:
    """Main texts of all nodes, in position order."""
    return [self.text(i) for i in self.ids]

  @functools.cached_property
  def _type_stats(self) -> dict[str, tuple[int, set, set]]:
    stats = {t: (0, set(), set()) for t in self.node_types}
    counts = dict.fromkeys(self.node_types, 0)
    for pos, t_idx in enumerate(self._type_idx):
      t = self.node_types[t_idx]
      counts[t] += 1
      stats[t][1].update(self._features[pos])
      stats[t][2].update(self._neighbors[pos])
    return {t: (counts[t], f, n) for t, (_, f, n) in stats.items()}

  @functools.cached_property
  def schema(self) -> dict[str, TypeSchema]:
    """Per node type: count, feature names and neighbour types seen on any node of that type."""
    return {t: TypeSchema(t, c, self.text_keys[t], tuple(sorted(f)), tuple(sorted(n)))
            for t, (c, f, n) in self._type_stats.items()}

  @functools.cached_property
  def fingerprint(self) -> str:
    """sha1 over ids, types and main texts: what a retrieval index depends on."""
    h = hashlib.sha1()
    for nid in self.ids:
      h.update(nid.encode())
      h.update(b"\x00")
      h.update(self.node_type(nid).encode())
      h.update(b"\x00")
      h.update(self.text(nid).encode())
      h.update(b"\x01")
    return h.hexdigest()

  def num_edges(self) -> int:
    """Directed neighbour entries (an undirected edge stored on both ends counts twice)."""
    return sum(len(ids) for neigh in self._neighbors for ids in neigh.values())

  def to_json_dict(self) -> dict:
    """The GRBench structure ({"<type>_nodes": {...}}), sharing the stored feature dicts."""
    out: dict[str, dict] = {f"{t}_nodes": {} for t in self.node_types}
    for pos, nid in enumerate(self.ids):
      out[f"{self.node_types[self._type_idx[pos]]}_nodes"][nid] = {
          "features": self._features[pos], "neighbors": self._neighbors[pos]}
    return out


def _check_node(node: Any, where: str) -> tuple[dict, dict[str, list[str]]]:
  # Decoded JSON gives plain dicts; checking `dict` (not the Mapping ABC) keeps 100k-node loads fast.
  if not isinstance(node, dict):
    raise errors.DataError(f"{where}: expected an object with 'features' and 'neighbors'")
  unknown = set(node) - {"features", "neighbors"}
  if unknown:
    raise errors.DataError(f"{where}: unknown field(s) {sorted(unknown)}")
  if "features" not in node:
    raise errors.DataError(f"{where}: missing 'features'")
  feats = node["features"]
  if not isinstance(feats, dict):
    raise errors.DataError(f"{where}.features: expected an object")
  neigh_raw = node.get("neighbors", {})
  if not isinstance(neigh_raw, dict):
    raise errors.DataError(f"{where}.neighbors: expected an object mapping types to id lists")
  neigh: dict[str, list[str]] = {}
  for ntype, ids in neigh_raw.items():
    if not isinstance(ids, list):
      raise errors.DataError(f"{where}.neighbors[{ntype!r}]: expected a list of node ids")
    if all(type(i) is str for i in ids):
      neigh[ntype] = list(ids)
      continue
    out = []
    for i in ids:
      if isinstance(i, bool) or not isinstance(i, (str, int)):
        raise errors.DataError(f"{where}.neighbors[{ntype!r}]: node ids must be strings, got {i!r}")
      out.append(str(i))
    neigh[ntype] = out
  return dict(feats), neigh


def from_json_dict(raw: Any, *, name: str = "<graph>", text_keys: Mapping[str, str] | None = None,
                   on_dangling: str = "error") -> KnowledgeGraph:
  """Builds a graph from the decoded GRBench structure. See KnowledgeGraph for the arguments."""
  if not isinstance(raw, Mapping) or not raw:
    raise errors.DataError(f"{name}: expected a non-empty object of '<type>_nodes' tables")
  by_type = {}
  for key, nodes in raw.items():
    if not isinstance(key, str) or not key.endswith("_nodes") or key == "_nodes":
      raise errors.DataError(f"{name}: top-level key {key!r} is not of the form '<type>_nodes'")
    by_type[key[:-len("_nodes")]] = nodes
  return KnowledgeGraph(by_type, name=name, text_keys=text_keys, on_dangling=on_dangling)


def load_graph(path: str | os.PathLike, *, text_keys: Mapping[str, str] | None = None,
               on_dangling: str = "error") -> KnowledgeGraph:
  """Reads and validates a GRBench graph.json file.

  Raises:
    DataError: missing file, invalid JSON (with the line), or an invalid graph.
  """
  path = pathlib.Path(path)
  try:
    with path.open("rb") as f:
      raw = json.load(f)
  except FileNotFoundError:
    raise errors.DataError(f"{path}: graph file not found") from None
  except IsADirectoryError:
    raise errors.DataError(f"{path}: is a directory, expected a graph.json file") from None
  except json.JSONDecodeError as e:
    raise errors.DataError(f"{path}: line {e.lineno}: not valid JSON ({e.msg})") from None
  except UnicodeDecodeError as e:
    raise errors.DataError(f"{path}: not UTF-8 text ({e.reason})") from None
  return from_json_dict(raw, name=str(path), text_keys=text_keys, on_dangling=on_dangling)


def save_graph(graph: KnowledgeGraph, path: str | os.PathLike) -> pathlib.Path:
  """Writes graph.json atomically (a reader never sees half a file)."""
  return files.write_json(path, graph.to_json_dict(), "the graph")
