"""A trained router serving requests: its workflow per request, batched decisions, growing memory.

`RouterSession` loads a training workdir (the config it recorded, its best checkpoint, the
history memory saved with it) and serves queries:

  request -> one episode of the routing MDP over the LLM pool, greedy decisions by GARNet
  -> the root's final answer, every call (role, LLM, tokens, $ cost, latency), usage and cost.

Concurrency (host side, one asyncio loop): every in-flight request puts its observation into a
`DecisionBatcher` (gp_jax/rl/decisions.py, the one decision batcher of concurrent workflows),
which scores all observations waiting at that moment with one call of the jitted batched policy
(rl/rollout.PolicyRunner, batch padded to a few fixed sizes so it compiles once per size, in the
compute thread) and hands each request its greedy action; LLM calls go through the pool (the simulator,
or the OpenAI-compatible pool with its limits, retries and replicas).

Request flow: `admit` gives a request a workflow slot or one of `max_queue` places waiting for
one (429 beyond); a cancelled request (client gone, deadline) stops at its next await and logs
the calls it spent; the policy calls and the text encoder run in one worker thread, off the
loop; the final call (the root's Executor) takes the request's sampling and may stream its
text; the conversation's other messages reach the calls on the root node as context.

Memory: decisions read the history memory (per-hub sums in the transductive mode). A served
Memory: decisions read the history memory (serving/memory.ServedMemory). A served request joins
it when its outcome is known: `feedback(id, score, key=...)` turns the request's calls into
history rows with utility = score (as a training episode's calls join with their utility), the
store (serving/store_api.ServedStore: files, or PostgreSQL for replicas) makes them durable, and
only then does the memory apply them (evicting the oldest rows beyond history_capacity, and a
key's own oldest rows beyond its share). Later decisions read the new rows. The memory starts
from the checkpoint's history (the training episodes) or, when the store holds one, from the
store; a shared store's feedback from other replicas is applied every `sync_interval_s`.

Learning (`learn`, serving/online.py): each routed request keeps its rollout episode (what the
decisions saw and chose) until its feedback arrives; the learner turns episodes into guarded PPO
updates in its own thread, and `_swap` installs an accepted version's weights on the loop,
between batched policy calls. Versions, rollback and restart: serving/versions.py.

The library part takes explicit arguments; `load_config` is the one place that reads a recorded
config (and refuses command-line overrides of fields that changed what was trained).
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import logging
import math
import pathlib
import time
import types
import uuid
from typing import Callable

import jax
import ml_collections
import numpy as np

from gp_jax import errors
from gp_jax.graph import features as features_lib
from gp_jax.llm import base
from gp_jax.rl import decisions
from gp_jax.rl import parallel
from gp_jax.rl import rollout
from gp_jax.runs import config_defaults
from gp_jax.runs import system as system_lib
from gp_jax.runs import train as training
from gp_jax.runs import workdir as workdir_config
from gp_jax.runs.serving import conversation as conversation_lib
from gp_jax.runs.serving import memory as memory_lib
from gp_jax.runs.serving import online
from gp_jax.runs.serving import store
from gp_jax.runs.serving import store_api
from gp_jax.runs.serving import versions as versions_lib
from gp_jax.sim import simulator as sim
from gp_jax.types import Query
from gp_jax.util import aio
from gp_jax.workflow import env as env_lib
from gp_jax.workflow import mdp
from gp_jax.workflow import prompts

_log = logging.getLogger(__name__)
ROUTER_MODEL = "graphplanner"
# Config fields a served workdir may take from the command line: where backbones are and how
# long to wait for them, caches, replay, and the output cap of each call. Anything else changes
# the trained router and is refused.
SERVE_OVERRIDABLE = ("backend", "endpoints_file", "request_timeout_s", "replay", "text.cache",
                     "compile_cache", "sampling.max_tokens")
BATCH_BUCKETS = (1, 8, 64)       # padded decision batch sizes (one compilation each)
STORE_THREADS = 16               # threads for the store's blocking calls (one feedback write each)
DEFAULT_SIM_TASK = "mmlu"        # the broadest simulated task family (multi-subject questions)


class RequestError(Exception):
  """A request the server answers with an OpenAI-format error (HTTP status, message, code, and
  extra response headers such as Retry-After)."""

  def __init__(self, status: int, message: str, code: str, param: str | None = None,
               headers: dict | None = None):
    super().__init__(message)
    self.status, self.message, self.code, self.param = status, message, code, param
    self.headers = dict(headers or {})


class Admission:
  """A request's place from `RouterSession.admit`: `async with` waits for a workflow slot and
  holds it; `cancel` gives back a place never used."""

  def __init__(self, session: "RouterSession"):
    self._s = session
    self._state = "waiting"
    self._t0 = 0.0

  async def __aenter__(self) -> "Admission":
    s = self._s
    try:
      await s._slot().acquire()
    finally:
      s.waiting -= 1
      self._state = "done"
    self._state = "running"
    s.in_flight += 1
    self._t0 = time.perf_counter()
    return self

  async def __aexit__(self, *exc) -> None:
    if self._state == "running":
      s = self._s
      self._state = "done"
      s.in_flight -= 1
      s._slot().release()
      s._held_s = 0.9 * s._held_s + 0.1 * (time.perf_counter() - self._t0)

  def cancel(self) -> None:
    if self._state == "waiting":
      self._state = "done"
      self._s.waiting -= 1


# ---- config --------------------------------------------------------------------------------------
def _unflatten(flat: dict) -> ml_collections.ConfigDict:
  tree: dict = {}
  for key, value in flat.items():
    node = tree
    *parents, leaf = key.split(".")
    for p in parents:
      node = node.setdefault(p, {})
    node[leaf] = value
  return ml_collections.ConfigDict(tree)


def _overridable(key: str) -> bool:
  return any(key == p or key.startswith(p + ".") for p in SERVE_OVERRIDABLE)


def load_config(workdir, overrides: dict | None = None) -> ml_collections.ConfigDict:
  """The config a training workdir recorded, with runtime overrides applied (and the fields
  added since it was recorded: config_defaults.complete).

  Args:
    workdir: a training run's directory (config.json, checkpoints/).
    overrides: {dotted field: value} given on the command line (--config.backend=...).
  Raises:
    ConfigError: no recorded config, or an override of a field that changes the trained router.
  """
  path = pathlib.Path(workdir) / workdir_config.CONFIG_FILE
  if not path.exists():
    raise errors.ConfigError(f"{workdir} has no {workdir_config.CONFIG_FILE}: not a training "
                             "workdir (train it with experiments/train.py first)")
  flat = errors.read_json(path, "recorded training config")
  if not isinstance(flat, dict):
    raise errors.ConfigError(f"{path}: not a config record (expected a JSON object)")
  for key, value in (overrides or {}).items():
    if not _overridable(key):
      raise errors.ConfigError(
          f"--config.{key} changes the trained router; a served workdir keeps its recorded "
          f"value ({flat.get(key, '<absent>')!r}). Overridable when serving: "
          f"{', '.join(SERVE_OVERRIDABLE)}")
    if isinstance(value, (tuple, list)):
      value = list(value)
    flat[key] = value
  return config_defaults.complete(_unflatten(flat))


# ---- batched decisions ---------------------------------------------------------------------------
@dataclasses.dataclass
class Served:
  """One answered request: the answer and the record logged for it (store.RouteLog)."""
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


class RouterSession:
  """A trained router ready to serve (see the module docstring).

  Args:
    config: the workdir's recorded config (`load_config`).
    workdir: the training run (best checkpoint, else latest).
    max_concurrency: requests whose workflows run at once (others wait for a slot); also the
      largest decision batch.
    max_queue: requests that may wait for a slot (None: 4 x max_concurrency); one more is
      refused at once with 429 (server_overloaded).
    memory_path: the memory file (None: the memory lives in RAM only).
    route_log: the route log file (None: in RAM only).
    store_config: where the state is kept (serving/store.StoreConfig; overrides memory_path and
      route_log).
    max_key_share: the fraction of the memory one API key's served rows may hold.
    sync_interval_s: how often feedback other replicas added is applied (shared stores).
    default_task: task family of requests without a task hint (None: the backend's default).
    pool: an LLM pool to use instead of the configured backend (tests).
    learn: learn while serving (online.LearnSettings; None: frozen weights).
    versions_dir: where a learning server keeps its router versions (versions.VersionStore).
  """

  def __init__(self, config, workdir, *, max_concurrency: int = 64, memory_path=None,
               route_log=None, store_config: store.StoreConfig | None = None,
               max_key_share: float | None = 0.25, sync_interval_s: float = 1.0,
               default_task: str | None = None, pool: base.LLMPool | None = None,
               max_queue: int | None = None, learn: online.LearnSettings | None = None,
               versions_dir=None):
    if max_concurrency < 1:
      raise errors.ConfigError(f"--max_concurrency must be >= 1, got {max_concurrency}")
    if not sync_interval_s > 0:
      raise errors.ConfigError(f"--sync_interval_s must be > 0, got {sync_interval_s}")
    if max_queue is not None and max_queue < 0:
      raise errors.ConfigError(f"--max_queue must be >= 0, got {max_queue}")
    self.max_queue = 4 * max_concurrency if max_queue is None else int(max_queue)
    self.counters = collections.Counter()
    training.enable_compile_cache(config.compile_cache)
    self.workdir = pathlib.Path(workdir)
    self.sync_interval_s = float(sync_interval_s)
    self._load_router(config, pool, default_task)
    self.reads_memory = self.mode != "inductive"
    cfg = store_config or store.StoreConfig(
        memory_path=str(memory_path) if memory_path else None,
        route_log=str(route_log) if route_log else None)
    self.store = store.open_store(cfg, row_dim=self.featurizer.spec.row_dim,
                                  num_hubs=self.space.size)
    # The store's blocking calls run on their own threads: a slow disk or database never holds
    # up the default executor's work, and concurrent feedback can share one write.
    self._store_io = concurrent.futures.ThreadPoolExecutor(STORE_THREADS, "store")
    try:
      self.memory = memory_lib.ServedMemory(self.history, self.space, self.store,
                                            max_key_share=max_key_share,
                                            reads_memory=self.reads_memory,
                                            executor=self._store_io)
      restored = self.store.load()
      self.memory.restore(restored)
      # A new base every capacity/4 feedback rows: the whole-memory rewrite costs about 4
      # appended rows' bytes per appended row, and a restart replays at most a quarter of it.
      self.compact_rows = max(4096, self.history.capacity // 4)
      self._start_policy(max_concurrency, learn)
      self._start_learner(config, learn, versions_dir)
      if restored is None:   # the store holds the memory from the start (the checkpoint's)
        self.store.write_base(*self._snapshot())
    except BaseException:
      self.store.close()
      self._store_io.shutdown()
      raise
    self._slots: asyncio.Semaphore | None = None
    self._compacting: asyncio.Task | None = None
    self._sync_task: asyncio.Task | None = None
    self._claimed: set[str] = set()   # ids whose feedback is being written
    self.in_flight = 0
    self.waiting = 0               # admitted requests waiting for a workflow slot
    self._held_s = 1.0             # running mean of how long a request holds its slot (Retry-After)

  def _load_router(self, config, pool: base.LLMPool | None, default_task: str | None) -> None:
    """The system of the recorded config, the trained router of self.workdir, the task
    families served and the routing environment of requests."""
    self.system = system = system_lib.build(config, pool=pool)
    self.pool = system.pool
    self.world = system.world if system_lib._serves_simulator(system.pool) else None
    self.alpha = float(config.alpha)
    self.mode = config.model.history
    self.featurizer = system.featurizer
    self.space = system.space
    self.model, self.params, self.history = training.load_router(config, self.workdir, system)
    self.history.capacity = int(config.model.history_capacity)
    self.simulated = config.data.source == "simulated"
    self.tasks = list(sim.TASKS) if self.simulated else _file_tasks()
    self.default_task = default_task or (DEFAULT_SIM_TASK if self.simulated
                                         else system.train_queries[0].task_name)
    if self.default_task not in self.tasks:
      raise errors.unknown_name("task", self.default_task, self.tasks)
    self.env = env_lib.WorkflowEnv(system.space, system.mdp_cfg, system.pool, alpha=self.alpha,
                                   describe=self.describe, scorer=lambda answer, q: 0.0,
                                   sampling=system.sampling)
    executors = system.space.roles.indices_of_kind("executor")
    self.executor = system.space.roles.roles[executors[0]]

  def _start_policy(self, max_concurrency: int, learn: online.LearnSettings | None) -> None:
    """The batched policy over the memory, compiled by one warm-up decision per batch size and
    one pass of the history row transforms per size the memory can grow to. A learning server's
    exploring requests sample their decisions (with the learner's seed) in the same policy calls
    as the greedy ones."""
    self.runner = rollout.PolicyRunner(self.model, self.featurizer.hub_features,
                                       max(BATCH_BUCKETS), featurizer=self.featurizer)
    self.runner.set_params(self.params, self.history if self.reads_memory else None)
    self.max_concurrency = max_concurrency
    buckets = tuple(b for b in BATCH_BUCKETS if b < max_concurrency) + (max_concurrency,)
    # One worker thread for the router's compute (policy calls, text encoding): off the event
    # loop, one at a time (JAX uses its own threads within a call).
    self._compute = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="router-compute")
    self._index = self._new_index()
    self.batcher = decisions.DecisionBatcher(
        self.runner, buckets, greedy=True, executor=self._compute,
        key=jax.random.PRNGKey(learn.seed) if learn is not None else None,
        prepare=self._with_retrieval if self._index is not None else None)
    self.memory.attach(self.runner, self.params, on_evict=self._reset_index)
    self.batcher.warm_up(*self._warm_up_observation())
    if self.reads_memory:   # feedback and swaps then compile nothing on the event loop
      self.runner.warm_up_rows(self.history)

  def _warm_up_observation(self) -> tuple[dict, np.ndarray]:
    """The first observation of a made-up request, and its query embedding (compiling)."""
    q = self.make_query("warm-up question", self.default_task)
    t_emb, q_emb = self.featurizer.encoder.encode([self.describe(q)[0], q.query])
    state = self.env.reset(q)
    return self.featurizer.observe(
        state, t_emb, q_emb, np.zeros((0, self.featurizer.spec.row_dim), np.float32),
        self.env.mask(state)), q_emb

  def _start_learner(self, config, learn: online.LearnSettings | None, versions_dir) -> None:
    """A learning server's learner and its version store (resuming the serving version)."""
    self.learner: online.OnlineLearner | None = None
    self.router_version: str | None = None
    self._trajectories: collections.OrderedDict[str, rollout.Episode] = collections.OrderedDict()
    if learn is None:
      return
    if versions_dir is None:
      raise errors.ConfigError("--learn keeps router versions next to the memory: give a "
                               "--memory_path (not 'none')")
    store = versions_lib.VersionStore(versions_dir, row_dim=self.featurizer.spec.row_dim,
                                      num_hubs=self.space.size)
    self.learner = online.OnlineLearner(
        learn, config=config, system=self.system, model=self.model, workdir=self.workdir,
        params=self.params,
        history=lambda: self.history if self.reads_memory else None, versions=store,
        swap=self._swap)
    self.router_version = self.learner.version
    if self.learner.version != "v0":   # a restart resumes the serving version
      self._swap(self.learner.params, self.learner.version)
    parallel.to_device(self.learner.params)   # compiles a swap's transfer before serving
    obs, _ = self._warm_up_observation()
    self.learner.warm_up(obs, self.history.view() if self.reads_memory else None)

  def _swap(self, params, version: str) -> None:
    """New weights for the decisions (on the event loop, between batched policy calls: each
    call copies its inputs on the loop): the per-hub sums recomputed over the memory."""
    params = parallel.to_device(params)   # one transfer, not one dispatch per leaf
    self.params = params
    self.runner.set_params(params, self.history if self.reads_memory else None)
    self.memory.attach(self.runner, params, on_evict=self._reset_index)
    self.router_version = version
    self.counters["swaps"] += 1

  def explores(self, rid: str) -> bool:
    """Whether request `rid` samples its decisions (a learning server's exploring share)."""
    share = self.learner.settings.explore if self.learner is not None else 0.0
    return share > 0 and rollout.episode_seed("explore", rid) < share * 2 ** 32

  # ---- queries ---------------------------------------------------------------------------------
  def describe(self, q: Query) -> tuple[str, str]:
    """(task description, answer format) of the task family a request named."""
    if self.simulated:
      return system_lib.sim_describe(q)
    from gp_jax.tasks import registry
    task = registry.get_task(q.task_name)
    return task.description, task.answer_format

  def make_query(self, text: str, task: str, rid: str = "request") -> Query:
    """The Query of a request (on the simulator: a simulated query adopted into the world)."""
    if self.simulated:
      text = " ".join(text.split())   # prompts show the question on one line
    if self.world is not None:
      info = self.world.adopt_query(text, task)
      return Query(qid=rid, task_name=info.task, domain=info.domain, query=info.text,
                   ground_truth="", metric="feedback")
    domain = sim.TASKS[task][0] if self.simulated else _file_domain(task)
    return Query(qid=rid, task_name=task, domain=domain, query=text, ground_truth="",
                 metric="feedback")

  def check_task(self, task: str | None) -> str:
    if task is None:
      return self.default_task
    if task not in self.tasks:
      raise RequestError(400, f"unknown task {task!r}; known tasks: {', '.join(self.tasks)}",
                         "invalid_task", "metadata.task")
    return task

  @property
  def backbones(self) -> tuple[str, ...]:
    return self.space.llms

  # ---- serving -----------------------------------------------------------------------------------
  def _slot(self) -> asyncio.Semaphore:
    if self._slots is None:
      self._slots = asyncio.Semaphore(self.max_concurrency)
    return self._slots

  def admit(self) -> "Admission":
    """A place for one request: a workflow slot, or one of `max_queue` places waiting for one.

    Raises:
      RequestError: 429 `server_overloaded` with a Retry-After header when every slot is taken
        and max_queue requests already wait (answered at once, never after a wait).
    """
    if self.in_flight + self.waiting >= self.max_concurrency + self.max_queue:
      self.counters["overloaded"] += 1
      retry = self.retry_after_s()
      raise RequestError(429, f"the server is at capacity ({self.in_flight} requests running, "
                         f"{self.waiting} waiting); retry after {retry} s", "server_overloaded",
                         headers={"Retry-After": str(retry)})
    self.waiting += 1
    return Admission(self)

  def retry_after_s(self) -> int:
    """Seconds until a queue place likely frees: the mean time a request holds its slot, times
    the rounds of max_concurrency that the waiting requests take (1 to 60)."""
    rounds = (self.waiting + 1) / self.max_concurrency
    return int(min(60, max(1, math.ceil(self._held_s * rounds))))

  async def _off_loop(self, fn, *args) -> tuple:
    """fn(*args) in the compute thread; returns (its result, the seconds it ran there)."""
    def timed():
      t0 = time.perf_counter()
      out = fn(*args)
      return out, time.perf_counter() - t0
    return await asyncio.get_running_loop().run_in_executor(self._compute, timed)

  def _checked_task(self, task: str | None, admission: "Admission | None") -> str:
    """check_task; a request refused for its task gives its queue place back."""
    try:
      return self.check_task(task)
    except RequestError:
      if admission is not None:
        admission.cancel()
      raise

  async def complete(self, text: str, *, task: str | None = None, rid: str | None = None,
                     seed: int | None = None, params: base.SamplingParams | None = None,
                     conversation: str = "", on_delta: Callable[[str], None] | None = None,
                     admission: "Admission | None" = None,
                     request_id: str | None = None, key: str | None = None) -> Served:
    """Runs the learned workflow on one query. Raises RequestError when it cannot be answered.

    params: sampling of the final call (the root's answering Executor); the other calls keep
      the served config's sampling. conversation: context every call on the root node starts its
      user message with (conversation.render). on_delta: receives the final call's text as the
      pool streams it. admission: a place from `admit` (default: taken here; 429 when full).
    A cancelled request (client gone, deadline) logs the backbone calls it spent and re-raises.
    key: the name of the API key that asked (the route record's `key`; None without keys).
    """
    task = self._checked_task(task, admission)
    rid = rid or new_id()
    admission = admission or self.admit()
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
          (rows, obs), dt = await self._off_loop(self._next_observation, state, res.call, t_emb,
                                                 q_emb, rows, self.env.mask(state))
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
    await self.log_route(record)
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
    """Compute thread: the workflow memory rows with `call`'s row added, and the next decision's
    observation (one hop per decision)."""
    rows = np.concatenate([rows, self.featurizer.memory_rows([call], None)])
    return rows, self.featurizer.observe(state, t_emb, q_emb, rows, mask)

  def _check_answered(self, state, record: dict) -> None:
    """Raises RequestError 502 when the workflow gave no answer (its backbones failed). Its route
    is logged and kept for feedback all the same (a client may report the failure, score 0, to
    the memory and the learner): the headers carry the completion id (x-gp-request-id) and the
    $ cost spent."""
    calls = record["calls"]
    failed = [c["error"] for c in calls if c["error"]]
    if state.final_answer is None or (calls and calls[-1]["error"]):
      self.counters["unservable"] += 1
      kinds = ", ".join(sorted(set(failed))) or "no final answer within the step cap"
      raise RequestError(502, f"the workflow produced no answer: {len(failed)} of {len(calls)} "
                         f"backbone calls failed ({kinds})", "backbone_error",
                         headers={"x-gp-request-id": record["id"],
                                  "x-gp-cost-usd": f"{record['cost_usd']:.10g}"})

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
                        admission: "Admission | None" = None,
                        request_id: str | None = None, key: str | None = None) -> Served:
    """One call of backbone `model`, no routing. On the simulator (which answers only the
    workflow's role prompts) the last user message is asked as one Executor call, with the
    other messages as its context block (conversation.render)."""
    task = self._checked_task(task, admission)
    rid = rid or new_id()
    text = last_user_text(messages)
    admission = admission or self.admit()
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
      raise RequestError(502, f"backbone {model} failed: {out.error}", "backbone_error")
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
    await self.log_route(record)
    self.counters["passthrough"] += 1
    return Served(out.text, record)

  # ---- feedback and memory -----------------------------------------------------------------------
  def _new_index(self):
    k = self.runner.retrieval_k
    return features_lib.RetrievalIndex(self.featurizer, k) if k else None

  def _reset_index(self) -> None:
    if self._index is not None:   # retrieval ablation: rebuilt after evictions
      self._index = self._new_index()

  def _with_retrieval(self, obs: list[dict], q_embs: list[np.ndarray]) -> list[dict]:
    """The retrieval ablation's observations: each with the k history rows nearest its query,
    read on the loop, where the history changes (the batcher's prepare step)."""
    if self.reads_memory:
      self._index.sync(self.history.rows, self.history.hubs)
    obs = [dict(o) for o in obs]
    for o, extra in zip(obs, self._index.fields(np.stack(q_embs))):
      o.update(extra)
    return obs

  async def _stored(self, fn, *args):
    """fn(*args) on the store's threads."""
    return await asyncio.get_running_loop().run_in_executor(self._store_io, fn, *args)

  async def log_route(self, record: dict) -> int:
    """Appends a served request's record to the store's route log; sets and returns its seq.
    Raises RequestError 503 when it cannot be written (the answer is not given out unlogged:
    its feedback would find no route)."""
    try:
      seq = await self._stored(self.store.append_route, record)
    except OSError as e:
      self.counters["route_not_stored"] += 1
      logging.getLogger(__name__).error("route %s not logged: %s", record.get("id"), e)
      raise RequestError(503, "the request could not be logged (retry later)",
                         "storage_unavailable") from None
    record["seq"] = seq
    return seq

  async def start(self) -> None:
    """Background work of a running server: on a shared store, applying other replicas'
    feedback every sync_interval_s (the bound on how stale a replica's memory is)."""
    if getattr(self.store, "shared", True) and self._sync_task is None:
      self._sync_task = asyncio.get_running_loop().create_task(self._follow())

  async def _follow(self) -> None:
    while True:
      await asyncio.sleep(self.sync_interval_s)
      try:
        self.counters["synced_feedback"] += await self.memory.sync()
      except Exception:   # a store outage: keep serving the memory as it is, try again
        self.counters["sync_errors"] += 1
        logging.getLogger(__name__).exception("memory sync failed")
      self._maybe_compact()

  async def feedback(self, rid: str, score: float, *, key: str | None = None,
                     record: dict | None = None) -> dict:
    """Adds a served request's calls to the history memory with utility `score`, once the store
    holds them durably. `key`: the name of the API key that sent it (None without keys).
    `record`: the route record of `rid` when the caller has already read it (one store read per
    feedback instead of two); read here otherwise.

    Raises:
      RequestError: unknown id (404), feedback already given or being written (409), score
        outside [0, 1] (400), the store could not write it (503: nothing stored, the id stays
        unused, a retry may succeed).
    """
    if not 0.0 <= score <= 1.0:
      raise RequestError(400, f"score must be a number in [0, 1], got {score}", "invalid_score",
                         "score")
    rec = record if record is not None else await self.route(rid)
    if rec is None:
      raise RequestError(404, f"no served completion with id {rid!r}", "unknown_id", "id")
    duplicate = RequestError(409, f"completion {rid!r} already has feedback",
                             "duplicate_feedback", "id")
    if rid in self._claimed or self.memory.has(rid):
      raise duplicate
    self._claimed.add(rid)
    try:
      # The calls as the memory stores them (the rows read texts, cost and failure), in the
      # model's row layout (the one function for rows joining a history).
      calls = [types.SimpleNamespace(**c) for c in rec["calls"]]
      rows = self.featurizer.episode_rows(calls, float(score), self.runner.row_layout)
      hubs = np.array([c["action"] for c in rec["calls"]], np.int32)
      fb = store_api.Feedback(seq=0, rid=rid, key=key, score=float(score), rows=rows, hubs=hubs)
      try:
        fb = await self._stored(self.store.add_feedback, fb)
      except store_api.DuplicateFeedback:
        raise duplicate from None
      except OSError as e:   # StorageError included: nothing was stored
        self.counters["feedback_not_stored"] += 1
        logging.getLogger(__name__).error("feedback %s not stored: %s", rid, e)
        raise RequestError(503, "the feedback could not be stored (nothing was recorded; "
                           "retry later)", "storage_unavailable") from None
      try:   # applies it (and anything before it) in the store's order
        await self.memory.sync()
      except Exception:   # stored (acknowledged below); the next sync applies it
        self.counters["sync_errors"] += 1
        logging.getLogger(__name__).exception("memory sync failed after feedback %s", rid)
    finally:
      self._claimed.discard(rid)
    self.counters["feedback"] += 1
    self._maybe_compact()
    if self.learner is not None:
      episode = self._trajectories.pop(rid, None)
      if episode is not None:
        self.learner.add(rid, key, float(score), episode)
      else:   # a pass-through call, or served before a restart or long ago
        self.counters["feedback_not_learned"] += 1
    out = self.memory.result(rid) or dict(rows_added=len(rows), rows_evicted=0)
    return dict(id=rid, score=float(score), rows_added=out["rows_added"],
                rows_evicted=out["rows_evicted"], memory_rows=len(self.history), seq=fb.seq)

  def _snapshot(self):
    return self.memory.snapshot(workdir=str(self.workdir), saved=time.time())

  def _maybe_compact(self) -> None:
    """Folds the feedback since the last base into a new one, in the background, once it holds
    more than compact_rows rows."""
    if self.memory.rows_since_base > self.compact_rows and (
        self._compacting is None or self._compacting.done()):
      self._compacting = asyncio.get_running_loop().create_task(self.compact())

  async def compact(self) -> None:
    """Writes the memory as the store's new base (arrays are replaced, never changed in place,
    so the snapshot is safe to hand to a thread)."""
    snap = self._snapshot()
    folded = self.memory.rows_since_base
    try:
      await self._stored(self.store.write_base, *snap)
    except OSError as e:   # the journal still holds everything: only the restart gets slower
      logging.getLogger(__name__).error("memory base not written: %s", e)
      self.counters["compaction_errors"] += 1
      return
    self.memory.rows_since_base = max(0, self.memory.rows_since_base - folded)

  def memory_info(self) -> dict:
    return dict(self.memory.memory_info(), mode=self.mode,
                store=getattr(self.store, "kind", type(self.store).__name__))

  async def route(self, rid: str) -> dict | None:
    """The route record of completion `rid` (with its `seq`, and `key` when the HTTP layer set
    one); None when unknown."""
    return await self._stored(self.store.route, rid)

  async def routes_after(self, seq: int, limit: int) -> list[dict]:
    """Route records with seq > `seq`, in seq order, at most `limit`."""
    return await self._stored(self.store.routes_after, seq, limit)

  async def routes_since(self, t: float, limit: int) -> list[dict]:
    """Route records created after unix time `t` (not for paging: records are numbered when
    they finish, so a slow request can be created before one already listed)."""
    out, after = [], 0
    while len(out) < limit:
      page = await self.routes_after(after, 1000)
      if not page:
        break
      out += [r for r in page if r["created"] > t]
      after = page[-1]["seq"]
    return out[:limit]

  def health(self) -> dict:
    b = self.batcher
    return dict(status="ok", model=ROUTER_MODEL, alpha=self.alpha, workdir=str(self.workdir),
                backbones=list(self.backbones), in_flight=self.in_flight,
                max_concurrency=self.max_concurrency, waiting=self.waiting,
                max_queue=self.max_queue, counters=dict(self.counters),
                decisions=dict(policy_calls=b.calls, decisions=b.decisions,
                               mean_batch=b.decisions / b.calls if b.calls else 0.0,
                               policy_s=b.act_s),
                memory=dict((k, v) for k, v in self.memory_info().items()
                            if k not in ("per_hub", "per_key")),
                router=(self.learner.info() if self.learner is not None
                        else dict(version=None, learning=False)))

  def router_versions(self) -> dict:
    """The accepted versions (a learning server), the serving one and the recent rejections."""
    if self.learner is None:
      raise RequestError(404, "this server does not learn (start it with --learn)",
                         "learning_disabled")
    return dict(object="list", data=self.learner.versions.versions(),
                serving=self.learner.version, rejected=list(self.learner.rejections))

  async def rollback(self, version: str) -> dict:
    """Serves accepted version `version` again. Raises RequestError 404 (unknown version, or
    a server that does not learn)."""
    if self.learner is None:
      raise RequestError(404, "this server does not learn (start it with --learn)",
                         "learning_disabled")
    try:
      record = await self.learner.rollback(version)
    except KeyError:
      raise RequestError(404, f"no router version {version!r}", "unknown_version",
                         "version") from None
    return dict(record, serving=version)

  async def aclose(self) -> None:
    await self.batcher.aclose()
    if self.learner is not None:
      await self.learner.aclose()
    await aio.cancel_and_wait(self._sync_task)
    try:
      if self._compacting is not None:
        await self._compacting
      if self.memory.rows_since_base:
        await self.compact()
    finally:
      self.store.close()
      self._store_io.shutdown()
      self._compute.shutdown(wait=False)   # nothing is queued once the batcher and requests stop
      await self.pool.aclose()


def _finish(reason: str | None) -> str:
  """The OpenAI finish_reason of an answer whose final call ended with `reason`."""
  return "length" if reason == "length" else "stop"


def new_id() -> str:
  return "chatcmpl-" + uuid.uuid4().hex


def last_user_text(messages: list[dict]) -> str:
  return next((m["content"] for m in reversed(messages) if m.get("role") == "user"), "")


def _file_tasks() -> list[str]:
  from gp_jax.tasks import registry
  return registry.task_names()


def _file_domain(task: str) -> str:
  from gp_jax.tasks import registry
  return registry.get_task(task).domain
