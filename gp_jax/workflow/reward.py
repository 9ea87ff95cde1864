"""Reward of the routing MDP: r_t = -alpha * C(a_t), plus U at the last step (paper-notes section 1).

C is the call's $ cost in units of COST_UNIT_USD. Raw $ per call is ~1e-4, so alpha * $ would vanish
next to U in [0, 1]. One unit is a milli-dollar: about one 1,100-token call to a 0.90 $/M model, or
five such calls to a 0.20 $/M model; the authors' cost column (micro-dollars) divided by 1000, as
their code stores it. With it alpha in {0, 0.1, 0.3, 0.5, 0.9} moves the simulated optimum from the
largest models and deep workflows to small models and direct answers (see docs/simulator.md).
"""
COST_UNIT_USD = 1e-3


def cost_units(cost_usd: float) -> float:
  return cost_usd / COST_UNIT_USD


def step_reward(cost_usd: float, alpha: float) -> float:
  return -alpha * cost_units(cost_usd)
