// Dropout launchers (dropout.wgsl): rng_take hands a call its key from the
// device's RNG state (on the GPU, so replayed step graphs draw new masks), and
// the dropout kernel applies mask * 1 / (1 - p) recomputed from that key.
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "dispatch_util.hpp"
#include "ops.hpp"

namespace pwt {
namespace {

namespace sh = wgsl::dropout;

const Kernel& drop_kernel(Device& dev, const char* entry, bool half = false) {
  static const PipelineCache::EntryBindings table = {{"rng_take", {sh::state, sh::key_out}},
                                                     {"dropout", {sh::src, sh::key, sh::dst, sh::dp}}};
  // (the file declares src and dst for every entry: the alias is emitted for each)
  return dev.pipelines().get("dropout", entry, table, {{"HALF", half ? "true" : "false"}},
                             {{"ET", half ? "f16" : "f32"}});
}

void check_words(const Buffer& b, const char* what) {
  if (b.bytes() < 16)
    throw ArgumentError(std::string(what) + " holds " + std::to_string(b.bytes()) + " bytes, needs 16 (4 uint32)");
}

}  // namespace

void rng_take(Recorder& r, const Buffer& state, const Buffer& key) {
  check_words(state, "rng_take state");
  check_words(key, "rng_take key");
  if (state.raw() == key.raw()) throw ArgumentError("rng_take: key shares a GPU buffer with state");
  r.dispatch(drop_kernel(r.device(), "rng_take"), {{sh::state, whole(state)}, {sh::key_out, whole(key)}}, 1);
}

uint32_t dropout_threshold(double p) {
  if (!(p >= 0.0 && p < 1.0)) throw ArgumentError("dropout: p must lie in [0, 1), got " + std::to_string(p));
  const double t = std::nearbyint(p * 4294967296.0);
  return t >= 4294967295.0 ? 4294967295u : uint32_t(t);
}

void dropout(Recorder& r, const Buffer& x, const Buffer& key, const Buffer& y, uint64_t n, double p, float beta,
             bool half) {
  const uint32_t threshold = dropout_threshold(p);
  if (n == 0) throw ArgumentError("dropout: n must be >= 1");
  const uint64_t size = half ? 2 : 4;
  for (auto [b, what] : {std::pair{&x, "dropout input x"}, {&y, "dropout output y"}})
    if (b->bytes() < n * size)
      throw ArgumentError(std::string(what) + " holds " + std::to_string(b->bytes() / size) +
                          (half ? " float16" : " float32") + " values, needs " + std::to_string(n));
  check_words(key, "dropout key");
  if (y.raw() == x.raw() || y.raw() == key.raw())
    throw ArgumentError(std::string("dropout: y shares a GPU buffer with ") + (y.raw() == x.raw() ? "x" : "key") +
                        " (in-place is not possible: a dispatch cannot read one buffer while writing it)");
  Device& dev = r.device();
  const Kernel& k = drop_kernel(dev, "dropout", half);
  const float scale = float(1.0 / (1.0 - p));
  // Pieces start where 2-byte and 4-byte offsets are both aligned.
  const uint64_t step = 2 * align_floats(dev);
  const uint64_t piece = max_piece_floats(dev) / step * step;
  for (uint64_t first = 0; first < n; first += piece) {
    const uint64_t count = std::min(piece, n - first);
    DropParams prm;
    prm.n = uint32_t(count);
    prm.first_lo = uint32_t(first);
    prm.first_hi = uint32_t(first >> 32);
    prm.threshold = threshold;
    prm.scale = scale;
    prm.beta = beta;
    const uint64_t threads = ceil_div((first & 3) + count, 4);
    auto [gx, gy] = grid_1d(dev, ceil_div(threads, sh::WG));
    r.dispatch(
        k,
        {{sh::src, elements(x, first, count, size)}, {sh::key, whole(key)}, {sh::dst, elements(y, first, count, size)}},
        prm, gx, gy);
  }
}

}  // namespace pwt
