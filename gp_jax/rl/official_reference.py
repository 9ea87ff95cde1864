"""Reference files of the released GraphPlanner code (`official_*.npz`, schema in docs/parity.md):
reading and checking one, computing gp_jax's numbers for its weights and inputs, and comparing.

Tolerances (float32; docs/parity.md says why):
  probabilities: absolute, 1e-5;
  values and losses: the largest absolute difference over the output's entries, relative to
    max(largest |reference| entry, 1e-2), 1e-4 (a loss is a mean of terms of size about 1, so one
    that happens to be near 0 is held to 1e-6 absolute, not to a share of its own small size);
  gradients of every minibatch step (when the file has them): relative to the network's largest
    gradient at that step, 1e-4;
  parameters after the update: the difference of the step (after - before) from the reference's
    step, relative to the learning rate times the number of minibatch steps (Adam moves a
    parameter by about the learning rate per step), 1e-2, on every element whose gradient is at
    least 1e-4 of the network's largest at every step. Adam divides each gradient by its own
    running size, so a gradient at rounding level (a true zero computed as 1e-10) takes a step
    of rounding noise times lr / 1e-8; those elements are counted, not compared (their gradients
    are, above).
"""
from __future__ import annotations

import dataclasses
import pathlib
import zipfile

import jax
import jax.numpy as jnp
import numpy as np

from gp_jax import errors
from gp_jax.graph import official
from gp_jax.rl import official_ppo
from gp_jax.util import buckets

PROB_ATOL = 1e-5
REL_TOL = 1e-4
REL_FLOOR = 1e-2
STEP_TOL = 1e-2
GRAD_TOL = 1e-4
CONDITIONED = 1e-4

_INPUTS = {  # key: (dtype kind, rank)
    "in/query_emb": ("f", 2), "in/llm_emb": ("f", 2), "in/his_rows": ("f", 2),
    "in/his_query": ("i", 1), "in/his_action": ("i", 1), "in/local_rows": ("f", 3),
    "in/local_query": ("i", 2), "in/local_action": ("i", 2), "in/local_count": ("i", 1),
    "in/state": ("f", 2), "in/his_index": ("i", 2), "in/mask": ("f", 2),
    "out/probs": ("f", 2), "out/value": ("f", 1),
    "cfg/embed_dim": ("i", 0), "cfg/hidden_dim": ("i", 0), "cfg/num_classes": ("i", 0),
}
_UPDATE = {
    "upd/action": ("i", 1), "upd/reward": ("f", 1), "upd/log_prob": ("f", 1),
    "upd/value": ("f", 1), "upd/done": ("n", 1), "upd/perm": ("i", 2),
    "upd/lr": ("f", 0), "upd/gamma": ("f", 0), "upd/eps_clip": ("f", 0),
    "upd/entropy_coef": ("f", 0), "upd/gae_lambda": ("f", 0), "upd/k_epochs": ("i", 0),
    "upd/batch_size": ("i", 0), "upd/policy_loss": ("f", 0), "upd/value_loss": ("f", 0),
    "upd/entropy": ("f", 0),
}


@dataclasses.dataclass
class Reference:
  path: str
  arrays: dict
  has_update: bool

  def __getitem__(self, key):
    return self.arrays[key]

  @property
  def hidden(self) -> int:
    return int(self["cfg/hidden_dim"])

  @property
  def num_classes(self) -> int:
    return int(self["cfg/num_classes"])

  def state_dict(self, net: str, prefix: str = "sd") -> dict:
    head = f"{prefix}/{net}/"
    return {k[len(head):]: v for k, v in self.arrays.items() if k.startswith(head)}


def _bad(path, msg):
  return errors.DataError(f"{path}: not a reference file of the released code ({msg}; schema in "
                          f"docs/parity.md)")


