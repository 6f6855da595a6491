// GEMM and GEMV launchers: variant choice, splitting of operands that exceed
// the storage-binding limit into bindable pieces, and dispatch.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "dispatch_util.hpp"
#include "ops.hpp"
#include "shaders.hpp"
#include "timing.hpp"

namespace pwt {

void check_floats(const Buffer& b, uint64_t count, const char* what) {
  if (b.bytes() < count * 4)
    throw ArgumentError(std::string(what) + " holds " + std::to_string(b.bytes() / 4) + " floats, needs " +
                        std::to_string(count));
}

namespace {

constexpr uint32_t kSplitMinK = 512;  // split-K from this K on (few output tiles)
// From this K on, mid-size outputs take 64x128 tiles and split-K (each split
// still runs many K steps): 512x4096x1024 NT 155 -> 142 us (#38).
constexpr uint32_t kLongK = 2048;
// NT products with at least kNtAsNnRows rows, and N and K of at least
// kNtAsNnMinCols, run as NN on a transposed copy of B (record_gemm). H100,
// 43 NT shapes (docs/gemm_notes.md #49): at 4096-16384 rows 0-5% faster
// (4096x768x50304 7973 -> 7554 us, 8192x4096x4096 6688 -> 6430, 4096^3
// 3357 -> 3292); at 256-1024 rows the copy ate the gain or more (777x4096x4096
// 754 -> 785 us).
constexpr uint64_t kNtAsNnRows = 4096;
constexpr uint32_t kNtAsNnMinCols = 256;
// NT products with fewer rows, at least kNtSwapMinRows of them, at least
// kNtSwapMinCols columns (a vocabulary projection) and kNtSwapMinMacs
// multiply-adds run as C^T = B A^T: NN on a transposed copy of A, storing C
// transposed (record_gemm), where the swapped product's last 128-wide tile
// column wastes no more than the direct product's last 64-high tile row.
// H100, tuned plans, swapped / direct (docs/gemm_notes.md #95): 1024x50304x768
// 1856 / 1935 us, 256x50304x768 479 / 498; but with M = 777 (1683 / 1576) or
// N = 4096 (256x4096x4096 233 / 231, 1024x4096x1024 226 / 223) slower.
constexpr uint32_t kNtSwapMinRows = 256;
constexpr uint64_t kNtSwapMinCols = 8192;
constexpr uint64_t kNtSwapMinMacs = uint64_t(1) << 30;
// From this K on, outputs of few tiles may split K 32 ways instead of 16 (choose_splits).
constexpr uint64_t kVeryLongK = 32768;
// Row sums ride along in the GEMM up to this many multiply-adds, where the
// separate pass (~9 us on the H100) costs more than the in-loop adds.
constexpr uint64_t kRowSumMaxMacs = uint64_t(1) << 30;

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
// Concurrent 64x128 workgroups: 2 per SM x 132 SMs on the H100 (measured: the
// time steps up between 216 and 270 workgroups). WebGPU does not report the
// multiprocessor count; PYWGTRAIN_GEMM_SLOTS sets it for other GPUs.
uint64_t wave_slots() {
  static const uint64_t slots = [] {
    const char* v = std::getenv("PYWGTRAIN_GEMM_SLOTS");
    const long n = v ? std::atol(v) : 0;
    return n > 0 ? uint64_t(n) : uint64_t(264);
  }();
  return slots;
}

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

uint32_t long_k_splits(uint64_t m, uint64_t n, uint64_t k) {
  const uint64_t tiles = long_k_tiles(m, n), slots = wave_slots();
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
uint32_t wave_model_splits(uint64_t m, uint64_t n, uint64_t k) {
  const uint64_t tiles = long_k_tiles(m, n);
  if (k >= kLongK) return tiles >= kLongKMinTiles ? long_k_splits(m, n, k) : 0;
  if (k < kSplitMinK || tiles >= kMidKMaxTiles || tiles < kMidKFewTiles) return 0;
  const uint32_t splits = long_k_splits(m, n, k);
  return tiles >= kMidKMinTiles || 5 * tiles * splits >= 4 * wave_slots() ? splits : 0;
}

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
// PYWGTRAIN_GEMM_TILES="BM,BN,BK,TM,TN[,WARP_W[,LEAN_LOOP]]" forces one configuration.
TileConfig choose_tiles(uint32_t m, uint32_t n, uint32_t k, bool ta, bool tb) {
  const char* forced = std::getenv("PYWGTRAIN_GEMM_TILES");  // read per call: experiments change it in-process
  TileConfig t{};
  if (forced && *forced) {
    int used = 0;
    const int fields = std::sscanf(forced, "%u,%u,%u,%u,%u%n,%u%n,%u%n", &t.bm, &t.bn, &t.bk, &t.tm, &t.tn, &used,
                                   &t.warp_w, &used, &t.lean_loop, &used);
    if (fields < 5 || forced[used] != '\0' || t.lean_loop > 1)
      throw ArgumentError(std::string("PYWGTRAIN_GEMM_TILES: expected BM,BN,BK,TM,TN[,WARP_W[,LEAN_LOOP]] (LEAN_LOOP 0 "
                                      "or 1), got '") +
                          forced + "'");
    const uint32_t wg_x = t.tn ? t.bn / t.tn : 0, wg_y = t.tm ? t.bm / t.tm : 0, threads = wg_x * wg_y;
    auto whole_slots = [&](uint32_t rows) { return threads && rows * t.bk / 4 >= threads && (rows * t.bk / 4) % threads == 0; };
    if (t.tm % 4 || t.tn % 4 || !whole_slots(t.bm) || !whole_slots(t.bn) || t.bm % 16 || t.bn % 16)
      throw ArgumentError("PYWGTRAIN_GEMM_TILES: TM and TN must be multiples of 4, BM and BN of 16, and each thread must "
                          "load a whole number (>= 1) of vec4s of both tiles (BM*BK/4 and BN*BK/4 multiples of "
                          "(BM/TM)*(BN/TN))");
    const bool warps_ok = !t.warp_w || t.warp_w == wg_x ||
                          (32 % t.warp_w == 0 && wg_x % t.warp_w == 0 && wg_y % (32 / t.warp_w) == 0);
    if (!warps_ok)
      throw ArgumentError("PYWGTRAIN_GEMM_TILES: WARP_W " + std::to_string(t.warp_w) + " must divide 32 and BN/TN (" +
                          std::to_string(wg_x) + "), and 32/WARP_W must divide BM/TM (" + std::to_string(wg_y) + ")");
    return t;
  }
  const uint64_t wide = ceil_div(m, 128) * ceil_div(n, 64);
  if (const uint32_t splits = wave_model_splits(m, n, k))
    return with_mode_warps({64, 128, 16, 8, 4, 8, long_k_tiles(m, n) * splits >= 512}, ta, tb);
  // LEAN_LOOP from 512 of the tiles it runs (#61: counted in 128x64 tiles
  // before, so 64x768x50304 NT, 393 tiles, took it: 177 us against 142).
  if (wide >= 256 || (wide >= 64 && (k < kSplitMinK || k >= kLongK)))
    return with_mode_warps({64, 128, 16, 8, 4, 8, long_k_tiles(m, n) >= 512}, ta, tb);
  return {64, 64, 16, 4, 4};
}
// clang-format on

namespace sh = wgsl::gemm;

// What happens to alpha * op(A) op(B) on its way to C (gemm.wgsl epilogue()).
enum class Epilogue : uint32_t {
  Plain = sh::EPILOGUE_PLAIN,
  BiasAct = sh::EPILOGUE_BIAS_ACT,
  BiasActTrain = sh::EPILOGUE_BIAS_ACT_TRAIN,
  ActGrad = sh::EPILOGUE_ACT_GRAD,
  RowSum = sh::EPILOGUE_ROWSUM,
  BiasResidual = sh::EPILOGUE_BIAS_RESIDUAL,
};

bool has_bias(Epilogue ep) {
  return ep == Epilogue::BiasAct || ep == Epilogue::BiasActTrain || ep == Epilogue::BiasResidual;
}
bool has_preact(Epilogue ep) { return ep == Epilogue::BiasActTrain || ep == Epilogue::ActGrad; }
bool has_residual(Epilogue ep) { return ep == Epilogue::BiasResidual; }

// C = alpha * op(A) op(B) + beta * C with C M x N, op(A) M x K, op(B) K x N;
// each matrix stored row-major with its leading dimension (A is K x M when
// ta, B is N x K when tb; C is N x M when tc, element (m, n) at n * ldc + m).
struct GemmProblem {
  const Buffer* a = nullptr;
  const Buffer* b = nullptr;
  const Buffer* c = nullptr;
  uint32_t m = 0, n = 0, k = 0;
  bool ta = false, tb = false, tc = false;
  uint64_t lda = 0, ldb = 0, ldc = 0;
  float alpha = 1.0f, beta = 0.0f;
};

// The shape of a product of packed operands (no buffers yet).
GemmProblem packed_shape(uint32_t m, uint32_t n, uint32_t k, bool ta, bool tb) {
  GemmProblem g;
  g.m = m;
  g.n = n;
  g.k = k;
  g.ta = ta;
  g.tb = tb;
  g.lda = ta ? m : k;
  g.ldb = tb ? k : n;
  g.ldc = n;
  return g;
}

// The problem of the public entry points: packed operands.
GemmProblem packed_problem(const Buffer& a, const Buffer& b, const Buffer& c, uint32_t m, uint32_t n, uint32_t k,
                           bool ta, bool tb, float alpha, float beta) {
  GemmProblem g = packed_shape(m, n, k, ta, tb);
  g.a = &a;
  g.b = &b;
  g.c = &c;
  g.alpha = alpha;
  g.beta = beta;
  return g;
}

// The block [m0, m0 + mc) x [n0, n0 + nc) of C over the K range [k0, k0 + kc).
struct Region {
  uint32_t m0 = 0, mc = 0, n0 = 0, nc = 0;
  uint64_t k0 = 0;
  uint32_t kc = 0;
};

// The whole product as one region.
Region whole_region(const GemmProblem& g) {
  Region reg;
  reg.mc = g.m;
  reg.nc = g.n;
  reg.kc = g.k;
  return reg;
}

// Optional epilogue operands, bound whole.
struct EpilogueArgs {
  Epilogue ep = Epilogue::Plain;
  Activation act = Activation::None;
  const Buffer* bias = nullptr;
  const Buffer* preact = nullptr;
  const Buffer* row_sums = nullptr;  // RowSum
  const Buffer* residual = nullptr;  // BiasResidual: at C's indices, windowed like C
};

// One pipeline of gemm.wgsl's tiled product (the stream-K entry when stream_k).
struct GemmVariant {
  TileConfig t;
  bool ta = false, tb = false, tc = false;
  Epilogue ep = Epilogue::Plain;
  Activation act = Activation::None;
  bool stream_k = false;
};

// What one tiled dispatch binds: windows of A, B and C, and the epilogue's
// operands (an unset range: the epilogue never touches it, a placeholder is
// bound). The vec4 views of A and B follow from the params.
struct GemmRanges {
  Range a, b, c;
  Range bias, preact, row_sums, residual;
};

// Every gemm.wgsl pipeline binds all of the epilogue's operands; a 16-byte
// placeholder stands in for the ones its epilogue never touches.
Range or_placeholder(Device& dev, const Range& r, bool writable) {
  return r.buffer ? r : Range{dev.placeholder(writable), 0, 16};
}

std::string u32_literal(uint32_t v) { return std::to_string(v) + "u"; }
const char* bool_literal(bool v) { return v ? "true" : "false"; }

// gemm.wgsl's A_VEC / B_VEC: whole-vec4 tile loads where the operand's
// contiguous direction is the tile's vec4 direction and its leading dimension
// and offset are multiples of 4 (PYWGTRAIN_GEMM_VEC=0 turns them off for A/B
// runs, docs/gemm_notes.md #42).
// C_VEC likewise for C's stores: its leading dimension, offset and split
// stride multiples of 4 (H100, 16384 x 1536 x 384: plain NN 535 -> 491 us,
// bias + GELU + pre-activation NT 663 -> 616 us). Not for the activation-
// gradient epilogue, whose vec4 pre-activation reads made it slower
// (3.47 -> 3.70 ms over a char step's 6 calls).
// B_PAIR: transposed B loads as 64-bit pairs along k where its leading
// dimension and offset are even, splits start at even k, and each thread holds an even
// number of slots of a 16-deep tile; dispatch_gemm drops it where the dispatch
// runs aligned (H100: NT 256x4096x4096 231.6 -> 227.0 us, docs/gemm_notes.md
// #107, #108; PYWGTRAIN_GEMM_PAIR=0 turns it off, read per call).
struct VecLoads {
  bool a = false, b = false, c = false, b_pair = false;
};
VecLoads vec_loads(const TileConfig& t, bool ta, bool tb, bool act_grad, const GemmParams& p) {
  static const bool enabled = !env_switched_off("PYWGTRAIN_GEMM_VEC");
  const uint32_t threads = (t.bm / t.tm) * (t.bn / t.tn);
  const uint32_t b_slots = t.bn * t.bk / 4 / threads;
  return {enabled && ta && p.lda % 4 == 0 && p.a_off % 4 == 0, enabled && !tb && p.ldb % 4 == 0 && p.b_off % 4 == 0,
          enabled && !act_grad && p.ldc % 4 == 0 && p.c_off % 4 == 0 && p.split_stride % 4 == 0,
          tb && t.bk == 16 && b_slots % 2 == 0 && p.ldb % 2 == 0 && p.b_off % 2 == 0 &&
              (p.k_chunk % 2 == 0 || p.k_chunk >= p.k) && !env_switched_off("PYWGTRAIN_GEMM_PAIR")};
}

// A non-negative integer from the environment variable `name` (read per
// call: experiments change it in-process); `fallback` when unset or empty.
uint64_t env_count(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const unsigned long long n = std::strtoull(v, &end, 10);
  if (*end || *v == '-') throw ArgumentError(std::string(name) + " must be a non-negative integer, got '" + v + "'");
  return n;
}

// gemm.wgsl's GROUP_M: tile rows consecutive workgroups walk down one tile
// column (PYWGTRAIN_GEMM_GROUP_M for A/B runs, read per call; 1 is row-major).
constexpr uint64_t kGroupRows = 8;
uint32_t group_rows() {
  return uint32_t(std::clamp<uint64_t>(env_count("PYWGTRAIN_GEMM_GROUP_M", kGroupRows), 1, 1u << 16));
}

// Entry `entry` of gemm.wgsl with its specialization constants (listed in
// the shader's header).
KernelDesc gemm_desc(const char* entry, const TileConfig& t, bool ta, bool tb, bool tc, Epilogue ep, Activation act,
                     bool lean, const VecLoads& v, bool aligned = false, bool edge_shift = false) {
  KernelDesc d;
  d.shader = "gemm";
  d.entry = entry;
  // clang-format off
  d.constants = {{"BM", u32_literal(t.bm)},
                 {"BN", u32_literal(t.bn)},
                 {"BK", u32_literal(t.bk)},
                 {"TM", u32_literal(t.tm)},
                 {"TN", u32_literal(t.tn)},
                 {"TRANS_A", bool_literal(ta)},
                 {"TRANS_B", bool_literal(tb)},
                 {"TRANS_C", bool_literal(tc)},
                 {"EPILOGUE", u32_literal(uint32_t(ep))},
                 {"ACT", u32_literal(uint32_t(act))},
                 {"WARP_W", u32_literal(t.warp_w ? t.warp_w : t.bn / t.tn)},
                 {"LEAN_LOOP", bool_literal(lean)},
                 {"A_VEC", bool_literal(v.a)},
                 {"B_VEC", bool_literal(v.b)},
                 {"B_PAIR", bool_literal(v.b_pair)},
                 {"C_VEC", bool_literal(v.c)},
                 {"GROUP_M", u32_literal(group_rows())},
                 {"ALIGNED", bool_literal(aligned)},
                 {"EDGE_SHIFT", bool_literal(edge_shift)}};
  // clang-format on
  d.trusted = true;
  return d;
}

// gemm.wgsl's ALIGNED and EDGE_SHIFT for one dispatch of the gemm entry with
// params p (stream-K takes neither). Both need every tile row (column) inside
// op(A), op(B) and C: whole tiles, or a ragged edge that EDGE_SHIFT moves
// inside, which needs at least one whole tile that way. The moved tile ends
// at the last loadable row (column): M (N) rounded up to 4 where A (B) loads
// as vec4s, so its origin is a multiple of 4 there; where C stores vec4s
// along that edge (along n, or along m when tc) the origin must be a
// multiple of 4 too: M (N) a multiple of 4, or rounded. EDGE_SHIFT is set only
// where it moves something (a ragged M or N, or an aligned dispatch's partial
// K step, which it runs first), so whole-tile dispatches keep the kernel
// without it. ALIGNED not with transposed B on 8x4 thread tiles: on the H100
// those ran 2-6% slower aligned (the other modes and tiles 0-12% faster;
// docs/gemm_notes.md #87). PYWGTRAIN_GEMM_ALIGNED=0 turns it off for A/B runs
// (read per call).
struct EdgeChecks {
  bool aligned = false, edge_shift = false;
};
EdgeChecks edge_checks(const GemmVariant& g, const VecLoads& v, const GemmParams& p) {
  const TileConfig& t = g.t;
  const bool whole_rows = p.m % t.bm == 0, whole_cols = p.n % t.bn == 0;
  const bool rows = whole_rows || (p.m >= t.bm && (!(v.c && g.tc) || v.a || p.m % 4 == 0));
  const bool cols = whole_cols || (p.n >= t.bn && (!(v.c && !g.tc) || v.b || p.n % 4 == 0));
  if (g.stream_k || !rows || !cols) return {};
  const bool aligned = !(g.tb && t.tm == 8 && t.tn == 4) && !env_switched_off("PYWGTRAIN_GEMM_ALIGNED");
  const bool k_tail = p.k % t.bk != 0 || p.k_chunk % t.bk != 0;  // some split ends in a partial K step
  return {aligned, !whole_rows || !whole_cols || (aligned && k_tail)};
}

const Kernel& gemm_kernel(Device& dev, const GemmVariant& g, const VecLoads& v, const EdgeChecks& c) {
  // Non-transposed B takes the separate K loop only with 128-bit loads (#44;
  // with scalar loads it cost NN 2%, #37). An aligned dispatch always runs
  // the unchecked loop: LEAN_LOOP off keeps one pipeline per aligned variant.
  const bool lean = g.t.lean_loop && (g.tb || v.b) && !c.aligned;
  KernelDesc d = gemm_desc(g.stream_k ? "gemm_stream_k" : "gemm", g.t, g.ta, g.tb, g.tc, g.ep,
                           g.ep == Epilogue::Plain ? Activation::None : g.act, lean, v, c.aligned, c.edge_shift);
  d.bindings = {sh::a,  sh::b,  sh::c,  sh::p,       sh::bias,     sh::preact, sh::row_sums,
                sh::a4, sh::b4, sh::c4, sh::preact4, sh::residual, sh::b2};
  return dev.pipelines().get(d);
}

// One tiled GEMM dispatch with params p.
void dispatch_gemm(Recorder& r, const GemmVariant& g, const GemmParams& p, const GemmRanges& ranges, uint32_t gx,
                   uint32_t gy, uint32_t gz = 1) {
  Device& dev = r.device();
  VecLoads v = vec_loads(g.t, g.ta, g.tb, g.ep == Epilogue::ActGrad, p);
  const EdgeChecks checks = edge_checks(g, v, p);
  // No B_PAIR in aligned dispatches: on the H100 (driver 580.159.04) those
  // with a partial first K step (128x128 tiles, NT 200x300x96) ran the last K
  // step on the previous step's A tile; the same SPIR-V is exact on lavapipe
  // and with scalar B loads (docs/gemm_notes.md #108). NT's tuned tiles (8x4
  // per thread) never run aligned, so they keep the pairs.
  v.b_pair = v.b_pair && !checks.aligned;
  const Range unused{dev.placeholder(false), 0, 16};
  r.dispatch(gemm_kernel(dev, g, v, checks),
             {{sh::a, ranges.a},
              {sh::b, ranges.b},
              {sh::c, ranges.c},
              {sh::bias, or_placeholder(dev, ranges.bias, false)},
              {sh::preact, or_placeholder(dev, ranges.preact, true)},
              {sh::row_sums, or_placeholder(dev, ranges.row_sums, true)},
              {sh::a4, v.a ? ranges.a : unused},
              {sh::b4, v.b ? ranges.b : unused},
              {sh::b2, v.b_pair ? ranges.b : unused},
              {sh::c4, or_placeholder(dev, v.c ? ranges.c : Range{}, true)},
              {sh::preact4, or_placeholder(dev, v.c ? ranges.preact : Range{}, true)},
              {sh::residual, or_placeholder(dev, ranges.residual, false)}},
             p, gx, gy, gz);
}

// gemv.wgsl's entry points: scalar loads (either layout of B), 128-bit
// column quads (B stored K x N), 128-bit rows of B and x (B stored N x K).
enum class GemvForm { Scalar, Columns4, Rows4 };

// A GEMV pipeline and the bindings its x and B take.
struct GemvKernel {
  const Kernel& kern;
  const Slot& x;
  const Slot& b;
};

GemvKernel gemv_kernel(Device& dev, bool tb, GemvForm form, uint32_t gv_x) {
  namespace gv = wgsl::gemv;
  const Slot& x = form == GemvForm::Rows4 ? gv::x4 : gv::x;
  const Slot& b = form == GemvForm::Scalar ? gv::b : gv::b4;
  KernelDesc d;
  d.shader = "gemv";
  d.entry = form == GemvForm::Scalar ? "gemv" : form == GemvForm::Columns4 ? "gemv_vec4" : "gemv_t_vec4";
  d.bindings = {x, b, gv::y, gv::p};
  d.constants = {{"TRANS_B", bool_literal(tb)}, {"GV_X", u32_literal(gv_x)}};
  d.trusted = true;
  return {dev.pipelines().get(d), x, b};
}

// A window of the block [row0, row0 + rows) x [col0, col0 + cols) of a
// row-major matrix with leading dimension ld, bound at an aligned offset;
// `inner` is where (row0, col0) starts inside it.
struct RowWindow {
  Range range;
  uint32_t inner;
};

RowWindow block_window(const Device& dev, const Buffer& buf, uint64_t base, uint64_t row0, uint64_t rows, uint64_t col0,
                       uint64_t cols, uint64_t ld) {
  const uint64_t align = std::max<uint32_t>(dev.limits().storage_offset_alignment, 4) / 4;
  const uint64_t first = base + row0 * ld + col0;
  const uint64_t start = first / align * align;
  const uint64_t count = first - start + (rows - 1) * ld + cols;
  return {floats(buf, start, count), uint32_t(first - start)};
}

// Whole rows [row0, row0 + rows).
RowWindow row_window(const Device& dev, const Buffer& buf, uint64_t base, uint64_t row0, uint64_t rows, uint64_t ld) {
  return block_window(dev, buf, base, row0, rows, 0, ld, ld);
}

// Largest row count whose window (plus alignment slack) fits one binding.
uint64_t rows_per_binding(const Device& dev, uint64_t ld, const char* operand) {
  const uint64_t cap = dev.limits().max_storage_binding / 4;
  const uint64_t slack = std::max<uint32_t>(dev.limits().storage_offset_alignment, 4) / 4;
  if (ld + slack > cap)
    throw ArgumentError(std::string("one row of ") + operand + " (" + std::to_string(ld) +
                        " floats) exceeds the device's max_storage_buffer_binding_size of " +
                        std::to_string(dev.limits().max_storage_binding) + " bytes");
  return (cap - slack) / ld;
}

// Block size along one dimension: every operand stored with that dimension as
// its row index must fit; 0 constraints means the whole extent.
uint64_t block_along(uint64_t extent, uint64_t limit, uint64_t tile) {
  uint64_t b = std::min(extent, limit);
  if (b < extent && b >= tile) b = b / tile * tile;
  return std::max<uint64_t>(b, 1);
}

// gemm.wgsl's elementwise entries (split-K reduce, repack): most ignore the
// tile constants, so fixed values keep one pipeline each; the stream-K
// fixup takes the product's tiles.
constexpr TileConfig kElementwiseTiles{64, 64, 16, 4, 4, 16};
// tc: the entry writes C transposed (the stream-K fixup of a product with tc).
KernelDesc elementwise_kernel(const char* entry, Epilogue ep, Activation act, const TileConfig& t = kElementwiseTiles,
                              bool tc = false) {
  return gemm_desc(entry, t, false, false, tc, ep, act, false, VecLoads{});
}

// What a split-K reduce binds: the partial products, C, and the
// pre-activation and residual at C's indices (epilogues that have them).
struct SplitRanges {
  Range partials, c, preact, residual;
};

// The window of g's C that region reg writes, `inner` at the region's
// element (m0, n0): its rows (its columns, when tc). The epilogue's
// pre-activation and residual windows are C's rows too (row_window, the
// same offset inside before the region's n0 is added; never with tc).
RowWindow c_window(const Device& dev, const GemmProblem& g, const Region& reg) {
  if (g.tc) return block_window(dev, *g.c, 0, reg.n0, reg.nc, reg.m0, reg.mc, g.ldc);
  RowWindow w = row_window(dev, *g.c, 0, reg.m0, reg.mc, g.ldc);
  w.inner += reg.n0;
  return w;
}

// The ranges a reduce into region reg of g's C binds: `partials`, C's
// window (its offset inside the window into c_inner) and the epilogue's
// pre-activation and residual windows at C's indices.
SplitRanges split_ranges(const Device& dev, const GemmProblem& g, const EpilogueArgs& e, const Range& partials,
                         const Region& reg, uint32_t& c_inner) {
  const RowWindow cw = c_window(dev, g, reg);
  c_inner = cw.inner;
  SplitRanges sr;
  sr.partials = partials;
  sr.c = cw.range;
  if (has_preact(e.ep)) sr.preact = row_window(dev, *e.preact, 0, reg.m0, reg.mc, g.ldc).range;
  if (has_residual(e.ep)) sr.residual = row_window(dev, *e.residual, 0, reg.m0, reg.mc, g.ldc).range;
  return sr;
}

// C[m, n] (at q.c_off, leading dimension q.ldc) = epilogue(q.alpha * the sum
// of q.splits partial products spaced q.split_stride floats apart); the
// plain epilogue adds q.beta * C, the bias is read from q.bias_off on. With
// stream_k_tiles: the sum of each tile's stream-K slots (gemm.wgsl
// stream_k_fixup) for a product on those tiles, into C transposed when tc.
void record_split_reduce(Recorder& r, const GemmParams& q, const SplitRanges& ranges, const EpilogueArgs& e,
                         const TileConfig* stream_k_tiles = nullptr, bool tc = false) {
  Device& dev = r.device();
  // Four columns per thread (splitk_reduce4) where whole vec4s line up.
  const bool quads = !stream_k_tiles && e.ep != Epilogue::ActGrad && q.n % 4 == 0 && q.ldc % 4 == 0 &&
                     q.c_off % 4 == 0 && q.split_stride % 4 == 0;
  KernelDesc d = stream_k_tiles ? elementwise_kernel("stream_k_fixup", e.ep, e.act, *stream_k_tiles, tc)
                 : quads        ? elementwise_kernel("splitk_reduce4", e.ep, e.act)
                                : elementwise_kernel("splitk_reduce", e.ep, e.act);
  const auto c_slot = quads ? sh::c4 : sh::c;
  const auto preact_slot = quads ? sh::preact4 : sh::preact;
  const auto partials_slot = quads ? sh::partials4 : sh::partials;
  d.bindings = {c_slot, sh::p, partials_slot, sh::bias, preact_slot, sh::residual};
  std::vector<Operand> operands{{c_slot, ranges.c}, {partials_slot, ranges.partials}};
  operands.push_back({sh::bias, or_placeholder(dev, has_bias(e.ep) ? whole(*e.bias) : Range{}, false)});
  operands.push_back({preact_slot, or_placeholder(dev, has_preact(e.ep) ? ranges.preact : Range{}, true)});
  operands.push_back({sh::residual, or_placeholder(dev, has_residual(e.ep) ? ranges.residual : Range{}, false)});
  auto [gx, gy] = grid_1d(dev, ceil_div(uint64_t(q.m) * q.n, quads ? 4 * sh::EW_WG : sh::EW_WG));
  r.dispatch(dev.pipelines().get(d), operands, q, gx, gy);
}

// y[y_base..] = alpha * x[x_base..] op(B) + beta * y: one row times a matrix
// (B stored K x N, or N x K when tb).
struct GemvProblem {
  const Buffer* x = nullptr;
  uint64_t x_base = 0;
  const Buffer* b = nullptr;
  const Buffer* y = nullptr;
  uint64_t y_base = 0;
  uint32_t n = 0, k = 0;
  bool tb = false;
  float alpha = 1.0f, beta = 0.0f;
};

void record_gemv(Recorder& r, const GemvProblem& g) {
  Device& dev = r.device();
  const uint32_t n = g.n, k = g.k;
  const bool tb = g.tb;
  // B is stored (tb ? N x K : K x N).
  const uint64_t ld = tb ? k : n;
  // Column form with n a multiple of 4: 128-bit loads of column quads
  // (PYWGTRAIN_GEMV_VEC4=0 turns them off for A/B runs, docs/gemm_notes.md).
  static const bool vec4_enabled = !env_switched_off("PYWGTRAIN_GEMV_VEC4");
  const bool vec4 = vec4_enabled && !tb && n % 4 == 0;
  // vec4 column form: from 4096 columns the column blocks alone fill the GPU,
  // one pass with gv_x quads across (about 256 workgroups); fewer columns take
  // 32 quads across and split K (partials + reduce). H100, docs/gemm_notes.md
  // #41: 1x4096x4096 32.8 -> 29.8 us (gv_x 4), 1x8192x8192 96.4 -> 94.7 (8).
  uint32_t gv_x = 32;
  if (vec4 && n >= 4096) {
    gv_x = 4;
    while (gv_x < 32 && n / (4 * gv_x) >= 384) gv_x *= 2;
  }
  // Row form (tb) with 128-bit loads of B's rows and of x where K and both
  // windows' starts are multiples of 4 (decided per dispatch below;
  // PYWGTRAIN_GEMV_T_VEC4=0 turns them off, #55).
  static const bool rows4_enabled = !env_switched_off("PYWGTRAIN_GEMV_T_VEC4");
  const bool rows4_possible = rows4_enabled && tb && k % 4 == 0;
  namespace gv = wgsl::gemv;
  const uint64_t per_group = tb ? 8 : vec4 ? 4 * gv_x : 32;
  const uint64_t n_limit = uint64_t(dev.limits().max_workgroups_per_dim) * per_group;
  // Pieces of B that each fit one binding: whole rows where a row fits, else
  // pieces of one row (an output's K range (tb), or a k's columns).
  const uint64_t cap = dev.limits().max_storage_binding / 4;
  const uint64_t slack = std::max<uint32_t>(dev.limits().storage_offset_alignment, 4) / 4;
  uint64_t kb, nb;
  if (ld + slack <= cap) {
    const uint64_t rows_cap = (cap - slack) / ld;
    kb = tb ? k : block_along(k, rows_cap, 1);
    nb = tb ? block_along(n, std::min(rows_cap, n_limit), per_group) : block_along(n, n_limit, per_group);
  } else if (tb) {
    nb = 1;
    kb = cap - slack;
  } else {
    kb = 1;
    nb = block_along(n, std::min(cap - slack, n_limit), per_group);
  }
  // Bounded K loops (dispatch_util.hpp): K beyond one pass of split partials
  // accumulates into y with beta = 1.
  kb = std::min(kb, kMaxKPerPass);
  for (uint64_t n0 = 0; n0 < n; n0 += nb) {
    const uint64_t nc = std::min<uint64_t>(nb, n - n0);
    for (uint64_t k0 = 0; k0 < k; k0 += kb) {
      const uint64_t kc = std::min<uint64_t>(kb, k - k0);
      RowWindow bw =
          tb ? block_window(dev, *g.b, 0, n0, nc, k0, kc, ld) : block_window(dev, *g.b, 0, k0, kc, n0, nc, ld);
      RowWindow xw = row_window(dev, *g.x, g.x_base, k0, kc, 1);
      RowWindow yw = row_window(dev, *g.y, g.y_base, n0, nc, 1);
      GemvParams p;
      p.n = uint32_t(nc);
      p.k = uint32_t(kc);
      p.ldb = uint32_t(ld);
      p.x_off = xw.inner;
      p.b_off = bw.inner;
      p.y_off = yw.inner;
      p.alpha = g.alpha;
      p.beta = k0 == 0 ? g.beta : 1.0f;
      p.k_chunk = uint32_t(kc);
      const bool rows4 = rows4_possible && xw.inner % 4 == 0 && bw.inner % 4 == 0;
      const GemvKernel kn = gemv_kernel(dev, tb,
                                        vec4    ? GemvForm::Columns4
                                        : rows4 ? GemvForm::Rows4
                                                : GemvForm::Scalar,
                                        gv_x);
      const uint64_t groups = ceil_div(nc, per_group);
      // Split K over workgroups (partials + reduce): always past kMaxKPerSplit
      // (bounded loops), and in the column-parallel form with few columns so
      // enough loads are in flight to saturate memory.
      uint64_t splits = ceil_div(kc, kMaxKPerSplit);
      if (!tb && nb == n && kb == k && groups < 256 && kc >= 1024)
        splits = std::max<uint64_t>(splits, std::min<uint64_t>({ceil_div(512, groups), kc / 256, 32}));
      if (splits > 1) {
        uint32_t k_chunk = uint32_t(ceil_div(kc, splits));
        if (rows4) k_chunk = (k_chunk + 3) & ~3u;  // whole vec4s per split
        splits = ceil_div(kc, k_chunk);
        const Range ws{dev.workspace(uint64_t(nc) * splits * 4), 0, uint64_t(nc) * splits * 4};
        GemvParams q = p;
        q.y_off = 0;
        q.alpha = 1.0f;
        q.beta = 0.0f;
        q.k_chunk = k_chunk;
        q.split_stride = uint32_t(nc);
        r.dispatch(kn.kern, {{kn.x, xw.range}, {kn.b, bw.range}, {gv::y, ws}}, q, uint32_t(groups), uint32_t(splits));
        GemmParams s;
        s.m = 1;
        s.n = uint32_t(nc);
        s.ldc = uint32_t(nc);
        s.c_off = yw.inner;
        s.alpha = g.alpha;
        s.beta = k0 == 0 ? g.beta : 1.0f;
        s.split_stride = uint32_t(nc);
        s.splits = uint32_t(splits);
        SplitRanges sr;
        sr.partials = ws;
        sr.c = yw.range;
        record_split_reduce(r, s, sr, EpilogueArgs{});
        continue;
      }
      r.dispatch(kn.kern, {{kn.x, xw.range}, {kn.b, bw.range}, {gv::y, yw.range}}, p, uint32_t(groups));
    }
  }
}

// clang-format off
// Split K across workgroups when the output has too few tiles to keep
// several workgroups on every multiprocessor (measured on the H100: one
// 256-thread workgroup per SM runs latency-bound, ~4 TFLOP/s at 1024^3) and K
// is long enough to share: each split writes a partial product to the device
// workspace, a second pass sums them into C. K longer than kMaxKPerSplit is
// always split, so no workgroup loops over more (bounded loops, dispatch_util.hpp).
uint32_t choose_splits(uint32_t m, uint32_t n, uint64_t k, const TileConfig& t) {
  const uint64_t bounded = ceil_div(k, kMaxKPerSplit);
  if (const char* forced = std::getenv("PYWGTRAIN_GEMM_SPLITS"); forced && std::atoi(forced) > 0)
    return uint32_t(std::max<uint64_t>(bounded, std::min<uint64_t>(std::atoi(forced), ceil_div(k, t.bk))));
  const uint64_t tiles = ceil_div(m, t.bm) * ceil_div(n, t.bn);
  if (const uint32_t splits = t.bm == 64 && t.bn == 128 ? wave_model_splits(m, n, k) : 0)
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
  const uint64_t slots = wave_slots(), past_wave = tiles * splits % slots;
  if (tiles * splits > slots && past_wave && past_wave <= slots / 4 && splits < std::min(most, k / 64)) ++splits;
  return uint32_t(std::max<uint64_t>({splits, bounded, 1}));
}
// clang-format on

// A region's windows of A and B and the params every dispatch over it shares:
// its shape, the leading dimensions, the operand offsets inside the windows,
// alpha and beta, all of the region's K in one split. Callers add C's side.
struct RegionBinding {
  RowWindow a, b;
  GemmParams p;
};
RegionBinding bind_region(const Device& dev, const GemmProblem& g, const Region& reg) {
  RegionBinding rb;
  rb.a = g.ta ? row_window(dev, *g.a, 0, reg.k0, reg.kc, g.lda) : row_window(dev, *g.a, 0, reg.m0, reg.mc, g.lda);
  rb.b = g.tb ? row_window(dev, *g.b, 0, reg.n0, reg.nc, g.ldb) : row_window(dev, *g.b, 0, reg.k0, reg.kc, g.ldb);
  GemmParams& p = rb.p;
  p.m = reg.mc;
  p.n = reg.nc;
  p.k = reg.kc;
  p.lda = uint32_t(g.lda);
  p.ldb = uint32_t(g.ldb);
  p.a_off = rb.a.inner + uint32_t(g.ta ? reg.m0 : reg.k0);
  p.b_off = rb.b.inner + uint32_t(g.tb ? reg.k0 : reg.n0);
  p.alpha = g.alpha;
  p.beta = g.beta;
  p.k_chunk = reg.kc;
  p.splits = 1;
  return rb;
}

// The plain-epilogue variant of g on tiles t, and a dispatch's A, B and C ranges.
GemmVariant plain_variant(const TileConfig& t, const GemmProblem& g) {
  GemmVariant v;
  v.t = t;
  v.ta = g.ta;
  v.tb = g.tb;
  v.tc = g.tc;
  return v;
}
GemmRanges abc_ranges(const RegionBinding& rb, const Range& c) {
  GemmRanges ranges;
  ranges.a = rb.a.range;
  ranges.b = rb.b.range;
  ranges.c = c;
  return ranges;
}

// Split-K over region `reg` of g's C: each split writes its partial product
// (compact, nc wide; with tc transposed, mc wide) to the device workspace,
// the reduce pass sums them into C with the epilogue (bias from column n0
// on, the pre-activation at C's indices). With tc the reduce runs over C's
// own layout, the region's transpose, so both of its passes stay row-major.
void record_split_region(Recorder& r, const GemmProblem& g, const Region& reg, const TileConfig& t, uint32_t splits,
                         const EpilogueArgs& e) {
  Device& dev = r.device();
  // The partials bind as one range: at most a binding's worth of them (never
  // below the splits the bounded K loops need, which the callers' K blocks
  // keep within it).
  const uint64_t stride_cap = dev.limits().max_storage_binding / 4 / (uint64_t(reg.mc) * reg.nc);
  splits = uint32_t(std::clamp<uint64_t>(splits, 1, std::max<uint64_t>(stride_cap, ceil_div(reg.kc, kMaxKPerSplit))));
  const uint32_t k_chunk = uint32_t(ceil_div(ceil_div(reg.kc, splits), t.bk) * t.bk);  // whole K tiles per split
  splits = uint32_t(ceil_div(reg.kc, k_chunk));
  const uint64_t stride = uint64_t(reg.mc) * reg.nc;
  const Range ws{dev.workspace(stride * splits * 4), 0, stride * splits * 4};
  // Partials: compact (nc wide), unscaled; alpha, beta and the epilogue come in the reduce.
  RegionBinding rb = bind_region(dev, g, reg);
  GemmParams& p = rb.p;
  p.ldc = g.tc ? reg.mc : reg.nc;
  p.alpha = 1.0f;
  p.beta = 0.0f;
  p.k_chunk = k_chunk;
  p.split_stride = uint32_t(stride);
  p.splits = splits;
  dispatch_gemm(r, plain_variant(t, g), p, abc_ranges(rb, ws), uint32_t(ceil_div(reg.nc, t.bn)),
                uint32_t(ceil_div(reg.mc, t.bm)), splits);
  GemmParams q;
  const SplitRanges sr = split_ranges(dev, g, e, ws, reg, q.c_off);
  q.m = g.tc ? reg.nc : reg.mc;
  q.n = g.tc ? reg.mc : reg.nc;
  q.ldc = uint32_t(g.ldc);
  q.alpha = g.alpha;
  q.beta = g.beta;
  q.bias_off = reg.n0;
  q.split_stride = uint32_t(stride);
  q.splits = splits;
  record_split_reduce(r, q, sr, e);
}

// Stream-K (gemm.wgsl gemm_stream_k): `workers` workgroups, one wave, share
// the tiles' K steps in equal ranges, so a product whose tiles fill a wave
// or two only in part keeps every slot busy to the end. Each tile gets a
// partial slot per workgroup whose range meets it (`slots`: the most any tile
// gets); the fixup pass sums them with the epilogue.
// The tile rows that fill whole waves of workers run before it as plain
// tiles with the epilogue in-kernel (the stream-K paper's hybrid), so only
// the part wave's tiles go through partial slots and the fixup (H100,
// docs/gemm_notes.md #78: 777x4096x4096 NT 765 -> 726 us, 777x768x3072 NN
// 129 -> 119). `first_row`: where stream-K takes over (a multiple of the
// tile height; 0 when the tiles fill less than a wave); `tiles`: those after it.
struct StreamK {
  uint32_t first_row = 0;
  uint64_t tiles = 0, slots = 0;
  uint64_t partial_floats(const TileConfig& t) const { return tiles * slots * t.bm * t.bn; }
};

// The layout of stream-K for an m x n x k product on tiles t, or nothing
// where it does not apply: more workers than its K steps or one dispatch allows,
// the shader's step indices past 32 bits, partials past one binding, or a
// workgroup's range past half of kMaxKPerSplit (bounded loops: the range's
// K steps plus, per tile it meets, the segment loop and the stores; lavapipe
// counts them all, and 777x300x2304 on one worker came back with the last
// third of its tiles missing).
std::optional<StreamK> stream_k_layout(const Device& dev, uint32_t m, uint32_t n, uint32_t k, const TileConfig& t,
                                       uint32_t workers) {
  if (!workers || workers > dev.limits().max_workgroups_per_dim) return std::nullopt;
  const uint64_t tiles_m = ceil_div(m, t.bm), tiles_n = ceil_div(n, t.bn);
  // The plain rows' K loop stays within the bounded loops' kMaxKPerSplit.
  const uint64_t plain_rows =
      k > kMaxKPerSplit ? 0 : std::min(tiles_m * tiles_n / workers * workers / tiles_n, tiles_m - 1);
  const uint64_t tiles = (tiles_m - plain_rows) * tiles_n, steps = ceil_div(k, t.bk), total = tiles * steps;
  if (total < workers || ceil_div(total, workers) * t.bk > kMaxKPerSplit / 2 || total * workers >= (uint64_t(1) << 32))
    return std::nullopt;
  // gemm.wgsl sk_worker_of: the workgroup whose range holds step x.
  auto worker_of = [&](uint64_t x) { return ((x + 1) * workers - 1) / total; };
  StreamK sk;
  sk.first_row = uint32_t(plain_rows * t.bm);
  sk.tiles = tiles;
  for (uint64_t tile = 0; tile < tiles; ++tile)
    sk.slots = std::max(sk.slots, worker_of((tile + 1) * steps - 1) - worker_of(tile * steps) + 1);
  if (sk.partial_floats(t) * 4 > dev.limits().max_storage_binding) return std::nullopt;
  return sk;
}

// Region reg of g in one dispatch of tiles t, unsplit, epilogue e in-kernel.
void record_region(Recorder& r, const GemmProblem& g, const Region& reg, const TileConfig& t, const EpilogueArgs& e) {
  Device& dev = r.device();
  RegionBinding rb = bind_region(dev, g, reg);
  const RowWindow cw = c_window(dev, g, reg);
  GemmParams& p = rb.p;
  p.ldc = uint32_t(g.ldc);
  p.c_off = cw.inner;
  p.bias_off = reg.n0;
  GemmRanges ranges = abc_ranges(rb, cw.range);
  if (has_bias(e.ep)) ranges.bias = whole(*e.bias);
  if (has_preact(e.ep)) ranges.preact = row_window(dev, *e.preact, 0, reg.m0, reg.mc, g.ldc).range;
  if (e.ep == Epilogue::RowSum) ranges.row_sums = whole(*e.row_sums);
  if (has_residual(e.ep)) ranges.residual = row_window(dev, *e.residual, 0, reg.m0, reg.mc, g.ldc).range;
  GemmVariant v = plain_variant(t, g);
  v.ep = e.ep;
  v.act = e.act;
  dispatch_gemm(r, v, p, ranges, uint32_t(ceil_div(reg.nc, t.bn)), uint32_t(ceil_div(reg.mc, t.bm)));
}

// The whole product g (bindable at once) by stream-K with layout sk: the
// rows before sk.first_row as plain tiles, the rest by stream-K, then the
// fixup into C.
void record_stream_k(Recorder& r, const GemmProblem& g, const TileConfig& t, uint32_t workers, const StreamK& sk,
                     const EpilogueArgs& e) {
  Device& dev = r.device();
  Region reg = whole_region(g);
  if (sk.first_row) {
    reg.mc = sk.first_row;
    record_region(r, g, reg, t, e);
    reg.m0 = sk.first_row;
    reg.mc = g.m - sk.first_row;
  }
  const uint64_t bytes = sk.partial_floats(t) * 4;
  const Range ws{dev.workspace(bytes), 0, bytes};
  RegionBinding rb = bind_region(dev, g, reg);
  GemmParams& p = rb.p;
  p.splits = uint32_t(sk.slots);
  p.sk_workers = workers;
  p.ldc = t.bn;  // rows of a partial slot (vec_loads' C_VEC test)
  GemmVariant v = plain_variant(t, g);
  v.stream_k = true;
  v.tc = false;  // its partial slots hold the product's tiles; the fixup transposes
  dispatch_gemm(r, v, p, abc_ranges(rb, ws), workers, 1);
  GemmParams q = p;
  const SplitRanges sr = split_ranges(dev, g, e, ws, reg, q.c_off);
  q.ldc = uint32_t(g.ldc);
  q.bias_off = 0;
  record_split_reduce(r, q, sr, e, &t, g.tc);
}

// Ragged large products (e.g. 4097^3): a last tile row or column holding a
// few rows would cost a whole extra wave of full-K workgroups. The aligned
// part runs as usual; each thin strip runs as its own split-K product on
// small tiles. Plain epilogue, everything bindable at once, C packed (and
// not transposed).
bool record_ragged(Recorder& r, const GemmProblem& g, const TileConfig& t) {
  const uint32_t m = g.m, n = g.n, k = g.k;
  if (g.tc) return false;
  const uint32_t rm = m % t.bm, rn = n % t.bn;
  const bool thin_m = rm && rm <= t.bm / 8 && m / t.bm >= 8, thin_n = rn && rn <= t.bn / 8 && n / t.bn >= 8;
  if (!(thin_m || thin_n) || k < kSplitMinK) return false;
  Device& dev = r.device();
  const uint32_t m_main = m - (thin_m ? rm : 0), n_main = n - (thin_n ? rn : 0);
  Region main_part;
  main_part.mc = m_main;
  main_part.nc = n_main;
  main_part.kc = k;
  RegionBinding rb = bind_region(dev, g, main_part);
  RowWindow cw = row_window(dev, *g.c, 0, 0, m_main, n);
  rb.p.ldc = n;
  rb.p.c_off = cw.inner;
  dispatch_gemm(r, plain_variant(t, g), rb.p, abc_ranges(rb, cw.range), uint32_t(ceil_div(n_main, t.bn)),
                uint32_t(ceil_div(m_main, t.bm)));
  GemmProblem strips = g;
  strips.ldc = n;
  auto strip = [&](uint32_t m0, uint32_t mc, uint32_t n0, uint32_t nc) {
    const TileConfig ts = choose_tiles(mc, nc, k, g.ta, g.tb);
    Region reg;
    reg.m0 = m0;
    reg.mc = mc;
    reg.n0 = n0;
    reg.nc = nc;
    reg.kc = k;
    record_split_region(r, strips, reg, ts, choose_splits(mc, nc, k, ts), EpilogueArgs{});
  };
  if (thin_m) strip(m_main, rm, 0, n);       // bottom rows, corner included
  if (thin_n) strip(0, m_main, n_main, rn);  // right columns above them
  return true;
}

// Copies the rows x cols matrix `src` (leading dimension cols) to `dst` with
// leading dimension ld.
void record_repack(Recorder& r, const Buffer& src, const Buffer& dst, uint32_t rows, uint32_t cols, uint32_t ld) {
  Device& dev = r.device();
  GemmParams q;
  q.m = rows;
  q.n = cols;
  q.lda = cols;
  q.ldc = ld;
  q.alpha = 1.0f;
  KernelDesc d = elementwise_kernel("repack", Epilogue::Plain, Activation::None);
  d.bindings = {sh::c, sh::p, sh::partials};
  auto [gx, gy] = grid_1d(dev, ceil_div(uint64_t(rows) * cols, sh::EW_WG));
  r.dispatch(dev.pipelines().get(d),
             {{sh::c, floats(dst, 0, uint64_t(rows) * ld)}, {sh::partials, floats(src, 0, uint64_t(rows) * cols)}}, q,
             gx, gy);
}

// Writes the transpose of the rows x cols matrix `src` (leading dimension
// src_ld) to `dst` with leading dimension dst_ld.
void record_transpose(Recorder& r, const Buffer& src, uint64_t src_ld, uint32_t rows, uint32_t cols, const Buffer& dst,
                      uint64_t dst_ld) {
  Device& dev = r.device();
  GemmParams q;
  q.m = rows;
  q.n = cols;
  q.lda = uint32_t(src_ld);
  q.ldc = uint32_t(dst_ld);
  KernelDesc d = elementwise_kernel("transpose", Epilogue::Plain, Activation::None);
  d.bindings = {sh::c, sh::p, sh::partials};
  r.dispatch(
      dev.pipelines().get(d),
      {{sh::c, floats(dst, 0, (cols - 1) * dst_ld + rows)}, {sh::partials, floats(src, 0, (rows - 1) * src_ld + cols)}},
      q, uint32_t(ceil_div(cols, sh::TRANSPOSE_TILE)), uint32_t(ceil_div(rows, sh::TRANSPOSE_TILE)));
}

// The rows x cols matrix `src` (leading dimension ld) transposed into the
// device's repack space `slot`, its rows padded to a multiple of 4 floats
// (the product's 128-bit loads), recorded on r; null where the source or the
// copy exceeds one binding or the transpose's grid one dispatch.
std::unique_ptr<Buffer> transposed_copy(Recorder& r, const Buffer& src, uint64_t ld, uint32_t rows, uint32_t cols,
                                        int slot) {
  Device& dev = r.device();
  const uint64_t binding_floats = dev.limits().max_storage_binding / 4;
  const uint64_t rows4 = (uint64_t(rows) + 3) & ~uint64_t(3);
  if (uint64_t(rows) * ld > binding_floats || uint64_t(cols) * rows4 > binding_floats ||
      ceil_div(std::max(rows, cols), sh::TRANSPOSE_TILE) > dev.limits().max_workgroups_per_dim)
    return nullptr;
  const uint64_t bytes = cols * rows4 * 4;
  auto copy = std::make_unique<Buffer>(r.device_ptr(), dev.repack_space(slot, bytes), bytes);
  record_transpose(r, src, ld, rows, cols, *copy, rows4);
  return copy;
}

// NT products of at least this many rows run as NN on a transposed copy of
// B (PYWGTRAIN_GEMM_NT_ROWS, for experiments).
uint64_t nt_as_nn_rows() { return env_count("PYWGTRAIN_GEMM_NT_ROWS", kNtAsNnRows); }
// Whether an NT product with fewer rows runs swapped (C^T = B A^T).
// PYWGTRAIN_GEMM_NT_SWAP_COLS=N (for experiments and tests, read per call):
// every one with at least N columns does.
bool nt_swapped(uint64_t m, uint64_t n, uint64_t k) {
  if (const char* v = std::getenv("PYWGTRAIN_GEMM_NT_SWAP_COLS"); v && *v)
    return n >= env_count("PYWGTRAIN_GEMM_NT_SWAP_COLS", 0);
  const bool same_waste = 2 * ceil_div(m, 128) == ceil_div(m, 64);
  return m >= kNtSwapMinRows && n >= kNtSwapMinCols && m * n * k >= kNtSwapMinMacs && same_waste;
}

// Block sizes along M, N and K of what one set of bindings covers on tiles t.
struct Blocks {
  uint64_t m, n, k;
};
Blocks blocks(const Device& dev, const GemmProblem& g, const TileConfig& t) {
  // Rows of each stored matrix are one of M, N, K; bound each block size by
  // every operand whose rows run along that dimension.
  const uint64_t c_rows = rows_per_binding(dev, g.ldc, "C");
  uint64_t m_cap = uint64_t(dev.limits().max_workgroups_per_dim) * t.bm;
  uint64_t n_cap = uint64_t(dev.limits().max_workgroups_per_dim) * t.bn;
  if (g.tc)
    n_cap = std::min(n_cap, c_rows);
  else
    m_cap = std::min(m_cap, c_rows);
  uint64_t k_cap = UINT64_MAX;
  if (!g.ta)
    m_cap = std::min(m_cap, rows_per_binding(dev, g.lda, "A"));
  else
    k_cap = std::min(k_cap, rows_per_binding(dev, g.lda, "A"));
  if (g.tb)
    n_cap = std::min(n_cap, rows_per_binding(dev, g.ldb, "B"));
  else
    k_cap = std::min(k_cap, rows_per_binding(dev, g.ldb, "B"));
  const uint64_t mb = block_along(g.m, m_cap, t.bm), nb = block_along(g.n, n_cap, t.bn);
  // Bounded K loops (dispatch_util.hpp): a K block takes at most as many
  // kMaxKPerSplit splits as one pass may have and as fit the workspace binding
  // beside an mb x nb output block; longer K runs as several blocks.
  const uint64_t pass_splits = std::clamp<uint64_t>(dev.limits().max_storage_binding / 4 / (mb * nb), 1, kMaxSplits);
  k_cap = std::min(k_cap, kMaxKPerSplit * pass_splits);
  return {mb, nb, block_along(g.k, k_cap, t.bk)};
}

void record_planned(Recorder& r, const GemmProblem& g, EpilogueArgs e, const GemmPlan& plan);

GemmPlan heuristic_plan(uint32_t m, uint32_t n, uint32_t k, bool ta, bool tb) {
  GemmPlan p;
  p.t = choose_tiles(m, n, k, ta, tb);
  p.splits = choose_splits(m, n, k, p.t);
  return p;
}

// clang-format off
// Autotuning (Device::gemm_tuning): the first product of a shape times the
// plans below and keeps the fastest, unless the heuristic plan is within
// kTuneMargin of it (timing noise must not trade a known plan for an equal
// one). Candidates: 64x64 tiles (4x4 per thread), 64x128 tiles (8x4, warps
// on 8x4 thread blocks, 4x8 in TN: with_mode_warps) and 32x128 tiles (the
// same 8x4 on 128 threads: twice the workgroups of 64x128 for outputs of
// under a wave or two; H100 256x768x3072 and 1024x768x768 NN 2 splits 44.8
// us against 51-52 for the others; both 128-column tiles LEAN_LOOP both
// ways) over split counts while each split keeps >= kTuneMinKPerSplit of K
// and the workgroups fit kTuneMaxWaves waves, and stream-K (kStreamKTiles,
// its warps as with_mode_warps sets them). Each runs in batches of calls
// lasting about kTuneBatchUs (the median call by GPU timestamps) on
// operand copies rotated as the bench rotates its own, kTuneRounds rounds
// interleaved, after a warm-up that brings the GPU's clocks up; the median
// round counts. Tiny products (< kTuneMinMacs) keep the heuristic: launch
// cost dominates them. Timing writes a scratch C (never the caller's, which
// recorded work may still read), so products whose C exceeds kTuneMaxScratch
// and those past one binding keep the heuristic too, as does every product on
// an adapter without timestamp queries.
constexpr uint64_t kTuneMinMacs = uint64_t(1) << 22;
constexpr uint64_t kTuneMaxScratch = uint64_t(256) << 20;
constexpr uint64_t kTuneMinKPerSplit = 64;
constexpr uint64_t kTuneMaxWaves = 4;
constexpr double kTuneBatchUs = 1000;
constexpr int kTuneRounds = 3;
constexpr uint32_t kTuneMaxReps = 64;
constexpr uint64_t kTuneRotateBytes = uint64_t(256) << 20;  // as `pywgtrain bench gemm`: > 5x the H100's L2
constexpr uint64_t kTuneMaxSets = 8;
// 2%: at 3% the heuristic kept TN products where stream-K ran 2.5-3.6% faster
// (H100 3072x768x4096 TN 474 against 457 us; docs/gemm_notes.md #105).
constexpr double kTuneMargin = 0.98;
constexpr uint32_t kTuneSplits[] = {1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32};
constexpr TileConfig kTuneTiles[] = {{64, 64, 16, 4, 4}, {64, 128, 16, 8, 4, 8}, {32, 128, 16, 8, 4, 8}};
// Stream-K candidates: 64x128 tiles (LEAN_LOOP both ways), one wave of
// workers, on outputs of fewer than kTuneMaxWaves waves of tiles whose
// workers get >= kTuneMinKPerSplit of K each.
constexpr TileConfig kStreamKTiles = kTuneTiles[1];
// clang-format on

// Whether a plan (read from a cache file) is one the tuner could have chosen:
// anything else is ignored rather than compiled.
bool plan_supported(const GemmPlan& p, bool ta, bool tb) {
  if (p.splits < 1 || p.splits > kMaxSplits || p.t.lean_loop > 1) return false;
  TileConfig base = p.t;
  base.lean_loop = 0;
  if (p.workers) return p.splits == 1 && base == with_mode_warps(kStreamKTiles, ta, tb);
  for (const TileConfig& t : kTuneTiles)
    if (base == with_mode_warps(t, ta, tb) && (p.t.lean_loop == 0 || t.bn == 128)) return true;
  return false;
}

// Whether an experiment forces the plan (a variable set to a non-empty value).
bool forced_by_env() {
  for (const char* name : {"PYWGTRAIN_GEMM_TILES", "PYWGTRAIN_GEMM_SPLITS", "PYWGTRAIN_GEMM_STREAM_K"})
    if (const char* v = std::getenv(name); v && *v) return true;
  return false;
}

bool tunable(const Device& dev, const GemmProblem& g) {
  if (!dev.has_feature(WGPUFeatureName_TimestampQuery)) return false;
  const uint64_t c_bytes = uint64_t(g.m) * g.n * 4;
  if (uint64_t(g.m) * g.n * g.k < kTuneMinMacs || c_bytes > kTuneMaxScratch || c_bytes > dev.limits().max_buffer)
    return false;
  const GemmProblem packed_c = [&] {
    GemmProblem q = g;
    q.ldc = g.tc ? g.m : g.n;
    return q;
  }();
  for (const TileConfig& t : kTuneTiles) {
    const Blocks b = blocks(dev, packed_c, t);
    if (b.m < g.m || b.n < g.n || b.k < g.k) return false;
  }
  return true;
}

std::vector<GemmPlan> tune_candidates(const Device& dev, const GemmProblem& g, const GemmPlan& heuristic) {
  std::vector<GemmPlan> out{heuristic};
  auto add = [&](const TileConfig& t, uint32_t splits, uint32_t workers = 0) {
    GemmPlan p;
    p.t = t;
    p.splits = splits;
    p.workers = workers;
    for (const GemmPlan& q : out)
      if (q.t == p.t && q.splits == p.splits && q.workers == p.workers) return;
    out.push_back(p);
  };
  for (const TileConfig& t : kTuneTiles) {
    const uint64_t tiles = ceil_div(g.m, t.bm) * ceil_div(g.n, t.bn);
    for (uint32_t s : kTuneSplits) {
      s = std::max<uint32_t>(s, uint32_t(ceil_div(g.k, kMaxKPerSplit)));  // bounded K loops
      if (s > 1 && (g.k / s < kTuneMinKPerSplit || tiles * s > kTuneMaxWaves * wave_slots())) continue;
      // 128-wide tiles take LEAN_LOOP both ways: which K loop shape wins
      // depends on the shape (1024x4096x1024 NT in 2 splits: 240.7 us plain,
      // 228.5 lean; docs/gemm_notes.md #79).
      TileConfig v = with_mode_warps(t, g.ta, g.tb);
      add(v, s);
      if (t.bn == 128) {
        v.lean_loop = 1;
        add(v, s);
      }
    }
  }
  const uint64_t slots = wave_slots();
  const uint64_t sk_tiles = ceil_div(g.m, kStreamKTiles.bm) * ceil_div(g.n, kStreamKTiles.bn);
  if (sk_tiles < kTuneMaxWaves * slots &&
      ceil_div(g.k, kStreamKTiles.bk) * sk_tiles * kStreamKTiles.bk >= slots * kTuneMinKPerSplit &&
      stream_k_layout(dev, g.m, g.n, g.k, kStreamKTiles, uint32_t(slots))) {
    const TileConfig plain = with_mode_warps(kStreamKTiles, g.ta, g.tb);
    TileConfig lean = plain;
    lean.lean_loop = 1;
    add(plain, 1, uint32_t(slots));
    add(lean, 1, uint32_t(slots));
  }
  return out;
}

// Times the candidates for g's shape on the device (own submissions, before
// whatever `outer` holds) and returns the plan to keep.
GemmPlan tune_plan(Recorder& outer, const GemmProblem& g, const GemmPlan& heuristic) {
  Device& dev = outer.device();
  const std::vector<GemmPlan> candidates = tune_candidates(dev, g, heuristic);
  Recorder rec(outer.device_ptr());
  // The timed calls rotate through copies of A and B (and scratch outputs:
  // never the caller's C, which recorded work may still read), as `pywgtrain
  // bench gemm` rotates its operand sets: on one set, warm in L2, plans that
  // stream their operands read fast and ran slow in the bench (H100,
  // 1024x768x3072 NN with LEAN_LOOP: 125.6 us warm, 161.3 rotated, against
  // 129.8 / 130.4 without; docs/gemm_notes.md #67). Up to kTuneMaxSets sets
  // within kTuneRotateBytes; where two do not fit, or the GPU has no memory
  // for the copies, the caller's A and B alone (tuning must not fail a
  // product that fits).
  auto extent = [](uint64_t rows, uint64_t cols, uint64_t ld) { return ((rows - 1) * ld + cols) * 4; };
  const uint64_t a_bytes = g.ta ? extent(g.k, g.m, g.lda) : extent(g.m, g.k, g.lda);
  const uint64_t b_bytes = g.tb ? extent(g.n, g.k, g.ldb) : extent(g.k, g.n, g.ldb);
  const uint64_t c_bytes = uint64_t(g.m) * g.n * 4;
  uint64_t sets = std::clamp<uint64_t>(kTuneRotateBytes / (a_bytes + b_bytes + c_bytes), 1, kTuneMaxSets);
  std::vector<std::unique_ptr<Buffer>> owned;
  auto scratch = [&](uint64_t bytes, const char* label) {
    // Whole vec4s: the kernels' 128-bit views of an operand bind past the
    // last row's end up to the next 16 bytes.
    owned.push_back(std::make_unique<Buffer>(outer.device_ptr(), (bytes + 15) & ~uint64_t(15), label));
    return owned.back().get();
  };
  GemmProblem base = g;  // the caller's A and B into a scratch C
  base.c = scratch(c_bytes, "pywgtrain.gemm_tune_output");
  base.ldc = g.tc ? g.m : g.n;
  base.alpha = 1.0f;
  base.beta = 0.0f;
  std::vector<GemmProblem> probes{base};
  if (sets > 1) {
    std::vector<GemmProblem> copies;
    try {
      for (uint64_t i = 0; i < sets; ++i) {
        GemmProblem p = base;
        if (i) p.c = scratch(c_bytes, "pywgtrain.gemm_tune_output");
        p.a = scratch(a_bytes, "pywgtrain.gemm_tune_a");
        p.b = scratch(b_bytes, "pywgtrain.gemm_tune_b");
        rec.copy(*g.a, 0, *p.a, 0, a_bytes);
        rec.copy(*g.b, 0, *p.b, 0, b_bytes);
        copies.push_back(p);
      }
    } catch (const OutOfMemoryError&) {
      // Fewer sets: the copies made so far.
    }
    if (!copies.empty()) probes = std::move(copies);
  }
  sets = probes.size();
  // GPU timestamps around each call, as `pywgtrain bench` times (tunable()
  // requires them: wall clock around a submission measures the host too).
  PassTimer timer(outer.device_ptr(), kTuneMaxReps);
  auto per_call_us = [&](const GemmPlan& p, uint32_t reps) {
    for (uint32_t i = 0; i < reps; ++i) {
      timer.time_next_pass(rec, i);
      record_planned(rec, probes[i % sets], EpilogueArgs{}, p);
    }
    std::vector<double> ns = timer.read(rec, reps);
    std::nth_element(ns.begin(), ns.begin() + reps / 2, ns.end());
    return ns[reps / 2] / 1e3;
  };
  // Untimed, one submission each: every candidate once (compiling each
  // variant), then the heuristic's plan 4 x reps times (clocks up).
  auto run_untimed = [&](const GemmPlan& p, uint32_t calls) {
    for (uint32_t i = 0; i < calls; ++i) record_planned(rec, probes[i % sets], EpilogueArgs{}, p);
  };
  for (const GemmPlan& p : candidates) run_untimed(p, 1);
  dev.wait(rec.submit());
  const double one = std::max(per_call_us(heuristic, 1), 1.0);
  const uint32_t reps = uint32_t(std::clamp(kTuneBatchUs / one, 2.0, double(kTuneMaxReps)));
  run_untimed(heuristic, 4 * reps);
  dev.wait(rec.submit());
  std::vector<std::vector<double>> rounds(candidates.size());
  for (int round = 0; round < kTuneRounds; ++round)
    for (size_t i = 0; i < candidates.size(); ++i) rounds[i].push_back(per_call_us(candidates[i], reps));
  // Each candidate's median round, not its fastest: a plan can run a whole
  // batch far faster than it usually does (H100, 1024x768x3072 NT lean: one
  // batch of 50 calls at 134 us among 23 at 168-170; docs/gemm_notes.md #88),
  // and the fastest of three rounds let such a batch pick it.
  std::vector<double> best(candidates.size());
  for (size_t i = 0; i < candidates.size(); ++i) {
    auto& t = rounds[i];
    std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
    best[i] = t[t.size() / 2];
  }
  size_t win = size_t(std::min_element(best.begin(), best.end()) - best.begin());
  if (best[win] > kTuneMargin * best[0]) win = 0;  // candidates[0] is the heuristic plan
  GemmPlan chosen = candidates[win];
  chosen.us = best[win];
  return chosen;
}

// The plan g runs with: PYWGTRAIN_GEMM_TILES / _SPLITS / _STREAM_K when set, else the
// device's measured plan for its shape (timed now if autotuning is on and the
// shape is new), else the heuristic.
GemmPlan gemm_plan(Recorder& r, const GemmProblem& g) {
  GemmTuning& tuning = r.device().gemm_tuning();
  const GemmShape shape{g.m, g.n, g.k, g.ta, g.tb, g.tc};
  if (forced_by_env()) {
    GemmPlan forced = heuristic_plan(g.m, g.n, g.k, g.ta, g.tb);
    forced.workers = uint32_t(std::min<uint64_t>(env_count("PYWGTRAIN_GEMM_STREAM_K", 0), UINT32_MAX));
    return forced;
  }
  if (auto known = tuning.find(shape); known && plan_supported(*known, g.ta, g.tb)) return *known;
  const GemmPlan heuristic = heuristic_plan(g.m, g.n, g.k, g.ta, g.tb);
  if (!tuning.enabled() || !tunable(r.device(), g)) return heuristic;
  const GemmPlan plan = tune_plan(r, g, heuristic);
  tuning.add(shape, plan);
  return plan;
}

// Ragged M in NN and NT (A's rows contiguous): the whole 64-row tile rows
// and the last few rows can run faster as two products on plans of their own
// than as one whose last tile row is mostly empty (H100: 777x4096x4096 NT
// 753 us, its first 768 rows 663 and last 9 51; 777x1024x4096 NT 191 against
// 179 + 23, docs/gemm_notes.md #96). Where the tuner has timed all three
// shapes (products of at least kRowSplitMinRows rows and kRowSplitMinMacs
// multiply-adds: tuning two more shapes costs too much for smaller ones),
// the split runs when its two plans beat the whole product's by kTuneMargin.
// PYWGTRAIN_GEMM_ROW_SPLIT=1 (=0) always (never) splits, read per call. The
// lower part binds views of A, C and the epilogue's per-element operands
// from its first row, so those offsets must be aligned.
constexpr uint32_t kRowSplitTile = 64;
constexpr uint32_t kRowSplitMinRows = 256;
constexpr uint64_t kRowSplitMinMacs = uint64_t(1) << 30;
bool record_row_split(Recorder& r, const GemmProblem& g, const EpilogueArgs& e) {
  const uint32_t low_rows = g.m % kRowSplitTile, top_rows = g.m - low_rows;
  if (g.ta || e.ep == Epilogue::RowSum || !low_rows || !top_rows || env_switched_off("PYWGTRAIN_GEMM_ROW_SPLIT"))
    return false;
  const uint64_t align = std::max<uint32_t>(r.device().limits().storage_offset_alignment, 4);
  const uint64_t a_at = uint64_t(top_rows) * g.lda * 4, c_at = uint64_t(top_rows) * g.ldc * 4;
  if (a_at % align || c_at % align) return false;
  GemmProblem top = g, low = g;
  top.m = top_rows;
  low.m = low_rows;
  GemmPlan top_plan, low_plan;
  const char* forced = std::getenv("PYWGTRAIN_GEMM_ROW_SPLIT");
  if (forced && *forced) {
    if (std::string(forced) != "1")
      throw ArgumentError(std::string("PYWGTRAIN_GEMM_ROW_SPLIT must be 0 or 1, got '") + forced + "'");
    top_plan = gemm_plan(r, top);
    low_plan = gemm_plan(r, low);
  } else {
    if (g.m < kRowSplitMinRows || uint64_t(g.m) * g.n * g.k < kRowSplitMinMacs) return false;
    const GemmPlan whole = gemm_plan(r, g);
    if (!whole.us) return false;  // not timed: the heuristic's plan, or forced ones
    top_plan = gemm_plan(r, top);
    low_plan = gemm_plan(r, low);
    if (!top_plan.us || !low_plan.us || top_plan.us + low_plan.us >= kTuneMargin * whole.us) return false;
  }
  auto rest = [](const Buffer* b, uint64_t at) { return std::make_unique<Buffer>(*b, at, b->bytes() - at); };
  const auto a_low = rest(g.a, a_at), c_low = rest(g.c, c_at);
  std::unique_ptr<Buffer> preact_low, residual_low;
  EpilogueArgs e_low = e;
  if (e.preact) e_low.preact = (preact_low = rest(e.preact, c_at)).get();
  if (e.residual) e_low.residual = (residual_low = rest(e.residual, c_at)).get();
  low.a = a_low.get();
  low.c = c_low.get();
  record_planned(r, top, e, top_plan);
  record_planned(r, low, e_low, low_plan);
  return true;
}

void record_gemm(Recorder& r, const GemmProblem& g, EpilogueArgs e) {
  Device& dev = r.device();
  const uint32_t m = g.m, n = g.n, k = g.k;
  const bool ta = g.ta, tb = g.tb;
  const uint64_t lda = g.lda, ldb = g.ldb;
  const Buffer &a = *g.a, &b = *g.b, &c = *g.c;
  const uint64_t cap_floats = dev.limits().max_storage_binding / 4;
  const uint64_t slack = std::max<uint32_t>(dev.limits().storage_offset_alignment, 4) / 4;
  if (e.ep == Epilogue::Plain && !ta && lda + slack > cap_floats && ldb == (tb ? k : n)) {
    // One row of A (K floats) exceeds a binding: each row of C is a GEMV of
    // that row of A with op(B), which binds both in pieces along K.
    for (uint64_t m0 = 0; m0 < m; ++m0) {
      GemvProblem row;
      row.x = &a;
      row.x_base = m0 * lda;
      row.b = &b;
      row.y = &c;
      row.y_base = m0 * g.ldc;
      row.n = n;
      row.k = k;
      row.tb = tb;
      row.alpha = g.alpha;
      row.beta = g.beta;
      record_gemv(r, row);
    }
    return;
  }
  // NT (x @ W.T, a linear layer's forward) loads both operands k-major, as
  // scalars; NN loads B n-major as vec4s. Products with many rows repay
  // transposing B into the device workspace first: the copy reads and writes
  // B once, the product reads it M / BM times.
  if (!ta && tb && m >= nt_as_nn_rows() && n >= kNtAsNnMinCols && k >= kNtAsNnMinCols)
    if (const auto bt = transposed_copy(r, b, ldb, n, k, 1)) {
      GemmProblem nn = g;
      nn.b = bt.get();
      nn.tb = false;
      nn.ldb = (uint64_t(n) + 3) & ~uint64_t(3);
      return record_gemm(r, nn, e);
    }
  // Fewer rows and many columns: C^T = B A^T instead, NN on a transposed
  // copy of A, the small operand (4 MB at 256 x 4096, where B is 64 MB), with
  // C stored transposed (gemm.wgsl TRANS_C).
  if (!ta && tb && e.ep == Epilogue::Plain && nt_swapped(m, n, k))
    if (const auto at = transposed_copy(r, a, lda, m, k, 0)) {
      GemmProblem swapped = g;
      swapped.a = &b;
      swapped.lda = ldb;
      swapped.b = at.get();
      swapped.ldb = (uint64_t(m) + 3) & ~uint64_t(3);
      swapped.tb = false;
      swapped.tc = true;
      swapped.m = n;
      swapped.n = m;
      return record_planned(r, swapped, e, gemm_plan(r, swapped));
    }
  if (record_row_split(r, g, e)) return;
  record_planned(r, g, e, gemm_plan(r, g));
}

void record_planned(Recorder& r, const GemmProblem& g, EpilogueArgs e, const GemmPlan& plan) {
  Device& dev = r.device();
  // A transposed C is written only by the swapped NT path, with the plain
  // epilogue: the bias and row-sum offsets below index C's columns.
  if (g.tc && e.ep != Epilogue::Plain) throw std::logic_error("gemm: a transposed C takes the plain epilogue only");
  const uint32_t m = g.m, n = g.n, k = g.k;
  const bool ta = g.ta, tb = g.tb;
  const uint64_t lda = g.lda, ldb = g.ldb, ldc = g.ldc;
  const Buffer &a = *g.a, &b = *g.b, &c = *g.c;
  const TileConfig t = plan.t;
  const Blocks blk = blocks(dev, g, t);
  const uint64_t mb = blk.m, nb = blk.n, kb = blk.k;
  const bool whole_problem = kb == k && mb == m && nb == n;
  // Bounded K loops: never fewer splits than keep each within kMaxKPerSplit.
  const uint32_t whole_splits = uint32_t(std::max<uint64_t>(plan.splits, ceil_div(k, kMaxKPerSplit)));
  // Stream-K where the plan asks for it and it applies; else the plan's tiles and splits.
  const std::optional<StreamK> sk =
      plan.workers && whole_problem ? stream_k_layout(dev, m, n, k, t, plan.workers) : std::nullopt;
  if (e.ep == Epilogue::RowSum && (!whole_problem || whole_splits > 1 || sk || uint64_t(m) * n * k > kRowSumMaxMacs)) {
    // The in-kernel row sums need the whole K in one workgroup and one grid,
    // and they slow the main loop by ~8% (H100, 4096x512x4096): large
    // products take a plain GEMM and a separate column-sum pass (A is K x M).
    record_gemm(r, g, EpilogueArgs{});
    return bias_grad(r, a, *e.row_sums, k, m, g.beta);
  }
  // Large products whose m-major A or n-major B has a leading dimension that
  // is not a multiple of 4 (4095^3, 4097^3) cannot load it as vec4s: they
  // run on a padded copy when it fits one binding (the copy costs ~1.6% at
  // 4096^3, the 128-bit loads save ~10%, docs/gemm_notes.md #45). After the
  // row-sum fallback above, whose column-sum pass reads A packed.
  const uint64_t binding = dev.limits().max_storage_binding;
  auto padded_fits = [&](uint64_t ld) { return uint64_t(k) * ((ld + 3) & ~uint64_t(3)) * 4 <= binding; };
  const bool pad_a = t.lean_loop && ta && lda % 4 && n >= 1024 && padded_fits(lda);
  const bool pad_b = t.lean_loop && !tb && ldb % 4 && m >= 1024 && padded_fits(ldb);
  if (pad_a || pad_b) {
    const uint64_t lda4 = pad_a ? (lda + 3) & ~uint64_t(3) : lda, ldb4 = pad_b ? (ldb + 3) & ~uint64_t(3) : ldb;
    std::unique_ptr<Buffer> a_padded, b_padded;
    GemmProblem padded = g;
    if (pad_a) {
      a_padded = std::make_unique<Buffer>(r.device_ptr(), dev.repack_space(0, k * lda4 * 4), k * lda4 * 4);
      record_repack(r, a, *a_padded, k, uint32_t(lda), uint32_t(lda4));
      padded.a = a_padded.get();
      padded.lda = lda4;
    }
    if (pad_b) {
      b_padded = std::make_unique<Buffer>(r.device_ptr(), dev.repack_space(1, k * ldb4 * 4), k * ldb4 * 4);
      record_repack(r, b, *b_padded, k, uint32_t(ldb), uint32_t(ldb4));
      padded.b = b_padded.get();
      padded.ldb = ldb4;
    }
    return record_planned(r, padded, e, plan);
  }
  if (whole_problem) {
    if (sk) return record_stream_k(r, g, t, plan.workers, *sk, e);
    if (whole_splits > 1) {
      return record_split_region(r, g, whole_region(g), t, whole_splits, e);
    }
    if (e.ep == Epilogue::Plain && ldc == n && record_ragged(r, g, t)) return;
  }
  // Operands past the binding limit along K, or K past one pass of splits:
  // the blocks accumulate into C (beta = 1 after the first), so a fused
  // epilogue runs afterwards as its own elementwise pass over the complete
  // sum. A block with K past kMaxKPerSplit (or few tiles) runs split-K.
  // The bias + residual epilogue only adds, so the first K block applies it
  // and the others accumulate onto its result.
  const bool k_blocks = kb < k;
  const bool first_block_epilogue = e.ep == Epilogue::BiasResidual;
  std::unique_ptr<Buffer> scratch;  // released after recording: wgpu keeps it alive for the encoder
  const Buffer* target = &c;
  if (k_blocks && e.ep != Epilogue::Plain && !first_block_epilogue) {
    if (e.ep == Epilogue::BiasAct) {  // needs a pre-activation buffer of its own
      scratch = std::make_unique<Buffer>(r.device_ptr(), uint64_t(m) * n * 4, "pywgtrain.preact_scratch");
      e.preact = scratch.get();
      e.ep = Epilogue::BiasActTrain;
    } else if (e.ep == Epilogue::ActGrad) {
      scratch = std::make_unique<Buffer>(r.device_ptr(), uint64_t(m) * n * 4, "pywgtrain.product_scratch");
    }
    target = e.ep == Epilogue::BiasActTrain ? e.preact : scratch.get();
  }
  for (uint64_t m0 = 0; m0 < m; m0 += mb) {
    const uint64_t mc = std::min(mb, m - m0);
    for (uint64_t n0 = 0; n0 < n; n0 += nb) {
      const uint64_t nc = std::min(nb, n - n0);
      for (uint64_t k0 = 0; k0 < k; k0 += kb) {
        const uint64_t kc = std::min(kb, k - k0);
        const float beta = k0 == 0 ? g.beta : 1.0f;
        const Epilogue in_kernel = !k_blocks || (first_block_epilogue && k0 == 0) ? e.ep : Epilogue::Plain;
        const uint32_t splits = whole_problem ? whole_splits : choose_splits(uint32_t(mc), uint32_t(nc), kc, t);
        GemmProblem block = g;
        block.c = target;
        block.beta = beta;
        Region reg;
        reg.m0 = uint32_t(m0);
        reg.mc = uint32_t(mc);
        reg.n0 = uint32_t(n0);
        reg.nc = uint32_t(nc);
        reg.k0 = k0;
        reg.kc = uint32_t(kc);
        EpilogueArgs be = e;
        be.ep = in_kernel;
        if (splits > 1)
          record_split_region(r, block, reg, t, splits, be);
        else
          record_region(r, block, reg, t, be);
      }
    }
  }
  if (!k_blocks || e.ep == Epilogue::Plain || first_block_epilogue) return;
  if (e.ep == Epilogue::ActGrad) return activation_backward(r, *scratch, *e.preact, c, uint64_t(m) * n, e.act);
  // preact holds op(A) op(B); add the bias in place and write act() to C.
  namespace ln = wgsl::linear;
  KernelDesc d;
  d.shader = "linear";
  d.entry = "bias_act";
  d.bindings = {ln::result, ln::ep, ln::bias, ln::zio};
  d.constants = {{"ACT", u32_literal(uint32_t(e.act))}};
  const Kernel& bk = dev.pipelines().get(d);
  const uint64_t rows_per = rows_per_piece(dev, n);
  for (uint64_t m0 = 0; m0 < m; m0 += rows_per) {
    const uint64_t mc = std::min(rows_per, m - m0);
    EwParams p;
    p.n = uint32_t(mc * n);
    p.cols = n;
    auto [gx, gy] = grid_1d(dev, ceil_div(mc * n, ln::WG));
    r.dispatch(bk,
               {{ln::result, floats(c, m0 * n, mc * n)},
                {ln::bias, whole(*e.bias)},
                {ln::zio, floats(*e.preact, m0 * n, mc * n)}},
               p, gx, gy);
  }
}

void check_gemm(const Buffer& a, const Buffer& b, const Buffer& c, uint32_t m, uint32_t n, uint32_t k) {
  if (m == 0 || n == 0 || k == 0)
    throw ArgumentError("gemm: M, N and K must be >= 1 (got " + std::to_string(m) + ", " + std::to_string(n) + ", " +
                        std::to_string(k) + ")");
  check_floats(a, uint64_t(m) * k, "gemm operand A");
  check_floats(b, uint64_t(k) * n, "gemm operand B");
  check_floats(c, uint64_t(m) * n, "gemm output C");
}

}  // namespace

std::vector<GemmPlan> gemm_tune_candidates(const Device& dev, uint32_t m, uint32_t n, uint32_t k, bool ta, bool tb) {
  return tune_candidates(dev, packed_shape(m, n, k, ta, tb), heuristic_plan(m, n, k, ta, tb));
}

void configure_gemm_tuning(Device& dev, bool enabled, const std::string& cache_dir) {
  // The signature: format, adapter, every embedded shader, the tuner's
  // candidate tiles and the heuristic plans of a grid of shapes (a changed
  // heuristic or candidate set re-tunes what it competes with).
  std::string sig = "pywgtrain gemm plans v3 | ";  // v3: a tc column
  // Bumped when the candidate set or the way a plan runs changes outside the
  // shaders, tiles and heuristic below (cached plans competed under the old
  // rules). 2: stream-K after whole waves of plain tiles; 3: LEAN_LOOP both
  // ways at every split count; 4: the median round decides, not the fastest;
  // 5: ragged M, N and K run aligned with edge shifts; 6: NT products run
  // swapped (C^T = B A^T), edges shifted to vec4-rounded ends; 7: TN products
  // on 64x128 tiles run warps on 4x8 thread blocks (with_mode_warps); 8: TN
  // stream-K on both warp blocks; 9: a 2% margin (kTuneMargin); 10: TN
  // stream-K on 4x8 only again (8x4 won only within 0.5%, #103).
  constexpr int kPlanRules = 10;
  const AdapterSummary& a = dev.info();
  sig += a.name + " | " + a.vendor + " | " + a.driver + " | " + a.backend + " | " + std::to_string(a.vendor_id) + ":" +
         std::to_string(a.device_id) + " | slots " + std::to_string(wave_slots());
  std::string material;
  for (const auto& [name, text] : embedded_shaders()) material += name + "\n" + text + "\n";
  for (const TileConfig& t : kTuneTiles)
    for (uint32_t v : {t.bm, t.bn, t.bk, t.tm, t.tn, t.warp_w}) material += std::to_string(v) + ",";
  material += "| rules " + std::to_string(kPlanRules) + " |";
  for (uint32_t m : {16u, 64u, 256u, 1024u, 4096u})
    for (uint32_t n : {64u, 768u, 3072u, 50304u})
      for (uint32_t k : {64u, 768u, 3072u, 16384u})
        for (bool ta : {false, true})
          for (bool tb : {false, true}) {
            const GemmPlan p = heuristic_plan(m, n, k, ta, tb);
            for (uint32_t v : {p.t.bm, p.t.bn, p.t.bk, p.t.tm, p.t.tn, p.t.warp_w, p.t.lean_loop, p.splits})
              material += std::to_string(v) + ",";
          }
  char hex[24];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(fnv1a(material)));
  dev.gemm_tuning().configure(enabled, cache_dir, sig + " | " + hex);
}

void gemm(Recorder& r, const Buffer& a, const Buffer& b, const Buffer& c, uint32_t m, uint32_t n, uint32_t k, bool ta,
          bool tb, float alpha, float beta) {
  check_gemm(a, b, c, m, n, k);
  if (m == 1 || n == 1) {
    GemvProblem g;
    g.y = &c;
    g.alpha = alpha;
    g.beta = beta;
    g.k = k;
    if (m == 1) {
      // op(A) is one row whichever way A is stored.
      g.x = &a;
      g.b = &b;
      g.n = n;
      g.tb = tb;
    } else {
      // C^T = op(B)^T op(A)^T: the single column of op(B) is the vector and
      // op(A)^T is the matrix, stored N x K style exactly when A is not transposed.
      g.x = &b;
      g.b = &a;
      g.n = m;
      g.tb = !ta;
    }
    record_gemv(r, g);
  } else {
    record_gemm(r, packed_problem(a, b, c, m, n, k, ta, tb, alpha, beta), EpilogueArgs{});
  }
}

void gemm_bias_act(Recorder& r, const Buffer& a, const Buffer& b, const Buffer& bias, const Buffer& y,
                   const Buffer* preact, uint32_t m, uint32_t n, uint32_t k, bool ta, bool tb, Activation act) {
  check_gemm(a, b, y, m, n, k);
  check_floats(bias, n, "bias");
  if (preact) check_floats(*preact, uint64_t(m) * n, "pre-activation output");
  EpilogueArgs e;
  e.ep = preact ? Epilogue::BiasActTrain : Epilogue::BiasAct;
  e.act = act;
  e.bias = &bias;
  e.preact = preact;
  record_gemm(r, packed_problem(a, b, y, m, n, k, ta, tb, 1.0f, 0.0f), e);
}

void gemm_bias_residual(Recorder& r, const Buffer& a, const Buffer& b, const Buffer& bias, const Buffer& residual,
                        const Buffer& y, uint32_t m, uint32_t n, uint32_t k, bool ta, bool tb) {
  check_gemm(a, b, y, m, n, k);
  check_floats(bias, n, "bias");
  check_floats(residual, uint64_t(m) * n, "residual");
  check_no_alias("gemm_bias_residual", y, "the output y", {{&residual, "residual"}});
  EpilogueArgs e;
  e.ep = Epilogue::BiasResidual;
  e.bias = &bias;
  e.residual = &residual;
  record_gemm(r, packed_problem(a, b, y, m, n, k, ta, tb, 1.0f, 0.0f), e);
}

void linear_weight_grads(Recorder& r, const Buffer& dz, const Buffer& x, const Buffer& dw, const Buffer& db,
                         uint32_t rows, uint32_t out_features, uint32_t in_features, float beta) {
  check_gemm(dz, x, dw, out_features, in_features, rows);
  check_floats(db, out_features, "bias gradient");
  EpilogueArgs e;
  e.ep = Epilogue::RowSum;
  e.row_sums = &db;
  record_gemm(r, packed_problem(dz, x, dw, out_features, in_features, rows, true, false, 1.0f, beta), e);
}

void gemm_act_grad(Recorder& r, const Buffer& a, const Buffer& b, const Buffer& preact, const Buffer& c, uint32_t m,
                   uint32_t n, uint32_t k, bool ta, bool tb, Activation act) {
  check_gemm(a, b, c, m, n, k);
  check_floats(preact, uint64_t(m) * n, "pre-activation");
  EpilogueArgs e;
  e.ep = Epilogue::ActGrad;
  e.act = act;
  e.preact = &preact;
  record_gemm(r, packed_problem(a, b, c, m, n, k, ta, tb, 1.0f, 0.0f), e);
}

}  // namespace pwt
