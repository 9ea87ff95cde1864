"""Devices and hosts for the learner: one `jax.sharding.Mesh` with a single data axis.

The learner is one SPMD program over the mesh: history rows are sharded along the data axis (each
device encodes its rows and sums them per (chunk, hub); a psum inside `jax.shard_map` joins the
sums), transitions are data-parallel (each minibatch split along the axis, the loss a sum that
jit's sharding propagation all-reduces), parameters and optimizer state are replicated.
On a one-device mesh nothing is placed or wrapped, so the program is exactly the unsharded one.

Several hosts: `initialize` calls `jax.distributed.initialize()` (coordinator address, process
count and id from the config or, when left empty, from the cluster environment that JAX detects:
SLURM, Open MPI, Cloud TPU); the mesh then spans every process's devices. Host data given to
`put` must be the same on every process (the training loop exchanges episodes so that it is).
"""
from __future__ import annotations

import functools
import pickle

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import AxisType
from jax.sharding import Mesh
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from gp_jax import errors

DATA = "data"   # the one mesh axis: history rows and transitions are split along it


def initialize(*, coordinator: str = "", num_processes: int = 0, process_id: int = -1) -> None:
  """Joins a multi-process JAX job (call before any other JAX work, once per process).

  Empty/zero/negative fields are left to JAX's cluster auto-detection (SLURM, Open MPI, TPU pod
  metadata, or the JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID environment).
  """
  if num_processes < 0:
    raise errors.ConfigError(f"parallel.num_processes must be >= 0, got {num_processes}")
  if num_processes and not -1 <= process_id < num_processes:
    raise errors.ConfigError(f"parallel.process_id must be in [0, {num_processes}), "
                             f"got {process_id}")
  if jax.distributed.is_initialized():
    return
  # CPU devices of several processes talk through gloo (GPUs/TPUs use their own collectives).
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  kw = {}
  if coordinator:
    kw["coordinator_address"] = coordinator
  if num_processes:
    kw["num_processes"] = num_processes
  if process_id >= 0:
    kw["process_id"] = process_id
  jax.distributed.initialize(**kw)


def make_mesh(num_devices: int = 0, *, local: bool = False) -> Mesh:
  """A 1-D mesh (axis DATA) over the first `num_devices` devices (0 = all of them).

  local: only this process's devices (the rollout's history refresh, which is per process).
  """
  devices = jax.local_devices() if local else jax.devices()
  n = num_devices or len(devices)
  if local:
    n = min(n, len(devices))
  if not 1 <= n <= len(devices):
    raise errors.ConfigError(f"parallel.devices = {num_devices} but {len(devices)} devices are "
                             f"available ({devices[0].platform})")
  return jax.make_mesh((n,), (DATA,), (AxisType.Auto,), devices=devices[:n])


def is_sharded(mesh: Mesh | None) -> bool:
  """Whether `mesh` spans more than one device (else the unsharded program runs)."""
  return mesh is not None and mesh.size > 1


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def rows_sharding(mesh: Mesh) -> NamedSharding:
  """Leading axis split along DATA (history rows, transitions)."""
  return NamedSharding(mesh, P(DATA))


def put(x, sharding: NamedSharding) -> jax.Array:
  """A global array of sharding from host data `x` (identical on every process).

  An array that already has this sharding passes through (no copy); any other is read back to
  the host first (e.g. the initial state on the default device).
  """
  if isinstance(x, jax.Array) and x.sharding == sharding:
    return x
  x = np.asarray(x)
  return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])


def put_tree(tree, sharding: NamedSharding):
  return jax.tree_util.tree_map(lambda x: put(x, sharding), tree)


def to_device(tree):
  """`tree` with its host leaves on the default device, in one transfer per dtype: the leaves
  are packed into one flat buffer and split on the device by one jitted call (compiled once per
  set of shapes). Leaves that are already JAX arrays stay as they are. A tree of many small
  leaves (the router's weights) otherwise costs one dispatch per leaf."""
  leaves, treedef = jax.tree_util.tree_flatten(tree)
  groups: dict = {}
  for i, x in enumerate(leaves):
    if not isinstance(x, jax.Array):
      x = leaves[i] = np.asarray(x)
      groups.setdefault(x.dtype, []).append(i)
  for idx in groups.values():
    shapes = tuple(leaves[i].shape for i in idx)
    flat = np.concatenate([leaves[i].ravel() for i in idx])
    for i, x in zip(idx, _split(flat, shapes)):
      leaves[i] = x
  return jax.tree_util.tree_unflatten(treedef, leaves)


@functools.partial(jax.jit, static_argnums=1)
def _split(flat, shapes: tuple):
  out, at = [], 0
  for shape in shapes:
    n = int(np.prod(shape))
    out.append(flat[at:at + n].reshape(shape))
    at += n
  return out


def pad_rows(rows: np.ndarray, segment: np.ndarray, multiple: int, drop_segment: int):
  """History rows/segments padded to a multiple of the device count; padding rows go to the
  dropped segment `drop_segment`, so no sum changes."""
  extra = -len(rows) % multiple
  if not extra:
    return rows, segment
  rows = np.concatenate([rows, np.zeros((extra,) + rows.shape[1:], rows.dtype)])
  segment = np.concatenate([segment, np.full(extra, drop_segment, segment.dtype)])
  return rows, segment


def local_copy(tree):
  """Single-device copies of replicated multi-device arrays, for host-side work such as the
  rollout policy (its inputs differ between processes, and one device does a decision faster than
  a replicated program on several)."""
  def one(x):
    if isinstance(x, jax.Array) and len(x.sharding.device_set) > 1:
      return x.addressable_data(0)
    return x
  return jax.tree_util.tree_map(one, tree)


def is_local(tree) -> bool:
  """Whether every array of `tree` lives on this process's devices only."""
  return all(not isinstance(x, jax.Array) or x.is_fully_addressable
             for x in jax.tree_util.tree_leaves(tree))


def barrier(name: str) -> None:
  """Waits until every process gets here (nothing to do for one process)."""
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


def allgather_objects(obj) -> list:
  """`obj` (picklable host data) of every process, in process order; [obj] for one process.

  Every process must call it the same number of times (it is a collective). Pickled bytes travel
  as uint8 arrays padded to a power of two, so few distinct shapes are compiled.
  """
  if jax.process_count() == 1:
    return [obj]
  data = np.frombuffer(pickle.dumps(obj), np.uint8)
  sizes = np.asarray(multihost_utils.process_allgather(np.asarray([len(data)], np.int64)))
  width = 1 << max(int(sizes.max()) - 1, 1).bit_length()
  padded = np.zeros(width, np.uint8)
  padded[:len(data)] = data
  gathered = np.asarray(multihost_utils.process_allgather(padded))
  return [pickle.loads(gathered[p, :int(sizes[p, 0])].tobytes()) for p in range(len(gathered))]
