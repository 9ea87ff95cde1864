"""Fits the v2 world's bounded parameters to the paper's fit targets (docs/calibration.md).

  python -m experiments.calibrate --workdir=workdirs/calibrate
  python -m experiments.calibrate --config=experiments/configs/calibrate.py:test --workdir=...
Writes <workdir>/world.json (load it with --config.sim.world=v2 --config.sim.world_file=...),
report.md and report.json; resumes from <workdir>/calibrate_state.json. Single LLMs and cheap
baseline stand-ins only, never GraphPlanner (gp_jax/sim/calibration.py).
"""
from absl import flags

from experiments import common
from gp_jax.llm import catalog as catalog_lib
from gp_jax.sim import calibration

_CONFIG = common.define_config("experiments/configs/calibrate.py", "Calibration config.")
_WORKDIR = flags.DEFINE_string("workdir", "workdirs/calibrate", "Where the state, world and report go.")


@common.user_errors_exit_2
def main(argv):
  del argv
  workdir = common.check_workdir(_WORKDIR.value, must_exist=False)
  catalog = catalog_lib.load_catalog()
  settings = calibration.settings_from_config(_CONFIG.value, catalog)
  report = calibration.calibrate(settings, workdir, catalog)
  print(f"fit RMSE {report['rmse_points']:.2f} points (priors {report['prior_rmse_points']:.2f}); "
        f"world file {workdir / calibration.WORLD_FILE}; report {workdir / calibration.REPORT_MD}")


if __name__ == "__main__":
  common.run(main)
