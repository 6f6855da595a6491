// GEMM and GEMV launchers: variant choice, splitting of operands that exceed
// the storage-binding limit into bindable pieces, and dispatch.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "dispatch_util.hpp"
#include "ops.hpp"

namespace pwt {

void check_floats(const Buffer& b, uint64_t count, const char* what) {
  if (b.bytes() < count * 4)
    throw ArgumentError(std::string(what) + " holds " + std::to_string(b.bytes() / 4) + " floats, needs " + std::to_string(count));
}

namespace {

struct GemmParams {
  uint32_t m, n, k, lda, ldb, ldc, a_off, b_off, c_off;
  float alpha, beta;
  uint32_t bias_off;
  uint32_t k_chunk, split_stride, splits, pad;
};

struct GemvParams {
  uint32_t n, k, ldb, x_off, b_off, y_off;
  float alpha, beta;
  uint32_t k_chunk, split_stride;
};

// warp_w: width in threads of the thread block one warp covers (0: BN / TN,
// whole rows of the workgroup's thread grid).
// lean_loop: gemm.wgsl's LEAN_LOOP (inside workgroups run their unchecked K
// steps as a loop of their own).
struct TileConfig { uint32_t bm, bn, bk, tm, tn, warp_w = 0, lean_loop = 0; };

constexpr uint32_t kSplitMinK = 512;  // split-K from this K on (few output tiles)
// From this K on, mid-size outputs take 64x128 tiles and split-K (each split
// still runs many K steps): 512x4096x1024 NT 155 -> 142 us (#38).
constexpr uint32_t kLongK = 2048;
// Row sums ride along in the GEMM up to this many multiply-adds, where the
// separate pass (~9 us on the H100) costs more than the in-loop adds.
constexpr uint64_t kRowSumMaxMacs = uint64_t(1) << 30;

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
// time steps up between 264 and 270 workgroups). WebGPU does not report the
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

// 64x128 tiles (8x4 per thread, warps on 8x4 thread blocks) when the output
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
TileConfig choose_tiles(uint32_t m, uint32_t n, uint32_t k) {
  const char* forced = std::getenv("PYWGTRAIN_GEMM_TILES");  // read per call: experiments change it in-process
  TileConfig t{};
  if (forced && std::sscanf(forced, "%u,%u,%u,%u,%u,%u,%u", &t.bm, &t.bn, &t.bk, &t.tm, &t.tn, &t.warp_w, &t.lean_loop) >= 5) {
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
  if (k >= kLongK && long_k_tiles(m, n) >= kLongKMinTiles)
    return {64, 128, 16, 8, 4, 8, long_k_tiles(m, n) * long_k_splits(m, n, k) >= 512};
  if (wide >= 256 || (wide >= 64 && (k < kSplitMinK || k >= kLongK))) return {64, 128, 16, 8, 4, 8, wide >= 512};
  return {64, 64, 16, 4, 4};
}

// What happens to alpha * op(A) op(B) on its way to C (gemm.wgsl entry points).
enum class Epilogue { Plain, BiasAct, BiasActTrain, ActGrad, RowSum };

bool has_bias(Epilogue ep) { return ep == Epilogue::BiasAct || ep == Epilogue::BiasActTrain; }
bool has_preact(Epilogue ep) { return ep == Epilogue::BiasActTrain || ep == Epilogue::ActGrad; }

// Bindings 4 (bias) and 5 (pre-activation) after the ones every variant has.
void add_epilogue_bindings(KernelDesc& d, Epilogue ep) {
  if (has_bias(ep)) d.bindings.push_back({4, Bind::ReadOnly});
  if (has_preact(ep)) d.bindings.push_back({5, Bind::ReadWrite});
  if (ep == Epilogue::RowSum) d.bindings.push_back({7, Bind::ReadWrite});
}

// gemm.wgsl's A_VEC / B_VEC: whole-vec4 tile loads where the operand's
// contiguous direction is the tile's vec4 direction and its leading dimension
// and offset are multiples of 4 (PYWGTRAIN_GEMM_VEC=0 turns them off for A/B
// runs, docs/gemm_notes.md #42).
struct VecLoads { bool a, b; };
VecLoads vec_loads(bool ta, bool tb, const GemmParams& p) {
  static const bool enabled = [] {
    const char* v = std::getenv("PYWGTRAIN_GEMM_VEC");
    return !(v && std::string(v) == "0");
  }();
  return {enabled && ta && p.lda % 4 == 0 && p.a_off % 4 == 0, enabled && !tb && p.ldb % 4 == 0 && p.b_off % 4 == 0};
}

const Kernel& gemm_kernel(Device& dev, const TileConfig& t, bool ta, bool tb, Epilogue ep, Activation act,
                          const VecLoads& v) {
  static const char* entries[] = {"gemm", "gemm_bias_act", "gemm_bias_act_train", "gemm_act_grad", "gemm_rowsum"};
  // Non-transposed B takes the separate K loop only with 128-bit loads (#44;
  // with scalar loads it cost NN 2%, #37).
  const bool lean = t.lean_loop && (tb || v.b);
  KernelDesc d;
  d.shader = "gemm";
  d.entry = entries[int(ep)];
  d.bindings = {{0, Bind::ReadOnly}, {1, Bind::ReadOnly}, {2, Bind::ReadWrite}, {3, Bind::Uniform}};
  add_epilogue_bindings(d, ep);
  d.bindings.push_back({8, Bind::ReadOnly});
  d.bindings.push_back({9, Bind::ReadOnly});
  auto u = [](uint32_t v) { return std::to_string(v) + "u"; };
  d.constants = {{"BM", u(t.bm)}, {"BN", u(t.bn)}, {"BK", u(t.bk)}, {"TM", u(t.tm)}, {"TN", u(t.tn)},
                 {"TRANS_A", ta ? "true" : "false"}, {"TRANS_B", tb ? "true" : "false"},
                 {"ACT", u(uint32_t(ep == Epilogue::Plain ? Activation::None : act))},
                 {"ROWSUM", ep == Epilogue::RowSum ? "true" : "false"},
                 {"WARP_W", u(t.warp_w ? t.warp_w : t.bn / t.tn)}, {"LEAN_LOOP", lean ? "true" : "false"},
                 {"A_VEC", v.a ? "true" : "false"}, {"B_VEC", v.b ? "true" : "false"}};
  d.trusted = true;
  return dev.pipelines().get(d);
}

// One GEMM dispatch with params p. `ranges` starts with A's and B's ranges and
// holds every storage binding before 8 and 9; the vec4 views of A and B (or
// the placeholder) follow from p, as the kernel's A_VEC / B_VEC do.
void dispatch_gemm(Recorder& r, const TileConfig& t, bool ta, bool tb, Epilogue ep, Activation act,
                   const GemmParams& p, std::vector<Range> ranges, uint32_t gx, uint32_t gy, uint32_t gz = 1) {
  Device& dev = r.device();
  const VecLoads v = vec_loads(ta, tb, p);
  const Range unused{dev.placeholder(), 0, 16};
  const Range a = ranges[0], b = ranges[1];
  ranges.push_back(v.a ? a : unused);
  ranges.push_back(v.b ? b : unused);
  r.dispatch(gemm_kernel(dev, t, ta, tb, ep, act, v), ranges, p, gx, gy, gz);
}

const Kernel& gemv_kernel(Device& dev, bool tb, bool vec4, uint32_t gv_x) {
  KernelDesc d;
  d.shader = "gemv";
  d.entry = vec4 ? "gemv_vec4" : "gemv";
  d.bindings = {{0, Bind::ReadOnly}, {vec4 ? 4u : 1u, Bind::ReadOnly}, {2, Bind::ReadWrite}, {3, Bind::Uniform}};
  d.constants = {{"TRANS_B", tb ? "true" : "false"}, {"GV_X", std::to_string(gv_x) + "u"}};
  d.trusted = true;
  return dev.pipelines().get(d);
}

// A window of the block [row0, row0 + rows) x [col0, col0 + cols) of a
// row-major matrix with leading dimension ld, bound at an aligned offset;
// `inner` is where (row0, col0) starts inside it.
struct RowWindow { Range range; uint32_t inner; };

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

// Optional epilogue operands, bound whole.
struct EpilogueArgs {
  Epilogue ep = Epilogue::Plain;
  Activation act = Activation::None;
  const Buffer* bias = nullptr;
  const Buffer* preact = nullptr;
  const Buffer* row_sums = nullptr;  // RowSum
};

// gemm.wgsl's elementwise entries (split-K reduces, repack): bindings C (2),
// params and `partials` (6); they ignore the tile constants, so fixed values
// keep one pipeline each.
KernelDesc elementwise_kernel(const char* entry, Activation act) {
  KernelDesc d;
  d.shader = "gemm";
  d.entry = entry;
  d.bindings = {{2, Bind::ReadWrite}, {3, Bind::Uniform}, {6, Bind::ReadOnly}};
  d.constants = {{"BM", "64u"}, {"BN", "64u"}, {"BK", "16u"}, {"TM", "4u"}, {"TN", "4u"},
                 {"TRANS_A", "false"}, {"TRANS_B", "false"}, {"ACT", std::to_string(uint32_t(act)) + "u"},
                 {"ROWSUM", "false"}, {"WARP_W", "16u"}, {"LEAN_LOOP", "false"}, {"A_VEC", "false"}, {"B_VEC", "false"}};
  d.trusted = true;
  return d;
}

// C[m, n] (at c_off, leading dimension ldc) = epilogue(alpha * sum of `splits`
// partial products spaced `stride` floats apart in ws); the plain epilogue adds
// beta * C. The bias is read from bias_off on; the pre-activation (bound as
// preact_range) has C's element indices.
void record_split_reduce(Recorder& r, const Range& ws, uint32_t m, uint32_t n, uint32_t ldc, uint32_t c_off,
                         uint32_t splits, uint32_t stride, float alpha, float beta, Range c_range, const EpilogueArgs& e,
                         uint32_t bias_off = 0, const Range* preact_range = nullptr) {
  static const char* entries[] = {"splitk_reduce", "splitk_bias_act", "splitk_bias_act_train", "splitk_act_grad"};
  Device& dev = r.device();
  KernelDesc d = elementwise_kernel(entries[int(e.ep)], e.act);
  add_epilogue_bindings(d, e.ep);
  GemmParams q{m, n, 0, 0, 0, ldc, 0, 0, c_off, alpha, beta, bias_off, 0, stride, splits, 0};
  std::vector<Range> ranges{c_range, ws};
  if (has_bias(e.ep)) ranges.push_back(whole(*e.bias));
  if (has_preact(e.ep)) ranges.push_back(preact_range ? *preact_range : whole(*e.preact));
  auto [gx, gy] = grid_1d(dev, ceil_div(uint64_t(m) * n, 256));
  r.dispatch(dev.pipelines().get(d), ranges, q, gx, gy);
}

void record_gemv(Recorder& r, const Buffer& x, uint64_t x_base, const Buffer& b, const Buffer& y, uint64_t y_base,
                 uint32_t n, uint32_t k, bool tb, float alpha, float beta) {
  Device& dev = r.device();
  // B is stored (tb ? N x K : K x N).
  const uint64_t ld = tb ? k : n;
  // Column form with n a multiple of 4: 128-bit loads of column quads
  // (PYWGTRAIN_GEMV_VEC4=0 turns them off for A/B runs, docs/gemm_notes.md).
  static const bool vec4_enabled = [] {
    const char* v = std::getenv("PYWGTRAIN_GEMV_VEC4");
    return !(v && std::string(v) == "0");
  }();
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
  const Kernel& kern = gemv_kernel(dev, tb, vec4, gv_x);
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
      RowWindow bw = tb ? block_window(dev, b, 0, n0, nc, k0, kc, ld) : block_window(dev, b, 0, k0, kc, n0, nc, ld);
      RowWindow xw = row_window(dev, x, x_base, k0, kc, 1);
      RowWindow yw = row_window(dev, y, y_base, n0, nc, 1);
      GemvParams p{uint32_t(nc), uint32_t(kc), uint32_t(ld), xw.inner, bw.inner, yw.inner,
                   alpha, k0 == 0 ? beta : 1.0f, uint32_t(kc), 0};
      const uint64_t groups = ceil_div(nc, per_group);
      // Split K over workgroups (partials + reduce): always past kMaxKPerSplit
      // (bounded loops), and in the column-parallel form with few columns so
      // enough loads are in flight to saturate memory.
      uint64_t splits = ceil_div(kc, kMaxKPerSplit);
      if (!tb && nb == n && kb == k && groups < 256 && kc >= 1024)
        splits = std::max<uint64_t>(splits, std::min<uint64_t>({ceil_div(512, groups), kc / 256, 32}));
      if (splits > 1) {
        const uint32_t k_chunk = uint32_t(ceil_div(kc, splits));
        splits = ceil_div(kc, k_chunk);
        const Range ws{dev.workspace(uint64_t(nc) * splits * 4), 0, uint64_t(nc) * splits * 4};
        GemvParams q = p;
        q.y_off = 0;
        q.alpha = 1.0f;
        q.beta = 0.0f;
        q.k_chunk = k_chunk;
        q.split_stride = uint32_t(nc);
        r.dispatch(kern, {xw.range, bw.range, ws}, q, uint32_t(groups), uint32_t(splits));
        record_split_reduce(r, ws, 1, uint32_t(nc), uint32_t(nc), yw.inner, uint32_t(splits), uint32_t(nc), alpha,
                            k0 == 0 ? beta : 1.0f, yw.range, EpilogueArgs{});
        continue;
      }
      r.dispatch(kern, {xw.range, bw.range, yw.range}, p, uint32_t(groups));
    }
  }
}

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
  if (k >= kLongK && t.bm == 64 && t.bn == 128 && tiles >= kLongKMinTiles)
    return uint32_t(std::max<uint64_t>(bounded, long_k_splits(m, n, k)));
  if (tiles >= 256 || k < kSplitMinK) return uint32_t(bounded);
  const uint64_t splits = std::min<uint64_t>({ceil_div(512, tiles), k / 128, 16});
  return uint32_t(std::max<uint64_t>({splits, bounded, 1}));
}

