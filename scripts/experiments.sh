#!/usr/bin/env bash
# Every experiment of the paper on the simulated pool (the alpha sweep, the studies phases, unseen,
# ablations, roles and drift (twice: history by mean and by retrieval), the routed Graph Counselor,
# the released code's settings), then one report with figures.
#   bash scripts/experiments.sh          CPU size: workdirs/experiments/, report -> docs/report.md
#   bash scripts/experiments.sh test     CI size:  workdirs/experiments_test/, report next to it
#   bash scripts/experiments.sh v2       CPU size on the v2 world (data/world_v2.json; it failed its
#                                        check, docs/calibration.md): workdirs/experiments_v2/,
#                                        report -> docs/report_v2.md; no routed Graph Counselor (its
#                                        simulated pool does not read the world, so it is v1's run)
# Each runner is resumable: rerunning skips finished cells and resumes interrupted training.
# Extra arguments after the size go to every study and sweep run, so they must name fields both
# configs have (e.g. --config.train.episodes=2000).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
size="${1:-default}"
world=()   # none: the default world, v1
shift || true
case "$size" in
  default) suffix="";      root="workdirs/experiments";      out="docs/report.md"; drift_seeds="0,1,2" ;;
  v2)      suffix="";      root="workdirs/experiments_v2";   out="docs/report_v2.md"; drift_seeds="0,1,2"
           world=(--config.sim.world=v2 --config.sim.world_file=data/world_v2.json) ;;
  test)    suffix=":test"; root="workdirs/experiments_test"; out="$root/report.md"; drift_seeds="0" ;;
  *) echo "error: unknown size '$size' (use default, test or v2)" >&2; exit 2 ;;
esac
set -- ${world[@]+"${world[@]}"} "$@"   # the world's flags go to every sweep and study run
mkdir -p "$root/studies"
t0=$(date +%s)
stamp() { echo "[experiments] $1: $(( $(date +%s) - t0 ))s elapsed" >&2; }
python -m experiments.calibrate --config="experiments/configs/calibrate.py$suffix" --workdir="$root/calibrate"
stamp "calibration of the v2 world"
python -m experiments.sweep --config="experiments/configs/sweep.py$suffix" --workdir="$root/sweep" "$@"
stamp "alpha sweep"
for study in phases unseen ablations roles; do
  python -m experiments.study --study="$study" --config="experiments/configs/study.py$suffix" \
    --workdir="$root/studies/$study" "$@"
  stamp "study $study"
done
# The drift study with three seeds at CPU size (with two, a 95% t-interval is +-9 std wide).
python -m experiments.study --study=drift --config="experiments/configs/study.py$suffix" \
  --workdir="$root/studies/drift" --config.study.seeds="$drift_seeds" "$@"
stamp "study drift"
# The drift study's second aggregation of the history: per-query retrieval of the k nearest rows
# (docs/memory.md), on the two events where the pool gets worse.
python -m experiments.study --study=drift --config="experiments/configs/study.py$suffix" \
  --workdir="$root/studies/drift_retrieval" --config.model.history=retrieval \
  --config.study.drift_events=quality_drop,fail "$@"
stamp "study drift (history by retrieval)"
if [ "$size" != v2 ]; then
  python -m experiments.counselor_routed --config="experiments/configs/counselor_routed.py$suffix" \
    --workdir="$root/counselor_routed"
  stamp "routed Graph Counselor"
fi
# The released code's settings (experiments/configs/official.py, docs/official.md): one training
# run and its evaluation, into $root/official (about a minute at CPU size). Not on the v2 world:
# it reproduces the authors' settings on the default one.
if [ "$size" != v2 ]; then
  python -m experiments.train --config="experiments/configs/official.py$suffix" \
    --workdir="$root/official"
  stamp "released code's settings (official.py)"
fi
python -m experiments.report --root="$root" --out="$out"
stamp "report"
