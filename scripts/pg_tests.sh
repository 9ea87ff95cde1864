#!/usr/bin/env bash
# PostgreSQL stage (separate from the unit tests): the replica store gp_jax/serving/state/postgres.py
# and two serve_router replicas on one database, against a real PostgreSQL server that the tests
# start (scripts/postgres.sh: a throwaway cluster on 127.0.0.1, installed first when missing) and
# always stop. tests/pg/.
# The 120 s replica hold by hand (docs/lab/2026-12-07-replica-hold-look.md):
#   GP_JAX_HOLD_S=120 bash scripts/pg_tests.sh -s -k held
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/postgres.sh install
source scripts/env.sh
export GP_JAX_PG=1
python -m pytest -q -m pg tests/pg "$@"
