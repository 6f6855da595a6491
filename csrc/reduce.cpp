// Two-pass reductions (reduce.wgsl) shared by the norm and loss launchers.
#include <string>

#include "dispatch_util.hpp"
#include "ops.hpp"

namespace pwt {
namespace {

const Kernel& reduce_kernel(Device& dev, const char* entry, bool square) {
  KernelDesc d;
  d.shader = "reduce";
  d.entry = entry;
  const std::string e = entry;
  if (e == "partial_sum4") d.bindings = {{4, Bind::ReadOnly}, {1, Bind::ReadWrite}, {2, Bind::Uniform}};
  else if (e == "partial_sum") d.bindings = {{0, Bind::ReadOnly}, {1, Bind::ReadWrite}, {2, Bind::Uniform}};
  else d.bindings = {{0, Bind::ReadOnly}, {1, Bind::ReadWrite}, {3, Bind::Uniform}};
  d.constants = {{"SQUARE", square ? "true" : "false"}};
  return dev.pipelines().get(d);
}

}  // namespace

// Sums (or sums of squares) of consecutive pieces of `src` into scratch, from
// scratch[offset] on; returns the new offset.
uint64_t record_partials(Recorder& r, const Buffer& src, uint64_t n, bool square, const Buffer& scratch, uint64_t offset) {
  Device& dev = r.device();
  for_each_piece(dev, n, [&](uint64_t first, uint64_t count) {
    const uint64_t groups = ceil_div(count, kReduceGroup);
    struct { uint32_t n, out_off; } p{uint32_t(count), uint32_t(offset)};
    auto [gx, gy] = grid_1d(dev, groups);
    // Pieces start at aligned offsets, so whole vec4s whenever the count allows.
    const Kernel& k = reduce_kernel(dev, count % 4 ? "partial_sum" : "partial_sum4", square);
    r.dispatch(k, {floats(src, first, count), whole(scratch)}, p, gx, gy);
    offset += groups;
  });
  return offset;
}

void record_finalize(Recorder& r, const char* entry, const Buffer& scratch, uint64_t partials, const Buffer& out,
                     uint32_t out_index, float scale, float max_norm) {
  struct { uint32_t count, out_off; float scale, max_norm; } p{uint32_t(partials), out_index, scale, max_norm};
  r.dispatch(reduce_kernel(r.device(), entry, false), {whole(scratch), whole(out)}, p, 1);
}

}  // namespace pwt
