"""sim.world = v1 stays what it was: the CI-size config's simulated queries, success
probabilities, sub-questions, token counts, sampled outputs and exact optimum, hashed and compared
with the digest recorded from the code before the v2 world existed (main at 32a4c62).

Every float is hashed at 10 significant digits: numpy's exp and log take different SIMD paths on
different CPUs and may differ in the last bit, which is not a change of the world. Everything else (texts, keys, integers, the sampled outputs) is hashed exactly."""
import hashlib
import numbers

from experiments.configs import test as test_config
from gp_jax.runs import system as system_lib
from gp_jax.sim import optimal
from gp_jax.sim import simulator as sim
from gp_jax.workflow import policies

# sha256 of `fingerprint(test_config.get_config())`, recorded with the code of main at 32a4c62
# (before v2) on an AVX2 machine, the same there with numpy's AVX2 paths off
# (NPY_DISABLE_CPU_FEATURES=X86_V3). The exact digest recorded before (0e54e9f4...) did not hold
# on that machine, where the code of 32a4c62 itself gave 7b63dacc...: floats' last bits.
V1_DIGEST = "191fe37a18785de5cdac2be1de0216e5300329b51660a94c8d442fa8a9049e3d"


def canon(x):
  """`x` with every float (Python or numpy) as a string of 10 significant digits, containers
  kept (dicts in key order); other values as they are."""
  if x is None or isinstance(x, (numbers.Integral, str)):   # bools are Integral
    return x
  if isinstance(x, numbers.Real):
    return format(float(x), ".10g")
  if isinstance(x, dict):
    return {k: canon(x[k]) for k in sorted(x, key=repr)}
  if isinstance(x, (list, tuple)):
    return type(x)(canon(v) for v in x)
  return x


def _put(h, x) -> None:
  h.update(repr(canon(x)).encode())


def fingerprint(config) -> str:
  system = system_lib.build(config)
  world = system.world
  h = hashlib.sha256()
  llms = list(system.space.llms)
  queries = system.train_queries[:24] + system.test_queries[:12]
  for q in queries:
    node = world.lookup(q.query)
    _put(h, (q.qid, q.task_name, q.query, q.ground_truth, q.meta))
    _put(h, [world.exec_probability(node, m) for m in llms])
    _put(h, [world.output_tokens("executor", node, m) for m in llms])
    for planner in llms[:2]:
      kids = world.children(node, planner, 3, False)
      _put(h, [(k.key, k.text, k.hardness, k.complexity, k.gold) for k in kids])
      _put(h, [world.exec_probability(k, m) for k in kids for m in llms])
  env = system.env(0.5)
  planner = system.space.encode("planner", llms[0])
  single = policies.single_llm_policy(system.space, llms[1])

  def plan_then_execute(query, state, mask, rng):
    return planner if state.steps == 0 and mask[planner] else single(query, state, mask, rng)

  states = policies.run_policy(env, plan_then_execute, queries[:8], seed=0)
  for s in states:
    _put(h, [(c.kind, c.llm, c.output_text, c.input_tokens, c.output_tokens, c.cost_usd)
                   for c in s.calls])
    _put(h, sim.expected_utility(world, s))
  solver = optimal.OptimalSolver(world, system.space, system.mdp_cfg, 0.5, system.describe)
  _put(h, [solver.value(q) for q in queries[:8]])
  # Every LLM of the catalog on every simulated task (seen and held out), and an adopted text.
  full = sim.SimWorld(sim.load_profiles(system_lib.full_catalog(config)))
  names = sorted(full.profiles)
  for q in full.sample_queries(30, seed=3, split="pin", tasks=list(sim.TASKS)):
    node = full.lookup(q.query)
    _put(h, (q.query, q.meta, [full.exec_probability(node, m) for m in names]))
  node = full.adopt_query("How many apples are left?", "gsm8k")
  _put(h, (node.key, node.hardness, node.complexity, node.gold))
  return h.hexdigest()


def test_v1_outputs_are_unchanged():
  assert fingerprint(test_config.get_config()) == V1_DIGEST
