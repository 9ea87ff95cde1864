"""Feasibility of a look's targets: the DP optimum and single-round routers per seed, no training.

  python -m experiments.feasibility --config=experiments/configs/study.py --seeds=0,1,2,3,4 \
    --alpha=0.5 --routers=mlp --out=/tmp/feasibility.json [--config.* overrides]
For each seed the system is built as the studies build it; on its test queries the exact DP
optimum (reward, E[acc], calls per query, split rate) and the named single-round routers (fitted on
the training queries with config.study's settings) are evaluated. Writes the per-seed rows, the
means with 95% t half-widths and the paired (by seed) optimum - router intervals to --out, and a
table to stdout (gp_jax/runs/feasibility.py). Simulated pools only.
"""
import sys

from absl import flags

from experiments import common
from gp_jax import errors
from gp_jax.runs import feasibility

_CONFIG = common.define_config("experiments/configs/study.py", "Study config.", complete=True)
_SEEDS = flags.DEFINE_string("seeds", None, "Comma list of seeds (default: config.study.seeds).")
_ALPHA = flags.DEFINE_float("alpha", None, "Cost weight of the reward (default: config.alpha).")
_ROUTERS = flags.DEFINE_string("routers", "mlp", "Comma list of single-round routers to compare "
                               "with the optimum (gp_jax/baselines/single_round.py; '' = none).")
_OUT = flags.DEFINE_string("out", None, "JSON file of the record (written atomically).",
                           required=True)


@common.user_errors_exit_2
def main(argv):
  if len(argv) > 1:
    raise errors.ConfigError(f"unexpected arguments: {' '.join(argv[1:])}")
  c = _CONFIG.value
  if _SEEDS.value is not None:
    seeds = feasibility.parse_seeds(_SEEDS.value)
  elif "study" in c:
    seeds = feasibility.parse_seeds(c.study.seeds)
  else:
    raise errors.ConfigError("--seeds is required with a config that has no study.seeds")
  alpha = float(c.alpha if _ALPHA.value is None else _ALPHA.value)
  routers = feasibility.parse_routers(_ROUTERS.value)
  out = common.check_output_file(_OUT.value, "out")
  record = feasibility.run(c, seeds, alpha, routers, verbose=True)
  record["argv"] = list(sys.argv[1:])
  feasibility.write(record, out)
  print(feasibility.format_table(record))
  print(f"record: {out}")


if __name__ == "__main__":
  common.run(main)
