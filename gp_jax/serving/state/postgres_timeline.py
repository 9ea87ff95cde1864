"""Epochs of the PostgreSQL store's sequence numbers: a counter that goes backwards is detected.

Every replica follows the feedback table by `seq > last applied`. If the counter row ever hands
out numbers a replica has already passed (a failover to a standby that was behind the old
primary, a restore from a backup, a hand edit), that replica would skip the new feedback for
good. So each store object keeps (`Timeline`):
  - the namespace's epoch (a third counter row, kind 'epoch', 0 at first);
  - the highest feedback and route seq it has handed to its caller or written ("seen");
  - the anchor: seq and completion id of the last feedback row it read or wrote.
Every sync (`feedback_after`) compares them with the database (`check`): the epoch changed, a
counter below what this replica has seen, or the anchor's seq holding another feedback (or none)
is an event. A write whose new seq is not above what this replica has seen, or that hits a row
already holding its seq, is one too.

On an event (`advance`, one transaction holding the counter rows):
  - the replica that finds the regression starts a new epoch, max(epoch in the database, its
    own) + 1, and raises both counters past every seq it has seen, every stored row and the
    epoch's start, epoch << EPOCH_BITS: numbers handed out from then on are above anything an
    older epoch handed out, however far a replica got;
  - a replica that finds only a newer epoch (another replica started it) takes it;
  - either way the replica re-reads the feedback the database holds after its base (the
    "replay"). Its caller gets those rows numbered just below the new counter, so its memory
    applies every one it does not hold yet (memories skip ids they hold) and then follows the
    new numbers. Nothing the database holds is skipped, and everything acknowledged after the
    event is in the database. (The served memory then reloads from the database instead, seeing
    `PostgresStore.epoch_events` move: memory.ServedMemory.reload.)
The log line that says so is written by the store (postgres.PostgresStore).
"""
from __future__ import annotations

import dataclasses

EPOCH_BITS = 40   # seq of an epoch's first row: epoch << 40 (about 10^12 rows per epoch)
KINDS = ("feedback", "route")


@dataclasses.dataclass
class Timeline:
  """What one store object has seen of its namespace's numbering."""
  epoch: int = 0
  seen: dict = dataclasses.field(default_factory=lambda: {k: 0 for k in KINDS})
  anchor: tuple[int, str] | None = None   # (seq, rid) of the last feedback row read or written
  cut: int = 0          # the last advance's counter: replayed rows are numbered up to it
  replay: list = dataclasses.field(default_factory=list)   # [(presented seq, db row)]
  events: int = 0

  def saw(self, kind: str, seq: int, rid: str | None = None) -> None:
    if seq > self.seen[kind]:
      self.seen[kind] = int(seq)
      if kind == "feedback" and rid is not None:
        self.anchor = (int(seq), rid)


@dataclasses.dataclass(frozen=True)
class Advance:
  """The outcome of one `advance`, applied to the Timeline once its transaction committed."""
  epoch: int
  old_epoch: int
  started: bool       # this replica started the epoch (it found the regression)
  cut: int            # the feedback counter now; replayed rows are numbered cut - n + 1 .. cut
  route_floor: int
  replay: list        # db rows of the feedback after the base, in seq order
  why: str


class Regressed(Exception):
  """Internal: a write found the counter behind what this replica has seen."""


def counters(conn, namespace: str, lock: bool = False) -> dict[str, int]:
  rows = conn.execute("SELECT kind, value FROM gp_jax_counter WHERE namespace = %s ORDER BY kind"
                      + (" FOR UPDATE" if lock else ""), (namespace,)).fetchall()
  return {k: int(v) for k, v in rows}


