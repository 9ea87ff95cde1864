"""GRBench question files, the graph generator (determinism, schemas, sizes, consistency) and
the question templates."""
import collections
import json
import pathlib

import pytest

from gp_jax import errors
from gp_jax.counselor.kg import data
from gp_jax.counselor.kg import parser
from gp_jax.counselor.kg import retrieval
from gp_jax.counselor.synth import generator
from gp_jax.counselor.synth import plans
from gp_jax.counselor.synth import templates

SAMPLES = pathlib.Path(__file__).resolve().parents[3] / "data" / "counselor"


def write(tmp_path, text):
  p = tmp_path / "q.jsonl"
  p.write_text(text)
  return p


def test_load_real_grbench_rows(tmp_path):
  p = write(tmp_path, '{"qid": 0, "question": "Who wrote \\"X\\"?", "answer": "A, B"}\n\n'
                      '{"qid": "1", "question": "How many?", "answer": 7, "level": "easy"}\n'
                      '{"qid": "2", "question": "Which?", "answer": ["a", "b"], "difficulty": "hard"}\n')
  qs = data.load_questions(p)
  assert [q.qid for q in qs] == ["0", "1", "2"]
  assert [q.answer for q in qs] == ["A, B", "7", "a, b"]
  assert [q.level for q in qs] == ["unknown", "easy", "hard"]
  assert qs[0].question == 'Who wrote "X"?' and qs[0].plan is None


@pytest.mark.parametrize("text, message", [
    ('{"qid": 1, "question": "x", "answer": "y"}\n{"qid": 2,', "line 2: not valid JSON"),
    ('{"qid": 1, "question": "x"}\n', "line 1: missing field 'answer'"),
    ('{"qid": 1, "question": " ", "answer": "y"}\n', "'question' must be a non-empty string"),
    ('{"qid": true, "question": "x", "answer": "y"}\n', "'qid' must be"),
    ('{"qid": 1, "question": "x", "answer": {"a": 1}}\n', "'answer' must be"),
    ('{"qid": 1, "question": "x", "answer": "y", "level": "expert"}\n', "'level' must be one of"),
    ('{"qid": 1, "question": "x", "answer": "y"}\n{"qid": "1", "question": "z", "answer": "w"}\n',
     "line 2: duplicate qid '1' \\(first on line 1\\)"),
    ('[1, 2]\n', "line 1: expected a JSON object"),
    ('\n\n', "no questions"),
])
def test_bad_question_files(tmp_path, text, message):
  with pytest.raises(errors.DataError, match=message):
    data.load_questions(write(tmp_path, text))


def test_missing_question_file(tmp_path):
  with pytest.raises(errors.DataError, match="question file not found"):
    data.load_questions(tmp_path / "none.jsonl")


def test_generator_is_deterministic_and_seeded(datasets):
  for domain in generator.DOMAINS:
    g1, q1 = generator.generate_dataset(domain, "tiny", seed=3, per_template=3)
    g2, q2 = datasets[domain]
    assert json.dumps(g1.to_json_dict()) == json.dumps(g2.to_json_dict())
    assert [q.to_json() for q in q1] == [q.to_json() for q in q2]
    g3 = generator.generate_graph(domain, "tiny", seed=4)
    assert g3.fingerprint != g1.fingerprint


def test_domains_have_different_schemas(datasets):
  schemas = {d: {t: (s.features, s.neighbor_types) for t, s in g.schema.items()}
             for d, (g, _) in datasets.items()}
  assert set(schemas["academic"]) == {"author", "paper", "venue"}
  assert set(schemas["ecommerce"]) == {"item", "brand", "category"}
  assert set(schemas["biomedical"]) == {"compound", "disease", "gene", "side_effect"}
  assert schemas["biomedical"]["compound"][1] == ("binds", "causes", "treats")
  assert schemas["ecommerce"]["item"][1] == ("also_bought", "brand", "category")


def _inverse_ok(g, src_type, rel, dst_rel):
  for nid in g.ids:
    if g.node_type(nid) != src_type:
      continue
    for j in g.neighbors(nid)[rel]:
      if nid not in g.neighbors(j)[dst_rel]:
        return False
  return True


