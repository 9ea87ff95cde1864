#!/usr/bin/env bash
# The main job: set up the environment (cached), then train GraphPlanner routers on the embedded
# simulated LLM pool at alpha = 0 and alpha = 0.5 (two processes side by side) and evaluate each
# against a random policy, every single LLM and the exact optimum. Rerunning resumes (or, when
# finished, re-evaluates). Extra flags go to both runs, e.g. --config.train.episodes=2000.
# While they run, the terminal shows their progress lines ("[train] ...", "[eval ...] ...", about
# one every 10 s each, GP_JAX_PROGRESS_EVERY seconds); the full output goes to workdirs/alpha*.log
# (GP_JAX_WORKDIRS=<folder> puts the workdirs and logs there instead of workdirs/).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
set -m   # each run in its own process group, so an interrupt stops all of its processes
workdirs="${GP_JAX_WORKDIRS:-workdirs}"
mkdir -p "$workdirs"
start=$(date +%s)
alphas=(0.0 0.5)
logs=""
for alpha in "${alphas[@]}"; do logs+=" $workdirs/alpha$alpha.log"; done
echo "[train.sh] training at alpha ${alphas[*]} side by side; full logs:$logs"

run_alpha() {   # alpha, then the extra flags: the run's output to its log, progress to the terminal
  local alpha="$1"
  shift
  python -m experiments.train --config=experiments/configs/default.py \
    --config.alpha="$alpha" --workdir="$workdirs/alpha$alpha" "$@" 2>&1 \
    | tee "$workdirs/alpha$alpha.log" \
    | sed -u -n -e "s/^\(\[\|error:\|resumed\)/alpha $alpha  \1/p"
}

pids=()
for alpha in "${alphas[@]}"; do
  run_alpha "$alpha" "$@" &
  pids+=($!)
done
trap 'for p in "${pids[@]}"; do kill -- "-$p" 2>/dev/null || true; done; exit 130' INT TERM
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
for alpha in "${alphas[@]}"; do
  echo "== alpha = $alpha (log: $workdirs/alpha$alpha.log) =="
  # The summary the runner printed at the end, without the progress lines.
  grep -Ev '^\[|^[IWE][0-9]{4} |^\s*$' "$workdirs/alpha$alpha.log" | tail -25 || true
done
echo "total wall time: $(( $(date +%s) - start ))s"
exit $status
