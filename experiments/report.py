"""Markdown reports with figures.

  python -m experiments.report --root=runs --out=docs/report.md     every experiment under workdirs/
  python -m experiments.report --workdir=workdirs/sweep [--out=...]     one alpha sweep only
  python -m experiments.report --compare=v1=workdirs/experiments,v2=workdirs/experiments_v2 \
      --out=x.md     the paper's effects read from the studies of several runs, side by side
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
_COMPARE = flags.DEFINE_string(
    "compare", "", "label=root,label=root: the paper's effects from each root's studies.")
_OUT = flags.DEFINE_string("out", "", "Report path ('' = <root or workdir>/report.md).")


def _compare_roots(spec: str) -> dict[str, str]:
  roots = {}
  for part in spec.split(","):
    label, sep, root = part.partition("=")
    if not sep or not label.strip() or not root.strip():
      raise errors.ConfigError(f"--compare: {part!r} is not label=root")
    if label.strip() in roots:
      raise errors.ConfigError(f"--compare: label {label.strip()!r} given twice")
    roots[label.strip()] = root.strip()
  return roots


@common.user_errors_exit_2
def main(argv):
  del argv
  if sum(map(bool, (_ROOT.value, _WORKDIR.value, _COMPARE.value))) != 1:
    raise errors.ConfigError("give exactly one of --root (every experiment), --workdir (a sweep) "
                             "or --compare (label=root,...)")
  if _COMPARE.value:
    if not _OUT.value:
      raise errors.ConfigError("--compare needs --out")
    path = studies_report.write_comparison(_compare_roots(_COMPARE.value), _OUT.value)
  elif _ROOT.value:
    path = studies_report.write_full_report(_ROOT.value, _OUT.value or f"{_ROOT.value}/report.md")
  else:
    path = report.write_report(_WORKDIR.value, _OUT.value or None)
  print(f"wrote {path}")


if __name__ == "__main__":
  common.run(main)
