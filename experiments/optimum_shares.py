"""Which LLMs the exact DP optimum calls: its share of calls per LLM on the test queries.

  python -m experiments.optimum_shares                                   # the study config's pool
  python -m experiments.optimum_shares --config.llms=all --config.data.n_test=100   # all 12 LLMs
An event or a held-out LLM can only test the router if the optimum relies on that LLM
(docs/memory.md, "Which LLM matters"). Simulated pools only.
"""
from absl import flags

from experiments import common
from gp_jax import errors
from gp_jax.runs import system as system_lib
from gp_jax.runs.studies import runner
from gp_jax.util import config_overrides

_CONFIG = common.define_config("experiments/configs/study.py", "Study config.", complete=True)
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the test queries and the sampled outcomes.")


@common.user_errors_exit_2
def main(argv):
  del argv
  c = config_overrides.apply(_CONFIG.value, {"seed": _SEED.value})
  system = system_lib.build(c)
  if not system.simulated:
    raise errors.ConfigError("the DP optimum needs the simulated pool (backend=sim)")
  states = runner.optimum_states(system, float(c.alpha), _SEED.value)
  shares = runner.action_shares(system, states)["llm"]
  print(f"optimum's share of calls, alpha={float(c.alpha):g}, {len(states)} test queries, "
        f"seed {_SEED.value}:")
  for llm in sorted(system.space.llms, key=lambda m: -shares.get(m, 0.0)):
    print(f"  {shares.get(llm, 0.0):.3f}  {llm}")


if __name__ == "__main__":
  common.run(main)
