"""Drift study: windowed reward-since-event curves, the 95% interval, recovery, settings and the
report on small hand-made cells (the study itself runs at CI size in the experiments stage)."""
import json
import math

import numpy as np
import pytest
from scipy import stats

from experiments.configs import study as study_config
from gp_jax import errors
from gp_jax.runs.studies import drift


def test_window_means_align_at_the_event():
  r = np.arange(10, dtype=float)          # reward of query i is i
  offsets, means = drift.window_means(r, t=5, window=2)
  # windows [1,3) [3,5) before the event, [5,7) [7,9) after; [9,10) is incomplete: dropped.
  assert offsets.tolist() == [-4, -2, 0, 2]
  assert means.tolist() == [1.5, 3.5, 5.5, 7.5]
  offsets, means = drift.window_means(r, t=0, window=3)
  assert offsets.tolist() == [0, 3, 6] and means.tolist() == [1.0, 4.0, 7.0]
  with pytest.raises(ValueError):
    drift.window_means(r, t=11, window=2)
  with pytest.raises(ValueError):
    drift.window_means(r, t=2, window=0)


def test_window_curve_interval_over_seeds():
  a = np.array([0., 0., 1., 1.])
  b = np.array([0., 2., 1., 3.])
  c = drift.window_curve([a, b], t=2, window=1)
  assert c["offsets"] == [-2, -1, 0, 1] and c["seeds"] == 2
  assert c["mean"] == [0.0, 1.0, 1.0, 2.0]
  half = stats.t.ppf(0.975, 1) * np.std([0., 2.], ddof=1) / math.sqrt(2)
  assert c["half"][0] == 0.0 and c["half"][1] == pytest.approx(half)
  one = drift.window_curve([a], t=2, window=2)
  assert one["mean"] == [0.0, 1.0] and all(math.isnan(h) for h in one["half"])


def test_ci95_against_a_plain_formula():
  v = [0.2, 0.5, 0.3, 0.6]
  m, h, n = drift.ci95(v)
  assert (m, n) == (pytest.approx(0.4), 4)
  assert h == pytest.approx(3.182446305 * np.std(v, ddof=1) / 2, rel=1e-6)
  assert math.isnan(drift.ci95([0.1])[1]) and drift.ci95([])[2] == 0


def test_recovery():
  ref = np.array([9., 9., 1., 1., 1., 1.])   # retrained: mean 1.0 after the event at t=2
  router = np.array([5., 5., 0., 0., .5, .9])
  assert drift.recovery(router, ref, t=2, after=2, window=2) == pytest.approx(0.7)
  assert drift.recovery(router, ref, t=2, after=0, window=1) == 0.0
  assert math.isnan(drift.recovery(router, -ref, t=2, after=0, window=1))   # no positive reference
  with pytest.raises(ValueError, match="does not fit"):
    drift.recovery(router, ref, t=2, after=3, window=2)


def _cell(kind, seed, shift):
  n, t = 8, 4
  base = np.full(n, 0.5)
  rewards = dict(online=base - shift * (np.arange(n) >= t), frozen=base - 0.2 * (np.arange(n) >= t),
                 no_history=base - 0.3 * (np.arange(n) >= t), retrained=np.full(n, 0.4),
                 optimum=np.full(n, 0.8), **{"single:a": np.full(n, 0.1), "single:b": np.full(n, 0.3)})
  return dict(study="drift", variant=kind, seed=seed, alpha=0.5, t=t, window=2, recovery_after=2,
              n_test=n, eval_overrides={"data.sim_events.fail.llm": "a"},
              rewards={k: v.tolist() for k, v in rewards.items()})


def test_summary_and_report(tmp_path):
  cells = [_cell("fail", 0, 0.1), _cell("fail", 1, 0.3)]
  s = drift.summarize(cells)["fail"]
  assert s["best_single"] == "single:b" and set(s["arms"]) == set(drift.ARMS) | {"single:b"}
  online = s["arms"]["online"]
  assert online["pre"][0] == pytest.approx(0.5) and online["post"][0] == pytest.approx(0.3)
  assert online["recovery"][0] == pytest.approx(np.mean([0.4 / 0.4, 0.2 / 0.4]))
  assert online["curve"]["offsets"] == [-4, -2, 0, 2]
  for c in cells:
    d = tmp_path / f"fail_seed{c['seed']}"
    d.mkdir()
    (d / "cell.json").write_text(json.dumps(c))
  out = drift.write_report(tmp_path)
  text = out.read_text()
  assert "| online | 0.500 ± 0.000 | 0.300 ± " in text and (tmp_path / "report.png").stat().st_size
  (tmp_path / "bad").mkdir()
  (tmp_path / "bad" / "cell.json").write_text(json.dumps({"variant": "x"}))
  with pytest.raises(errors.DataError, match="not a drift study cell"):
    drift.load_cells(tmp_path)


def test_settings_validate():
  c = study_config.get_config("test")
  s = drift.settings(c)
  assert s.events == drift.EVENTS and s.t == 8
  ev, re = drift.event_overrides("join", s, c)
  assert ev["llms"].endswith("," + s.join_llm) and re["data.sim_events.join.t"] == 0
  assert ev["data.sim_events.splits"] == "test" and re["data.sim_events.splits"] == "train"
  for field, value, match in [("drift_t", 0, "inside the test stream"),
                              ("drift_recovery_after", 20, "must fit"),
                              ("drift_events", "quake", "drift event"),
                              ("drift_join_llm", "qwen2.5-7b-instruct", "in the training pool")]:
    c = study_config.get_config("test")
    c.study[field] = value
    with pytest.raises(errors.ConfigError, match=match):
      drift.settings(c)