// Split-K over the region [m0, m0 + mc) x [n0, n0 + nc) of C and the K range
// [k0, k0 + kc): each split writes its partial product (compact, nc wide) to
// the device workspace, the reduce pass sums them into C with the epilogue
// (bias from column n0 on, the pre-activation at C's indices).
void record_split_region(Recorder& r, const Buffer& a, const Buffer& b, const Buffer& c, uint32_t m0, uint32_t mc,
                         uint32_t n0, uint32_t nc, uint64_t k0, uint32_t kc, bool ta, bool tb, uint64_t lda,
                         uint64_t ldb, uint64_t ldc, const TileConfig& t, uint32_t splits, float alpha, float beta,
                         const EpilogueArgs& e) {
  Device& dev = r.device();
  // The partials bind as one range: at most a binding's worth of them (never
  // below the splits the bounded K loops need, which the callers' K blocks
  // keep within it).
  const uint64_t stride_cap = dev.limits().max_storage_binding / 4 / (uint64_t(mc) * nc);
  splits = uint32_t(std::clamp<uint64_t>(splits, 1, std::max<uint64_t>(stride_cap, ceil_div(kc, kMaxKPerSplit))));
  const uint32_t k_chunk = uint32_t(ceil_div(ceil_div(kc, splits), t.bk) * t.bk);  // whole K tiles per split
  splits = uint32_t(ceil_div(kc, k_chunk));
  const uint64_t stride = uint64_t(mc) * nc;
  const Range ws{dev.workspace(stride * splits * 4), 0, stride * splits * 4};
  RowWindow aw = ta ? row_window(dev, a, 0, k0, kc, lda) : row_window(dev, a, 0, m0, mc, lda);
  RowWindow bw = tb ? row_window(dev, b, 0, n0, nc, ldb) : row_window(dev, b, 0, k0, kc, ldb);
  GemmParams p{mc, nc, kc, uint32_t(lda), uint32_t(ldb), nc, aw.inner + uint32_t(ta ? m0 : k0),
               bw.inner + uint32_t(tb ? k0 : n0), 0, 1.0f, 0.0f, 0, k_chunk, uint32_t(stride), splits, 0};
  dispatch_gemm(r, t, ta, tb, Epilogue::Plain, Activation::None, p, {aw.range, bw.range, ws},
                uint32_t(ceil_div(nc, t.bn)), uint32_t(ceil_div(mc, t.bm)), splits);
  RowWindow cw = row_window(dev, c, 0, m0, mc, ldc);
  Range preact;
  if (has_preact(e.ep)) preact = row_window(dev, *e.preact, 0, m0, mc, ldc).range;
  record_split_reduce(r, ws, mc, nc, uint32_t(ldc), cw.inner + n0, splits, uint32_t(stride), alpha, beta, cw.range, e,
                      n0, has_preact(e.ep) ? &preact : nullptr);
}

