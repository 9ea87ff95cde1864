"""Fits the v2 world's cluster-offset size to LLMRouterBench's oracle gap; writes a world file.

  python -m experiments.oracle_gap --out=data/world_v2_gap.json \
    [--quantity=recovered_share] [--target=0.689] [--n_queries=2000] [--seeds=0,1,2,3,4] \
    [--base=data/world_v2.json] [--report=/tmp/oracle_gap.md]
On the catalog's LLMs of 7-9B, bisects cluster_offset_sd so that the per-query oracle's
--quantity (recovered_share, gap_points or ratio; default LLMRouterBench's value as --target)
matches on each seed's simulated queries (gp_jax/sim/oracle_gap.py). --out gets the --base world
file with the mean fitted size (to 0.01 logit), a new `about` and the whole record under
"oracle_gap_fit"; the markdown report goes to stdout (and to --report). Load the world with
--config.sim.world=v2 --config.sim.world_file=<out>. A target the offsets cannot reach is an
`error:` line naming the values at the search's ends. Docs: docs/lab/2026-12-07-oracle-gap.md.
"""
import pathlib
import time

from absl import flags

from experiments import common
from experiments.configs import calibrate as calibrate_config
from gp_jax import config_lists
from gp_jax import errors
from gp_jax import files
from gp_jax import paths
from gp_jax.llm import catalog as catalog_lib
from gp_jax.sim import calibration
from gp_jax.sim import oracle_gap

_OUT = flags.DEFINE_string("out", None, "The fitted world file to write (JSON).", required=True)
_BASE = flags.DEFINE_string("base", str(paths.DATA_DIR / "world_v2.json"),
                            "The world file whose cluster_offset_sd is fitted (left unchanged).")
_QUANTITY = flags.DEFINE_enum("quantity", "recovered_share", list(oracle_gap.QUANTITIES),
                              "Which reading of the oracle gap to match.")
_TARGET = flags.DEFINE_float("target", None, "The value to match (default: LLMRouterBench's).")
_N_QUERIES = flags.DEFINE_integer("n_queries", 2000, "Simulated test queries per seed.")
_SEEDS = flags.DEFINE_string("seeds", "0,1,2,3,4", "Comma list of the query sets' seeds.")
_REPORT = flags.DEFINE_string("report", "", "Also write the markdown report to this file.")


@common.user_errors_exit_2
def main(argv):
  if len(argv) > 1:
    raise errors.ConfigError(f"unexpected arguments: {' '.join(argv[1:])}")
  out = common.check_output_file(_OUT.value, "out")
  report_path = (common.check_output_file(_REPORT.value, "report") if _REPORT.value
                 else None)
  base_path = pathlib.Path(_BASE.value).expanduser()
  if out.resolve() == base_path.resolve():
    raise errors.ConfigError(f"--out={_OUT.value} is the --base world file; write a new file")
  if not 1 <= _N_QUERIES.value <= 100_000:
    raise errors.ConfigError(f"--n_queries={_N_QUERIES.value}: give 1 to 100000")
  seeds = config_lists.seeds(_SEEDS.value)
  if _TARGET.value is not None:
    oracle_gap.check_target(_QUANTITY.value, _TARGET.value)
  base = errors.read_json(base_path, "base world file")
  catalog = catalog_lib.load_catalog()
  settings = calibration.settings_from_config(calibrate_config.get_config(), catalog)
  start = time.time()
  record = oracle_gap.study(catalog, base, quantity=_QUANTITY.value, target=_TARGET.value,
                            n_queries=_N_QUERIES.value, seeds=seeds,
                            calibration_settings=settings)
  content = oracle_gap.world_file(base, record["cluster_offset_sd"], oracle_gap.about(record),
                                  record)
  if "rmse_points" in content:   # the base's calibration RMSE, now measured in the new world
    content["rmse_points"] = record["calibration_rmse_points"]["fitted"]
  files.write_json(out, content, "fitted world file", indent=1)
  text = oracle_gap.render(record)
  if report_path is not None:
    files.write_atomic(report_path, text, "oracle gap report", parents=True)
  print(text)
  print(f"world file {out} (cluster_offset_sd = {record['cluster_offset_sd']:g}); "
        f"{time.time() - start:.0f} s")


if __name__ == "__main__":
  common.run(main)
