"""The router versions of a learning server: each accepted version an orbax checkpoint with its
provenance, and one index that says which versions exist and which one serves.

Layout under the served-state folder (next to the memory):

  router_versions/index.json     {"versions": [{version, parent, created, feedback, canary,
                                  kl, update_step}, ...], "serving": version id, "learner": {...}}
  router_versions/<version>/     gp_jax/rl/checkpoint.Checkpointer folder: step 0 of "latest"
                                 holds the learner's TrainingState (params, optimizer state,
                                 PRNG key, update count) and the provenance as its metadata
  router_versions/memory/<version>.npz
                                 the served memory as it was when the version began to serve
                                 (journal.save_memory's format); a rollback to the version
                                 serves it again with this memory (the newest MEMORY_KEPT
                                 versions' and v0's are kept)
  router_versions/memory/aside-<n>.npz
                                 the memory as it was just before rollback n: the rows that
                                 entered after the version rolled back to (the span's feedback)
                                 are kept here, and rolling forward to a later version serves
                                 that version's own memory again

The index is the commit point: a version is accepted once its checkpoint is complete (orbax
writes into a temporary folder and renames it, then the integrity record) and the index naming
it is replaced atomically (files.write_json). A kill at any moment leaves the previous index,
whose versions are all complete; a folder the index does not name (a version killed while being
written) is deleted when the store opens. Version "v0" is the trained checkpoint the server
started from.
"""
from __future__ import annotations

import json
import logging
import pathlib
import shutil
import time

import jax
import numpy as np

from gp_jax import errors
from gp_jax import files
from gp_jax.graph import history as history_lib
from gp_jax.rl import checkpoint as checkpoint_lib
from gp_jax.serving.state import journal as journal_lib

INDEX = "index.json"
FOLDER = "router_versions"
MEMORY = "memory"     # the versions' memory snapshots and the memories rollbacks set aside
MEMORY_KEPT = 16      # versions (besides v0) whose memory snapshot is kept, newest first
_log = logging.getLogger(__name__)


def stamped(record: dict) -> dict:
  """`record` with its creation time (now, unless it has one)."""
  return dict(record, created=record.get("created", time.time()))


def _empty_history(row_dim: int, num_hubs: int) -> history_lib.HistoryMemory:
  """The history a version's checkpoint holds: none (the served memory lives apart)."""
  return history_lib.HistoryMemory(row_dim, num_hubs, capacity=0)


def write_checkpoint(folder: str | pathlib.Path, state, record: dict, *, row_dim: int,
                     num_hubs: int) -> None:
  """Writes a version's checkpoint: `state` (a TrainingState) with `record` as its metadata
  into `folder`; it is not a version until VersionStore.commit names it (the learner process
  writes it, the server commits it). A folder already there is an uncommitted write that
  failed: it is replaced."""
  folder = pathlib.Path(folder)
  if folder.exists():
    shutil.rmtree(folder)
  ckpt = checkpoint_lib.Checkpointer(folder)
  try:
    ckpt.save(checkpoint_lib.Write(
        step=0, state=jax.device_get(state),
        history=_empty_history(row_dim, num_hubs),
        meta=dict(record, best_iteration=0)))
  finally:
    ckpt.close()


