"""Evaluates a trained router (best checkpoint of --workdir) against baselines and the optimum.

  python -m experiments.evaluate --config=experiments/configs/default.py --workdir=workdirs/default
  --config.model.history=inductive evaluates with an empty history graph.
"""
from absl import flags

from experiments import common
from gp_jax.runs import pipeline

_CONFIG = common.define_config("experiments/configs/default.py", "Run config.", complete=True)
_WORKDIR = flags.DEFINE_string("workdir", "workdirs/default", "Workdir of a training run.")
_TAG = flags.DEFINE_string("tag", "eval", "Name of the report files written in the workdir.")


@common.user_errors_exit_2
def main(argv):
  del argv
  common.check_trained_workdir(_WORKDIR.value)
  pipeline.evaluate_run(_CONFIG.value, _WORKDIR.value, tag=_TAG.value)


if __name__ == "__main__":
  common.run(main)
