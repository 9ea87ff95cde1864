"""Rollouts: many episodes in flight, one batched jitted policy call per lock-step.

Each lock-step gathers the observation of every running episode, scores them with one call of
the jitted GARNet policy, then awaits all their LLM calls together (asyncio). Finished episodes
hand their slot to the next query. The order of everything is fixed by slot order, so a run is
deterministic whatever the LLM latencies. Per-hub history sums for decisions are kept
incrementally: rows are transformed once, with the current parameters, when they arrive.
History ablations (the model's fields say which): history_input="summary" reads per-hub summary
embeddings made from the history memory at each `set_params` (fixed for the iteration, so the PPO
update is given the same array: `history_input_array`); retrieval_k > 0 adds the k most similar
history rows to every observation (stored with it, so the update sees the same rows).
Row layout 2 (model.row_layout; docs/memory.md): a finished episode's rows carry each call's
credit of its scored utility (Featurizer.episode_rows), and every decision reads per-hub
statistics of the history (history.HubStats) kept here beside the hub sums; the rollout stores
them in each observation (hub_stats), so the update reads what the decision read.
Online memory (evaluation, weights frozen): `online=True` lets finished episodes join the history
as in training and keeps it within its capacity as they join (see `run_episodes`).
Forced planners (training's force_planner_episodes): the first `planner_first` queries' episodes
decide their first step among the planners only (mdp.planner_only); the observation stores that
mask, so the decision's log-probability and the PPO update's ratio are both under it.
(`first_kind="executor"` restricts those first steps to the executors instead: the root-credit
continuations that answer directly, gp_jax/rl/root_credit.py.)
Root floor (training's root_floor = e > 0, sampled rollouts only): each episode's first action is
drawn from the behaviour mixture (1 - e) x the policy + e x uniform over the valid actions, and
its recorded log-probability is the mixture's (root_credit.floor_root), so the PPO ratio at the
root is taken against what sampled it. Greedy rollouts read the policy alone.
Decision statistics (training's metrics, gp_jax/rl/loop.py): every decision records the entropy
of the distribution its action was drawn from (the softmax of the masked logits, over the valid
actions) and its type, read from the state and the mask at decision time (`decision_type`):
  root       the episode's first decision (at the query itself);
  pending    a later decision at a pending node that may still be planned: the mask holds a
             planner and an executor action (plan or execute is open);
  summarize  a decision at a planned node whose children are answered: the mask holds a
             summarizer action (summarise, or verify first where a verifier is allowed);
  other      every other decision: a pending node that can no longer be planned (planner budget
             spent, depth limit, Phase 1's fixed structure) and the root's final answer after its
             summary.
The first decision also records the probability its distribution puts on the planner actions
(Episode.p_planner_root; 1 in a forced-planner episode, whose first mask holds planners only).
"""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
from typing import Callable

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from gp_jax.graph import features as features_lib
from gp_jax.graph import garnet as garnet_lib
from gp_jax.graph import history as history_lib
from gp_jax.rl import batch as batch_lib
from gp_jax.rl import parallel
from gp_jax.rl import root_credit
from gp_jax.types import Query
from gp_jax.workflow import env as env_lib
from gp_jax.workflow import mdp

ROW_CHUNK = 256   # new history rows are transformed in chunks of this size (one compile)


