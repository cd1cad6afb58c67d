#!/usr/bin/env bash
# `make wheel-check`: does `pip install dssync` give a working library with torch alone?
#
# Builds the wheel and the sdist into dist/, makes a fresh venv with only the pinned CPU torch,
# installs the wheel there (its dependencies: torch and numpy), then checks that none of the lab
# extra came along, that the `dssync` command says in one line to install dssync[lab], and runs
# examples/quickstart.py from outside the checkout under torchrun on 2 ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PY:-.venv/bin/python}
OUT=build/wheel-check
rm -rf dist "$OUT"
mkdir -p "$OUT"

"$PY" -m build --sdist --wheel --outdir dist . >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
wheel=$(ls dist/dssync-*.whl)
echo "wheel-check: built $(cd dist && ls)"

python3 -m venv "$OUT/venv"
V="$ROOT/$OUT/venv/bin"
"$V/pip" install -q "$(grep '^torch==' requirements.txt)"
"$V/pip" install -q -c requirements.txt "$wheel"

extra=$("$V/pip" list --format=freeze 2>/dev/null | grep -i -E '^(click|rich|tqdm|matplotlib|scikit-learn|mlxtend)==' || true)
if [ -n "$extra" ]; then echo "wheel-check: the wheel pulled lab packages: $extra"; exit 1; fi

cd "$OUT"   # away from src/: the venv's dssync is the one imported
"$V/python" -c "import dssync, sys; assert '/venv/' in dssync.__file__, dssync.__file__; print('wheel-check: import dssync', dssync.__version__, 'from the venv')"
if msg=$("$V/dssync" train 2>&1); then echo "wheel-check: dssync ran without the lab extra"; exit 1; fi
case "$msg" in *"dssync[lab]"*) echo "wheel-check: dssync without the extra: $msg" ;;
  *) echo "wheel-check: dssync without the extra said: $msg"; exit 1 ;; esac
[ "$(printf '%s\n' "$msg" | wc -l)" -eq 1 ] || { echo "wheel-check: more than one line"; exit 1; }

# Each rank's "rank R: weight norm X" (two ranks' prints may share a line of the pipe).
results() { grep -o 'rank [0-9]*: weight norm -\?[0-9.]*' quickstart.log; }

# gloo's abort at process exit ("terminate called without an active exception", issue 27) is
# rare since comm/inflight.py, not gone: 0 of 40 runs of `tools/exit_aborts.py --runs 40 --load 2
# --example library` on 2026-12-06, once in that day's CI, after both ranks had printed the same
# model. Exactly that abort, after both ranks printed, is run once more and said aloud; a second
# abort, or any other failure, fails the check.
ABORT="terminate called without an active exception"
ok=0
for try in 1 2; do
  timeout 300 "$V/torchrun" --standalone --nproc-per-node 2 "$ROOT/examples/quickstart.py" >quickstart.log 2>&1 && { ok=1; break; }
  if [ "$try" -eq 1 ] && grep -q "$ABORT" quickstart.log && [ "$(results | wc -l)" -eq 2 ]; then
    echo "wheel-check: WARNING: a rank aborted at exit after both printed (gloo's exit race, issue 27); once more"
  else
    break
  fi
done
[ "$ok" -eq 1 ] || { tail -30 quickstart.log; echo "wheel-check: the quickstart failed"; exit 1; }
[ "$(results | sed 's/^rank [0-9]*: //' | sort -u | wc -l)" -eq 1 ] && [ "$(results | wc -l)" -eq 2 ] \
  || { cat quickstart.log; echo "wheel-check: the ranks did not end with one model"; exit 1; }
echo "wheel-check: examples/quickstart.py ran on 2 ranks from the wheel: $(results | sort | tr '\n' ' ')"
