// Launchers of the autograd's tensor kernels (elementwise.wgsl, axis.wgsl,
// embedding.wgsl, embedding_backward.wgsl). Operands past one storage binding are split into blocks;
// each block binds, per operand, the aligned range at or below its first
// element and passes that element's index in the binding through the uniform.
#include "tensor_ops.hpp"

#include <algorithm>
#include <array>
#include <initializer_list>
#include <memory>
#include <string>
#include <tuple>
#include <utility>

#include "dispatch_util.hpp"
#include "ops.hpp"

namespace pwt {
namespace {

namespace ew = wgsl::elementwise;
namespace ax = wgsl::axis;
namespace emb = wgsl::embedding;
namespace embb = wgsl::embedding_backward;
static_assert(emb::CB == embb::CB, "both embedding backward forms cover CB columns per workgroup");

constexpr uint32_t kEmbMaxRows = 128;  // rows per emb_bwd_segments workgroup at most (its VB is emitted per kernel)
// embedding_backward: ids per segment aimed at (enough workgroups to fill a GPU
// for small tables), the partial sums' scratch budget (floats), and the most
// segments one combine pass adds (its loop's trips).
constexpr uint64_t kEmbSegIds = 64;  // H100, nanoGPT char (65 x 384, 16384 ids): 512 gave 192 workgroups, 0.4 ms
constexpr uint64_t kEmbScratchFloats = uint64_t(1) << 24;
constexpr uint64_t kEmbMaxSegs = 1024;
// Ids one segment scans at most (a thread's trips: one per id, plus VB to clear and write).
constexpr uint64_t kEmbMaxSegLen = 16384;
constexpr uint64_t kMaxBlocks = 65536;  // dispatches one N-d launch may split into
// Trips of any one loop in a kernel: llvmpipe (lavapipe) silently leaves a
// loop after 65535 iterations (an inner loop's trips add up over its outer
// loop's), so longer work is split across dispatches.
constexpr uint64_t kMaxTrips = 32768;
constexpr uint64_t kRowThreads = ax::WG;   // threads along a row (reduce_rows, softmax)
constexpr uint64_t kColLanes = ax::LANES;  // lanes along len (reduce_cols)
constexpr uint64_t kSoftmaxMaxCols = kRowThreads * kMaxTrips;
// reduce_axis's two-pass split (below): lines are cut into parts when the
// one-pass reduction would run fewer workgroups than kSplitBelowGroups, into
// about kSplitTargetGroups workgroups in all, each part at least
// kPartPerLane elements per lane, at most kMaxParts parts per line.
constexpr uint64_t kSplitBelowGroups = 256;
constexpr uint64_t kSplitTargetGroups = 1024;
constexpr uint64_t kPartPerLane = 8;
constexpr uint64_t kMaxParts = 4096;

}  // namespace

void check_ints(const Buffer& b, uint64_t count, const char* what) {
  if (b.bytes() < count * 4)
    throw ArgumentError(std::string(what) + " holds " + std::to_string(b.bytes() / 4) + " int32 values, needs " +
                        std::to_string(count));
}

namespace {

// WebGPU cannot bind one buffer read-only and writable in one dispatch (wgpu
// would reject the whole recording at submit): refuse outputs that share a
// GPU buffer (also as views of one arena) with an input, naming both.
void check_nonzero(uint64_t v, const std::string& what) {
  if (v == 0) throw ArgumentError(what + " must be >= 1");
}

void check_half_mask(HalfMask half, const char* fn) {
  if (half > kHalfAll)
    throw ArgumentError(std::string(fn) + ": half must be a mask of operand slots 0..3 (0 to " +
                        std::to_string(kHalfAll) + "), got " + std::to_string(half));
}

// Bytes per element of operand slot `slot` (0..3: in0, in1, in2, res) under a HalfMask.
uint64_t elem_size(HalfMask half, uint32_t slot) { return (half >> slot & 1u) ? 2 : 4; }

// One element-wise kernel over n elements of the buffers bound to `operands`
// (operand slot 0..3 and its buffer; `half`: which slots hold float16).
void record_flat(Recorder& r, const Kernel& k,
                 std::initializer_list<std::tuple<Slot, uint32_t, const Buffer*>> operands, uint64_t n, float a,
                 float b, float beta, HalfMask half) {
  Device& dev = r.device();
  // Pieces start where 2-byte and 4-byte offsets are both aligned.
  const uint64_t step = 2 * align_floats(dev);
  const uint64_t piece = max_piece_floats(dev) / step * step;
  for (uint64_t first = 0; first < n; first += piece) {
    const uint64_t count = std::min(piece, n - first);
    FlatParams p;
    p.n = uint32_t(count);
    p.a = a;
    p.b = b;
    p.beta = beta;
    std::array<Operand, 4> bound;  // no allocation per call
    size_t i = 0;
    for (auto& [slot, at, buf] : operands)
      bound.at(i++) = Operand(slot, elements(*buf, first, count, elem_size(half, at)));
    auto [gx, gy] = grid_1d(dev, ceil_div(count, ew::WG * ew::EPT));
    r.dispatch(k, Operands(bound.data(), i), p, gx, gy);
  }
}

// ACT of activations.wgsl for the ops that reuse its math (GELU has forms of
// its own in elementwise.wgsl that keep relative precision for x << 0).
uint32_t act_for(UnaryOp op) {
  switch (op) {
    case UnaryOp::U_RELU:
      return uint32_t(Activation::Relu);
    case UnaryOp::U_SILU:
      return uint32_t(Activation::Silu);
    default:
      return uint32_t(Activation::None);
  }
}

// elementwise.wgsl kernel: every constant the file reads is emitted (unused ones as 0), and the
// element types of in0, in1, in2 and res as the aliases T0, T1, T2, TR (f16 where `half` says).
const Kernel& ew_kernel(Device& dev, const char* entry, std::initializer_list<Slot> bindings, uint32_t op,
                        HalfMask half, uint32_t act = 0, uint32_t which = 0) {
  const KernelKey key(entry, bindings, op | uint64_t(half) << 32, uint64_t(act) | uint64_t(which) << 32);
  return dev.pipelines().get(key, [&] {
    KernelDesc d;
    d.shader = "elementwise";
    d.entry = entry;
    d.bindings = bindings;
    d.constants = {{"OP", std::to_string(op) + "u"},
                   {"ACT", std::to_string(act) + "u"},
                   {"WHICH", std::to_string(which) + "u"},
                   {"RES_HALF", (half & kHalfRes) ? "true" : "false"}};
    static const char* const names[] = {"T0", "T1", "T2", "TR"};
    for (uint32_t slot = 0; slot < 4; ++slot) d.aliases.emplace_back(names[slot], (half >> slot & 1u) ? "f16" : "f32");
    return d;
  });
}

// axis.wgsl kernel; src_half / res_half: src / res hold float16 (the aliases ST, RT).
const Kernel& axis_kernel(Device& dev, const char* entry, std::initializer_list<Slot> bindings, uint32_t op,
                          bool log = false, bool src_half = false, bool res_half = false) {
  const KernelKey key(entry, bindings, op, uint64_t(log) | uint64_t(src_half) << 1 | uint64_t(res_half) << 2);
  return dev.pipelines().get(key, [&] {
    KernelDesc d;
    d.shader = "axis";
    d.entry = entry;
    d.bindings = bindings;
    d.constants = {
        {"OP", std::to_string(op) + "u"}, {"LOG", log ? "true" : "false"}, {"RES_HALF", res_half ? "true" : "false"}};
    d.aliases = {{"ST", src_half ? "f16" : "f32"}, {"RT", res_half ? "f16" : "f32"}};
    return d;
  });
}

const Kernel& gather_kernel(Device& dev, const char* entry, std::vector<Slot> bindings) {
  KernelDesc d;
  d.shader = "embedding";
  d.entry = entry;
  d.bindings = std::move(bindings);
  return dev.pipelines().get(d);
}

// ---- N-d index spaces (binary, binary_backward, where, strided_copy) ----

struct NdOperand {
  const Buffer* buf = nullptr;  // nullptr: slot unused by the kernel
  uint64_t off = 0;
  const std::vector<uint32_t>* strides = nullptr;
  const char* what = "";
};

// The bindings of NdParams' operand slots 0..3; copy_bits binds slots 0 and 3
// as raw words instead, copy_half_bits the words of 2-byte elements.
using NdSlots = std::array<Slot, 4>;
constexpr NdSlots kNdSlots = {ew::in0, ew::in1, ew::in2, ew::res};
constexpr NdSlots kNdBitSlots = {ew::in0_bits, ew::in1, ew::in2, ew::res_bits};
constexpr NdSlots kNdHalfBitSlots = {ew::in0_bits, ew::in1, ew::in2, ew::res_words};
static_assert(sizeof(NdParams::strides) / sizeof(NdParams::strides[0]) == kMaxDims, "NdParams holds kMaxDims strides");

std::vector<uint32_t> contiguous_strides(const std::vector<uint32_t>& shape, const std::string& fn) {
  std::vector<uint32_t> s(shape.size());
  uint64_t step = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    if (step > UINT32_MAX) throw ArgumentError(fn + ": more than 2^32 - 1 elements");
    s[d] = uint32_t(step);
    step *= std::max<uint32_t>(shape[d], 1);
  }
  if (step > UINT32_MAX) throw ArgumentError(fn + ": more than 2^32 - 1 elements");
  return s;
}

// Records kernel k over the index space `shape` with operands in binding
// slots 0..3 (in0, in1, in2, res: slot 3 written). Size-1 dimensions are dropped and dimensions
// every operand walks contiguously are merged; when an operand's span exceeds
// one binding, the space is cut into blocks: outer dimensions one coordinate
// at a time, the first dimension whose inner span fits in runs as long as fit.
void record_nd(Recorder& r, const Kernel& k, const std::string& fn, const std::array<NdOperand, 4>& ops,
               const std::vector<uint32_t>& shape, float beta, HalfMask half, const NdSlots& slots = kNdSlots) {
  const size_t nd = shape.size();
  if (nd > kMaxDims)
    throw ArgumentError(fn + ": " + std::to_string(nd) + " dimensions, at most " + std::to_string(kMaxDims) +
                        " supported");
  for (size_t d = 0; d < nd; ++d)
    if (shape[d] == 0) throw ArgumentError(fn + ": shape has a zero dimension (dimension " + std::to_string(d) + ")");
  for (uint32_t i = 0; i < 4; ++i) {
    const NdOperand& op = ops[i];
    if (!op.buf) continue;
    if (op.strides->size() != nd)
      throw ArgumentError(fn + ": " + op.what + " has " + std::to_string(op.strides->size()) + " strides for a " +
                          std::to_string(nd) + "-d shape");
    uint64_t last = op.off;  // element index of the last element touched
    for (size_t d = 0; d < nd; ++d) {
      const uint64_t step = uint64_t(shape[d] - 1) * (*op.strides)[d];
      if (step > (uint64_t(1) << 52)) throw ArgumentError(fn + ": " + op.what + " strides reach past any buffer");
      last += step;
    }
    if (op.buf->bytes() < (last + 1) * elem_size(half, i))  // the message is built only on failure: this runs per op
      check_elements(*op.buf, last + 1, elem_size(half, i), (fn + " " + op.what).c_str());
  }
  for (size_t i = 0; i < 3; ++i)
    if (ops[i].buf) check_no_alias(fn, *ops[3].buf, ops[3].what, {{ops[i].buf, ops[i].what}});

  // Collapse. Slot 4 is the block's own element index (contiguous), which
  // bounds the element count of a block.
  constexpr size_t kSlots = 5;
  // Fixed storage (at most kMaxDims dimensions): this runs for every element-wise op.
  std::array<uint64_t, kMaxDims> sh{};
  std::array<std::array<uint64_t, kSlots>, kMaxDims> st{};
  size_t n = 0;
  for (size_t d = 0; d < nd; ++d) {
    if (shape[d] == 1) continue;
    std::array<uint64_t, kSlots> s{};
    for (size_t i = 0; i < 4; ++i) s[i] = ops[i].buf ? (*ops[i].strides)[d] : 0;
    bool merge = n > 0;
    for (size_t i = 0; i < 4 && merge; ++i) merge = st[n - 1][i] == s[i] * shape[d];
    if (merge) {
      sh[n - 1] *= shape[d];
      st[n - 1] = s;
    } else {
      sh[n] = shape[d];
      st[n++] = s;
    }
  }
  if (n == 0) {
    sh[0] = 1;
    st[0] = {};
    n = 1;
  }
  for (size_t d = n, step = 1; d-- > 0;) {
    st[d][4] = step;
    step *= sh[d];
  }
  for (size_t d = 0; d < n; ++d)
    if (st[d][3] == 0 && sh[d] > 1)
      throw ArgumentError(fn + ": " + ops[3].what + " strides map several elements to one position (stride 0)");

  auto active = [&](size_t i) { return i == 4 || ops[i].buf != nullptr; };
  auto tail = [&](size_t i, size_t from) {  // elements spanned by dims from.. of operand i
    uint64_t e = 1;
    for (size_t d = from; d < n; ++d) e += (sh[d] - 1) * st[d][i];
    return e;
  };
  Device& dev = r.device();
  const uint64_t limit = span_limit(dev);
  size_t split = 1;  // dims >= split are whole in every block
  for (; split < n; ++split) {
    bool fits = true;
    for (size_t i = 0; i < kSlots; ++i) fits = fits && (!active(i) || tail(i, split) <= limit);
    if (fits) break;
  }
  const size_t p = split - 1;  // the dimension cut into runs
  uint64_t run = sh[p];
  for (size_t i = 0; i < kSlots; ++i)
    if (active(i) && st[p][i] > 0) run = std::min(run, (limit - tail(i, split)) / st[p][i] + 1);
  uint64_t blocks = ceil_div(sh[p], run);
  for (size_t d = 0; d < p; ++d) blocks *= sh[d];
  if (blocks > kMaxBlocks)
    throw ArgumentError(fn + ": operands span more than one storage binding and this layout would need " +
                        std::to_string(blocks) + " dispatches (at most " + std::to_string(kMaxBlocks) +
                        "); make the operands contiguous first");

  uint64_t per_run = 1;  // elements per coordinate of dim p
  for (size_t d = split; d < n; ++d) per_run *= sh[d];
  std::array<uint64_t, kMaxDims> coord{};
  for (;;) {
    for (uint64_t c = 0; c < sh[p]; c += run) {
      const uint64_t len = std::min(run, sh[p] - c);
      NdParams prm;
      prm.n = uint32_t(len * per_run);
      prm.ndim = uint32_t(n - p);
      prm.beta = beta;
      prm.shape[0][0] = uint32_t(len);
      for (size_t d = split; d < n; ++d) prm.shape[(d - p) / 4][(d - p) % 4] = uint32_t(sh[d]);
      for (size_t d = p; d < n; ++d)
        for (size_t i = 0; i < 4; ++i) prm.strides[d - p][i] = uint32_t(st[d][i]);
      std::array<Operand, 4> operands;
      size_t bound = 0;
      for (size_t i = 0; i < 4; ++i) {
        if (!ops[i].buf) continue;
        uint64_t first = ops[i].off + c * st[p][i];
        for (size_t d = 0; d < p; ++d) first += coord[d] * st[d][i];
        const Bound b =
            bind_span(dev, *ops[i].buf, first, (len - 1) * st[p][i] + tail(i, split), elem_size(half, uint32_t(i)));
        operands[bound++] = Operand(slots[i], b.range);
        prm.offs[i] = b.off;
      }
      auto [gx, gy] = grid_1d(dev, ceil_div(prm.n, ew::WG * ew::EPT));
      r.dispatch(k, Operands(operands.data(), bound), prm, gx, gy);
    }
    size_t d = p;
    for (; d > 0; --d) {
      if (++coord[d - 1] < sh[d - 1]) break;
      coord[d - 1] = 0;
    }
    if (d == 0) break;
  }
}

// ---- [outer, len, inner] blocks (reduce_axis, max_backward) ----

struct AxisBlock {
  uint64_t o0, outer, j0, len, i0, inner;
};

// Blocks whose x span fits one binding and whose len is at most max_len:
// runs of rows (each cut into len runs of max_len) when a [len, inner] slice
// fits, else runs of len (whole inner), else runs of inner.
template <typename F>
void for_each_axis_block(uint64_t limit, uint64_t max_len, uint64_t outer, uint64_t len, uint64_t inner, F fn) {
  const uint64_t slice = len * inner;
  if (slice <= limit) {
    const uint64_t mo = limit / slice;
    const uint64_t ml = std::min(len, max_len);
    for (uint64_t o = 0; o < outer; o += mo)
      for (uint64_t j = 0; j < len; j += ml)
        fn(AxisBlock{o, std::min(mo, outer - o), j, std::min(ml, len - j), 0, inner});
  } else if (inner <= limit) {
    const uint64_t ml = std::min(limit / inner, max_len);
    for (uint64_t o = 0; o < outer; ++o)
      for (uint64_t j = 0; j < len; j += ml) fn(AxisBlock{o, 1, j, std::min(ml, len - j), 0, inner});
  } else {
    for (uint64_t o = 0; o < outer; ++o)
      for (uint64_t j = 0; j < len; ++j)
        for (uint64_t i = 0; i < inner; i += limit) fn(AxisBlock{o, 1, j, 1, i, std::min(limit, inner - i)});
  }
}

struct AxisBinding {
  AxisParams prm;
  uint64_t x_first, x_count, out_first, out_count;
};

AxisBinding axis_binding(const AxisBlock& b, uint64_t len, uint64_t inner) {
  AxisBinding a{};
  a.x_first = (b.o0 * len + b.j0) * inner + b.i0;
  a.x_count = (b.outer - 1) * len * inner + (b.len - 1) * inner + b.inner;
  a.out_first = b.o0 * inner + b.i0;
  a.out_count = (b.outer - 1) * inner + b.inner;
  a.prm.outer = uint32_t(b.outer);
  a.prm.len = uint32_t(b.len);
  a.prm.inner = uint32_t(b.inner);
  a.prm.x_row = b.outer > 1 ? uint32_t(len * inner) : 0;  // fits whenever more than one row is bound
  a.prm.x_col = uint32_t(inner);
  a.prm.out_row = uint32_t(inner);
  a.prm.j0 = uint32_t(b.j0);
  a.prm.parts = 1;
  a.prm.part_len = uint32_t(b.len);
  return a;
}

// Rows of a [rows, cols] operand per block, or an error naming `fn` when one
// row exceeds a binding or `max_cols`.
uint64_t rows_per_block(const Device& dev, uint64_t cols, const std::string& fn, uint64_t max_cols = UINT64_MAX) {
  const uint64_t limit = span_limit(dev);
  if (cols > max_cols)
    throw ArgumentError(fn + ": rows of " + std::to_string(cols) + " columns exceed the supported " +
                        std::to_string(max_cols) + " (a workgroup per row)");
  if (cols > limit)
    throw ArgumentError(fn + ": a row of " + std::to_string(cols) + " elements exceeds one storage binding (" +
                        std::to_string(limit) + " elements)");
  return limit / cols;
}

// axis.wgsl's params for softmax over `rows` contiguous rows of `cols`, the
// first element at `x_off` of src's (and src2's) binding, at `out_off` of res's.
AxisParams softmax_rows(uint32_t rows, uint32_t cols, uint32_t x_off, uint32_t out_off) {
  AxisParams p;
  p.outer = rows;
  p.len = cols;
  p.inner = 1;
  p.x_row = cols;
  p.x_col = 1;
  p.out_row = cols;
  p.x_off = x_off;
  p.out_off = out_off;
  p.scale = 1.0f;
  p.parts = 1;
  p.part_len = cols;
  return p;
}

// Sizes and aliasing of an embedding call: `table` [vocab, dim], `ids` [n_ids]
// (int32), `rows` [n_ids, dim]; the output (rows for the gather, the table for
// the backward) must not alias the inputs.
void check_embedding(const char* fn, bool table_out, const Buffer& table, const char* table_name, const Buffer& rows,
                     const char* rows_name, const Buffer& ids, uint32_t n_ids, uint32_t vocab, uint32_t dim) {
  const std::string f = fn;
  check_nonzero(n_ids, (f + ": n_ids").c_str());
  check_nonzero(vocab, (f + ": vocab").c_str());
  check_nonzero(dim, (f + ": dim").c_str());
  check_floats(table, uint64_t(vocab) * dim, (f + " " + table_name).c_str());
  check_ints(ids, n_ids, (f + " ids").c_str());
  check_floats(rows, uint64_t(n_ids) * dim, (f + " " + rows_name).c_str());
  const Buffer& out = table_out ? table : rows;
  check_no_alias(fn, out, table_out ? table_name : rows_name,
                 {{table_out ? &rows : &table, table_out ? rows_name : table_name}, {&ids, "ids"}});
}

// A gather block: `ids` ids (dy / output rows) against table rows [v0, v0 + vc).
GatherParams gather_block(uint64_t ids, uint32_t dim, uint32_t vocab, uint64_t v0, uint64_t vc) {
  GatherParams p;
  p.rows = uint32_t(ids);
  p.cols = dim;
  p.vocab = vocab;
  p.v0 = uint32_t(v0);
  p.vcount = uint32_t(vc);
  return p;
}

}  // namespace

