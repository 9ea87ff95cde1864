r"""The simulated LLM pool: the embedded default backend (no network, no weights).

Every backbone m has, per domain d, a skill theta[m, d] = logit(published accuracy) (data/simulator.json
keeps the source of each number), a verbosity v_m, and qualities derived from its general competence
g_m = mean_d theta[m, d]:
  planning    pi_m  = 0.3 + 0.4 g_m          (hardness removed from the sub-questions it writes)
  summarising rho_m = sigmoid(2.5 + 0.8 g_m)  (chance to condense correct sub-answers correctly)
  final       phi_m = sigmoid(3.0 + 0.8 g_m)  (chance to restate a correct draft correctly)
  thinking    tau_m = 0.3 + 0.4 g_m          (hardness removed for the executor reading its notes)
  verifying   r_m   = 0.25 + 0.2 sigmoid(g_m) (chance to repair each wrong sub-answer)
Every query node has a domain d, a latent hardness h (root: h ~ N(task offset, 0.9^2)) and a
complexity k in {1..4} (number of steps). The text shows k exactly ("a three-step ...") and h only
through a noisy difficulty word (h + N(0, 0.35^2), binned). The outcome model:
  Executor m on node (h, k), with optional notes of thinker t:
      P(correct) = sigmoid(theta[m, d] - h - gamma (k - 1) + tau_t),   gamma = 1.2
  Planner m on node (h, k): w = min(k, max_width) sub-questions (Phase 1: exactly the width asked),
      the k steps split as evenly as possible (at least one each), hardness
      h_i = h - pi_m + 0.6 + eps_i,  eps_i ~ N(0, 0.3^2) fixed per (node, planner, i).
  Verifier r on a planned node: each wrong sub-answer is repaired with probability r_r.
  Summarizer s on a planned node: correct with probability rho_s * (fraction of correct sub-answers).
  Final executor f at the root: correct with probability phi_f if the draft summary is correct, else 0.
Hence P(node correct) is affine in its children's probabilities,
  P(planned node) = rho_s * (r_v + (1 - r_v) * mean_i P(child_i)),  P(final) = phi_f * P(root summary),
so the expected utility of a workflow factorises over the tree and the exact optimum of
E[U] - alpha * E[C] is computed by dynamic programming (gp_jax/sim/optimal.py).
Token usage: input tokens are counted on the actual messages (each whitespace-separated word costs
ceil(len/4) tokens, so counts add up over concatenation); output tokens are
  executor  base[d] * v_m * (1 + 0.4 (k - 1)) * j,  summarizer 60 v_m j,  final 30 v_m j,
  thinker 110 v_m j,  planner/verifier = the tokens of the lines they write,
with a fixed jitter j in [0.85, 1.15] per (node, LLM, role). Texts never reveal correctness: a wrong
answer is a different number of the same length. Sampling is deterministic given the messages and
SamplingParams.seed, so runs replay exactly.
The pool knows a call only from its messages: it reads them back by the markers of the prompt
contract (gp_jax/workflow/prompts.py, which documents it), and its outputs end with "Answer:
<value>", the answer format the simulated tasks ask for.
Sub-question texts are unique by construction: each one ends with a tag derived from its key,
" (ref <12 hex digits>)", so a text is a function of its key alone and no run depends on what the
process simulated before. SimWorld(unique_texts=False) (config data.sim_unique_texts=False) drops
the tag; two different sub-questions can then get the same text (1 or 2 pairs among the 7,600 to
9,100 nodes of one Router-R1-style training on the sweep's 3,000 training queries), and the one
registered second in the process is renamed "<text> (variant 2)". Which one is renamed then
depends on the order of simulation, so the same cell run alone, after other cells in one process,
or resumed in a new process could come out differently (docs/simulator.md).
The v2 world (gp_jax/sim/world.py, config sim.world = v2, SimWorld(params=...)) adds a noisy step
cue, latent query clusters with per (cluster, LLM) executor skill offsets, and the calibrated
values of gamma, the split penalty, the summary/final shifts, the complexity mix, verbosity and
per-LLM skill shifts; SimWorld(params=None) is the world above, bit for bit.
Pool events (gp_jax/sim/events.py, config data.sim_events): from root query t of a followed
split on, an LLM's executor skill shifts, its prices scale, it fails (every call returns an error),
or it joins (absent before t). SimWorld.exec_probability and SimulatorPool.chat ask the events;
without events nothing of the above changes.
Served queries: a router server adopts every request's text as a query (SimWorld.adopt_query).
The world keeps the latents of at most SERVED_QUERIES adopted queries with their sub-questions,
thinker notes and cached token counts, the least recently used query going first, so a stream of
unique requests holds bounded memory; it keeps an adopted text's digest, not the text. Queries it
samples itself (training, evaluation, canaries) are never evicted.
"""
from __future__ import annotations

