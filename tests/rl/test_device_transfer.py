"""parallel.to_device: a host tree on the device in one transfer per dtype, exactly."""
import jax
import jax.numpy as jnp
import numpy as np

from gp_jax.rl import parallel


def tree(rng):
  return {"dense": {"kernel": rng.standard_normal((5, 3)).astype(np.float32),
                    "bias": rng.standard_normal(3).astype(np.float32)},
          "scale": np.float32(rng.standard_normal()),
          "steps": rng.integers(0, 100, (2, 2)).astype(np.int32),
          "empty": np.zeros((0, 4), np.float32),
          "already": jnp.arange(4.0)}


def test_every_leaf_arrives_exactly_with_its_shape_and_dtype():
  host = tree(np.random.default_rng(0))
  out = parallel.to_device(host)
  assert jax.tree_util.tree_structure(out) == jax.tree_util.tree_structure(host)
  for a, b in zip(jax.tree_util.tree_leaves(host), jax.tree_util.tree_leaves(out)):
    assert isinstance(b, jax.Array)
    assert b.shape == np.shape(a) and b.dtype == np.asarray(a).dtype
    np.testing.assert_array_equal(np.asarray(b), np.asarray(a))
  assert out["already"] is host["already"]   # a device leaf is not copied


def test_new_values_of_the_same_shapes_compile_nothing():
  parallel.to_device(tree(np.random.default_rng(1)))
  compiled = parallel._split._cache_size()
  second = tree(np.random.default_rng(2))
  out = parallel.to_device(second)
  assert parallel._split._cache_size() == compiled
  np.testing.assert_array_equal(np.asarray(out["dense"]["kernel"]), second["dense"]["kernel"])
