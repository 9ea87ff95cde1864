"""Pool events of the simulator: outcomes change exactly from query t on, the optimum follows."""
import asyncio

import numpy as np
import pytest

from experiments.configs import test as test_config
from gp_jax import errors
from gp_jax.runs import system as system_lib
from gp_jax.sim import events as sim_events
from gp_jax.sim import optimal
from gp_jax.sim import simulator as sim
from gp_jax.workflow import env as env_lib
from gp_jax.workflow import mdp
from gp_jax.workflow import policies
from gp_jax.workflow import roles as roles_lib
from test_optimal import brute_force

SPLIT, T, N = "ev", 2, 4
X, Y = "qwen2.5-7b-instruct", "llama3-chatqa-1.5-70b"    # the tiny world's LLMs; events act on X
EVENTS = {
    "quality": sim_events.PoolEvent("quality", X, T, delta=-3.0),
    "price": sim_events.PoolEvent("price", X, T, scale=3.0),
    "join": sim_events.PoolEvent("join", X, T),
    "fail": sim_events.PoolEvent("fail", X, T),
}


def _system(tiny_world, events, cfg, alpha=0.5, roles=("planner", "executor", "summarizer")):
  """(world, env, solver) on the tiny world's LLMs, with `events` (None: the plain pool)."""
  world = sim.SimWorld(tiny_world["world"].profiles,
                       events=sim_events.PoolEvents(events, (SPLIT,)) if events else None)
  roles_set = roles_lib.load_roles().select(list(roles))
  space = mdp.ActionSpace(roles_set, tuple(tiny_world["names"]))
  pool = sim.SimulatorPool(tiny_world["catalog"], roles_set, world)
  llm_mask = None
  if world.events is not None and world.events.has_joins():
    llm_mask = lambda s: world.events.present_mask(space.llms, world.lookup(s.nodes[0].text).key)
  env = env_lib.WorkflowEnv(space, cfg, pool, alpha=alpha, describe=system_lib.sim_describe,
                            scorer=sim.sim_score, llm_mask=llm_mask)
  return world, env, optimal.OptimalSolver(world, space, cfg, alpha, system_lib.sim_describe)


def _script(space, first, second=Y):
  """A fixed set of calls: `first` plans the root, `second` executes the sub-questions, `first`
  summarises and gives the final answer (falling back to Y / executing where masked)."""
  def act(state, mask):
    node = state.node
    if state.at_final_answer:
      wanted = [("executor", first), ("executor", Y)]
    elif node.status == mdp.PENDING:
      wanted = [("planner", first)] if node.id == 0 and not node.plan_failed else []
      wanted += [("executor", second if node.id else first), ("executor", Y)]
    else:
      wanted = [("summarizer", first), ("summarizer", Y)]
    for role, llm in wanted:
      a = space.encode(role, llm)
      if mask[a]:
        return a
    raise AssertionError("no scripted action is valid")
  return act


def _records(world, env, first=X, second=Y):
  """Per query: (kind, llm, error, output, tokens in/out, cost) of each call of the script."""
  out = []
  for q in world.sample_queries(N, seed=7, split=SPLIT):
    state = env.reset(q)

    async def run():
      while not state.done:
        await env.step(state, q, _script(env.space, first, second)(state, env.mask(state)), seed=3)
    asyncio.run(run())
    out.append([(c.kind, c.llm, c.error, c.output_text, c.input_tokens, c.output_tokens, c.cost_usd)
                for c in state.calls])
  return out


CFG = mdp.MDPConfig(p_max=1, max_width=2, max_depth=2, step_cap=16)