// Ragged large products (e.g. 4097^3): a last tile row or column holding a
// few rows would cost a whole extra wave of full-K workgroups. The aligned
// part runs as usual; each thin strip runs as its own split-K product on
// small tiles. Plain epilogue, everything bindable at once.
bool record_ragged(Recorder& r, const Buffer& a, const Buffer& b, const Buffer& c, uint32_t m, uint32_t n, uint32_t k,
                   bool ta, bool tb, uint64_t lda, uint64_t ldb, const TileConfig& t, float alpha, float beta) {
  const uint32_t rm = m % t.bm, rn = n % t.bn;
  const bool thin_m = rm && rm <= t.bm / 8 && m / t.bm >= 8, thin_n = rn && rn <= t.bn / 8 && n / t.bn >= 8;
  if (!(thin_m || thin_n) || k < kSplitMinK) return false;
  Device& dev = r.device();
  const uint32_t m_main = m - (thin_m ? rm : 0), n_main = n - (thin_n ? rn : 0);
  RowWindow aw = ta ? row_window(dev, a, 0, 0, k, lda) : row_window(dev, a, 0, 0, m_main, lda);
  RowWindow bw = tb ? row_window(dev, b, 0, 0, n_main, ldb) : row_window(dev, b, 0, 0, k, ldb);
  RowWindow cw = row_window(dev, c, 0, 0, m_main, n);
  GemmParams p{m_main, n_main, k, uint32_t(lda), uint32_t(ldb), n, aw.inner, bw.inner, cw.inner, alpha, beta, 0, k, 0, 1, 0};
  dispatch_gemm(r, t, ta, tb, Epilogue::Plain, Activation::None, p, {aw.range, bw.range, cw.range},
                uint32_t(ceil_div(n_main, t.bn)), uint32_t(ceil_div(m_main, t.bm)));
  auto strip = [&](uint32_t m0, uint32_t mc, uint32_t n0, uint32_t nc) {
    const TileConfig ts = choose_tiles(mc, nc, k);
    record_split_region(r, a, b, c, m0, mc, n0, nc, 0, k, ta, tb, lda, ldb, n, ts,
                        choose_splits(mc, nc, k, ts), alpha, beta, EpilogueArgs{});
  };
  if (thin_m) strip(m_main, rm, 0, n);        // bottom rows, corner included
  if (thin_n) strip(0, m_main, n_main, rn);   // right columns above them
  return true;
}

