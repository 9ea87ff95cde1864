"""gp_jax/config_lists.py: a list field reads the same as a comma string or a sequence."""
import pytest

from gp_jax import config_lists
from gp_jax import errors


def test_names_from_a_string_or_a_sequence():
  assert config_lists.names(" a, b,,c ") == ("a", "b", "c")
  assert config_lists.names(("a", " b", "")) == ("a", "b")
  assert config_lists.names(["a"]) == config_lists.names("a")
  assert config_lists.names("") == config_lists.names(None) == ()


def test_an_empty_named_field_is_a_config_error():
  with pytest.raises(errors.ConfigError, match="config.llms is empty"):
    config_lists.names(" , ", "llms")


def test_numbers():
  assert config_lists.numbers("0, 0.5", "sweep.alphas") == [0.0, 0.5]
  assert config_lists.numbers((0, 1), "sweep.seeds", int) == [0, 1]
  with pytest.raises(errors.ConfigError, match="not a comma list of numbers"):
    config_lists.numbers("0,x", "sweep.alphas")
  with pytest.raises(errors.ConfigError, match="is empty"):
    config_lists.numbers("", "sweep.seeds", int)
