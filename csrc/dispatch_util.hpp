// Helpers shared by the launchers: 1-D grids that respect the per-dimension
// workgroup limit, and splitting of long vectors into bindable pieces.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <numeric>
#include <string>
#include <utility>

#include "recorder.hpp"

namespace pwt {

inline uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

// Bounded loops. No invocation loops over an unbounded count, for two reasons:
// (1) Mesa's lavapipe (llvmpipe, the CI device) ends a shader's loops silently
// once one invocation has run 65535 loop iterations in total, over all its
// loops (gallivm's loop limiter, LP_MAX_TGSI_LOOP_ITERATIONS): a GEMM
// workgroup looping over K = 2^21 in K tiles of 16 (131072 iterations) summed
// only the first 65536 tiles and returned half the product, with no error;
// (2) one f32 running sum over millions of terms loses precision (adding 1.0
// stalls at 2^24). So a workgroup's K loop covers at most kMaxKPerSplit
// elements in one dispatch (GEMM: 2048 K tiles; GEMV: <= 1024 iterations per
// lane); longer K runs as split-K partials in the workspace, at most
// kMaxSplits of them per pass (the reduce sums them in one loop), and K beyond
// kMaxSplits * kMaxKPerSplit runs as several passes accumulated into the
// output with beta = 1. Products with K <= kMaxKPerSplit are unaffected.
constexpr uint64_t kMaxKPerSplit = 32768;
constexpr uint64_t kMaxSplits = 1024;
constexpr uint64_t kMaxKPerPass = kMaxKPerSplit * kMaxSplits;
// Rows one column-sum dispatch (linear.wgsl bias_grad: rows / 128 iterations
// per lane) covers; more rows accumulate over dispatches with beta = 1.
constexpr uint64_t kMaxColumnSumRows = uint64_t(1) << 20;
// Classes per row of softmax_xent (one 64-lane workgroup per row, three loops
// of classes / 64 iterations each must stay below lavapipe's 65535).
constexpr uint64_t kMaxClasses = uint64_t(1) << 20;

// Longest rows that softmax, log_softmax and cross-entropy run a thread per row
// (their *_short entries) instead of a workgroup per row. On GPUs a workgroup
// per row leaves most threads idle on short rows; on CPU adapters (lavapipe)
// each workgroup's barrier trees cost ~0.2 ms, so a row per SIMD lane wins at
// every length measured (500k rows of 8: 78 s -> 0.2 s; 15625 rows of 256:
// 2.7 s -> 0.2 s), and 1024 keeps a thread's three passes far below the 65,535
// loop trips lavapipe allows.
inline uint32_t short_row_cols(const Device& dev) { return dev.info().adapter_type == "cpu" ? 1024 : 64; }

// (x, y) workgroup counts covering `groups` groups; shaders linearize y*nx + x.
inline std::pair<uint32_t, uint32_t> grid_1d(const Device& dev, uint64_t groups) {
  const uint64_t cap = dev.limits().max_workgroups_per_dim;
  if (groups <= cap) return {uint32_t(groups), 1u};
  const uint64_t y = ceil_div(groups, cap);
  return {uint32_t(ceil_div(groups, y)), uint32_t(y)};
}

// Largest element count of an f32 vector piece that fits one storage binding
// and keeps every piece offset a multiple of the binding offset alignment.
inline uint64_t max_piece_floats(const Device& dev) {
  const uint64_t align = std::max<uint32_t>(dev.limits().storage_offset_alignment, 4) / 4;
  const uint64_t by_binding = dev.limits().max_storage_binding / 4;
  const uint64_t by_grid = uint64_t(dev.limits().max_workgroups_per_dim) * 256 * 1024;
  return std::min(by_binding, by_grid) / align * align;
}

// Calls fn(first, count) over consecutive pieces of [0, n), elements of
// `elem` bytes (4 or 2: every piece still starts at an aligned byte offset).
inline void for_each_piece(const Device& dev, uint64_t n, const std::function<void(uint64_t, uint64_t)>& fn,
                           uint64_t elem = 4) {
  const uint64_t step = std::max<uint32_t>(dev.limits().storage_offset_alignment, 4) / elem;
  const uint64_t piece = max_piece_floats(dev) / step * step;
  for (uint64_t first = 0; first < n; first += piece) fn(first, std::min(piece, n - first));
}

// Elements [first, first + count) of `size` bytes each, bound as whole 4-byte words.
inline Range elements(const Buffer& b, uint64_t first, uint64_t count, uint64_t size) {
  return Range{b.raw(), b.offset() + first * size, (std::max<uint64_t>(count, 1) * size + 3) & ~uint64_t(3)};
}
inline Range floats(const Buffer& b, uint64_t first, uint64_t count) { return elements(b, first, count, 4); }

inline uint64_t align_floats(const Device& dev) {
  return std::max<uint32_t>(dev.limits().storage_offset_alignment, 4) / 4;
}

// Longest run of elements a block may bind for one operand, starting anywhere
// (leaves room for the slack below an unaligned first element).
inline uint64_t span_limit(const Device& dev) { return max_piece_floats(dev) - align_floats(dev); }

// One dispatch cannot bind a buffer read-only and writable: refuse an output
// sharing a GPU buffer with any of the inputs (null inputs are skipped).
inline void check_no_alias(const std::string& fn, const Buffer& out, const char* out_name,
                           std::initializer_list<std::pair<const Buffer*, const char*>> inputs) {
  for (const auto& [in, name] : inputs)
    if (in && in->raw() == out.raw())
      throw ArgumentError(fn + ": " + out_name + " shares a GPU buffer with " + name +
                          " (in-place is not possible: a dispatch cannot read one buffer while writing it)");
}

// A binding range and the index of the wanted first element inside it.
struct Bound {
  Range range;
  uint32_t off;
};

// Elements [first, first + count) of b (`size` bytes each), bound from the aligned element at or
// below `first` (binding offsets must be aligned; kernels add `off`).
inline Bound bind_span(const Device& dev, const Buffer& b, uint64_t first, uint64_t count, uint64_t size = 4) {
  const uint64_t al = align_floats(dev) * 4 / size;
  const uint64_t base = first / al * al;
  return {elements(b, base, first - base + count, size), uint32_t(first - base)};
}

// Rows per piece of a [rows, cols] matrix such that a piece fits one binding
// and every piece starts at an aligned offset.
inline uint64_t rows_per_piece(const Device& dev, uint64_t cols) {
  const uint64_t align = std::max<uint32_t>(dev.limits().storage_offset_alignment, 4) / 4;
  const uint64_t step = align / std::gcd(cols, align);
  const uint64_t rows = max_piece_floats(dev) / cols / step * step;
  if (rows == 0) throw ArgumentError("a row of " + std::to_string(cols) + " floats exceeds one storage binding");
  return rows;
}

void check_floats(const Buffer& b, uint64_t count, const char* what);
// check_floats for elements of `size` bytes: 4 (float32) or 2 (float16).
void check_elements(const Buffer& b, uint64_t count, uint64_t size, const char* what);
inline uint64_t elem_bytes(bool half) { return half ? 2 : 4; }
void check_ints(const Buffer& b, uint64_t count, const char* what);

constexpr uint64_t kReduceGroup = wgsl::reduce::WG * wgsl::reduce::ITEMS;  // elements per partial_sum workgroup
// Partial sums (of squares) of src's pieces into scratch from `offset`; returns the next offset.
uint64_t record_partials(Recorder& r, const Buffer& src, uint64_t n, bool square, const Buffer& scratch,
                         uint64_t offset);
// One-workgroup pass over `partials` values of scratch (reduce.wgsl finalize_norm).
void record_finalize(Recorder& r, const char* entry, const Buffer& scratch, uint64_t partials, const Buffer& out,
                     uint32_t out_index, float scale, float max_norm);

}  // namespace pwt
