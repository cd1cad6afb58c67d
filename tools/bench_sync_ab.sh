#!/usr/bin/env bash
# Interleaved A/B of `dssync bench-sync` (4 workers, fp32 pairs, 1M/4M/16M parameters) between
# a checkout of an older commit (BASE, a git worktree) and this one, REPEATS rounds of one run
# each; JSON per run into OUT (base-N.json, main-N.json). Used for the one-transport change:
#   git worktree add /tmp/base 45339be && tools/bench_sync_ab.sh /tmp/base docs/results/bench-sync/transport-ab 5
# PARAMS and STEPS pick the sizes and steps (the 16M re-run of 2026-12-06, 8 rounds):
#   PARAMS=16000000 tools/bench_sync_ab.sh /tmp/base /tmp/ab16 8
# BASE_ARGS and MAIN_ARGS add options to one side; with BASE this checkout, they are the A/B
# (the finiteness check's cost, 2026-12-07):
#   PARAMS="1000000 4000000" STEPS=40 MAIN_ARGS="--nonfinite spread" \
#     tools/bench_sync_ab.sh . docs/results/bench-sync/guard-ab 3
set -euo pipefail
BASE=${1:?a worktree of the older commit}
OUT=$(mkdir -p "${2:?a folder for the JSON files}" && cd "$2" && pwd)
REPEATS=${3:-5}
PARAMS=${PARAMS:-1000000 4000000 16000000}
STEPS=${STEPS:-20}
HERE=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-$HERE/.venv/bin/python}
mkdir -p "$OUT"
for r in $(seq 1 "$REPEATS"); do
  for side in base main; do
    dir=$BASE extra=${BASE_ARGS:-}
    [ "$side" = main ] && dir=$HERE extra=${MAIN_ARGS:-}
    (cd "$dir" && PYTHONPATH=src timeout 600 "$PY" -m dssync bench-sync --workers 4 \
      $(printf -- '--params %s ' $PARAMS) --steps "$STEPS" $extra --json "$OUT/$side-$r.json")
  done
done
