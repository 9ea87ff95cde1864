"""The paper's studies as lists of variants (gp_jax/runs/studies/runner.py runs them).

phases     Phase 1 (user-defined workflow, the router picks only the LLM of each step:
           Depth=1/Width=3 and Depth=2/Width=2) vs Phase 2 (the router builds the workflow).
           Each phase is compared with its own DP optimum.
unseen     Unseen tasks: trained on the seen tasks, tested on LogicGrid, MGSM and CommonGen
           (single-round routers fitted on the same training queries alongside). Unseen LLMs
           (config.study.unseen_llms, by default the LLM the optimum calls most): the router
           trained without them (train_llms) is evaluated with them added as new hubs built from
           their description, with zero history on them (unseen_llms), after a few served
           episodes whose calls join the history (unseen_llms_served, weights frozen), after the
           same episodes drive one PPO update (unseen_llms_few_shot), and against the router
           trained with them (unseen_llms_retrained). Each cell records the share of the
           optimum's and the router's calls made with the held-out LLMs.
ablations  Inductive vs transductive inference (the transductive router evaluated with an empty
           history), no history (trained and evaluated without), and the encoder and history
           variants of gp_jax/graph/garnet.py (homogeneous, GAT, graph transformer, history as a
           text summary, history by retrieval with k=5).
roles      Thinker and Verifier (paper App. E), on the pool config.study.roles_llms (the DP optimum
           with five roles costs K^3 in the pool size): trained with them; zero-shot (router trained on
           Planner/Executor/Summarizer, new role hubs added at test time); few-shot recipes
           (zero-shot plus config.study.few_shot episodes with the new hubs): history only, no
           update (pestv_served); one PPO update (pestv_few_shot, the original recipe); and
           config.study.few_shot_rounds rounds of fresh episodes, each driving one update
           (pestv_few_shot_rounds).
learner    The learner options of docs/learner.md on one world (issue 46's look,
           docs/lab/2026-12-07-v2-decomposition-look.md): today's study settings (study), the
           sweep's PPO schedules (sweep_ppo), each option alone on top of sweep_ppo, and, when
           config.study.learner_combined names options, them all together (combined). Every arm
           carries router:mlp and split recall and precision against the DP optimum.
"""
from __future__ import annotations

from gp_jax import config_lists
from gp_jax import errors
from gp_jax.runs import system as system_lib
from gp_jax.runs.studies.runner import Variant

NEW_ROLES = "planner,executor,summarizer,thinker,verifier"


def phases(config) -> list[Variant]:
  del config
  return [
      Variant("phase2"),
      Variant("phase1_d1w3", train={"mdp.phase1_depth": 1, "mdp.phase1_width": 3}),
      Variant("phase1_d2w2", train={"mdp.phase1_depth": 2, "mdp.phase1_width": 2}),
  ]


def held_out_pools(config) -> tuple[str, str, tuple[str, ...]]:
  """(training pool without the unseen LLMs, evaluation pool with them, the unseen LLMs) as
  comma lists and a tuple, for config.study.unseen_llms: LLMs of config.llms are taken out of
  training; other catalog LLMs are added at evaluation."""
  full = system_lib.full_catalog(config)
  pool = system_lib.select_llms(full, config.llms)
  held = config_lists.names(config.study.unseen_llms)
  for m in held:
    if m not in full.names:
      raise errors.unknown_name("unseen LLM (config.study.unseen_llms)", m, full.names)
  train = [m for m in pool if m not in held]
  if not held or not train:
    raise errors.ConfigError("config.study.unseen_llms must name at least one LLM and leave at "
                             f"least one of config.llms for training; got {held}")
  return ",".join(train), ",".join(pool + [m for m in held if m not in pool]), held


def unseen(config) -> list[Variant]:
  routers = config_lists.names(config.study.routers)
  train, full, held = held_out_pools(config)
  served = int(config.study.served)
  without, new = {"llms": train}, {"llms": full}
  return [
      Variant("seen_tasks", routers=routers),
      Variant("unseen_tasks", evaluate={"data.test_tasks": "unseen"}, routers=routers),
      Variant("train_llms", train=without),
      Variant("unseen_llms", train=without, evaluate=new, held_out=held),
      Variant("unseen_llms_served", train=without, evaluate=new, held_out=held,
              few_shot=served, few_shot_updates=0),
      Variant("unseen_llms_few_shot", train=without, evaluate=new, held_out=held,
              few_shot=served),
      # trained with them: the plain run when they are in config.llms (shared with seen_tasks)
      Variant("unseen_llms_retrained", train={} if full == ",".join(
          system_lib.configured_llms(config)) else new, held_out=held),
  ]


