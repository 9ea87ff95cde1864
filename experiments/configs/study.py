"""Study config (Phase 1 vs 2, unseen tasks/LLMs, ablations, new roles): GraphPlanner at CPU size.

  --config=experiments/configs/study.py        CPU size (9 LLMs, 1000 train / 300 test queries)
  --config=experiments/configs/study.py:test   CI size (3 LLMs, tiny; a study in about a minute)
"""
import ml_collections

from experiments.configs import default
from experiments.configs import test as test_config


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  if arg not in ("", "test"):
    raise ValueError(f"unknown study config variant {arg!r}; use '' or 'test'")
  if arg == "test":
    c = test_config.get_config()
    c.train.episodes = 32
  else:
    c = default.get_config()
    c.train.episodes = 6000        # half the main job's episodes per trained variant
  c.eval.baselines = True
  c.eval.optimum = True
  c.study = ml_collections.ConfigDict()
  c.study.seeds = "0,1" if arg == "" else "0"   # seeds (data, init, sampling)
  c.study.routers = "knn,mlp,routerdc,graph" if arg == "" else "knn,mlp"   # unseen-task baselines
  # The learner study's combined arm: learner options (gp_jax/runs/studies/definitions.py
  # LEARNER_OPTIONS) trained together, chosen by training return only ("" = no combined arm).
  c.study.learner_combined = ""
  c.study.few_shot = 50            # episodes of the few-shot new-role variants (per round)
  c.study.few_shot_rounds = 8      # rounds of pestv_few_shot_rounds (each: few_shot new episodes,
                                   # one PPO update; Adam state carried)
  # Unseen LLMs: held out of training, added at evaluation as hubs from their description. By
  # default the LLM the optimum relies on (0.71 of its calls on the 12-LLM pool, 100 test queries;
  # every other LLM <= 0.10: python -m experiments.optimum_shares, docs/memory.md), so the test
  # can tell whether the router uses it.
  c.study.unseen_llms = "qwen2.5-7b-instruct"
  c.study.served = 50              # served episodes joining the history (unseen_llms_served)
  # The roles study's DP optimum with Thinker and Verifier grows as K^3 in the pool size K (verifier
  # x summarizer x final executor per planner); on a CPU it uses a 5-LLM pool and 150 test queries.
  c.study.roles_llms = ("" if arg == "test" else
                        "qwen2.5-7b-instruct,llama-3.1-8b-instruct,gemma-2-9b-it,"
                        "llama3-chatqa-1.5-70b,llama-3.3-nemotron-super-49b-v1")   # "" = config.llms
  c.study.roles_n_test = 0 if arg == "test" else 150   # 0 = config.data.n_test
  # Drift study (gp_jax/runs/studies/drift.py): pool events at query drift_t of the test stream.
  c.study.drift_events = "quality_drop,price_rise,fail,join"   # events, one cell per event and seed
  c.study.drift_llm = "qwen2.5-7b-instruct"   # LLM whose skill drops, price rises or that fails
  # LLM that joins at t: the one the optimum relies on (as c.study.unseen_llms above). When it is
  # in config.llms, the router that meets the event is trained on config.llms without it.
  c.study.drift_join_llm = "qwen2.5-7b-instruct"
  c.study.drift_t = 8 if arg == "test" else 100        # event position in the test stream
  c.study.drift_delta = -3.0       # quality_drop: logit added to drift_llm's skill on every domain
  c.study.drift_price_scale = 4.0  # price_rise: multiplier of drift_llm's prices
  c.study.drift_window = 4 if arg == "test" else 25    # queries per window of the reward curve
  c.study.drift_recovery_after = 8 if arg == "test" else 100   # recovery measured this many
                                   # queries after the event, over one window
  c.study.drift_recent_rows = 40 if arg == "test" else 1000   # arm online_recent: online memory
                                   # keeping only its newest rows (a recency window)
  c.study.drift_closure_after = 4 if arg == "test" else 50   # gap closure (arm - frozen) /
  c.study.drift_closure_len = 12 if arg == "test" else 150   # (retrained - frozen) over queries
                                   # [t + closure_after, + closure_len)
  c.study.drift_online_parallel = 4  # episodes in flight of the memory arms (online memory)
  # The drift study's baselines, fitted once per seed on the pre-event pool: single-round routers
  # (arms "router:<name>"), and Router-R1-style (trained with PPO for as many episodes as the
  # GraphPlanner router; clip, epochs, minibatches, gamma, lambda, grad clip from config.ppo) and
  # KNN-multiround (k = knn_k), arms "multi:router_r1" and "multi:knn".
  c.study.drift_routers = ("best_single,knn,mlp" if arg == "test" else
                           "best_single,knn,mlp,routerdc,graph")
  c.study.drift_router_llm = ""    # Router-R1's router LLM; "" = the pool's cheapest
  c.study.drift_r1_hidden = 64     # Router-R1 MLP width
  c.study.drift_r1_episodes = c.train.episodes   # Router-R1 PPO episodes (as GraphPlanner's)
  c.study.drift_r1_batch = c.train.episodes_per_iter   # episodes per Router-R1 PPO update
  c.study.drift_r1_learning_rate = 1e-3
  c.study.drift_r1_entropy_coef = 0.01
  c.study.knn_k = 10               # single-round router settings (as in the sweep)
  c.study.mlp_hidden = 64
  c.study.router_steps = 500 if arg == "" else 100
  return c
