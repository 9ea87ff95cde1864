"""The one-shot baselines: context construction (Text RAG, GraphRAG 1/2-hop) and their calls."""
import pytest

from gp_jax.counselor.agents import baselines
from gp_jax.counselor.agents import prompts
from gp_jax.counselor.agents import records
from gp_jax.counselor.eval import harness
from tests.counselor.conftest import MODEL, ScriptedPool, run


def test_linearize_node(academic):
  graph, _, funcs = academic
  p = next(n for n in graph.ids if graph.node_type(n) == "paper")
  line = baselines.linearize_node(funcs, p)
  f = graph.features(p)
  assert line.startswith(f"{p} (paper): title={f['title']}; year={f['year']}; citations={f['citations']}")
  assert f"author: {', '.join(graph.neighbors(p)['author'])}" in line
  assert " | " not in baselines.linearize_node(funcs, p, with_neighbors=False)


def test_neighborhood_context_hops_and_budget(academic):
  graph, _, funcs = academic
  a = next(n for n in graph.ids if graph.node_type(n) == "author" and len(graph.neighbors(n)["paper"]) >= 2)
  one, n1 = baselines.neighborhood_context(funcs, a, hops=1, token_budget=10_000)
  assert n1 == 1 + len(graph.neighbors(a)["paper"])
  assert [l.split(" ")[0] for l in one.splitlines()] == [a] + graph.neighbors(a)["paper"]
  two, n2 = baselines.neighborhood_context(funcs, a, hops=2, token_budget=10_000)
  assert n2 > n1 and two.startswith(one)
  cut, n3 = baselines.neighborhood_context(funcs, a, hops=2, token_budget=120)
  assert 1 <= n3 < n2 and prompts.count_tokens(cut) <= 120
  empty, n0 = baselines.neighborhood_context(funcs, a, hops=2, token_budget=3)
  assert empty == "" and n0 == 0


@pytest.mark.parametrize("method", ["llm_only", "text_rag", "graphrag_1hop", "graphrag_2hop"])
def test_one_shot_methods_make_one_answer_call(academic, method):
  graph, questions, funcs = academic
  q = next(q for q in questions if q.template == "paper_year")
  pool = ScriptedPool(lambda kind, user, i: "Answer: 1999\nbecause")
  r = run(harness.run_method(method, q.question, funcs=funcs, pool=pool, qid=q.qid,
                              select_llm=records.fixed_selector(MODEL), max_steps=3))
  assert r.final_answer == "1999" and r.first_answer == "1999" and r.method == method
  assert [c.kind for c in r.calls] == ["answer"] and r.calls[0].role == "executor"
  user = pool.seen[0].messages[-1]["content"]
  assert pool.seen[0].kind == "answer" and user.endswith(f"Question: {q.question}\nAnswer:")
  if method == "llm_only":
    assert "Information from the knowledge graph" not in user
  else:
    # the question names the paper, so Retrieve on the question finds it
    paper = graph.ids[[graph.text(n) for n in graph.ids].index(q.question.split('"')[1])]
    assert r.extra["seed_node"] == paper
    assert baselines.linearize_node(funcs, paper, with_neighbors=method != "text_rag") in user
    assert r.extra["context_nodes"] >= 1


def test_failed_answer_call_gives_no_answer(academic):
  _, questions, funcs = academic
  r = run(baselines.run_text_rag(questions[0].question, funcs=funcs, pool=ScriptedPool(lambda *a: None),
                                 select_llm=records.fixed_selector(MODEL)))
  assert r.final_answer is None and r.calls[0].error == "scripted_failure"


def test_method_settings_filter():
  assert harness.method_settings("llm_only", {"max_steps": 3, "context_token_budget": 5}) == {}
  assert harness.method_settings("graphrag_2hop", {"max_steps": 3, "context_token_budget": 5}) == {
      "context_token_budget": 5}
  assert harness.method_settings("counselor", {"max_steps": 3, "context_token_budget": 5}) == {
      "max_steps": 3}
