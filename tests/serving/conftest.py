"""Fixtures of the router server's tests: one router trained with experiments/configs/test.py,
once per session, shared by every serving test module."""
import pytest

from experiments.configs import test as test_config


@pytest.fixture(scope="session")
def workdir(tmp_path_factory):
  from gp_jax.runs import pipeline
  wd = tmp_path_factory.mktemp("router") / "run"
  pipeline.train_and_evaluate(test_config.get_config(), wd, evaluate=False, verbose=False)
  return wd
