// float32 <-> float16 casts (cast.wgsl): one dispatch per piece that fits a
// storage binding, both operands bound from aligned element offsets.
#include <string>

#include "dispatch_util.hpp"
#include "ops.hpp"

namespace pwt {
namespace {

namespace sh = wgsl::cast;

}  // namespace

void cast(Recorder& r, const Buffer& src, const Buffer& dst, uint64_t n, bool to_half) {
  if (n == 0) throw ArgumentError("cast: n must be >= 1");
  const uint64_t src_size = to_half ? 4 : 2, dst_size = to_half ? 2 : 4;
  check_elements(src, n, src_size, "cast src");
  check_elements(dst, n, dst_size, "cast dst");
  check_no_alias("cast", dst, "dst", {{&src, "src"}});
  Device& dev = r.device();
  static const PipelineCache::EntryBindings table = {{"f32_to_f16", {sh::src, sh::dst, sh::cp}},
                                                     {"f16_to_f32", {sh::src, sh::dst, sh::cp}}};
  const Kernel& k = dev.pipelines().get("cast", to_half ? "f32_to_f16" : "f16_to_f32", table);
  // Pieces start where both the float32 and the float16 offsets are aligned.
  const uint64_t step = 2 * align_floats(dev);
  const uint64_t piece = max_piece_floats(dev) / step * step;
  for (uint64_t first = 0; first < n; first += piece) {
    const uint64_t count = std::min(piece, n - first);
    CastParams prm;
    prm.n = uint32_t(count);
    const uint64_t threads = to_half ? ceil_div(count, 2) : count;
    auto [gx, gy] = grid_1d(dev, ceil_div(threads, sh::WG));
    r.dispatch(k, {{sh::src, elements(src, first, count, src_size)}, {sh::dst, elements(dst, first, count, dst_size)}},
               prm, gx, gy);
  }
}

}  // namespace pwt