// ---- element-wise ----

void unary(Recorder& r, UnaryOp op, const Buffer& x, const Buffer& y, uint64_t n, float a, float b, float beta,
           HalfMask half) {
  if (uint32_t(op) >= kUnaryOps) throw ArgumentError("unary: unknown op " + std::to_string(uint32_t(op)));
  check_nonzero(n, "unary: n");
  check_half_mask(half, "unary");
  half &= kHalf0 | kHalfRes;
  check_elements(x, n, elem_size(half, 0), "unary input x");
  check_elements(y, n, elem_size(half, 3), "unary output y");
  check_no_alias("unary", y, "y", {{&x, "x"}});
  const Kernel& k = ew_kernel(r.device(), "unary", {ew::in0, ew::res, ew::fp}, uint32_t(op), half, act_for(op));
  record_flat(r, k, {{ew::in0, 0, &x}, {ew::res, 3, &y}}, n, a, b, beta, half);
}

void unary_backward(Recorder& r, UnaryOp op, const Buffer& x, const Buffer& y, const Buffer& dy, const Buffer& dx,
                    uint64_t n, float a, float b, float beta, HalfMask half) {
  if (uint32_t(op) >= kUnaryOps) throw ArgumentError("unary_backward: unknown op " + std::to_string(uint32_t(op)));
  check_nonzero(n, "unary_backward: n");
  check_half_mask(half, "unary_backward");
  check_elements(x, n, elem_size(half, 0), "unary_backward input x");
  check_elements(y, n, elem_size(half, 1), "unary_backward forward output y");
  check_elements(dy, n, elem_size(half, 2), "unary_backward dy");
  check_elements(dx, n, elem_size(half, 3), "unary_backward dx");
  check_no_alias("unary_backward", dx, "dx", {{&x, "x"}, {&y, "y"}, {&dy, "dy"}});
  const Kernel& k = ew_kernel(r.device(), "unary_backward", {ew::in0, ew::in1, ew::in2, ew::res, ew::fp}, uint32_t(op),
                              half, act_for(op));
  record_flat(r, k, {{ew::in0, 0, &x}, {ew::in1, 1, &y}, {ew::in2, 2, &dy}, {ew::res, 3, &dx}}, n, a, b, beta, half);
}

