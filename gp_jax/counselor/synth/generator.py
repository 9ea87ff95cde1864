"""A deterministic generator of GRBench-format knowledge graphs and templated questions.

Three domains with different schemas (node types, features, neighbour types):

  academic:    author {name, organization} -paper-; paper {title, year, citations}
               -author, venue, reference, cited_by-; venue {name, kind} -paper-
  ecommerce:   item {title, price, rating} -brand, category, also_bought-; brand {name, country}
               -item-; category {name} -item-
  biomedical:  compound {name, molecular_weight} -treats, binds, causes-; disease {name}
               -treated_by, associated_gene-; gene {name, chromosome} -bound_by,
               associated_disease-; side_effect {name} -caused_by-

Node degrees follow heavy-tailed (Zipf-like) popularity, as in real bibliographic, product and
biomedical graphs. Every node's main text is unique in the graph. Everything is a function of
(domain, number of nodes, seed): the same arguments give byte-identical files. 100k nodes generate
in seconds (edges are sampled in bulk with numpy).
"""
from __future__ import annotations

import pathlib
from typing import Callable

import numpy as np

from gp_jax import errors
from gp_jax.counselor.kg import data as data_lib
from gp_jax.counselor.kg import graph_store
from gp_jax.counselor.kg import retrieval

SIZES = {"tiny": 150, "small": 1_000, "10k": 10_000, "100k": 100_000}
DOMAINS = ("academic", "ecommerce", "biomedical")

# ----------------------------------------------------------------------------------- vocabulary
_ONSETS = ("b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w",
           "z", "br", "ch", "cl", "dr", "fl", "gr", "kr", "pl", "sh", "st", "th", "tr")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ea", "ou", "ia", "o")
_CODAS = ("", "", "", "n", "r", "l", "s", "m", "nd", "rk")

_TITLE_ADJ = ("Scalable", "Robust", "Efficient", "Adaptive", "Sparse", "Distributed", "Federated",
              "Probabilistic", "Hierarchical", "Contrastive", "Interpretable", "Causal",
              "Differentiable", "Incremental", "Bayesian", "Quantum", "Neural", "Low-Rank",
              "Multi-Agent", "Self-Supervised", "Energy-Aware", "Secure", "Streaming",
              "Approximate", "Generative", "Online", "Parallel", "Temporal", "Private", "Fair")
_TITLE_NOUN = ("Inference", "Learning", "Retrieval", "Scheduling", "Routing", "Compression",
               "Verification", "Optimization", "Clustering", "Segmentation", "Planning",
               "Reasoning", "Indexing", "Caching", "Sampling", "Estimation", "Tracking",
               "Synthesis", "Localization", "Ranking")
_TITLE_OBJ = ("Knowledge Graphs", "Sensor Networks", "Language Models", "Image Collections",
              "Spatial Databases", "Edge Devices", "Protein Structures", "Social Networks",
              "Time Series", "Program Code", "Wireless Channels", "Medical Records",
              "Recommender Systems", "Point Clouds", "Road Networks", "Power Grids",
              "Question Answering", "Speech Signals", "Financial Markets", "Robot Swarms")
_TITLE_TECH = ("Attention", "Random Projections", "Message Passing", "Gradient Boosting",
               "Diffusion", "Kernel Methods", "Reinforcement Signals", "Hashing", "Transformers",
               "Spectral Methods", "Active Queries", "Weak Supervision", "Dynamic Programming",
               "Monte Carlo Search", "Convex Relaxations", "Curriculum Training", "Distillation",
               "Memory Networks", "Program Synthesis", "Symbolic Rules")
_ORG_KIND = ("University of {}", "{} Institute of Technology", "{} Research Laboratory",
             "{} College", "{} Polytechnic")

_PRODUCT_ADJ = ("Compact", "Wireless", "Ergonomic", "Waterproof", "Lightweight", "Foldable",
                "Stainless", "Portable", "Premium", "Classic", "Ultra-Slim", "Heavy-Duty",
                "Rechargeable", "Insulated", "Smart", "Mini")
