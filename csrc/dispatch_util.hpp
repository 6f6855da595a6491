// Helpers shared by the launchers: 1-D grids that respect the per-dimension
// workgroup limit, and splitting of long vectors into bindable pieces.
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <numeric>
#include <string>
#include <utility>

#include "recorder.hpp"

namespace pwt {

inline uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

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

// Calls fn(first, count) over consecutive pieces of [0, n).
inline void for_each_piece(const Device& dev, uint64_t n, const std::function<void(uint64_t, uint64_t)>& fn) {
  const uint64_t piece = max_piece_floats(dev);
  for (uint64_t first = 0; first < n; first += piece) fn(first, std::min(piece, n - first));
}

inline Range floats(const Buffer& b, uint64_t first, uint64_t count) {
  return Range{b.raw(), b.offset() + first * 4, std::max<uint64_t>(count, 1) * 4};
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

constexpr uint64_t kReduceGroup = 256 * 16;  // elements per partial_sum workgroup (reduce.wgsl ITEMS)
// Partial sums (of squares) of src's pieces into scratch from `offset`; returns the next offset.
uint64_t record_partials(Recorder& r, const Buffer& src, uint64_t n, bool square, const Buffer& scratch, uint64_t offset);
// One-workgroup pass over `partials` values of scratch (reduce.wgsl finalize_norm).
void record_finalize(Recorder& r, const char* entry, const Buffer& scratch, uint64_t partials, const Buffer& out,
                     uint32_t out_index, float scale, float max_norm);

}  // namespace pwt
