"""The agents loop: gold-plan agents answer every generated question; judge -> reflection ->
second trial; step, token and failure limits halt cleanly; per-step model routing and records."""
import asyncio

import pytest

from gp_jax import errors
from gp_jax.counselor.agents import loop as agents
from gp_jax.counselor.agents import prompts
from gp_jax.counselor.agents import records
from gp_jax.counselor.eval import metrics
from gp_jax.counselor.kg import functions
from gp_jax.counselor.synth import oracle
from tests.counselor.conftest import MODEL, ScriptedPool, run


@pytest.mark.parametrize("domain", ["academic", "ecommerce", "biomedical"])
@pytest.mark.parametrize("method", ["counselor", "graph_cot"])
def test_an_agent_issuing_the_gold_calls_answers_every_generated_question(datasets, encoder,
                                                                          catalog, domain, method):
  graph, questions = datasets[domain]
  assert {q.level for q in questions} == {"easy", "medium", "hard"}
  funcs = functions.make_functions(graph, encoder)
  pool = oracle.OraclePool.from_questions(catalog, questions)
  runner = agents.run_counselor if method == "counselor" else agents.run_graph_cot

  async def all_questions():
    return await asyncio.gather(*[runner(q.question, funcs=funcs, pool=pool, qid=q.qid,
                                         select_llm=records.fixed_selector(MODEL))
                                  for q in questions])
  results = run(all_questions())
  wrong = [(q.template, q.answer, r.final_answer) for q, r in zip(questions, results)
           if r.final_answer != q.answer]
  assert not wrong
  assert all(metrics.exact_match(r.final_answer, q.answer) == 1.0
             for q, r in zip(questions, results))
  for r in results:
    assert len(r.trials) == 1 and r.trials[0].end_reason == "finish"
    kinds = [c.kind for c in r.calls]
    per_step = ["plan", "thought", "action"] if method == "counselor" else ["thought", "action"]
    steps = r.trials[0].steps
    expected = per_step * len(steps) + (["judge"] if method == "counselor" else [])
    assert kinds == expected
    assert r.trials[0].verdict is (True if method == "counselor" else None)
  assert pool.unknown_questions == 0


def _wrong_then_gold(question, catalog):
  """A scripted double: trial 1 answers 'Wrong Answer' at once; after a reflection it follows the
  gold plan (the oracle's logic)."""
  gold = oracle.OraclePool(catalog, {question.question: question.plan})

  def respond(kind, user, i):
    if kind == "judge":
      return "Judgment: [no] wrong." if "Proposed answer: Wrong Answer" in user else "[YES]"
    if kind == "reflect":
      return "Recap: guessed. Improved strategy: use Neighbor then Feature on citations."
    if "Reflection 1:" not in user:
      return {"plan": "Plan 1: guess.", "thought": "Thought 1: guess.",
              "action": "Action 1: Finish[Wrong Answer]"}[kind]
    return gold._respond([{"role": "system", "content": prompts.HEADERS[kind]},
                          {"role": "user", "content": user}])
  return respond


def test_wrong_first_trial_is_judged_reflected_on_and_retried(academic, catalog):
  graph, questions, funcs = academic
  q = next(q for q in questions if q.template == "most_cited_paper")
  pool = ScriptedPool(_wrong_then_gold(q, catalog))
  r = run(agents.run_counselor(q.question, funcs=funcs, pool=pool, qid=q.qid,
                               select_llm=records.fixed_selector(MODEL)))
  assert [t.answer for t in r.trials] == ["Wrong Answer", q.answer]
  assert r.first_answer == "Wrong Answer" and r.final_answer == q.answer
  t0, t1 = r.trials
  assert t0.verdict is False and "[no]" in t0.judgment
  assert t0.reflection.startswith("Recap: guessed.")
  assert t1.verdict is True and t1.reflection is None
  kinds = [c.kind for c in r.calls]
  assert kinds[:5] == ["plan", "thought", "action", "judge", "reflect"]
  assert kinds[5:] == ["plan", "thought", "action"] * len(t1.steps) + ["judge"]
  # the second trial's prompts carry the reflection, the first trial's do not
  trial_of_call = [c.trial for c in r.calls]
  assert trial_of_call == [0] * 5 + [1] * (len(kinds) - 5)
  prompts_seen = [s.messages[-1]["content"] for s in pool.seen]
  assert all("Reflection 1: Recap: guessed." not in p for p in prompts_seen[:5])
  assert all("Reflection 1: Recap: guessed." in p for p in prompts_seen[5:-1])
  # the judge reads the first trial's scratchpad and answer
  assert "Action 1: Finish[Wrong Answer]" in prompts_seen[3]


