"""The pure parts of benchmarks/bench_server.py: its command line, the LiteLLM proxy's config and
environment, the open-loop arrival schedule, the non-backbone time and the comparison table and
JSON. No server, no network, no litellm."""
import json

import numpy as np
import pytest

from benchmarks import bench_server as bench

MODELS = ["llm-a", "llm-b", "llm-c"]


def _result(records, wall=2.0, offered=None, **status):
  res = dict(records=records, wall=wall, status={"429": 0, "timeout": 0, "other": 0, **status})
  if offered is not None:
    res["offered"] = offered
  return res


def test_quick_sets_smaller_defaults_that_flags_still_override():
  full = bench.parse_args([])
  assert (full.clients, full.requests, full.modes) == ("1,16,64,256", 8, ["lockstep"])
  quick = bench.parse_args(["--quick"])
  assert (quick.clients, quick.requests, quick.backends) == ("1,16,64", 4, "testing_server")
  assert bench.parse_args(["--quick", "--clients=1,2", "--requests=3"]).clients == "1,2"
  assert bench.parse_args(["--modes=lockstep,open-loop"]).modes == ["lockstep", "open-loop"]
  with pytest.raises(SystemExit, match="--modes takes"):
    bench.parse_args(["--modes=lockstep,closed"])


def test_litellm_config_forwards_every_model_to_the_test_server_without_key_or_database():
  cfg = bench.litellm_config(MODELS, "http://127.0.0.1:9/v1", 60.0)
  assert [m["model_name"] for m in cfg["model_list"]] == MODELS
  for entry in cfg["model_list"]:
    params = entry["litellm_params"]
    assert params["model"] == "openai/" + entry["model_name"]   # LiteLLM's OpenAI-compatible route
    assert params["api_base"] == "http://127.0.0.1:9/v1"
  assert cfg["litellm_settings"] == {"num_retries": 0, "request_timeout": 60.0}
  general = cfg["general_settings"]
  assert "master_key" not in general and "database_url" not in general
  assert general["dangerously_permit_weak_or_unset_master_key"] is True
  assert json.loads(json.dumps(cfg)) == cfg   # written as JSON, which YAML reads as is


def test_litellm_env_drops_auth_database_and_the_projects_path():
  env = bench.litellm_env({"PATH": "/bin", "PYTHONPATH": "/repo", "LITELLM_MASTER_KEY": "sk-x",
                           "DATABASE_URL": "postgres://x", "HOME": "/root"})
  assert env == {"PATH": "/bin", "HOME": "/root", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}


def test_poisson_schedule_has_the_asked_mean_rate_and_is_deterministic_per_seed():
  times = bench.poisson_schedule(50.0, 20000, seed=3)
  assert times.shape == (20000,) and np.all(np.diff(times) > 0) and times[0] > 0
  assert 20000 / times[-1] == pytest.approx(50.0, rel=0.03)
  np.testing.assert_array_equal(times, bench.poisson_schedule(50.0, 20000, seed=3))
  assert not np.array_equal(times, bench.poisson_schedule(50.0, 20000, seed=4))
  # Same seed, double rate: the same draws at half the gaps.
  np.testing.assert_allclose(bench.poisson_schedule(100.0, 20000, seed=3), times / 2)
  with pytest.raises(ValueError):
    bench.poisson_schedule(0.0, 10, seed=0)


def test_ideal_and_non_backbone_time():
  assert bench.ideal_rps(16, 64, 8.0, 0.2) == pytest.approx(10.0)
  assert bench.ideal_rps(256, 64, 1.0, 0.2) == pytest.approx(320.0)   # the slots bind
  np.testing.assert_allclose(bench.non_backbone_ms([0.25, 0.3], 0.2), [50.0, 100.0])
  np.testing.assert_allclose(bench.non_backbone_ms([1.7], 0.2, calls=8), [100.0])


def test_compare_rows_routed_pass_through_and_nothing_answered():
  routed = [dict(e2e=1.7, calls=8, router_s=0.004 * k, decisions=4) for k in range(1, 5)]
  row = bench.compare_row("lockstep", 16, "ours-routed", _result(routed), 0.2)
  assert row["answered"] == 4 and row["rps"] == pytest.approx(2.0) and row["offered_rps"] is None
  assert row["overhead_p50_ms"] == pytest.approx(2.5)   # 4 ms x 2.5 / 4 decisions
  assert row["non_backbone_p50_ms"] is None
  passed = [dict(e2e=0.2 + 0.001 * k, calls=1) for k in range(1, 102)]
  row = bench.compare_row("open-loop", 64, "litellm-pass-through",
                          _result(passed, offered=256.0, timeout=2), 0.2)
  assert row["offered_rps"] == 256.0 and row["overhead_p50_ms"] is None
  assert row["non_backbone_p50_ms"] == pytest.approx(51.0)
  assert row["non_backbone_p99_ms"] == pytest.approx(100.0)
  assert (row["errors_429"], row["errors_timeout"], row["errors_other"]) == (0, 2, 0)
  empty = bench.compare_row("lockstep", 256, "ours-pass-through", _result([], other=3), 0.2)
  assert empty["answered"] == 0 and empty["p50_s"] is None and empty["errors_other"] == 3


def test_compare_table_and_json():
  rows = [
      bench.compare_row("lockstep", 1, "ours-routed",
                        _result([dict(e2e=1.6, calls=8, router_s=0.008, decisions=4)]), 0.2),
      bench.compare_row("open-loop", 1, "ours-pass-through",
                        _result([dict(e2e=0.21, calls=1)], offered=4.0), 0.2),
      bench.compare_row("open-loop", 1, "litellm-pass-through", _result([], **{"429": 5}), 0.2),
  ]
  lines = bench.format_compare_table(rows).splitlines()
  assert len(lines) == 2 + len(rows)
  assert len({line.count("|") for line in lines}) == 1   # every line has the header's columns
  assert lines[2].startswith("| lockstep | 1 | ours-routed | 1 | n/a | 0.5 | 1.600 | 1.600 | "
                             "2.00 / 2.00 | n/a | 0 / 0 / 0 |")
  assert "| 4.0 | 0.5 | 0.210 | 0.210 | n/a | 10.0 / 10.0 | 0 / 0 / 0 |" in lines[3]
  assert lines[4].endswith("| n/a | n/a | n/a | n/a | 5 / 0 / 0 |")
  data = json.loads(bench.compare_json(rows, {"requests": 1}))
  assert data == {"settings": {"requests": 1}, "rows": rows}
