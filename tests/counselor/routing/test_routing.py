"""The simulated counselor backend (the router: test_router.py; the runner: ../test_routed_runner.py)."""

import numpy as np
import pytest

from gp_jax.counselor.agents import loop as agents
from gp_jax.counselor.agents import records
from gp_jax.counselor.kg import parser as parser_lib
from gp_jax.counselor.synth import oracle
from gp_jax.counselor.synth import sim_pool
from gp_jax.sim import simulator
from tests.counselor.conftest import run

SMALL, BIG = "qwen2.5-7b-instruct", "llama-3.3-nemotron-super-49b-v1"


def _run_all(questions, funcs, pool, select, **kw):
  return [run(agents.run_counselor(q.question, funcs=funcs, pool=pool, select_llm=select,
                                   qid=q.qid, **kw)) for q in questions]


def test_success_rate_matches_probability(academic, catalog):
  graph, questions, funcs = academic
  pool = sim_pool.SimCounselorPool(catalog, questions, seed=1)
  for seed in range(3):
    _run_all(questions, funcs, pool.with_seed(seed), records.fixed_selector("llama-3.1-8b-instruct"))
    for k, d in pool.with_seed(seed).draws.items():
      assert d["n"] == 0  # with_seed gives each copy its own counters
  # collect the counters of one long run
  p = pool.with_seed(7)
  _run_all(questions * 2, funcs, p, records.fixed_selector("gemma-2-9b-it"))
  total = {"n": 0, "ok": 0, "sum_p": 0.0, "sum_var": 0.0}
  for d in p.draws.values():
    for key in total:
      total[key] += d[key]
  assert total["n"] > 200 and 0.2 < total["sum_p"] / total["n"] < 0.95
  assert abs(total["ok"] - total["sum_p"]) < 4 * np.sqrt(total["sum_var"]) + 1
  # a fixed probability: the success share is that probability
  q = sim_pool.SimCounselorPool(catalog, questions, seed=3, p_override=0.3)
  _run_all(questions, funcs, q, records.fixed_selector(SMALL))
  n = sum(d["n"] for d in q.draws.values())
  ok = sum(d["ok"] for d in q.draws.values())
  assert n > 100 and abs(ok / n - 0.3) < 4 * np.sqrt(0.21 / n)


def test_probability_equation_and_ordering(catalog):
  profiles = simulator.load_profiles(catalog)
  theta = profiles[BIG].theta["knowledge_reasoning"]
  p = sim_pool.success_probability(theta, "action", 0.5, 1.0)
  assert p == pytest.approx(1 / (1 + np.exp(-(2.0 * theta + 0.5 - 0.5 + 1.0))))
  assert sim_pool.success_probability(theta, "plan", 0.0) > sim_pool.success_probability(
      profiles[SMALL].theta["knowledge_reasoning"], "plan", 0.0)
  assert sim_pool.success_probability(0.0, "plan", 1.0) < sim_pool.success_probability(
      0.0, "plan", 0.0)


def test_probability_one_is_the_oracle(academic, catalog):
  graph, questions, funcs = academic
  sim = sim_pool.SimCounselorPool(catalog, questions, p_override=1.0)
  gold = oracle.OraclePool.from_questions(catalog, questions)
  select = records.fixed_selector({"default": SMALL, "action": BIG})
  a = _run_all(questions, funcs, sim, select, judge_final_trial=True)
  b = _run_all(questions, funcs, gold, select, judge_final_trial=True)
  for q, ra, rb in zip(questions, a, b):
    assert [c.output for c in ra.calls] == [c.output for c in rb.calls]
    assert ra.final_answer == q.answer
    # billed output tokens follow the verbosity of the model
    assert all(c.output_tokens > 0 and c.cost_usd > 0 for c in ra.calls)
  assert sim.draws["action"]["ok"] == sim.draws["action"]["n"] > 0


def test_failures_keep_the_format(academic, catalog):
  graph, questions, funcs = academic
  pool = sim_pool.SimCounselorPool(catalog, questions, p_override=0.0)
  results = _run_all(questions, funcs, pool, records.fixed_selector(SMALL), max_steps=4,
                     judge_final_trial=True)
  kinds = set()
  for q, r in zip(questions, results):
    assert r.final_answer != q.answer
    for c in r.calls:
      kinds.add(c.kind)
      if c.kind == "action":
        items = parser_lib.parse_action(c.output)
        assert items and not any(isinstance(i, parser_lib.Issue) for i in items), c.output
      elif c.kind == "judge":
        assert c.output.startswith("Judgment: [")
      elif c.kind in ("plan", "thought"):
        assert c.output and "\n" not in c.output
      else:
        assert c.output == sim_pool.UNHELPFUL_REFLECTION
  assert kinds == {"plan", "thought", "action", "judge", "reflect"}


def test_wrong_answers_are_near_misses(catalog, academic):
  pool = sim_pool.SimCounselorPool(catalog, academic[1])
  rng = np.random.default_rng(0)
  for gold in ("7", "0", "12.5", "Ann Lee, Bo Chen, Cy Dee", academic[1][0].answer):
    for _ in range(20):
      wrong = pool.wrong_answer(gold, rng)
      assert wrong and wrong != gold
  assert pool.wrong_answer("7", rng).lstrip("-").isdigit()
  assert len(pool.wrong_answer("a, b, c", rng).split(", ")) == 2