class PolicyRunner:
  """Jitted batched policy with incrementally maintained history hub sums (host side)."""

  def __init__(self, model: garnet_lib.GARNet, hub_features: np.ndarray, batch_size: int,
               max_traces: int | None = None,
               featurizer: features_lib.Featurizer | None = None, mesh=None):
    """featurizer: needed by the summary and retrieval ablations (text encoder, row layout).
    mesh: process-local devices (parallel.make_mesh(local=True)) the history refresh is sharded
    over; None or one device: unsharded."""
    self.model, self.batch_size = model, batch_size
    self.hub_features = jnp.asarray(hub_features)
    A = hub_features.shape[0]
    self.num_hubs = A
    self.params = None
    self.summary = model.history_input == "summary" and model.use_history
    self.retrieval_k = int(model.retrieval_k)
    self.keeps_sums = model.use_history and not self.summary
    if (self.summary or self.retrieval_k) and featurizer is None:
      raise ValueError("the summary and retrieval history modes need the featurizer")
    self.featurizer = featurizer
    self.summary_texts: list[str] = []
    width = featurizer.spec.text_dim if self.summary else model.hidden
    self.hub_sum = np.zeros((A, width), np.float32)
    self.hub_count = np.zeros(A, np.float32)
    self.row_layout = int(getattr(model, "row_layout", 1))
    self.stats = history_lib.HubStats(A) if model.reads_stats else None

    def scores(params, hub_features, hub_sum, hub_count, obs):
      h_hist = model.apply({"params": params}, hub_features, hub_sum, hub_count,
                           method=model.history_hubs)
      logits = jax.vmap(lambda o: model.apply({"params": params}, h_hist, o, method=model.policy))(obs)
      values = jax.vmap(lambda o: model.apply({"params": params}, hub_features, o,
                                              method=model.value))(obs)
      return logits, values

    def act(params, hub_features, hub_sum, hub_count, obs, key, greedy):
      logits, values = scores(params, hub_features, hub_sum, hub_count, obs)
      sampled = jax.random.categorical(key, logits)
      return _chosen(logits, sampled, greedy, model) + (values, jax.nn.softmax(logits))

    def act_each(params, hub_features, hub_sum, hub_count, obs, key, ids, greedy):
      logits, values = scores(params, hub_features, hub_sum, hub_count, obs)
      sampled = jax.vmap(lambda i, l: jax.random.categorical(decision_key(key, i), l))(ids, logits)
      return _chosen(logits, sampled, greedy, model) + (values,)

    def rows_fn(params, rows, hubs):
      h = model.apply({"params": params}, rows, method=model.history_rows)
      return jax.ops.segment_sum(h, hubs, A + 1)[:A], jax.ops.segment_sum(
          jnp.ones(hubs.shape[0]), hubs, A + 1)[:A]

    # Two row entry points with one shape each: whole history (per bucket) and new-row chunks.
    self.mesh = mesh if parallel.is_sharded(mesh) else None

    def rows_all(params, rows, hubs):
      if self.mesh is None:
        return rows_fn(params, rows, hubs)
      spec = P(parallel.DATA)
      return jax.shard_map(lambda p, r, h: jax.lax.psum(rows_fn(p, r, h), parallel.DATA),
                           mesh=self.mesh, in_specs=(P(), spec, spec), out_specs=(P(), P()))(
                               params, rows, hubs)

    def rows_chunk(params, rows, hubs):
      return rows_fn(params, rows, hubs)

    if max_traces is not None:   # tests: fail loudly if anything retraces
      act = chex.assert_max_traces(act, n=max_traces)
      act_each = chex.assert_max_traces(act_each, n=max_traces)
      rows_all = chex.assert_max_traces(rows_all, n=max_traces)
      rows_chunk = chex.assert_max_traces(rows_chunk, n=max_traces)
    self._scores = jax.jit(scores)
    self._act = jax.jit(act)
    self._act_each = jax.jit(act_each)
    self._rows_all = jax.jit(rows_all)
    self._rows_chunk = jax.jit(rows_chunk)

  def set_params(self, params, history: history_lib.HistoryMemory | None) -> None:
    """New parameter version: recompute the history hub sums once.

    params may be replicated over several devices (the learner's): decisions use one local copy.
    """
    full = params
    params = parallel.local_copy(params)
    self.params = params
    self.hub_sum[:] = 0
    self.hub_count[:] = 0
    if self.stats is not None:
      self.stats = (history_lib.HubStats.of(history.rows, history.hubs, self.num_hubs)
                    if history is not None else history_lib.HubStats(self.num_hubs))
    if self.summary:
      rows, hubs = (history.rows, history.hubs) if history is not None else (
          np.zeros((0, self.featurizer.spec.row_dim), np.float32), np.zeros(0, np.int32))
      self.summary_texts, self.hub_sum[:] = self.featurizer.history_summary(rows, hubs)
      self.hub_count[:] = np.bincount(hubs, minlength=self.num_hubs)[:self.num_hubs]
      return
    if not self.keeps_sums:
      return
    if history is not None and len(history):
      s, c = self._rows_all(*self._over_mesh(full, *history.padded()))
      self.hub_sum[:] = np.asarray(s)
      self.hub_count[:] = np.asarray(c)

  def _over_mesh(self, params, rows, hubs) -> tuple:
    """The whole-history transform's inputs: sharded over the mesh's devices when there is one
    (params replicated), else the local copy of params."""
    if self.mesh is None:
      return parallel.local_copy(params), rows, hubs
    rows, hubs = parallel.pad_rows(rows, hubs, self.mesh.size, self.num_hubs)
    rows = parallel.put(rows, parallel.rows_sharding(self.mesh))
    hubs = parallel.put(hubs, parallel.rows_sharding(self.mesh))
    params = parallel.put_tree(params if parallel.is_local(params) else parallel.local_copy(params),
                               parallel.replicated(self.mesh))
    return params, rows, hubs

  def warm_up_rows(self, history: history_lib.HistoryMemory) -> None:
    """Compiles the history row transforms for everything the memory can grow to: a chunk of new
    rows and the whole history at each of its padded sizes (history.padded_sizes). A server
    calls it before serving, so no feedback or weight swap compiles on its event loop (a first
    compile there stalls every request in flight). The kept sums are unchanged."""
    if not self.keeps_sums or self.params is None:
      return
    def padding(n):   # n rows of hub id num_hubs: they sum to nothing
      return np.zeros((n, history.row_dim), np.float32), np.full(n, self.num_hubs, np.int32)
    jax.block_until_ready(self._rows_chunk(self.params, *padding(ROW_CHUNK)))
    for n in history.padded_sizes():
      jax.block_until_ready(self._rows_all(*self._over_mesh(self.params, *padding(n))))

  def history_input_array(self) -> np.ndarray:
    """A copy of the per-hub history input the decisions since `set_params` read ([A, D] summary
    embeddings in the summary mode)."""
    return np.array(self.hub_sum)

  def add_history(self, rows: np.ndarray, hubs: np.ndarray, sign: float = 1.0) -> None:
    """New history rows: added to the kept sums (the summary changes only at set_params).
    sign=-1 subtracts rows that left the history (a server evicting as it goes; float32 sums
    drift slowly that way, so it recomputes them with set_params from time to time). The hub
    statistics (row layout 2) follow: rows join at the new end, or (sign=-1) leave at the old."""
    if self.stats is not None:
      (self.stats.add if sign > 0 else self.stats.remove)(rows, hubs)
    if not self.keeps_sums:
      return
    for i in range(0, len(rows), ROW_CHUNK):
      r, h = rows[i:i + ROW_CHUNK], hubs[i:i + ROW_CHUNK]
      pr = np.zeros((ROW_CHUNK, rows.shape[1]), np.float32)
      pr[:len(r)] = r
      ph = np.full(ROW_CHUNK, self.num_hubs, np.int32)
      ph[:len(h)] = h
      s, c = self._rows_chunk(self.params, pr, ph)
      self.hub_sum += sign * np.asarray(s)
      self.hub_count += sign * np.asarray(c)

  def remove_history(self, rows: np.ndarray, hubs: np.ndarray) -> None:
    """Evicted history rows: subtracted from the kept sums (online memory; same parameters as
    when they were added, so each row's transform is the one that was added)."""
    self.add_history(rows, hubs, sign=-1.0)

  def stats_table(self) -> np.ndarray | None:
    """[A, S] the per-hub statistics decisions read now (row layout 2), else None."""
    return self.stats.table() if self.stats is not None else None

  def with_stats(self, obs: dict, table: np.ndarray | None = None) -> dict:
    """A batch of observations with hub_stats [B, A, S] (row layout 2; the current statistics,
    or `table`) when it has none; unchanged otherwise."""
    if self.stats is None or "hub_stats" in obs:
      return obs
    table = self.stats_table() if table is None else table
    B = len(obs["mask"])
    return dict(obs, hub_stats=np.broadcast_to(table, (B,) + table.shape))

  def scores(self, obs: dict) -> tuple[np.ndarray, np.ndarray]:
    """Masked logits [B, A] and values [B] of a batch of observations."""
    obs = self.with_stats(obs)
    logits, values = self._scores(self.params, self.hub_features, self.hub_sum, self.hub_count,
                                  obs)
    return np.asarray(logits), np.asarray(values)

  def act(self, obs: dict, key, greedy: bool):
    """Actions [B], their log-probabilities [B] and values [B] of a batch of observations; the
    sampled actions draw one categorical over the whole batch with `key` (a rollout's lock-step)."""
    a, lp, v, _ = self._act_device(obs, key, greedy)
    return np.asarray(a), np.asarray(lp), np.asarray(v)

  def act_with_probs(self, obs: dict, key, greedy: bool):
    """As `act`, plus the probabilities [B, A] the actions were drawn from (the softmax of the
    masked logits; greedy actions are the policy head's greedy choice under them): what the
    decision statistics read."""
    return tuple(np.asarray(x) for x in self._act_device(obs, key, greedy))

  def _act_device(self, obs: dict, key, greedy: bool) -> tuple:
    """The jitted policy call of `act`: (actions, log-probabilities, values, probabilities), on
    the device."""
    obs = self.with_stats(obs)
    return self._act(self.params, self.hub_features, self.hub_sum, self.hub_count, obs, key,
                     jnp.asarray(greedy))

  def decision_inputs(self) -> tuple:
    """A copy of what `act` reads besides the observations (parameters, hub features, history
    sums; the hub statistics of row layout 2 last), for `act_each` in another thread while this
    one keeps updating the sums."""
    return (self.params, self.hub_features, self.hub_sum.copy(), self.hub_count.copy(),
            self.stats_table())

  def act_each(self, obs: dict, key, ids: np.ndarray, greedy: bool, inputs: tuple | None = None):
    """As `act`, but each decision samples with its own key, decision_key(key, ids[i]) (ids
    [B, k] integers, one row per decision): a decision's action does not depend on which other
    decisions share its batch, so batched decisions are the unbatched ones (gp_jax/rl/decisions.py).
    greedy: one bool for the batch, or one per decision [B] (greedy and sampled decisions in one
    call: an input, not a compiled branch).
    inputs: from `decision_inputs` (a worker thread's call); None: the runner's current ones."""
    inputs = inputs if inputs is not None else (self.params, self.hub_features, self.hub_sum,
                                                self.hub_count, self.stats_table())
    obs = self.with_stats(obs, inputs[4] if len(inputs) > 4 else None)
    a, lp, v = self._act_each(*inputs[:4], obs, key, jnp.asarray(ids, jnp.uint32), jnp.asarray(greedy))
    return np.asarray(a), np.asarray(lp), np.asarray(v)


