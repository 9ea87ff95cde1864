#!/usr/bin/env bash
# Chaos stage (separate from the unit tests, a few minutes of CPU): kills the real training CLI
# with SIGKILL at >= 10 seeded random moments (during checkpoint writes, rollouts, start-up and
# evaluation) at the default config's checkpoint spacing, reruns it each time, and checks that
# metrics.jsonl and eval.json equal those of an uninterrupted run (tests/chaos/).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
export GP_JAX_CHAOS=1
python -m pytest -q -m chaos tests/chaos "$@"
