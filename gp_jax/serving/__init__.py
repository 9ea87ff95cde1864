"""Serving a trained GraphPlanner router over an OpenAI-compatible HTTP API (docs/serving.md)."""
