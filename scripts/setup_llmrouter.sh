#!/usr/bin/env bash
# Creates (once) the separate virtual environment with LLMRouter (PyPI: llmrouter-lib) and CPU
# torch that the llmrouter stage (scripts/llmrouter_tests.sh) trains LLMRouter's routers in, and
# prints that venv's python path on stdout:
#   PY="$(bash scripts/setup_llmrouter.sh)" && "$PY" scripts/llmrouter_convert.py ...
# gp_jax never imports torch: torch and LLMRouter live only here, apart from the JAX venv
# (scripts/env.sh). The venv's name carries a hash of the pins, so changing a pin builds a new one.
# scripts/cached_venv.sh holds the lock (one creator at a time; others wait, then reuse) and the
# .complete mark (an interrupted install is redone rather than trusted).
#
# llmrouter-lib is installed with its full dependency set (gradio, litellm, transformers,
# datasets, torch-geometric, ...): it resolves on this machine's package indexes. Importing
# `llmrouter.models` imports every router module, so even KNN alone needs transformers, pillow,
# pydantic, scipy and scikit-learn; only torch is pinned here (the CPU build), the rest is left to
# the resolver.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/cached_venv.sh"
CACHE="${GP_JAX_CACHE:-$HOME/.cache/gp_jax}"
TORCH_VERSION="2.13.0+cpu"
LLMROUTER_VERSION="0.4.0"
KEY="$(printf '%s\n' "$TORCH_VERSION" "$LLMROUTER_VERSION" | sha1sum | cut -c1-8)"
VENV="${GP_JAX_LLMROUTER_VENV:-$CACHE/llmrouter-venv-$KEY}"
# The check imports the routers the stage trains, through the package's own import path (litellm,
# which it imports, would otherwise fetch a price table from the network first).
LITELLM_LOCAL_MODEL_COST_MAP=True cached_venv llmrouter "$VENV" \
  "from llmrouter.models import KNNRouter, KNNRouterTrainer, MLPRouter, MLPTrainer" \
  "torch==$TORCH_VERSION" "llmrouter-lib==$LLMROUTER_VERSION"