@pytest.mark.parametrize("kind", list(EVENTS))
def test_outcomes_change_exactly_from_t(tiny_world, kind):
  plain_world, plain_env, _ = _system(tiny_world, None, CFG)
  world, env, _ = _system(tiny_world, [EVENTS[kind]], CFG)
  second = X if kind == "quality" else Y  # the quality event acts on executor calls
  plain = _records(plain_world, plain_env, X, second)
  changed = _records(world, env, X, second)
  if kind == "join":   # absent before t (the script falls back to Y), the plain pool from t on
    assert changed[T:] == plain[T:]
    assert all(c[1] == Y for q in changed[:T] for c in q) and any(c[1] == X for c in plain[0])
    return
  assert changed[:T] == plain[:T]         # before t: bit-identical
  after = [(a, b) for qa, qb in zip(plain[T:], changed[T:]) for a, b in zip(qa, qb)]
  x_calls = [(a, b) for a, b in after if a[1] == X]
  assert x_calls
  if kind == "price":
    assert all(b[:6] == a[:6] and b[6] == pytest.approx(3.0 * a[6], rel=1e-12) and a[6] > 0
               for a, b in x_calls)
    assert all(a == b for a, b in after if a[1] != X)
  elif kind == "fail":
    assert all(b[2] == "unavailable" and b[3] == "" and b[6] == 0.0 for q in changed[T:]
               for b in q if b[1] == X)
  else:
    assert changed[T:] != plain[T:]
  # The probabilities the expected utility and the optimum use change from t on only.
  for i, q in enumerate(world.sample_queries(N, seed=7, split=SPLIT)):
    node, plain_node = world.lookup(q.query), plain_world.lookup(q.query)
    p, p0 = world.exec_probability(node, X), plain_world.exec_probability(plain_node, X)
    shifted = kind == "quality" and i >= T
    assert p == (pytest.approx(sim._sigmoid(sim._logit(p0) - 3.0), abs=1e-12) if shifted else p0)


def test_join_masks_and_refuses_before_t(tiny_world):
  world, env, _ = _system(tiny_world, [EVENTS["join"]], CFG)
  x_actions = [a for a in range(env.space.size) if env.space.decode(a)[1] == X]
  for i, q in enumerate(world.sample_queries(N, seed=7, split=SPLIT)):
    state = env.reset(q)
    assert env.mask(state)[x_actions].any() == (i >= T)
    if i < T:
      with pytest.raises(ValueError, match="masked"):
        asyncio.run(env.step(state, q, env.space.encode("executor", X), seed=0))
      msgs = [{"role": "system", "content": env.space.roles["executor"].system},
              {"role": "user", "content": f"Question: {q.query}"}]
      assert asyncio.run(env.pool.chat(X, msgs)).error == "not_in_pool"
  # The single-LLM baseline of X: Y's executor answers before t, X's from t on.
  states = policies.run_policy(env, policies.single_llm_policy(env.space, X),
                               world.sample_queries(N, seed=7, split=SPLIT))
  assert [[(c.kind, c.llm) for c in s.calls] for s in states] == \
      [[("executor", Y)]] * T + [[("executor", X)]] * (N - T)


def test_quality_event_acts_on_its_domains_and_tasks_only(tiny_world):
  queries = sim.SimWorld(tiny_world["world"].profiles).sample_queries(40, seed=7, split=SPLIT)
  domain, task = queries[T].domain, queries[T + 1].task_name
  ev = sim_events.PoolEvent("quality", X, T, delta=1.5, domains=(domain,), tasks=(task,))
  world, _, _ = _system(tiny_world, [ev], CFG)
  plain_world, _, _ = _system(tiny_world, None, CFG)
  hit = 0
  plain_world.sample_queries(40, seed=7, split=SPLIT)
  for i, q in enumerate(world.sample_queries(40, seed=7, split=SPLIT)):
    p = world.exec_probability(world.lookup(q.query), X)
    p0 = plain_world.exec_probability(plain_world.lookup(q.query), X)
    on = i >= T and (q.domain == domain or q.task_name == task)
    hit += on
    assert (p != p0) == on and world.exec_probability(world.lookup(q.query), Y) == \
        plain_world.exec_probability(plain_world.lookup(q.query), Y)
  assert hit >= 2 and hit < 38


@pytest.mark.parametrize("kind,cfg,alpha", [
    ("quality", CFG, 0.0), ("price", CFG, 0.5), ("join", CFG, 0.5), ("fail", CFG, 0.5),
    ("fail", CFG, 2.0),                                          # abstaining beats answering
    ("fail", mdp.MDPConfig(phase1_depth=1, phase1_width=2, step_cap=16), 2.0),   # Phase-1 escape
])
def test_optimum_follows_the_pool(tiny_world, kind, cfg, alpha):
  """The optimum is the brute-force optimum of the pool as it is at each query: the plain pool's
  before t (from t on for a join), the changed one otherwise; following its plan through the
  environment realises it."""
  _, _, plain = _system(tiny_world, None, cfg, alpha)
  plain.world.sample_queries(N, seed=7, split=SPLIT)
  world, env, solver = _system(tiny_world, [EVENTS[kind]], cfg, alpha)
  oracle = optimal.OraclePolicy(solver)
  moved = 0
  for i, q in enumerate(world.sample_queries(N, seed=7, split=SPLIT)):
    value = solver.value(q)
    if (i < T) != (kind == "join"):
      assert value == plain.value(q)
      continue
    assert value == pytest.approx(brute_force(env, world, q, alpha), abs=1e-9)
    moved += abs(value - plain.value(q)) > 1e-6
    state = env.reset(q)

    async def run():
      while not state.done:
        await env.step(state, q, oracle.act(q, state), seed=5)
    asyncio.run(run())
    realised = sim.expected_utility(world, state) - alpha * env.cost_units(state)
    assert realised == pytest.approx(value, abs=1e-9)
  assert moved   # the event changes what the best policy can get