def test_no_verdict_counts_as_no_and_reflections_are_bounded(academic):
  graph, questions, funcs = academic

  def respond(kind, user, i):
    return {"plan": "x", "thought": "y", "action": "Finish[nope]", "judge": "I am not sure.",
            "reflect": "Try again."}[kind]
  r = run(agents.run_counselor(questions[0].question, funcs=funcs, pool=ScriptedPool(respond),
                               select_llm=records.fixed_selector(MODEL), max_reflect=2))
  assert len(r.trials) == 3  # max_reflect + 1
  assert [t.verdict for t in r.trials] == [False, False, None]  # the last trial is not judged
  assert [c.kind for c in r.calls].count("reflect") == 2
  r = run(agents.run_counselor(questions[0].question, funcs=funcs, pool=ScriptedPool(respond),
                               select_llm=records.fixed_selector(MODEL), max_reflect=1,
                               judge_final_trial=True))
  assert [t.verdict for t in r.trials] == [False, False]
  assert [c.kind for c in r.calls].count("reflect") == 1


@pytest.mark.parametrize("text, verdict", [
    ("Judgment: [Yes]", True), ("[yes] fine", True), ("JUDGMENT: [ YES ]", True),
    ("Judgment: [No]", False), ("judgment: [no] The answer is wrong [yes]", False),
    ("Judgment: yes", True), ("No.", False), ("", False), ("maybe", False),
    ("The answer looks right", False),
])
def test_parse_verdict(text, verdict):
  assert agents.parse_verdict(text) is verdict


def test_step_limit_halts_cleanly(academic):
  graph, questions, funcs = academic

  def respond(kind, user, i):
    return {"plan": "look", "thought": "look", "action": "Retrieve[something]",
            "reflect": "Answer sooner."}[kind]
  r = run(agents.run_counselor(questions[0].question, funcs=funcs, pool=ScriptedPool(respond),
                               select_llm=records.fixed_selector(MODEL), max_steps=4,
                               max_reflect=1))
  assert [t.end_reason for t in r.trials] == ["max_steps", "max_steps"]
  assert [len(t.steps) for t in r.trials] == [4, 4]
  assert r.final_answer is None and r.first_answer is None
  # no answer: judged No without a call, then reflected on
  assert r.trials[0].verdict is False and "max_steps" in r.trials[0].judgment
  assert [c.kind for c in r.calls] == ["plan", "thought", "action"] * 4 + ["reflect"] + [
      "plan", "thought", "action"] * 4


def test_token_budget_truncates_oldest_observations_then_halts(academic):
  graph, questions, funcs = academic
  venue = next(n for n in graph.ids if graph.node_type(n) == "venue")
  big = f"Feature[Neighbor[{venue}, paper], title]"
  pool = ScriptedPool(lambda kind, user, i: {"plan": "p", "thought": "t", "action": big}[kind])
  base_tokens = prompts.messages_tokens(prompts.agent_messages(
      "plan", schema=funcs.describe_graph(), question=questions[0].question, reflections=[],
      scratchpad=prompts.Scratchpad(), step=1))
  r = run(agents.run_counselor(questions[0].question, funcs=funcs, pool=pool,
                               select_llm=records.fixed_selector(MODEL), max_steps=100,
                               use_reflection=False, prompt_token_budget=base_tokens + 600))
  t = r.trials[0]
  assert t.end_reason == "token_budget"
  assert 2 <= len(t.steps) < 100
  assert prompts.Scratchpad.TRUNCATED in t.scratchpad
  last_prompts = [s.messages for s in pool.seen[-3:]]
  assert all(prompts.messages_tokens(m) <= base_tokens + 600 for m in last_prompts)
  assert all(c.prompt_tokens_est <= base_tokens + 600 for c in r.calls)
  # a budget below the bare prompt: the trial ends before any call
  r = run(agents.run_counselor(questions[0].question, funcs=funcs, pool=pool,
                               select_llm=records.fixed_selector(MODEL), use_reflection=False,
                               prompt_token_budget=base_tokens - 1))
  assert r.trials[0].end_reason == "token_budget" and not r.calls


