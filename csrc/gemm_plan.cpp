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
// still runs many K steps; docs/gemm_notes.md #38).
constexpr uint32_t kLongK = 2048;
// From this K on, outputs of few tiles may split K 32 ways instead of 16
// (choose_splits; docs/gemm_notes.md #50).
constexpr uint64_t kVeryLongK = 32768;

// clang-format off
// Long K (a linear layer's dW = dY^T X: K = batch rows, 8192-16384 in GPT
// training) on outputs of a few hundred 64x128 tiles or fewer: the output
// alone fills one or two waves of workgroups, so wave quantization decides
// the time (a last wave nearly empty). Split K so that tiles * splits fills
// whole waves, by a cost model in units of one K step of one wave: waves *
// (K per split + kWaveFixedK) for the main pass, plus the partials' traffic
// and the reduce pass. Its constants were fitted on the H100
// (docs/gemm_notes.md #46).
constexpr uint64_t kLongKMinTiles = 16;
constexpr uint64_t kWaveFixedK = 128;     // a wave's prologue and tile store, in K steps
constexpr double kPartialCostK = 1e-5;    // per partial element written and summed
constexpr uint64_t kReduceCostK = 55;     // the reduce dispatch
constexpr uint64_t kMaxModelSplits = 32;
constexpr uint64_t kMinKPerSplit = 256;

uint64_t long_k_tiles(uint64_t m, uint64_t n) { return ceil_div(m, 64) * ceil_div(n, 128); }

// Mid K (kSplitMinK <= K < kLongK) on outputs of kMidKMinTiles to
// kMidKMaxTiles 64x128 tiles (0.7-1.5 waves): the same tiles and wave model
// (docs/gemm_notes.md #53); from kMidKMaxTiles tiles on its splits lost. From
// kMidKFewTiles to kMidKMinTiles tiles the model's splits take them too
// where they fill at least 4/5 of a wave; below that, 64x64 tiles split
// more ways were as fast (#61).
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
// Measured on the same plans both ways (docs/gemm_notes.md #103).
TileConfig with_mode_warps(TileConfig t, bool ta, bool tb) {
  if (t.bm == 64 && t.bn == 128 && t.tm == 8 && t.tn == 4 && t.warp_w == 8 && ta && !tb) t.warp_w = 4;
  return t;
}

// 64x128 tiles (8x4 per thread, warps on 8x4 thread blocks; TN: 4x8) when the output
// gives >= 256 tiles of 128x64, or >= 64 with K too short to split or long;
// else 64x64 (4x4), which split-K (below) multiplies: the configurations
// that won on the H100 (docs/gemm_notes.md #16, #25-#33). lean_loop only
// changes what the compiler makes of the K loop; it pays on large outputs
// and lost on outputs of 256 tiles, so outputs of >= 512 tiles take it
// (#37, #44).
// PYWGTRAIN_GEMM_TILES (GemmSwitches::tiles) forces one configuration.
TileConfig choose_tiles(const GemmSwitches& sw, uint32_t m, uint32_t n, uint32_t k, bool ta, bool tb) {
  if (sw.tiles) return *sw.tiles;
  const uint64_t wide = ceil_div(m, 128) * ceil_div(n, 64);
  if (const uint32_t splits = wave_model_splits(sw, m, n, k))
    return with_mode_warps({64, 128, 16, 8, 4, 8, long_k_tiles(m, n) * splits >= 512}, ta, tb);
  // LEAN_LOOP from 512 of the tiles it runs, not of 128x64 tiles (#61).
  if (wide >= 256 || (wide >= 64 && (k < kSplitMinK || k >= kLongK)))
    return with_mode_warps({64, 128, 16, 8, 4, 8, long_k_tiles(m, n) >= 512}, ta, tb);
  return {64, 64, 16, 4, 4};
}
// clang-format on

// clang-format off
// Split K across workgroups when the output has too few tiles to keep
// several workgroups on every multiprocessor (one workgroup per
// multiprocessor runs latency-bound; docs/gemm_notes.md #6, #16) and K
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
  // Up to 16 splits; 32 where K is very long (a cap of 32 made shorter K
  // slower; docs/gemm_notes.md #50).
  const uint64_t most = k >= kVeryLongK ? 32 : 16;
  uint64_t splits = std::min<uint64_t>({ceil_div(512, tiles), k / 128, most});
  // Workgroups just past a whole number of waves leave most of the GPU idle
  // in the last one: one split more fills it, down to 64 K per split
  // (docs/gemm_notes.md #60).
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
