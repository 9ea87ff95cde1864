"""The endpoints file: format, validation, atomic writes, start-up reachability."""
import json

import pytest

from gp_jax import errors
from gp_jax.llm import catalog as catalog_lib
from gp_jax.llm import endpoints as endpoints_lib
from gp_jax.llm import testing_server


@pytest.fixture(scope="module")
def catalog():
  return catalog_lib.load_catalog()


def test_roundtrip(tmp_path, catalog):
  eps = {"qwen2.5-7b-instruct": [endpoints_lib.Endpoint("http://127.0.0.1:8000/v1/", "q"),
                                 endpoints_lib.Endpoint("http://127.0.0.1:8001/v1", "q")],
         "gemma-2-9b-it": [endpoints_lib.Endpoint("http://h:8002/v1", "g")]}
  path = endpoints_lib.write_endpoints(tmp_path / "sub" / "e.json", eps)
  back = endpoints_lib.load_endpoints(path, catalog)
  assert back["qwen2.5-7b-instruct"][0] == endpoints_lib.Endpoint("http://127.0.0.1:8000/v1", "q")
  assert back["qwen2.5-7b-instruct"][0].chat_url == "http://127.0.0.1:8000/v1/chat/completions"
  assert len(back["qwen2.5-7b-instruct"]) == 2 and back["gemma-2-9b-it"][0].model == "g"
  assert [p.name for p in path.parent.iterdir()] == ["e.json"]  # no temporary file left


@pytest.mark.parametrize("content,error,match", [
    ('{"qwen2.5-7b-instruct": [', errors.DataError, "line 1: not valid JSON"),
    ('[]', errors.DataError, "expected an object"),
    ('{"gpt-9": [{"base_url": "http://a/v1", "model": "m"}]}', errors.ConfigError, "unknown LLM 'gpt-9'"),
    ('{"qwen2.5-7b-instruct": []}', errors.DataError, "non-empty list"),
    ('{"qwen2.5-7b-instruct": [{"base_url": "http://a/v1"}]}', errors.DataError, r"qwen2.5-7b-instruct\[0\]: missing field\(s\) \['model'\]"),
    ('{"qwen2.5-7b-instruct": [{"base_url": "ftp://a", "model": "m"}]}', errors.DataError, "http\\(s\\) URL"),
    ('{"qwen2.5-7b-instruct": [{"base_url": "http://a", "model": "m", "key": 1}]}', errors.DataError, "unknown field"),
    ('{"_about": "only a comment"}', errors.DataError, "no endpoints"),
])
def test_validation_errors(tmp_path, catalog, content, error, match):
  p = tmp_path / "e.json"
  p.write_text(content)
  with pytest.raises(error, match=match):
    endpoints_lib.load_endpoints(p, catalog)


def test_missing_file_says_who_writes_it(tmp_path):
  with pytest.raises(errors.DataError, match="serve_backbones.py"):
    endpoints_lib.load_endpoints(tmp_path / "nope.json")


def test_check_reachable(catalog):
  with testing_server.FakeOpenAIServer(models=("m",)) as srv:
    ok = {"qwen2.5-7b-instruct": [endpoints_lib.Endpoint(srv.url, "m")]}
    endpoints_lib.check_reachable(ok)
    assert endpoints_lib.served_models(srv.url) == ["m"]
    wrong = {"qwen2.5-7b-instruct": [endpoints_lib.Endpoint(srv.url, "x")]}
    with pytest.raises(errors.BackendError, match="LLM 'qwen2.5-7b-instruct'.*does not serve model 'x'"):
      endpoints_lib.check_reachable(wrong)
  dead = {"gemma-2-9b-it": [endpoints_lib.Endpoint("http://127.0.0.1:9/v1", "m")]}
  with pytest.raises(errors.BackendError, match="endpoint for LLM 'gemma-2-9b-it' at http://127.0.0.1:9/v1: .*unreachable"):
    endpoints_lib.check_reachable(dead, timeout_s=1)