def check(conn, namespace: str, tl: Timeline) -> tuple[str, bool] | None:
  """(what is wrong, whether the numbering went backwards) or None when the database still
  continues what this replica has seen."""
  c = counters(conn, namespace)
  for kind in KINDS:
    if c.get(kind, 0) < tl.seen[kind]:
      return (f"the {kind} counter is at {c.get(kind, 0)} but this replica has seen "
              f"{kind} {tl.seen[kind]}", True)
  if tl.anchor is not None:
    row = conn.execute("SELECT rid FROM gp_jax_feedback WHERE namespace = %s AND seq = %s",
                       (namespace, tl.anchor[0])).fetchone()
    if row is None or row[0] != tl.anchor[1]:
      held = "nothing" if row is None else f"feedback for {row[0]!r}"
      return (f"feedback {tl.anchor[0]} is {held} but this replica applied it as the feedback "
              f"for {tl.anchor[1]!r}", True)
  epoch = c.get("epoch", 0)
  if epoch != tl.epoch:
    return f"its epoch is {epoch}, this replica's {tl.epoch}", epoch < tl.epoch
  return None


def advance(conn, namespace: str, tl: Timeline, why: str, regressed: bool, after: int,
            feedback_select: str) -> Advance:
  """The event's transaction (module docstring); `after`: the caller's last applied seq."""
  c = counters(conn, namespace, lock=True)
  db_epoch = c.get("epoch", 0)
  started = regressed or db_epoch < tl.epoch
  epoch = max(db_epoch, tl.epoch) + 1 if started else db_epoch
  start = epoch << EPOCH_BITS if started else 0
  base = conn.execute("SELECT seq FROM gp_jax_base WHERE namespace = %s",
                      (namespace,)).fetchone()
  base_seq = int(base[0]) if base else 0
  (top_fb,) = conn.execute("SELECT coalesce(max(seq), 0) FROM gp_jax_feedback "
                           "WHERE namespace = %s", (namespace,)).fetchone()
  (top_route,) = conn.execute("SELECT coalesce(max(seq), 0) FROM gp_jax_route "
                              "WHERE namespace = %s", (namespace,)).fetchone()
  with conn.cursor(binary=True) as cur:
    replay = cur.execute(feedback_select + " AND seq > %s ORDER BY seq",
                         (namespace, base_seq)).fetchall()
  floor = max(c.get("feedback", 0), tl.seen["feedback"], int(top_fb), base_seq, int(after),
              tl.cut, start)
  cut = floor + len(replay)
  route_floor = max(c.get("route", 0), tl.seen["route"], int(top_route), start)
  conn.execute("INSERT INTO gp_jax_counter (namespace, kind, value) VALUES (%s, 'feedback', %s), "
               "(%s, 'route', %s), (%s, 'epoch', %s) ON CONFLICT (namespace, kind) DO UPDATE "
               "SET value = EXCLUDED.value",
               (namespace, cut, namespace, route_floor, namespace, epoch))
  return Advance(epoch=epoch, old_epoch=tl.epoch, started=started, cut=cut,
                 route_floor=route_floor, replay=replay, why=why)


def adopt(tl: Timeline, adv: Advance) -> None:
  """The Timeline after `adv` committed: replayed rows get the numbers just below the cut."""
  first = adv.cut - len(adv.replay) + 1
  tl.epoch, tl.cut = adv.epoch, adv.cut
  tl.replay = [(first + i, row) for i, row in enumerate(adv.replay)]
  tl.seen["feedback"] = max(tl.seen["feedback"], adv.cut)
  tl.seen["route"] = max(tl.seen["route"], adv.route_floor)
  tl.anchor = (int(adv.replay[-1][0]), adv.replay[-1][1]) if adv.replay else None
  tl.events += 1


def message(where, namespace: str, adv: Advance) -> str:
  """The one log line of an event."""
  if adv.started:
    what = (f"sequence numbers went backwards ({adv.why}: a failover to a standby that was "
            f"behind, or a restore?); started epoch {adv.epoch} (was {adv.old_epoch}), new "
            f"numbers start above {adv.cut}")
  else:
    what = (f"another replica started epoch {adv.epoch} (this replica was in epoch "
            f"{adv.old_epoch})")
  return (f"{where}: namespace {namespace!r}: {what}; re-reading the {len(adv.replay)} "
          f"feedback the database holds after its base so that none is skipped")