void fill(Recorder& r, const Buffer& out, uint64_t n, float value, bool half) {
  check_nonzero(n, "fill: n");
  const HalfMask mask = half ? kHalfRes : 0;
  check_elements(out, n, elem_size(mask, 3), "fill output");
  const Kernel& k = ew_kernel(r.device(), "fill", {ew::res, ew::fp}, 0, mask);
  record_flat(r, k, {{ew::res, 3, &out}}, n, value, 0.0f, 0.0f, mask);
}

void binary(Recorder& r, BinaryOp op, const Buffer& a, const Buffer& b, const Buffer& out,
            const std::vector<uint32_t>& shape, const std::vector<uint32_t>& a_strides,
            const std::vector<uint32_t>& b_strides, float beta, HalfMask half) {
  if (uint32_t(op) >= kBinaryOps) throw ArgumentError("binary: unknown op " + std::to_string(uint32_t(op)));
  check_half_mask(half, "binary");
  half &= ~kHalf2;  // no third input
  const auto out_strides = contiguous_strides(shape, "binary");
  const Kernel& k = ew_kernel(r.device(), "binary", {ew::in0, ew::in1, ew::res, ew::np}, uint32_t(op), half);
  std::array<NdOperand, 4> ops{};
  ops[0] = {&a, 0, &a_strides, "operand a"};
  ops[1] = {&b, 0, &b_strides, "operand b"};
  ops[3] = {&out, 0, &out_strides, "output"};
  record_nd(r, k, "binary", ops, shape, beta, half);
}

