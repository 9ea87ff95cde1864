#!/usr/bin/env bash
# Sets up the environment (cached) and runs the unit tests.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
python -m pytest -q tests "$@"
