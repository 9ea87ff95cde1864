"""Orbax checkpoints of a training run: latest (for resuming) and best (by running reward).

A checkpoint holds the TrainingState (params, optimizer state, PRNG key, update count), the history
memory (padded rows, hub ids, row count) and JSON metadata (iteration, counters, running reward).
Orbax writes into a temporary folder and renames it when complete, so a run killed at any moment
leaves the previous checkpoint intact.
"""
from __future__ import annotations

import pathlib

import jax
import numpy as np
import orbax.checkpoint as ocp

from gp_jax.graph import history as history_lib


def _manager(path: pathlib.Path, keep: int) -> ocp.CheckpointManager:
  return ocp.CheckpointManager(
      path.resolve(), options=ocp.CheckpointManagerOptions(
          max_to_keep=keep, create=True, enable_async_checkpointing=False))


class Checkpointer:
  def __init__(self, directory: str | pathlib.Path):
    directory = pathlib.Path(directory)
    self.latest = _manager(directory / "latest", 2)
    self.best = _manager(directory / "best", 1)

  @staticmethod
  def _args(state, history: history_lib.HistoryMemory, meta: dict):
    rows, hubs = history.padded()
    return ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        history=ocp.args.StandardSave({"rows": rows, "hubs": hubs}),
        meta=ocp.args.JsonSave(dict(meta, history_rows=len(history))))

  def save(self, step: int, state, history, meta: dict, *, best: bool = False) -> None:
    mngr = self.best if best else self.latest
    mngr.save(step, args=self._args(state, history, meta), force=True)
    mngr.wait_until_finished()

  def restore(self, abstract_state, history: history_lib.HistoryMemory, *, best: bool = False):
    """Returns (state, meta) and fills `history`; None when there is no checkpoint."""
    mngr = self.best if best else self.latest
    step = mngr.latest_step()
    if step is None:
      return None
    out = mngr.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state),
        history=ocp.args.StandardRestore(),
        meta=ocp.args.JsonRestore()))
    meta = dict(out["meta"])
    n = int(meta["history_rows"])
    h = jax.tree_util.tree_map(np.asarray, out["history"])
    history.load_state_dict({"rows": h["rows"][:n], "hubs": h["hubs"][:n]})
    return out["state"], meta

  def close(self) -> None:
    self.latest.close()
    self.best.close()
