#!/usr/bin/env bash
# Creates (once) the separate virtual environment with LiteLLM's proxy (PyPI: litellm[proxy])
# that benchmarks/bench_server.py --litellm=auto measures beside the router server, and prints
# that venv's python path on stdout:
#   PY="$(bash scripts/setup_litellm.sh)" && python benchmarks/bench_server.py --litellm="$PY" ...
# gp_jax never imports litellm: it lives only here, apart from the JAX venv (scripts/env.sh). The
# venv's name carries a hash of the pin, so changing the pin builds a new one;
# scripts/cached_venv.sh holds the lock and the .complete mark.
#
# The pin is the newest release whose [proxy] extra resolves on this machine's package index:
# 1.109.0 and later ask for litellm-proxy-extras / litellm-proxy releases that the index lacks.
# LITELLM_LOCAL_MODEL_COST_MAP=True keeps litellm from fetching its price table from the network
# when it is imported (here, for the check, and in the benchmark's proxy process).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/cached_venv.sh"
CACHE="${GP_JAX_CACHE:-$HOME/.cache/gp_jax}"
LITELLM_VERSION="1.108.7"
KEY="$(printf '%s\n' "litellm[proxy]==$LITELLM_VERSION" | sha1sum | cut -c1-8)"
VENV="${GP_JAX_LITELLM_VENV:-$CACHE/litellm-venv-$KEY}"
# The check imports the proxy's server module, as its CLI loads it (fastapi, uvicorn, the router).
LITELLM_LOCAL_MODEL_COST_MAP=True cached_venv litellm "$VENV" "import litellm.proxy.proxy_server" \
  "litellm[proxy]==$LITELLM_VERSION"
