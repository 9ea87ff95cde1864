"""experiments.calibrate's library: the objective's pieces, the search, resume and the outputs."""
import json

import pytest

from experiments.configs import calibrate as calibrate_config
from gp_jax import errors
from gp_jax.llm import catalog as catalog_lib
from gp_jax.sim import calibration
from gp_jax.sim import world as world_lib


def _settings(**changes):
  c = calibrate_config.get_config("test")
  c.update(changes)
  return calibration.settings_from_config(c, catalog_lib.load_catalog())


def test_ci_run_fits_writes_a_loadable_world_and_a_report(tmp_path):
  report = calibration.calibrate(_settings(), tmp_path, catalog_lib.load_catalog())
  assert report["loss"] <= report["prior_loss"]
  assert report["rmse_points"] == pytest.approx(calibration.rmse(report["targets"]))
  params = world_lib.load_world_file(tmp_path / calibration.WORLD_FILE)
  fitted = {p["name"]: p["fitted"] for p in report["parameters"]}
  assert params.gamma == pytest.approx(fitted["gamma"])
  assert params.cluster_offset_sd == 0.8 and params.step_cue_sd == 0.7   # mechanisms kept
  ids = {r["id"] for r in report["targets"]}
  targets = {t["id"] for t in calibration.load_fit_targets()}
  assert ids == targets                                  # every fit target is reported
  md = (tmp_path / calibration.REPORT_MD).read_text()
  assert "p2.r2_reasoner.acc" in md and "move / prior sd" in md
  assert all(r["weight"] == 0 for r in report["targets"] if r["id"].startswith(("aime.", "unseen")))


def test_resume_after_an_interruption_gives_the_uninterrupted_result(tmp_path, monkeypatch):
  catalog = catalog_lib.load_catalog()
  straight = calibration.calibrate(_settings(), tmp_path / "a", catalog)
  real, calls = calibration.measure, {"n": 0}

  def flaky(*args):
    calls["n"] += 1
    if calls["n"] == 4:
      raise KeyboardInterrupt
    return real(*args)

  monkeypatch.setattr(calibration, "measure", flaky)
  with pytest.raises(KeyboardInterrupt):
    calibration.calibrate(_settings(), tmp_path / "b", catalog)
  state = json.loads((tmp_path / "b" / calibration.STATE_FILE).read_text())
  assert not state["done"] and state["index"] > 0
  assert not (tmp_path / "b" / calibration.WORLD_FILE).exists()
  monkeypatch.setattr(calibration, "measure", real)
  resumed = calibration.calibrate(_settings(), tmp_path / "b", catalog)
  assert resumed["parameters"] == straight["parameters"]
  assert resumed["evaluations"] == straight["evaluations"]
  with pytest.raises(errors.ConfigError, match="other settings"):
    calibration.calibrate(_settings(n_test=61), tmp_path / "b", catalog)


def test_objective_pieces():
  specs = [calibration.Param("gamma", 1.2, 0.3, 2.5, 0.4, "")]
  rows = [{"id": "a.acc", "weight": 1.0, "residual": 3.0}, {"id": "b.acc", "weight": 0.5, "residual": -6.0},
          {"id": "c.calls", "weight": 1.0, "residual": 0.2}, {"id": "d.acc", "weight": 0.0, "residual": 50.0}]
  assert calibration.rmse(rows) == pytest.approx(((9 + 0.5 * 36) / 1.5) ** 0.5)
  assert calibration.loss(rows, {"gamma": 1.6}, specs) == pytest.approx((9 + 18) / 1.5 + 4.0 + 1.0)


def test_bad_settings_are_config_errors():
  with pytest.raises(errors.ConfigError, match="unknown parameters"):
    calibration.calibrate(_settings(fit="gamma,nope"), "/tmp/unused-calibration", catalog_lib.load_catalog())
  with pytest.raises(errors.ConfigError):
    _settings(n_test=0)
  with pytest.raises(errors.ConfigError):
    _settings(llms="qwen2.5-7b-instruct")
  with pytest.raises(errors.ConfigError, match="unknown world parameters"):
    c = calibrate_config.get_config("test")
    c.world.nope = 1.0
    calibration.settings_from_config(c, catalog_lib.load_catalog())
