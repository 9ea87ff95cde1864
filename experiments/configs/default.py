"""Default GraphPlanner config: the paper's hyperparameters on the embedded simulated pool."""
import ml_collections


def get_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0                       # one seed fixes data, init, rollouts and sampling
  c.alpha = 0.5                    # reward = U - alpha * cost (cost in milli-dollars, see reward.py)
  c.backend = "simulator"          # "simulator" (embedded) or "endpoints" (OpenAI-compatible servers)
  c.endpoints_file = ""            # endpoints JSON written by experiments/serve_backbones.py
  c.request_timeout_s = 120.0      # one HTTP attempt (endpoints backend)
  c.sampling = ml_collections.ConfigDict()
  c.sampling.temperature = 0.0     # LLM sampling (the per-episode seed is set by the rollout)
  c.sampling.max_tokens = 512      # output cap per call; lower it for slow CPU backends
  c.replay = ml_collections.ConfigDict()
  c.replay.mode = "off"            # "off", "read-write" (record) or "read-only" (replay offline)
  c.replay.path = ""               # SQLite file of the response cache
  c.catalog_file = ""              # LLM catalog JSON; "" = data/llm_pool.json
  c.llms = "train"                 # "train" (9 not held out), "all" (12) or a comma list
  c.roles = "planner,executor,summarizer"   # the paper's roles; add thinker,verifier for App. E
  c.compile_cache = "~/.cache/gp_jax/xla"   # persistent XLA cache ("" = off)

  c.mdp = ml_collections.ConfigDict()
  c.mdp.p_max = 2                  # planner calls per episode (authors' code)
  c.mdp.max_width = 3              # sub-queries kept per planner call
  c.mdp.max_depth = 3              # nodes at this depth are never planned
  c.mdp.step_cap = 16              # LLM calls per episode; also the workflow-memory rows
  c.mdp.phase1_depth = 0           # >0: Phase-1 fixed workflow (router picks only the LLM)
  c.mdp.phase1_width = 0

  c.data = ml_collections.ConfigDict()
  c.data.source = "simulated"      # "simulated" or "files" (JSONL from experiments/prepare_data.py)
  c.data.tasks = "seen"            # simulated tasks for training: seen | unseen | all | comma list
  c.data.test_tasks = ""           # "" = same as tasks
  c.data.n_train = 1000            # training queries (simulated) / cap on file rows (0 = all)
  c.data.n_test = 300              # held-out test queries
  # Simulated only: end each sub-question's text with a tag derived from its key, so no result
  # depends on what the process simulated before (gp_jax/sim/simulator.py). False restores the
  # untagged texts, whose rare collisions are renamed in registration order.
  c.data.sim_unique_texts = True
  # Simulated only: pool events (gp_jax/sim/events.py, docs/simulator.md). Each is off while its
  # llm is "". t counts root queries in the order of a followed split's stream (query "<split>-
  # <seed>-<i>" is position i); the event acts on the queries at positions >= t.
  c.data.sim_events = ml_collections.ConfigDict()
  c.data.sim_events.splits = "test"  # comma list of the splits whose streams the events follow;
                                     # the others (training, by default) see the configured pool
  c.data.sim_events.quality = ml_collections.ConfigDict()
  c.data.sim_events.quality.llm = ""       # LLM whose executor skill changes ("" = off)
  c.data.sim_events.quality.t = 0          # first query position affected
  c.data.sim_events.quality.delta = -2.0   # logit added to its skill (< 0 drops, > 0 rises)
  c.data.sim_events.quality.domains = ""   # comma list of domains it acts on ("" with tasks "" = all)
  c.data.sim_events.quality.tasks = ""     # comma list of tasks it acts on (besides the domains)
  c.data.sim_events.price = ml_collections.ConfigDict()
  c.data.sim_events.price.llm = ""         # LLM whose prices change ("" = off)
  c.data.sim_events.price.t = 0            # first query position at the new prices
  c.data.sim_events.price.scale = 2.0      # multiplier of its input and output $/M prices (> 0)
  c.data.sim_events.join = ml_collections.ConfigDict()
  c.data.sim_events.join.llm = ""          # LLM of config.llms absent (masked) before t ("" = off)
  c.data.sim_events.join.t = 0             # first query position at which it can be called
  c.data.sim_events.fail = ml_collections.ConfigDict()
  c.data.sim_events.fail.llm = ""          # LLM whose every call errors from t on ("" = off)
  c.data.sim_events.fail.t = 0             # first query position at which it fails
  c.data.train_file = ""
  c.data.test_file = ""

  # Simulated only: which world (gp_jax/sim/world.py, docs/simulator.md). "v1": the text states
  # each query's step count and skills are fixed functions of what the text shows; "v2": a noisy
  # step cue and latent per (query cluster, LLM) skill offsets. world_file: a v2 world's
  # parameters (JSON written by experiments/calibrate.py; "" = world.py's defaults).
  c.sim = ml_collections.ConfigDict()
  c.sim.world = "v1"
  c.sim.world_file = ""

  c.text = ml_collections.ConfigDict()
  c.text.encoder = "hashing"       # "hashing" (default, no weights) or "minilm"
  c.text.dim = 384                 # hashing width (MiniLM is 384)
  c.text.cache = ""                # SQLite embedding cache path ("" = memory only)
  c.text.base_url = ""             # vllm_embed only: OpenAI-compatible base URL (.../v1)
  c.text.model = ""                # vllm_embed only: served embedding model name

  c.model = ml_collections.ConfigDict()
  c.model.hidden = 32              # GARNet width (paper: 32)
  c.model.num_layers = 2           # GARNet layers on the workflow graph
  c.model.mlp_hidden = 64          # state-fusion / value MLP width
  c.model.mem_proj = 128           # memory-row text projection width (0 = full text width)
  c.model.history = "transductive"  # "transductive" (history of training episodes), "inductive"
                                   # (none), "summary" (per-hub text), "retrieval" (top-k rows)
  c.model.encoder = "garnet"       # "garnet", "homogeneous", "gat", "transformer" (ablations.md)
  c.model.retrieval_k = 5          # history rows retrieved per decision (history = "retrieval")
  c.model.attention_heads = 4      # heads of the transformer encoder (must divide hidden)
  c.model.history_capacity = 100_000  # history rows kept (oldest evicted between iterations)
  c.model.row_layout = 1           # history rows: 1 the episode's reward utility on every row
                                   # (the layout of the published numbers);
                                   # 2 per-call credit of the scored utility + per-hub statistics
                                   # read by policy and value (docs/memory.md); records without
                                   # the field are layout 1
  c.model.memory_bias = False      # row layout 2 only: add to each hub's logit a bias computed
                                   # from that hub's statistics alone (docs/memory.md)
  c.model.memory_predictor = False  # row layout 2, transductive history: a head trained by
                                   # regression to predict each hub's next-call reward from its
                                   # statistics; kappa x its prediction joins the hub's logit
  c.model.memory_predictor_scale = 5.0  # kappa, logits per unit of predicted call reward
                                   # (chosen among 5, 15, 50 by training return under perturbed
                                   # pools, reduced size: docs/memory.md)
  c.model.policy_head = "flat"     # "flat": one softmax over the role x LLM actions; "factored":
                                   # p(role) x p(LLM | role), greedy = best role, then its best
                                   # LLM (gp_jax/graph/garnet.py)

  c.ppo = ml_collections.ConfigDict()
  c.ppo.learning_rate = 3e-4       # paper
  c.ppo.lr_schedule = "constant"   # "constant" or "linear" (decay over the run's gradient steps)
  c.ppo.lr_final_fraction = 0.0    # linear: final lr as a fraction of learning_rate
  c.ppo.value_lr_multiplier = 2.0  # paper: value lr x2
  c.ppo.clip_eps = 0.2             # paper
  c.ppo.epochs = 4                 # paper
  c.ppo.num_minibatches = 4
  c.ppo.gamma = 0.99               # paper
  c.ppo.gae_lambda = 0.95
  c.ppo.max_grad_norm = 0.5        # paper (global-norm clip; 0 = none)
  c.ppo.entropy_coef = 0.001       # small: the greedy router needs a sharp policy
  c.ppo.entropy_schedule = "constant"   # "constant" or "linear" (decay over the run's PPO updates)
  c.ppo.entropy_final_fraction = 0.0    # linear: final coefficient as a fraction of entropy_coef
  c.ppo.value_coef = 0.5
  c.ppo.entropy_stop = 0.05        # stop when mean policy entropy falls below this
  c.ppo.entropy_stop_min_episodes = 0   # ... but only once this many training episodes have
                                   # run (0 = from the first update)
  c.ppo.role_entropy_coef = 0.0    # bonus x entropy of the role marginal (sum of p over each
                                   # role's actions), either head; 0 = none (gp_jax/rl/ppo.py)
  c.ppo.advantage_norm = "batch"   # advantages standardised over the "batch", or "per_type":
                                   # within each decision type (root, pending, summarize, other:
                                   # gp_jax/rl/batch.py)

  c.train = ml_collections.ConfigDict()
  c.train.episodes = 12000         # training episodes
  c.train.episodes_per_iter = 64   # episodes per PPO update
  c.train.parallel = 64            # episodes in flight
  c.train.reward = "auto"          # terminal utility: "sampled" (the scored answer), "expected"
                                   # (E[U | calls], simulator only: less noise), "auto" = expected
                                   # on the simulator, sampled otherwise
  c.train.checkpoint_every = 5     # iterations between 'latest' checkpoints
  c.train.force_planner_episodes = 0   # the run's first N training episodes start with a Planner
                                   # (their first decision allows only planner actions; the
                                   # released code's option, docs/official.md); 0 = none
  c.train.root_floor = 0.0          # root credit (gp_jax/rl/root_credit.py): training episodes
                                   # draw their first action from (1 - e) x the policy + e x
                                   # uniform over the valid actions, e = this; 0 = off
  c.train.root_rollout = 0         # root credit: per iteration, the first N episodes' root
                                   # advantages from paired greedy continuations (split vs
                                   # answer; use with ppo.gamma = 1); 0 = off
  c.train.phase1_episodes = 0      # warm start: the first N training episodes (whole iterations,
                                   # counted in train.episodes) run the fixed Phase-1 workflow of
                                   # depth phase1_depth and width phase1_width, then Phase 2
                                   # (gp_jax/runs/train.py); 0 = none
  c.train.phase1_depth = 1         # the warm start's Phase-1 depth ...
  c.train.phase1_width = 3         # ... and width (read only when phase1_episodes > 0)
  c.train.background_checkpoints = False  # write them in a thread while training goes on (one
                                   # process; pays off where cores are idle, docs/scaling.md)
  c.train.padding = "fixed"        # transitions per update: "fixed" (every call the episodes
                                   # could make) or "buckets" (sizes <= 4/3 apart: <= 25% padding,
                                   # one compilation per size met; docs/scaling.md)
  c.train.pool_perturb = ml_collections.ConfigDict()   # training under changing pools
  c.train.pool_perturb.enabled = False  # perturb the training pool every few iterations
                                   # (gp_jax/sim/perturb.py, docs/memory.md; simulator only)
  c.train.pool_perturb.every = 2   # iterations per phase (one perturbation per phase)
  c.train.pool_perturb.skill_prob = 0.3   # per LLM and phase: executor skill shift on random
  c.train.pool_perturb.delta_low = -3.0   # domains by delta ~ U[delta_low, delta_high] logits
  c.train.pool_perturb.delta_high = 1.0
  c.train.pool_perturb.price_prob = 0.2   # prices x one of 0.25, 0.5, 2, 4
  c.train.pool_perturb.fail_prob = 0.1    # every call fails
  c.train.pool_perturb.absent_prob = 0.1  # absent for the phase (joins again after it)

  c.parallel = ml_collections.ConfigDict()   # docs/scaling.md
  c.parallel.devices = 0           # learner mesh size: 0 = all devices (of all processes)
  c.parallel.distributed = False   # join a multi-process job (jax.distributed.initialize)
  c.parallel.coordinator = ""      # "host:port" of process 0 ("" = from the cluster environment)
  c.parallel.num_processes = 0     # 0 = from the cluster environment
  c.parallel.process_id = -1       # -1 = from the cluster environment

  c.eval = ml_collections.ConfigDict()
  c.eval.baselines = True          # random and single-LLM policies
  c.eval.optimum = True            # exact DP optimum (simulator only)
  c.eval.online_history = False    # online memory: evaluated episodes join the router's history as
                                   # they finish (weights frozen, model.history_capacity bounds it);
                                   # its row is "GraphPlanner (online memory)"
  c.eval.online_recent_rows = 0    # > 0: online memory keeps only its newest rows (a recency
                                   # window: each hub's mean reads recent calls); 0 = capacity
  return c
