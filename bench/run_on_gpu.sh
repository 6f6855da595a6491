#!/usr/bin/env bash
# Build, test and benchmark on the lent GPU machine in one call (docs/performance.md).
#
# Usage: bash bench/run_on_gpu.sh [tests|bench|all]     (default: all)
#        from the project's root, e.g. as the device tool's command with carry [".gpu"].
#
# Needs:
#   - a machine with an NVIDIA GPU and its Vulkan driver (the lent machine has
#     its ICD at /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json);
#   - .gpu/ in the project's root, filled once on this side by
#     `bash ../shared/gpu/prepare` and carried to the GPU machine: the Vulkan
#     loader packages, the wgpu wheel pywgtrain builds against, and
#     .gpu/prelude.sh, which installs them there (the machine is offline);
#   - python3 with pip, and for `bench` also cmake and ninja (C++ microbenchmark).
# A missing prerequisite stops the script before any work with a one-line
# message on stderr and exit status 1 (2 for a bad argument); so does a failed
# build or a WebGPU without adapter (after the log's tail).
#
# Writes logs, JSON results and the demo's loss curve under $OUT (default ./out).
set -uo pipefail

usage() { sed -n '2,/^[^#]/{/^#/s/^# \{0,1\}//p}' "$0"; }  # the header comment above
die() { echo "run_on_gpu.sh: $*" >&2; exit 1; }

case ${1:-all} in
  -h | --help) usage; exit 0 ;;
  tests | bench | all) what=${1:-all} ;;
  *) echo "run_on_gpu.sh: unknown argument '$1' (expected tests, bench or all; --help)" >&2; exit 2 ;;
esac

[[ -f pyproject.toml && -f bench/run_on_gpu.sh ]] || die "run it from the project's root (no pyproject.toml here: $PWD)"
[[ -f .gpu/prelude.sh ]] ||
  die ".gpu/prelude.sh missing: run 'bash ../shared/gpu/prepare' once from the project's root, then carry [\".gpu\"]"
command -v python3 >/dev/null || die "python3 not found"
if [[ $what == bench || $what == all ]]; then
  for tool in cmake ninja; do command -v "$tool" >/dev/null || die "$tool not found (needed for the C++ benchmark)"; done
fi

OUT=${OUT:-out}
mkdir -p "$OUT"
# shellcheck disable=SC1091
source .gpu/prelude.sh || die "sourcing .gpu/prelude.sh failed (no GPU, or .gpu/ incomplete: prepare it again)"
[[ -f ${VK_DRIVER_FILES:-} ]] || die "no Vulkan driver for the GPU: ${VK_DRIVER_FILES:-VK_DRIVER_FILES unset} missing"
root=$PWD
# The build log stays out of $OUT (the device tool brings back at most 8 files).
python3 -m pip install -q --no-build-isolation --no-deps . > /tmp/pywgtrain-build.txt 2>&1 ||
  { tail -30 /tmp/pywgtrain-build.txt >&2; die "building pywgtrain failed (build log above)"; }
cd /tmp  # import the installed package, not the source tree
python3 -m pywgtrain info > "$OUT/info.txt" 2>&1 ||
  { cat "$OUT/info.txt" >&2; die "WebGPU finds no usable adapter (pywgtrain info failed, above)"; }
head -8 "$OUT/info.txt"
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