def test_generated_graphs_are_consistent(datasets):
  a, e, b = (datasets[d][0] for d in ("academic", "ecommerce", "biomedical"))
  assert _inverse_ok(a, "paper", "author", "paper") and _inverse_ok(a, "author", "paper", "author")
  assert _inverse_ok(a, "paper", "reference", "cited_by")
  assert _inverse_ok(e, "item", "also_bought", "also_bought")
  assert _inverse_ok(e, "item", "brand", "item")
  assert _inverse_ok(b, "compound", "treats", "treated_by")
  assert _inverse_ok(b, "compound", "binds", "bound_by")
  assert _inverse_ok(b, "disease", "associated_gene", "associated_disease")
  for g in (a, e, b):
    texts = [retrieval.normalize_text(t) for t in g.texts()]
    assert len(set(texts)) == len(texts)  # main texts are unique: Retrieve is well defined
    for nid in g.ids:
      assert nid not in g.neighbors(nid).get("also_bought", [])


def test_sizes_and_heavy_tails():
  assert generator.parse_size("10k") == 10_000 and generator.parse_size("2500") == 2500
  with pytest.raises(errors.ConfigError, match="unknown graph size"):
    generator.parse_size("huge")
  with pytest.raises(errors.ConfigError, match="between 40"):
    generator.parse_size(5)
  g = generator.generate_graph("academic", "10k", seed=0)
  assert len(g) == 10_000
  papers_per_author = [len(g.neighbors(n)["paper"]) for n in g.ids if g.node_type(n) == "author"]
  mean = sum(papers_per_author) / len(papers_per_author)
  assert max(papers_per_author) > 8 * mean  # a few very productive authors, as in DBLP


def test_templates_cover_levels_and_plans_parse(datasets):
  for domain, (graph, questions) in datasets.items():
    by_level = collections.Counter(q.level for q in questions)
    assert all(by_level[l] >= 3 for l in data.LEVELS), (domain, by_level)
    names = {t.name for t in templates.TEMPLATES[domain]}
    assert {q.template for q in questions} <= names
    assert collections.Counter(q.template for q in questions).most_common(1)[0][1] <= 3
    assert len({q.question for q in questions}) == len(questions)
    for q in questions:
      for step in q.plan["steps"]:
        if "act" in step:
          items = parser.parse_action(plans.fill(step["act"], {"p": "x1"}))
          assert len(items) == 1 and isinstance(items[0], parser.Call), step["act"]


def test_question_roundtrip(tmp_path, datasets):
  _, questions = datasets["ecommerce"]
  path = data.save_questions(questions, tmp_path / "q.jsonl")
  again = data.load_questions(path)
  assert [q.to_json() for q in again] == [q.to_json() for q in questions]
  assert all(a.plan == b.plan for a, b in zip(again, questions))


def test_plan_reducers():
  assert plans.apply_op("count", [["a", "b"], ["b", "c"]]) == 3
  assert plans.apply_op("intersect", [["a", "b"], ["c"]], ["c", "a"]) == ["a", "c"]
  assert plans.apply_op("minus", ["a", "b", "a"], "a") == ["b"]
  assert plans.apply_op("argmax", ["x", "y", "z"], [1, 5, 3]) == "y"
  with pytest.raises(plans.PlanError, match="tied"):
    plans.apply_op("argmax", ["x", "y"], [5, 5])
  assert plans.apply_op("mode", [["a"], ["b"], ["a"]]) == "a"
  with pytest.raises(plans.PlanError, match="tied"):
    plans.apply_op("mode", ["a", "b"])
  assert plans.apply_op("mean2", [1.0, 2.0, 2.0]) == 1.67
  assert plans.apply_op("sum", [1, [2, 3]]) == 6
  assert plans.apply_op("filter_any", ["c1", "c2"], [["g1"], ["g2", "g3"]], ["g3"]) == ["c2"]
  plan = {"steps": [{"act": "A[x]"}, {"let": "v", "expr": {"op": "first", "args": [{"obs": 1}]}},
                    {"act": "B[{v}]"}], "answer": {"obs": 2}}
  assert plans.next_move(plan, []) == ("act", "A[x]")
  assert plans.next_move(plan, [["k", "l"]]) == ("act", "B[k]")
  assert plans.next_move(plan, [["k"], 7]) == ("finish", 7)


@pytest.mark.parametrize("domain", generator.DOMAINS)
def test_committed_samples_match_the_generator(domain):
  folder = SAMPLES / f"{domain}-tiny"
  graph, questions = generator.generate_dataset(domain, "tiny", seed=0, per_template=2)
  assert json.loads((folder / "graph.json").read_text()) == graph.to_json_dict()
  assert [q.to_json() for q in data.load_questions(folder / "questions.jsonl")] == [
      q.to_json() for q in questions]
