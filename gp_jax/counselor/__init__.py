"""Graph Counselor: multi-agent GraphRAG over knowledge graphs (GRBench format), routable agents.

Rooms, each importing only the rooms listed before it (tests/counselor/test_rooms.py):

  kg/       the knowledge graph: store (graph_store), question files (data), graph functions and
            the Retrieve index (functions, retrieval), action parser and interpreter
  agents/   the agents loop with self-reflection (loop), its prompts, what a run records
            (records: AgentStep, CallRecord, LLMSelector), the one-shot baselines
  eval/     answer metrics and the LLM judge (metrics), methods run and scored (evaluate)
  synth/    generated graphs and questions (generator, templates, plans), the oracle backend and
            the simulated counselor backend (sim_pool)
  routing/  GraphPlanner's router picking every agent step's backbone, on graph/ and rl/'s
            machinery: observations (features), LLM selector (selector), training (router)

The experiments that assemble them are in the run layer (gp_jax/runs/counselor.py,
gp_jax/runs/counselor_routed.py). The entry points a router uses (every LLM call of a run takes
its model from `select_llm`):

  funcs = make_functions(load_graph("graph.json"), make_encoder("hashing"))
  result = await run_counselor(question, funcs=funcs, pool=pool, select_llm=my_router)
  result.calls  # CallRecord per LLM call: kind, role, model, tokens, $ cost, latency, error
"""
from gp_jax.counselor.agents.loop import (DEFAULT_SAMPLING, parse_verdict,  # noqa: F401
                                          run_counselor, run_graph_cot)
from gp_jax.counselor.agents.records import (AGENT_KINDS, AGENT_ROLES, AgentStep,  # noqa: F401
                                             CallRecord, CounselorResult, LLMSelector,
                                             TrialResult, fixed_selector)
from gp_jax.counselor.eval.harness import METHODS, run_method  # noqa: F401
from gp_jax.counselor.kg.data import GraphQuestion, load_questions, save_questions  # noqa: F401
from gp_jax.counselor.kg.functions import GraphFunctions, make_functions  # noqa: F401
from gp_jax.counselor.kg.graph_store import (KnowledgeGraph, from_json_dict,  # noqa: F401
                                             load_graph)
from gp_jax.counselor.synth.generator import (DOMAINS, generate_dataset,  # noqa: F401
                                              generate_graph)
from gp_jax.counselor.synth.oracle import OraclePool  # noqa: F401
