// Internal declarations shared by the GEMM sources: gemm_plan.cpp (the
// heuristic plan), gemm_tuner.cpp (the autotuner and the plan a product
// runs with), gemm_dispatch.cpp (gemm.wgsl's pipelines and single
// dispatches), gemm_record.cpp (a plan recorded), gemv.cpp and gemm.cpp
// (the public entry points, ops.hpp). Nothing outside them includes it.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "dispatch_util.hpp"
#include "ops.hpp"

namespace pwt::gemm_detail {

constexpr uint32_t kSplitMinK = 512;  // split-K from this K on (few output tiles)
// The tuner keeps the heuristic plan unless a candidate beats it by this
// factor (timing noise must not trade a known plan for an equal one); a
// wider margin kept slower plans (docs/gemm_notes.md #105).
constexpr double kTuneMargin = 0.98;

// ---- Plan choice (gemm_plan.cpp)

// The warp block of 64x128 tiles for a transpose mode.
TileConfig with_mode_warps(TileConfig t, bool ta, bool tb);
TileConfig choose_tiles(const GemmSwitches& sw, uint32_t m, uint32_t n, uint32_t k, bool ta, bool tb);
uint32_t choose_splits(const GemmSwitches& sw, uint32_t m, uint32_t n, uint64_t k, const TileConfig& t);
GemmPlan heuristic_plan(const GemmSwitches& sw, uint32_t m, uint32_t n, uint32_t k, bool ta, bool tb);

// ---- Problems

// What happens to alpha * op(A) op(B) on its way to C (gemm.wgsl epilogue()).
enum class Epilogue : uint32_t {
  Plain = wgsl::gemm::EPILOGUE_PLAIN,
  BiasAct = wgsl::gemm::EPILOGUE_BIAS_ACT,
  BiasActTrain = wgsl::gemm::EPILOGUE_BIAS_ACT_TRAIN,
  ActGrad = wgsl::gemm::EPILOGUE_ACT_GRAD,
  RowSum = wgsl::gemm::EPILOGUE_ROWSUM,
  BiasResidual = wgsl::gemm::EPILOGUE_BIAS_RESIDUAL,
};

inline bool has_bias(Epilogue ep) {
  return ep == Epilogue::BiasAct || ep == Epilogue::BiasActTrain || ep == Epilogue::BiasResidual;
}
inline bool has_preact(Epilogue ep) { return ep == Epilogue::BiasActTrain || ep == Epilogue::ActGrad; }
inline bool has_residual(Epilogue ep) { return ep == Epilogue::BiasResidual; }

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
  uint32_t elem = 4;    // bytes per element of A and B: 4 (float32) or 2 (float16)
  uint32_t c_elem = 4;  // of C
};

