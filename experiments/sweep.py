"""The alpha sweep: GraphPlanner, single-round routers, single LLMs, random and the DP optimum.

  python -m experiments.sweep --workdir=workdirs/sweep
  python -m experiments.sweep --config=experiments/configs/sweep.py:test --workdir=/tmp/sweep
Rerunning the same command skips finished (alpha, seed) cells. Then: python -m experiments.report.
"""
from absl import flags

from experiments import common
from gp_jax.runs import sweep

_CONFIG = common.define_config("experiments/configs/sweep.py", "Sweep config.", complete=True)
_WORKDIR = flags.DEFINE_string("workdir", "workdirs/sweep", "Sweep directory (cells, labels).")


@common.user_errors_exit_2
def main(argv):
  del argv
  common.check_workdir(_WORKDIR.value, must_exist=False)
  res = sweep.sweep_from_config(_CONFIG.value, _WORKDIR.value)
  print(f"ran {len(res['ran'])} cells, skipped {len(res['skipped'])} finished ones, "
        f"in {res['seconds']:.0f}s; report: python -m experiments.report --workdir={_WORKDIR.value}")


if __name__ == "__main__":
  common.run(main)
