"""Chaos stage: training killed (SIGKILL) again and again must end as an uninterrupted run.

Run with `bash scripts/chaos.sh` (it sets GP_JAX_CHAOS=1); a few minutes of CPU, so the unit stage
skips these tests (the marker's rule is in tests/conftest.py).
"""