void binary_backward(Recorder& r, BinaryOp op, uint32_t which, const Buffer& a, const Buffer& b, const Buffer& dy,
                     const Buffer& g, const std::vector<uint32_t>& shape, const std::vector<uint32_t>& a_strides,
                     const std::vector<uint32_t>& b_strides, float beta, HalfMask half) {
  if (uint32_t(op) >= kBinaryOps) throw ArgumentError("binary_backward: unknown op " + std::to_string(uint32_t(op)));
  if (which > 1) throw ArgumentError("binary_backward: which must be 0 (a) or 1 (b), got " + std::to_string(which));
  check_half_mask(half, "binary_backward");
  const auto out_strides = contiguous_strides(shape, "binary_backward");
  const Kernel& k = ew_kernel(r.device(), "binary_backward", {ew::in0, ew::in1, ew::in2, ew::res, ew::np}, uint32_t(op),
                              half, 0, which);
  std::array<NdOperand, 4> ops{};
  ops[0] = {&a, 0, &a_strides, "operand a"};
  ops[1] = {&b, 0, &b_strides, "operand b"};
  ops[2] = {&dy, 0, &out_strides, "dy"};
  ops[3] = {&g, 0, &out_strides, "gradient g"};
  record_nd(r, k, "binary_backward", ops, shape, beta, half);
}

