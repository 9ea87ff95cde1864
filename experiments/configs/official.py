"""The released code's settings on gp_jax's simulator (docs/official.md).

  --config=experiments/configs/official.py        the released run's sizes: 1000 episodes
  --config=experiments/configs/official.py:test   CI size (tiny data and text width, 40 episodes)

Each value cites the authors' file and line (router_planner/dynamic_router/ of
github.com/ulab-uiuc/GraphPlanner at 56010b1: train.py, network.py, route_env.py; utils.py is
router_planner/shared/utils.py). Where the repository disagrees with itself, the value is the one
the code that runs builds: `python -m ...train` calls main(), which passes every parse_args value
to train_ppo (train.py:836-857), and train_ppo builds the agent with RouteAgent's defaults except
hidden_dim and buffer_size (train.py:455-456). The `config` dict of train.py:411-430 only goes to
wandb (train.py:436-440) and is not what trains. What gp_jax cannot express is said where it
would go, with what gp_jax does instead.
"""
import ml_collections

from experiments.configs import default

# route_env.py:75-77 keeps items[:3] + items[4:-8] of the 14 LLMs in
# config/llm_descriptions_with_embeddings.json: these 5 (15 actions). Their prices there are
# gp_jax's catalog's, but gemma-2-9b-it's (0.10 $/M there, 0.20 here).
LLMS = ("qwen2.5-7b-instruct,codegemma-7b,gemma-2-9b-it,llama3-chatqa-1.5-8b,"
        "mistral-7b-instruct-v0.3")


