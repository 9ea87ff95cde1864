"""Baseline routers GraphPlanner is compared with, and the alpha-sweep experiment."""
