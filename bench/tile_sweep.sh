# A/B of GEMM tile configurations, each in its own process (PYWGTRAIN_GEMM_TILES),
# after one run with the default choice beside cuBLAS. On the GPU machine:
#   SHAPES=512x4096x4096,4096x512x4096:TN VARIANTS="64,128,16,8,4,8 ..." bash bench/tile_sweep.sh
source .gpu/prelude.sh
python3 -m pip install -q --no-build-isolation --no-deps . 2>&1 | tail -3
cd /tmp
S=${SHAPES:-4096x4096x4096,4096x4096x4096:TN,512x4096x4096,512x4096x4096:NT,4096x512x4096:TN,512x1024x4096}
python3 -m pywgtrain bench gemm --shapes $S 2>&1 | grep -v "^adapter"
for v in ${VARIANTS:-64,128,16,8,4,8 64,128,16,8,4,4 128,64,16,8,4,4 128,128,32,8,8 64,64,16,4,4}; do
  echo "== $v"
  PYWGTRAIN_GEMM_TILES=$v python3 -m pywgtrain bench gemm --no-baseline --shapes $S 2>&1 | grep -v "^adapter"
done
