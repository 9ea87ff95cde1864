"""Memory diagnostic on a trained router (gp_jax/runs/studies/memory_diagnostic.py):

  python -m experiments.memory_diagnostic --config=experiments/configs/test.py \
      --workdir=workdirs/test --llm=qwen2.5-7b-instruct
Injects undiluted evidence against one LLM into the frozen router's history and reports how far
its share of calls and its logits move, and the logits' gradient norm per hub's history input.
"""
from absl import flags

from experiments import common
from gp_jax import files
from gp_jax.runs import system as system_lib
from gp_jax.runs import train as training
from gp_jax.runs.studies import memory_diagnostic
from gp_jax.runs.studies import runner

_CONFIG = common.define_config("experiments/configs/default.py", "Run config.")
_WORKDIR = flags.DEFINE_string("workdir", "workdirs/default", "Workdir of a training run.")
_LLM = flags.DEFINE_string("llm", "qwen2.5-7b-instruct", "The LLM whose rows are overwritten.")
_OUT = flags.DEFINE_string("out", "", "JSON file for the result (none: print only).")


@common.user_errors_exit_2
def main(argv):
  del argv
  common.check_trained_workdir(_WORKDIR.value)
  c = _CONFIG.value
  system = system_lib.build(c)
  model, params, history = training.load_router(c, _WORKDIR.value, system)
  env = system.env(float(c.alpha), reward=c.train.reward)
  d = memory_diagnostic.diagnose(system, env, model, params, runner.history_for(c, history),
                                 _LLM.value, system.test_queries, parallel=int(c.train.parallel),
                                 seed=int(c.seed))
  print("\n".join(memory_diagnostic.report_lines(d)))
  if _OUT.value:
    files.write_json(_OUT.value, d, "memory diagnostic")


if __name__ == "__main__":
  common.run(main)
