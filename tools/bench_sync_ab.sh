#!/usr/bin/env bash
# Interleaved A/B of `dssync bench-sync` (4 workers, fp32 pairs, 1M/4M/16M parameters) between
# a checkout of an older commit (BASE, a git worktree) and this one, REPEATS rounds of one run
# each; JSON per run into OUT (base-N.json, main-N.json). Used for the one-transport change:
#   git worktree add /tmp/base 45339be && tools/bench_sync_ab.sh /tmp/base docs/results/bench-sync/transport-ab 5
set -euo pipefail
BASE=${1:?a worktree of the older commit}
OUT=${2:?a folder for the JSON files}
REPEATS=${3:-5}
HERE=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-$HERE/.venv/bin/python}
mkdir -p "$OUT"
for r in $(seq 1 "$REPEATS"); do
  for side in base main; do
    dir=$BASE; [ "$side" = main ] && dir=$HERE
    (cd "$dir" && PYTHONPATH=src timeout 600 "$PY" -m dssync bench-sync --workers 4 \
      --params 1000000 --params 4000000 --params 16000000 --steps 20 --json "$OUT/$side-$r.json")
  done
done
