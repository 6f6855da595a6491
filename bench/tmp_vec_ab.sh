#!/usr/bin/env bash
# temporary: whole-vec4 tile loads A/B (removed after the experiment)
source .gpu/prelude.sh
python3 -m pip install -q --no-build-isolation --no-deps . 2>&1 | tail -5
cd /tmp
mkdir -p /tmp/glc; __GL_SHADER_DISK_CACHE=1 __GL_SHADER_DISK_CACHE_PATH=/tmp/glc __GL_SHADER_DISK_CACHE_SKIP_CLEANUP=1 \
  python3 -m pywgtrain bench gemm --no-baseline --shapes 4096x4096x4096 2>&1 | grep -v "^adapter"
tar czf $OUT/cache.tgz /tmp/glc
S=4096x4096x4096,4096x4096x4096:TN,4096x4096x4096:TT,4096x4096x4096:NT,8192x8192x8192,2048x2048x2048,4096x4096x1024,4096x1024x4096,4096x512x4096:TN,512x1024x4096
for v in 1 0 1 0; do
  echo "== VEC=$v"
  PYWGTRAIN_GEMM_VEC=$v python3 -m pywgtrain bench gemm --no-baseline --shapes $S 2>&1 | grep -v "^adapter"
done
