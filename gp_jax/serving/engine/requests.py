"""A served request's paths through the engine: the learned workflow and pass-through.

`Requests` holds RouterSession's request methods (gp_jax/serving/engine/session.py assembles the
parts they use). The learned workflow is one episode of the routing MDP over the LLM pool:
every decision waits in the DecisionBatcher (gp_jax/rl/decisions.py) with the decisions of the
other requests in flight and is scored by one call of the jitted batched policy in the compute
thread; LLM calls go through the pool on the event loop. The root's Executor ends the episode
and its answer is the request's answer. A cancelled request (client gone, deadline) stops at
its next await and logs the calls it spent. Every answered request's route record is logged
before the answer is given out (gp_jax/serving/engine/feedback.py).
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from typing import Callable

import numpy as np

from gp_jax.llm import base
from gp_jax.rl import rollout
from gp_jax.serving.engine import admission as admission_lib
from gp_jax.serving.engine import conversation as conversation_lib
from gp_jax.serving.engine import errors as errors_lib
from gp_jax.workflow import mdp
from gp_jax.workflow import prompts

_log = logging.getLogger(__name__)
ROUTER_MODEL = "graphplanner"


@dataclasses.dataclass
class Served:
  """One answered request: the answer and the record logged for it (the store's route log)."""
  answer: str
  record: dict


def _usage(calls: list[dict]) -> dict:
  p = sum(c["input_tokens"] for c in calls)
  c_ = sum(c["output_tokens"] for c in calls)
  return dict(prompt_tokens=p, completion_tokens=c_, total_tokens=p + c_)


def _call_record(c: mdp.Call) -> dict:
  return dict(step=c.step, role=c.role, llm=c.llm, action=c.action, node=c.node,
              input_text=c.input_text, output_text=c.output_text, input_tokens=c.input_tokens,
              output_tokens=c.output_tokens, cost_usd=c.cost_usd, latency_s=c.latency_s,
              error=c.error)


class Requests:
  """The request paths of a RouterSession (mixed into it; see the module docstring)."""

  async def _off_loop(self, fn, *args) -> tuple:
    """fn(*args) in the compute thread; returns (its result, the seconds it ran there)."""
    def timed():
      t0 = time.perf_counter()
      out = fn(*args)
      return out, time.perf_counter() - t0
    return await asyncio.get_running_loop().run_in_executor(self._compute, timed)

  def _checked_task(self, task: str | None, admission: admission_lib.Admission | None) -> str:
    """check_task; a request refused for its task gives its queue place back."""
    try:
      return self.check_task(task)
    except errors_lib.Refusal:
      if admission is not None:
        admission.cancel()
      raise

  async def complete(self, text: str, *, task: str | None = None, rid: str | None = None,
                     seed: int | None = None, params: base.SamplingParams | None = None,
                     conversation: str = "", on_delta: Callable[[str], None] | None = None,
                     admission: admission_lib.Admission | None = None,
                     request_id: str | None = None, key: str | None = None) -> Served:
    """Runs the learned workflow on one query. Raises a Refusal when it
    cannot be answered.

    params: sampling of the final call (the root's answering Executor); the other calls keep
      the served config's sampling. conversation: context every call on the root node starts its
      user message with (conversation.render). on_delta: receives the final call's text as the
      pool streams it. admission: a place from `admit` (default: taken here; refused when full).
    A cancelled request (client gone, deadline) logs the backbone calls it spent and re-raises.
    key: the name of the API key that asked (the route record's `key`; None without keys).
    """
    task = self._checked_task(task, admission)
    rid = rid or new_id()
    admission = admission or self.admissions.admit()
    async with admission:
      return await self._complete(text, task, rid, seed, params, conversation, on_delta,
                                  request_id, key)

  async def _complete(self, text, task, rid, seed, params, conversation, on_delta,
                      request_id, key=None) -> Served:
    t0 = time.perf_counter()
    created = time.time()
    q = self.make_query(text, task, rid)
    seed = seed if seed is not None else rollout.episode_seed("serve", rid)
    state = self.env.reset(q)
    history_rows = len(self.history) if self.reads_memory else 0
    backbone_s = 0.0
    decisions = 0
    finish = None
    calling = False
    version = self.router_version
    episode = None
    try:
      (t_emb, q_emb, rows, obs), compute_s = await self._off_loop(
          self._first_observation, [self.describe(q)[0], q.query], state, self.env.mask(state))
      if self.learner is not None:
        episode = rollout.Episode(q, state, seed, t_emb, q_emb, rows)
      while not state.done:
        decision = await self._decide(obs, rid, decisions, q_emb, episode)
        action, policy_s = decision.action, decision.seconds
        compute_s += policy_s
        decisions += 1
        # The root's Executor ends the episode: its answer is the request's answer.
        final = self.space.decode(action)[0].kind == "executor" and state.current == 0
        t1 = time.perf_counter()
        calling = True
        res = await self.env.step(state, q, action, seed, params=params if final else None,
                                  conversation=conversation if state.current == 0 else "",
                                  on_delta=on_delta if final else None)
        calling = False
        backbone_s += time.perf_counter() - t1
        if episode is not None:
          episode.rewards.append(res.reward)   # -alpha x cost; the feedback score joins it
        finish = res.finish_reason if final else finish
        if not state.done:   # the last call's row would be read by no decision
          args = (state, res.call, t_emb, q_emb, rows, self.env.mask(state))
          if self.rows_on_loop:
            t2 = time.perf_counter()
            rows, obs = self._next_observation(*args)
            compute_s += time.perf_counter() - t2
          else:
            (rows, obs), dt = await self._off_loop(self._next_observation, *args)
            compute_s += dt
    except asyncio.CancelledError:
      self._log_cancelled(rid, request_id, [_call_record(c) for c in state.calls], calling)
      raise
    calls = [_call_record(c) for c in state.calls]
    total_s = time.perf_counter() - t0
    record = dict(type="route", id=rid, created=created, model=ROUTER_MODEL, alpha=self.alpha,
                  key=key, task=task, query=q.query, answer=state.final_answer, calls=calls,
                  usage=_usage(calls), cost_usd=sum(c["cost_usd"] for c in calls),
                  history_rows=history_rows, finish_reason=_finish(finish),
                  request_id=request_id, router_version=version, explored=self.explores(rid),
                  timing=dict(total_s=total_s, backbone_s=backbone_s,
                              router_s=max(0.0, total_s - backbone_s), compute_s=compute_s,
                              decisions=decisions))
    await self.records.log_route(record)
    if episode is not None:
      self._keep_trajectory(rid, episode)
    self._check_answered(state, record)
    self.counters["served"] += 1
    return Served(state.final_answer, record)

  def _first_observation(self, texts: list[str], state, mask) -> tuple:
    """Compute thread: a request's task and query embeddings, its (empty) workflow memory rows
    and its first observation, in one hop (each hop waits its turn behind other requests').
    texts: the task description and the query."""
    t_emb, q_emb = self.featurizer.encoder.encode(texts)
    rows = np.zeros((0, self.featurizer.spec.row_dim), np.float32)
    return t_emb, q_emb, rows, self.featurizer.observe(state, t_emb, q_emb, rows, mask)

  def _next_observation(self, state, call, t_emb, q_emb, rows, mask) -> tuple:
    """The workflow memory rows with `call`'s row added (its texts encoded), and the next
    decision's observation. On the loop when the encoder is cheap (rows_on_loop: a hop to the
    compute thread and back costs the loop more than this, and waits behind the other requests'
    work at every decision), else in the compute thread."""
    rows = np.concatenate([rows, self.featurizer.memory_rows([call], None)])
    return rows, self.featurizer.observe(state, t_emb, q_emb, rows, mask)

  def _check_answered(self, state, record: dict) -> None:
    """Raises a BACKBONE Refusal when the workflow gave no answer (its backbones failed). Its
    route is logged and kept for feedback all the same (a client may report the failure, score 0, to
    the memory and the learner): its details carry the completion id and the $ cost spent."""
    calls = record["calls"]
    failed = [c["error"] for c in calls if c["error"]]
    if state.final_answer is None or (calls and calls[-1]["error"]):
      self.counters["unservable"] += 1
      kinds = ", ".join(sorted(set(failed))) or "no final answer within the step cap"
      raise errors_lib.Refusal(
          errors_lib.BACKBONE, f"the workflow produced no answer: {len(failed)} of {len(calls)} "
          f"backbone calls failed ({kinds})", "backbone_error",
          details={"request_id": record["id"], "cost_usd": record["cost_usd"]})

  async def _decide(self, obs: dict, rid: str, index: int, q_emb, episode):
    """Decision `index` of request `rid`: greedy, or sampled for an exploring request (with its
    own key); a learning server's `episode` keeps what the policy saw and chose."""
    explore = self.explores(rid)
    ids = (rollout.episode_seed("decision", rid, index),) if explore else (0,)
    decision = await self.batcher.decide(obs, ids=ids, extra=q_emb, greedy=not explore)
    if episode is not None:   # as a training rollout's episode records it
      episode.obs.append(obs)
      episode.actions.append(decision.action)
      episode.logp.append(decision.logp)
      episode.values.append(decision.value)
    return decision

  def _keep_trajectory(self, rid: str, episode: rollout.Episode) -> None:
    """A served episode waits for its feedback (the oldest beyond keep_trajectories go)."""
    self._trajectories[rid] = episode
    while len(self._trajectories) > self.learner.settings.keep_trajectories:
      self._trajectories.popitem(last=False)
      self.counters["trajectories_dropped"] += 1

  def _log_cancelled(self, rid: str, request_id: str | None, calls: list[dict],
                     aborted: bool) -> None:
    """The calls a cancelled request spent: one log line and the `cancelled*` counters (its
    route is not logged: it has no answer, and feedback on it would teach nothing true)."""
    cost = sum(c["cost_usd"] for c in calls)
    self.counters["cancelled"] += 1
    self.counters["cancelled_calls"] += len(calls)
    self.counters["cancelled_aborted_calls"] += int(aborted)
    self.counters["cancelled_cost_usd"] += cost
    route = ",".join(f"{c['role']}:{c['llm']}" for c in calls) or "-"
    _log.warning("cancelled %s (x-request-id %s): %d backbone calls done, $%.6g, route %s%s",
                 rid, request_id or "-", len(calls), cost, route,
                 "; one call aborted in flight" if aborted else "")

  async def passthrough(self, model: str, messages: list[dict], params: base.SamplingParams, *,
                        task: str | None = None, rid: str | None = None,
                        on_delta: Callable[[str], None] | None = None,
                        admission: admission_lib.Admission | None = None,
                        request_id: str | None = None, key: str | None = None) -> Served:
    """One call of backbone `model`, no routing. On the simulator (which answers only the
    workflow's role prompts) the last user message is asked as one Executor call, with the
    other messages as its context block (conversation.render)."""
    task = self._checked_task(task, admission)
    rid = rid or new_id()
    text = last_user_text(messages)
    admission = admission or self.admissions.admit()
    async with admission:
      t0, created = time.perf_counter(), time.time()
      q = self.make_query(text, task, rid)
      if self.world is not None:
        messages = prompts.build_messages(self.executor, self.env.reset(q), self.system.mdp_cfg,
                                          *self.describe(q),
                                          conversation=conversation_lib.render(messages))
      try:
        if on_delta is None:
          out = await self.pool.chat(model, messages, params)
        else:
          out = await self.pool.chat_stream(model, messages, params, on_delta)
      except asyncio.CancelledError:
        self._log_cancelled(rid, request_id, [], True)
        raise
      total_s = time.perf_counter() - t0
    if out.error:
      self.counters["unservable"] += 1
      raise errors_lib.Refusal(errors_lib.BACKBONE, f"backbone {model} failed: {out.error}",
                               "backbone_error")
    call = dict(step=0, role="passthrough", llm=model,
                action=self.space.encode(self.executor.name, model), node=0, input_text=q.query,
                output_text=out.text, input_tokens=out.input_tokens,
                output_tokens=out.output_tokens, cost_usd=out.cost_usd,
                latency_s=out.latency_s or total_s, error=None)
    record = dict(type="route", id=rid, created=created, model=model, alpha=None, key=key,
                  task=task, query=q.query, answer=out.text, calls=[call], usage=_usage([call]),
                  cost_usd=out.cost_usd, history_rows=None,
                  finish_reason=_finish(out.finish_reason), request_id=request_id,
                  timing=dict(total_s=total_s, backbone_s=total_s, router_s=0.0, compute_s=0.0,
                              decisions=0))
    await self.records.log_route(record)
    self.counters["passthrough"] += 1
    return Served(out.text, record)


def _finish(reason: str | None) -> str:
  """The OpenAI finish_reason of an answer whose final call ended with `reason`."""
  return "length" if reason == "length" else "stop"


def new_id() -> str:
  return "chatcmpl-" + uuid.uuid4().hex


def last_user_text(messages: list[dict]) -> str:
  return next((m["content"] for m in reversed(messages) if m.get("role") == "user"), "")
