"""Chaos stage: training killed (SIGKILL) again and again must end as an uninterrupted run.

Run with `bash scripts/chaos.sh` (it sets GP_JAX_CHAOS=1); a few minutes of CPU, so the unit stage
skips these tests.
"""
import os

import pytest

ENABLED = os.environ.get("GP_JAX_CHAOS") == "1"


def pytest_collection_modifyitems(config, items):
  if ENABLED:
    return
  skip = pytest.mark.skip(reason="chaos stage (several minutes): run `bash scripts/chaos.sh`, "
                          "which sets GP_JAX_CHAOS=1")
  for item in items:
    if "chaos" in item.keywords:
      item.add_marker(skip)
