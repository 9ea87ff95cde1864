"""Question templates of the generated GRBench-format graphs, with gold answers and gold plans.

Levels follow GRBench: easy = one hop (a feature, a degree, a neighbour list); medium = multi-hop,
counting, set intersection, argmax without ties; hard = paths and aggregations over several hops.
Each template computes its gold answer directly from the graph's features and neighbour lists
(never through the graph functions) with the reducers of plans.OPS, and writes the gold plan an
agent would follow with the graph functions. Candidates whose answer would be ambiguous (ties),
empty, or need lists longer than MAX_LIST are skipped.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

from gp_jax import errors
from gp_jax.counselor.kg import data as data_lib
from gp_jax.counselor.kg import graph_store
from gp_jax.counselor.kg import interpreter
from gp_jax.counselor.synth import plans

MAX_LIST = 40  # below the observation list limit, so every list an agent needs is shown in full
q = plans.quote


def _act(a: str) -> dict:
  return {"act": a}


def _let(name: str, expr: dict) -> dict:
  return {"let": name, "expr": expr}


def O(k: int) -> dict:  # noqa: E743 - reads like the paper's "Observation k"
  return {"obs": k}


def OP(name: str, *args: dict) -> dict:
  return {"op": name, "args": list(args)}


def LIT(v: Any) -> dict:
  return {"lit": v}


def _plan(steps: list[dict], answer: dict) -> dict:
  return {"steps": steps, "answer": answer}


class _G:
  """Read-only helpers over the graph for gold computations."""

  def __init__(self, graph: graph_store.KnowledgeGraph):
    self.g = graph

  def name(self, nid: str) -> str:
    return self.g.text(nid)

  def feat(self, nid: str, key: str) -> Any:
    return self.g.features(nid)[key]

  def nb(self, nid: str, ntype: str) -> list[str]:
    return self.g.neighbors(nid).get(ntype, [])

  def small(self, *lists) -> bool:
    return all(len(x) <= MAX_LIST for x in lists)


Build = Callable[[_G, str, np.random.Generator], "tuple[str, Any, dict] | None"]


@dataclasses.dataclass(frozen=True)
class Template:
  name: str
  level: str
  anchor: str  # node type the question starts from
  build: Build


def _common_count(g, a: str, b: str, via: str, question: str, *, check_size: bool = True):
  """'How many <via> neighbours do a and b share?': count of the intersection, two Neighbor calls."""
  la, lb = g.nb(a, via), g.nb(b, via)
  if check_size and not g.small(la, lb):
    return None
  na, nb = g.name(a), g.name(b)
  return (question.format(a=na, b=nb),
          plans.apply_op("count", plans.apply_op("intersect", la, lb)),
          _plan([_act(f"Neighbor[Retrieve[{q(na)}], {via}]"),
                 _act(f"Neighbor[Retrieve[{q(nb)}], {via}]")],
                OP("count", OP("intersect", O(1), O(2)))))


def _argmax_via(g, node: str, via: str, feature: str, name_feature: str, question: str):
  """'Which <via> neighbour of node has the largest <feature>?' (None when tied or too large)."""
  items = g.nb(node, via)
  if len(items) < 2 or not g.small(items):
    return None
  try:
    best = plans.apply_op("argmax", items, [g.feat(i, feature) for i in items])
  except plans.PlanError:
    return None
  n = g.name(node)
  return (question.format(n=n), g.name(best),
          _plan([_act(f"Neighbor[Retrieve[{q(n)}], {via}]"),
                 _act(f"Feature[Neighbor[Retrieve[{q(n)}], {via}], {feature}]"),
                 _let("p", OP("argmax", O(1), O(2))),
                 _act(f"Feature[{{p}}, {name_feature}]")], O(3)))


def _two(r: np.random.Generator, xs: list[str]) -> tuple[str, str]:
  i, j = r.choice(len(xs), 2, replace=False)
  return xs[int(i)], xs[int(j)]


# ------------------------------------------------------------------------------------ academic
def _a_paper_year(g, p, r):
  t = g.name(p)
  return (f'In which year was the paper "{t}" published?', g.feat(p, "year"),
          _plan([_act(f"Feature[Retrieve[{q(t)}], year]")], O(1)))


def _a_author_org(g, a, r):
  n = g.name(a)
  return (f"Which organization is the researcher {n} affiliated with?", g.feat(a, "organization"),
          _plan([_act(f"Feature[Retrieve[{q(n)}], organization]")], O(1)))


def _a_author_paper_count(g, a, r):
  n = g.name(a)
  return (f"How many papers has the researcher {n} written?", len(g.nb(a, "paper")),
          _plan([_act(f"Degree[Retrieve[{q(n)}], paper]")], O(1)))


def _a_paper_authors(g, p, r):
  t = g.name(p)
  authors = [g.name(x) for x in g.nb(p, "author")]
  return (f'Who are the authors of the paper "{t}"?', authors,
          _plan([_act(f"Feature[Neighbor[Retrieve[{q(t)}], author], name]")], O(1)))


def _a_author_venues(g, a, r):
  papers = g.nb(a, "paper")
  if len(papers) < 2 or not g.small(papers):
    return None
  n = g.name(a)
  value = plans.apply_op("unique", [[g.name(v) for v in g.nb(p, "venue")] for p in papers])
  return (f"In which venues has {n} published papers?", value,
          _plan([_act(f"Feature[Neighbor[Neighbor[Retrieve[{q(n)}], paper], venue], name]")],
                OP("unique", O(1))))


def _a_coauthor_count(g, a, r):
  papers = g.nb(a, "paper")
  nested = [g.nb(p, "author") for p in papers]
  if not papers or not g.small(papers, *nested):
    return None
  value = plans.apply_op("count", plans.apply_op("minus", nested, [a]))
  if value == 0:
    return None
  n = g.name(a)
  return (f"How many different co-authors has {n} written papers with?", value,
          _plan([_act(f"Retrieve[{q(n)}]"),
                 _act(f"Neighbor[Neighbor[Retrieve[{q(n)}], paper], author]")],
                OP("count", OP("minus", O(2), O(1)))))


def _a_common_papers(g, p, r):
  authors = g.nb(p, "author")
  if len(authors) < 2:
    return None
  a, b = _two(r, authors)
  return _common_count(g, a, b, "paper", "How many papers have {a} and {b} written together?")


def _a_most_cited(g, a, r):
  return _argmax_via(g, a, "paper", "citations", "title",
                     "Which paper written by {n} has the most citations?")


def _a_total_citations(g, a, r):
  papers = g.nb(a, "paper")
  if len(papers) < 2 or not g.small(papers):
    return None
  n = g.name(a)
  return (f"What is the total number of citations of all papers written by {n}?",
          plans.apply_op("sum", [g.feat(p, "citations") for p in papers]),
          _plan([_act(f"Feature[Neighbor[Retrieve[{q(n)}], paper], citations]")], OP("sum", O(1))))


def _a_top_venue(g, a, r):
  papers = g.nb(a, "paper")
  if len(papers) < 3 or not g.small(papers):
    return None
  try:
    value = plans.apply_op("mode", [[g.name(v) for v in g.nb(p, "venue")] for p in papers])
  except plans.PlanError:
    return None
  n = g.name(a)
  return (f"At which venue has {n} published the most papers?", value,
          _plan([_act(f"Feature[Neighbor[Neighbor[Retrieve[{q(n)}], paper], venue], name]")],
                OP("mode", O(1))))


def _a_common_coauthors(g, c, r):
  papers = g.nb(c, "paper")
  co = plans.apply_op("minus", [g.nb(p, "author") for p in papers], [c])
  if len(co) < 2:
    return None
  a, b = _two(r, co)

  def names_2hop(x):
    ps = g.nb(x, "paper")
    nested = [[g.name(y) for y in g.nb(p, "author")] for p in ps]
    return nested if g.small(ps, *nested) else None
  la, lb = names_2hop(a), names_2hop(b)
  if la is None or lb is None:
    return None
  na, nb = g.name(a), g.name(b)
  value = plans.apply_op("sorted", plans.apply_op(
      "minus", plans.apply_op("intersect", la, lb), [na, nb]))
  if not 1 <= len(value) <= 5:
    return None
  return (f"Who has co-authored papers with both {na} and {nb}?", value,
          _plan([_act(f"Feature[Neighbor[Neighbor[Retrieve[{q(na)}], paper], author], name]"),
                 _act(f"Feature[Neighbor[Neighbor[Retrieve[{q(nb)}], paper], author], name]")],
                OP("sorted", OP("minus", OP("intersect", O(1), O(2)), LIT([na, nb])))))


# ------------------------------------------------------------------------------------ ecommerce
def _e_price(g, i, r):
  t = g.name(i)
  return (f'What is the price of the item "{t}"?', g.feat(i, "price"),
          _plan([_act(f"Feature[Retrieve[{q(t)}], price]")], O(1)))


def _e_rating(g, i, r):
  t = g.name(i)
  return (f'What is the customer rating of "{t}"?', g.feat(i, "rating"),
          _plan([_act(f"Feature[Retrieve[{q(t)}], rating]")], O(1)))


def _e_brand_items(g, b, r):
  n = g.name(b)
  return (f"How many items does the brand {n} sell?", len(g.nb(b, "item")),
          _plan([_act(f"Degree[Retrieve[{q(n)}], item]")], O(1)))


def _e_item_brand(g, i, r):
  t = g.name(i)
  return (f'Which brand makes "{t}"?', [g.name(b) for b in g.nb(i, "brand")],
          _plan([_act(f"Feature[Neighbor[Retrieve[{q(t)}], brand], name]")], O(1)))


def _e_bought_brands(g, i, r):
  bought = g.nb(i, "also_bought")
  if len(bought) < 2:
    return None
  t = g.name(i)
  return (f'How many different brands make the items frequently bought together with "{t}"?',
          plans.apply_op("count", [g.nb(j, "brand") for j in bought]),
          _plan([_act(f"Neighbor[Neighbor[Retrieve[{q(t)}], also_bought], brand]")],
                OP("count", O(1))))


def _e_common_bought(g, c, r):
  bought = g.nb(c, "also_bought")
  if len(bought) < 2:
    return None
  a, b = _two(r, bought)
  return _common_count(g, a, b, "also_bought",
                       'How many items are frequently bought together with both "{a}" and "{b}"?')


def _e_priciest(g, b, r):
  return _argmax_via(g, b, "item", "price", "title",
                     "Which item of the brand {n} is the most expensive?")


def _e_bought_categories(g, i, r):
  bought = g.nb(i, "also_bought")
  if len(bought) < 2:
    return None
  t = g.name(i)
  value = plans.apply_op("unique", [[g.name(c) for c in g.nb(j, "category")] for j in bought])
  return (f'Which categories do the items frequently bought together with "{t}" belong to?', value,
          _plan([_act(f"Feature[Neighbor[Neighbor[Retrieve[{q(t)}], also_bought], category], "
                      "name]")], OP("unique", O(1))))


def _e_brand_avg_price(g, b, r):
  items = g.nb(b, "item")
  if len(items) < 2 or not g.small(items):
    return None
  n = g.name(b)
  return (f"What is the average price of the items sold by {n}, rounded to two decimals?",
          plans.apply_op("mean2", [g.feat(i, "price") for i in items]),
          _plan([_act(f"Feature[Neighbor[Retrieve[{q(n)}], item], price]")], OP("mean2", O(1))))


def _e_bought_top_category(g, i, r):
  bought = g.nb(i, "also_bought")
  if len(bought) < 3:
    return None
  try:
    value = plans.apply_op("mode", [[g.name(c) for c in g.nb(j, "category")] for j in bought])
  except plans.PlanError:
    return None
  t = g.name(i)
  return (f'Which category do most of the items frequently bought together with "{t}" belong to?',
          value,
          _plan([_act(f"Feature[Neighbor[Neighbor[Retrieve[{q(t)}], also_bought], category], "
                      "name]")], OP("mode", O(1))))


# ----------------------------------------------------------------------------------- biomedical
def _b_weight(g, c, r):
  n = g.name(c)
  return (f"What is the molecular weight of {n}?", g.feat(c, "molecular_weight"),
          _plan([_act(f"Feature[Retrieve[{q(n)}], molecular_weight]")], O(1)))


def _b_chromosome(g, x, r):
  n = g.name(x)
  return (f"On which chromosome is the gene {n} located?", g.feat(x, "chromosome"),
          _plan([_act(f"Feature[Retrieve[{q(n)}], chromosome]")], O(1)))


def _b_side_effect_count(g, c, r):
  n = g.name(c)
  return (f"How many side effects can {n} cause?", len(g.nb(c, "causes")),
          _plan([_act(f"Degree[Retrieve[{q(n)}], causes]")], O(1)))


def _b_treats(g, c, r):
  n = g.name(c)
  return (f"Which diseases does {n} treat?", [g.name(d) for d in g.nb(c, "treats")],
          _plan([_act(f"Feature[Neighbor[Retrieve[{q(n)}], treats], name]")], O(1)))


def _b_drug_genes(g, d, r):
  drugs = g.nb(d, "treated_by")
  if not drugs or not g.small(drugs):
    return None
  n = g.name(d)
  return (f"How many different genes are bound by the compounds that treat {n}?",
          plans.apply_op("count", [g.nb(c, "binds") for c in drugs]),
          _plan([_act(f"Neighbor[Neighbor[Retrieve[{q(n)}], treated_by], binds]")],
                OP("count", O(1))))


def _b_shared_genes(g, x, r):
  binders = g.nb(x, "bound_by")
  if len(binders) < 2:
    return None
  a, b = _two(r, binders)
  return _common_count(g, a, b, "binds", "How many genes are bound by both {a} and {b}?",
                       check_size=False)


def _b_heaviest(g, d, r):
  return _argmax_via(g, d, "treated_by", "molecular_weight", "name",
                     "Which of the compounds that treat {n} has the highest molecular weight?")


def _b_avg_weight(g, d, r):
  drugs = g.nb(d, "treated_by")
  if len(drugs) < 2 or not g.small(drugs):
    return None
  n = g.name(d)
  return (f"What is the average molecular weight of the compounds that treat {n}, rounded to two "
          "decimals?", plans.apply_op("mean2", [g.feat(c, "molecular_weight") for c in drugs]),
          _plan([_act(f"Feature[Neighbor[Retrieve[{q(n)}], treated_by], molecular_weight]")],
                OP("mean2", O(1))))


def _b_common_side_effect(g, d, r):
  drugs = g.nb(d, "treated_by")
  if len(drugs) < 2 or not g.small(drugs):
    return None
  try:
    value = plans.apply_op("mode", [[g.name(s) for s in g.nb(c, "causes")] for c in drugs])
  except plans.PlanError:
    return None
  n = g.name(d)
  return (f"Which side effect is caused by the largest number of compounds that treat {n}?", value,
          _plan([_act(f"Feature[Neighbor[Neighbor[Retrieve[{q(n)}], treated_by], causes], name]")],
                OP("mode", O(1))))


def _b_targeted(g, d, r):
  drugs = g.nb(d, "treated_by")
  genes = g.nb(d, "associated_gene")
  if not drugs or not g.small(drugs, genes):
    return None
  value = plans.apply_op("filter_any", [g.name(c) for c in drugs],
                         [g.nb(c, "binds") for c in drugs], genes)
  if not 1 <= len(value) <= 5:
    return None
  n = g.name(d)
  return (f"Which compounds that treat {n} also bind a gene associated with {n}?", value,
          _plan([_act(f"Feature[Neighbor[Retrieve[{q(n)}], treated_by], name]"),
                 _act(f"Neighbor[Neighbor[Retrieve[{q(n)}], treated_by], binds]"),
                 _act(f"Neighbor[Retrieve[{q(n)}], associated_gene]")],
                OP("filter_any", O(1), O(2), O(3))))


TEMPLATES: dict[str, tuple[Template, ...]] = {
    "academic": (
        Template("paper_year", "easy", "paper", _a_paper_year),
        Template("author_org", "easy", "author", _a_author_org),
        Template("author_paper_count", "easy", "author", _a_author_paper_count),
        Template("paper_authors", "easy", "paper", _a_paper_authors),
        Template("author_venues", "medium", "author", _a_author_venues),
        Template("coauthor_count", "medium", "author", _a_coauthor_count),
        Template("common_papers", "medium", "paper", _a_common_papers),
        Template("most_cited_paper", "medium", "author", _a_most_cited),
        Template("total_citations", "hard", "author", _a_total_citations),
        Template("top_venue", "hard", "author", _a_top_venue),
        Template("common_coauthors", "hard", "author", _a_common_coauthors),
    ),
    "ecommerce": (
        Template("item_price", "easy", "item", _e_price),
        Template("item_rating", "easy", "item", _e_rating),
        Template("brand_item_count", "easy", "brand", _e_brand_items),
        Template("item_brand", "easy", "item", _e_item_brand),
        Template("bought_with_brands", "medium", "item", _e_bought_brands),
        Template("common_bought", "medium", "item", _e_common_bought),
        Template("priciest_item", "medium", "brand", _e_priciest),
        Template("bought_with_categories", "medium", "item", _e_bought_categories),
        Template("brand_average_price", "hard", "brand", _e_brand_avg_price),
        Template("bought_with_top_category", "hard", "item", _e_bought_top_category),
    ),
    "biomedical": (
        Template("compound_weight", "easy", "compound", _b_weight),
        Template("gene_chromosome", "easy", "gene", _b_chromosome),
        Template("side_effect_count", "easy", "compound", _b_side_effect_count),
        Template("compound_treats", "easy", "compound", _b_treats),
        Template("treatment_gene_count", "medium", "disease", _b_drug_genes),
        Template("shared_genes", "medium", "gene", _b_shared_genes),
        Template("heaviest_treatment", "medium", "disease", _b_heaviest),
        Template("treatment_average_weight", "hard", "disease", _b_avg_weight),
        Template("common_side_effect", "hard", "disease", _b_common_side_effect),
        Template("targeted_treatments", "hard", "disease", _b_targeted),
    ),
}


def generate_questions(graph: graph_store.KnowledgeGraph, domain: str, *, seed: int = 0,
                       per_template: int = 5, max_tries: int = 5000) -> list[data_lib.GraphQuestion]:
  """Up to `per_template` questions per template of `domain`, deterministic in (graph, seed).

  Templates whose constraints no candidate meets within max_tries anchors yield fewer questions.
  """
  if domain not in TEMPLATES:
    raise errors.unknown_name("domain", domain, TEMPLATES)
  if per_template < 1:
    raise errors.ConfigError(f"per_template must be >= 1, got {per_template}")
  g = _G(graph)
  by_type: dict[str, list[str]] = {}
  for nid in graph.ids:
    by_type.setdefault(graph.node_type(nid), []).append(nid)
  out: list[data_lib.GraphQuestion] = []
  seen: set[str] = set()
  for t_idx, tpl in enumerate(TEMPLATES[domain]):
    rng = np.random.default_rng([seed, t_idx, 17])
    anchors = by_type.get(tpl.anchor, [])
    made = 0
    for k in rng.permutation(len(anchors))[:max_tries].tolist():
      built = tpl.build(g, anchors[k], rng)
      if built is None:
        continue
      question, value, plan = built
      if question in seen:
        continue
      seen.add(question)
      out.append(data_lib.GraphQuestion(
          qid=f"{domain}-{tpl.name}-{made}", question=question,
          answer=interpreter.format_answer(value), level=tpl.level, template=tpl.name, plan=plan))
      made += 1
      if made == per_template:
        break
  return out
