"""Batched decisions of concurrent workflows: one jitted policy call for every decision waiting.

Workflows that each run on their own (asyncio tasks: served requests, Graph Counselor questions)
ask for one decision at a time. A `DecisionBatcher` collects the observations waiting at one
turn of the event loop, scores them with one call of the batched policy (on the loop, or in a
worker thread on a copy of the policy's inputs taken on the loop, so the loop keeps serving and
may change the history sums meanwhile)
(gp_jax.rl.rollout.PolicyRunner.act_each, the batch padded to the smallest of a few fixed sizes,
so each size compiles once) and hands every workflow its decision: action, log-probability and
value. Sampled decisions draw with their own key, decision_key(key, ids) of the ids the caller
gives (say a question's hash and the call's index), so a decision is the same whichever other
decisions share its batch and in whatever order the workflows arrive: batching changes the speed,
not the actions. Greedy decisions are the policy head's (gp_jax.graph.garnet.greedy_actions: the
argmax of the masked logits, or with the factored head the most probable role, then its most
probable LLM). Each decision may say
which it is (a learning server samples the decisions of its exploring requests only): greedy and
sampled decisions share one policy call, the choice made per row inside it.

(The lock-step rollouts of GraphPlanner's training, gp_jax/rl/rollout.run_episodes, batch their
episodes themselves: every episode advances one step per policy call.)
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import time
from typing import Any, Callable, NamedTuple, Sequence

import jax
import numpy as np

from gp_jax.graph import features as features_lib
from gp_jax.rl import rollout
from gp_jax.util import aio
from gp_jax.util import buckets as buckets_lib


class _Waiting(NamedTuple):
  """A decision waiting for the next batched call."""
  obs: dict
  ids: np.ndarray
  greedy: bool
  extra: Any
  future: asyncio.Future


@dataclasses.dataclass(frozen=True)
class Decision:
  action: int
  logp: float       # log-probability of the action under the policy
  value: float      # the value head's V(s)
  seconds: float    # this decision's share of its batched call's time (seconds / batch size)


# prepare(observations, extras) -> observations: what a batch's observations need from the moment
# it is scored (the serving retrieval ablation adds the history rows nearest to each query).
Prepare = Callable[[list[dict], list[Any]], list[dict]]


class DecisionBatcher:
  """Scores the decisions of concurrent workflows together (module docstring).

  Args:
    runner: the batched policy, with its parameters set.
    buckets: padded batch sizes (e.g. gp_jax.rl.batch.padding_buckets); at most the largest is
      scored per call.
    key: the sampling key (needed for sampled decisions).
    greedy: the decisions' default: greedy (the policy head's); else sampled with per-decision
      keys (`decide` may say otherwise for one decision).
    num_ids: ids per decision (the width of `decide`'s ids).
    prepare: applied to each batch's observations (on the loop), with the extras given to
      `decide`.
    executor: where the policy call runs (a worker thread, on runner.decision_inputs() taken on
      the loop); None: on the loop.
  """

  def __init__(self, runner: rollout.PolicyRunner, buckets: Sequence[int], *,
               key: jax.Array | None = None, greedy: bool = True, num_ids: int = 1,
               prepare: Prepare | None = None,
               executor: concurrent.futures.Executor | None = None):
    if not buckets or min(buckets) < 1:
      raise ValueError(f"decision batch sizes must be >= 1, got {list(buckets)}")
    self.runner, self.buckets = runner, tuple(sorted(buckets))
    self.samples = key is not None
    self.key = key if key is not None else jax.random.PRNGKey(0)
    self.num_ids, self.prepare, self.executor = num_ids, prepare, executor
    self.greedy = self._greedy(greedy)
    self._pending: list[_Waiting] = []
    self._wake: asyncio.Event | None = None
    self._task: asyncio.Task | None = None
    self.calls = 0          # batched policy calls
    self.decisions = 0
    self.act_s = 0.0        # seconds in policy calls

  def bucket(self, n: int) -> int:
    """The padded size of a batch of n decisions (n <= the largest bucket)."""
    return buckets_lib.bucket(n, self.buckets)

  def _ids(self, ids: Sequence[int]) -> np.ndarray:
    out = np.zeros(self.num_ids, np.uint32)
    if len(ids) != self.num_ids:
      raise ValueError(f"a decision takes {self.num_ids} ids, got {list(ids)}")
    out[:] = [int(i) & 0xFFFFFFFF for i in ids]
    return out

  def _prepared(self, obs: list[dict], extras: list[Any]) -> list[dict]:
    return self.prepare(list(obs), list(extras)) if self.prepare is not None else list(obs)

  def _greedy(self, greedy: bool | None) -> bool:
    """A decision's kind (None: the batcher's default); sampling needs the batcher's key."""
    greedy = self.greedy if greedy is None else bool(greedy)
    if not greedy and not self.samples:
      raise ValueError("sampled decisions need a key: this batcher was made without one")
    return greedy

  def _score(self, obs: list[dict], ids: list[np.ndarray], greedy: list[bool],
             inputs: tuple | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The padded policy call (any thread): actions, log-probabilities, values of the real rows
    (greedy: per row; the padding rows repeat the last)."""
    size = self.bucket(len(obs))
    batch = features_lib.stack(obs, pad_to=size)
    pad = size - len(ids)
    id_rows = np.stack(list(ids) + [ids[-1]] * pad)
    greedy_rows = np.asarray(list(greedy) + [greedy[-1]] * pad, bool)
    a, lp, v = self.runner.act_each(batch, self.key, id_rows, greedy_rows, inputs=inputs)
    n = len(obs)
    return a[:n], lp[:n], v[:n]

  def act(self, obs: list[dict], ids: list[np.ndarray], extras: list[Any]
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Actions, log-probabilities and values [n] of n <= the largest bucket decisions of the
    batcher's default kind, now (one padded policy call on this thread)."""
    return self._score(self._prepared(obs, extras), ids, [self.greedy] * len(obs))

  def warm_up(self, obs: dict, extra: Any = None) -> None:
    """Compiles the policy for every batch size before the first decision (greedy and sampled
    rows are one compiled function: the choice is an input)."""
    for b in self.buckets:
      self.act([obs] * b, [self._ids([0] * self.num_ids)] * b, [extra] * b)

  async def decide(self, obs: dict, ids: Sequence[int] = (0,), extra: Any = None,
                   greedy: bool | None = None) -> Decision:
    """The decision for one observation; awaits the next batched policy call.

    Args:
      obs: one observation (gp_jax.graph.features layout).
      ids: num_ids integers naming this decision: its sampling key is decision_key(key, ids).
      extra: passed to `prepare` with the observation.
      greedy: greedy (the policy head's), or sampled (needs the batcher's key); None: the
        batcher's default.
    """
    loop = asyncio.get_running_loop()
    ids, greedy = self._ids(ids), self._greedy(greedy)
    if self._task is None or self._task.done():
      self._wake = asyncio.Event()
      self._task = loop.create_task(self._serve())
    fut = loop.create_future()
    self._pending.append(_Waiting(obs, ids, greedy, extra, fut))
    self._wake.set()
    return await fut

  async def _serve(self) -> None:
    while True:
      await self._wake.wait()
      await asyncio.sleep(0)   # workflows whose LLM call finished this turn join the batch
      self._wake.clear()
      take = self.buckets[-1]
      batch, self._pending = self._pending[:take], self._pending[take:]
      if self._pending:
        self._wake.set()
      batch = [b for b in batch if not b.future.done()]   # cancelled (timed-out) workflows
      if not batch:
        continue
      t0 = time.perf_counter()
      try:
        obs = self._prepared([b.obs for b in batch], [b.extra for b in batch])
        ids, greedy = [b.ids for b in batch], [b.greedy for b in batch]
        if self.executor is None:
          actions, logp, values = self._score(obs, ids, greedy)
        else:   # the inputs are copied on the loop: consistent while the loop changes the sums
          actions, logp, values = await asyncio.get_running_loop().run_in_executor(
              self.executor, self._score, obs, ids, greedy, self.runner.decision_inputs())
      except Exception as e:   # surfaced to every waiting workflow; the batcher keeps serving
        for b in batch:
          if not b.future.done():
            b.future.set_exception(e)
        continue
      dt = time.perf_counter() - t0
      self.act_s += dt
      self.calls += 1
      self.decisions += len(batch)
      for b, a, lp, v in zip(batch, actions, logp, values):
        if not b.future.done():
          b.future.set_result(Decision(int(a), float(lp), float(v), dt / len(batch)))

  async def aclose(self) -> None:
    """Stops the batching task (decisions still waiting are cancelled with it)."""
    await aio.cancel_and_wait(self._task)
