// Dropout launchers (dropout.wgsl): rng_take hands a call its key from the
// device's RNG state (on the GPU, so replayed step graphs draw new masks), and
// the dropout kernel applies mask * 1 / (1 - p) recomputed from that key.
#include <cmath>
#include <string>

#include "dispatch_util.hpp"
#include "ops.hpp"

namespace pwt {
namespace {

struct DropParams {  // dropout.wgsl
  uint32_t n, first_lo, first_hi, threshold;
  float scale, beta;
  uint32_t pad0, pad1;
};
static_assert(sizeof(DropParams) == 32, "dropout.wgsl DropParams is 32 bytes");

const Kernel& drop_kernel(Device& dev, const char* entry) {
  KernelDesc d;
  d.shader = "dropout";
  d.entry = entry;
  if (std::string(entry) == "rng_take")
    d.bindings = {{4, Bind::ReadWrite}, {5, Bind::ReadWrite}};
  else
    d.bindings = {{0, Bind::ReadOnly}, {1, Bind::ReadOnly}, {2, Bind::ReadWrite}, {3, Bind::Uniform}};
  return dev.pipelines().get(d);
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
  // (const void*, size_t): the untemplated overload, no uniform block (a bare nullptr would pick the template)
  r.dispatch(drop_kernel(r.device(), "rng_take"), {whole(state), whole(key)}, static_cast<const void*>(nullptr),
             size_t(0), 1u);
}

uint32_t dropout_threshold(double p) {
  if (!(p >= 0.0 && p < 1.0)) throw ArgumentError("dropout: p must lie in [0, 1), got " + std::to_string(p));
  const double t = std::nearbyint(p * 4294967296.0);
  return t >= 4294967295.0 ? 4294967295u : uint32_t(t);
}

void dropout(Recorder& r, const Buffer& x, const Buffer& key, const Buffer& y, uint64_t n, double p, float beta) {
  const uint32_t threshold = dropout_threshold(p);
  if (n == 0) throw ArgumentError("dropout: n must be >= 1");
  check_floats(x, n, "dropout input x");
  check_floats(y, n, "dropout output y");
  check_words(key, "dropout key");
  if (y.raw() == x.raw() || y.raw() == key.raw())
    throw ArgumentError(std::string("dropout: y shares a GPU buffer with ") + (y.raw() == x.raw() ? "x" : "key") +
                        " (in-place is not possible: a dispatch cannot read one buffer while writing it)");
  Device& dev = r.device();
  const Kernel& k = drop_kernel(dev, "dropout");
  const float scale = float(1.0 / (1.0 - p));
  for_each_piece(dev, n, [&](uint64_t first, uint64_t count) {
    DropParams prm{};
    prm.n = uint32_t(count);
    prm.first_lo = uint32_t(first);
    prm.first_hi = uint32_t(first >> 32);
    prm.threshold = threshold;
    prm.scale = scale;
    prm.beta = beta;
    const uint64_t threads = ceil_div((first & 3) + count, 4);
    auto [gx, gy] = grid_1d(dev, ceil_div(threads, 256));
    r.dispatch(k, {floats(x, first, count), whole(key), floats(y, first, count)}, prm, gx, gy);
  });
}

}  // namespace pwt