// The shape of a product of packed operands (no buffers yet).
inline GemmProblem packed_shape(uint32_t m, uint32_t n, uint32_t k, bool ta, bool tb) {
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
inline GemmProblem packed_problem(const Buffer& a, const Buffer& b, const Buffer& c, uint32_t m, uint32_t n, uint32_t k,
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
inline Region whole_region(const GemmProblem& g) {
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
  // float16 bias and residual (gemm.wgsl BT, RT); the pre-activation has C's type.
  bool half_bias = false, half_residual = false;
};

// ---- gemm.wgsl's pipelines and single dispatches (gemm_dispatch.cpp)

// One pipeline of gemm.wgsl's tiled product (the stream-K entry when stream_k).
struct GemmVariant {
  TileConfig t;
  bool ta = false, tb = false, tc = false;
  Epilogue ep = Epilogue::Plain;
  Activation act = Activation::None;
  bool stream_k = false;
  // float16 A and B (AB), C (CT); split-K and stream-K partials stay float32.
  bool half_ab = false, half_c = false;
  bool half_bias = false, half_residual = false;  // the epilogue's operands (EpilogueArgs)
};

// What one tiled dispatch binds: windows of A, B and C, and the epilogue's
// operands (an unset range: the epilogue never touches it, a placeholder is
// bound). The vec4 views of A and B follow from the params.
struct GemmRanges {
  Range a, b, c;
  Range bias, preact, row_sums, residual;
};

inline std::string u32_literal(uint32_t v) { return std::to_string(v) + "u"; }
inline const char* bool_literal(bool v) { return v ? "true" : "false"; }

// One tiled GEMM dispatch with params p.
void dispatch_gemm(Recorder& r, const GemmVariant& g, const GemmParams& p, const GemmRanges& ranges, uint32_t gx,
                   uint32_t gy, uint32_t gz = 1);

// A window of the block [row0, row0 + rows) x [col0, col0 + cols) of a
// row-major matrix with leading dimension ld, bound at an aligned offset;
// `inner` is where (row0, col0) starts inside it.
struct RowWindow {
  Range range;
  uint32_t inner;
};

// `elem`: bytes per element (4, or 2 for float16).
RowWindow block_window(const Device& dev, const Buffer& buf, uint64_t base, uint64_t row0, uint64_t rows, uint64_t col0,
                       uint64_t cols, uint64_t ld, uint32_t elem = 4);
// Whole rows [row0, row0 + rows).
RowWindow row_window(const Device& dev, const Buffer& buf, uint64_t base, uint64_t row0, uint64_t rows, uint64_t ld,
                     uint32_t elem = 4);
// Largest row count whose window (plus alignment slack) fits one binding.
uint64_t rows_per_binding(const Device& dev, uint64_t ld, const char* operand, uint32_t elem = 4);
// Block size along one dimension: every operand stored with that dimension as
// its row index must fit; 0 constraints means the whole extent.
uint64_t block_along(uint64_t extent, uint64_t limit, uint64_t tile);

// What a split-K reduce binds: the partial products, C, and the
// pre-activation and residual at C's indices (epilogues that have them).
struct SplitRanges {
  Range partials, c, preact, residual;
};

// C[m, n] (at q.c_off, leading dimension q.ldc) = epilogue(q.alpha * the sum
// of q.splits partial products spaced q.split_stride floats apart); the
// plain epilogue adds q.beta * C, the bias is read from q.bias_off on. With
// stream_k_tiles: the sum of each tile's stream-K slots (gemm.wgsl
// stream_k_fixup) for a product on those tiles, into C transposed when tc.
// half_c: C is float16.
void record_split_reduce(Recorder& r, const GemmParams& q, const SplitRanges& ranges, const EpilogueArgs& e,
                         const TileConfig* stream_k_tiles = nullptr, bool tc = false, bool half_c = false);

// Copies the rows x cols matrix `src` (leading dimension cols) to `dst` with
// leading dimension ld.
void record_repack(Recorder& r, const Buffer& src, const Buffer& dst, uint32_t rows, uint32_t cols, uint32_t ld);
// The rows x cols matrix `src` (leading dimension ld, elements of `elem`
// bytes: 4 or 2) transposed into the device's repack space `slot`, its rows
// padded to a multiple of 4 elements (the product's vec4 loads), recorded on
// r; null where the source or the copy exceeds one binding or the
// transpose's grid one dispatch.
std::unique_ptr<Buffer> transposed_copy(Recorder& r, const Buffer& src, uint64_t ld, uint32_t rows, uint32_t cols,
                                        int slot, uint32_t elem = 4);

// ---- GEMV (gemv.cpp)

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

void record_gemv(Recorder& r, const GemvProblem& g);

// ---- Recording a plan (gemm_record.cpp)

// Stream-K (gemm.wgsl gemm_stream_k): `workers` workgroups, one wave, share
// the tiles' K steps in equal ranges, so a product whose tiles fill a wave
// or two only in part keeps every slot busy to the end. Each tile gets a
// partial slot per workgroup whose range meets it (`slots`: the most any tile
// gets); the fixup pass sums them with the epilogue.
// The tile rows that fill whole waves of workers run before it as plain
// tiles with the epilogue in-kernel (the stream-K paper's hybrid), so only
// the part wave's tiles go through partial slots and the fixup
// (docs/gemm_notes.md #78). `first_row`: where stream-K takes over (a multiple of the
// tile height; 0 when the tiles fill less than a wave); `tiles`: those after it.
struct StreamK {
  uint32_t first_row = 0;
  uint64_t tiles = 0, slots = 0;
  uint64_t partial_floats(const TileConfig& t) const { return tiles * slots * t.bm * t.bn; }
};

// The layout of stream-K for an m x n x k product on tiles t, or nothing
// where it does not apply.
std::optional<StreamK> stream_k_layout(const Device& dev, uint32_t m, uint32_t n, uint32_t k, const TileConfig& t,
                                       uint32_t workers);

// Block sizes along M, N and K of what one set of bindings covers on tiles t.
struct Blocks {
  uint64_t m, n, k;
};
Blocks blocks(const Device& dev, const GemmProblem& g, const TileConfig& t);

// The product g on plan `plan`, epilogue e.
void record_planned(Recorder& r, const GemmProblem& g, EpilogueArgs e, const GemmPlan& plan);
// The product g with epilogue e: as a GEMV per row, on transposed operand
// copies, row-split, or on the plan gemm_plan gives.
void record_gemm(Recorder& r, const GemmProblem& g, EpilogueArgs e);

// ---- The plan a product runs with (gemm_tuner.cpp)

// The plan g runs with: PYWGTRAIN_GEMM_TILES / _SPLITS / _STREAM_K when set, else the
// device's measured plan for its shape (timed now if autotuning is on and the
// shape is new), else the heuristic.
GemmPlan gemm_plan(Recorder& r, const GemmProblem& g);

}  // namespace pwt::gemm_detail
