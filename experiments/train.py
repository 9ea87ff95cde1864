"""Trains a GraphPlanner router, then evaluates it against baselines and the exact optimum.

  python -m experiments.train --config=experiments/configs/default.py --workdir=runs/default
  python -m experiments.train --config=experiments/configs/default.py:... --config.alpha=0
Rerunning the same command resumes from the latest checkpoint in --workdir.
"""
from absl import app
from absl import flags
from ml_collections import config_flags

from experiments import common
from gp_jax.rl import pipeline

_CONFIG = config_flags.DEFINE_config_file("config", "experiments/configs/default.py", "Run config.")
_WORKDIR = flags.DEFINE_string("workdir", "runs/default", "Checkpoints, metrics and reports.")
_EVALUATE = flags.DEFINE_bool("evaluate", True, "Evaluate after training.")


@common.user_errors_exit_2
def main(argv):
  del argv
  pipeline.train_and_evaluate(_CONFIG.value, _WORKDIR.value, evaluate=_EVALUATE.value)


if __name__ == "__main__":
  app.run(main)
