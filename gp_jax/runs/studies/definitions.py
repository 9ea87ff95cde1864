"""The paper's studies as lists of variants (gp_jax/runs/studies/runner.py runs them).

phases     Phase 1 (user-defined workflow, the router picks only the LLM of each step:
           Depth=1/Width=3 and Depth=2/Width=2) vs Phase 2 (the router builds the workflow).
           Each phase is compared with its own DP optimum.
unseen     Unseen tasks: trained on the seen tasks, tested on LogicGrid, MGSM and CommonGen
           (single-round routers fitted on the same training queries alongside). Unseen LLMs: the
           router trained on the 9 training LLMs is evaluated with the 3 held-out LLMs added as new
           hubs (built from their description embeddings), without retraining; the same router on
           the 9-LLM pool is the reference.
ablations  Inductive vs transductive inference (the transductive router evaluated with an empty
           history), no history (trained and evaluated without), and the encoder and history
           variants of gp_jax/graph/garnet.py (homogeneous, GAT, graph transformer, history as a
           text summary, history by retrieval with k=5).
roles      Thinker and Verifier (paper App. E), on the pool config.study.roles_llms (the DP optimum
           with five roles costs K^3 in the pool size): trained with them; zero-shot (router trained on
           Planner/Executor/Summarizer, new role hubs added at test time); few-shot (zero-shot plus
           50 episodes with the new hubs in the history and one PPO update on them).
"""
from __future__ import annotations

from gp_jax import errors
from gp_jax.llm import catalog as catalog_lib
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


def with_held_out(config) -> str:
  """The training LLMs of `config` followed by the catalog's held-out LLMs (comma list)."""
  full = catalog_lib.load_catalog(config.catalog_file or catalog_lib.DEFAULT_POOL_FILE)
  names = system_lib.select_llms(full, config.llms)
  return ",".join(names + [m.name for m in full.llms if m.held_out and m.name not in names])


def unseen(config) -> list[Variant]:
  routers = tuple(r.strip() for r in str(config.study.routers).split(",") if r.strip())
  return [
      Variant("seen_tasks", routers=routers),
      Variant("unseen_tasks", evaluate={"data.test_tasks": "unseen"}, routers=routers),
      Variant("train_llms"),
      Variant("unseen_llms", evaluate={"llms": with_held_out(config)}),
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
  if config.study.get("roles_llms", ""):
    base["llms"] = str(config.study.roles_llms)
  if int(config.study.get("roles_n_test", 0)):
    base["data.n_test"] = int(config.study.roles_n_test)
  new = {"roles": NEW_ROLES, "mdp.step_cap": cap}
  return [
      Variant("pes_trained", train=base),
      Variant("pestv_trained", train={**base, **new}),
      Variant("pestv_zero_shot", train=base, evaluate=new),
      Variant("pestv_few_shot", train=base, evaluate=new, few_shot=few),
  ]


STUDIES = {"phases": phases, "unseen": unseen, "ablations": ablations, "roles": roles}


def variants(name: str, config) -> list[Variant]:
  if name not in STUDIES:
    raise errors.unknown_name("study", name, STUDIES)
  return STUDIES[name](config)
