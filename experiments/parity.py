"""Checks gp_jax's copy of the released GraphPlanner network and update against a reference file.

  python -m experiments.parity --reference=tests/graph/official_large.npz

Computes gp_jax's action probabilities, values, and (when the file has one) the released PPO
update for the file's weights and inputs, prints each output's largest absolute and relative
difference from the released code's, and exits 0 when every output is within its tolerance
(docs/parity.md), 1 when one is not, 2 (one `error:` line) when the file does not follow the schema.
Reference files are written by tests/graph/make_official_reference.py from the authors' checkout.
"""
import sys

from absl import flags

from experiments import common
from gp_jax import errors
from gp_jax.rl import official_reference

_REFERENCE = flags.DEFINE_string("reference", "", "Reference .npz file (docs/parity.md).")
_JIT = flags.DEFINE_boolean("jit", True, "Compile (false: every operation runs eagerly).")


@common.user_errors_exit_2
def main(argv):
  if len(argv) > 1:
    raise errors.ConfigError(f"unexpected arguments: {' '.join(argv[1:])}")
  if not _REFERENCE.value:
    raise errors.ConfigError("--reference is required")
  ref = official_reference.load(_REFERENCE.value)
  rows = official_reference.compare(ref, official_reference.compute(ref, jit=_JIT.value))
  print(f"parity with the released code: {ref.path} ({ref.arrays['cfg/source']})"
        if "cfg/source" in ref.arrays else f"parity with the released code: {ref.path}")
  print(f"{'output':<18} {'max abs diff':>13} {'max rel diff':>13}  {'tolerance':<26} result")
  for r in rows:
    print(f"{r.name:<18} {r.max_abs:13.3e} {r.max_rel:13.3e}  {r.tolerance:<26} "
          f"{'ok' if r.ok else 'FAIL'}")
  bad = [r.name for r in rows if not r.ok]
  print("within tolerance" if not bad else f"outside tolerance: {', '.join(bad)}")
  sys.exit(1 if bad else 0)


if __name__ == "__main__":
  common.run(main)