void where(Recorder& r, const Buffer& cond, const Buffer& a, const Buffer& b, const Buffer& out,
           const std::vector<uint32_t>& shape, const std::vector<uint32_t>& c_strides,
           const std::vector<uint32_t>& a_strides, const std::vector<uint32_t>& b_strides, float beta, HalfMask half) {
  check_half_mask(half, "where");
  const auto out_strides = contiguous_strides(shape, "where");
  const Kernel& k = ew_kernel(r.device(), "where_select", {ew::in0, ew::in1, ew::in2, ew::res, ew::np}, 0, half);
  std::array<NdOperand, 4> ops{};
  ops[0] = {&a, 0, &a_strides, "operand a"};
  ops[1] = {&b, 0, &b_strides, "operand b"};
  ops[2] = {&cond, 0, &c_strides, "cond"};
  ops[3] = {&out, 0, &out_strides, "output"};
  record_nd(r, k, "where", ops, shape, beta, half);
}

void strided_copy(Recorder& r, const Buffer& src, uint64_t src_off, const std::vector<uint32_t>& src_strides,
                  const Buffer& dst, uint64_t dst_off, const std::vector<uint32_t>& dst_strides,
                  const std::vector<uint32_t>& shape, float beta, HalfMask half) {
  check_half_mask(half, "strided_copy");
  half &= kHalf0 | kHalfRes;
  std::array<NdOperand, 4> ops{};
  ops[0] = {&src, src_off, &src_strides, "src"};
  ops[3] = {&dst, dst_off, &dst_strides, "dst"};
  // A plain copy between equal element types moves raw bits: int32 ids and NaN payloads arrive
  // unchanged. 2-byte elements go through their words (a word may hold halves of two threads).
  if (beta == 0.0f && half == 0) {
    const Kernel& k = ew_kernel(r.device(), "copy_bits", {ew::in0_bits, ew::res_bits, ew::np}, 0, 0);
    record_nd(r, k, "strided_copy", ops, shape, beta, half, kNdBitSlots);
    return;
  }
  if (beta == 0.0f && half == (kHalf0 | kHalfRes)) {
    const Kernel& k = ew_kernel(r.device(), "copy_half_bits", {ew::in0_bits, ew::res_words, ew::np}, 0, 0);
    record_nd(r, k, "strided_copy", ops, shape, beta, half, kNdHalfBitSlots);
    return;
  }
  const Kernel& k = ew_kernel(r.device(), "strided_copy", {ew::in0, ew::res, ew::np}, 0, half);
  record_nd(r, k, "strided_copy", ops, shape, beta, half);
}

// ---- along an axis ----

void reduce_axis(Recorder& r, ReduceOp op, const Buffer& x, const Buffer& out, const Buffer* argmax, uint32_t outer,
                 uint32_t len, uint32_t inner, float scale, float beta, bool half) {
  if (uint32_t(op) >= kReduceOps) throw ArgumentError("reduce_axis: unknown op " + std::to_string(uint32_t(op)));
  check_nonzero(outer, "reduce_axis: outer");
  check_nonzero(len, "reduce_axis: len");
  check_nonzero(inner, "reduce_axis: inner");
  check_elements(x, uint64_t(outer) * len * inner, elem_bytes(half), "reduce_axis input x");
  check_floats(out, uint64_t(outer) * inner, "reduce_axis output");
  if (argmax) {
    if (op != ReduceOp::R_MAX) throw ArgumentError("reduce_axis: argmax is only produced by Max");
    check_ints(*argmax, uint64_t(outer) * inner, "reduce_axis argmax");
  }
  check_no_alias("reduce_axis", out, "out", {{&x, "x"}});
  if (argmax) check_no_alias("reduce_axis", *argmax, "argmax", {{&x, "x"}});
  Device& dev = r.device();
  const uint64_t limit = span_limit(dev);
  const bool rows = inner == 1;
  const uint64_t lanes = rows ? kRowThreads : kColLanes;  // threads along len per workgroup
  const uint64_t max_len = lanes * kMaxTrips;
  // Few long lines (a whole-tensor sum, a column sum of a tall matrix) take two
  // passes: the first cuts each line into parts, a workgroup each, into a
  // float32 scratch [outer, parts, inner]; the second reduces the parts. One
  // workgroup per line would leave the GPU idle (H200: sum() of 8192 x 50304
  // floats took hundreds of ms). argmax keeps one pass (its indices).
  auto line_groups = [&](uint64_t o, uint64_t i) { return rows ? o : o * ceil_div(i, ax::COLS); };
  const uint64_t min_part = lanes * kPartPerLane;
  const bool split = !argmax && line_groups(outer, inner) < kSplitBelowGroups && len >= 2 * min_part;
  const uint64_t block_len = split ? max_len * kMaxParts : max_len;  // a part's trips stay within kMaxTrips
  // len split into blocks merged into out (binding limit, loop trips)
  const bool blocks_len = uint64_t(len) * inner > limit || len > block_len;
  if (blocks_len && op == ReduceOp::R_MAX && (scale != 1.0f || beta != 0.0f))
    throw ArgumentError("reduce_axis: Max with len " + std::to_string(len) +
                        " (split into blocks: " + std::to_string(block_len) +
                        " per block, or past one storage binding) needs scale 1 and beta 0");
  const char* entry =
      rows ? (argmax ? "reduce_rows_arg" : "reduce_rows") : (argmax ? "reduce_cols_arg" : "reduce_cols");
  const Kernel& k = argmax ? axis_kernel(dev, entry, {ax::src, ax::res, ax::ap, ax::idx_out}, uint32_t(op), false, half)
                           : axis_kernel(dev, entry, {ax::src, ax::res, ax::ap}, uint32_t(op), false, half);
  for_each_axis_block(limit, block_len, outer, len, inner, [&](const AxisBlock& b) {
    AxisBinding ab = axis_binding(b, len, inner);
    const Bound xb = bind_span(dev, x, ab.x_first, ab.x_count, elem_bytes(half));
    const Bound ob = bind_span(dev, out, ab.out_first, ab.out_count);
    ab.prm.x_off = xb.off;
    ab.prm.out_off = ob.off;
    ab.prm.combine = b.j0 > 0 && op == ReduceOp::R_MAX;
    ab.prm.scale = scale;
    ab.prm.beta = b.j0 > 0 ? 1.0f : beta;  // Sum: later len blocks add to the earlier ones
    const uint64_t groups = line_groups(b.outer, b.inner);
    // Parts: about kSplitTargetGroups workgroups, none shorter than min_part, none past the trip limit.
    const uint64_t parts =
        split ? std::max(ceil_div(b.len, max_len), std::min(ceil_div(kSplitTargetGroups, groups), b.len / min_part))
              : 1;
    if (parts > 1) {
      const uint64_t part_len = ceil_div(b.len, parts);
      const uint64_t used = ceil_div(b.len, part_len);
      const uint64_t count = b.outer * used * b.inner;
      // A scratch of its own (the workspace may hold a caller's operand); wgpu keeps it alive for the recording.
      auto scratch = std::make_unique<Buffer>(r.device_ptr(), count * 4, "pywgtrain.reduce_parts");
      AxisParams first = ab.prm;
      first.parts = uint32_t(used);
      first.part_len = uint32_t(part_len);
      first.out_row = uint32_t(used * b.inner);
      first.out_off = 0;
      first.combine = 0;
      first.scale = 1.0f;
      first.beta = 0.0f;
      auto [fx, fy] = grid_1d(dev, groups * used);
      r.dispatch(k, {{ax::src, xb.range}, {ax::res, floats(*scratch, 0, count)}}, first, fx, fy);
      AxisParams second = ab.prm;  // out, scale, beta, combine as a one-pass block
      second.len = uint32_t(used);
      second.part_len = uint32_t(used);
      second.x_off = 0;
      second.x_row = uint32_t(used * b.inner);
      second.x_col = uint32_t(b.inner);
      const Kernel& k2 = axis_kernel(dev, entry, {ax::src, ax::res, ax::ap}, uint32_t(op), false, false);
      auto [gx, gy] = grid_1d(dev, groups);
      r.dispatch(k2, {{ax::src, floats(*scratch, 0, count)}, {ax::res, ob.range}}, second, gx, gy);
      return;
    }
    std::vector<Operand> operands = {{ax::src, xb.range}, {ax::res, ob.range}};
    if (argmax) operands.push_back({ax::idx_out, bind_span(dev, *argmax, ab.out_first, ab.out_count).range});
    auto [gx, gy] = grid_1d(dev, groups);
    r.dispatch(k, operands, ab.prm, gx, gy);
  });
}

