"""A trained router ready to serve: the engine's one owner of the policy, the memory and the
router versions, assembled from a training workdir.

`RouterSession` loads a training workdir (the config it recorded, its best checkpoint, the
history memory saved with it) and serves queries:

  request -> one episode of the routing MDP over the LLM pool, greedy decisions by GARNet
  -> the root's final answer, every call (role, LLM, tokens, $ cost, latency), usage and cost.

Its parts, each in its own module of gp_jax/serving/engine/:
  admission.py  workflow slots and waiting places (refused at once beyond them);
  requests.py   the request paths: the learned workflow and pass-through;
  feedback.py   route records and feedback: durable in the store first, then visible in the
                memory; compaction and replica sync;
  config.py     the recorded config and a served pool event;
  errors.py     what the engine refuses (the HTTP layer maps each kind to a status).

Concurrency (host side, one asyncio loop): every in-flight request puts its observation into a
`DecisionBatcher` (gp_jax/rl/decisions.py, the one decision batcher of concurrent workflows),
which scores all observations waiting at that moment with one call of the jitted batched policy
(rl/rollout.PolicyRunner, batch padded to a few fixed sizes so it compiles once per size, in the
compute thread) and hands each request its action; LLM calls go through the pool (the
simulator, or the OpenAI-compatible pool with its limits, retries and replicas). The policy
calls and the text encoder run in one worker thread, off the loop.

Memory: decisions read the history memory (state/memory.ServedMemory). A served request joins it
when its outcome is known (feedback.py); evictions drop the oldest rows beyond
history_capacity, and a key's own oldest rows beyond its share. The memory starts from the
checkpoint's history (the training episodes) or, when the store holds one, from the store.

Learning (`learn`, serving/learning/learner.py): each routed request keeps its rollout episode
until its feedback arrives; the learner turns episodes into guarded PPO updates in its own
process, and `_swap` installs an accepted version's weights on the loop, between batched policy
calls. Versions: serving/state/versions.py; rollback: serving/learning/rollback.py.
"""
from __future__ import annotations

import collections
import concurrent.futures
import logging
import pathlib
import time

import jax
import numpy as np

from gp_jax import errors
from gp_jax.graph import features as features_lib
from gp_jax.llm import base
from gp_jax.rl import decisions
from gp_jax.rl import parallel
from gp_jax.rl import rollout
from gp_jax.runs import system as system_lib
from gp_jax.runs import train as training
from gp_jax.serving.engine import admission as admission_lib
from gp_jax.serving.engine import errors as errors_lib
from gp_jax.serving.engine import feedback as feedback_lib
from gp_jax.serving.engine import placement
from gp_jax.serving.engine import requests as requests_lib
from gp_jax.serving.learning import learner as learner_lib
from gp_jax.serving.learning import rollback as rollback_lib
from gp_jax.serving.state import memory as memory_lib
from gp_jax.serving.state import store
from gp_jax.serving.state import versions as versions_lib
from gp_jax.sim import simulator as sim
from gp_jax.types import Query
from gp_jax.workflow import env as env_lib

_log = logging.getLogger(__name__)
BATCH_BUCKETS = (1, 8, 64)       # padded decision batch sizes (one compilation each)
DEFAULT_SIM_TASK = "mmlu"        # the broadest simulated task family (multi-subject questions)