// Copies the rows x cols matrix `src` (leading dimension cols) to `dst` with
// leading dimension ld.
void record_repack(Recorder& r, const Buffer& src, const Buffer& dst, uint32_t rows, uint32_t cols, uint32_t ld) {
  Device& dev = r.device();
  GemmParams q{rows, cols, 0, cols, 0, ld, 0, 0, 0, 1.0f, 0.0f, 0, 0, 0, 0, 0};
  auto [gx, gy] = grid_1d(dev, ceil_div(uint64_t(rows) * cols, 256));
  r.dispatch(dev.pipelines().get(elementwise_kernel("repack", Activation::None)),
             {floats(dst, 0, uint64_t(rows) * ld), floats(src, 0, uint64_t(rows) * cols)}, q, gx, gy);
}

// lda, ldb: leading dimensions of the stored A and B (0: packed, i.e. M or K,
// K or N).
void record_gemm(Recorder& r, const Buffer& a, const Buffer& b, const Buffer& c, uint32_t m, uint32_t n, uint32_t k,
                 bool ta, bool tb, float alpha, float beta, EpilogueArgs e, uint64_t lda = 0, uint64_t ldb = 0) {
  Device& dev = r.device();
  const TileConfig t = choose_tiles(m, n, k);
  if (!lda) lda = ta ? m : k;
  if (!ldb) ldb = tb ? k : n;
  const uint64_t ldc = n;
  const uint64_t cap_floats = dev.limits().max_storage_binding / 4;
  const uint64_t slack = std::max<uint32_t>(dev.limits().storage_offset_alignment, 4) / 4;
  if (e.ep == Epilogue::Plain && !ta && lda + slack > cap_floats && ldb == (tb ? k : n)) {
    // One row of A (K floats) exceeds a binding: each row of C is a GEMV of
    // that row of A with op(B), which binds both in pieces along K.
    for (uint64_t m0 = 0; m0 < m; ++m0) record_gemv(r, a, m0 * lda, b, c, m0 * ldc, n, k, tb, alpha, beta);
    return;
  }
  // Rows of each stored matrix are one of M, N, K; bound each block size by
  // every operand whose rows run along that dimension.
  uint64_t m_cap = rows_per_binding(dev, ldc, "C");
  m_cap = std::min<uint64_t>(m_cap, uint64_t(dev.limits().max_workgroups_per_dim) * t.bm);
  uint64_t n_cap = uint64_t(dev.limits().max_workgroups_per_dim) * t.bn;
  uint64_t k_cap = UINT64_MAX;
  if (!ta) m_cap = std::min(m_cap, rows_per_binding(dev, lda, "A")); else k_cap = std::min(k_cap, rows_per_binding(dev, lda, "A"));
  if (tb) n_cap = std::min(n_cap, rows_per_binding(dev, ldb, "B")); else k_cap = std::min(k_cap, rows_per_binding(dev, ldb, "B"));
  const uint64_t mb = block_along(m, m_cap, t.bm), nb = block_along(n, n_cap, t.bn);
  // Bounded K loops (dispatch_util.hpp): a K block takes at most as many
  // kMaxKPerSplit splits as one pass may have and as fit the workspace binding
  // beside an mb x nb output block; longer K runs as several blocks.
  const uint64_t pass_splits = std::clamp<uint64_t>(cap_floats / (mb * nb), 1, kMaxSplits);
  k_cap = std::min(k_cap, kMaxKPerSplit * pass_splits);
  const uint64_t kb = block_along(k, k_cap, t.bk);
  if (e.ep == Epilogue::RowSum &&
      (kb < k || mb < m || nb < n || choose_splits(m, n, k, t) > 1 || uint64_t(m) * n * k > kRowSumMaxMacs)) {
    // The in-kernel row sums need the whole K in one workgroup and one grid,
    // and they slow the main loop by ~8% (H100, 4096x512x4096): large
    // products take a plain GEMM and a separate column-sum pass (A is K x M).
    record_gemm(r, a, b, c, m, n, k, ta, tb, alpha, beta, EpilogueArgs{});
    return bias_grad(r, a, *e.row_sums, k, m, beta);
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
    if (pad_a) {
      a_padded = std::make_unique<Buffer>(r.device_ptr(), dev.repack_space(0, k * lda4 * 4), k * lda4 * 4);
      record_repack(r, a, *a_padded, k, uint32_t(lda), uint32_t(lda4));
    }
    if (pad_b) {
      b_padded = std::make_unique<Buffer>(r.device_ptr(), dev.repack_space(1, k * ldb4 * 4), k * ldb4 * 4);
      record_repack(r, b, *b_padded, k, uint32_t(ldb), uint32_t(ldb4));
    }
    return record_gemm(r, pad_a ? *a_padded : a, pad_b ? *b_padded : b, c, m, n, k, ta, tb, alpha, beta, e, lda4, ldb4);
  }
  if (kb == k && mb == m && nb == n) {
    const uint32_t splits = choose_splits(m, n, k, t);
    if (splits > 1) return record_split_region(r, a, b, c, 0, m, 0, n, 0, k, ta, tb, lda, ldb, ldc, t, splits, alpha, beta, e);
    if (e.ep == Epilogue::Plain && record_ragged(r, a, b, c, m, n, k, ta, tb, lda, ldb, t, alpha, beta)) return;
  }
  // Operands past the binding limit along K, or K past one pass of splits:
  // the blocks accumulate into C (beta = 1 after the first), so a fused
  // epilogue runs afterwards as its own elementwise pass over the complete
  // sum. A block with K past kMaxKPerSplit (or few tiles) runs split-K.
  const bool k_blocks = kb < k;
  std::unique_ptr<Buffer> scratch;  // released after recording: wgpu keeps it alive for the encoder
  const Buffer* target = &c;
  if (k_blocks && e.ep != Epilogue::Plain) {
    if (e.ep == Epilogue::BiasAct) {  // needs a pre-activation buffer of its own
      scratch = std::make_unique<Buffer>(r.device_ptr(), uint64_t(m) * n * 4, "pywgtrain.preact_scratch");
      e.preact = scratch.get();
      e.ep = Epilogue::BiasActTrain;
    } else if (e.ep == Epilogue::ActGrad) {
      scratch = std::make_unique<Buffer>(r.device_ptr(), uint64_t(m) * n * 4, "pywgtrain.product_scratch");
    }
    target = e.ep == Epilogue::BiasActTrain ? e.preact : scratch.get();
  }
  const Epilogue in_kernel = k_blocks ? Epilogue::Plain : e.ep;
  for (uint64_t m0 = 0; m0 < m; m0 += mb) {
    const uint64_t mc = std::min(mb, m - m0);
    for (uint64_t n0 = 0; n0 < n; n0 += nb) {
      const uint64_t nc = std::min(nb, n - n0);
      for (uint64_t k0 = 0; k0 < k; k0 += kb) {
        const uint64_t kc = std::min(kb, k - k0);
        const uint32_t splits = choose_splits(uint32_t(mc), uint32_t(nc), kc, t);
        if (splits > 1) {
          EpilogueArgs pe = e;
          pe.ep = in_kernel;
          record_split_region(r, a, b, *target, uint32_t(m0), uint32_t(mc), uint32_t(n0), uint32_t(nc), k0,
                              uint32_t(kc), ta, tb, lda, ldb, ldc, t, splits, alpha, k0 == 0 ? beta : 1.0f, pe);
          continue;
        }
        RowWindow aw = ta ? row_window(dev, a, 0, k0, kc, lda) : row_window(dev, a, 0, m0, mc, lda);
        RowWindow bw = tb ? row_window(dev, b, 0, n0, nc, ldb) : row_window(dev, b, 0, k0, kc, ldb);
        RowWindow cw = row_window(dev, *target, 0, m0, mc, ldc);
        GemmParams p{uint32_t(mc), uint32_t(nc), uint32_t(kc), uint32_t(lda), uint32_t(ldb), uint32_t(ldc),
                     aw.inner + uint32_t(ta ? m0 : k0), bw.inner + uint32_t(tb ? k0 : n0), cw.inner + uint32_t(n0),
                     alpha, k0 == 0 ? beta : 1.0f, uint32_t(n0), uint32_t(kc), 0, 1, 0};
        std::vector<Range> ranges{aw.range, bw.range, cw.range};
        if (has_bias(in_kernel)) ranges.push_back(whole(*e.bias));
        if (has_preact(in_kernel)) ranges.push_back(row_window(dev, *e.preact, 0, m0, mc, ldc).range);
        if (in_kernel == Epilogue::RowSum) ranges.push_back(whole(*e.row_sums));
        dispatch_gemm(r, t, ta, tb, in_kernel, e.act, p, std::move(ranges), uint32_t(ceil_div(nc, t.bn)),
                      uint32_t(ceil_div(mc, t.bm)));
      }
    }
  }
  if (!k_blocks || e.ep == Epilogue::Plain) return;
  if (e.ep == Epilogue::ActGrad) return activation_backward(r, *scratch, *e.preact, c, uint64_t(m) * n, e.act);
  // preact holds op(A) op(B); add the bias in place and write act() to C.
  KernelDesc d;
  d.shader = "linear";
  d.entry = "bias_act";
  d.bindings = {{2, Bind::ReadWrite}, {3, Bind::Uniform}, {4, Bind::ReadOnly}, {5, Bind::ReadWrite}};
  d.constants = {{"ACT", std::to_string(uint32_t(e.act)) + "u"}};
  const Kernel& bk = dev.pipelines().get(d);
  const uint64_t rows_per = rows_per_piece(dev, n);
  for (uint64_t m0 = 0; m0 < m; m0 += rows_per) {
    const uint64_t mc = std::min(rows_per, m - m0);
    struct { uint32_t n, cols, bias_off, pad; } p{uint32_t(mc * n), n, 0, 0};
    auto [gx, gy] = grid_1d(dev, ceil_div(mc * n, 256));
    r.dispatch(bk, {floats(c, m0 * n, mc * n), whole(*e.bias), floats(*e.preact, m0 * n, mc * n)}, p, gx, gy);
  }
}