import collections
import copy
import dataclasses
import hashlib
import json
import math
import pathlib
import re
from typing import Sequence

import numpy as np

from gp_jax import errors
from gp_jax import paths
from gp_jax.llm import base
from gp_jax.llm import catalog as catalog_lib
from gp_jax.sim import events as sim_events
from gp_jax.sim import world as world_lib
from gp_jax.types import Query
from gp_jax.workflow import prompts
from gp_jax.workflow import roles as roles_lib

SIM_FILE = paths.DATA_DIR / "simulator.json"
SIM_METRIC = "sim_exact"
GAMMA = 1.2            # logit penalty per extra reasoning step answered in one go
SPLIT_PENALTY = 0.6    # context lost by a sub-question
CHILD_NOISE = 0.3
HARDNESS_SD = 0.9
OBS_NOISE = 0.35
COMPLEXITY_PROBS = (0.4, 0.25, 0.2, 0.15)   # k = 1..4
EXEC_BASE_TOKENS = {"math": 170, "code": 200, "commonsense": 50, "world_knowledge": 35,
                    "knowledge_reasoning": 80}
SUMMARY_TOKENS, FINAL_TOKENS, THINK_TOKENS = 60, 30, 110

# Simulated tasks: name -> (domain, how the text names it, hardness offset, seen in training).
TASKS = {
    "gsm8k": ("math", "Grade-school math word problem", -0.3, True),
    "math": ("math", "Competition mathematics problem", 0.6, True),
    "mbpp": ("code", "Python programming exercise", -0.1, True),
    "human_eval": ("code", "Python function completion", 0.2, True),
    "commonsense_qa": ("commonsense", "Everyday commonsense question", -0.2, True),
    "arc_challenge": ("commonsense", "Grade-school science question", 0.2, True),
    "openbook_qa": ("commonsense", "Open-book science fact question", 0.0, True),
    "natural_qa": ("world_knowledge", "Open-domain factual question", 0.2, True),
    "trivia_qa": ("world_knowledge", "Trivia question", -0.2, True),
    "mmlu": ("knowledge_reasoning", "Multi-subject exam question", -0.2, True),
    "gpqa": ("knowledge_reasoning", "Graduate-level science question", 1.0, True),
    "agentverse-mgsm": ("math", "Multilingual grade-school math problem", 0.2, False),
    "agentverse-logicgrid": ("knowledge_reasoning", "Logic grid puzzle", 0.8, False),
    "commongen": ("commonsense", "Concept-to-sentence writing task", -0.3, False),
}
SEEN_TASKS = [t for t, v in TASKS.items() if v[3]]
UNSEEN_TASKS = [t for t, v in TASKS.items() if not v[3]]
_K_WORDS = {1: "single", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six"}
_DIFF_WORDS = ((-1.0, "routine"), (-0.3, "standard"), (0.4, "moderate"), (1.1, "tricky"),
               (math.inf, "hard"))
_VOCAB = {
    "math": "ratio sum product fraction area perimeter speed price discount interest angle "
            "triangle sequence remainder average volume".split(),
    "code": "list string dictionary loop index sort filter tuple integer matrix recursion "
            "prefix suffix parser counter".split(),
    "commonsense": "kitchen weather plant animal tool habit season school market river "
                   "clothing sport garden travel".split(),
    "world_knowledge": "capital river novel painter treaty empire film album mountain "
                       "inventor island election".split(),
    "knowledge_reasoning": "enzyme theorem statute market orbit protein circuit dynasty "
                           "reaction genome contract lens".split(),
}
_VERBS = "find compute compare explain identify determine estimate check derive list".split()
_FILLER = "so we use the rule and get then add this step next with that fact from each part".split()


SERVED_QUERIES = 4096   # adopted queries a world keeps (with their sub-questions), LRU
ADOPTED = "adopted-"    # key prefix of an adopted query; its sub-questions' keys start with its key


def count_tokens(text: str) -> int:
  """Simulated tokenizer: each whitespace-separated word costs ceil(len/4) tokens (additive)."""
  return sum(-(-len(w) // 4) for w in text.split())


def _rng(*keys) -> np.random.Generator:
  digest = hashlib.blake2b(repr(keys).encode(), digest_size=8).digest()
  return np.random.default_rng(int.from_bytes(digest, "little"))


def _uniform(*keys) -> float:
  """A fixed uniform [0, 1) number per key tuple (cheaper than building a Generator)."""
  digest = hashlib.blake2b(repr(keys).encode(), digest_size=8).digest()
  return int.from_bytes(digest, "little") / 2.0 ** 64


def _sigmoid(x):
  return 1.0 / (1.0 + np.exp(-x))


def _logit(p):
  return math.log(p / (1.0 - p))


def difficulty_word(h_observed: float) -> str:
  for bound, word in _DIFF_WORDS:
    if h_observed < bound:
      return word
  return _DIFF_WORDS[-1][1]


def split_complexity(k: int, w: int) -> list[int]:
  """k steps over w sub-questions, as even as possible, larger first, at least one each."""
  base_, extra = divmod(k, w)
  return [max(1, base_ + (1 if i < extra else 0)) for i in range(w)]


@dataclasses.dataclass(frozen=True)
class LLMProfile:
  name: str
  theta: dict            # domain -> logit skill
  verbosity: float
  price_in: float
  price_out: float
  summary_shift: float = 0.0   # v2 world (world.py): logit added to the summary quality
  final_shift: float = 0.0     # v2 world: logit added to the final-answer quality

  @property
  def competence(self) -> float:
    return float(np.mean(list(self.theta.values())))

  @property
  def plan_quality(self) -> float:
    return 0.3 + 0.4 * self.competence

  @property
  def summary_quality(self) -> float:
    return float(_sigmoid(2.5 + self.summary_shift + 0.8 * self.competence))

  @property
  def final_quality(self) -> float:
    return float(_sigmoid(3.0 + self.final_shift + 0.8 * self.competence))

  @property
  def think_quality(self) -> float:
    return 0.3 + 0.4 * self.competence

  @property
  def verify_quality(self) -> float:
    return 0.25 + 0.2 * float(_sigmoid(self.competence))


@dataclasses.dataclass(frozen=True)
class NodeInfo:
  """Latent facts of one simulated query node."""
  key: str
  task: str
  domain: str
  hardness: float
  complexity: int
  gold: str
  text: str
  cluster: int = -1     # v2 world: the latent cluster of its domain (-1 in v1)


def load_profiles(catalog: catalog_lib.Catalog, path=SIM_FILE) -> dict[str, LLMProfile]:
  raw = json.loads(pathlib.Path(path).read_text())
  profiles = {}
  for spec in catalog.llms:
    if spec.name not in raw["llms"]:
      raise errors.ConfigError(f"the simulator has no calibration for LLM {spec.name!r} "
                               f"(add it to {path})")
    entry = raw["llms"][spec.name]
    theta = {d: _logit(acc / 100.0) for d, (acc, _src) in entry["skill"].items()}
    profiles[spec.name] = LLMProfile(spec.name, theta, float(entry["verbosity"]),
                                     spec.price_in, spec.price_out)
  return profiles


def _digest(text: str) -> bytes:
  return hashlib.blake2b(text.encode(), digest_size=16).digest()


class _ServedTree:
  """What a world holds for one adopted query, dropped together when it is evicted: the digests
  of its nodes' texts, and the keys of its thinker notes and cache entries."""
  __slots__ = ("digests", "thoughts", "children", "tokens")

  def __init__(self):
    self.digests, self.thoughts, self.children, self.tokens = [], [], [], []


class SimWorld:
  """The simulated queries and every sub-question texts generated from them (latents registry)."""

  def __init__(self, profiles: dict[str, LLMProfile], unique_texts: bool = True,
               events: sim_events.PoolEvents | None = None,
               params: world_lib.WorldParams | None = None):
    """unique_texts: end each sub-question's text with its key's digest (module docstring).
    events: pool events (gp_jax/sim/events.py); None or empty: the pool never changes.
    params: the v2 world's parameters (gp_jax/sim/world.py); None: the v1 world."""
    self.params = params
    if params is not None:
      profiles = {n: dataclasses.replace(
          p, theta={d: t + params.shift_of(n) for d, t in p.theta.items()},
          verbosity=p.verbosity * params.verbosity_scale, summary_shift=params.summary_shift,
          final_shift=params.final_shift) for n, p in profiles.items()}
      self._complexity_probs = params.complexity_probs
    else:
      self._complexity_probs = COMPLEXITY_PROBS
    self._offsets: dict[str, dict[str, np.ndarray]] = {}
    self._themes: dict[str, list[tuple[str, str]]] = {}
    self.profiles = profiles
    self.unique_texts = unique_texts
    self.events = events or None
    self.nodes: dict[str, NodeInfo] = {}      # text -> latents
    self.thoughts: dict[str, float] = {}     # thinker notes text -> tau
    self._children_cache: dict[tuple, list[NodeInfo]] = {}
    self._tokens_cache: dict[tuple, int] = {}
    # Adopted queries (module docstring, Served queries): root key -> its tree, least recently
    # used first; a node of one by the digest of its text (its NodeInfo kept without the text).
    self.served_capacity = SERVED_QUERIES
    self._served: collections.OrderedDict[str, _ServedTree] = collections.OrderedDict()
    self._served_nodes: dict[bytes, NodeInfo] = {}

  def with_events(self, events: sim_events.PoolEvents | None) -> "SimWorld":
    """The same world under other pool events: it shares this one's registry of texts and its
    caches (neither depends on the events), so a text either knows is known to both."""
    other = copy.copy(self)
    other.events = events or None
    return other

  # ---- queries -------------------------------------------------------------------------------
  def sample_queries(self, n: int, *, seed: int, split: str, tasks: Sequence[str] = SEEN_TASKS
                     ) -> list[Query]:
    """n simulated queries, deterministic in (seed, split)."""
    for t in tasks:
      if t not in TASKS:
        raise errors.unknown_name("simulated task", t, TASKS)
    rng = _rng("queries", seed, split)
    out = []
    for i in range(n):
      task = tasks[int(rng.integers(len(tasks)))]
      domain, phrase, offset, _ = TASKS[task]
      h = float(rng.normal(self._hardness_offset(offset, domain), HARDNESS_SD))
      k = int(rng.choice(np.arange(1, 5), p=self._complexity_probs))
      key = f"{split}-{seed}-{i}"
      cluster = self.cluster_of(key, domain)
      text = self._query_text(rng, phrase, domain, h, k, "question", key, cluster)
      gold = str(int(rng.integers(1000, 10000)))
      info = self._register(NodeInfo(key, task, domain, h, k, gold, text, cluster))
      out.append(Query(qid=key, task_name=task, domain=domain, query=info.text, ground_truth=gold,
                       metric=SIM_METRIC, split=split,
                       meta={"hardness": h, "complexity": k}))
    return out

  def adopt_query(self, text: str, task: str) -> NodeInfo:
    """The node of a query text from outside the simulator (a request to the router server).

    A text the world already knows keeps its latents; a new one gets latents drawn like
    `sample_queries` draws them (hardness around the task's offset, complexity, gold answer),
    seeded by the text and task, so the same request always meets the same simulated query.
    `text` must be one line (the prompts show the question on one line). The world keeps at most
    `served_capacity` adopted queries (module docstring, Served queries)."""
    known = self.lookup(text)
    if known is not None:
      return known
    if task not in TASKS:
      raise errors.unknown_name("simulated task", task, TASKS)
    domain, _, offset, _ = TASKS[task]
    rng = _rng("adopted", text, task)
    h = float(rng.normal(self._hardness_offset(offset, domain), HARDNESS_SD))
    k = int(rng.choice(np.arange(1, 5), p=self._complexity_probs))
    gold = str(int(rng.integers(1000, 10000)))
    key = ADOPTED + hashlib.blake2b(repr((text, task)).encode(), digest_size=8).hexdigest()
    return self._register(NodeInfo(key, task, domain, h, k, gold, text.strip(),
                                   self.cluster_of(key, domain)))

  # ---- v2 world (gp_jax/sim/world.py) ------------------------------------------------------
  def _hardness_offset(self, offset: float, domain: str) -> float:
    """A task's mean root hardness: TASKS' offset, plus the v2 world's domain shift."""
    return offset if self.params is None else offset + self.params.hardness_of(domain)

  def cluster_of(self, key: str, domain: str) -> int:
    """The latent cluster of a root query (fixed per key); -1 in the v1 world."""
    if self.params is None:
      return -1
    return int(_uniform("cluster", key) * self.params.clusters_per_domain)

  def shown_steps(self, key: str, k: int) -> int:
    """The step count a node's text states: k in v1, a noisy cue of k in v2."""
    if self.params is None or self.params.step_cue_sd == 0:
      return k
    noisy = k + self.params.step_cue_sd * float(_rng("cue", key).standard_normal())
    return int(min(world_lib.MAX_SHOWN_STEPS, max(1, round(noisy))))

  def theme(self, domain: str, cluster: int) -> tuple[str, str]:
    if domain not in self._themes:
      self._themes[domain] = world_lib.themes(_VOCAB[domain], domain,
                                              self.params.clusters_per_domain, _rng)
    return self._themes[domain][cluster]

  def cluster_offset(self, domain: str, cluster: int, llm: str) -> float:
    """delta[d, c, m] of the v2 world (0 in v1 or without a cluster)."""
    if self.params is None or cluster < 0:
      return 0.0
    if domain not in self._offsets:
      self._offsets[domain] = world_lib.cluster_offsets(domain, sorted(self.profiles),
                                                        self.params, _rng)
    return float(self._offsets[domain][llm][cluster])

  def _query_text(self, rng, phrase, domain, h, k, noun, key="", cluster=-1) -> str:
    word = difficulty_word(h + float(rng.normal(0.0, OBS_NOISE)))
    vocab = _VOCAB[domain]
    topic = " and ".join(rng.choice(vocab, size=2, replace=False))
    if cluster >= 0:   # v2: the cluster's theme (drawn words above keep the stream as in v1)
      topic = " and ".join(self.theme(domain, cluster))
    steps = []
    for _ in range(k):
      a, b = rng.choice(vocab, size=2, replace=False)
      steps.append(f"{rng.choice(_VERBS)} the {a} of the {b}")
    shown = self.shown_steps(key, k)
    if shown != k:   # v2: the text lists the cued count (extra steps from the node's own stream,
      extra = _rng("cue-steps", key)    # so the latents drawn after the text stay as in v1)
      while len(steps) < shown:
        a, b = extra.choice(vocab, size=2, replace=False)
        steps.append(f"{extra.choice(_VERBS)} the {a} of the {b}")
      steps = steps[:shown]
    kword = _K_WORDS.get(shown, str(shown))
    return f"{phrase}: a {word} {kword}-step {noun} about {topic}: " + ", then ".join(steps) + "."

  def _register(self, info: NodeInfo) -> NodeInfo:
    # Colliding texts are renamed in registration order (only untagged texts collide: see the
    # module docstring).
    tree = self._tree_of(info.key)
    text = info.text
    n = 1
    if tree is None:
      while text in self.nodes and self.nodes[text].key != info.key:
        n += 1
        text = f"{info.text} (variant {n})"
      info = dataclasses.replace(info, text=text)
      self.nodes[text] = info
      return info
    while (known := self.lookup(text)) is not None and known.key != info.key:
      n += 1
      text = f"{info.text} (variant {n})"
    info = dataclasses.replace(info, text=text)
    digest = _digest(text)
    self._served_nodes[digest] = dataclasses.replace(info, text="")
    tree.digests.append(digest)
    return info

  def lookup(self, text: str) -> NodeInfo | None:
    text = text.strip()
    info = self.nodes.get(text)
    if info is not None or not self._served_nodes:
      return info
    info = self._served_nodes.get(_digest(text))
    if info is None:
      return None
    root = info.key.split("/", 1)[0]
    if root in self._served:   # the query is in use: kept longest
      self._served.move_to_end(root)
    return dataclasses.replace(info, text=text)

  # ---- adopted queries, bounded (module docstring, Served queries) ---------------------------
  def _tree_of(self, key: str) -> _ServedTree | None:
    """The tree of the adopted query that node `key` belongs to (made, as the most recently
    used, when it has none); None for a node of the world's own queries."""
    if not key.startswith(ADOPTED):
      return None
    root = key.split("/", 1)[0]
    tree = self._served.get(root)
    if tree is None:
      tree = self._served[root] = _ServedTree()
      while len(self._served) > self.served_capacity:
        self._evict(self._served.popitem(last=False)[1])
    return tree

  def _evict(self, tree: _ServedTree) -> None:
    for d in tree.digests:
      self._served_nodes.pop(d, None)
    for t in tree.thoughts:
      self.thoughts.pop(t, None)
    for k in tree.children:
      self._children_cache.pop(k, None)
    for k in tree.tokens:
      self._tokens_cache.pop(k, None)

  @property
  def served_queries(self) -> int:
    """Adopted queries the world holds now (at most served_capacity)."""
    return len(self._served)

  def note_thought(self, node: NodeInfo, text: str, tau: float) -> None:
    """A thinker's notes on `node`, which raise an executor's chances by `tau` when it reads
    them."""
    tree = self._tree_of(node.key)
    if tree is not None and text not in self.thoughts:
      tree.thoughts.append(text)
    self.thoughts[text] = tau

  # ---- deterministic pieces shared by the pool and the optimum -----------------------------
  def children(self, node: NodeInfo, planner: str, width: int, exact: bool) -> list[NodeInfo]:
    """The sub-questions planner `planner` writes for `node` (deterministic)."""
    cache_key = (node.key, planner, width, exact)
    if cache_key in self._children_cache:
      return self._children_cache[cache_key]
    w = width if exact else min(node.complexity, width)
    ks = split_complexity(node.complexity, w)
    prof = self.profiles[planner]
    rng = _rng("children", node.key, planner, width, exact)
    phrase = TASKS[node.task][1]
    kids = []
    for i, kc in enumerate(ks):
      split_penalty = SPLIT_PENALTY if self.params is None else self.params.split_penalty
      h = node.hardness - prof.plan_quality + split_penalty + float(rng.normal(0.0, CHILD_NOISE))
      key = f"{node.key}/{planner}/{width}{'x' if exact else ''}/{i}"
      text = self._query_text(rng, phrase, node.domain, h, kc, "sub-question", key, node.cluster)
      gold = str(int(rng.integers(1000, 10000)))
      if self.unique_texts:
        text = f"{text} (ref {hashlib.blake2b(key.encode(), digest_size=6).hexdigest()})"
      kids.append(self._register(NodeInfo(key, node.task, node.domain, h, kc, gold, text,
                                          node.cluster)))
    self._children_cache[cache_key] = kids
    tree = self._tree_of(node.key)
    if tree is not None:
      tree.children.append(cache_key)
    return kids

  def jitter(self, node_key: str, llm: str, role: str) -> float:
    return 0.85 + 0.3 * _uniform("jitter", node_key, llm, role)

  def output_tokens(self, kind: str, node: NodeInfo, llm: str, final: bool = False) -> int:
    key = (kind, node.key, llm, final)
    if key not in self._tokens_cache:
      self._tokens_cache[key] = self._output_tokens(kind, node, llm, final)
      tree = self._tree_of(node.key)
      if tree is not None:
        tree.tokens.append(key)
    return self._tokens_cache[key]

  def _output_tokens(self, kind: str, node: NodeInfo, llm: str, final: bool) -> int:
    v = self.profiles[llm].verbosity
    j = self.jitter(node.key, llm, kind + ("-final" if final else ""))
    if kind == "executor":
      base_ = FINAL_TOKENS if final else EXEC_BASE_TOKENS[node.domain] * (1 + 0.4 * (node.complexity - 1))
    elif kind == "summarizer":
      base_ = SUMMARY_TOKENS
    elif kind == "thinker":
      base_ = THINK_TOKENS
    else:
      raise ValueError(kind)
    return max(4, int(round(base_ * v * j)))

  def exec_probability(self, node: NodeInfo, llm: str, tau: float = 0.0) -> float:
    theta = self.profiles[llm].theta[node.domain]
    gamma = GAMMA
    if self.params is not None:   # v2: the cluster's offset, the fitted step penalty
      theta = theta + self.cluster_offset(node.domain, node.cluster, llm)
      gamma = self.params.gamma
    if self.events is not None:
      theta = theta + self.events.skill_shift(llm, node.key, node.domain, node.task)
    return float(_sigmoid(theta - node.hardness - gamma * (node.complexity - 1) + tau))


def answer_line(value: str) -> str:
  return f"Answer: {value}"


def extract_answer(text: str) -> str | None:
  """The value after the last 'Answer:' in a simulated output."""
  found = re.findall(r"Answer:\s*(\S+)", text)
  return found[-1].rstrip(".") if found else None


def sim_score(prediction: str | None, query: Query) -> float:
  """Metric of simulated tasks: exact match of the final 'Answer:' value."""
  if not prediction:
    return 0.0
  return float(extract_answer(prediction) == query.ground_truth)


def _distractor(rng, gold: str) -> str:
  while True:
    v = str(int(rng.integers(10 ** (len(gold) - 1), 10 ** len(gold))))
    if v != gold:
      return v


def _filler(rng, n_tokens: int) -> str:
  return " ".join(rng.choice(_FILLER, size=max(0, n_tokens)))


# The planner's width in its system message (prompts.PLANNER_WIDTH with the {width_rule} and
# {max_width} it was rendered with).
_WIDTH_RULE = f"({re.escape(prompts.AT_MOST)}|{re.escape(prompts.EXACTLY)})"
_WIDTH_RE = re.compile(re.escape(prompts.PLANNER_WIDTH)
                       .replace(re.escape("{width_rule}"), _WIDTH_RULE)
                       .replace(re.escape("{max_width}"), r"(\d+)"))


@dataclasses.dataclass(frozen=True)
class Reading:
  """What the simulated pool reads from one call's messages (the prompt contract,
  gp_jax/workflow/prompts.py)."""
  kind: str | None                    # None: no role's system prefix starts the system message
  question: str                       # the node's text ("" when its line is missing)
  width: int = 3                      # planner: the sub-questions asked for (3 if not stated) ...
  exact: bool = False                 # ... exactly that many (Phase 1) or at most
  draft: str | None = None            # executor: the draft line of a final answer, or None
  notes: str | None = None            # executor: the thinker's notes, or None
  children: tuple[tuple[str, str], ...] = ()   # summarizer, verifier: (sub-question, answer)


class SimulatorPool(base.LLMPool):
  """LLMPool backed by SimWorld. Reads each call back from its messages alone (`read`): the role's
  kind from the system message, the node and the context from the user message, by the markers of
  the prompt contract (gp_jax/workflow/prompts.py); a message it cannot read gets an
  'unrecognised_prompt' error."""

  def __init__(self, catalog: catalog_lib.Catalog, roles: roles_lib.RoleSet, world: SimWorld):
    super().__init__(catalog)
    for name in catalog.names:
      if name not in world.profiles:
        raise errors.ConfigError(f"simulator has no profile for {name!r}")
    self.world = world
    self._prefixes = [(prompts.system_prefix(r), r.kind) for r in roles.roles]
    self.calls = 0

  def _kind(self, system: str) -> str | None:
    for prefix, kind in self._prefixes:
      if system.startswith(prefix):
        return kind
    return None

  def read(self, messages: list[dict]) -> Reading:
    """The kind, node text and context of one call, read from its messages."""
    system = next((m["content"] for m in messages if m["role"] == "system"), "")
    user = next((m["content"] for m in messages if m["role"] == "user"), "")
    kind = self._kind(system)
    lines = user.splitlines()
    if kind in prompts.CHILDREN_KINDS:
      question = next((l[len(prompts.MAIN_QUESTION):] for l in lines
                       if l.startswith(prompts.MAIN_QUESTION)), "")
      return Reading(kind, question, children=tuple(_children_pairs(lines)))
    question = next((l[len(prompts.QUESTION):] for l in reversed(lines)
                     if l.startswith(prompts.QUESTION)), "")
    if kind == "planner":
      m = _WIDTH_RE.search(system)
      width, exact = (int(m.group(2)), m.group(1) == prompts.EXACTLY) if m else (3, False)
      return Reading(kind, question, width=width, exact=exact)
    if kind == "executor":
      draft = next((l for l in lines if l.startswith(prompts.DRAFT)), None)
      notes = next((l[len(prompts.NOTES):] for l in lines if l.startswith(prompts.NOTES)), None)
      return Reading(kind, question, draft=draft, notes=notes)
    return Reading(kind, question)

  async def chat(self, model, messages, params=base.SamplingParams()):
    self.catalog[model]  # unknown model names are a configuration error
    self.calls += 1
    in_tokens = sum(count_tokens(m["content"]) for m in messages)
    reading = self.read(messages)
    node = self.world.lookup(reading.question)
    if reading.kind is None or node is None:
      return base.failed(model, "unrecognised_prompt", input_tokens=in_tokens)
    events = self.world.events
    if events is not None:   # pool events at this node's root query (events.py)
      if events.absent(model, node.key):
        return base.failed(model, "not_in_pool", input_tokens=in_tokens)
      if events.failed(model, node.key):
        return base.failed(model, "unavailable", input_tokens=in_tokens)
    msg_digest = hashlib.blake2b(repr(messages).encode(), digest_size=8).hexdigest()
    rng = _rng("call", model, msg_digest, params.seed)
    text = self._respond(reading, node, model, rng)
    if text is None:
      return base.failed(model, "unrecognised_prompt", input_tokens=in_tokens)
    out_tokens = count_tokens(text)
    cost = self.catalog.cost_usd(model, in_tokens, out_tokens)
    if events is not None:
      cost *= events.price_scale(model, node.key)
    return base.Completion(model=model, text=text, input_tokens=in_tokens, output_tokens=out_tokens,
                           cost_usd=cost)

  def _respond(self, reading: Reading, node: NodeInfo, model: str,
               rng: np.random.Generator) -> str | None:
    """The output text of `model` on the call read; None when a children block names an unknown
    sub-question (or none)."""
    w, prof, kind = self.world, self.world.profiles[model], reading.kind
    if kind == "planner":
      return "\n".join(c.text for c in w.children(node, model, reading.width, reading.exact))
    if kind == "thinker":
      text = _filler(rng, w.output_tokens("thinker", node, model))
      w.note_thought(node, text, prof.think_quality)
      return text
    if kind == "executor":
      if reading.draft is not None:
        ok = extract_answer(reading.draft) == node.gold and rng.random() < prof.final_quality
        n_out = w.output_tokens("executor", node, model, final=True)
      else:
        tau = w.thoughts.get(reading.notes, 0.0) if reading.notes is not None else 0.0
        ok = rng.random() < w.exec_probability(node, model, tau)
        n_out = w.output_tokens("executor", node, model)
      return _answer_text(rng, node.gold if ok else _distractor(rng, node.gold), n_out)
    if kind not in prompts.CHILDREN_KINDS:
      raise AssertionError(kind)
    pairs = reading.children
    kids = [w.lookup(q) for q, _ in pairs]
    if not pairs or any(k is None for k in kids):
      return None
    correct = [extract_answer(a) == k.gold for (_, a), k in zip(pairs, kids)]
    if kind == "verifier":
      fixed = [c or rng.random() < prof.verify_quality for c in correct]
      return "\n".join(answer_line(k.gold if f else (extract_answer(a) or _distractor(rng, k.gold)))
                       for (_, a), k, f in zip(pairs, kids, fixed))
    ok = rng.random() < prof.summary_quality * float(np.mean(correct))
    value = node.gold if ok else _distractor(rng, node.gold)
    return _answer_text(rng, value, w.output_tokens("summarizer", node, model))


def _answer_text(rng, value: str, n_out: int) -> str:
  """Filler words, then the answer line: n_out tokens in all (at least the answer line's)."""
  return f"{_filler(rng, n_out - count_tokens(answer_line(value)))} {answer_line(value)}".strip()


def _children_pairs(lines: list[str]) -> list[tuple[str, str]]:
  pairs, q = [], None
  for l in lines:
    if l.startswith(prompts.SUBQUESTION):
      q = l[len(prompts.SUBQUESTION):]
    elif l.startswith(prompts.ANSWER) and q is not None:
      pairs.append((q, l[len(prompts.ANSWER):]))
      q = None
  return pairs


def expected_utility(world: SimWorld, state) -> float:
  """P(final answer correct) of a finished episode, given the LLMs it called (not their samples).

  `state` is a gp_jax.workflow.mdp.WorkflowState. Averaging the realised utility over the
  simulator's sampling gives this number; evaluation reports it to remove sampling noise.
  """
  by_node: dict[int, dict[str, str]] = {}
  final_llm = None
  for c in state.calls:
    if c.error is not None:
      continue
    slot = by_node.setdefault(c.node, {})
    if c.kind == "executor" and c.node == 0 and "summarizer" in slot:
      final_llm = c.llm
    else:
      slot[c.kind] = c.llm

  def prob(node) -> float:
    info = world.lookup(node.text)
    if info is None:
      return 0.0
    calls = by_node.get(node.id, {})
    if node.children:
      if "summarizer" not in calls:
        return 0.0
      kids = [prob(state.nodes[c]) for c in node.children]
      r = world.profiles[calls["verifier"]].verify_quality if "verifier" in calls else 0.0
      return world.profiles[calls["summarizer"]].summary_quality * (r + (1 - r) * float(np.mean(kids)))
    if "executor" not in calls:
      return 0.0
    tau = world.profiles[calls["thinker"]].think_quality if "thinker" in calls else 0.0
    return world.exec_probability(info, calls["executor"], tau)

  if state.final_answer is None:
    return 0.0
  root = state.nodes[0]
  if root.children:
    if final_llm is None:
      return 0.0
    return world.profiles[final_llm].final_quality * prob(root)
  return prob(root)
