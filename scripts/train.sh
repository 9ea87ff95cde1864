#!/usr/bin/env bash
# The main job: set up the environment (cached), then train GraphPlanner routers on the embedded
# simulated LLM pool at alpha = 0 and alpha = 0.5 (two processes side by side) and evaluate each
# against a random policy, every single LLM and the exact optimum. Rerunning resumes (or, when
# finished, re-evaluates). Extra flags go to both runs, e.g. --config.train.episodes=2000.
source "$(dirname "$0")/env.sh"
mkdir -p runs
start=$(date +%s)
pids=()
for alpha in 0.0 0.5; do
  python -m experiments.train --config=experiments/configs/default.py \
    --config.alpha="$alpha" --workdir="runs/alpha$alpha" "$@" >"runs/alpha$alpha.log" 2>&1 &
  pids+=($!)
done
trap 'kill "${pids[@]}" 2>/dev/null' INT TERM
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
for alpha in 0.0 0.5; do
  echo "== alpha = $alpha (log: runs/alpha$alpha.log) =="
  # Progress lines use carriage returns; show the summary the runner printed at the end.
  tr '\r' '\n' <"runs/alpha$alpha.log" | grep -Ev '^\[|^[IWE][0-9]{4} |^\s*$' | tail -25
done
echo "total wall time: $(( $(date +%s) - start ))s"
exit $status
