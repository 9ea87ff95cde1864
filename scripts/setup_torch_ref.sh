#!/usr/bin/env bash
# Creates (once) the CPU-torch virtual environment that runs the authors' released PyTorch code
# for the parity fixtures (tests/graph/make_official_reference.py) and the torch-side timing
# (benchmarks/bench_official_torch.py), and prints that venv's python path on stdout:
#   PY="$(bash scripts/setup_torch_ref.sh)" && "$PY" tests/graph/make_official_reference.py ...
# gp_jax never imports torch; torch lives only here, apart from the JAX venv (scripts/env.sh).
# Like env.sh it holds a lock (one creator at a time; others wait, then reuse) and marks a
# finished venv with .complete, so an interrupted install is redone rather than trusted.
set -euo pipefail
CACHE="${GP_JAX_CACHE:-$HOME/.cache/gp_jax}"
TORCH_VERSION="2.13.0+cpu"
VENV="${GP_JAX_TORCH_REF_VENV:-$CACHE/torch-ref}"
LOG="$CACHE/torch-ref-install.log"
mkdir -p "$CACHE"
exec 7>"$CACHE/.torch-ref.lock"
flock 7

if [ ! -x "$VENV/bin/python" ] || [ ! -f "$VENV/.complete" ]; then
  echo "[torch-ref] creating $VENV (torch==$TORCH_VERSION; log: $LOG)" >&2
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  if ! "$VENV/bin/pip" install "torch==$TORCH_VERSION" numpy >"$LOG" 2>&1; then
    tail -n 30 "$LOG" >&2; echo "[torch-ref] pip install failed (log: $LOG)" >&2; exit 1
  fi
  if ! "$VENV/bin/python" -c "import torch, numpy" >>"$LOG" 2>&1; then
    tail -n 30 "$LOG" >&2; echo "[torch-ref] torch does not import (log: $LOG)" >&2; exit 1
  fi
  touch "$VENV/.complete"
  echo "[torch-ref] ready" >&2
fi

flock -u 7
echo "$VENV/bin/python"
