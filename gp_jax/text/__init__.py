"""Text encoders behind one interface, and an embedding cache."""
from gp_jax.text.encoder import TextEncoder, HashingEncoder, CachedEncoder, make_encoder, register_encoder  # noqa: F401
