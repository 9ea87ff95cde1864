"""gp_jax: GraphPlanner (graph-memory agentic routing) and Graph Counselor (multi-agent GraphRAG) in JAX."""

__version__ = "0.1.0"