class RouterSession(requests_lib.Requests):
  """A trained router ready to serve (see the module docstring).

  Args:
    config: the workdir's recorded config (engine/config.load_config).
    workdir: the training run (best checkpoint, else latest).
    max_concurrency: requests whose workflows run at once (others wait for a slot); also the
      largest decision batch.
    max_queue: requests that may wait for a slot (None: 4 x max_concurrency); one more is
      refused at once (OVERLOADED: server_overloaded).
    max_key_concurrency: places (running or waiting) one API key may hold (None: a quarter of
      max_concurrency; 0: no cap); one more is refused (OVERLOADED: key_concurrency_exceeded).
    policy_thread: where the batched policy calls run: "loop" (the event loop), "thread" (the
      compute thread, off the loop), "auto" (engine/placement.py: the loop when the largest
      batch's call is cheap at start, else the thread).
    memory_path: the memory file (None: the memory lives in RAM only).
    route_log: the route log file (None: in RAM only).
    store_config: where the state is kept (state/store.StoreConfig; overrides memory_path and
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
               max_queue: int | None = None, learn: learner_lib.LearnSettings | None = None,
               versions_dir=None, policy_thread: str = "auto",
               max_key_concurrency: int | None = None):
    self.counters = collections.Counter()
    self.admissions = admission_lib.Admissions(max_concurrency, max_queue, self.counters,
                                               max_key_concurrency)
    if not sync_interval_s > 0:
      raise errors.ConfigError(f"--sync_interval_s must be > 0, got {sync_interval_s}")
    if policy_thread not in placement.POLICY_THREADS:
      raise errors.unknown_name("policy_thread", policy_thread, placement.POLICY_THREADS)
    training.enable_compile_cache(config.compile_cache)
    self.workdir = pathlib.Path(workdir)
    self._load_router(config, pool, default_task)
    self.reads_memory = self.mode != "inductive"
    cfg = store_config or store.StoreConfig(
        memory_path=str(memory_path) if memory_path else None,
        route_log=str(route_log) if route_log else None)
    self.store = store.open_store(cfg, row_dim=self.featurizer.spec.row_dim,
                                  num_hubs=self.space.size)
    store_io = concurrent.futures.ThreadPoolExecutor(feedback_lib.STORE_THREADS, "store")
    try:
      self.memory = memory_lib.ServedMemory(self.history, self.space, self.store,
                                            max_key_share=max_key_share,
                                            reads_memory=self.reads_memory, executor=store_io)
      restored = self.store.load()
      self.memory.restore(restored)
      # A new base every capacity/4 feedback rows: the whole-memory rewrite costs about 4
      # appended rows' bytes per appended row, and a restart replays at most a quarter of it.
      self.records = feedback_lib.ServedRecords(
          self.store, self.memory, self.featurizer, counters=self.counters,
          sync_interval_s=sync_interval_s, compact_rows=max(4096, self.history.capacity // 4),
          snapshot=self._snapshot, executor=store_io)
      self._start_policy(max_concurrency, learn, policy_thread)
      self._start_learner(config, learn, versions_dir)
      if restored is None:   # the store holds the memory from the start (the checkpoint's)
        self.store.write_base(*self._snapshot())
    except BaseException:
      self.store.close()
      store_io.shutdown()
      raise
    self._store_io = store_io

  # ---- admission -------------------------------------------------------------------------------
  def admit(self, key: str | None = None) -> admission_lib.Admission:
    """A place for one request, counted against client key `key` (Admissions.admit; an
    OVERLOADED Refusal when full or when the key holds its cap)."""
    return self.admissions.admit(key)

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
    self.text_encoder = config.text.encoder
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

  def _start_policy(self, max_concurrency: int, learn: learner_lib.LearnSettings | None,
                    policy_thread: str) -> None:
    """The batched policy over the memory, compiled by one warm-up decision per batch size and
    one pass of the history row transforms per size the memory can grow to. A learning server's
    exploring requests sample their decisions (with the learner's seed) in the same policy calls
    as the greedy ones. The calls run on the loop or in the compute thread (policy_thread)."""
    self.runner = rollout.PolicyRunner(self.model, self.featurizer.hub_features,
                                       max(BATCH_BUCKETS), featurizer=self.featurizer)
    self.runner.set_params(self.params, self.history if self.reads_memory else None)
    buckets = tuple(b for b in BATCH_BUCKETS if b < max_concurrency) + (max_concurrency,)
    # One worker thread for the router's heavier compute (text encoding; the policy calls unless
    # they run on the loop): off the event loop, one at a time (JAX uses its own threads within
    # a call).
    self._compute = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="router-compute")
    self._index = self._new_index()
    self.batcher = decisions.DecisionBatcher(
        self.runner, buckets, greedy=True, executor=self._compute,
        key=jax.random.PRNGKey(learn.seed) if learn is not None else None,
        prepare=self._with_retrieval if self._index is not None else None)
    self.memory.attach(self.runner, self.params, on_evict=self._reset_index)
    obs, q_emb = self._warm_up_observation()
    self.batcher.warm_up(obs, q_emb)
    if self.reads_memory:   # feedback and swaps then compile nothing on the event loop
      self.runner.warm_up_rows(self.history)
    self.policy_call_s = placement.time_largest_call(self.batcher, obs, q_emb)
    on_loop = placement.policy_on_loop(policy_thread, self.policy_call_s)
    self.batcher.executor = None if on_loop else self._compute
    self.rows_on_loop = placement.rows_on_loop(str(self.text_encoder))

  def _warm_up_observation(self) -> tuple[dict, np.ndarray]:
    """The first observation of a made-up request, and its query embedding (compiling)."""
    q = self.make_query("warm-up question", self.default_task)
    t_emb, q_emb = self.featurizer.encoder.encode([self.describe(q)[0], q.query])
    state = self.env.reset(q)
    return self.featurizer.observe(
        state, t_emb, q_emb, np.zeros((0, self.featurizer.spec.row_dim), np.float32),
        self.env.mask(state)), q_emb

  def _start_learner(self, config, learn: learner_lib.LearnSettings | None, versions_dir) -> None:
    """A learning server's learner and its version store (resuming the serving version)."""
    self.learner: learner_lib.OnlineLearner | None = None
    self.router_version: str | None = None
    self._trajectories: collections.OrderedDict[str, rollout.Episode] = collections.OrderedDict()
    if learn is None:
      return
    if versions_dir is None:
      raise errors.ConfigError("--learn keeps router versions next to the memory: give a "
                               "--memory_path (not 'none')")
    store = versions_lib.VersionStore(versions_dir, row_dim=self.featurizer.spec.row_dim,
                                      num_hubs=self.space.size)
    self.learner = learner_lib.OnlineLearner(
        learn, config=config, system=self.system, model=self.model, workdir=self.workdir,
        params=self.params,
        history=lambda: self.history if self.reads_memory else None, versions=store,
        swap=self._swap, memory=self.memory)
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
      raise errors_lib.Refusal(errors_lib.INVALID, f"unknown task {task!r}; known tasks: "
                               f"{', '.join(self.tasks)}", "invalid_task", "metadata.task")
    return task

  @property
  def backbones(self) -> tuple[str, ...]:
    return self.space.llms

  # ---- retrieval ablation ----------------------------------------------------------------------
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

  # ---- records and feedback (engine/feedback.py) ------------------------------------------------
  async def start(self) -> None:
    """Background work of a running server: a shared store's feedback from other replicas."""
    await self.records.start()

  async def feedback(self, rid: str, score: float, *, key: str | None = None,
                     record: dict | None = None) -> dict:
    """Adds a served request's calls to the history memory with utility `score`, once the store
    holds them durably (ServedRecords.feedback), and hands its episode to a learning server's
    learner. `key`: the name of the API key that sent it (None without keys). `record`: the
    route record of `rid` when the caller has already read it (one store read instead of two).

    Raises:
      Refusal: INVALID score, NOT_FOUND id, CONFLICT (feedback already given or being written),
        UNAVAILABLE store (nothing stored; a retry may succeed).
    """
    out, fb = await self.records.feedback(rid, score, key=key, record=record,
                                          row_layout=self.runner.row_layout)
    if self.learner is not None:
      episode = self._trajectories.pop(rid, None)
      if episode is not None:
        self.learner.add(rid, key, float(score), episode,
                         version=(record or {}).get("router_version"))
      else:   # a pass-through call, or served before a restart or long ago
        self.counters["feedback_not_learned"] += 1
    return dict(id=rid, score=float(score), rows_added=out["rows_added"],
                rows_evicted=out["rows_evicted"], memory_rows=len(self.history), seq=fb.seq)

  async def route(self, rid: str) -> dict | None:
    return await self.records.route(rid)

  async def routes_after(self, seq: int, limit: int) -> list[dict]:
    return await self.records.routes_after(seq, limit)

  async def routes_since(self, t: float, limit: int) -> list[dict]:
    return await self.records.routes_since(t, limit)

  def _snapshot(self):
    return self.memory.snapshot(workdir=str(self.workdir), saved=time.time())

  def memory_info(self) -> dict:
    return dict(self.memory.memory_info(), mode=self.mode,
                store=getattr(self.store, "kind", type(self.store).__name__))

  def health(self) -> dict:
    """/health's details; "down" when the store cannot keep feedback (FileStore.problem)."""
    a, b = self.admissions, self.batcher
    problem = self.store.problem() if hasattr(self.store, "problem") else None
    return dict(status="ok" if problem is None else "down", store_problem=problem,
                model=requests_lib.ROUTER_MODEL, alpha=self.alpha, workdir=str(self.workdir),
                backbones=list(self.backbones), in_flight=a.in_flight,
                max_concurrency=a.max_concurrency, waiting=a.waiting,
                max_queue=a.max_queue, counters=dict(self.counters),
                decisions=dict(policy_calls=b.calls, decisions=b.decisions,
                               mean_batch=b.decisions / b.calls if b.calls else 0.0,
                               policy_s=b.act_s, on_loop=b.executor is None,
                               largest_call_s=self.policy_call_s,
                               rows_on_loop=self.rows_on_loop),
                memory=dict((k, v) for k, v in self.memory_info().items()
                            if k not in ("per_hub", "per_key")),
                router=(self.learner.info() if self.learner is not None
                        else dict(version=None, learning=False)))

  def router_versions(self) -> dict:
    """The accepted versions (a learning server), the serving one and the recent rejections."""
    if self.learner is None:
      raise _not_learning()
    return dict(object="list", data=self.learner.versions.versions(),
                serving=self.learner.version, rejected=list(self.learner.rejections))

  async def rollback(self, version: str) -> dict:
    """Serves accepted version `version` again with the memory it began to serve with, and
    pauses learning (learning/rollback.py); requests waiting for feedback are not learned from.
    Refusals: NOT_FOUND (unknown version, or not learning), CONFLICT (no memory snapshot
    kept), UNAVAILABLE (a file not written; the rollback may be repeated)."""
    if self.learner is None:
      raise _not_learning()
    try:
      record = await self.learner.rollback(version, rebase=self.records.rebase)
    except KeyError:
      raise errors_lib.Refusal(errors_lib.NOT_FOUND, f"no router version {version!r}",
                               "unknown_version", "version") from None
    except rollback_lib.MemoryMissing:
      raise errors_lib.Refusal(errors_lib.CONFLICT, f"router version {version!r} has no memory "
                               "snapshot kept", "memory_snapshot_missing", "version") from None
    except OSError as e:
      raise _unwritten("rollback", e) from None
    self.counters["trajectories_dropped_rollback"] += len(self._trajectories)
    self._trajectories.clear()   # decided before the rollback: not learned from
    return dict(record, serving=version)

  async def resume(self) -> dict:
    """Ends a rollback's pause of learning (NOT_FOUND: not learning; UNAVAILABLE: unwritten)."""
    if self.learner is None:
      raise _not_learning()
    try:
      return await self.learner.resume()
    except OSError as e:
      raise _unwritten("resume", e) from None

  async def aclose(self) -> None:
    await self.batcher.aclose()
    if self.learner is not None:
      await self.learner.aclose()
    try:
      await self.records.aclose()
    finally:
      self.store.close()
      self._store_io.shutdown()
      self._compute.shutdown(wait=False)   # nothing is queued once the batcher and requests stop
      await self.pool.aclose()


def _not_learning() -> errors_lib.Refusal:
  return errors_lib.Refusal(errors_lib.NOT_FOUND, "this server does not learn (start it with "
                            "--learn)", "learning_disabled")


def _unwritten(what: str, e: OSError) -> errors_lib.Refusal:
  _log.error("%s not completed: %s", what, e)
  return errors_lib.Refusal(errors_lib.UNAVAILABLE, f"the {what} was not written (retry it)",
                            "storage_unavailable")


def _file_tasks() -> list[str]:
  from gp_jax.tasks import registry
  return registry.task_names()


def _file_domain(task: str) -> str:
  from gp_jax.tasks import registry
  return registry.get_task(task).domain
