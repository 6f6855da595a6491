#!/usr/bin/env bash
# Build, test and benchmark on the lent GPU in one call (see docs/performance.md):
#   device run, carry [".gpu"], command: bash bench/run_on_gpu.sh [tests|bench|all]
# Writes logs and JSON results under $OUT.
set -uo pipefail
what=${1:-all}
OUT=${OUT:-out}
mkdir -p "$OUT"
source .gpu/prelude.sh
python3 -m pip install -q --no-build-isolation --no-deps . 2>&1 | tail -30
cd /tmp  # import the installed package, not the source tree
python3 -m pywgtrain info 2>&1 | tee "$OUT/info.txt" | head -8
root=$OLDPWD
if [[ $what == tests || $what == all ]]; then
  python3 -m pytest -q -p no:cacheprovider "$root/tests" 2>&1 | tee "$OUT/pytest.txt" | tail -15
fi
if [[ $what == bench || $what == all ]]; then
  python3 -m pywgtrain bench all --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.txt"
fi
