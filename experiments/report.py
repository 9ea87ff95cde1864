"""Markdown report and accuracy-vs-cost plot of an alpha-sweep workdir.

  python -m experiments.report --workdir=runs/sweep [--out=docs/sweep_report.md]
"""
from absl import app
from absl import flags

from experiments import common
from gp_jax.baselines import report

_WORKDIR = flags.DEFINE_string("workdir", "runs/sweep", "Sweep directory written by experiments.sweep.")
_OUT = flags.DEFINE_string("out", "", "Report path ('' = <workdir>/report.md); the PNG goes next to it.")


@common.user_errors_exit_2
def main(argv):
  del argv
  path = report.write_report(_WORKDIR.value, _OUT.value or None)
  print(f"wrote {path}")


if __name__ == "__main__":
  app.run(main)