_PRODUCT_NOUN = ("Blender", "Headphones", "Backpack", "Desk Lamp", "Water Bottle",
                 "Running Shoes", "Keyboard", "Coffee Grinder", "Yoga Mat", "Camera Bag",
                 "Phone Case", "Tent", "Rice Cooker", "Office Chair", "Smart Watch", "Frying Pan",
                 "Bike Helmet", "Sunglasses", "Power Bank", "Toothbrush", "Thermos", "Notebook",
                 "Drill", "Vacuum Cleaner", "Air Purifier")
_BRAND_SUFFIX = ("Labs", "Works", "Outfitters", "Home", "Gear", "Supply", "Goods", "Designs")
_COUNTRIES = ("Germany", "Japan", "United States", "Canada", "Sweden", "Italy", "South Korea",
              "Brazil", "India", "France", "Mexico", "Australia", "Spain", "Netherlands", "Kenya")
_CATEGORY = ("Kitchen Appliances", "Outdoor Gear", "Audio", "Office Furniture", "Fitness",
             "Travel Accessories", "Personal Care", "Home Lighting", "Computer Accessories",
             "Cookware", "Cycling", "Mobile Accessories", "Power Tools", "Cleaning",
             "Photography", "Stationery", "Eyewear", "Wearables", "Camping", "Air Quality")

_DRUG_SUFFIX = ("mab", "nib", "pril", "olol", "statin", "cillin", "azole", "vir", "tide", "parin",
                "sartan", "oxacin")
_SALTS = ("hydrochloride", "sodium", "acetate", "mesylate", "tartrate", "citrate", "sulfate",
          "phosphate")
_CONDITIONS = ("syndrome", "disease", "dystrophy", "fever", "anemia", "carcinoma", "neuropathy",
               "dermatitis", "myopathy", "encephalitis")
_GENE_FAMILY = ("kinase", "receptor", "transporter", "ligase", "channel", "factor", "protease",
                "synthase", "phosphatase", "regulator")
_CHROMOSOMES = tuple(str(i) for i in range(1, 23)) + ("X", "Y")
_SEVERITY = ("mild", "severe", "acute", "chronic", "transient", "recurrent")
_SYMPTOMS = ("nausea", "headache", "rash", "dizziness", "fatigue", "insomnia", "itching",
             "swelling", "cramps", "fever", "tremor", "blurred vision", "dry mouth", "hair loss",
             "weight gain", "palpitations", "cough", "joint pain", "anxiety", "constipation")
_SITES = ("", " of the skin", " of the liver", " of the stomach", " of the eyes", " of the joints",
          " of the lungs", " of the muscles", " of the scalp", " of the kidneys")


class _Draws:
  """Uniform draws taken from the generator in blocks (one numpy call per 64k draws, not per
  draw): the per-string choices below are made a few hundred thousand times for 100k nodes."""

  def __init__(self, rng: np.random.Generator):
    self.rng = rng
    self.buf = rng.random(1 << 16)
    self.i = 0

  def below(self, n: int) -> int:
    """An integer uniform in [0, n)."""
    if self.i == len(self.buf):
      self.buf = self.rng.random(1 << 16)
      self.i = 0
    u = self.buf[self.i]
    self.i += 1
    return min(int(u * n), n - 1)

  def pick(self, seq):
    return seq[self.below(len(seq))]


class _Names:
  """Draws strings that are unique (by normalised text) across the whole graph."""

  def __init__(self, rng: np.random.Generator):
    self.d = _Draws(rng)
    self.used: set[str] = set()

  def word(self, syllables: int) -> str:
    d = self.d
    parts = [d.pick(_ONSETS) + d.pick(_VOWELS) + d.pick(_CODAS) for _ in range(syllables)]
    return "".join(parts).capitalize()

  def draw(self, n: int, make: Callable[[], str]) -> list[str]:
    out = []
    misses = 0
    while len(out) < n:
      s = make()
      if misses > 50:  # the pattern space is nearly used up: disambiguate with a fresh word
        s = f"{s} {self.word(2)}"
      key = retrieval.normalize_text(s)
      if key in self.used:
        misses += 1
        continue
      misses = 0
      self.used.add(key)
      out.append(s)
    return out


