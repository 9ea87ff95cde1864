"""Routed Graph Counselor config (experiments/counselor_routed.py, docs/counselor_routing.md).

  --config=experiments/configs/counselor_routed.py        the documented run: academic 'small'
                                                          graph, 150 train / 70 test questions,
                                                          3 seeds
  --config=experiments/configs/counselor_routed.py:test   the CI size: tiny graph, 24 / 16
                                                          questions, one seed, three LLMs (about
                                                          a minute on 2 CPU cores)
Every field but seeds and concurrency is part of a seed's results: a workdir holding seeds of
other settings is refused.
"""
import ml_collections

VARIANTS = ("", "test")


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  if arg not in VARIANTS:
    raise ValueError(f"unknown counselor_routed config variant {arg!r}; use '' or 'test'")
  test = arg == "test"
  c = ml_collections.ConfigDict()
  c.seeds = "0" if test else "0,1,2"   # comma-separated; each seed splits, trains and evaluates
  c.concurrency = 8                # questions in flight at once
  c.alpha = 0.05                   # cost weight: reward = EM - alpha * cost in milli-dollars
  # Comma-separated catalog LLMs the router picks from (and the fixed-LLM rows); "" = the
  # catalog's training LLMs.
  c.llms = ("qwen2.5-7b-instruct,llama-3.1-8b-instruct,llama-3.3-nemotron-super-49b-v1"
            if test else "")
  c.catalog_file = ""              # LLM catalog JSON; "" = data/llm_pool.json
  # The per-kind table baseline (one LLM per agent kind, found by coordinate ascent on the
  # training questions): passes over the five kinds (a pass that changes nothing ends it).
  c.table_passes = 2

  c.data = ml_collections.ConfigDict()
  c.data.domain = "academic"       # generated graph: academic | ecommerce | biomedical
  c.data.size = "tiny" if test else "small"   # tiny | small | 10k | a node count
  c.data.graph_seed = 0            # generator seed of the graph and the questions
  c.data.per_template = 4 if test else 20     # generated questions per template
  c.data.graph = ""                # a GRBench graph.json instead of a generated graph ...
  c.data.questions = ""            # ... and its questions JSONL (with gold plans)
  c.data.n_train = 24 if test else 150        # training questions per seed
  c.data.n_test = 16 if test else 70          # held-out test questions per seed

  c.text = ml_collections.ConfigDict()
  c.text.encoder = "hashing"       # text encoder of Retrieve and of the router's features

  c.counselor = ml_collections.ConfigDict()
  c.counselor.max_steps = 10       # Graph Counselor steps per trial
  c.counselor.max_reflect = 2      # reflections (trials = max_reflect + 1)

  c.sim = ml_collections.ConfigDict()   # the simulated counselor backend
  c.sim.skill_domain = "knowledge_reasoning"   # simulator domain whose skill sets P(success)
  c.sim.skill_scale = 2.0          # weight of that skill in the success logit

  c.train = ml_collections.ConfigDict()
  c.train.episodes = 192 if test else 3200    # training episodes (questions answered)
  c.train.batch_questions = 16 if test else 32   # episodes per PPO update

  c.ppo = ml_collections.ConfigDict()
  c.ppo.learning_rate = 1e-3       # Adam learning rate of the router
  c.ppo.entropy_coef = 0.02        # entropy bonus
  c.ppo.gae_lambda = 0.8           # GAE lambda
  return c
