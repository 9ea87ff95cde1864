"""Learning while serving: PPO updates from served workflows whose feedback arrived, guarded, with
the new weights swapped in between decisions (docs/serving.md, "Learning while serving").

A served request keeps what its decisions saw and chose, as a training rollout does
(gp_jax/rl/rollout.Episode: observations, actions, log-probabilities, values, step rewards
-alpha x cost). Its feedback score s adds s to the last step's reward, so its return is
s - alpha x cost, the training reward with the trained alpha. Every `every` feedbacks the learner
builds the project's PPO batch of them (gp_jax/rl/batch.build_batch) and runs the project's one
jitted PPO update (gp_jax/rl/ppo.py, through gp_jax/runs/ppo_config.make_update) on a copy of the
serving weights, with the guards below (online_update.GuardedUpdate), in the learner's own
process at the lowest scheduling priority (learner_process.py), so the update neither holds the
interpreter lock nor XLA's threads the decisions use; requests go on meanwhile with the serving
weights. This module keeps the server's side: the episodes waiting, the key share, the versions
and the swap.

Guards, in this order, before a candidate may serve:
  key share    each API key's feedback is at most `max_key_share` of an update's episodes (a
               key's surplus waits for later updates; the oldest waiting episodes beyond
               `max_pending` are dropped and counted): one client cannot steer an update.
  consistency  a key whose scores correlate with the router's value estimates significantly
               less than the other keys' do (Fisher's z test, feedback_check.py) is flagged,
               and its episodes are dropped before an update (counted): a key under the share
               cannot invert the updates' direction either.
  KL bound     the mean KL(serving || candidate) of the update's decisions must not exceed
               `max_kl`: one update moves the policy at most that far. An update past it is
               first shortened (a backtracking line search, as TRPO's): the candidate becomes
               serving + beta x (update - serving) for beta = 1/2, 1/4, ... (`kl_backtrack`
               halvings), the first within the bound; refused only when none is.
  canary       the candidate and the serving weights both run the canary queries (held-out
               simulator queries, the test split the router never trained on) greedily, scored
               by the simulator's expected utility minus alpha x cost, on the pool the latest
               served query of the update met (online_update.py); a candidate worse than the
               serving weights, or than the anchor (the best accepted version so far, scored
               on the same queries, memory and pool), by more than `canary_margin` is rejected,
               so small losses cannot add up over versions. The anchor moves to an accepted
               candidate that scores at least as well as it.
A rejected candidate is dropped (its episodes with it), logged and counted (/metrics); an
accepted one becomes a new version (versions.py: an orbax checkpoint with its parent, the
feedback ids it learned from and both canary scores) and is swapped in on the event loop, where
no decision is in the middle of being scored (decisions copy their inputs on the loop), with a
snapshot of the memory as the version begins to serve (versions.py).

Rollback (`rollback`): the version's weights and the memory as it was when the version began to
serve (the rows that entered since, the span's feedback, are set aside in a file, and rolling
forward serves the later version's own memory again), so the router decides as that version
did. An update in progress is discarded, the episodes waiting are dropped, feedback on requests
decided by versions off the target's lineage is not learned from, the anchor returns to the
target's, and learning pauses until an admin resumes it (`resume`); the pause outlives restarts.

History memory in the update: the served memory changes with every feedback and evicts its
oldest rows, so a served decision's memory cannot be rebuilt exactly later; the update gives
every transition the memory as it is when the update starts (the serving decisions read nearly
the same rows; the PPO ratio clip and the KL limit bound what the difference can do).
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import logging
import time
from typing import Callable

import jax
import numpy as np

from gp_jax import errors
from gp_jax.rl import loop as rl_loop
from gp_jax.rl import ppo
from gp_jax.rl import rollout
from gp_jax.runs import ppo_config
from gp_jax.serving.learning import consistency
from gp_jax.serving.learning import process as process_lib
from gp_jax.serving.learning import rollback as rollback_lib
from gp_jax.serving.learning import update as update_lib
from gp_jax.serving.state import versions as versions_lib

_log = logging.getLogger(__name__)
LEARNABLE_MODES = ("transductive", "inductive")   # model.history modes the online learner updates


@dataclasses.dataclass(frozen=True)
class LearnSettings:
  """Settings of a learning server (recorded in the served-state folder's learn.json).

  Attributes:
    every: feedbacks (episodes) per PPO update.
    explore: share of requests whose decisions are sampled from the policy instead of greedy
      (the rest are greedy, as a frozen server's); without it the learner only ever sees the
      routes the policy already prefers.
    canary_size: held-out simulator queries the guard scores a candidate on.
    canary_margin: a candidate whose canary reward is below the serving one by more than this is
      rejected.
    max_kl: the most mean KL(serving || candidate) over the update's decisions one update may
      move the policy.
    kl_backtrack: halvings of an update's parameter step tried when the full step is past
      max_kl (0: refuse it outright); the optimizer state is the full step's.
    max_key_share: the most share of one update's episodes one API key's feedback may be.
    key_check_z: the consistency check's threshold on Fisher's z (feedback_check.py; 0: off).
    key_check_min: feedbacks a key needs before the consistency check may flag it.
    max_pending: episodes with feedback waiting for an update (oldest dropped beyond it).
    keep_trajectories: served requests whose trajectories wait for feedback (oldest dropped).
    seed: the learner's PRNG seed (minibatch order; exploration draws).
  """
  every: int = 32
  explore: float = 0.1
  canary_size: int = 16
  canary_margin: float = 0.02
  max_kl: float = 0.05
  kl_backtrack: int = 3
  max_key_share: float = 0.25
  key_check_z: float = 3.09
  key_check_min: int = 32
  max_pending: int = 4096
  keep_trajectories: int = 1024
  seed: int = 0

  def __post_init__(self):
    checks = [(self.every >= 1, "--learn_every >= 1"),
              (0.0 <= self.explore <= 1.0, "0 <= --learn_explore <= 1"),
              (self.canary_size >= 1, "--learn_canary_size >= 1"),
              (self.canary_margin >= 0.0, "--learn_canary_margin >= 0"),
              (self.max_kl > 0.0, "--learn_max_kl > 0"),
              (0 <= self.kl_backtrack <= 30, "0 <= --learn_kl_backtrack <= 30"),
              (0.0 < self.max_key_share <= 1.0, "0 < --learn_max_key_share <= 1"),
              (self.key_check_z >= 0.0, "--learn_key_check_z >= 0"),
              (self.key_check_min >= 4, "--learn_key_check_min >= 4"),
              (self.max_pending >= self.every, "--learn_max_pending >= --learn_every"),
              (self.keep_trajectories >= 1, "--learn_keep_trajectories >= 1")]
    for ok, what in checks:
      if not ok:
        raise errors.ConfigError(f"invalid learning settings: need {what}")

  @property
  def key_cap(self) -> int:
    """Episodes of one key in one update (at least 1)."""
    return max(1, int(self.max_key_share * self.every))

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)


@dataclasses.dataclass
class Pending:
  """An episode whose feedback arrived, waiting for an update."""
  rid: str
  key: str | None
  score: float
  episode: rollout.Episode


def select(pending: list[Pending], every: int, key_cap: int) -> list[int] | None:
  """Indices of the next update's `every` episodes: oldest first, at most key_cap of one API key
  (feedback without a key is not capped); None when the waiting ones cannot fill an update."""
  taken, per_key = [], collections.Counter()
  for i, p in enumerate(pending):
    if p.key is not None and per_key[p.key] >= key_cap:
      continue
    per_key[p.key] += 1
    taken.append(i)
    if len(taken) == every:
      return taken
  return None


class OnlineLearner(rollback_lib.Rollbacks):
  """The learner of a serving router (module docstring).

  Args:
    settings: LearnSettings.
    config, system, model: the served router's recorded config (with any served pool event),
      its system (gp_jax/runs/system) and GARNet.
    workdir: the trained router's run (the learner process builds the same system and GARNet).
    params: the trained weights (version v0 when the store is new).
    history: () -> the served history memory now (None: the inductive mode).
    versions: the version store (versions.VersionStore).
    swap: swap(params, version) installs weights for the decisions (called on the event loop).
    memory: the served memory (state/memory.ServedMemory; None: versions keep no memory, and a
      rollback restores the weights only).
  """

  def __init__(self, settings: LearnSettings, *, config, system, model, workdir, params,
               history: Callable, versions: versions_lib.VersionStore,
               swap: Callable[[object, str], None], memory=None):
    if config.model.history not in LEARNABLE_MODES:
      raise errors.ConfigError(f"--learn updates routers with model.history in "
                               f"{', '.join(LEARNABLE_MODES)}; this one is "
                               f"{config.model.history!r}")
    if not system.simulated:
      raise errors.ConfigError("--learn needs the simulator backend: its canary scores "
                               "candidates on held-out simulator queries (docs/serving.md)")
    self.settings = s = settings
    self.history, self.swap, self.memory = history, swap, memory
    self.versions = versions
    learner = versions.learner
    self.paused: dict | None = learner.get("paused")   # a rollback's pause, until resume
    self.rollbacks: list[dict] = list(learner.get("rollbacks", []))[-20:]
    self._halt = False                 # a rollback is under way: no update starts or commits
    self._rolling = asyncio.Lock()     # one rollback at a time
    self._discarded: set[str] = set()  # versions whose decisions are no longer learned from
    optimizer = ppo_config.make_optimizer(config)
    self._abstract = rl_loop.init_state(model, system.featurizer, optimizer, int(config.seed))
    # The thread that talks to the learner process keeps the default priority: it holds the
    # interpreter lock while it pickles, and at a lower priority it could be descheduled holding
    # it while the decisions wait (docs/serving.md, the fourth overhead look).
    self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="router-learner")
    self.process = process_lib.LearnerProcess(config, workdir, settings)
    self.pending: list[Pending] = []
    self.counters = collections.Counter(versions.learner.get("counters", {}))
    self.rejections: list[dict] = list(versions.learner.get("rejections", []))[-20:]
    self.consistency = consistency.FeedbackConsistency(s.key_check_z, s.key_check_min)
    self.consistency.load_state_dict(versions.learner.get("consistency", {}))
    self.updating = False
    self._closing = False
    self._flagged_seen: set[str] = set()
    self._task: asyncio.Task | None = None
    if versions.serving is None:   # a new store: the trained weights are v0
      self.state = ppo.TrainingState(params=jax.device_get(params),
                                     opt_state=jax.device_get(optimizer.init(params)),
                                     rng=np.asarray(jax.random.PRNGKey(s.seed)),
                                     update_step=np.zeros((), np.int32))
      self.anchor = "v0"
      versions.add(self.state, dict(version="v0", parent=None, feedback=[], canary=None,
                                    kl=None, update_step=0, anchor="v0"), self._learner_state())
      if memory is not None:
        versions.write_memory("v0", memory.snapshot(router_version="v0", saved=time.time()))
    else:   # a restart: the serving version and the learner's state as they were
      self.state = jax.device_get(versions.load(versions.serving, self._abstract))
      self.anchor = learner.get("anchor") or versions.serving
    self.version = versions.serving
    self._anchor_params = (None if self.anchor == self.version else
                           jax.device_get(versions.load(self.anchor, self._abstract).params))

  @property
  def params(self):
    return self.state.params

  def _learner_state(self) -> dict:
    return dict(counters=dict(self.counters), rejections=self.rejections[-20:],
                settings=self.settings.to_dict(), consistency=self.consistency.state_dict(),
                paused=self.paused, anchor=self.anchor, rollbacks=self.rollbacks[-20:])

  # ---- on the event loop ---------------------------------------------------------------------------
  def add(self, rid: str, key: str | None, score: float, episode: rollout.Episode,
          version: str | None = None) -> None:
    """A served episode whose feedback `score` arrived: its last reward gains the score; an
    update starts once `every` episodes can fill one (not while paused). `version`: the version
    that decided it (one a rollback discarded: not learned from)."""
    if version is not None and version in self._discarded:
      self.counters["not_learned_rollback"] += 1
      return
    if episode.values:   # the value estimate at the last decision, for the consistency check
      self.consistency.add(key, float(episode.values[-1]), float(score))
    episode.rewards[-1] += float(score)
    episode.utility = float(score)
    self.pending.append(Pending(rid, key, float(score), update_lib.learning_episode(episode)))
    self.counters["feedback"] += 1
    drop = len(self.pending) - self.settings.max_pending
    if drop > 0:
      self.counters["dropped_pending"] += drop
      del self.pending[:drop]
    self._maybe_start()

  def _drop_flagged(self) -> None:
    """Drops the waiting episodes of keys the consistency check flags (counted, logged once)."""
    flagged = {k for k in {p.key for p in self.pending} if self.consistency.flagged(k)}
    if not flagged:
      return
    for k in flagged - self._flagged_seen:
      _log.warning("feedback of API key %r left out of updates: %s", k,
                   self.consistency.verdict(k))
    self._flagged_seen |= flagged
    kept = [p for p in self.pending if p.key not in flagged]
    self.counters["dropped_inconsistent"] += len(self.pending) - len(kept)
    self.pending = kept

  def _maybe_start(self) -> None:
    if (self._closing or self._halt or self.paused is not None
        or (self._task is not None and not self._task.done())):
      return
    if len(self.pending) >= self.settings.every:   # only before an update can be selected
      self._drop_flagged()
    taken = select(self.pending, self.settings.every, self.settings.key_cap)
    if taken is None:
      return
    chosen = [self.pending[i] for i in taken]
    keep = set(taken)
    self.pending = [p for i, p in enumerate(self.pending) if i not in keep]
    history = self.history()
    view = history.view() if history is not None else None
    self.updating = True
    self._task = asyncio.get_running_loop().create_task(self._cycle(chosen, view))

  async def _cycle(self, chosen: list[Pending], view) -> None:
    loop = asyncio.get_running_loop()
    try:
      outcome = await loop.run_in_executor(self._thread, self._update, chosen, view)
    except Exception:   # a failed update must not stop the server; it is logged and counted
      self.counters["update_errors"] += 1
      _log.exception("online update failed")
      outcome = None
    finally:
      self.updating = False
    if outcome is not None and outcome["accepted"]:
      self.state, self.version = outcome["state"], outcome["version"]
      self.anchor, self._anchor_params = outcome["anchor"]
      self.swap(self.state.params, self.version)
      await self._keep_memory(self.version)
    self._task = None   # this cycle is over: the next may start (episodes may be waiting)
    self._maybe_start()

  def info(self) -> dict:
    return dict(version=self.version, learning=True, updating=self.updating,
                paused=self.paused, anchor=self.anchor,
                pending=len(self.pending), versions=len(self.versions.versions()),
                flagged_keys=len(self.consistency.flagged_keys()),   # names: the log, admin
                counters=dict(self.counters), settings=self.settings.to_dict())

  async def aclose(self) -> None:
    """Lets an update in progress finish (and be recorded); starts no other; stops the learner
    process."""
    self._closing = True
    if self._task is not None and not self._task.done():
      try:
        await self._task
      except Exception:
        pass
    self._thread.shutdown(wait=True)
    self.process.close()

  # ---- in the learner thread (the compute in the learner process) ----------------------------------
  def warm_up(self, obs: dict, view) -> None:
    """Starts the learner process and compiles its update, KL scoring and canary policy before
    serving, so the first update takes as long as the others."""
    self.process.call("warm_up", self.state, obs, view)

  def _update(self, chosen: list[Pending], view) -> dict:
    """One guarded update of the serving weights from `chosen` episodes (in the learner
    process); returns {accepted, version, state} (accepted) or {accepted: False, reason}."""
    episodes = process_lib.pack([p.episode for p in chosen])   # off the loop, lock handed over
    anchor = None if self.anchor == self.version else self._anchor_params
    out = self.process.call("step", self.state, episodes, view, anchor)
    self.counters["updates"] += 1
    feedback = [dict(id=p.rid, key=p.key, score=p.score) for p in chosen]
    new = out["state"]
    base = dict(parent=self.version, feedback=feedback, update_step=int(new.update_step),
                update=dict(out["metrics"], seconds=out["seconds"]), kl=out["kl"],
                canary=out["canary"], step=out["beta"], full_step_kl=out["full_step_kl"])
    if out["reason"] is not None:
      return self._reject(out["reason"], base, out["why"])
    if self._halt:   # a rollback came while it ran: not committed (the folder is replaced)
      self.counters["discarded_rollback"] += 1
      return dict(accepted=False, reason="rollback")
    if out["beta"] < 1.0:
      self.counters["shortened"] += 1
    version = self.versions.next_id()
    anchor = self._next_anchor(out["canary"], version, new.params)
    self.counters["accepted"] += 1
    # The learner process writes the candidate's checkpoint (orbax is CPU work too); this
    # process commits it in the index.
    record = versions_lib.stamped(dict(base, version=version, anchor=anchor[0],
                                       canary=dict(base["canary"], anchor_version=self.anchor)))
    self.process.call("write", str(self.versions.directory / version), record)
    record = self.versions.commit(record, self._learner_state())
    _log.info("router version %s accepted (parent %s, %d feedbacks, KL %.4g, canary %.4f vs "
              "%.4f)", version, self.version, len(chosen), out["kl"], out["canary"]["candidate"],
              out["canary"]["parent"])
    return dict(accepted=True, version=version, state=new, record=record,
                anchor=(anchor[0], None if anchor[0] == version else anchor[1]))

  def _next_anchor(self, canary: dict, version: str, params) -> tuple:
    """(version, params) of the best of the anchor, the parent and the candidate `version` on
    this update's canary (the newest on a tie)."""
    best = (canary["anchor"], self.anchor, self._anchor_params)
    if canary["parent"] >= best[0]:
      best = (canary["parent"], self.version, self.state.params)
    if canary["candidate"] >= best[0]:
      best = (canary["candidate"], version, params)
    return best[1:]

  def _reject(self, reason: str, base: dict, why: str) -> dict:
    self.counters[f"rejected_{reason}"] += 1
    self.rejections.append(dict(base, reason=reason, created=time.time(),
                                feedback=[f["id"] for f in base["feedback"]]))
    self.rejections = self.rejections[-20:]
    _log.warning("candidate router rejected (%s): %s; serving %s stays", reason, why,
                 self.version)
    try:
      self.versions.set_learner(self._learner_state())
    except OSError as e:   # the counters are kept in RAM; the next write records them
      _log.error("learner state not written: %s", e)
    return dict(accepted=False, reason=reason)