def ablations(config) -> list[Variant]:
  del config
  return [
      Variant("transductive"),
      Variant("inductive_inference", history="none"),
      Variant("no_history", train={"model.history": "inductive"}),
      Variant("homogeneous", train={"model.encoder": "homogeneous"}),
      Variant("gat", train={"model.encoder": "gat"}),
      Variant("graph_transformer", train={"model.encoder": "transformer"}),
      Variant("history_summary", train={"model.history": "summary"}),
      Variant("history_retrieval", train={"model.history": "retrieval", "model.retrieval_k": 5}),
  ]


def roles(config) -> list[Variant]:
  few = int(config.study.few_shot)
  # Thinker and Verifier calls lengthen a complete workflow: raise the step cap to fit it.
  cap = max(int(config.mdp.step_cap),
            system_lib.mdp_config(config.mdp).max_calls(thinker=True, verifier=True))
  base = {}
  if config.study.roles_llms:
    base["llms"] = str(config.study.roles_llms)
  if int(config.study.roles_n_test):
    base["data.n_test"] = int(config.study.roles_n_test)
  new = {"roles": NEW_ROLES, "mdp.step_cap": cap}
  return [
      Variant("pes_trained", train=base),
      Variant("pestv_trained", train={**base, **new}),
      Variant("pestv_zero_shot", train=base, evaluate=new),
      Variant("pestv_served", train=base, evaluate=new, few_shot=few, few_shot_updates=0),
      Variant("pestv_few_shot", train=base, evaluate=new, few_shot=few),
      Variant("pestv_few_shot_rounds", train=base, evaluate=new, few_shot=few,
              few_shot_rounds=int(config.study.few_shot_rounds)),
  ]


# The sweep's PPO schedules (experiments/configs/sweep.py): entropy 0.03 and the learning rate
# both decaying linearly to 0 over the run.
SWEEP_PPO = {"ppo.entropy_coef": 0.03, "ppo.entropy_schedule": "linear",
             "ppo.entropy_final_fraction": 0.0, "ppo.lr_schedule": "linear",
             "ppo.lr_final_fraction": 0.0}
# Each learner option of docs/learner.md as the look sets it (on top of SWEEP_PPO).
LEARNER_OPTIONS = {
    "gamma1": {"ppo.gamma": 1.0},
    "factored": {"model.policy_head": "factored"},
    "role_entropy": {"ppo.role_entropy_coef": 0.01},
    "per_type": {"ppo.advantage_norm": "per_type"},
    "stop_min": {"ppo.entropy_stop": 0.05, "ppo.entropy_stop_min_episodes": 3000},
    "forced": {"train.force_planner_episodes": 600},
    "phase1": {"train.phase1_episodes": 1000},
    # Root credit (docs/lab/2026-12-07-v2-root-credit-plan.md): each with gamma = 1.
    "root_floor": {"ppo.gamma": 1.0, "train.root_floor": 0.2},
    "root_rollout": {"ppo.gamma": 1.0, "train.root_rollout": 16},
    "root_both": {"ppo.gamma": 1.0, "train.root_floor": 0.2, "train.root_rollout": 16},
}


def combined_options(text: str) -> list[str]:
  """'gamma1,forced' -> the named learner options (blanks dropped); unknown or repeated names
  are ConfigErrors."""
  names = [n.strip() for n in str(text).split(",") if n.strip()]
  for n in names:
    if n not in LEARNER_OPTIONS:
      raise errors.unknown_name("learner option", n, LEARNER_OPTIONS)
  if len(set(names)) != len(names):
    raise errors.ConfigError(f"study.learner_combined={text}: an option is repeated")
  return names


def learner(config) -> list[Variant]:
  extra = dict(routers=("mlp",), split_agreement=True)
  out = [Variant("study", **extra), Variant("sweep_ppo", train=dict(SWEEP_PPO), **extra)]
  out += [Variant(name, train={**SWEEP_PPO, **o}, **extra) for name, o in LEARNER_OPTIONS.items()]
  chosen = combined_options(config.study.get("learner_combined", ""))
  if chosen:
    train = dict(SWEEP_PPO)
    for n in chosen:
      train.update(LEARNER_OPTIONS[n])
    out.append(Variant("combined", train=train, **extra))
  return out


STUDIES = {"phases": phases, "unseen": unseen, "ablations": ablations, "roles": roles,
           "learner": learner}


def variants(name: str, config, only: str = "") -> list[Variant]:
  """The variants of study `name`; only: comma-separated variant names to keep ("" = all), in
  the study's order (an unknown name is a ConfigError listing the study's variants)."""
  if name not in STUDIES:
    raise errors.unknown_name("study", name, STUDIES)
  out = STUDIES[name](config)
  keep = [v.strip() for v in str(only).split(",") if v.strip()]
  known = [v.name for v in out]
  for k in keep:
    if k not in known:
      raise errors.unknown_name(f"{name} variant", k, known)
  return [v for v in out if v.name in keep] if keep else out