void max_backward(Recorder& r, const Buffer& dy, const Buffer& argmax, const Buffer& dx, uint32_t outer, uint32_t len,
                  uint32_t inner, float beta) {
  check_nonzero(outer, "max_backward: outer");
  check_nonzero(len, "max_backward: len");
  check_nonzero(inner, "max_backward: inner");
  check_floats(dy, uint64_t(outer) * inner, "max_backward dy");
  check_ints(argmax, uint64_t(outer) * inner, "max_backward argmax");
  check_floats(dx, uint64_t(outer) * len * inner, "max_backward dx");
  check_no_alias("max_backward", dx, "dx", {{&dy, "dy"}, {&argmax, "argmax"}});
  Device& dev = r.device();
  const Kernel& k = axis_kernel(dev, "max_backward", {ax::src, ax::idx_in, ax::res, ax::ap}, uint32_t(ReduceOp::R_MAX));
  for_each_axis_block(span_limit(dev), UINT64_MAX, outer, len, inner, [&](const AxisBlock& b) {
    AxisBinding ab = axis_binding(b, len, inner);
    const Bound dyb = bind_span(dev, dy, ab.out_first, ab.out_count);
    const Bound dxb = bind_span(dev, dx, ab.x_first, ab.x_count);
    ab.prm.x_off = dxb.off;
    ab.prm.out_off = dyb.off;
    ab.prm.scale = 1.0f;
    ab.prm.beta = beta;
    auto [gx, gy] = grid_1d(dev, ceil_div(b.outer * b.len * b.inner, ax::WG));
    r.dispatch(k,
               {{ax::src, dyb.range},
                {ax::idx_in, bind_span(dev, argmax, ab.out_first, ab.out_count).range},
                {ax::res, dxb.range}},
               ab.prm, gx, gy);
  });
}

void softmax(Recorder& r, const Buffer& x, const Buffer& y, uint32_t rows, uint32_t cols, bool log, bool half) {
  check_nonzero(rows, "softmax: rows");
  check_nonzero(cols, "softmax: cols");
  check_elements(x, uint64_t(rows) * cols, elem_bytes(half), "softmax input x");
  check_floats(y, uint64_t(rows) * cols, "softmax output y");
  check_no_alias("softmax", y, "y", {{&x, "x"}});
  Device& dev = r.device();
  const uint64_t per = rows_per_block(dev, cols, "softmax", kSoftmaxMaxCols);
  const bool short_rows = cols <= short_row_cols(dev);  // a thread per row
  const Kernel& k =
      axis_kernel(dev, short_rows ? "softmax_short" : "softmax", {ax::src, ax::res, ax::ap}, 0, log, half, false);
  for (uint64_t r0 = 0; r0 < rows; r0 += per) {
    const uint64_t rc = std::min<uint64_t>(per, rows - r0);
    const Bound xb = bind_span(dev, x, r0 * cols, rc * cols, elem_bytes(half));
    const Bound yb = bind_span(dev, y, r0 * cols, rc * cols);
    const AxisParams p = softmax_rows(uint32_t(rc), cols, xb.off, yb.off);
    auto [gx, gy] = grid_1d(dev, short_rows ? ceil_div(rc, ax::WG) : rc);
    r.dispatch(k, {{ax::src, xb.range}, {ax::res, yb.range}}, p, gx, gy);
  }
}

void softmax_backward(Recorder& r, const Buffer& y, const Buffer& dy, const Buffer& dx, uint32_t rows, uint32_t cols,
                      bool log, float beta, bool half) {
  check_nonzero(rows, "softmax_backward: rows");
  check_nonzero(cols, "softmax_backward: cols");
  const uint64_t n = uint64_t(rows) * cols;
  check_floats(y, n, "softmax_backward y");
  check_floats(dy, n, "softmax_backward dy");
  check_elements(dx, n, elem_bytes(half), "softmax_backward dx");
  check_no_alias("softmax_backward", dx, "dx", {{&y, "y"}, {&dy, "dy"}});
  Device& dev = r.device();
  const uint64_t per = rows_per_block(dev, cols, "softmax_backward", kSoftmaxMaxCols);
  const bool short_rows = cols <= short_row_cols(dev);  // a thread per row
  const Kernel& k = axis_kernel(dev, short_rows ? "softmax_backward_short" : "softmax_backward",
                                {ax::src, ax::src2, ax::res, ax::ap}, 0, log, false, half);
  for (uint64_t r0 = 0; r0 < rows; r0 += per) {
    const uint64_t rc = std::min<uint64_t>(per, rows - r0);
    const Bound yb = bind_span(dev, y, r0 * cols, rc * cols);
    const Bound dxb = bind_span(dev, dx, r0 * cols, rc * cols, elem_bytes(half));
    AxisParams p = softmax_rows(uint32_t(rc), cols, yb.off, dxb.off);  // dy shares y's offset: aligned bases
    p.beta = beta;
    auto [gx, gy] = grid_1d(dev, short_rows ? ceil_div(rc, ax::WG) : rc);
    r.dispatch(k,
               {{ax::src, yb.range}, {ax::src2, bind_span(dev, dy, r0 * cols, rc * cols).range}, {ax::res, dxb.range}},
               p, gx, gy);
  }
}

