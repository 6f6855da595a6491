// Two-pass reductions (reduce.wgsl) shared by the norm and loss launchers.
#include <string>

#include "dispatch_util.hpp"
#include "ops.hpp"

namespace pwt {
namespace {

const Kernel& reduce_kernel(Device& dev, const char* entry, bool square) {
  namespace sh = wgsl::reduce;
  static const PipelineCache::EntryBindings table = {{"partial_sum4", {sh::src4, sh::dst, sh::pp}},
                                                     {"partial_sum", {sh::src, sh::dst, sh::pp}},
                                                     {"finalize_norm", {sh::src, sh::dst, sh::fp}}};
  return dev.pipelines().get("reduce", entry, table, {{"SQUARE", square ? "true" : "false"}});
}

}  // namespace

// Sums (or sums of squares) of consecutive pieces of `src` into scratch, from
// scratch[offset] on; returns the new offset.
uint64_t record_partials(Recorder& r, const Buffer& src, uint64_t n, bool square, const Buffer& scratch,
                         uint64_t offset) {
  Device& dev = r.device();
  for_each_piece(dev, n, [&](uint64_t first, uint64_t count) {
    const uint64_t groups = ceil_div(count, kReduceGroup);
    ReducePartialParams p;
    p.n = uint32_t(count);
    p.out_off = uint32_t(offset);
    auto [gx, gy] = grid_1d(dev, groups);
    // Pieces start at aligned offsets, so whole vec4s whenever the count allows.
    const bool vec4 = count % 4 == 0;
    const Kernel& k = reduce_kernel(dev, vec4 ? "partial_sum4" : "partial_sum", square);
    r.dispatch(k,
               {{vec4 ? wgsl::reduce::src4 : wgsl::reduce::src, floats(src, first, count)},
                {wgsl::reduce::dst, whole(scratch)}},
               p, gx, gy);
    offset += groups;
  });
  return offset;
}

void record_finalize(Recorder& r, const char* entry, const Buffer& scratch, uint64_t partials, const Buffer& out,
                     uint32_t out_index, float scale, float max_norm) {
  ReduceFinalParams p;
  p.count = uint32_t(partials);
  p.out_off = out_index;
  p.scale = scale;
  p.max_norm = max_norm;
  r.dispatch(reduce_kernel(r.device(), entry, false),
             {{wgsl::reduce::src, whole(scratch)}, {wgsl::reduce::dst, whole(out)}}, p, 1);
}

}  // namespace pwt
