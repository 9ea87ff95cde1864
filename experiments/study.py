"""Runs one study (Phase 1 vs 2, unseen tasks/LLMs, ablations, new roles) into a workdir.

  python -m experiments.study --study=phases --workdir=workdirs/studies/phases
  python -m experiments.study --study=ablations --config=experiments/configs/study.py:test --workdir=/tmp/abl
  python -m experiments.study --study=ablations --variants=transductive,no_history --workdir=/tmp/a2
  python -m experiments.study --study=drift --config=experiments/configs/study.py:test --workdir=/tmp/drift
Rerunning skips finished (variant, seed) cells and resumes interrupted training. Studies:
phases, unseen, ablations, roles, learner (gp_jax/runs/studies/definitions.py), drift (gp_jax/runs/studies/drift.py:
pool events during evaluation; writes <workdir>/report.md and .png). Then: python -m experiments.report.
"""
from absl import flags

from experiments import common
from gp_jax import config_lists
from gp_jax import errors
from gp_jax.runs.studies import definitions
from gp_jax.runs.studies import drift
from gp_jax.runs.studies import drift_report
from gp_jax.runs.studies import report as studies_report
from gp_jax.runs.studies import runner

_CONFIG = common.define_config("experiments/configs/study.py", "Study config.", complete=True)
_STUDY = flags.DEFINE_string("study", None, "phases | unseen | ablations | roles | learner | drift",
                             required=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Study directory (default workdirs/studies/<study>).")
_VARIANTS = flags.DEFINE_string("variants", "", "Comma-separated variants of the study to run "
                                "(default: all of them; not for drift).")


@common.user_errors_exit_2
def main(argv):
  del argv
  c = _CONFIG.value
  s = c.study
  if _STUDY.value == drift.STUDY:   # pool events: its own cells (per-query rewards) and report
    if _VARIANTS.value:
      raise errors.ConfigError("--variants selects variants of phases, unseen, ablations or "
                               "roles; the drift study's arms are config.study.drift_routers")
    workdir = _WORKDIR.value or f"workdirs/studies/{drift.STUDY}"
    res = drift.DriftRunner(c, workdir).run(config_lists.numbers(s.seeds, "study.seeds", int))
    print(f"ran {len(res['ran'])} cells, skipped {len(res['skipped'])} finished ones, in "
          f"{res['seconds']:.0f}s; report: {drift_report.write_report(workdir)}")
    return
  variants = definitions.variants(_STUDY.value, c, _VARIANTS.value)
  kwargs = dict(knn_k=int(s.knn_k), mlp_hidden=int(s.mlp_hidden), steps=int(s.router_steps))
  workdir = _WORKDIR.value or f"workdirs/studies/{_STUDY.value}"
  common.check_workdir(workdir, must_exist=False)
  res = runner.StudyRunner(c, workdir, _STUDY.value, variants, router_kwargs=kwargs).run(
      config_lists.numbers(s.seeds, "study.seeds", int))
  print(f"ran {len(res['ran'])} cells, skipped {len(res['skipped'])} finished ones, in "
        f"{res['seconds']:.0f}s; report: "
        f"{studies_report.write_study_report(workdir, _STUDY.value)}")


if __name__ == "__main__":
  common.run(main)
