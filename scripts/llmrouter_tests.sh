#!/usr/bin/env bash
# llmrouter stage (separate from the unit tests): builds, once and cached, the LLMRouter venv
# (scripts/setup_llmrouter.sh: llmrouter-lib and CPU torch, apart from the JAX venv), then runs the
# tests marked `llmrouter` (tests/llmrouter/): a route log exported by experiments.export_routes
# (rows, embeddings, LLM descriptions) trains LLMRouter's own KNN, MLP and hybrid routers.
set -euo pipefail
cd "$(dirname "$0")/.."
GP_JAX_LLMROUTER_PYTHON="$(bash scripts/setup_llmrouter.sh)"
export GP_JAX_LLMROUTER_PYTHON
source scripts/env.sh
export GP_JAX_LLMROUTER=1
python -m pytest -q -m llmrouter tests/llmrouter "$@"