def test_failed_calls_are_recorded_and_do_not_crash(academic):
  graph, questions, funcs = academic
  r = run(agents.run_counselor(questions[0].question, funcs=funcs,
                               pool=ScriptedPool(lambda *a: None),
                               select_llm=records.fixed_selector(MODEL)))
  assert [t.end_reason for t in r.trials] == ["llm_error"] * 3
  assert r.final_answer is None
  assert all(c.error == "scripted_failure" and c.output == "" for c in r.calls)
  assert [c.kind for c in r.calls].count("reflect") == 2  # the reflect calls fail too

  failed_once = []

  def flaky(kind, user, i):  # the first action call fails, the rest work
    if kind == "action" and not failed_once:
      failed_once.append(i)
      return None
    return {"plan": "p", "thought": "t", "action": "Finish[ok]", "judge": "[Yes]"}[kind]
  r = run(agents.run_counselor(questions[0].question, funcs=funcs, pool=ScriptedPool(flaky),
                               select_llm=records.fixed_selector(MODEL)))
  t = r.trials[0]
  assert "the model call failed (scripted_failure)" in t.steps[0].observation
  assert t.answer == "ok" and t.end_reason == "finish" and len(t.steps) == 2


class SlowPool(ScriptedPool):
  async def chat(self, model, messages, params=None):
    await asyncio.sleep(10)


def test_hung_calls_time_out(academic):
  graph, questions, funcs = academic
  r = run(agents.run_counselor(questions[0].question, funcs=funcs,
                               pool=SlowPool(lambda *a: "x"), call_timeout_s=0.05,
                               select_llm=records.fixed_selector(MODEL), use_reflection=False))
  assert r.trials[0].end_reason == "llm_error"
  assert [c.error for c in r.calls] == ["timeout"] * 3


def test_every_call_is_routed_through_the_selector_and_recorded(academic, catalog):
  graph, questions, funcs = academic
  q = next(q for q in questions if q.template == "coauthor_count")
  pool = oracle.OraclePool.from_questions(catalog, questions)
  table = {"plan": "qwen2.5-7b-instruct", "thought": "mistral-7b-instruct-v0.3",
           "action": "llama-3.1-8b-instruct", "judge": "llama3-chatqa-1.5-70b",
           "reflect": "mixtral-8x22b-instruct-v0.1"}
  seen_steps = []

  async def selector(step: records.AgentStep) -> str:  # an asynchronous router
    seen_steps.append(step)
    return table[step.kind]
  r = run(agents.run_counselor(q.question, funcs=funcs, pool=pool, qid=q.qid, select_llm=selector))
  assert r.final_answer == q.answer
  assert [s.kind for s in seen_steps] == [c.kind for c in r.calls]
  for i, (s, c) in enumerate(zip(seen_steps, r.calls)):
    assert c.model == table[c.kind] and s.role == records.AGENT_ROLES[s.kind]
    assert s.qid == q.qid and s.question == q.question and s.trial == 0
    assert len(s.calls_so_far) == i
    assert s.prompt == s.messages[-1]["content"]
    assert c.cost_usd == pytest.approx(catalog.cost_usd(c.model, c.input_tokens, c.output_tokens))
    assert c.input_tokens > 0 and c.output_tokens > 0 and c.latency_s >= 0
  assert [s.step for s in seen_steps if s.kind == "plan"] == list(range(1, len(r.trials[0].steps) + 1))
  assert {s.role for s in seen_steps} == {"planner", "thinker", "executor", "verifier"}
  assert r.cost_usd == pytest.approx(sum(c.cost_usd for c in r.calls))
  assert r.to_json()["n_calls"] == len(r.calls)


def test_selector_misconfiguration_raises(academic):
  graph, questions, funcs = academic
  with pytest.raises(errors.ConfigError, match="unknown LLM 'gpt-9'"):
    run(agents.run_counselor(questions[0].question, funcs=funcs, pool=ScriptedPool(lambda *a: "x"),
                             select_llm=records.fixed_selector("gpt-9")))
  with pytest.raises(errors.ConfigError, match="expected a model name"):
    run(agents.run_counselor(questions[0].question, funcs=funcs, pool=ScriptedPool(lambda *a: "x"),
                             select_llm=lambda step: None))
  with pytest.raises(errors.ConfigError, match="no model for agent kind"):
    records.fixed_selector({"plan": MODEL})
  with pytest.raises(errors.ConfigError, match="unknown agent kind 'planner'"):
    records.fixed_selector({"planner": MODEL})
  assert records.fixed_selector({"plan": "a", "default": "b"}).table["action"] == "b"
