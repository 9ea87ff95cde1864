"""Graph Counselor: multi-agent GraphRAG over knowledge graphs (GRBench format), with routable agents.

The entry points a router uses (every LLM call of a run takes its model from `select_llm`):

  funcs = make_functions(load_graph("graph.json"), make_encoder("hashing"))
  result = await run_counselor(question, funcs=funcs, pool=pool, select_llm=my_router)
  result.calls  # CallRecord per LLM call: kind, role, model, tokens, $ cost, latency, error

See gp_jax/counselor/agents/loop.py for the loop and records.py for AgentStep / CallRecord.
"""
from gp_jax.counselor.agents.loop import DEFAULT_SAMPLING, parse_verdict, run_counselor, run_graph_cot  # noqa: F401
from gp_jax.counselor.eval.evaluate import METHODS, run_method  # noqa: F401
from gp_jax.counselor.kg.data import GraphQuestion, load_questions, save_questions  # noqa: F401
from gp_jax.counselor.kg.functions import GraphFunctions, make_functions  # noqa: F401
from gp_jax.counselor.kg.graph_store import KnowledgeGraph, from_json_dict, load_graph  # noqa: F401
from gp_jax.counselor.synth.generator import DOMAINS, generate_dataset, generate_graph  # noqa: F401
from gp_jax.counselor.synth.oracle import OraclePool  # noqa: F401
from gp_jax.counselor.agents.records import (AGENT_KINDS, AGENT_ROLES, AgentStep, CallRecord,  # noqa: F401
                                      CounselorResult, LLMSelector, TrialResult, fixed_selector)