// ---- index kernels ----

void embedding(Recorder& r, const Buffer& weight, const Buffer& ids, const Buffer& out, uint32_t n_ids, uint32_t vocab,
               uint32_t dim) {
  check_embedding("embedding", false, weight, "weight", out, "out", ids, n_ids, vocab, dim);
  Device& dev = r.device();
  const uint64_t per = rows_per_block(dev, dim, "embedding");
  const Kernel& k = gather_kernel(dev, "embedding", {emb::src, emb::idx, emb::dst, emb::gp});
  // Weight rows in blocks (ids of other blocks are skipped), ids / output rows in blocks.
  for (uint64_t v0 = 0; v0 < vocab; v0 += per) {
    const uint64_t vc = std::min<uint64_t>(per, vocab - v0);
    const Bound wb = bind_span(dev, weight, v0 * dim, vc * dim);
    for (uint64_t i0 = 0; i0 < n_ids; i0 += per) {
      const uint64_t ic = std::min<uint64_t>(per, n_ids - i0);
      const Bound ib = bind_span(dev, ids, i0, ic);
      const Bound ob = bind_span(dev, out, i0 * dim, ic * dim);
      GatherParams p = gather_block(ic, dim, vocab, v0, vc);
      p.src_off = wb.off;
      p.idx_off = ib.off;
      p.dst_off = ob.off;
      p.first = v0 == 0;
      auto [gx, gy] = grid_1d(dev, ceil_div(ic * dim, emb::WG));
      r.dispatch(k, {{emb::src, wb.range}, {emb::idx, ib.range}, {emb::dst, ob.range}}, p, gx, gy);
    }
  }
}

void next_token(Recorder& r, const Buffer& logits, const Buffer& tok, const Buffer& hist, const Buffer& pos,
                uint32_t rows, uint32_t cols, uint32_t hist_cols) {
  check_nonzero(rows, "next_token: rows");
  check_nonzero(cols, "next_token: cols");
  check_nonzero(hist_cols, "next_token: hist_cols");
  check_floats(logits, uint64_t(rows) * cols, "next_token logits");
  check_ints(tok, rows, "next_token tok");
  check_ints(hist, uint64_t(rows) * hist_cols, "next_token hist");
  check_ints(pos, 1, "next_token pos");
  check_no_alias("next_token", tok, "tok", {{&logits, "logits"}, {&hist, "hist"}, {&pos, "pos"}});
  check_no_alias("next_token", hist, "hist", {{&logits, "logits"}, {&pos, "pos"}});
  check_no_alias("next_token", pos, "pos", {{&logits, "logits"}});
  Device& dev = r.device();
  // One workgroup walks every row: its loops run rows and cols / WG trips.
  if (uint64_t(rows) * cols * 4 > dev.limits().max_storage_binding || ceil_div(cols, emb::WG) > kMaxTrips ||
      rows > kMaxTrips)
    throw ArgumentError("next_token: logits [" + std::to_string(rows) + ", " + std::to_string(cols) +
                        "] exceed one storage binding or one workgroup's loop limit");
  const Kernel& k = gather_kernel(dev, "next_token", {emb::src, emb::tok_out, emb::hist, emb::pos_io, emb::tp});
  TokenParams p;
  p.rows = rows;
  p.cols = cols;
  p.hist_cols = hist_cols;
  r.dispatch(k,
             {{emb::src, floats(logits, 0, uint64_t(rows) * cols)},
              {emb::tok_out, floats(tok, 0, rows)},
              {emb::hist, floats(hist, 0, uint64_t(rows) * hist_cols)},
              {emb::pos_io, floats(pos, 0, 1)}},
             p, 1);
}