void check_gemm(const Buffer& a, const Buffer& b, const Buffer& c, uint32_t m, uint32_t n, uint32_t k) {
  if (m == 0 || n == 0 || k == 0) throw ArgumentError("gemm: M, N and K must be >= 1 (got " + std::to_string(m) + ", " + std::to_string(n) + ", " + std::to_string(k) + ")");
  check_floats(a, uint64_t(m) * k, "gemm operand A");
  check_floats(b, uint64_t(k) * n, "gemm operand B");
  check_floats(c, uint64_t(m) * n, "gemm output C");
}

}  // namespace

void gemm(Recorder& r, const Buffer& a, const Buffer& b, const Buffer& c, uint32_t m, uint32_t n, uint32_t k,
          bool ta, bool tb, float alpha, float beta) {
  check_gemm(a, b, c, m, n, k);
  if (m == 1) {
    // op(A) is one row whichever way A is stored.
    record_gemv(r, a, 0, b, c, 0, n, k, tb, alpha, beta);
  } else if (n == 1) {
    // C^T = op(B)^T op(A)^T: the single column of op(B) is the vector and
    // op(A)^T is the matrix, stored N x K style exactly when A is not transposed.
    record_gemv(r, b, 0, a, c, 0, m, k, !ta, alpha, beta);
  } else {
    record_gemm(r, a, b, c, m, n, k, ta, tb, alpha, beta, EpilogueArgs{});
  }
}

