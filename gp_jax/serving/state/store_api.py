"""What a router server must not lose, and the one interface every store of it provides.

A served router keeps three things that outlive the process:
  - the history memory: a base (rows, hubs, header) plus the feedback added since, in order;
  - the completion ids that have feedback (a second feedback for one id is refused, across
    restarts and across replicas);
  - the route log: one record per served request, numbered by the store (`seq`, increasing in
    the order the store accepted them), which `GET /v1/routes?after=` pages by.

Two stores implement `ServedStore`:
  - `store.FileStore`: the embedded default, files in one folder (memory base + journal, route
    log), held by one process at a time (an exclusive lock on the folder);
  - `postgres.PostgresStore`: PostgreSQL (`--memory_url=postgresql://...`), shared by replicas.
    Each replica reads the feedback the others added with `feedback_after`.

Acknowledgement rule (both stores): `add_feedback` returns only once the feedback is durable; if
it raises, nothing of that feedback is stored and its id stays unused, so the client's retry
succeeds.
"""
from __future__ import annotations

import dataclasses
from typing import Protocol

import numpy as np

from gp_jax import errors


@dataclasses.dataclass(frozen=True)
class Feedback:
  """One acknowledged feedback: a served request's calls as history rows.

  seq: the store's sequence number (0 before the store has accepted it).
  rid: the completion id. key: name of the API key that sent it (None when no keys are set).
  score: the outcome in [0, 1]. rows: [n, F] float32 history rows. hubs: [n] int32 action ids.
  """
  seq: int
  rid: str
  key: str | None
  score: float
  rows: np.ndarray
  hubs: np.ndarray


@dataclasses.dataclass(frozen=True)
class Restored:
  """What a store holds at start: the base memory and the feedback after it, in seq order."""
  rows: np.ndarray            # [n, F] float32 base rows
  hubs: np.ndarray            # [n] int32
  header: dict                # facts saved with the base (capacity, served_rows, feedback ids...)
  base_seq: int               # the last feedback seq the base holds
  feedback: list[Feedback]    # seq > base_seq, ascending


class DuplicateFeedback(errors.GpJaxError):
  """The completion already has feedback (in this process, an earlier one, or another replica)."""


class ServedStore(Protocol):
  """The interface of a served router's durable state (module docstring)."""

  def load(self) -> Restored | None:
    """The stored memory, or None when the store is new (the caller then seeds it with
    `write_base` from the checkpoint's history). Damaged data raises DataError naming it."""

  def write_base(self, rows: np.ndarray, hubs: np.ndarray, header: dict, seq: int) -> None:
    """A new base holding everything up to feedback `seq` (compaction, or the first seed)."""

  def add_feedback(self, fb: Feedback) -> Feedback:
    """Stores one feedback durably and returns it with its seq. Raises DuplicateFeedback when
    the id already has feedback, StorageError when it cannot be written (nothing is stored)."""

  def feedback_after(self, seq: int) -> list[Feedback]:
    """Feedback with seq > `seq`, ascending (other replicas'; a file store returns its own)."""

  def has_feedback(self, rid: str) -> bool:
    """Whether completion `rid` has feedback."""

  def append_route(self, record: dict) -> int:
    """Stores one route record (a served request) and returns its seq."""

  def append_routes(self, records: list[dict]) -> list[int]:
    """Stores route records in this order (the engine's batch of one loop tick); returns their
    seqs. Raises OSError or StorageError when they cannot be written (then none is acknowledged
    to its client)."""

  def route(self, rid: str) -> dict | None:
    """The route record of completion `rid`, with its `seq`; None when unknown."""

  def routes_after(self, seq: int, limit: int) -> list[dict]:
    """Route records with seq > `seq`, ascending, at most `limit`."""

  def close(self) -> None:
    """Releases files, locks and connections."""


def check_rows(rows: np.ndarray, hubs: np.ndarray, *, row_dim: int, num_hubs: int,
               where: str) -> None:
  """Raises DataError naming `where` when rows/hubs do not fit this router."""
  if rows.ndim != 2 or rows.shape[1] != row_dim or hubs.shape != (len(rows),):
    raise errors.DataError(f"{where}: memory rows of shape {rows.shape} do not fit this router "
                           f"(row width {row_dim}); it was made by a router with other features")
  if len(hubs) and (hubs.min() < 0 or hubs.max() >= num_hubs):
    raise errors.DataError(f"{where}: memory rows name (role, LLM) hubs outside this router's "
                           f"{num_hubs}")