def decision_key(key: jax.Array, ids: jax.Array) -> jax.Array:
  """The sampling key of one decision: `key` folded with each of its ids [k] in turn."""
  for j in range(ids.shape[0]):
    key = jax.random.fold_in(key, ids[j])
  return key


def _chosen(logits, sampled, greedy, model=None):
  """(actions [B], their log-probabilities [B]): the greedy actions of the model's policy head
  when greedy (garnet.greedy_actions: flat, the argmax of the masked logits), else the sampled
  actions."""
  actions = jnp.where(greedy, garnet_lib.greedy_actions(model, logits), sampled)
  logp = jnp.take_along_axis(jax.nn.log_softmax(logits), actions[:, None], 1)[:, 0]
  return actions, logp


@dataclasses.dataclass
class Episode:
  query: Query
  state: mdp.WorkflowState
  seed: int
  task_emb: np.ndarray
  query_emb: np.ndarray
  rows: np.ndarray
  obs: list = dataclasses.field(default_factory=list)
  actions: list = dataclasses.field(default_factory=list)
  logp: list = dataclasses.field(default_factory=list)
  values: list = dataclasses.field(default_factory=list)
  rewards: list = dataclasses.field(default_factory=list)
  snapshots: list = dataclasses.field(default_factory=list)
  utility: float = 0.0
  first_kind: str = ""   # the first decision was among this role kind's actions only ("": any)
  # Decision statistics (module docstring): per decision its type and the entropy of the
  # distribution it was drawn from; the planner probability of the first decision.
  decision_types: list = dataclasses.field(default_factory=list)
  entropies: list = dataclasses.field(default_factory=list)
  p_planner_root: float = float("nan")

  def decision_mask(self, env: env_lib.WorkflowEnv) -> np.ndarray:
    """The valid actions of the next decision, bool [A]: the env's, restricted to the actions of
    role kind `first_kind` at the episode's first decision when it has one."""
    mask = env.mask(self.state)
    if self.first_kind and self.state.steps == 0:
      return mdp.kind_only(mask, env.space, self.first_kind)
    return mask

  @property
  def planner_first(self) -> bool:
    """The first decision was among the planners only (a forced-planner episode)."""
    return self.first_kind == "planner"

  @property
  def episode_return(self) -> float:
    return float(sum(self.rewards))


