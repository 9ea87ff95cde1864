"""The cluster-offset size fitted to a published oracle gap (gp_jax/sim/oracle_gap.py and its
runner experiments/oracle_gap.py)."""
import dataclasses
import json
import pathlib
import subprocess
import sys

import pytest

from gp_jax import errors
from gp_jax.llm import catalog as catalog_lib
from gp_jax.sim import oracle_gap
from gp_jax.sim import simulator as sim
from gp_jax.sim import world as world_lib

REPO = pathlib.Path(__file__).resolve().parents[2]
V2_FILE = REPO / "data" / "world_v2.json"
GAP_FILE = REPO / "data" / "world_v2_gap.json"
NAMES = ["qwen2.5-7b-instruct", "llama-3.1-8b-instruct", "gemma-2-9b-it"]


@pytest.fixture(scope="module")
def setting():
  return (sim.load_profiles(catalog_lib.load_catalog().select(NAMES)),
          world_lib.load_world_file(V2_FILE))


def _measure(setting, n=150, seed=0, **changes):
  profiles, params = setting
  return oracle_gap.measure(profiles, params.replace(**changes), n_queries=n, seed=seed)


def test_bench_readings_and_the_same_kind_pool():
  b = oracle_gap.bench()
  assert b["gap_points"] == pytest.approx(18.54)
  assert b["ratio"] == pytest.approx(1.2536, abs=1e-4)
  assert b["recovered_share"] == pytest.approx(0.6892, abs=1e-4)
  pool = oracle_gap.same_kind_pool(catalog_lib.load_catalog())
  assert len(pool) == 6 and set(NAMES) <= set(pool)
  assert all(7 <= catalog_lib.load_catalog()[m].size_b <= 9 for m in pool)


def test_the_gap_grows_with_the_offset_size_on_a_fixed_query_set(setting):
  catalog = catalog_lib.load_catalog()
  same_kind = (sim.load_profiles(catalog.select(oracle_gap.same_kind_pool(catalog))), setting[1])
  rows = [_measure(same_kind, n=300, cluster_offset_sd=sd) for sd in (0.0, 0.8, 1.6, 2.4, 3.2)]
  for key in ("recovered_share", "gap_points", "oracle", "oracle_expected"):
    values = [r[key] for r in rows]
    assert values == sorted(values) and values[0] < values[-1], key


def test_size_zero_is_the_world_without_offsets(setting):
  profiles, params = setting
  zero = _measure(setting, cluster_offset_sd=0.0)
  one_cluster = _measure(setting, cluster_offset_sd=1.5, clusters_per_domain=1)  # centred: all 0
  for key in ("best_single", "oracle", "oracle_expected"):
    assert zero[key] == pytest.approx(one_cluster[key], abs=1e-12)
  world = sim.SimWorld(profiles, params=params.replace(cluster_offset_sd=0.0))
  assert all(world.cluster_offset(d, c, m) == 0.0 for d in profiles[NAMES[0]].theta
             for c in range(params.clusters_per_domain) for m in NAMES)


def test_the_search_hits_a_given_target(setting):
  profiles, params = setting
  target = _measure(setting, n=80, seed=3, cluster_offset_sd=1.3)["recovered_share"]
  got = oracle_gap.fit(profiles, params, quantity="recovered_share", target=target, n_queries=80,
                       seed=3)
  assert got["cluster_offset_sd"] == pytest.approx(1.3, abs=0.01)
  at = _measure(setting, n=80, seed=3, cluster_offset_sd=got["cluster_offset_sd"])
  assert at["recovered_share"] == pytest.approx(target, abs=1e-3)
  with pytest.raises(errors.ConfigError, match="below what the cluster offsets can give"):
    oracle_gap.fit(profiles, params, quantity="gap_points", target=5.0, n_queries=80, seed=3)
  with pytest.raises(errors.ConfigError, match="must lie in"):
    oracle_gap.fit(profiles, params, quantity="ratio", target=0.9, n_queries=80, seed=3)


def _params_differ(a: world_lib.WorldParams, b: world_lib.WorldParams) -> set:
  return {f.name for f in dataclasses.fields(a) if getattr(a, f.name) != getattr(b, f.name)}


def test_the_written_world_file_loads_and_differs_only_in_the_fitted_size(tmp_path):
  base = json.loads(V2_FILE.read_text())
  record = oracle_gap.study(catalog_lib.load_catalog(), base, n_queries=40, seeds=[0, 1],
                            table_sizes=(0.0, 2.0), replicate_to=8)
  assert record["fit"]["per_seed"] and 0 < record["cluster_offset_sd"] < oracle_gap.MAX_SD
  assert "LLMRouterBench" in oracle_gap.render(record)
  content = oracle_gap.world_file(base, record["cluster_offset_sd"], oracle_gap.about(record),
                                  record)
  path = tmp_path / "world.json"
  path.write_text(json.dumps(content))
  loaded, v2 = world_lib.load_world_file(path), world_lib.load_world_file(V2_FILE)
  assert _params_differ(loaded, v2) == {"cluster_offset_sd"}
  assert loaded.cluster_offset_sd == record["cluster_offset_sd"]
  assert "LLMRouterBench" in content["about"] and "LLMRouterBench" not in base["about"]
  if GAP_FILE.exists():   # the file the runner wrote (docs/lab/2026-12-07-oracle-gap.md)
    assert _params_differ(world_lib.load_world_file(GAP_FILE), v2) == {"cluster_offset_sd"}


@pytest.mark.parametrize("flags, words", [
    (["--seeds=a"], "--seeds"),
    (["--n_queries=0"], "--n_queries"),
    (["--target=1.5"], "must lie in (0, 1)"),
    (["--quantity=gap_points", "--n_queries=30", "--seeds=0"], "below what the cluster offsets"),
    ([f"--out={V2_FILE}"], "is the --base world file"),
])
def test_bad_input_is_one_error_line_and_exit_2(tmp_path, flags, words):
  out = tmp_path / "w.json"
  proc = subprocess.run([sys.executable, "-m", "experiments.oracle_gap", f"--out={out}", *flags],
                        cwd=REPO, capture_output=True, text=True, timeout=120)
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), proc.stderr
  assert words in lines[0] and not out.exists()
