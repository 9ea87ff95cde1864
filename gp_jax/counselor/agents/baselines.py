"""Baselines on the same graphs and LLM pool: LLM-only, Text RAG, GraphRAG (1-hop, 2-hop).

(Graph-CoT, the Thought/Action loop without plan and reflection, is loop.run_graph_cot.)

- LLM-only: the question alone, one call.
- Text RAG: Retrieve on the whole question (top-1 node); that node's features as context.
- GraphRAG k-hop: the same seed node and its neighbourhood up to k hops, breadth-first
  (neighbour types in stored order), each node linearised on one line, until the context budget
  (approximate tokens) is full.

All return a CounselorResult with one 'answer' call, so every method is scored and costed alike.
"""
from __future__ import annotations

import collections
import json
import time
from typing import Mapping

from gp_jax.counselor.agents import loop as agents
from gp_jax.counselor.agents import prompts
from gp_jax.counselor.agents import records
from gp_jax.counselor.kg import functions as functions_lib
from gp_jax.llm import base

MAX_IDS_PER_TYPE = 20  # neighbour ids listed per type in a linearised node


def _value_text(v) -> str:
  return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)


def linearize_node(funcs: functions_lib.GraphFunctions, node_id: str, *,
                   with_neighbors: bool = True) -> str:
  """One line: 'id (type): feature=value; ... | neighbour_type: id, id, ... (+n more)'."""
  g = funcs.graph
  feats = "; ".join(f"{k}={_value_text(v)}" for k, v in g.features(node_id).items())
  line = f"{node_id} ({g.node_type(node_id)}): {feats}"
  if with_neighbors:
    parts = []
    for t, ids in g.neighbors(node_id).items():
      more = f" (+{len(ids) - MAX_IDS_PER_TYPE} more)" if len(ids) > MAX_IDS_PER_TYPE else ""
      parts.append(f"{t}: {', '.join(ids[:MAX_IDS_PER_TYPE]) or '-'}{more}")
    if parts:
      line += " | " + "; ".join(parts)
  return line


def neighborhood_context(funcs: functions_lib.GraphFunctions, seed_id: str, *, hops: int,
                         token_budget: int) -> tuple[str, int]:
  """Linearised BFS neighbourhood of seed_id within `hops`, cut at `token_budget` tokens.

  Returns:
    (context text, number of nodes included).
  """
  g = funcs.graph
  seen = {seed_id}
  queue = collections.deque([(seed_id, 0)])
  lines: list[str] = []
  used = 0
  while queue:
    nid, depth = queue.popleft()
    line = linearize_node(funcs, nid)
    cost = prompts.count_tokens(line) + 1
    if used + cost > token_budget:
      break
    lines.append(line)
    used += cost
    if depth < hops:
      for ids in g.neighbors(nid).values():
        for j in ids:
          if j not in seen:
            seen.add(j)
            queue.append((j, depth + 1))
  return "\n".join(lines), len(lines)


async def _one_shot(question: str, context: str | None, *, method: str, pool: base.LLMPool,
                    select_llm: records.LLMSelector, qid: str,
                    sampling: Mapping[str, base.SamplingParams] | None, call_timeout_s: float,
                    record_prompts: bool, extra: dict) -> records.CounselorResult:
  t0 = time.perf_counter()
  session = agents.CallSession(pool=pool, select_llm=select_llm, qid=qid, question=question,
                               sampling=sampling, call_timeout_s=call_timeout_s,
                               record_prompts=record_prompts)
  c = await session.call("answer", 0, 0, prompts.answer_messages(question=question, context=context))
  answer = c.text.strip().splitlines()[0].strip() if c.ok and c.text.strip() else None
  if answer is not None and answer.lower().startswith("answer:"):
    answer = answer[len("answer:"):].strip() or None
  trial = records.TrialResult(trial=0, answer=answer, end_reason="single_call", steps=[],
                              scratchpad=context or "")
  return records.CounselorResult(qid=qid, question=question, method=method, trials=[trial],
                                 calls=session.calls, first_answer=answer, final_answer=answer,
                                 wall_s=time.perf_counter() - t0, extra=extra)


async def run_llm_only(question: str, *, funcs: functions_lib.GraphFunctions, pool: base.LLMPool,
                       select_llm: records.LLMSelector, qid: str = "",
                       sampling: Mapping[str, base.SamplingParams] | None = None,
                       call_timeout_s: float = 600.0, record_prompts: bool = False,
                       method: str = "llm_only") -> records.CounselorResult:
  """The question alone, answered in one call (funcs is unused; kept for a uniform signature)."""
  del funcs
  return await _one_shot(question, None, method=method, pool=pool, select_llm=select_llm, qid=qid,
                         sampling=sampling, call_timeout_s=call_timeout_s,
                         record_prompts=record_prompts, extra={})


async def run_text_rag(question: str, *, funcs: functions_lib.GraphFunctions, pool: base.LLMPool,
                       select_llm: records.LLMSelector, qid: str = "",
                       sampling: Mapping[str, base.SamplingParams] | None = None,
                       call_timeout_s: float = 600.0, record_prompts: bool = False,
                       method: str = "text_rag") -> records.CounselorResult:
  """The top-1 node retrieved for the question, its features as context."""
  seed = funcs.retrieve([question])[0]
  context = linearize_node(funcs, seed, with_neighbors=False)
  return await _one_shot(question, context, method=method, pool=pool, select_llm=select_llm,
                         qid=qid, sampling=sampling, call_timeout_s=call_timeout_s,
                         record_prompts=record_prompts, extra={"seed_node": seed, "context_nodes": 1})


async def run_graphrag(question: str, *, funcs: functions_lib.GraphFunctions, pool: base.LLMPool,
                       select_llm: records.LLMSelector, qid: str = "", hops: int = 1,
                       context_token_budget: int = 2000,
                       sampling: Mapping[str, base.SamplingParams] | None = None,
                       call_timeout_s: float = 600.0, record_prompts: bool = False,
                       method: str | None = None) -> records.CounselorResult:
  """The retrieved node's k-hop neighbourhood, linearised within the context budget."""
  seed = funcs.retrieve([question])[0]
  context, n_nodes = neighborhood_context(funcs, seed, hops=hops, token_budget=context_token_budget)
  return await _one_shot(question, context, method=method or f"graphrag_{hops}hop", pool=pool,
                         select_llm=select_llm, qid=qid, sampling=sampling,
                         call_timeout_s=call_timeout_s, record_prompts=record_prompts,
                         extra={"seed_node": seed, "context_nodes": n_nodes})