def load(path) -> Reference:
  """Reads and checks a reference file; anything off is one DataError naming the file."""
  path = str(path)
  if not pathlib.Path(path).is_file():
    raise errors.DataError(f"{path}: reference file not found")
  try:
    with np.load(path, allow_pickle=False) as z:
      arrays = {k: z[k] for k in z.files}
  except (OSError, ValueError, zipfile.BadZipFile, EOFError) as e:
    raise _bad(path, f"cannot be read as .npz: {e}") from None
  has_update = any(k.startswith("upd/") for k in arrays)
  for key, (kind, rank) in {**_INPUTS, **(_UPDATE if has_update else {})}.items():
    if key not in arrays:
      raise _bad(path, f"no {key!r}")
    a = arrays[key]
    kinds = {"f": "f", "i": "iu", "n": "fiub"}[kind]
    if a.dtype.kind not in kinds or a.ndim != rank:
      raise _bad(path, f"{key!r} is {a.dtype}{list(a.shape)}, expected rank {rank} "
                       f"{dict(f='float', i='int', n='numeric')[kind]}")
  d, A = int(arrays["cfg/embed_dim"]), arrays["in/llm_emb"].shape[0]
  Q, B = arrays["in/query_emb"].shape[0], arrays["in/state"].shape[0]
  F, L = 2 * d + 2, arrays["in/local_rows"].shape[1]
  want = {"in/query_emb": (Q, d), "in/llm_emb": (A, 2 * d), "in/local_rows": (B, L, F),
          "in/local_query": (B, L), "in/local_action": (B, L), "in/local_count": (B,),
          "in/state": (B, d), "in/his_index": (B, 2), "in/mask": (B, A), "out/probs": (B, A),
          "out/value": (B,)}
  H = arrays["in/his_rows"].shape[0]
  want.update({"in/his_rows": (H, F), "in/his_query": (H,), "in/his_action": (H,)})
  if has_update:
    want.update({k: (B,) for k in ("upd/action", "upd/reward", "upd/log_prob", "upd/value",
                                   "upd/done")})
    want["upd/perm"] = (int(arrays["upd/k_epochs"]), B)
  for key, shape in want.items():
    if arrays[key].shape != shape:
      raise _bad(path, f"{key!r} has shape {list(arrays[key].shape)}, expected {list(shape)}")
  ids = [("in/his_query", Q), ("in/his_action", A), ("in/local_query", Q),
         ("in/local_action", A)]
  for key, n in ids:
    if arrays[key].size and (arrays[key].min() < 0 or arrays[key].max() >= n):
      raise _bad(path, f"{key!r} holds ids outside [0, {n})")
  hi = arrays["in/his_index"]
  if (hi[:, 0] < 0).any() or (hi[:, 0] >= Q).any() or (hi[:, 1] < 0).any() or (
      hi[:, 1] >= int(arrays["cfg/num_classes"])).any():
    raise _bad(path, "'in/his_index' is outside the query table or the task classes")
  if ((arrays["in/local_count"] < 0) | (arrays["in/local_count"] > L)).any():
    raise _bad(path, f"'in/local_count' outside [0, {L}]")
  if not (arrays["in/mask"] != 0).any(1).all():
    raise _bad(path, "an observation with no valid action")
  if has_update:
    perm = arrays["upd/perm"]
    if not (np.sort(perm, 1) == np.arange(B)).all():
      raise _bad(path, "'upd/perm' rows are not permutations of the buffer")
  if not any(k.startswith("sd/policy/") for k in arrays) or not any(
      k.startswith("sd/value/") for k in arrays):
    raise _bad(path, "no state_dict under sd/policy/ and sd/value/")
  return Reference(path, arrays, has_update)


def inputs(ref: Reference):
  """(query [Q, d], llm [A, 2d], history Memory padded to a power-of-two row count,
  observations with leading axis B) as jnp arrays."""
  H = ref["in/his_rows"].shape[0]
  n = buckets.bucket(max(H, 1), buckets.powers_of_two(max(H, 1)))
  def pad(a):
    return np.concatenate([a, np.zeros((n - H,) + a.shape[1:], a.dtype)])
  history = official.Memory(jnp.asarray(pad(ref["in/his_rows"]), jnp.float32),
                            jnp.asarray(pad(ref["in/his_query"]), jnp.int32),
                            jnp.asarray(pad(ref["in/his_action"]), jnp.int32),
                            jnp.asarray(np.arange(n) < H))
  L = ref["in/local_rows"].shape[1]
  local = official.Memory(jnp.asarray(ref["in/local_rows"], jnp.float32),
                          jnp.asarray(ref["in/local_query"], jnp.int32),
                          jnp.asarray(ref["in/local_action"], jnp.int32),
                          jnp.asarray(np.arange(L)[None] < ref["in/local_count"][:, None]))
  obs = official.Observation(local, jnp.asarray(ref["in/state"], jnp.float32),
                             jnp.asarray(ref["in/his_index"], jnp.int32),
                             jnp.asarray(ref["in/mask"], jnp.float32))
  return (jnp.asarray(ref["in/query_emb"], jnp.float32),
          jnp.asarray(ref["in/llm_emb"], jnp.float32), history, obs)


def params_of(ref: Reference, nets: official.Networks, prefix: str = "sd"):
  """The file's state_dicts as flax params {"policy", "value"} (DataError when they do not fit)."""
  query, llm, history, obs = inputs(ref)
  template = jax.eval_shape(lambda: official.init(nets, jax.random.PRNGKey(0), query, llm, history,
                                                  jax.tree_util.tree_map(lambda x: x[0], obs)))
  try:
    return {net: official.from_state_dict(ref.state_dict(net, prefix), template[net])
            for net in ("policy", "value")}
  except errors.DataError as e:
    raise _bad(ref.path, f"{prefix}/: {e}") from None


def settings_of(ref: Reference) -> official_ppo.Settings:
  return official_ppo.Settings(lr=float(ref["upd/lr"]), gamma=float(ref["upd/gamma"]),
                               gae_lambda=float(ref["upd/gae_lambda"]),
                               eps_clip=float(ref["upd/eps_clip"]),
                               entropy_coef=float(ref["upd/entropy_coef"]),
                               batch_size=int(ref["upd/batch_size"]))


def compute(ref: Reference, jit: bool = True) -> dict:
  """gp_jax's numbers for the file: probs, value, and (with an update) the three losses and the
  parameters after the update as state_dicts. jit=False runs every operation eagerly."""
  if not jit:
    with jax.disable_jit():
      return _compute(ref)
  return _compute(ref)