def get_config(arg: str = "") -> ml_collections.ConfigDict:
  if arg not in ("", "test"):
    raise ValueError(f"unknown official config variant {arg!r}; use '' or 'test'")
  c = default.get_config()
  c.alpha = 0.0                    # route_env.py:561-568: the reward is the task score of the final
                                   # answer; planner and summarizer steps give 0 (route_env.py:525,
                                   # 686); the call's cost goes only into the memory rows
                                   # (route_env.py:506, 590, 657). The paper's -alpha C term: none.
  c.llms = LLMS                    # route_env.py:75-77 (above)
  c.roles = "planner,executor,summarizer"   # route_env.py:88

  c.mdp.p_max = 2                  # train.py:732 --max_planner_calls default 2 (train_ppo's own
                                   # default 5, train.py:397, and Env_route's 5, route_env.py:45,
                                   # are overridden by main(), train.py:841)
  c.mdp.max_width = 3              # route_env.py:46 (train.py never sets it)
  c.mdp.max_depth = 3              # route_env.py:47 (train.py never sets it)
  c.mdp.step_cap = 16              # train.py:736 max_timesteps 500; with p_max 2 and width 3 an
                                   # episode makes at most 10 calls, so neither cap binds (16 is
                                   # also gp_jax's workflow-memory rows per observation)

  # utils.py:74: Longformer-base (768-d) embeds queries, states, outputs and descriptions.
  # gp_jax's text encoder at the same width; it is a hashing encoder, not Longformer (no weights).
  c.text.encoder = "hashing"
  c.text.dim = 768
  c.model.mem_proj = 0             # memory rows [n_i (768) ; n_o (768) ; score ; cost] as
                                   # network.py:117-121 (gp_jax adds a failed-call flag: 1539)
  c.model.hidden = 32              # train.py:455 RouteAgent(hidden_dim=32) (RouteAgent default
                                   # 16, network.py:379; the wandb dict's 16, train.py:423)
  c.model.num_layers = 1           # network.py:212: one local DBLayer over this episode's tables
  c.model.mlp_hidden = 32          # network.py:218-232: query and state towers of width hidden,
                                   # fused by Linear(3 x hidden -> hidden). gp_jax: one MLP over
                                   # [task ; query ; state]; the 11-way task-class embedding
                                   # (network.py:223) is gp_jax's task-description embedding instead
  c.model.history = "transductive"  # network.py:254 his_dbl reads every past training row
  c.model.history_capacity = 100_000  # MemoryTable never evicts (train.py:309-342); 1000
                                   # episodes of <= 10 calls stay under this
  c.model.row_layout = 1           # the score column: route_env.py:589 puts the reward on
                                   # executor rows (0 but at the final answer), 505 and 656 put 0
                                   # on planner and summarizer rows. gp_jax cannot express that;
                                   # layout 1 puts the episode's utility on every row

  c.ppo.learning_rate = 1e-4       # network.py:380 RouteAgent lr default (wandb dict: 3e-4, 418)
  c.ppo.value_lr_multiplier = 2.0  # network.py:401 Adam(value, lr=2 * lr)
  c.ppo.gamma = 0.98               # network.py:380 (wandb dict: 0.99, train.py:419)
  c.ppo.gae_lambda = 0.85          # network.py:436 compute_gae(lambda_gae=0.85), called at 462
  c.ppo.clip_eps = 0.2             # network.py:380 eps_clip
  c.ppo.epochs = 1                 # network.py:380 k_epochs (wandb dict: 4, train.py:421)
  c.ppo.entropy_coef = 0.0         # network.py:381 (and the wandb dict's 0.00, train.py:422)
  c.ppo.entropy_stop = 0.0         # no entropy stop: train.py's one stop, running reward > 10
                                   # (train.py:688), cannot fire with scores in [0, 1]
  c.ppo.max_grad_norm = 0.0        # no clipping: network.py:500-501 step without clip_grad_norm
  c.ppo.value_coef = 2.0           # network.py:498 value loss = MSE on its own Adam; gp_jax's
                                   # value term is value_coef x 0.5 MSE on disjoint parameters
  c.ppo.num_minibatches = 2        # train.py:614 update(..., 32): minibatches of 32 of the
                                   # 50-transition buffer (network.py:474), 2 per epoch (32 + 18).
                                   # gp_jax: 2 minibatches, each half of the update's padded
                                   # transitions (padding weighs 0), so half its real ones
  # Advantages normalised over the update's transitions: network.py:465, as gp_jax always does.

  c.train.reward = "sampled"       # route_env.py:561-567 eval_perf of the final answer (gp_jax's
                                   # default on the simulator is its expectation)
  c.train.episodes = 1000          # train.py:735 --max_episodes
  c.train.parallel = 1             # train.py:738 --batch_size 1: one episode at a time, each
                                   # joining the history before the next starts (train.py:125-133)
  # Not expressible: network.py:402 keeps a deque of the last 50 transitions (train.py:455
  # buffer_size=50) that is never cleared; the first update runs when it is full (train.py:602),
  # then every 3rd episode (train.py:606), each on the last 50 transitions with the log-probs of
  # the policy that took them (so a transition is in several updates). gp_jax updates once per
  # iteration on that iteration's episodes only, each transition once, with the log-probs of the
  # policy being updated. 10 episodes per update: 100 updates in the run (the released code: about
  # 330); at CPU size they held 10 to 55 transitions (23 on average) where the buffer holds 50.
  c.train.episodes_per_iter = 10
  c.train.checkpoint_every = 5     # train.py:636 latest every 50 episodes (5 iterations of 10)
  c.train.force_planner_episodes = 0   # train.py:749 --force_planner_episodes default 0, which
                                   # main() passes (train.py:855); train_ppo's own default is 50
                                   # (train.py:402), used only when it is called from Python
                                   # without the argument: --config.train.force_planner_episodes=50
  # Query order: route_env.py:387 draws each episode's query with replacement; gp_jax draws
  # per-epoch shuffles. Evaluation: greedy, as train.py:170-173, on the best checkpoint by running
  # reward (train.py:624-633), once after training instead of every 20 episodes (train.py:741).
  c.eval.baselines = True
  c.eval.optimum = True

  if arg == "test":                # the same settings at CI size
    c.data.n_train = 48
    c.data.n_test = 24
    c.text.dim = 64
    c.model.history_capacity = 400
    c.train.episodes = 40          # 4 iterations of 10 episodes
    c.train.checkpoint_every = 1
  return c
