#!/usr/bin/env bash
# The released code's math on whatever accelerator JAX finds (a GPU when there is one), in one go:
# parity on every committed reference file, the --official bench at the released shapes (gp_jax's
# side only: the released code runs on CPU beside it when --torch_python/--official_repo are given
# to bench_garnet.py by hand), and a CI-size training with the released settings.
#   bash scripts/official_check.sh [out_dir]     (default: workdirs/official_check)
# Prints everything and keeps the logs in out_dir; exits non-zero when a step fails.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
out="${1:-workdirs/official_check}"
mkdir -p "$out"
python -c 'import jax; print("jax", jax.__version__, "devices:", jax.devices())' | tee "$out/devices.txt"
for f in tests/graph/official_*.npz; do
  python -m experiments.parity --reference="$f" | tee "$out/parity_$(basename "$f" .npz).txt"
done
python benchmarks/bench_garnet.py --official --sizes="${GP_JAX_OFFICIAL_SIZES:-1000,10000,100000}" \
  --repeats=5 | tee "$out/bench_official.txt"
rm -rf "$out/train"
python -m experiments.train --config=experiments/configs/official.py:test --workdir="$out/train" \
  2>&1 | tail -n 20 | tee "$out/train.txt"