def test_config_section_reaches_the_system_and_validates():
  c = test_config.get_config()
  c.data.sim_events.fail.llm = c.llms.split(",")[0]
  c.data.sim_events.fail.t = 5
  c.data.sim_events.join.llm = c.llms.split(",")[1]
  c.data.sim_events.join.t = 3
  system = system_lib.build(c)
  assert [e.kind for e in system.world.events.events] == ["join", "fail"]
  env = system.env(0.5)
  masks = [env.mask(env.reset(q)).reshape(len(system.space.roles), -1)[:, 1].any()
           for q in system.test_queries[:5]]
  assert masks == [False, False, False, True, True]
  assert all(env.mask(env.reset(q)).any() for q in system.train_queries[:5])  # train: plain pool
  assert system_lib.build(test_config.get_config()).world.events is None     # all off: no events
  for field, value, match in [("fail.llm", "gpt-nope", "not in the pool"),
                              ("fail.t", -1, "t must be >= 0"),
                              ("price.scale", 0.0, "scale must be > 0"),
                              ("quality.domains", "cooking", "domain"),
                              ("splits", " ", "splits is empty")]:
    c = test_config.get_config()
    kind = field.split(".")[0]
    if kind != "splits":
      c.data.sim_events[kind].llm = c.llms.split(",")[0]
    if kind in ("price", "quality", "splits"):
      c.data.sim_events.price.llm = c.llms.split(",")[0]
    sec, _, leaf = field.rpartition(".")
    (c.data.sim_events[sec] if sec else c.data.sim_events)[leaf] = value
    with pytest.raises(errors.ConfigError, match=match):
      system_lib.build(c)
  c = test_config.get_config()
  c.data.sim_events.fail.llm = c.llms.split(",")[0]
  c.replay.mode, c.replay.path = "read-write", "/tmp/unused.sqlite"
  with pytest.raises(errors.ConfigError, match="replay"):
    system_lib.build(c)


def test_query_position():
  assert sim_events.query_position("test-0-12") == ("test", 12)
  assert sim_events.query_position("few-shot-3-4/qwen/3/1/x/2") == ("few-shot", 4)
  with pytest.raises(ValueError, match="not a simulated query key"):
    sim_events.query_position("gsm8k-17")


def test_pool_at_a_query_as_events_on_another_split(tiny_world):
  """PoolEvents.at: the pool one query met, carried to every query of another split; a world
  under those events (SimWorld.with_events) answers the other split as that pool does."""
  events = sim_events.PoolEvents([EVENTS["quality"], EVENTS["price"],
                                  sim_events.PoolEvent("join", Y, T + 1)], (SPLIT,))
  before, after = f"{SPLIT}-7-{T - 1}", f"{SPLIT}-7-{T + 1}/x/2/0"
  assert [(e.kind, e.t) for e in events.at(before, ["other"]).events] == \
      [("join", sim_events.NEVER)]                      # only Y's join, not yet made
  at = events.at(after, ["other"])
  assert [(e.kind, e.llm, e.t) for e in at.events] == [("quality", X, 0), ("price", X, 0)]
  assert at.splits == ("other",) and at.events[0].delta == -3.0 and at.events[1].scale == 3.0
  assert events.at("other-7-9", ["other"]) is None       # a split the events do not follow
  plain = sim.SimWorld(tiny_world["world"].profiles)
  moved = plain.with_events(at)
  assert plain.events is None and moved.events is at
  queries = plain.sample_queries(3, seed=7, split="other")
  for q in queries:   # the registry is shared: texts sampled by one are known to the other
    node = moved.lookup(q.query)
    assert node is plain.lookup(q.query)
    p0 = plain.exec_probability(node, X)
    assert moved.exec_probability(node, X) == pytest.approx(
        sim._sigmoid(sim._logit(p0) - 3.0), abs=1e-12)
    assert moved.exec_probability(node, Y) == plain.exec_probability(node, Y)
  assert plain.with_events(events.at(before, ["other"])).events.absent(Y, "other-7-0")