DECISION_TYPES = batch_lib.DECISION_TYPES   # one definition (gp_jax/rl/batch.py)


@functools.lru_cache(maxsize=64)
def _kinds(space: mdp.ActionSpace) -> tuple[str, ...]:
  """The role kind of every action of `space`, computed once per space (decisions read it)."""
  return batch_lib.action_kinds(space)


def decision_type(steps: int, mask: np.ndarray, space: mdp.ActionSpace) -> str:
  """The type of a decision (module docstring) taken after `steps` calls of its episode under
  the valid actions `mask` [A]."""
  kind = batch_lib.decision_types(np.asarray(mask, bool)[None], np.array([steps]),
                                  _kinds(space), xp=np)[0]
  return batch_lib.DECISION_TYPES[int(kind)]


def entropy(probs: np.ndarray, mask: np.ndarray) -> float:
  """The entropy (nats) of the distribution `probs` [A] over its valid actions `mask` [A]."""
  p = np.asarray(probs, np.float64)[np.asarray(mask, bool)]
  p = p[p > 0]
  return float(-np.sum(p * np.log(p)))


@dataclasses.dataclass(frozen=True)
class RolloutShard:
  """This process's part of a multi-process rollout (gp_jax/rl/parallel.py).

  Every process runs the episodes of its own queries (one contiguous slice of the iteration's),
  in lock-step with the others: after each step the processes exchange the history rows of the
  episodes that finished (added in process order, so every process holds the same history and
  snapshots are global row counts) and how many episodes each has in flight. A process places its
  observations at its offset in a batch of all processes' episodes (the runner's batch size), so
  sampling draws the noise of the one-process batch: with every query in flight from the start
  (train.parallel >= train.episodes_per_iter) the rollout is the one-process rollout.
  """
  index_offset: int                      # iteration-wide index of this process's first query
  slots: int                             # this process's episodes in flight
  allgather: Callable[[object], list]    # one host object from every process, in process order