def _popularity(r: np.random.Generator, n: int, exponent: float) -> np.ndarray:
  """Cumulative Zipf-like weights over n targets in random order (for searchsorted sampling)."""
  w = 1.0 / np.arange(1, n + 1) ** exponent
  w = w[r.permutation(n)]
  c = np.cumsum(w)
  return c / c[-1]


def _sample_links(r: np.random.Generator, n_src: int, n_dst: int, *, mean_extra: float,
                  base: int, cap: int, exponent: float) -> list[list[int]]:
  """For each source, base + Poisson(mean_extra) (<= cap) distinct popular targets."""
  k = np.minimum(base + r.poisson(mean_extra, n_src), cap)
  cdf = _popularity(r, n_dst, exponent)
  flat = np.searchsorted(cdf, r.random(int(k.sum())), side="right")
  flat = np.minimum(flat, n_dst - 1)
  out, pos = [], 0
  for kk in k.tolist():
    out.append(list(dict.fromkeys(flat[pos:pos + kk].tolist())))
    pos += kk
  return out


def _counts(n: int, shares: dict[str, float | None], mins: dict[str, int],
            caps: dict[str, int] | None = None) -> dict[str, int]:
  """Nodes per type: a share of n (at least min, at most cap); the type with share None gets
  the rest."""
  caps = caps or {}
  out = {t: max(mins[t], min(int(round(n * s)), caps.get(t, n)))
         for t, s in shares.items() if s is not None}
  rest = next(t for t, s in shares.items() if s is None)
  out[rest] = max(mins[rest], n - sum(out.values()))
  return out


def _node(features: dict, neighbors: dict) -> dict:
  return {"features": features, "neighbors": neighbors}