class VersionStore:
  """Accepted versions under `directory` (module docstring).

  Args:
    directory: the versions folder (created).
    row_dim, num_hubs: the history row layout (a checkpoint holds an empty history).
  """

  def __init__(self, directory: str | pathlib.Path, *, row_dim: int, num_hubs: int):
    self.directory = pathlib.Path(directory)
    try:
      self.directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
      raise errors.StorageError(f"cannot create the router versions folder {self.directory}: "
                                f"{e.strerror or e}") from None
    self.row_dim, self.num_hubs = row_dim, num_hubs
    path = self.directory / INDEX
    self.index = (errors.read_json(path, "router versions index") if path.exists()
                  else dict(versions=[], serving=None, learner={}))
    if not isinstance(self.index, dict) or not isinstance(self.index.get("versions"), list):
      raise errors.DataError(f"{path}: not a router versions index")
    known = {v["version"] for v in self.index["versions"]} | {MEMORY}
    for p in self.directory.iterdir():   # versions killed while being written
      if p.is_dir() and p.name not in known:
        _log.warning("removing router version folder %s (not in the index: its write did not "
                     "finish)", p.name)
        shutil.rmtree(p, ignore_errors=True)

  @property
  def serving(self) -> str | None:
    return self.index.get("serving")

  @property
  def learner(self) -> dict:
    return dict(self.index.get("learner") or {})

  def versions(self) -> list[dict]:
    return [dict(v) for v in self.index["versions"]]

  def get(self, version: str) -> dict | None:
    return next((dict(v) for v in self.index["versions"] if v["version"] == version), None)

  def next_id(self) -> str:
    return f"v{len(self.index['versions'])}"

  def add(self, state, record: dict, learner: dict) -> dict:
    """Writes `state` (a TrainingState) as version record["version"], then the index naming it
    as accepted and serving. Raises StorageError (the index is unchanged)."""
    record = stamped(record)
    self._check_new(record["version"])
    write_checkpoint(self.directory / record["version"], state, record, row_dim=self.row_dim,
                     num_hubs=self.num_hubs)
    return self.commit(record, learner)

  def commit(self, record: dict, learner: dict) -> dict:
    """The index naming version record["version"] (its checkpoint already written, by
    write_checkpoint) as accepted and serving, with the learner's state."""
    self._check_new(record["version"])
    if not (self.directory / record["version"]).is_dir():
      raise errors.StorageError(f"router version {record['version']} has no checkpoint folder "
                                f"in {self.directory}")
    index = dict(self.index, versions=self.index["versions"] + [record],
                 serving=record["version"], learner=dict(learner))
    self._write(index)
    return record

  def _check_new(self, version: str) -> None:
    if self.get(version) is not None:
      raise ValueError(f"router version {version} exists")

  def set_serving(self, version: str, learner: dict) -> None:
    if self.get(version) is None:
      raise KeyError(version)
    self._write(dict(self.index, serving=version, learner=dict(learner)))

  def set_learner(self, learner: dict) -> None:
    self._write(dict(self.index, learner=dict(learner)))

  def _write(self, index: dict) -> None:
    files.write_atomic(self.directory / INDEX, json.dumps(index), "the router versions index",
                       durable=True)
    self.index = index

  def load(self, version: str, abstract_state):
    """The TrainingState of `version` (structure of `abstract_state`). Raises KeyError for an
    unknown version, DataError for a damaged one."""
    if self.get(version) is None:
      raise KeyError(version)
    ckpt = checkpoint_lib.Checkpointer(self.directory / version, read_only=True)
    try:
      out = ckpt.restore(jax.tree_util.tree_map(np.asarray, abstract_state),
                         _empty_history(self.row_dim, self.num_hubs))
    finally:
      ckpt.close()
    if out is None:
      raise errors.DataError(f"router version {version} has no checkpoint in "
                             f"{self.directory / version}")
    return out.state

  # ---- the versions' memories ----------------------------------------------------------------
  def lineage(self, version: str) -> list[str]:
    """`version` and its ancestors, newest first."""
    out, v = [], self.get(version)
    while v is not None and v["version"] not in out:
      out.append(v["version"])
      v = self.get(v["parent"]) if v.get("parent") else None
    return out

  def memory_path(self, name: str) -> pathlib.Path:
    return self.directory / MEMORY / f"{name}.npz"

  def has_memory(self, version: str) -> bool:
    return self.memory_path(version).exists()

  def write_memory(self, name: str, snapshot) -> str:
    """Writes a memory snapshot (ServedMemory.snapshot: rows, hubs, header, seq) durably as
    memory/<name>.npz; returns that path relative to the versions folder."""
    rows, hubs, header, seq = snapshot
    journal_lib.save_memory(self.memory_path(name), rows, hubs, dict(header, seq=int(seq)))
    self._prune_memories()
    return f"{MEMORY}/{name}.npz"

  def load_memory(self, version: str):
    """(rows, hubs, header) of `version`'s memory snapshot; None when it has none (a version
    from before snapshots, or one whose snapshot was pruned)."""
    return journal_lib.load_memory(self.memory_path(version), row_dim=self.row_dim,
                                   num_hubs=self.num_hubs)

  def _prune_memories(self) -> None:
    """Removes the snapshots of versions older than the newest MEMORY_KEPT (v0's and the
    serving version's stay; the memories rollbacks set aside stay)."""
    names = [v["version"] for v in self.index["versions"]]
    keep = set(names[-MEMORY_KEPT:]) | {"v0", self.serving}
    for name in names:
      if name not in keep and self.has_memory(name):
        self.memory_path(name).unlink(missing_ok=True)