def episode_seed(*keys) -> int:
  return int.from_bytes(hashlib.blake2b(repr(keys).encode(), digest_size=4).digest(), "little")


async def run_episodes(env: env_lib.WorkflowEnv, featurizer: features_lib.Featurizer,
                       runner: PolicyRunner, queries: list[Query], *, key: jax.Array,
                       greedy: bool, history: history_lib.HistoryMemory | None,
                       grow_history: bool, seed_salt, task_text=None, online: bool = False,
                       shard: RolloutShard | None = None, planner_first: int = 0,
                       first_kind: str = "planner", root_floor: float = 0.0) -> list[Episode]:
  """Runs one episode per query, runner.batch_size at a time; returns them in query order.

  Episodes that finish at one lock-step join the history together after it (when it grows), so
  every later decision reads them and no decision of the same or an earlier lock-step does.

  Args:
    history: the history memory decisions read (None: inductive, no history).
    grow_history: add each finished episode's calls to `history` (training, transductive).
    seed_salt: mixed into each episode's LLM sampling seed.
    task_text: query -> text embedded as the task node (default: task description).
    online: test-time online memory (needs grow_history and a history): the episodes finishing at
      one lock-step join in query order, and the oldest rows beyond history.capacity are evicted
      at once (the decision sums, the summary and the retrieval index follow), so the memory
      never holds more than its capacity when a decision reads it. Snapshots then no longer
      index the rows: such episodes are not for a PPO update.
    shard: several processes: this one's slice of the queries (RolloutShard); runner.batch_size
      is then the episodes in flight over all processes.
    planner_first: the episodes of the first this many queries (iteration-wide indices when
      sharded) take their first step among the planner actions only, where one is valid
      (training's forced-planner episodes; 0: none).
    first_kind: the role kind those first steps are restricted to ("planner" or "executor").
    root_floor: e in [0, 1): sampled rollouts draw each first action from (1 - e) x the policy +
      e x uniform over its valid actions, and record that mixture's log-probability (module
      docstring); 0 or greedy: the policy alone.
  """
  if online and (history is None or not grow_history):
    raise ValueError("online memory needs a history memory and grow_history=True")
  if online and shard is not None:
    raise ValueError("online memory runs in one process (no shard)")
  task_text = task_text or (lambda q: env.describe(q)[0])
  encoder = featurizer.encoder
  pending = list(enumerate(queries))[::-1]
  slots: list[tuple[int, Episode] | None] = [None] * runner.batch_size
  done: dict[int, Episode] = {}
  row_dim = featurizer.spec.row_dim
  index = (features_lib.RetrievalIndex(featurizer, runner.retrieval_k) if runner.retrieval_k
           else None)

  def start(slot: int) -> None:
    if not pending:
      slots[slot] = None
      return
    i, q = pending.pop()
    t_emb, q_emb = encoder.encode([task_text(q), q.query])
    index = i + (shard.index_offset if shard is not None else 0)
    slots[slot] = (i, Episode(q, env.reset(q), episode_seed(seed_salt, index, q.qid), t_emb, q_emb,
                              np.zeros((0, row_dim), np.float32),
                              first_kind=first_kind if index < planner_first else ""))

  if shard is None:
    n_slots = runner.batch_size
  else:   # this process's share of the slots; the others' live counts give its batch offset
    n_slots = min(shard.slots, len(queries))
    slots = slots[:n_slots]
  for s in range(n_slots):
    start(s)
  in_flight = shard.allgather(sum(x is not None for x in slots)) if shard is not None else None
  step = 0
  while any(slots) or (shard is not None and any(in_flight)):
    live = [(s, slot) for s, slot in enumerate(slots) if slot is not None]
    if not live:   # this process is done; it keeps exchanging rows with the others
      step += 1
      in_flight = _exchange(shard, [], [], 0, history, runner)
      continue
    obs = [featurizer.observe(ep.state, ep.task_emb, ep.query_emb, ep.rows, ep.decision_mask(env))
           for _, (_, ep) in live]
    if index is not None:   # the k history rows nearest to each query, stored in its observation
      if history is not None:
        index.sync(history.rows, history.hubs)
      for o, extra in zip(obs, index.fields(np.stack([ep.query_emb for _, (_, ep) in live]))):
        o.update(extra)
    if runner.stats is not None:   # what this lock-step's decisions read, kept for the update
      table = runner.stats_table()
      for o in obs:
        o["hub_stats"] = table
    offset = sum(in_flight[:jax.process_index()]) if shard is not None else 0
    batch = features_lib.stack([obs[0]] * offset + obs, pad_to=runner.batch_size)
    actions, logp, values, probs = runner.act_with_probs(batch, jax.random.fold_in(key, step),
                                                         greedy)
    actions, logp, values, probs = (np.array(actions[offset:]), np.array(logp[offset:]),
                                    values[offset:], probs[offset:])
    if root_floor > 0 and not greedy:   # the behaviour mixture at each episode's first decision
      for j, (_, (_, ep)) in enumerate(live):
        if ep.state.steps == 0:
          actions[j], logp[j] = root_credit.floor_root(probs[j], obs[j]["mask"], int(actions[j]),
                                                       root_floor, ep.seed)
    for j, (_, (_, ep)) in enumerate(live):   # before the steps change the states
      _record_decision(ep, probs[j], obs[j]["mask"], env.space)
    step += 1
    snap = history.snapshot() if history is not None else 0
    results = await asyncio.gather(*[
        env.step(ep.state, ep.query, int(actions[j]), ep.seed) for j, (_, (_, ep)) in enumerate(live)])
    new_rows, new_hubs, new_ids = [], [], []
    for j, ((s, (i, ep)), res) in enumerate(zip(live, results)):
      ep.obs.append(obs[j]); ep.actions.append(int(actions[j])); ep.logp.append(float(logp[j]))
      ep.values.append(float(values[j])); ep.rewards.append(res.reward); ep.snapshots.append(snap)
      ep.rows = np.concatenate([ep.rows, featurizer.memory_rows([res.call], None)])
      if res.done:
        ep.utility = env.reward_utility(ep.state, ep.query)
        if grow_history and history is not None:
          new_rows.append(featurizer.episode_rows(ep.state.calls, row_utility(env, ep, runner),
                                                  runner.row_layout))
          new_hubs.append(np.array([c.action for c in ep.state.calls], np.int32))
          new_ids.append(i)
        done[i] = ep
        start(s)
    if shard is not None:
      in_flight = _exchange(shard, new_rows, new_hubs, sum(x is not None for x in slots),
                            history, runner)
    elif new_rows:   # episodes finished in this lock-step join the history for the next decisions
      if online:   # in query order (training keeps slot order)
        order = np.argsort(new_ids, kind="stable")
        new_rows, new_hubs = [new_rows[k] for k in order], [new_hubs[k] for k in order]
      rows, hubs = np.concatenate(new_rows), np.concatenate(new_hubs)
      history.add(rows, hubs)
      runner.add_history(rows, hubs)
      if online:
        drop = len(history) - history.capacity
        if drop > 0:
          old_rows, old_hubs = history.rows[:drop], history.hubs[:drop]
          history.evict()
          runner.remove_history(old_rows, old_hubs)
          if index is not None:   # the index assumes a growing history: rebuild it
            index = features_lib.RetrievalIndex(featurizer, runner.retrieval_k)
        if runner.summary:   # the per-hub summary text follows the memory
          runner.set_params(runner.params, history)
  return [done[i] for i in range(len(queries))]