void embedding_backward(Recorder& r, const Buffer& dy, const Buffer& ids, const Buffer& dweight, uint32_t n_ids,
                        uint32_t vocab, uint32_t dim, float beta) {
  check_embedding("embedding_backward", true, dweight, "dweight", dy, "dy", ids, n_ids, vocab, dim);
  Device& dev = r.device();
  const uint64_t per = rows_per_block(dev, dim, "embedding_backward");
  // Rows per workgroup: as many as workgroup memory holds (VB * CB floats plus a 64-id tile), up to 128.
  const uint64_t wg_bytes = dev.limits().max_workgroup_storage;
  const uint64_t vb = std::min<uint64_t>(kEmbMaxRows, wg_bytes > 256 ? (wg_bytes - 256) / (4 * embb::CB) : 0);
  if (vb == 0) throw ArgumentError("embedding_backward: the device offers too little workgroup memory");
  KernelDesc seg_desc;
  seg_desc.shader = "embedding_backward";
  seg_desc.entry = "emb_bwd_segments";
  seg_desc.bindings = {embb::src, embb::idx, embb::dst, embb::ep};
  seg_desc.constants = {{"VB", std::to_string(vb) + "u"}};
  const Kernel& seg_k = dev.pipelines().get(seg_desc);
  const uint64_t table = uint64_t(vocab) * dim;
  const uint64_t cblocks = ceil_div(dim, embb::CB);
  // Segments: the ids split into S runs summed by different workgroups into partial tables
  // (S * vocab * dim floats of scratch, one binding), which a second pass adds in segment order.
  const uint64_t budget = std::min(kEmbScratchFloats, span_limit(dev));
  const uint64_t segs_max = std::min({ceil_div(n_ids, kEmbSegIds), budget / table, kEmbMaxSegs});

  if (segs_max < 2) {
    // Tables too large for segment partials have many vocabulary blocks, hence many workgroups:
    // embedding.wgsl's scan, which adds matching dy rows straight into dweight (H100, GPT-2's
    // 50304 x 768 table and 8192 ids: 3.1 ms with the position table, against 29 ms for
    // emb_bwd_segments with one segment). Id blocks in increasing order, later ones accumulating.
    const Kernel& k = gather_kernel(dev, "embedding_backward", {emb::src, emb::idx, emb::dst, emb::gp});
    const uint64_t id_rows = std::min<uint64_t>(per, kMaxTrips);  // one inner-loop trip per id
    for (uint64_t v0 = 0; v0 < vocab; v0 += per) {
      const uint64_t vc = std::min<uint64_t>(per, vocab - v0);
      const Bound wb = bind_span(dev, dweight, v0 * dim, vc * dim);
      for (uint64_t i0 = 0; i0 < n_ids; i0 += id_rows) {
        const uint64_t ic = std::min<uint64_t>(id_rows, n_ids - i0);
        const Bound db = bind_span(dev, dy, i0 * dim, ic * dim);
        const Bound ib = bind_span(dev, ids, i0, ic);
        GatherParams p = gather_block(ic, dim, vocab, v0, vc);
        p.src_off = db.off;
        p.idx_off = ib.off;
        p.dst_off = wb.off;
        p.beta = i0 == 0 ? beta : 1.0f;
        auto [gx, gy] = grid_1d(dev, ceil_div(vc, emb::VB) * ceil_div(dim, emb::CB));
        r.dispatch(k, {{emb::src, db.range}, {emb::idx, ib.range}, {emb::dst, wb.range}}, p, gx, gy);
      }
    }
    return;
  }

  // The whole table fits one binding here (table <= budget / 2). Rounds of up to segs_max segments of at
  // most kEmbMaxSegLen ids (and dy rows within one binding), later rounds accumulating (beta = 1).
  KernelDesc comb_desc = seg_desc;
  comb_desc.entry = "emb_bwd_combine";
  comb_desc.bindings = {embb::src, embb::dst, embb::ep};
  const Kernel& comb_k = dev.pipelines().get(comb_desc);
  const uint64_t round_ids = std::min(segs_max * kEmbMaxSegLen, per);
  // Scratch for the partial tables (wgpu keeps it alive for the encoder; a captured graph references it).
  auto scratch = std::make_unique<Buffer>(r.device_ptr(), segs_max * table * 4, "pywgtrain.emb_partials");
  const Bound wb = bind_span(dev, dweight, 0, table);
  for (uint64_t i0 = 0; i0 < n_ids; i0 += round_ids) {
    const uint64_t ic = std::min<uint64_t>(round_ids, n_ids - i0);
    const uint64_t seg = ceil_div(ic, segs_max);  // <= kEmbMaxSegLen
    const uint64_t segs = ceil_div(ic, seg);      // <= segs_max
    const Bound db = bind_span(dev, dy, i0 * dim, ic * dim);
    const Bound ib = bind_span(dev, ids, i0, ic);
    const Range parts = floats(*scratch, 0, segs * table);
    EmbBwdParams p;
    p.rows = uint32_t(ic);
    p.cols = dim;
    p.v0 = 0;
    p.vcount = vocab;
    p.src_off = db.off;
    p.idx_off = ib.off;
    p.dst_off = 0;
    p.seg = uint32_t(seg);
    p.segs = uint32_t(segs);
    auto [gx, gy] = grid_1d(dev, segs * ceil_div(vocab, vb) * cblocks);
    r.dispatch(seg_k, {{embb::src, db.range}, {embb::idx, ib.range}, {embb::dst, parts}}, p, gx, gy);
    EmbBwdParams q = p;
    q.src_off = 0;
    q.dst_off = wb.off;
    q.beta = i0 == 0 ? beta : 1.0f;
    auto [cx, cy] = grid_1d(dev, ceil_div(table, embb::WG));
    r.dispatch(comb_k, {{embb::src, parts}, {embb::dst, wb.range}}, q, cx, cy);
  }
}

void nll_pick(Recorder& r, const Buffer& x, const Buffer& labels, const Buffer& out, const Buffer& mask, uint32_t rows,
              uint32_t cols, int32_t ignore_index) {
  check_nonzero(rows, "nll_pick: rows");
  check_nonzero(cols, "nll_pick: cols");
  check_floats(x, uint64_t(rows) * cols, "nll_pick input x");
  check_ints(labels, rows, "nll_pick labels");
  check_floats(out, rows, "nll_pick output");
  check_floats(mask, rows, "nll_pick mask");
  check_no_alias("nll_pick", out, "out", {{&x, "x"}, {&labels, "labels"}});
  check_no_alias("nll_pick", mask, "mask", {{&x, "x"}, {&labels, "labels"}});
  Device& dev = r.device();
  const uint64_t per = rows_per_block(dev, cols, "nll_pick");
  const Kernel& k = gather_kernel(dev, "nll_pick", {emb::src, emb::idx, emb::dst, emb::dst2, emb::gp});
  for (uint64_t r0 = 0; r0 < rows; r0 += per) {
    const uint64_t rc = std::min<uint64_t>(per, rows - r0);
    const Bound xb = bind_span(dev, x, r0 * cols, rc * cols);
    const Bound lb = bind_span(dev, labels, r0, rc);
    const Bound ob = bind_span(dev, out, r0, rc);
    GatherParams p;
    p.rows = uint32_t(rc);
    p.cols = cols;
    p.src_off = xb.off;
    p.idx_off = lb.off;
    p.dst_off = ob.off;  // mask shares it
    p.ignore_index = ignore_index;
    auto [gx, gy] = grid_1d(dev, ceil_div(rc, emb::WG));
    r.dispatch(k,
               {{emb::src, xb.range},
                {emb::idx, lb.range},
                {emb::dst, ob.range},
                {emb::dst2, bind_span(dev, mask, r0, rc).range}},
               p, gx, gy);
  }
}

void nll_pick_backward(Recorder& r, const Buffer& dy, const Buffer& labels, const Buffer& dx, uint32_t rows,
                       uint32_t cols, int32_t ignore_index, float beta) {
  check_nonzero(rows, "nll_pick_backward: rows");
  check_nonzero(cols, "nll_pick_backward: cols");
  check_floats(dy, rows, "nll_pick_backward dy");
  check_ints(labels, rows, "nll_pick_backward labels");
  check_floats(dx, uint64_t(rows) * cols, "nll_pick_backward dx");
  check_no_alias("nll_pick_backward", dx, "dx", {{&dy, "dy"}, {&labels, "labels"}});
  Device& dev = r.device();
  const uint64_t per = rows_per_block(dev, cols, "nll_pick_backward");
  const Kernel& k = gather_kernel(dev, "nll_pick_backward", {emb::src, emb::idx, emb::dst, emb::gp});
  for (uint64_t r0 = 0; r0 < rows; r0 += per) {
    const uint64_t rc = std::min<uint64_t>(per, rows - r0);
    const Bound lb = bind_span(dev, labels, r0, rc);
    const Bound xb = bind_span(dev, dx, r0 * cols, rc * cols);
    GatherParams p;
    p.rows = uint32_t(rc);
    p.cols = cols;
    p.idx_off = lb.off;  // dy shares it
    p.dst_off = xb.off;
    p.ignore_index = ignore_index;
    p.beta = beta;
    auto [gx, gy] = grid_1d(dev, ceil_div(rc * cols, emb::WG));
    r.dispatch(k, {{emb::src, bind_span(dev, dy, r0, rc).range}, {emb::idx, lb.range}, {emb::dst, xb.range}}, p, gx,
               gy);
  }
}

}  // namespace pwt
