"""LLM pool: catalog, the async pool interface, and its backends (simulator, OpenAI-compatible, replay)."""
