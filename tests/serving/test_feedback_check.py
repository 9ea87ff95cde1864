"""The consistency check of a learning server (gp_jax/serving/learning/consistency.py)."""
import collections
import types

import numpy as np

from gp_jax.serving.learning import consistency
from gp_jax.serving.learning import learner as learner_lib

HONEST = [f"user{j}" for j in range(8)]


def _stream(rng, n, invert_key=None, invert_share=0.2, informative=True):
  """(key, estimate, score) of n served requests: the score is 1 with probability the estimate
  (informative) or 1/2 (a pool where the estimates say nothing); invert_key sends 1 - score on
  every request i with i % round(1 / invert_share) == 0, the honest keys the rest."""
  every = round(1 / invert_share)
  out = []
  for i in range(n):
    v = rng.uniform(0.05, 0.95)
    s = float(rng.uniform() < (v if informative else 0.5))
    if invert_key is not None and i % every == 0:
      out.append((invert_key, v, 1.0 - s))
    else:
      out.append((HONEST[i % len(HONEST)], v, s))
  return out


def _guard(stream, z=3.09, min_feedback=32):
  g = consistency.FeedbackConsistency(z, min_feedback)
  for key, v, s in stream:
    g.add(key, v, s)
  return g


def test_correlation_of_the_sums_is_pearsons():
  rng = np.random.default_rng(0)
  x, y = rng.normal(size=50), rng.normal(size=50)
  y = y + 0.5 * x
  g = _guard([("k", a, b) for a, b in zip(x, y)])
  assert np.isclose(consistency.correlation(g.sums["k"]), np.corrcoef(x, y)[0, 1])
  assert np.isnan(consistency.correlation(np.array([3.0, 3.0, 1.0, 3.0, 1.0, 1.0])))


def test_an_inverting_key_under_the_share_is_flagged_and_no_honest_key_is():
  g = _guard(_stream(np.random.default_rng(1), 1000, invert_key="mallory"))
  v = g.verdict("mallory")
  assert v["flagged"] and v["r"] < 0 < v["r_rest"], v
  assert g.flagged_keys() == ["mallory"]
  for k in HONEST:
    assert not g.flagged(k), (k, g.verdict(k))


def test_no_key_is_flagged_without_a_majority_to_disagree_with():
  rng = np.random.default_rng(2)
  # Honest keys alone, over many seeds of the stream: the test's 1% per key, not more.
  flagged = sum(len(_guard(_stream(np.random.default_rng(s), 400)).flagged_keys())
                for s in range(40))
  assert flagged <= 6, flagged
  # One key alone is never judged, inverted or not; feedback without a key is not counted.
  alone = _guard([("mallory", v, 1.0 - s) for _, v, s in _stream(rng, 400)] +
                 [(None, 0.5, 1.0)] * 50)
  assert not alone.flagged("mallory") and set(alone.sums) == {"mallory"}
  # A pool where the estimates say nothing of the scores for everyone flags no one.
  flat = _guard(_stream(rng, 1000, invert_key="mallory", informative=False))
  assert flat.flagged_keys() == []


def test_checked_at_every_update_honest_keys_stay_unflagged_and_an_inverter_is_caught():
  """The check is repeated at every update (here every 32 feedbacks) on cumulative sums: over a
  long honest stream no key is flagged at any check under the default threshold; in the same
  stream with an inverting key, it is flagged early and stays flagged."""
  def checks(stream):
    g, out = _guard([]), []
    for i, (k, v, s) in enumerate(stream):
      g.add(k, v, s)
      if i % 32 == 31:
        out.append(g.flagged_keys())
    return out
  assert all(f == [] for f in checks(_stream(np.random.default_rng(6), 8000)))
  poisoned = checks(_stream(np.random.default_rng(6), 8000, invert_key="mallory"))
  first = next(i for i, f in enumerate(poisoned) if f)
  assert first * 32 < 1000 and all(f == ["mallory"] for f in poisoned[first:]), first


def test_a_key_needs_its_minimum_and_the_guard_can_be_turned_off():
  stream = _stream(np.random.default_rng(3), 1000, invert_key="mallory")
  assert _guard(stream).flagged("mallory")
  assert not _guard(stream, min_feedback=10_000).flagged("mallory")
  assert not _guard(stream, z=0).flagged("mallory")


def test_state_round_trip_keeps_the_verdicts():
  g = _guard(_stream(np.random.default_rng(4), 1000, invert_key="mallory"))
  h = consistency.FeedbackConsistency(3.09, 32)
  h.load_state_dict(g.state_dict())
  assert h.flagged_keys() == g.flagged_keys() == ["mallory"]
  a, b = h.verdict("user0"), g.verdict("user0")   # the total re-summed: equal up to rounding
  assert a["flagged"] == b["flagged"] and a["n"] == b["n"]
  assert np.allclose([a["r"], a["r_rest"], a["z"]], [b["r"], b["r_rest"], b["z"]])


def test_the_learner_drops_a_flagged_keys_waiting_episodes():
  g = _guard(_stream(np.random.default_rng(5), 1000, invert_key="mallory"))
  pending = [learner_lib.Pending(f"r{i}", k, 1.0, None) for i, k in
             enumerate(["mallory", "user0", None, "mallory", "user1"])]
  learner = types.SimpleNamespace(pending=pending, consistency=g,
                                  counters=collections.Counter(), _flagged_seen=set())
  learner_lib.OnlineLearner._drop_flagged(learner)
  assert [p.rid for p in learner.pending] == ["r1", "r2", "r4"]
  assert learner.counters["dropped_inconsistent"] == 2
  assert learner._flagged_seen == {"mallory"}