# ----------------------------------------------------------------------------------- domains
def _academic(n: int, r: np.random.Generator) -> dict:
  names = _Names(r)
  d = names.d
  c = _counts(n, {"venue": 0.01, "author": 0.4, "paper": None},
              {"venue": 3, "author": 8, "paper": 10}, {"venue": 1500})
  n_v, n_a, n_p = c["venue"], c["author"], c["paper"]
  firsts = [names.word(2) for _ in range(max(20, n_a // 4))]
  lasts = [names.word(2 + d.below(2)) for _ in range(max(20, n_a // 2))]
  places = [names.word(2) for _ in range(max(3, n_a // 20))]
  orgs = [d.pick(_ORG_KIND).format(p) for p in places]
  authors = names.draw(n_a, lambda: f"{d.pick(firsts)} {d.pick(lasts)}")

  def venue_name():
    form = d.below(4)
    if form == 0:
      return f"Journal of {d.pick(_TITLE_NOUN)} in {d.pick(_TITLE_OBJ)}"
    if form == 1:
      return f"International Conference on {d.pick(_TITLE_ADJ)} {d.pick(_TITLE_NOUN)}"
    if form == 2:
      return f"Workshop on {d.pick(_TITLE_ADJ)} {d.pick(_TITLE_OBJ)}"
    return f"Transactions on {d.pick(_TITLE_NOUN)} and {d.pick(_TITLE_NOUN)}"
  venues = names.draw(n_v, venue_name)

  def title():
    form = d.below(5)
    a, nn, o, t = (d.pick(_TITLE_ADJ), d.pick(_TITLE_NOUN), d.pick(_TITLE_OBJ),
                   d.pick(_TITLE_TECH))
    if form == 0:
      return f"{a} {nn} for {o}"
    if form == 1:
      return f"{a} {nn} of {o} with {t}"
    if form == 2:
      return f"Towards {a} {nn} in {o}"
    if form == 3:
      return f"On the {nn} of {o} under {t}"
    return f"{a} and {d.pick(_TITLE_ADJ)} {nn} for {o} via {t}"
  titles = names.draw(n_p, title)
  years = np.sort(r.integers(1995, 2025, n_p))  # paper i is never older than paper i-1
  citations = np.floor(r.lognormal(1.6, 1.3, n_p)).astype(int)
  paper_authors = _sample_links(r, n_p, n_a, mean_extra=1.6, base=1, cap=8, exponent=0.9)
  paper_venue = _sample_links(r, n_p, n_v, mean_extra=0.0, base=1, cap=1, exponent=1.0)
  refs: list[list[int]] = []
  n_refs = np.minimum(r.poisson(1.5, n_p), 5)
  u = r.random(int(n_refs.sum()))
  pos = 0
  for i, k in enumerate(n_refs.tolist()):
    cand = (u[pos:pos + k] * i).astype(int).tolist() if i > 0 else []
    refs.append(list(dict.fromkeys(cand)))
    pos += k
  a_ids = [f"a{i}" for i in range(n_a)]
  p_ids = [f"p{i}" for i in range(n_p)]
  v_ids = [f"v{i}" for i in range(n_v)]
  a_papers: list[list[str]] = [[] for _ in range(n_a)]
  v_papers: list[list[str]] = [[] for _ in range(n_v)]
  cited_by: list[list[str]] = [[] for _ in range(n_p)]
  for i in range(n_p):
    for a in paper_authors[i]:
      a_papers[a].append(p_ids[i])
    v_papers[paper_venue[i][0]].append(p_ids[i])
    for j in refs[i]:
      cited_by[j].append(p_ids[i])
  author_org = r.integers(len(orgs), size=n_a)
  kinds = {"Journal": "journal", "International": "conference", "Workshop": "workshop",
           "Transactions": "journal"}
  return {
      "author_nodes": {a_ids[i]: _node({"name": authors[i], "organization": orgs[author_org[i]]},
                                       {"paper": a_papers[i]}) for i in range(n_a)},
      "paper_nodes": {p_ids[i]: _node(
          {"title": titles[i], "year": int(years[i]), "citations": int(citations[i])},
          {"author": [a_ids[a] for a in paper_authors[i]], "venue": [v_ids[paper_venue[i][0]]],
           "reference": [p_ids[j] for j in refs[i]], "cited_by": cited_by[i]})
          for i in range(n_p)},
      "venue_nodes": {v_ids[i]: _node({"name": venues[i], "kind": kinds[venues[i].split()[0]]},
                                      {"paper": v_papers[i]}) for i in range(n_v)},
  }


def _ecommerce(n: int, r: np.random.Generator) -> dict:
  names = _Names(r)
  d = names.d
  c = _counts(n, {"category": 0.004, "brand": 0.17, "item": None},
              {"category": 4, "brand": 5, "item": 12})
  n_c, n_b, n_i = c["category"], c["brand"], c["item"]
  cats = names.draw(n_c, lambda: (d.pick(_CATEGORY) if d.below(2) == 0 else
                                  f"{d.pick(_PRODUCT_ADJ)} {d.pick(_CATEGORY)}"))
  brands = names.draw(n_b, lambda: f"{names.word(2 + d.below(2))} {d.pick(_BRAND_SUFFIX)}")
  titles = names.draw(n_i, lambda: (f"{d.pick(_PRODUCT_ADJ)} {d.pick(_PRODUCT_NOUN)} "
                                    f"{chr(65 + d.below(26))}{10 + d.below(990)}"))
  prices = np.round(np.exp(r.normal(3.3, 0.8, n_i)) + 0.99, 2)
  ratings = np.round(r.uniform(2.0, 5.0, n_i), 1)
  item_brand = _sample_links(r, n_i, n_b, mean_extra=0.0, base=1, cap=1, exponent=0.9)
  item_cat = _sample_links(r, n_i, n_c, mean_extra=0.0, base=1, cap=1, exponent=0.7)
  bought = _sample_links(r, n_i, n_i, mean_extra=1.0, base=0, cap=4, exponent=0.8)
  also: list[dict[int, None]] = [dict() for _ in range(n_i)]
  for i, js in enumerate(bought):
    for j in js:
      if j != i:
        also[i][j] = None
        also[j][i] = None
  i_ids = [f"i{k}" for k in range(n_i)]
  b_ids = [f"b{k}" for k in range(n_b)]
  c_ids = [f"c{k}" for k in range(n_c)]
  b_items: list[list[str]] = [[] for _ in range(n_b)]
  c_items: list[list[str]] = [[] for _ in range(n_c)]
  for k in range(n_i):
    b_items[item_brand[k][0]].append(i_ids[k])
    c_items[item_cat[k][0]].append(i_ids[k])
  country = r.integers(len(_COUNTRIES), size=n_b)
  return {
      "item_nodes": {i_ids[k]: _node(
          {"title": titles[k], "price": float(prices[k]), "rating": float(ratings[k])},
          {"brand": [b_ids[item_brand[k][0]]], "category": [c_ids[item_cat[k][0]]],
           "also_bought": [i_ids[j] for j in also[k]]}) for k in range(n_i)},
      "brand_nodes": {b_ids[k]: _node({"name": brands[k], "country": _COUNTRIES[country[k]]},
                                      {"item": b_items[k]}) for k in range(n_b)},
      "category_nodes": {c_ids[k]: _node({"name": cats[k]}, {"item": c_items[k]})
                         for k in range(n_c)},
  }


def _biomedical(n: int, r: np.random.Generator) -> dict:
  names = _Names(r)
  d = names.d
  c = _counts(n, {"side_effect": 0.1, "disease": 0.15, "compound": 0.35, "gene": None},
              {"side_effect": 6, "disease": 6, "compound": 10, "gene": 10},
              {"side_effect": 1800})
  n_s, n_d, n_c, n_g = c["side_effect"], c["disease"], c["compound"], c["gene"]
  compounds = names.draw(n_c, lambda: (f"{names.word(2 + d.below(2))}"
                                       f"{d.pick(_DRUG_SUFFIX)} {d.pick(_SALTS)}").capitalize())
  diseases = names.draw(n_d, lambda: f"{names.word(2 + d.below(2))} {d.pick(_CONDITIONS)}")

  def gene_name():
    letters = "".join(chr(65 + d.below(26)) for _ in range(3 + d.below(2)))
    return f"{letters}{1 + d.below(29)} {d.pick(_GENE_FAMILY)}"
  genes = names.draw(n_g, gene_name)
  effects = names.draw(n_s, lambda: (f"{d.pick(_SEVERITY)} {d.pick(_SYMPTOMS)}"
                                     f"{d.pick(_SITES)}").capitalize())
  weights = np.round(r.uniform(120.0, 900.0, n_c), 1)
  chrom = r.integers(len(_CHROMOSOMES), size=n_g)
  treats = _sample_links(r, n_c, n_d, mean_extra=0.8, base=1, cap=4, exponent=0.8)
  binds = _sample_links(r, n_c, n_g, mean_extra=1.5, base=1, cap=6, exponent=0.8)
  causes = _sample_links(r, n_c, n_s, mean_extra=2.0, base=0, cap=8, exponent=1.1)
  assoc = _sample_links(r, n_d, n_g, mean_extra=2.0, base=1, cap=8, exponent=0.8)
  c_ids = [f"C{k}" for k in range(n_c)]
  d_ids = [f"D{k}" for k in range(n_d)]
  g_ids = [f"G{k}" for k in range(n_g)]
  s_ids = [f"S{k}" for k in range(n_s)]
  treated_by = [[] for _ in range(n_d)]
  bound_by = [[] for _ in range(n_g)]
  caused_by = [[] for _ in range(n_s)]
  g_assoc = [[] for _ in range(n_g)]
  for k in range(n_c):
    for d in treats[k]:
      treated_by[d].append(c_ids[k])
    for g in binds[k]:
      bound_by[g].append(c_ids[k])
    for s in causes[k]:
      caused_by[s].append(c_ids[k])
  for d in range(n_d):
    for g in assoc[d]:
      g_assoc[g].append(d_ids[d])
  return {
      "compound_nodes": {c_ids[k]: _node(
          {"name": compounds[k], "molecular_weight": float(weights[k])},
          {"treats": [d_ids[d] for d in treats[k]], "binds": [g_ids[g] for g in binds[k]],
           "causes": [s_ids[s] for s in causes[k]]}) for k in range(n_c)},
      "disease_nodes": {d_ids[k]: _node(
          {"name": diseases[k]},
          {"treated_by": treated_by[k], "associated_gene": [g_ids[g] for g in assoc[k]]})
          for k in range(n_d)},
      "gene_nodes": {g_ids[k]: _node(
          {"name": genes[k], "chromosome": _CHROMOSOMES[chrom[k]]},
          {"bound_by": bound_by[k], "associated_disease": g_assoc[k]}) for k in range(n_g)},
      "side_effect_nodes": {s_ids[k]: _node({"name": effects[k]}, {"caused_by": caused_by[k]})
                            for k in range(n_s)},
  }


_BUILDERS = {"academic": _academic, "ecommerce": _ecommerce, "biomedical": _biomedical}


def parse_size(size: str | int) -> int:
  """A size name (tiny, small, 10k, 100k) or a node count >= 40."""
  if isinstance(size, str) and size in SIZES:
    return SIZES[size]
  try:
    n = int(size)
  except (TypeError, ValueError):
    raise errors.unknown_name("graph size", str(size), list(SIZES) + ["<number of nodes>"]) from None
  if n < 40 or n > 5_000_000:
    raise errors.ConfigError(f"graph size must be between 40 and 5000000 nodes, got {n}")
  return n


def generate_graph(domain: str, size: str | int = "tiny", seed: int = 0) -> graph_store.KnowledgeGraph:
  """A GRBench-format graph of about `size` nodes (exact for all but the smallest sizes).

  Args:
    domain: 'academic', 'ecommerce' or 'biomedical'.
    size: a SIZES name or a node count.
    seed: PRNG seed; the graph is a pure function of (domain, size, seed).
  """
  if domain not in _BUILDERS:
    raise errors.unknown_name("domain", domain, _BUILDERS)
  n = parse_size(size)
  rng = np.random.default_rng([seed, DOMAINS.index(domain), n])
  raw = _BUILDERS[domain](n, rng)
  return graph_store.from_json_dict(raw, name=f"generated:{domain}:{n}:{seed}")


def generate_dataset(domain: str, size: str | int = "tiny", seed: int = 0, per_template: int = 5
                     ) -> tuple[graph_store.KnowledgeGraph, list[data_lib.GraphQuestion]]:
  """A generated graph and its templated questions (gold answers and plans from the graph)."""
  from gp_jax.counselor.synth import templates  # the templates read graphs this module builds
  graph = generate_graph(domain, size, seed)
  return graph, templates.generate_questions(graph, domain, seed=seed, per_template=per_template)


def write_dataset(out_dir: str | pathlib.Path, graph: graph_store.KnowledgeGraph,
                  questions: list[data_lib.GraphQuestion]) -> tuple[pathlib.Path, pathlib.Path]:
  """Writes graph.json and questions.jsonl into out_dir (each file atomically)."""
  out_dir = pathlib.Path(out_dir)
  g = graph_store.save_graph(graph, out_dir / "graph.json")
  q = data_lib.save_questions(questions, out_dir / "questions.jsonl")
  return g, q
