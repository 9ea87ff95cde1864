"""GARNet: heterogeneous graph memory over queries, role-LLM hubs and memories of past LLM calls."""
from gp_jax.util import jraph_compat as _jraph_compat  # noqa: F401  (restores aliases jraph utilities still use)
