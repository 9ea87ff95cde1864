"""The consistency check of a learning server: an API key whose feedback disagrees with the other
keys' is left out of the updates (docs/serving.md, Learning while serving).

The key share bounds how much of one update one key's feedback may be; a key under that share can
still steer every update a little, e.g. by inverting its scores. This guard asks of each key
whether its scores follow the same outcomes the other keys' scores follow. Its yardstick is the
router's own value estimate of each served request (the value network's estimate at the
request's last decision): over the honest traffic, a request the value network expects to go
well is scored higher, so scores and estimates correlate positively. A key whose scores are
inverted correlates negatively.

For each key k the guard keeps running sums of (estimate, score) pairs, and compares the
correlation r_k of its pairs with the correlation r_rest of every other key's pairs pooled, by
Fisher's z test: Z = (atanh r_k - atanh r_rest) / sqrt(1/(n_k - 3) + 1/(n_rest - 3)). A key
whose Z is below -`z` with at least `min_feedback` pairs of its own is flagged: its waiting and
later episodes are dropped before they reach an update (counted). The comparison is with the
other keys, not with the estimates alone: after a pool change every key's scores part from the
estimates together, and no key is flagged for it. Feedback without a key, and a server with one
key, are never judged. The test assumes most feedback is honest, as any check against the
majority does: a majority of colluding keys would flag the honest ones. A flagged key stays
flagged while its own sums keep it below (the sums are cumulative, kept with the learner's
state). The history memory is not guarded here (its own per-key share bounds a key's rows).
"""
from __future__ import annotations

import math

import numpy as np

_FIELDS = ("n", "x", "y", "xx", "yy", "xy")
_R_MAX = 0.999   # correlations are clipped inside (-1, 1) before atanh


def correlation(s: np.ndarray) -> float:
  """Pearson correlation of the pairs summed in s (n, Σx, Σy, Σx², Σy², Σxy); NaN when either
  side has no spread."""
  n, x, y, xx, yy, xy = (float(v) for v in s)
  if n < 2:
    return math.nan
  vx, vy = xx - x * x / n, yy - y * y / n
  if vx <= 1e-12 * max(1.0, xx) or vy <= 1e-12 * max(1.0, yy):
    return math.nan
  return (xy - x * y / n) / math.sqrt(vx * vy)


class FeedbackConsistency:
  """Per-key running sums of (value estimate, score) and the test above.

  Args:
    z: the one-sided threshold on Z; 0 turns the guard off. The test is repeated at every
      update on cumulative sums, so an honest key gets many chances to cross it: the server's
      default, 3.09 (0.1% one-sided for one test), is stricter than a single test's 1% (2.33).
    min_feedback: pairs of its own a key needs before it can be flagged.
  """

  def __init__(self, z: float, min_feedback: int):
    self.z, self.min_feedback = float(z), int(min_feedback)
    self.sums: dict[str, np.ndarray] = {}
    self.total = np.zeros(len(_FIELDS))   # over all keys (a verdict is O(1) in the keys)

  def add(self, key: str | None, estimate: float, score: float) -> None:
    if key is None:
      return
    x, y = float(estimate), float(score)
    pair = np.array([1.0, x, y, x * x, y * y, x * y])
    self.sums.setdefault(key, np.zeros(len(_FIELDS)))[:] += pair
    self.total += pair

  def verdict(self, key: str) -> dict:
    """n, r (the key's), r_rest (the others', pooled), z (Fisher's statistic; NaN when not
    computable) and flagged."""
    mine = self.sums.get(key, np.zeros(len(_FIELDS)))
    rest = self.total - mine
    r_k, r_rest = correlation(mine), correlation(rest)
    n_k, n_rest = int(mine[0]), int(rest[0])
    stat = math.nan
    if n_k > 3 and n_rest > 3 and not (math.isnan(r_k) or math.isnan(r_rest)):
      def fz(r):
        return math.atanh(min(_R_MAX, max(-_R_MAX, r)))
      stat = (fz(r_k) - fz(r_rest)) / math.sqrt(1.0 / (n_k - 3) + 1.0 / (n_rest - 3))
    flagged = (self.z > 0 and n_k >= self.min_feedback and not math.isnan(stat)
               and stat < -self.z)
    return dict(n=n_k, r=r_k, r_rest=r_rest, z=stat, flagged=bool(flagged))

  def flagged(self, key: str | None) -> bool:
    return key is not None and self.z > 0 and self.verdict(key)["flagged"]

  def flagged_keys(self) -> list[str]:
    return sorted(k for k in self.sums if self.flagged(k))

  def state_dict(self) -> dict:
    return {k: s.tolist() for k, s in self.sums.items()}

  def load_state_dict(self, state: dict) -> None:
    self.sums = {k: np.asarray(v, float) for k, v in (state or {}).items()
                 if len(v) == len(_FIELDS)}
    self.total = sum(self.sums.values(), np.zeros(len(_FIELDS)))
