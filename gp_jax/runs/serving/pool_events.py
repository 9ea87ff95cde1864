"""Pool events served: a router server on the simulator whose pool changes at request t.

The drift study's events (gp_jax/runs/studies/drift.py: quality_drop, price_rise, fail, with its
event settings) act on the simulator's query streams by position (gp_jax/sim/events.py). A served
request whose text is a simulated training query meets that query's node (key
"train-<seed>-<i>"), so an event that follows the training split acts on the served requests for
training queries i >= t: a client replaying the training stream in order meets the event at its
request t (first pass). Requests for other texts (adopted queries) never meet it.

`apply` turns one ServedEvent into the served config's data.sim_events: the recorded events are
replaced by this one (a router retrained on a changed pool serves with only the event given here),
with splits = "train". The held-out canary queries of a learning server (the test split) meet
the pool the latest served query of an update met: the event once the stream has passed t
(online_update.GuardedUpdate.canary_pool). The join event changes the action space (the pool
gains an LLM) and is not served.
"""
from __future__ import annotations

import dataclasses

from gp_jax import errors
from gp_jax.runs import system as system_lib
from gp_jax.runs.studies import drift
from gp_jax.runs.studies import runner as runner_lib
from gp_jax.sim import events as sim_events
from gp_jax.sim import simulator as sim

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

  def overrides(self, config, *, t: int | None = None) -> dict:
    """The data.sim_events fields (dotted keys) of this event at position `t` (default self.t)
    of the training stream: the drift study's event settings (drift.event_overrides)."""
    s = drift.Settings(llm=self.llm, join_llm=self.llm, t=self.t if t is None else int(t),
                       delta=self.delta, price_scale=self.price_scale, window=1,
                       recovery_after=0, events=(self.kind,), routers=(), recent_rows=1)
    ev, _ = drift.event_overrides(self.kind, s, config)
    return {**ev, "data.sim_events.splits": SPLIT}


def _cleared() -> dict:
  """Overrides that turn every recorded event off."""
  return {f"data.sim_events.{k}.llm": "" for k in sim_events.KINDS}


def apply(config, event: ServedEvent, *, t: int | None = None):
  """A copy of the served `config` with `event` (at `t`, default event.t) as its only pool event.

  Raises:
    ConfigError: not a simulator config, an unknown kind or LLM, t < 0.
  """
  if event.kind not in KINDS:
    raise errors.unknown_name("served pool event", event.kind, KINDS)
  if config.data.source != "simulated" or config.get("backend", "simulator") != "simulator":
    raise errors.ConfigError(
        "--sim_event changes the simulated pool: it needs the simulator backend and a router "
        f"trained on simulated data (this config: backend={config.get('backend')!r}, "
        f"data.source={config.data.source!r})")
  if config.replay.mode != "off":
    raise errors.ConfigError("--sim_event cannot be used with a replay cache (replay.mode="
                             f"{config.replay.mode!r}): the events change the answers to the "
                             "same messages")
  out = runner_lib.apply_overrides(config, {**_cleared(), **event.overrides(config, t=t)})
  # Validated here, before the router loads: the LLM must be in the served pool, t >= 0.
  sim_events.from_config(out.data.sim_events, llms=system_lib.configured_llms(out),
                         domains={v[0] for v in sim.TASKS.values()}, tasks=sim.TASKS)
  return out


def retrained_overrides(config, event: ServedEvent) -> dict:
  """Training overrides of the reference router: the same config trained on the post-event pool
  (the event on every training query, t = 0), as the drift study retrains."""
  return {**_cleared(), **event.overrides(config, t=0)}
