"""Graph Counselor config (experiments/counselor.py): a method on a GRBench graph, or the generator.

  --config=experiments/configs/counselor.py          real backbones behind OpenAI-compatible
                                                     servers (set endpoints_file)
  --config=experiments/configs/counselor.py:oracle   the oracle backend: follows the gold plans of
                                                     generated questions (CPU, seconds; a check of
                                                     the machinery, not a model)
"""
import ml_collections

VARIANTS = ("", "oracle")


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  if arg not in VARIANTS:
    raise ValueError(f"unknown counselor config variant {arg!r}; use '' or 'oracle'")
  c = ml_collections.ConfigDict()
  # counselor (Plan/Thought/Action + judge + reflection) | graph_cot | llm_only | text_rag |
  # graphrag_1hop | graphrag_2hop
  c.method = "counselor"
  c.pool = "oracle" if arg == "oracle" else "endpoints"   # "endpoints" or "oracle"
  c.endpoints_file = ""            # endpoints JSON written by experiments/serve_backbones.py
  c.catalog_file = ""              # LLM catalog JSON; "" = data/llm_pool.json
  c.model = ""                     # catalog LLM of every agent kind; "" = the catalog's first
  c.models = ""                    # per agent kind, overriding model: "plan=a,reflect=b" (kinds:
                                   # plan, thought, action, judge, reflect, answer)
  c.llm_judge = True               # also score with the LLM-judge metric
  c.judge_model = ""               # its LLM; "" = the LLM of the 'judge' agent kind
  c.limit = 0                      # only the first N questions (0 = all)
  c.concurrency = 8                # questions in flight at once

  c.data = ml_collections.ConfigDict()
  c.data.text_keys = ""            # main text feature per node type: "paper=title,author=name"
  c.data.drop_dangling = False     # drop neighbour ids that name no node instead of failing

  c.text = ml_collections.ConfigDict()
  c.text.encoder = "hashing"       # text encoder of Retrieve: "hashing" (no weights) or "minilm"
  c.text.cache = ""                # SQLite file caching query embeddings ("" = memory only)
  c.text.index_cache_dir = ""      # folder caching node-embedding matrices ("" = memory only)

  c.agents = ml_collections.ConfigDict()
  c.agents.max_steps = 10          # Plan/Thought/Action steps per trial
  c.agents.max_reflect = 2         # reflections (trials = max_reflect + 1)
  c.agents.prompt_token_budget = 6000    # largest agent prompt (tokens)
  c.agents.context_token_budget = 2000   # retrieved context of the GraphRAG baselines (tokens)

  c.generate = ml_collections.ConfigDict()   # --mode=generate
  c.generate.domain = "academic"   # academic | ecommerce | biomedical
  c.generate.size = "tiny"         # tiny | small | 10k | 100k | a node count
  c.generate.seed = 0              # generator seed of the graph and the questions
  c.generate.per_template = 5      # questions per template
  return c