void gemm_bias_act(Recorder& r, const Buffer& a, const Buffer& b, const Buffer& bias, const Buffer& y,
                   const Buffer* preact, uint32_t m, uint32_t n, uint32_t k, bool ta, bool tb, Activation act) {
  check_gemm(a, b, y, m, n, k);
  check_floats(bias, n, "bias");
  if (preact) check_floats(*preact, uint64_t(m) * n, "pre-activation output");
  record_gemm(r, a, b, y, m, n, k, ta, tb, 1.0f, 0.0f,
              EpilogueArgs{preact ? Epilogue::BiasActTrain : Epilogue::BiasAct, act, &bias, preact});
}

void linear_weight_grads(Recorder& r, const Buffer& dz, const Buffer& x, const Buffer& dw, const Buffer& db,
                         uint32_t rows, uint32_t out_features, uint32_t in_features, float beta) {
  check_gemm(dz, x, dw, out_features, in_features, rows);
  check_floats(db, out_features, "bias gradient");
  record_gemm(r, dz, x, dw, out_features, in_features, rows, true, false, 1.0f, beta,
              EpilogueArgs{Epilogue::RowSum, Activation::None, nullptr, nullptr, &db});
}

void gemm_act_grad(Recorder& r, const Buffer& a, const Buffer& b, const Buffer& preact, const Buffer& c, uint32_t m,
                   uint32_t n, uint32_t k, bool ta, bool tb, Activation act) {
  check_gemm(a, b, c, m, n, k);
  check_floats(preact, uint64_t(m) * n, "pre-activation");
  record_gemm(r, a, b, c, m, n, k, ta, tb, 1.0f, 0.0f, EpilogueArgs{Epilogue::ActGrad, act, nullptr, &preact});
}

}  // namespace pwt
