"""Trains a GraphPlanner router, then evaluates it against baselines and the exact optimum.

  python -m experiments.train --config=experiments/configs/default.py --workdir=workdirs/default
  python -m experiments.train --config=experiments/configs/default.py:... --config.alpha=0
Rerunning the same command resumes from the latest checkpoint in --workdir.
"""
from absl import flags

from experiments import common
from gp_jax.runs import pipeline

_CONFIG = common.define_config("experiments/configs/default.py", "Run config.", complete=True)
_WORKDIR = flags.DEFINE_string("workdir", "workdirs/default", "Checkpoints, metrics and reports.")
_EVALUATE = flags.DEFINE_bool("evaluate", True, "Evaluate after training.")


@common.user_errors_exit_2
def main(argv):
  del argv
  common.check_workdir(_WORKDIR.value, must_exist=False)
  pipeline.train_and_evaluate(_CONFIG.value, _WORKDIR.value, evaluate=_EVALUATE.value)


if __name__ == "__main__":
  common.run(main)
