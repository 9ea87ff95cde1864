"""Progress of long steps on the terminal: done / total, elapsed time, ETA and a few fields.

One `Progress` per step (training iterations, evaluation queries, sweep or study cells), fed
`update(done, **fields)` from the step's loop. It writes to stderr in one of three styles:
  * "tty": one line rewritten in place (carriage return), at most 5 times a second;
  * "lines": plain lines, the first once an ETA exists, then at most one every
    `GP_JAX_PROGRESS_EVERY` seconds (default 10), and the last: logs stay line-based and short;
  * "off": nothing.
The style is "tty" when stderr is a terminal and "lines" otherwise; the environment variable
`GP_JAX_PROGRESS` (tty | lines | off) overrides that. Every line starts with "[<label>]", which
is what scripts/train.sh picks out of the logs to show.

The ETA is the remaining count at the rate measured since the first update of this process, so
the first step (XLA compilation, a resumed run's earlier work) does not skew it; before a second
update there is none ("ETA ?" on a terminal; the "lines" style waits for it).

(A small reporter rather than a progress library such as tqdm: logs need plain, throttled lines
rather than a redrawn bar, the runners already keep absl logging off the console, and it adds
no dependency to the cached virtual environment.)
"""
from __future__ import annotations

import os
import sys
import time

STYLES = ("tty", "lines", "off")
_TTY_INTERVAL_S = 0.2
_MIN_RATE_S = 1.0        # no ETA from a rate measured over less time than this (bursts)
_tty_line_open = False   # a "tty" line is on screen without its newline yet


def style_for(stream) -> str:
  """The output style for `stream`: $GP_JAX_PROGRESS, else tty for a terminal, else lines."""
  forced = os.environ.get("GP_JAX_PROGRESS", "").strip().lower()
  if forced in STYLES:
    return forced
  try:
    return "tty" if stream.isatty() else "lines"
  except (AttributeError, ValueError):
    return "lines"


def lines_interval_s() -> float:
  try:
    return max(0.0, float(os.environ.get("GP_JAX_PROGRESS_EVERY", "10")))
  except ValueError:
    return 10.0


def format_seconds(s: float) -> str:
  """4s, 2m05s, 1h02m."""
  s = max(0, int(round(s)))
  if s < 60:
    return f"{s}s"
  if s < 3600:
    return f"{s // 60}m{s % 60:02d}s"
  return f"{s // 3600}h{s % 3600 // 60:02d}m"


def note(text: str, stream=None) -> None:
  """A one-off line (e.g. "[eval] building the system"), kept apart from an open tty line."""
  stream = stream or sys.stderr
  if style_for(stream) == "off":
    return
  _close_tty_line(stream)
  stream.write(text + "\n")
  stream.flush()


def _close_tty_line(stream) -> None:
  global _tty_line_open
  if _tty_line_open:
    stream.write("\n")
    _tty_line_open = False


class Progress:
  """Reports `done` of `total` units of one step; see the module docstring.

  Args:
    label: the step's name, printed as "[label]".
    total: units of the whole step (iterations, queries, cells).
    unit: the units' name ("iter", "queries", "cells").
    stream: where to write (default sys.stderr).
    style: "tty", "lines" or "off" (default: style_for(stream)).
    eta_from_start: measure the rate from the creation of this object rather than from the first
      update (for steps whose first unit is no slower than the others, e.g. sweep cells).
    write_at_total: write the line that reaches `total` at once (else at `close`, for steps made
      of parts, see `restart`).
  """

  def __init__(self, label: str, total: int, *, unit: str = "", stream=None,
               style: str | None = None, eta_from_start: bool = False,
               write_at_total: bool = True):
    self.unit = unit
    self.stream = stream or sys.stderr
    self.style = style or style_for(self.stream)
    self.eta_from_start = eta_from_start
    self.write_at_total = write_at_total
    self._last_write = -float("inf")
    self._last_line = ""
    self.restart(label, total)

  def restart(self, label: str, total: int) -> None:
    """Starts the next part of a step (e.g. the next policy of an evaluation): a new label,
    total, clock and rate, on the same line (tty) or the same one-per-interval budget (lines)."""
    self.label = label
    self.total = max(0, int(total))
    self.t_start = time.monotonic()
    # (time, done) the ETA's rate is measured from: the first update, or the start.
    self._first: tuple[float, int] | None = (self.t_start, 0) if self.eta_from_start else None
    self._unwritten: tuple[int, dict] | None = None   # the latest update, when not written
    self.done = 0

  def eta_s(self, done: int, now: float) -> float | None:
    """Seconds left at the rate since the first update (or the start); None before a later
    update at least a second after it."""
    left = self.total - done
    if left <= 0:
      return 0.0
    if self._first is not None and done > self._first[1] and now - self._first[0] >= _MIN_RATE_S:
      t0, d0 = self._first
      return left * (now - t0) / (done - d0)
    return None

  def line(self, done: int, fields: dict, now: float) -> str:
    pct = f" ({100 * done / self.total:.0f}%)" if self.total else ""
    unit = f" {self.unit}" if self.unit else ""
    parts = [f"[{self.label}] {done}/{self.total}{unit}{pct}"]
    parts += [f"{k} {_fmt(v)}" for k, v in fields.items() if v is not None]
    eta = self.eta_s(done, now)
    timing = f"{format_seconds(now - self.t_start)} elapsed"
    if done < self.total:
      timing += f", ETA {'?' if eta is None else format_seconds(eta)}"
    return "  ".join(parts) + " | " + timing

  def update(self, done: int, *, final: bool = False, **fields) -> None:
    """Records `done` units finished (of `total`); fields are shown as "name value"."""
    now = time.monotonic()
    self.done = done = int(done)
    if self._first is None:
      self._first = (now, done)
    if self.style == "off":
      return
    self._unwritten = (done, fields)
    first_write = self._last_write == -float("inf")
    last = final or (self.write_at_total and done >= self.total)
    if self.style == "tty":
      if not (first_write or last or now - self._last_write >= _TTY_INTERVAL_S):
        return
    else:
      # A line once there is an ETA, then at most one per interval.
      due = (self.eta_s(done, now) is not None
             and (first_write or now - self._last_write >= lines_interval_s()))
      if not (due or last):
        return
    self._write(done, fields, now, last)

  def _write(self, done: int, fields: dict, now: float, last: bool) -> None:
    global _tty_line_open
    self._unwritten = None
    text = self.line(done, fields, now)
    if self.style == "tty":
      pad = max(0, len(self._last_line) - len(text))
      self.stream.write("\r" + text + " " * pad)
      _tty_line_open = True
      if last:
        self.stream.write("\n")
        _tty_line_open = False
    else:
      self.stream.write(text + "\n")
    self.stream.flush()
    self._last_write, self._last_line = now, text

  def close(self) -> None:
    """Writes the last update if it was held back (a step that ended early, or between lines),
    and ends an open tty line."""
    if self._unwritten is not None:
      self._write(*self._unwritten, time.monotonic(), True)
    if self.style == "tty":
      _close_tty_line(self.stream)


def _fmt(v) -> str:
  return f"{v:.3f}" if isinstance(v, float) else str(v)
