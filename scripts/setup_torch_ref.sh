#!/usr/bin/env bash
# Creates (once) the CPU-torch virtual environment that runs the authors' released PyTorch code
# for the parity fixtures (tests/graph/make_official_reference.py) and the torch-side timing
# (benchmarks/bench_official_torch.py), and prints that venv's python path on stdout:
#   PY="$(bash scripts/setup_torch_ref.sh)" && "$PY" tests/graph/make_official_reference.py ...
# gp_jax never imports torch; torch lives only here, apart from the JAX venv (scripts/env.sh).
# scripts/cached_venv.sh holds the lock (one creator at a time; others wait, then reuse) and the
# .complete mark (an interrupted install is redone rather than trusted).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/cached_venv.sh"
CACHE="${GP_JAX_CACHE:-$HOME/.cache/gp_jax}"
TORCH_VERSION="2.13.0+cpu"
VENV="${GP_JAX_TORCH_REF_VENV:-$CACHE/torch-ref}"
cached_venv torch-ref "$VENV" "import torch, numpy" "torch==$TORCH_VERSION" numpy
