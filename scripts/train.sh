#!/usr/bin/env bash
# The main job: set up the environment (cached), then train GraphPlanner routers on the embedded
# simulated LLM pool at alpha = 0 and alpha = 0.5 and evaluate each against random, every single
# LLM and the exact optimum. Rerunning resumes (or, when finished, re-evaluates). Extra flags are
# passed to both runs, e.g. --config.train.episodes=2000.
source "$(dirname "$0")/env.sh"
for alpha in 0.0 0.5; do
  echo "== alpha = $alpha =="
  python -m experiments.train --config=experiments/configs/default.py \
    --config.alpha="$alpha" --workdir="runs/alpha$alpha" "$@"
done
