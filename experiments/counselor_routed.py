"""Routed Graph Counselor: GraphPlanner's router picks the backbone of every agent step, compared
with one fixed LLM for all agents, on the simulated counselor backend (no real LLM, CPU only).

  # default size (academic 'small' graph, 150 train / 70 test questions, 3 seeds)
  python -m experiments.counselor_routed --workdir=runs/counselor_routed

  # CI size (about a minute on 2 CPU cores)
  python -m experiments.counselor_routed --workdir=/tmp/cr_ci --size=tiny --per_template=4 \
      --n_train=24 --n_test=16 --episodes=192 --batch_questions=16 --seeds=0 \
      --llms=qwen2.5-7b-instruct,llama-3.1-8b-instruct,llama-3.3-nemotron-super-49b-v1

Writes <workdir>/seeds/seed_<s>.json per seed (a rerun skips finished seeds), results.json and
results.md. See docs/counselor_routing.md.
"""
from absl import app
from absl import flags

from experiments import common

_WORKDIR = flags.DEFINE_string("workdir", "", "Output folder (required).")
_SEEDS = flags.DEFINE_string("seeds", "0,1,2", "Comma-separated seeds.")
_DOMAIN = flags.DEFINE_string("domain", "academic", "Generated graph: academic | ecommerce | biomedical.")
_SIZE = flags.DEFINE_string("size", "small", "Generated graph size: tiny | small | 10k | a node count.")
_GRAPH_SEED = flags.DEFINE_integer("graph_seed", 0, "Generator seed of the graph and questions.")
_PER_TEMPLATE = flags.DEFINE_integer("per_template", 20, "Generated questions per template.")
_GRAPH = flags.DEFINE_string("graph", "", "A GRBench graph.json instead of a generated graph.")
_QUESTIONS = flags.DEFINE_string("questions", "", "Its questions JSONL (with gold plans).")
_N_TRAIN = flags.DEFINE_integer("n_train", 150, "Training questions per seed.")
_N_TEST = flags.DEFINE_integer("n_test", 70, "Held-out test questions per seed.")
_LLMS = flags.DEFINE_string("llms", "", "Comma-separated catalog LLMs (default: the training LLMs).")
_CATALOG = flags.DEFINE_string("catalog", "", "LLM catalog JSON (default data/llm_pool.json).")
_ALPHA = flags.DEFINE_float("alpha", 0.05, "Cost weight: reward = EM - alpha * milli-dollars.")
_EPISODES = flags.DEFINE_integer("episodes", 3200, "Training episodes (questions answered).")
_BATCH = flags.DEFINE_integer("batch_questions", 32, "Episodes per PPO update.")
_LR = flags.DEFINE_float("learning_rate", 1e-3, "Adam learning rate of the router.")
_ENTROPY = flags.DEFINE_float("entropy_coef", 0.02, "PPO entropy bonus.")
_LAMBDA = flags.DEFINE_float("gae_lambda", 0.8, "GAE lambda.")
_MAX_STEPS = flags.DEFINE_integer("max_steps", 10, "Counselor steps per trial.")
_MAX_REFLECT = flags.DEFINE_integer("max_reflect", 2, "Reflections (trials = max_reflect + 1).")
_SKILL_DOMAIN = flags.DEFINE_string("skill_domain", "knowledge_reasoning",
                                    "Simulator domain whose skill sets the success probability.")
_SKILL_SCALE = flags.DEFINE_float("skill_scale", 2.0, "Weight of the skill in the success logit.")
_CONCURRENCY = flags.DEFINE_integer("concurrency", 8, "Questions in flight at once.")


@common.user_errors_exit_2
def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  common.check_workdir(_WORKDIR.value, must_exist=False)
  from gp_jax.runs import counselor_routed as rx  # after flag parsing: keeps --help fast
  cfg = rx.ExperimentConfig(
      domain=_DOMAIN.value, size=_SIZE.value, graph_seed=_GRAPH_SEED.value,
      per_template=_PER_TEMPLATE.value, graph=_GRAPH.value, questions=_QUESTIONS.value,
      n_train=_N_TRAIN.value, n_test=_N_TEST.value,
      llms=tuple(s.strip() for s in _LLMS.value.split(",") if s.strip()), catalog=_CATALOG.value,
      alpha=_ALPHA.value, episodes=_EPISODES.value, batch_questions=_BATCH.value,
      learning_rate=_LR.value, entropy_coef=_ENTROPY.value, gae_lambda=_LAMBDA.value,
      max_steps=_MAX_STEPS.value, max_reflect=_MAX_REFLECT.value,
      skill_domain=_SKILL_DOMAIN.value, skill_scale=_SKILL_SCALE.value)
  rx.run(cfg, rx.parse_seeds(_SEEDS.value), _WORKDIR.value, concurrency=_CONCURRENCY.value)
  return 0


if __name__ == "__main__":
  common.run(main)
