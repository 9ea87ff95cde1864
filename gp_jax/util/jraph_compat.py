"""Restores the `jax.tree_map`/`jax.tree_leaves` aliases that jraph 0.0.6 still calls.

Newer JAX removed the aliases; a few jraph utilities (zero_out_padding,
get_fully_connected_graph) reference them at call time. Import this module before
jraph (gp_jax.graph does) so those utilities work.
"""
import jax
import jax.tree_util

for _name, _fn in (("tree_map", jax.tree_util.tree_map), ("tree_leaves", jax.tree_util.tree_leaves),
                   ("tree_flatten", jax.tree_util.tree_flatten),
                   ("tree_unflatten", jax.tree_util.tree_unflatten)):
  try:
    getattr(jax, _name)
  except AttributeError:
    setattr(jax, _name, _fn)

import jraph  # noqa: E402,F401  (imported after the aliases exist)