def _compute(ref: Reference) -> dict:
  nets = official.networks(ref.hidden, ref.num_classes)
  params = params_of(ref, nets)
  query, llm, history, obs = inputs(ref)
  forward = jax.jit(official.forward, static_argnums=0)
  probs, values = forward(nets, params, query, llm, history, obs)
  out = {"probs": np.asarray(probs), "value": np.asarray(values)}
  if not ref.has_update:
    return out
  settings = settings_of(ref)
  buffer = official_ppo.Buffer(obs, jnp.asarray(ref["upd/action"], jnp.int32),
                               jnp.asarray(ref["upd/reward"], jnp.float32),
                               jnp.asarray(ref["upd/log_prob"], jnp.float32),
                               jnp.asarray(ref["upd/value"], jnp.float32),
                               jnp.asarray(ref["upd/done"], jnp.float32))
  index, weight = official_ppo.minibatch_plan(ref["upd/perm"], settings.batch_size)
  new, _, means, per_step, grads = official_ppo.update(
      nets, settings, params, official_ppo.init_opt_state(settings, params), query, llm, history,
      buffer, jnp.asarray(index), jnp.asarray(weight), with_grads=True)
  out.update({"policy_loss": float(means[0]), "value_loss": float(means[1]),
              "entropy": float(means[2]), "steps": len(index),
              "policy_loss_steps": np.asarray(per_step[:, 0]),
              "value_loss_steps": np.asarray(per_step[:, 1]),
              "after": {net: official.to_state_dict(new[net]) for net in ("policy", "value")},
              "grads": {net: _stacked_state_dict(grads[net], len(index))
                        for net in ("policy", "value")}})
  return out


def _stacked_state_dict(grads, steps):
  per_step = [official.to_state_dict(jax.tree_util.tree_map(lambda x: x[i], grads))
              for i in range(steps)]
  return {k: np.stack([d[k] for d in per_step]) for k in per_step[0]}


@dataclasses.dataclass
class Row:
  name: str
  max_abs: float
  max_rel: float
  tolerance: str
  ok: bool


def _rel(ours, ref):
  """(largest |difference|, that over max(largest |reference|, REL_FLOOR))."""
  ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
  diff = float(np.abs(ours - ref).max(initial=0.0))
  return diff, diff / max(float(np.abs(ref).max(initial=0.0)), REL_FLOOR)


def compare(ref: Reference, ours: dict) -> list[Row]:
  """One row per output: its largest absolute and relative difference, and whether it passes."""
  rows = []
  a, r = _rel(ours["probs"], ref["out/probs"])
  rows.append(Row("probs", a, r, f"abs <= {PROB_ATOL:g}", a <= PROB_ATOL))
  for name, key in [("value", "out/value")] + ([
      ("policy_loss", "upd/policy_loss"), ("value_loss", "upd/value_loss"),
      ("entropy", "upd/entropy")] if ref.has_update else []) + [
      (name, f"upd/{name}") for name in ("policy_loss_steps", "value_loss_steps")
      if f"upd/{name}" in ref.arrays]:
    a, r = _rel(ours[name], ref[key])
    rows.append(Row(name, a, r, f"rel <= {REL_TOL:g}", r <= REL_TOL))
  if ref.has_update:
    for net, lr in (("policy", float(ref["upd/lr"])), ("value", 2.0 * float(ref["upd/lr"]))):
      grads = ours["grads"][net]
      top = np.max([np.abs(g).reshape(len(g), -1).max(1) for g in grads.values()], 0)   # [S]
      theirs = ref.state_dict(net, "upd/grad")
      if theirs:
        worst_abs, worst = 0.0, 0.0
        for k, g in grads.items():
          d = np.abs(g.astype(np.float64) - theirs[k]).reshape(len(g), -1).max(1)
          worst_abs = max(worst_abs, float(d.max()))
          worst = max(worst, float((d / top).max()))
        rows.append(Row(f"{net} grads", worst_abs, worst, f"rel <= {GRAD_TOL:g} of largest",
                        worst <= GRAD_TOL))
      scale = lr * ours["steps"]
      before, after, mine = ref.state_dict(net), ref.state_dict(net, "upd/sd"), ours["after"][net]
      worst_abs, worst, skipped, total = 0.0, 0.0, 0, 0
      for k, b in before.items():
        shape = (-1,) + b.shape
        g = np.abs(grads[k]).reshape(shape)
        keep = ((g == 0) | (g >= CONDITIONED * top.reshape((-1,) + (1,) * b.ndim))).all(0)
        d = np.abs((mine[k].astype(np.float64) - b) - (after[k].astype(np.float64) - b))[keep]
        skipped += int((~keep).sum())
        total += keep.size
        worst_abs = max(worst_abs, float(d.max(initial=0.0)))
        worst = max(worst, float(d.max(initial=0.0)) / scale)
      rows.append(Row(f"{net} step", worst_abs, worst,
                      f"<= {STEP_TOL:g} lr x steps ({total - skipped}/{total})", worst <= STEP_TOL))
  return rows
