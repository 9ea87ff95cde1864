"""Prints the simulator's decision landscape: optimum vs best single LLM at each alpha.

  python benchmarks/sim_landscape.py [--n=150] [--alphas=0,0.1,0.3,0.5,0.9]
"""
import collections

from absl import app
from absl import flags
import numpy as np

from experiments.configs import default
from gp_jax.runs import system as system_lib
from gp_jax.sim import optimal

_N = flags.DEFINE_integer("n", 150, "Simulated test queries.")
_ALPHAS = flags.DEFINE_list("alphas", ["0", "0.1", "0.3", "0.5", "0.9"], "Cost weights.")


def main(argv):
  del argv
  c = default.get_config()
  c.data.n_train, c.data.n_test = 1, _N.value
  sysm = system_lib.build(c)
  qs = sysm.test_queries
  names = list(sysm.space.llms)
  print("| alpha | optimum reward | best single LLM (executor only) | single / optimum | optimum plans the root | LLMs the optimum calls most |")
  print("|---|---|---|---|---|---|")
  for alpha in map(float, _ALPHAS.value):
    solver = optimal.OptimalSolver(sysm.world, sysm.space, sysm.mdp_cfg, alpha, sysm.describe)
    vals, roots, use = [], collections.Counter(), collections.Counter()
    for q in qs:
      v, plan = solver.plan(q)
      vals.append(v)
      roots[plan.kind] += 1
      stack = [plan]
      while stack:
        p = stack.pop()
        use[p.llm] += 1
        stack += p.children
    singles = {}
    for m in names:
      k = names.index(m)
      r = []
      for q in qs:
        solver._prepare(q)
        node = sysm.world.lookup(q.query)
        p, cost, _, _ = solver._exec_options(node, True)
        r.append(p[k] - alpha * cost[k])
      singles[m] = float(np.mean(r))
    best = max(singles, key=singles.get)
    opt = float(np.mean(vals))
    top = ", ".join(f"{m} {n}" for m, n in use.most_common(3))
    print(f"| {alpha} | {opt:.3f} | {best} {singles[best]:.3f} | {singles[best] / opt:.2f} | "
          f"{roots['plan']} / {len(qs)} | {top} |")


if __name__ == "__main__":
  app.run(main)
