"""Markdown reports with figures.

  python -m experiments.report --root=runs --out=docs/report.md     every experiment under workdirs/
  python -m experiments.report --workdir=workdirs/sweep [--out=...]     one alpha sweep only
--root reads workdirs/sweep (alpha sweep), workdirs/studies/<study> (phases, unseen, ablations, roles) and
workdirs/counselor_routed (routed Graph Counselor); PNG figures are written next to --out.
"""
from absl import flags

from experiments import common
from gp_jax import errors
from gp_jax.runs import sweep_report as report
from gp_jax.runs.studies import report as studies_report

_ROOT = flags.DEFINE_string("root", "", "Runs directory holding sweep/, studies/, counselor_routed/.")
_WORKDIR = flags.DEFINE_string("workdir", "", "One sweep directory written by experiments.sweep.")
_OUT = flags.DEFINE_string("out", "", "Report path ('' = <root or workdir>/report.md).")


@common.user_errors_exit_2
def main(argv):
  del argv
  if bool(_ROOT.value) == bool(_WORKDIR.value):
    raise errors.ConfigError("give exactly one of --root (every experiment) or --workdir (a sweep)")
  if _ROOT.value:
    path = studies_report.write_full_report(_ROOT.value, _OUT.value or f"{_ROOT.value}/report.md")
  else:
    path = report.write_report(_WORKDIR.value, _OUT.value or None)
  print(f"wrote {path}")


if __name__ == "__main__":
  common.run(main)
