"""Alpha-sweep config: GraphPlanner and the baselines at CPU-feasible sizes.

  --config=experiments/configs/sweep.py        the CPU sweep (5 alphas x 5 seeds)
  --config=experiments/configs/sweep.py:test   the CI-sized sweep (2 alphas x 2 seeds, < 1 minute)
"""
import ml_collections

from experiments.configs import default
from experiments.configs import test as test_config


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  if arg not in ("", "test"):
    raise ValueError(f"unknown sweep config variant {arg!r}; use '' or 'test'")
  if arg == "test":
    c = test_config.get_config()
    c.train.episodes = 32          # two PPO iterations per cell keep the CI sweep under a minute
  else:
    c = default.get_config()
    c.llms = ("qwen2.5-7b-instruct,llama-3.1-8b-instruct,gemma-2-9b-it,llama3-chatqa-1.5-70b,"
              "llama-3.3-nemotron-super-49b-v1")   # five of the nine training LLMs, cheap to large
    # Training queries of every method (GraphPlanner, Router-R1-style, the routers' labels). With
    # 400, 12,000 episodes revisit each query 30 times and GraphPlanner fits per-query noise of
    # the planners' sub-questions (docs/experiments.md, "GraphPlanner's PPO settings in the sweep").
    c.data.n_train = 3000
    c.data.n_test = 150            # held-out test queries of every method
    c.text.dim = 128               # hashing width
    c.model.mem_proj = 32
    c.model.history_capacity = 5000
    c.train.episodes = 12000       # GraphPlanner training episodes per cell
    c.train.episodes_per_iter = 64
    c.train.parallel = 64
    c.train.checkpoint_every = 4
  # PPO for the sweep (docs/experiments.md, "GraphPlanner's PPO settings in the sweep"): a larger
  # entropy bonus, and both it and the learning rate decaying linearly to 0 over the run; with the
  # paper's constant 3e-4 and entropy 0.001 the router settled on worse planner/summarizer LLMs at
  # alpha >= 0.1.
  c.ppo.entropy_coef = 0.03
  c.ppo.entropy_schedule = "linear"
  c.ppo.entropy_final_fraction = 0.0
  c.ppo.lr_schedule = "linear"
  c.ppo.lr_final_fraction = 0.0
  c.eval.baselines = True
  c.eval.optimum = True

  c.sweep = ml_collections.ConfigDict()
  c.sweep.alphas = "0,0.1,0.3,0.5,0.9" if arg == "" else "0,0.9"   # cost weights of the grid
  # Seeds (data, init, sampling) per alpha; five, so that the 95% interval of a paired gap uses
  # t = 2.776 (4 degrees of freedom) rather than 4.303.
  c.sweep.seeds = "0,1,2,3,4" if arg == "" else "0,1"
  # Single-round routers; the GraphRouter-style GNN ("graph") and RouterDC compile for ~10 s and
  # ~4 s per fit on a CPU, so the CI-sized sweep leaves them out (tests/baselines covers both).
  c.sweep.routers = ("random,best_single,largest,cheapest,knn,linear,mlp"
                     + (",graph,routerdc" if arg == "" else ""))
  c.sweep.knn_k = 10               # neighbours of the KNN router
  c.sweep.mlp_hidden = 64          # hidden width of the MLP router
  c.sweep.router_steps = 500 if arg == "" else 200   # full-batch Adam steps (linear, MLP)
  c.sweep.router_learning_rate = 1e-2
  c.sweep.router_weight_decay = 1e-3
  c.sweep.graph_hidden = 32        # GNN width of the graph router
  c.sweep.graph_steps = 300        # full-batch Adam steps of the graph router
  c.sweep.routerdc_steps = 300     # full-batch Adam steps of RouterDC
  # Multi-round routers (gp_jax/baselines/multi_round/), rows "multi:<name>": knn (KNN-multiround
  # decompose-route-merge, k = knn_k), llm (LLM-multiround; on the simulator an untrained heuristic
  # stand-in for the prompted router), router_r1 (Router-R1-style MLP policy trained with PPO per
  # cell; clip, epochs, minibatches, gamma, lambda, grad clip from config.ppo), r2_reasoner
  # (R2-Reasoner-style decomposer + difficulty-aware allocator: SFT once per seed, GRPO per cell).
  c.sweep.multi_routers = "knn,llm,router_r1,r2_reasoner"
  c.sweep.router_llm = ""          # router LLM of llm and router_r1; "" = the pool's cheapest
  c.sweep.r1_hidden = 64           # Router-R1 MLP width
  c.sweep.r1_episodes = 12000 if arg == "" else 128  # Router-R1 PPO episodes per cell (as GraphPlanner)
  c.sweep.r1_batch = 64 if arg == "" else 32         # episodes per PPO update
  c.sweep.r1_learning_rate = 1e-3
  c.sweep.r1_entropy_coef = 0.01
  # R2-Reasoner-style router (gp_jax/baselines/multi_round/r2_reasoner.py, R2Settings): GRPO
  # episodes per round as Router-R1's per cell on the CPU sweep, 4 GRPO steps per round in CI.
  c.sweep.r2_hidden = 64           # difficulty MLP width
  c.sweep.r2_sft_steps = 300       # stage 1: full-batch Adam steps on the sub-question labels
  c.sweep.r2_episodes = 12000 if arg == "" else 128  # stage 2: GRPO episodes per round
  c.sweep.r2_batch = 16 if arg == "" else 8          # training queries per GRPO step
  c.sweep.r2_group = 4             # allocations sampled per query (the GRPO group)
  c.sweep.r2_temperature = 0.1     # allocation policy softmax(score / temperature)
  c.sweep.r2_kl_coef = 0.04        # KL weight to the SFT allocator
  c.sweep.r2_learning_rate = 3e-3  # GRPO Adam rate
  c.sweep.r2_rounds = 2            # decomposer / allocator alternations
  c.sweep.r2_select_queries = 256  # training queries that choose the decomposer after GRPO
  return c
