r"""Routed Graph Counselor: GraphPlanner's router picks the backbone of every agent step, compared
with one fixed LLM for all agents, on the simulated counselor backend (no real LLM, CPU only).

  # default size (academic 'small' graph, 150 train / 70 test questions, 3 seeds)
  python -m experiments.counselor_routed --workdir=workdirs/counselor_routed

  # CI size (about a minute on 2 CPU cores)
  python -m experiments.counselor_routed --config=experiments/configs/counselor_routed.py:test \
      --workdir=/tmp/cr_ci

Settings: experiments/configs/counselor_routed.py (override one with --config.<field>=...).
Writes <workdir>/seeds/seed_<s>.json per seed (a rerun skips finished seeds), results.json and
results.md. See docs/counselor_routing.md.
"""
from absl import app
from absl import flags

from experiments import common

_CONFIG = common.define_config("experiments/configs/counselor_routed.py",
                               "Routed Graph Counselor config.")
_WORKDIR = flags.DEFINE_string("workdir", "", "Output folder (required).")


@common.user_errors_exit_2
def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  common.check_workdir(_WORKDIR.value, must_exist=False)
  from gp_jax.runs import counselor_routed  # after flag parsing: keeps --help fast
  counselor_routed.run_from_config(_CONFIG.value, _WORKDIR.value)
  return 0


if __name__ == "__main__":
  common.run(main)
