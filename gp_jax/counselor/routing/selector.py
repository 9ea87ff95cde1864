"""The routed counselor's LLM selector: every agent step of the questions in flight, one batched
decision of the shared policy machinery (gp_jax.rl.decisions.DecisionBatcher over
gp_jax.rl.rollout.PolicyRunner, the sampling inside the jit).

A `CounselorSelector` is a records.LLMSelector: the agents loop awaits it before each call with
an AgentStep; it keeps each question's memory rows (by qid, so one selector serves many questions
at once), makes the step's observation (features.CounselorFeaturizer), awaits the batched
decision and returns the chosen hub's LLM. Sampled decisions are named (hash of the qid, index of
the decision within the question), so with a given key a question's choices do not depend on the
other questions in flight. With `record` it keeps every decision as a Transition for PPO.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from gp_jax.counselor.agents import records
from gp_jax.counselor.routing import features as features_lib
from gp_jax.rl import decisions
from gp_jax.rl import rollout


@dataclasses.dataclass
class Transition:
  """One routing decision as PPO needs it."""
  obs: dict
  action: int
  logp: float
  value: float


class CounselorSelector:
  """LLMSelector over a DecisionBatcher (module docstring).

  Attributes:
    transitions: qid -> the question's decisions in call order (with record=True).
    choices: kind -> LLM -> decisions made.
  """

  def __init__(self, featurizer: features_lib.CounselorFeaturizer,
               batcher: decisions.DecisionBatcher, *, record: bool = False):
    if batcher.num_ids != 2:
      raise ValueError("the counselor names each decision with 2 ids (question, call index)")
    self.featurizer, self.batcher, self.record = featurizer, batcher, record
    self._rows: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    self._made: dict[str, int] = {}
    self.transitions: dict[str, list[Transition]] = {}
    self.choices: dict[str, dict[str, int]] = {k: {} for k in features_lib.KINDS}

  def _memory(self, step: records.AgentStep) -> tuple[np.ndarray, np.ndarray]:
    """The memory rows and hubs of step.calls_so_far (new calls featurized once)."""
    f = self.featurizer
    rows, hubs = self._rows.get(step.qid, (np.zeros((0, f.spec.row_dim), np.float32),
                                           np.zeros(0, np.int32)))
    if len(rows) < len(step.calls_so_far):
      new_rows, new_hubs = f.rows(step.calls_so_far[len(rows):])
      rows, hubs = np.concatenate([rows, new_rows]), np.concatenate([hubs, new_hubs])
      self._rows[step.qid] = rows, hubs
    return rows, hubs

  async def __call__(self, step: records.AgentStep) -> str:
    obs = self.featurizer.observe(step, *self._memory(step))
    index = self._made.get(step.qid, 0)
    self._made[step.qid] = index + 1
    d = await self.batcher.decide(obs, ids=(rollout.episode_seed(step.qid), index))
    if self.record:
      self.transitions.setdefault(step.qid, []).append(Transition(obs, d.action, d.logp, d.value))
    model = self.featurizer.model(d.action)
    self.choices[step.kind][model] = self.choices[step.kind].get(model, 0) + 1
    return model
