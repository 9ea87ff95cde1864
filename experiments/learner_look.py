"""The learner look's numbers and targets from `learner` study workdirs (no training).

  python -m experiments.learner_look --workdir=workdirs/look/learner_v2 \
    [--v1_workdir=workdirs/look/learner_v1] [--json=/tmp/look.json]
Prints, per arm over its seeds, calls per query, split rate, recall and precision against the DP
optimum, reward, reward / optimum, the paired difference from router:mlp with its 95% t-interval,
training time and training return; then targets T1-T6 of
docs/lab/2026-12-07-v2-decomposition-look.md per arm, and which options the combined arm takes
(by training return only). gp_jax/runs/studies/learner_look.py.
"""
import json

from absl import flags

from experiments import common
from gp_jax import files
from gp_jax.runs.studies import learner_look

_WORKDIR = flags.DEFINE_string("workdir", None, "The learner study's workdir on the look's world.",
                               required=True)
_V1 = flags.DEFINE_string("v1_workdir", None, "A learner study workdir on v1 (target T5).")
_JSON = flags.DEFINE_string("json", None, "Also write the numbers as JSON to this file.")


@common.user_errors_exit_2
def main(argv):
  del argv
  common.check_workdir(_WORKDIR.value, must_exist=True)
  if _V1.value:
    common.check_workdir(_V1.value, must_exist=True)
  v = learner_look.verdict(_WORKDIR.value, _V1.value)
  if _JSON.value:
    files.write_json(_JSON.value, json.loads(json.dumps(v, default=float)), "the look's numbers",
                     indent=1)
  print(learner_look.format_report(v))


if __name__ == "__main__":
  common.run(main)
