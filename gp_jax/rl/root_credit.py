"""Root credit: two training options for the episode's first decision (split or answer).

Early in training a split is scored with near-random later choices, so answering directly looks
better than it is and the sampled policy stops splitting before the subtree's choices improve
(docs/learner.md). Both options below read only sampled rewards of the environment, as training
does; neither reads hidden variables of a simulator. Both are off by default.

root_floor = e (train.root_floor, in [0, 1)): a floor on exploration at the root, in the
  behaviour policy only. A sampled training episode draws its first action from
      b(a) = (1 - e) p(a) + e / |valid|
  (p the policy's distribution over the valid actions of the root), and records log b(a) as the
  action's old log-probability, so the PPO ratio p_new(a) / b(a) is taken against what sampled
  it. Below the root nothing changes, and greedy decisions read p alone. With e = 0.2 and half
  the root's actions planners, splits keep being sampled on about 10% of episodes for the whole
  run, so the decisions after a split keep being trained.

root_rollout = k (train.root_rollout): the root advantage from paired greedy continuations. Each
  iteration, for the first k of its training queries, the current policy's greedy continuation
  runs twice from the same query with the same sampling seed: once with the root restricted to
  the executors (answer directly), once restricted to the planners (split with the policy's most
  likely planner LLM). With R_split and R_direct the two episodes' returns (sums of rewards), the
  root decision of that query's sampled episode gets the advantage
      R_split - R_direct   when its action was a planner,
      R_direct - R_split   when its action was an executor,
  in place of its GAE advantage (before normalisation; its value target stays GAE's). A split is
  then judged by what the current policy does after it. The difference is undiscounted: use it
  with ppo.gamma = 1. One process only (the continuations run on the learner's process).
"""
from __future__ import annotations

import numpy as np

_FLOOR_STREAM = 0x726F6F74   # mixed into the episode's seed: the floor's draws are their own stream


def floor_root(probs: np.ndarray, mask: np.ndarray, action: int, floor: float,
               episode_seed: int) -> tuple[int, float]:
  """(action, log-probability under the behaviour mixture) of an episode's first decision.

  probs [A]: the policy's distribution (0 off the valid actions); mask [A]: the valid actions;
  action: the action sampled from probs; floor: e in [0, 1); episode_seed: the episode's seed
  (its draws are deterministic: with probability e the action is replaced by one drawn
  uniformly among the valid actions)."""
  if not 0 <= floor < 1:
    raise ValueError(f"root_floor must be in [0, 1), got {floor}")
  valid = np.flatnonzero(np.asarray(mask, bool))
  rng = np.random.default_rng([int(episode_seed), _FLOOR_STREAM])
  if rng.random() < floor:
    action = int(valid[rng.integers(len(valid))])
  return action, float(np.log(behaviour_probs(probs, mask, floor)[action]))


def behaviour_probs(probs: np.ndarray, mask: np.ndarray, floor: float) -> np.ndarray:
  """[A] the root's behaviour mixture (1 - floor) x probs + floor x uniform over the valid
  actions (0 off them); float64."""
  mask = np.asarray(mask, bool)
  p = np.where(mask, np.asarray(probs, np.float64), 0.0)
  return (1 - floor) * p + floor * mask / mask.sum()


async def paired_returns(run_episodes, env, featurizer, runner, queries, *, key, history,
                         seed_salt) -> tuple[np.ndarray, np.ndarray]:
  """(R_direct [k], R_split [k]): the returns of the current policy's greedy episodes on
  `queries`, the root restricted to the executors, then to the planners; the same sampling seeds
  (seed_salt and each query's index) in both, so only the root's action differs. `history` is
  read, never grown. run_episodes: gp_jax.rl.rollout.run_episodes (passed in: rollout imports
  this module for floor_root)."""

  def run(kind):
    return run_episodes(env, featurizer, runner, queries, key=key, greedy=True,
                        history=history, grow_history=False, seed_salt=seed_salt,
                        planner_first=len(queries), first_kind=kind)
  direct = await run("executor")
  split = await run("planner")
  return (np.array([e.episode_return for e in direct]),
          np.array([e.episode_return for e in split]))


def root_overrides(actions: list[int], root_masks: list[np.ndarray], r_direct: np.ndarray,
                   r_split: np.ndarray, space) -> dict[int, float]:
  """{episode index: advantage} for the root decisions of the first k sampled episodes (their
  root actions and masks): R_split - R_direct where the action was a planner, R_direct - R_split
  where it was an executor. Left out: an episode whose root mask did not hold both a planner and
  an executor (nothing to compare), or whose action was another role."""
  planners, executors = space.kind_mask(["planner"]), space.kind_mask(["executor"])
  out = {}
  for i, (a, mask) in enumerate(zip(actions, root_masks)):
    mask = np.asarray(mask, bool)
    if not ((mask & planners).any() and (mask & executors).any()):
      continue
    gap = float(r_split[i] - r_direct[i])
    if planners[a]:
      out[i] = gap
    elif executors[a]:
      out[i] = -gap
  return out
