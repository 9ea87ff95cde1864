"""sim.world = v1 stays what it was, bit for bit: the CI-size config's simulated queries, success
probabilities, sub-questions, token counts, sampled outputs and exact optimum, hashed and compared
with the digest recorded from the code before the v2 world existed (main at 32a4c62)."""
import hashlib

from experiments.configs import test as test_config
from gp_jax.runs import system as system_lib
from gp_jax.sim import optimal
from gp_jax.sim import simulator as sim
from gp_jax.workflow import policies

# sha256 of `fingerprint(test_config.get_config())`, recorded on main at 32a4c62 (before v2).
V1_DIGEST = "0e54e9f40763f5833900568769d452f95321300d1ba3263668484535f02c7ce7"


def fingerprint(config) -> str:
  system = system_lib.build(config)
  world = system.world
  h = hashlib.sha256()
  llms = list(system.space.llms)
  queries = system.train_queries[:24] + system.test_queries[:12]
  for q in queries:
    node = world.lookup(q.query)
    h.update(repr((q.qid, q.task_name, q.query, q.ground_truth, q.meta)).encode())
    h.update(repr([world.exec_probability(node, m) for m in llms]).encode())
    h.update(repr([world.output_tokens("executor", node, m) for m in llms]).encode())
    for planner in llms[:2]:
      kids = world.children(node, planner, 3, False)
      h.update(repr([(k.key, k.text, k.hardness, k.complexity, k.gold) for k in kids]).encode())
      h.update(repr([world.exec_probability(k, m) for k in kids for m in llms]).encode())
  env = system.env(0.5)
  planner = system.space.encode("planner", llms[0])
  single = policies.single_llm_policy(system.space, llms[1])

  def plan_then_execute(query, state, mask, rng):
    return planner if state.steps == 0 and mask[planner] else single(query, state, mask, rng)

  states = policies.run_policy(env, plan_then_execute, queries[:8], seed=0)
  for s in states:
    h.update(repr([(c.kind, c.llm, c.output_text, c.input_tokens, c.output_tokens, c.cost_usd)
                   for c in s.calls]).encode())
    h.update(repr(sim.expected_utility(world, s)).encode())
  solver = optimal.OptimalSolver(world, system.space, system.mdp_cfg, 0.5, system.describe)
  h.update(repr([round(solver.value(q), 12) for q in queries[:8]]).encode())
  # Every LLM of the catalog on every simulated task (seen and held out), and an adopted text.
  full = sim.SimWorld(sim.load_profiles(system_lib.full_catalog(config)))
  names = sorted(full.profiles)
  for q in full.sample_queries(30, seed=3, split="pin", tasks=list(sim.TASKS)):
    node = full.lookup(q.query)
    h.update(repr((q.query, q.meta, [full.exec_probability(node, m) for m in names])).encode())
  node = full.adopt_query("How many apples are left?", "gsm8k")
  h.update(repr((node.key, node.hardness, node.complexity, node.gold)).encode())
  return h.hexdigest()


def test_v1_outputs_are_unchanged():
  assert fingerprint(test_config.get_config()) == V1_DIGEST
