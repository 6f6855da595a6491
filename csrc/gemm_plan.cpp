// GEMM plan choice without measurements of this device: tile configuration
// and split-K count per shape (the heuristic plan), and the wave model that
// decides long- and mid-K splits.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "gemm_internal.hpp"

namespace pwt::gemm_detail {

namespace {

// From this K on, mid-size outputs take 64x128 tiles and split-K (each split
// still runs many K steps): 512x4096x1024 NT 155 -> 142 us (#38).
constexpr uint32_t kLongK = 2048;
// From this K on, outputs of few tiles may split K 32 ways instead of 16 (choose_splits).
constexpr uint64_t kVeryLongK = 32768;

// clang-format off
// Long K (a linear layer's dW = dY^T X: K = batch rows, 8192-16384 in GPT
// training) on outputs of a few hundred 64x128 tiles or fewer: the output
// alone fills one or two waves of workgroups, so wave quantization decides
// the time (3072x768x8192 TN: 288 tiles on the H100's 264 concurrent slots
// ran as two waves, the second nearly empty, 1.60x cuBLAS). Split K so that
// tiles * splits fills whole waves, by a cost model in units of one K step of
// one wave: waves * (K per split + kWaveFixedK) for the main pass, plus the
// partials' traffic and the reduce pass. Fitted on the H100 (64x128 tiles,
// splits 1-16, docs/gemm_notes.md #46): its picks land within 3-12% of the
// best measured split on every GPT-2 and nanoGPT dW shape.
constexpr uint64_t kLongKMinTiles = 16;
constexpr uint64_t kWaveFixedK = 128;     // a wave's prologue and tile store, in K steps
constexpr double kPartialCostK = 1e-5;    // per partial element written and summed
constexpr uint64_t kReduceCostK = 55;     // the reduce dispatch
constexpr uint64_t kMaxModelSplits = 32;
constexpr uint64_t kMinKPerSplit = 256;

uint64_t long_k_tiles(uint64_t m, uint64_t n) { return ceil_div(m, 64) * ceil_div(n, 128); }

// Mid K (kSplitMinK <= K < kLongK) on outputs of kMidKMinTiles to
// kMidKMaxTiles 64x128 tiles (0.7-1.5 waves): the same tiles and wave model
// (docs/gemm_notes.md #53, H100: 2304x1024x768 TN 140 -> 113 us, from 64x64
// tiles to 64x128 unsplit; 3072x1024x768 TN, 288 tiles, 170 -> 153 in the 3
// splits the model picks). At 384 tiles and K = 768 its 2 splits lost
// (4096x768x768 NT 136 -> 154 us). From kMidKFewTiles to kMidKMinTiles
// tiles the model's splits take them too where they fill at least 4/5 of
// a wave (#61: 777x768x768 NN, 78 tiles in 3 splits, 45.7 -> 39.9 us;
// 768x1024x768 TN 53.4 -> 49.7); at 96 tiles its 2 splits (0.73 waves)
// were no faster than 64x64 tiles split 4 ways (1024x768x768 NT 55.2 vs
// 53.2 us), which keep those.
constexpr uint64_t kMidKMinTiles = 192;
constexpr uint64_t kMidKMaxTiles = 384;
constexpr uint64_t kMidKFewTiles = 64;


uint32_t long_k_splits(const GemmSwitches& sw, uint64_t m, uint64_t n, uint64_t k) {
  const uint64_t tiles = long_k_tiles(m, n), slots = sw.slots;
  uint32_t best = 1;
  double best_cost = 0;
  for (uint64_t s = 1; s <= kMaxModelSplits && (s == 1 || k / s >= kMinKPerSplit); ++s) {
    const double waves = double(ceil_div(tiles * s, slots));
    double cost = waves * double(ceil_div(k, s) + kWaveFixedK);
    if (s > 1) cost += double(s) * double(m * n) * kPartialCostK + double(kReduceCostK);
    if (s == 1 || cost < best_cost) best = uint32_t(s), best_cost = cost;
  }
  return best;
}

// The splits of (m, n, k) on 64x128 tiles where the wave model applies; 0 where not.
uint32_t wave_model_splits(const GemmSwitches& sw, uint64_t m, uint64_t n, uint64_t k) {
  const uint64_t tiles = long_k_tiles(m, n);
  if (k >= kLongK) return tiles >= kLongKMinTiles ? long_k_splits(sw, m, n, k) : 0;
  if (k < kSplitMinK || tiles >= kMidKMaxTiles || tiles < kMidKFewTiles) return 0;
  const uint32_t splits = long_k_splits(sw, m, n, k);
  return tiles >= kMidKMinTiles || 5 * tiles * splits >= 4 * sw.slots ? splits : 0;
}

}  // namespace

// The warp block of 64x128 tiles for a transpose mode: TN products (the
// weight gradients) run warps on 4x8 thread blocks, the other modes on 8x4.
// H100, the same plans both ways (docs/gemm_notes.md #103): TN 1-2.5% faster
// on 4x8 (4096x1024x777 165.6 -> 161.5 us, 4096^3 3189 -> 3141), NN and NT
// 0.3-1% slower (4096^3 NN 3232 -> 3251).
TileConfig with_mode_warps(TileConfig t, bool ta, bool tb) {
  if (t.bm == 64 && t.bn == 128 && t.tm == 8 && t.tn == 4 && t.warp_w == 8 && ta && !tb) t.warp_w = 4;
  return t;
}

// 64x128 tiles (8x4 per thread, warps on 8x4 thread blocks; TN: 4x8) when the output
// gives >= 256 tiles of 128x64, or >= 64 with K too short to split or long;
// else 64x64 (4x4), which split-K (below) multiplies. Measured on the H100
// (docs/gemm_notes.md #16, #25-#33): 8x4 per thread beat 8x8 everywhere once
// tile loads were unchecked inside the matrix and coalesced per load; 64x128
// beat 128x64 by 2-4% on NN/TN, 4096x4096x1024 and the large training step
// (TT -3%); with split-K, 64x64 beat larger tiles on 256x768x3072 and 1024^3.
// lean_loop only changes what the compiler makes of the K loop (#37, #44):
// with 128-bit tile loads +3-6% at 4096^3 in NN, TN and NT, but -10% at
// 512x4096x4096 NT (256 tiles), so outputs of >= 512 tiles take it.
// PYWGTRAIN_GEMM_TILES (GemmSwitches::tiles) forces one configuration.
TileConfig choose_tiles(const GemmSwitches& sw, uint32_t m, uint32_t n, uint32_t k, bool ta, bool tb) {
  if (sw.tiles) return *sw.tiles;
  const uint64_t wide = ceil_div(m, 128) * ceil_div(n, 64);
  if (const uint32_t splits = wave_model_splits(sw, m, n, k))
    return with_mode_warps({64, 128, 16, 8, 4, 8, long_k_tiles(m, n) * splits >= 512}, ta, tb);
  // LEAN_LOOP from 512 of the tiles it runs (#61: counted in 128x64 tiles
  // before, so 64x768x50304 NT, 393 tiles, took it: 177 us against 142).
  if (wide >= 256 || (wide >= 64 && (k < kSplitMinK || k >= kLongK)))
    return with_mode_warps({64, 128, 16, 8, 4, 8, long_k_tiles(m, n) >= 512}, ta, tb);
  return {64, 64, 16, 4, 4};
}
// clang-format on

// clang-format off
// Split K across workgroups when the output has too few tiles to keep
// several workgroups on every multiprocessor (measured on the H100: one
// 256-thread workgroup per SM runs latency-bound, ~4 TFLOP/s at 1024^3) and K
// is long enough to share: each split writes a partial product to the device
// workspace, a second pass sums them into C. K longer than kMaxKPerSplit is
// always split, so no workgroup loops over more (bounded loops, dispatch_util.hpp).
uint32_t choose_splits(const GemmSwitches& sw, uint32_t m, uint32_t n, uint64_t k, const TileConfig& t) {
  const uint64_t bounded = ceil_div(k, kMaxKPerSplit);
  if (sw.splits) return uint32_t(std::max<uint64_t>(bounded, std::min<uint64_t>(sw.splits, ceil_div(k, t.bk))));
  const uint64_t tiles = ceil_div(m, t.bm) * ceil_div(n, t.bn);
  if (const uint32_t splits = t.bm == 64 && t.bn == 128 ? wave_model_splits(sw, m, n, k) : 0)
    return uint32_t(std::max<uint64_t>(bounded, splits));
  if (tiles >= 256 || k < kSplitMinK) return uint32_t(bounded);
  // Up to 16 splits; 32 where K is very long (H100, 64x50304x768 NN, 12
  // tiles: 16 splits 230 us, 32 175 us, 48-96 181-197 us, cuBLAS 148-151;
  // the same cap of 32 made 64x4096x4096 and 256x4096x4096 slower).
  const uint64_t most = k >= kVeryLongK ? 32 : 16;
  uint64_t splits = std::min<uint64_t>({ceil_div(512, tiles), k / 128, most});
  // Workgroups just past a whole number of waves leave most of the GPU idle
  // in the last one: one split more fills it, down to 64 K per split (H100,
  // in one submission each: 1024x768x768 NN on 192 tiles 3 -> 4 splits
  // 57.7 -> 53.5 us, 256x768x768 on 48 tiles 6 -> 7 23.8 -> 22.4;
  // docs/gemm_notes.md #60).
  const uint64_t slots = sw.slots, past_wave = tiles * splits % slots;
  if (tiles * splits > slots && past_wave && past_wave <= slots / 4 && splits < std::min(most, k / 64)) ++splits;
  return uint32_t(std::max<uint64_t>({splits, bounded, 1}));
}
// clang-format on

GemmPlan heuristic_plan(const GemmSwitches& sw, uint32_t m, uint32_t n, uint32_t k, bool ta, bool tb) {
  GemmPlan p;
  p.t = choose_tiles(sw, m, n, k, ta, tb);
  p.splits = choose_splits(sw, m, n, k, p.t);
  return p;
}

}  // namespace pwt::gemm_detail
