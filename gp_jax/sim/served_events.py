"""Pool events served: a router server on the simulator whose pool changes at request t.

The drift study's events (quality_drop, price_rise, fail; gp_jax/sim/events.py says what each
does) act on the simulator's query streams by position. A served request whose text is a
simulated training query meets that query's node (key "train-<seed>-<i>"), so an event that
follows the training split acts on the served requests for training queries i >= t: a client
replaying the training stream in order meets the event at its request t (first pass). Requests
for other texts (adopted queries) never meet it.

A served event replaces the recorded events of the served config (a router retrained on a changed
pool serves with only the event given here), with splits = "train"; the server applies it with
gp_jax/serving/engine/config.with_pool_event. The held-out canary queries of a learning server (the
test split) meet the pool the latest served query of an update met: the event once the stream has
passed t (gp_jax/serving/learning/update.py). The join event changes the action space (the pool
gains an LLM) and is not served.
"""
from __future__ import annotations

import dataclasses

from gp_jax.sim import events as sim_events

KINDS = ("quality_drop", "price_rise", "fail")   # the drift study's events a server can serve
SPLIT = "train"                                   # the query stream the served event follows
FILE = "sim_event.json"                           # its record in the served-state folder


@dataclasses.dataclass(frozen=True)
class ServedEvent:
  """One drift-study event at served request position t of the training stream.

  kind: one of KINDS; llm: the LLM it concerns; t: first training-query position it acts on;
  delta: quality_drop's logit shift of the LLM's skill; price_scale: price_rise's multiplier.
  """
  kind: str
  llm: str
  t: int
  delta: float
  price_scale: float

  def to_dict(self) -> dict:
    return dict(dataclasses.asdict(self), split=SPLIT)

  def overrides(self, *, t: int | None = None) -> dict:
    """The data.sim_events fields (dotted keys) of this event, alone, at position `t` (default
    self.t) of the training stream."""
    return {**sim_events.cleared_overrides(),
            **sim_events.config_overrides(self.kind, self.llm, self.t if t is None else int(t),
                                          SPLIT, delta=self.delta, price_scale=self.price_scale)}


def retrained_overrides(event: ServedEvent) -> dict:
  """Training overrides of the reference router: the same config trained on the post-event pool
  (the event on every training query, t = 0), as the drift study retrains."""
  return event.overrides(t=0)
