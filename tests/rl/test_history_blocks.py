"""The update's history encode in blocks (more than 2 x ppo.ROW_BLOCK rows on a device) gives the
one-pass sums and gradients (float32 summation order aside: rtol 1e-5)."""
import jax
import jax.numpy as jnp
import numpy as np

from experiments.configs import test as test_config
from gp_jax.graph import history as history_lib
from gp_jax.rl import ppo
from gp_jax.runs import train as training


def test_blocked_encode_matches_one_pass(monkeypatch):
  cfg = test_config.get_config()
  model = training.make_model(cfg)
  F, A = 2 * cfg.model.mem_proj + 3, 5
  rng = np.random.default_rng(0)
  n = 1000
  hist = history_lib.HistoryMemory(F, A, capacity=n)
  hist.add(rng.normal(size=(n, F)).astype(np.float32), rng.integers(0, A, n))
  num_chunks = 9
  inputs = hist.update_inputs(np.sort(rng.integers(0, n + 1, 8)), num_chunks=num_chunks)
  rows = inputs["rows"][:n + 3]            # 1003 rows: not a multiple of the block
  segment = inputs["segment"][:n + 3]
  params = model.init(jax.random.PRNGKey(0), jnp.zeros((A, 2 * cfg.text.dim)),
                      jnp.zeros((2, F)), _obs(cfg, F, A))["params"]
  hist_in = dict(rows=jnp.asarray(rows), segment=jnp.asarray(segment))

  w = jnp.asarray(rng.normal(size=(num_chunks, A, cfg.model.hidden)).astype(np.float32))

  def loss(p):   # linear in the sums: gradients differ only by summation order
    sums = ppo.history_chunk_sums(model, p, hist_in, num_chunks, A)
    return jnp.sum(w * sums), sums
  (l1, s1), g1 = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
  monkeypatch.setattr(ppo, "ROW_BLOCK", 128)   # 8 blocks, the last one overlapping
  (l2, s2), g2 = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
  assert float(jnp.abs(s1).max()) > 1.0
  np.testing.assert_allclose(s2, s1, rtol=1e-5, atol=1e-4)
  for a, b in zip(jax.tree_util.tree_leaves(g1), jax.tree_util.tree_leaves(g2)):
    np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5 * float(np.abs(a).max()))


def _obs(cfg, F, A):
  D, M = cfg.text.dim, cfg.mdp.step_cap
  return dict(task=jnp.zeros(D), query=jnp.zeros(D), state=jnp.zeros(8), rows=jnp.zeros((M, F)),
              row_hub=jnp.full(M, A, jnp.int32), row_valid=jnp.zeros(M, bool),
              mask=jnp.ones(A, bool))
