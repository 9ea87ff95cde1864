#!/usr/bin/env bash
# Sets up the environment (cached) and runs the unit tests.
source "$(dirname "$0")/env.sh"
python -m pytest -q tests "$@"
