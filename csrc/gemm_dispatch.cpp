// gemm.wgsl's pipelines and single dispatches: the variant's constants
// (vec4 loads, alignment, tile order), one tiled product, the split-K and
// stream-K reduce, operand copies (repack, transpose), and the binding
// windows they all take.
#include <algorithm>
#include <cstdlib>
#include <initializer_list>
#include <memory>
#include <stdexcept>
#include <string>

#include "gemm_internal.hpp"

namespace pwt::gemm_detail {

namespace sh = wgsl::gemm;

namespace {

// Every gemm.wgsl pipeline binds all of the epilogue's operands; a 16-byte
// placeholder stands in for the ones its epilogue never touches.
Range or_placeholder(Device& dev, const Range& r, bool writable) {
  return r.buffer ? r : Range{dev.placeholder(writable), 0, 16};
}

// gemm.wgsl's A_VEC / B_VEC: whole-vec4 tile loads where the operand's
// contiguous direction is the tile's vec4 direction and its leading dimension
// and offset are multiples of 4 (PYWGTRAIN_GEMM_VEC=0 turns them off for A/B
// runs, docs/gemm_notes.md #42).
// C_VEC likewise for C's stores: its leading dimension, offset and split
// stride multiples of 4; not for the activation-gradient epilogue, whose
// vec4 pre-activation reads made it slower (docs/gemm_notes.md #48).
// B_PAIR: transposed B loads as 64-bit pairs along k where its leading
// dimension and offset are even, splits start at even k, and each thread holds an even
// number of slots of a 16-deep tile; dispatch_gemm drops it where the dispatch
// runs aligned (docs/gemm_notes.md #107, #108; PYWGTRAIN_GEMM_PAIR=0 turns it
// off).
struct VecLoads {
  bool a = false, b = false, c = false, b_pair = false;
};
VecLoads vec_loads(const GemmSwitches& sw, const TileConfig& t, bool ta, bool tb, bool act_grad, const GemmParams& p) {
  const bool enabled = sw.vec;
  const uint32_t threads = (t.bm / t.tm) * (t.bn / t.tn);
  const uint32_t b_slots = t.bn * t.bk / 4 / threads;
  return {enabled && ta && p.lda % 4 == 0 && p.a_off % 4 == 0, enabled && !tb && p.ldb % 4 == 0 && p.b_off % 4 == 0,
          enabled && !act_grad && p.ldc % 4 == 0 && p.c_off % 4 == 0 && p.split_stride % 4 == 0,
          tb && t.bk == 16 && b_slots % 2 == 0 && p.ldb % 2 == 0 && p.b_off % 2 == 0 &&
              (p.k_chunk % 2 == 0 || p.k_chunk >= p.k) && sw.pair};
}

// The specialization constants of one gemm.wgsl entry (listed in the
// shader's header), apart from the device's switches.
struct GemmSpec {
  TileConfig t;
  bool ta = false, tb = false, tc = false;
  Epilogue ep = Epilogue::Plain;
  Activation act = Activation::None;
  bool lean = false;
  VecLoads v;
  bool aligned = false, edge_shift = false;
  bool half_ab = false, half_c = false;  // float16 A and B; float16 C
  bool half_bias = false, half_residual = false;
};

// Entry `entry` of gemm.wgsl specialized by `s`, binding `slots`. Found by an
// integer key: this runs for every GEMM dispatch, and building the desc's
// strings cost more than recording the dispatch.
const Kernel& gemm_pipeline(Device& dev, const char* entry, const GemmSpec& s, std::initializer_list<Slot> slots) {
  const GemmSwitches& sw = dev.gemm_switches();
  const TileConfig& t = s.t;
  const uint32_t warp_w = t.warp_w ? t.warp_w : t.bn / t.tn;
  auto field = [](uint32_t v) -> uint64_t {
    if (v >= 1024) throw std::logic_error("gemm kernel key: a constant of 1024 or more");
    return v;
  };
  const uint64_t tiles =
      field(t.bm) | field(t.bn) << 10 | field(t.bk) << 20 | field(t.tm) << 30 | field(t.tn) << 40 | field(warp_w) << 50;
  uint64_t rest = uint64_t(s.ep) << 16 | uint64_t(s.act) << 24 | field(sw.group_m) << 32;
  int bit = 0;
  const bool half_fma = s.half_ab && sw.f16_fma;
  for (bool f : {s.ta, s.tb, s.tc, s.lean, s.v.a, s.v.b, s.v.b_pair, s.v.c, s.aligned, s.edge_shift, s.half_ab,
                 s.half_c, half_fma, s.half_bias, s.half_residual})
    rest |= uint64_t(f) << bit++;
  return dev.pipelines().get(KernelKey(entry, slots, tiles, rest), [&] {
    KernelDesc d;
    d.shader = "gemm";
    d.entry = entry;
    d.bindings = slots;
    auto type = [](bool half) { return half ? "f16" : "f32"; };
    d.aliases = {{"AB", type(s.half_ab)},
                 {"CT", type(s.half_c)},
                 {"TT", type(half_fma)},
                 {"BT", type(s.half_bias)},
                 {"RT", type(s.half_residual)}};
    // clang-format off
    d.constants = {{"BM", u32_literal(t.bm)},
                   {"BN", u32_literal(t.bn)},
                   {"BK", u32_literal(t.bk)},
                   {"TM", u32_literal(t.tm)},
                   {"TN", u32_literal(t.tn)},
                   {"TRANS_A", bool_literal(s.ta)},
                   {"TRANS_B", bool_literal(s.tb)},
                   {"TRANS_C", bool_literal(s.tc)},
                   {"EPILOGUE", u32_literal(uint32_t(s.ep))},
                   {"ACT", u32_literal(uint32_t(s.act))},
                   {"WARP_W", u32_literal(warp_w)},
                   {"LEAN_LOOP", bool_literal(s.lean)},
                   {"A_VEC", bool_literal(s.v.a)},
                   {"B_VEC", bool_literal(s.v.b)},
                   {"B_PAIR", bool_literal(s.v.b_pair)},
                   {"C_VEC", bool_literal(s.v.c)},
                   {"GROUP_M", u32_literal(sw.group_m)},
                   {"ALIGNED", bool_literal(s.aligned)},
                   {"EDGE_SHIFT", bool_literal(s.edge_shift)},
                   {"HALF_FMA", bool_literal(half_fma)}};
    // clang-format on
    d.trusted = true;
    return d;
  });
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
// those ran slower aligned, the other modes and tiles faster
// (docs/gemm_notes.md #87). PYWGTRAIN_GEMM_ALIGNED=0 turns it off for A/B runs.
struct EdgeChecks {
  bool aligned = false, edge_shift = false;
};
EdgeChecks edge_checks(const GemmSwitches& sw, const GemmVariant& g, const VecLoads& v, const GemmParams& p) {
  const TileConfig& t = g.t;
  const bool whole_rows = p.m % t.bm == 0, whole_cols = p.n % t.bn == 0;
  const bool rows = whole_rows || (p.m >= t.bm && (!(v.c && g.tc) || v.a || p.m % 4 == 0));
  const bool cols = whole_cols || (p.n >= t.bn && (!(v.c && !g.tc) || v.b || p.n % 4 == 0));
  if (g.stream_k || !rows || !cols) return {};
  const bool aligned = !(g.tb && t.tm == 8 && t.tn == 4) && sw.aligned;
  const bool k_tail = p.k % t.bk != 0 || p.k_chunk % t.bk != 0;  // some split ends in a partial K step
  return {aligned, !whole_rows || !whole_cols || (aligned && k_tail)};
}

const Kernel& gemm_kernel(Device& dev, const GemmVariant& g, const VecLoads& v, const EdgeChecks& c) {
  // Non-transposed B takes the separate K loop only with 128-bit loads: with
  // scalar loads it cost NN (docs/gemm_notes.md #37, #44). An aligned dispatch always runs
  // the unchecked loop: LEAN_LOOP off keeps one pipeline per aligned variant.
  const bool lean = g.t.lean_loop && (g.tb || v.b) && !c.aligned;
  GemmSpec s;
  s.t = g.t;
  s.ta = g.ta;
  s.tb = g.tb;
  s.tc = g.tc;
  s.ep = g.ep;
  s.act = g.ep == Epilogue::Plain ? Activation::None : g.act;
  s.lean = lean;
  s.v = v;
  s.aligned = c.aligned;
  s.edge_shift = c.edge_shift;
  s.half_ab = g.half_ab;
  s.half_c = g.half_c;
  s.half_bias = g.half_bias;
  s.half_residual = g.half_residual;
  return gemm_pipeline(dev, g.stream_k ? "gemm_stream_k" : "gemm", s,
                       {sh::a, sh::b, sh::c, sh::p, sh::bias, sh::preact, sh::row_sums, sh::a4, sh::b4, sh::c4,
                        sh::preact4, sh::residual, sh::b2});
}

}  // namespace

void dispatch_gemm(Recorder& r, const GemmVariant& g, const GemmParams& p, const GemmRanges& ranges, uint32_t gx,
                   uint32_t gy, uint32_t gz) {
  Device& dev = r.device();
  VecLoads v = vec_loads(dev.gemm_switches(), g.t, g.ta, g.tb, g.ep == Epilogue::ActGrad, p);
  const EdgeChecks checks = edge_checks(dev.gemm_switches(), g, v, p);
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

RowWindow block_window(const Device& dev, const Buffer& buf, uint64_t base, uint64_t row0, uint64_t rows, uint64_t col0,
                       uint64_t cols, uint64_t ld, uint32_t elem) {
  const uint64_t align = std::max<uint32_t>(dev.limits().storage_offset_alignment, 4) / elem;
  const uint64_t first = base + row0 * ld + col0;
  const uint64_t start = first / align * align;
  const uint64_t count = first - start + (rows - 1) * ld + cols;
  return {elements(buf, start, count, elem), uint32_t(first - start)};
}

RowWindow row_window(const Device& dev, const Buffer& buf, uint64_t base, uint64_t row0, uint64_t rows, uint64_t ld,
                     uint32_t elem) {
  return block_window(dev, buf, base, row0, rows, 0, ld, ld, elem);
}

uint64_t rows_per_binding(const Device& dev, uint64_t ld, const char* operand, uint32_t elem) {
  // (the window's byte count is rounded up to a word: one element of slack for float16)
  const uint64_t cap = dev.limits().max_storage_binding / elem - (elem < 4 ? 1 : 0);
  const uint64_t slack = std::max<uint32_t>(dev.limits().storage_offset_alignment, 4) / elem;
  if (ld + slack > cap)
    throw ArgumentError(std::string("one row of ") + operand + " (" + std::to_string(ld) +
                        " elements) exceeds the device's max_storage_buffer_binding_size of " +
                        std::to_string(dev.limits().max_storage_binding) + " bytes");
  return (cap - slack) / ld;
}

uint64_t block_along(uint64_t extent, uint64_t limit, uint64_t tile) {
  uint64_t b = std::min(extent, limit);
  if (b < extent && b >= tile) b = b / tile * tile;
  return std::max<uint64_t>(b, 1);
}

namespace {

// gemm.wgsl's elementwise entries (split-K reduce, repack): most ignore the
// tile constants, so fixed values keep one pipeline each; the stream-K
// fixup takes the product's tiles.
constexpr TileConfig kElementwiseTiles{64, 64, 16, 4, 4, 16};
// tc: the entry writes C transposed (the stream-K fixup of a product with tc).
const Kernel& elementwise_pipeline(Device& dev, const char* entry, Epilogue ep, Activation act,
                                   std::initializer_list<Slot> slots, const TileConfig& t = kElementwiseTiles,
                                   bool tc = false, bool half_c = false, bool half_bias = false,
                                   bool half_residual = false) {
  GemmSpec s;
  s.t = t;
  s.tc = tc;
  s.ep = ep;
  s.act = act;
  s.half_c = half_c;
  s.half_bias = half_bias;
  s.half_residual = half_residual;
  return gemm_pipeline(dev, entry, s, slots);
}

}  // namespace

void record_split_reduce(Recorder& r, const GemmParams& q, const SplitRanges& ranges, const EpilogueArgs& e,
                         const TileConfig* stream_k_tiles, bool tc, bool half_c) {
  Device& dev = r.device();
  // Four columns per thread (splitk_reduce4) where whole vec4s line up.
  const bool quads = !stream_k_tiles && e.ep != Epilogue::ActGrad && q.n % 4 == 0 && q.ldc % 4 == 0 &&
                     q.c_off % 4 == 0 && q.split_stride % 4 == 0;
  const auto c_slot = quads ? sh::c4 : sh::c;
  const auto preact_slot = quads ? sh::preact4 : sh::preact;
  const auto partials_slot = quads ? sh::partials4 : sh::partials;
  const char* entry = stream_k_tiles ? "stream_k_fixup" : quads ? "splitk_reduce4" : "splitk_reduce";
  const Kernel& k = elementwise_pipeline(
      dev, entry, e.ep, e.act, {c_slot, sh::p, partials_slot, sh::bias, preact_slot, sh::residual},
      stream_k_tiles ? *stream_k_tiles : kElementwiseTiles, stream_k_tiles && tc, half_c, e.half_bias, e.half_residual);
  auto [gx, gy] = grid_1d(dev, ceil_div(uint64_t(q.m) * q.n, quads ? 4 * sh::EW_WG : sh::EW_WG));
  r.dispatch(k,
             {{c_slot, ranges.c},
              {partials_slot, ranges.partials},
              {sh::bias, or_placeholder(dev, has_bias(e.ep) ? whole(*e.bias) : Range{}, false)},
              {preact_slot, or_placeholder(dev, has_preact(e.ep) ? ranges.preact : Range{}, true)},
              {sh::residual, or_placeholder(dev, has_residual(e.ep) ? ranges.residual : Range{}, false)}},
             q, gx, gy);
}

void record_repack(Recorder& r, const Buffer& src, const Buffer& dst, uint32_t rows, uint32_t cols, uint32_t ld) {
  Device& dev = r.device();
  GemmParams q;
  q.m = rows;
  q.n = cols;
  q.lda = cols;
  q.ldc = ld;
  q.alpha = 1.0f;
  const Kernel& k =
      elementwise_pipeline(dev, "repack", Epilogue::Plain, Activation::None, {sh::c, sh::p, sh::partials});
  auto [gx, gy] = grid_1d(dev, ceil_div(uint64_t(rows) * cols, sh::EW_WG));
  r.dispatch(k, {{sh::c, floats(dst, 0, uint64_t(rows) * ld)}, {sh::partials, floats(src, 0, uint64_t(rows) * cols)}},
             q, gx, gy);
}

namespace {

// Writes the transpose of the rows x cols matrix `src` (leading dimension
// src_ld, elements of `elem` bytes) to `dst` with leading dimension dst_ld.
void record_transpose(Recorder& r, const Buffer& src, uint64_t src_ld, uint32_t rows, uint32_t cols, const Buffer& dst,
                      uint64_t dst_ld, uint32_t elem) {
  Device& dev = r.device();
  GemmParams q;
  q.m = rows;
  q.n = cols;
  q.lda = uint32_t(src_ld);
  q.ldc = uint32_t(dst_ld);
  GemmSpec s;
  s.t = kElementwiseTiles;
  s.half_ab = s.half_c = elem == 2;
  const Kernel& k = gemm_pipeline(dev, "transpose", s, {sh::c, sh::p, sh::a});
  r.dispatch(k,
             {{sh::c, elements(dst, 0, (uint64_t(cols) - 1) * dst_ld + rows, elem)},
              {sh::a, elements(src, 0, (uint64_t(rows) - 1) * src_ld + cols, elem)}},
             q, uint32_t(ceil_div(cols, sh::TRANSPOSE_TILE)), uint32_t(ceil_div(rows, sh::TRANSPOSE_TILE)));
}

}  // namespace

std::unique_ptr<Buffer> transposed_copy(Recorder& r, const Buffer& src, uint64_t ld, uint32_t rows, uint32_t cols,
                                        int slot, uint32_t elem) {
  Device& dev = r.device();
  const uint64_t binding_elems = dev.limits().max_storage_binding / elem;
  const uint64_t rows4 = (uint64_t(rows) + 3) & ~uint64_t(3);
  if (uint64_t(rows) * ld > binding_elems || uint64_t(cols) * rows4 > binding_elems ||
      ceil_div(std::max(rows, cols), sh::TRANSPOSE_TILE) > dev.limits().max_workgroups_per_dim)
    return nullptr;
  const uint64_t bytes = cols * rows4 * elem;
  auto copy = std::make_unique<Buffer>(r.device_ptr(), dev.repack_space(slot, bytes), bytes);
  record_transpose(r, src, ld, rows, cols, *copy, rows4, elem);
  return copy;
}

}  // namespace pwt::gemm_detail