def _record_decision(ep: Episode, probs: np.ndarray, mask: np.ndarray,
                     space: mdp.ActionSpace) -> None:
  """Adds a decision's type and entropy to its episode (and, at its first decision, the
  probability on the planner actions), from the probabilities [A] its action was drawn from."""
  kind = decision_type(ep.state.steps, mask, space)
  ep.decision_types.append(kind)
  ep.entropies.append(entropy(probs, mask))
  if kind == "root":
    planners = np.asarray(mask, bool) & space.kind_mask(["planner"])
    ep.p_planner_root = float(np.sum(np.asarray(probs, np.float64)[planners]))


def row_utility(env: env_lib.WorkflowEnv, ep: Episode, runner: PolicyRunner) -> float:
  """The utility a finished episode's history rows share: layout 1 the reward utility (the
  expected utility on the simulator), layout 2 the scored utility (what a serving router's
  feedback gives: the same kind in training, online evaluation and serving)."""
  return ep.utility if runner.row_layout == 1 else env.utility(ep.state, ep.query)


def _exchange(shard: RolloutShard, new_rows: list, new_hubs: list, live: int,
              history: history_lib.HistoryMemory | None, runner: PolicyRunner) -> list[int]:
  """One lock-step's exchange: every process's finished rows join the history in process order
  (as one process adds them in slot order); returns each process's episodes in flight."""
  parts = shard.allgather((new_rows, new_hubs, live))
  rows = [r for part in parts for r in part[0]]
  hubs = [h for part in parts for h in part[1]]
  if rows and history is not None:
    rows, hubs = np.concatenate(rows), np.concatenate(hubs)
    history.add(rows, hubs)
    runner.add_history(rows, hubs)
  return [part[2] for part in parts]
