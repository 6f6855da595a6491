#!/usr/bin/env bash
# Build, test and benchmark on the lent GPU in one call (docs/performance.md):
#   device run, carry [".gpu"], command: bash bench/run_on_gpu.sh [tests|bench|all]
# Writes logs, JSON results and the demo's loss curve under $OUT.
set -uo pipefail
what=${1:-all}
OUT=${OUT:-out}
mkdir -p "$OUT"
source .gpu/prelude.sh
root=$PWD
python3 -m pip install -q --no-build-isolation --no-deps . 2>&1 | tail -30
cd /tmp  # import the installed package, not the source tree
python3 -m pywgtrain info 2>&1 | tee "$OUT/info.txt" | head -8
if [[ $what == tests || $what == all ]]; then
  python3 -m pytest -q -p no:cacheprovider "$root/tests" 2>&1 | tee "$OUT/pytest.txt" | tail -15
fi
if [[ $what == bench || $what == all ]]; then
  python3 -m pywgtrain bench all --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.txt"
  # C++ microbenchmark: the core driven directly, GPU timestamps, JSON out.
  cmake -S "$root" -B /tmp/cpp-bench -G Ninja -DPYWGTRAIN_BUILD_BENCHMARKS=ON -DPYWGTRAIN_BUILD_PYTHON=OFF \
    -DPython_EXECUTABLE="$(command -v python3)" >/dev/null && cmake --build /tmp/cpp-bench >/dev/null &&
    /tmp/cpp-bench/gemm_bench 1024x1024x1024 2048x2048x2048 4096x4096x4096 4096x4096x4096:NT 4096x4096x4096:TN \
      4096x4096x4096:TT 64x1024x1024 256x768x3072 512x1024x4096 1x4096x4096 --reps 50 | tee "$OUT/gemm_bench_cpp.json"
  python3 "$root/bench/gemv_probe.py" 2>&1 | tee "$OUT/gemv_probe.txt"
  python3 -m pywgtrain train --plot "$OUT/loss_curve.png" --min-accuracy 0.95 2>&1 | grep -v "step/s" | tee "$OUT/train.txt"
fi
