// Fused LayerNorm launchers (layernorm.wgsl): the forward saves mean and rstd
// per row; the backward writes dx and per-slot partial sums of dy * xhat and
// dy, which a column pass reduces into dweight / dbias in a fixed order
// (deterministic, no atomics). Operands past one storage binding run in row
// blocks; later blocks accumulate into dweight / dbias. x and dx may hold
// float16 (the alias XT); y, dy, the statistics and the math stay float32.
#include <algorithm>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>

#include "dispatch_util.hpp"
#include "ops.hpp"

namespace pwt {
namespace {

namespace sh = wgsl::layernorm;
constexpr uint32_t kHasW = sh::HAS_W, kHasB = sh::HAS_B, kWantDx = sh::WANT_DX, kWantParts = sh::WANT_PARTS,
                   kWantDw = sh::WANT_DW, kWantDb = sh::WANT_DB;  // LnParams.flags
constexpr uint32_t kGroup = sh::WG;
constexpr uint64_t kMaxTrips = 32768;      // lavapipe leaves any loop after 65535 trips (inner trips add up)
constexpr uint64_t kMaxCols = 256 * 8192;  // the forward's three passes: 3 * 8192 trips per thread
constexpr uint64_t kTargetParts = 1024;    // partial rows per block the column pass sums

// half: x and dx hold float16 (the alias XT).
const Kernel& ln_kernel(Device& dev, const char* entry, bool half) {
  static const PipelineCache::EntryBindings table = {
      {"ln_forward", {sh::x, sh::weight, sh::bias, sh::y, sh::mean_out, sh::rstd_out, sh::lp}},
      {"ln_backward", {sh::x, sh::weight, sh::lp, sh::dy, sh::mean_in, sh::rstd_in, sh::dx, sh::parts}},
      {"ln_param_grads", {sh::lp, sh::parts_in, sh::dweight, sh::dbias}}};
  return dev.pipelines().get("layernorm", entry, table, {{"HALF", half ? "true" : "false"}},
                             {{"XT", half ? "f16" : "f32"}});
}

// Threads per row: the smallest power of two >= cols / cols_per_thread, at
// most a workgroup. The forward takes several rows per workgroup with ~16
// elements per thread: a whole 256-thread workgroup per 384-wide row spent
// its time in the tree reductions' barriers (H100, 16384 x 384: 82 -> 40 us).
// The backward keeps one element per thread (cols_per_thread 1): its partial
// rows are per row slot, so more slots per workgroup meant fewer workgroups
// for the same partial rows (the same change made it 85 -> 258 us).
constexpr uint32_t kForwardColsPerThread = 16;
uint32_t threads_per_row(uint32_t cols, uint32_t cols_per_thread) {
  uint32_t t = 1;
  while (uint64_t(t) * cols_per_thread < cols && t < kGroup) t <<= 1;
  return t;
}

uint32_t log2u(uint32_t v) {
  uint32_t l = 0;
  while (v > 1) v >>= 1, ++l;
  return l;
}

void check_dims(const Device& dev, const std::string& fn, uint32_t rows, uint32_t cols) {
  if (rows == 0 || cols == 0)
    throw ArgumentError(fn + ": rows and cols must be >= 1, got " + std::to_string(rows) + " x " +
                        std::to_string(cols));
  if (cols > kMaxCols)
    throw ArgumentError(fn + ": rows of " + std::to_string(cols) + " elements exceed the supported " +
                        std::to_string(kMaxCols) + " (one workgroup per row)");
  if (cols > span_limit(dev))
    throw ArgumentError(fn + ": a row of " + std::to_string(cols) + " elements exceeds one storage binding");
}

// Each operand present holds at least its count of elements of `size` bytes ("<fn> <what> holds ...").
struct Sized {
  const Buffer* buffer;
  uint64_t count;
  const char* what;
  uint64_t size = 4;
};
void check_sizes(const std::string& fn, std::initializer_list<Sized> operands) {
  for (const Sized& o : operands)
    if (o.buffer) check_elements(*o.buffer, o.count, o.size, (fn + " " + o.what).c_str());
}

}  // namespace

void layer_norm_forward(Recorder& r, const Buffer& x, const Buffer* weight, const Buffer* bias, const Buffer& y,
                        const Buffer& mean, const Buffer& rstd, uint32_t rows, uint32_t cols, float eps, bool half) {
  Device& dev = r.device();
  const std::string fn = "layer_norm_forward";
  check_dims(dev, fn, rows, cols);
  if (!(eps >= 0.0f) || eps > 3.4e38f) throw ArgumentError(fn + ": eps must be finite and >= 0");
  const uint64_t n = uint64_t(rows) * cols;
  const uint64_t xs = elem_bytes(half);
  check_sizes("layer_norm", {{&x, n, "input x", xs},
                             {&y, n, "output y"},
                             {&mean, rows, "mean"},
                             {&rstd, rows, "rstd"},
                             {weight, cols, "weight"},
                             {bias, cols, "bias"}});
  for (auto [out, name] : {std::pair{&y, "y"}, {&mean, "mean"}, {&rstd, "rstd"}})
    check_no_alias(fn, *out, name, {{&x, "x"}, {weight, "weight"}, {bias, "bias"}});
  const uint32_t t = threads_per_row(cols, kForwardColsPerThread);
  const uint32_t rpw = kGroup / t;
  const uint32_t flags = (weight ? kHasW : 0) | (bias ? kHasB : 0);
  const Kernel& k = ln_kernel(dev, "ln_forward", half);
  const uint64_t per = span_limit(dev) / cols;
  for (uint64_t r0 = 0; r0 < rows; r0 += per) {
    const uint64_t rc = std::min<uint64_t>(per, rows - r0);
    const Bound xb = bind_span(dev, x, r0 * cols, rc * cols, xs);
    const Bound yb = bind_span(dev, y, r0 * cols, rc * cols);
    const Bound mb = bind_span(dev, mean, r0, rc);
    LnParams p;
    p.rows = uint32_t(rc);
    p.cols = cols;
    p.x_off = xb.off;
    p.y_off = yb.off;
    p.s_off = mb.off;  // rstd shares it: same first element, aligned bases
    p.tpr = t;
    p.seg_rows = 1;
    p.flags = flags;
    p.eps = eps;
    auto [gx, gy] = grid_1d(dev, ceil_div(rc, rpw));
    r.dispatch(k,
               {{sh::x, xb.range},
                {sh::weight, weight ? whole(*weight) : xb.range},
                {sh::bias, bias ? whole(*bias) : xb.range},
                {sh::y, yb.range},
                {sh::mean_out, mb.range},
                {sh::rstd_out, bind_span(dev, rstd, r0, rc).range}},
               p, gx, gy);
  }
}

void layer_norm_backward(Recorder& r, const Buffer& x, const Buffer* weight, const Buffer& mean, const Buffer& rstd,
                         const Buffer& dy, const Buffer* dx, const Buffer* dweight, const Buffer* dbias, uint32_t rows,
                         uint32_t cols, float beta, float beta_weight, float beta_bias, bool half) {
  Device& dev = r.device();
  const std::string fn = "layer_norm_backward";
  check_dims(dev, fn, rows, cols);
  if (!dx && !dweight && !dbias)
    throw ArgumentError(fn + ": no gradient requested (dx, dweight and dbias are all None)");
  if (dweight && !weight) throw ArgumentError(fn + ": dweight needs the weight (the forward had none)");
  const uint64_t n = uint64_t(rows) * cols;
  const uint64_t xs = elem_bytes(half);
  check_sizes(fn, {{&x, n, "input x", xs},
                   {&dy, n, "dy"},
                   {&mean, rows, "mean"},
                   {&rstd, rows, "rstd"},
                   {weight, cols, "weight"},
                   {dx, n, "dx", xs}});
  if (dx) {
    check_no_alias(fn, *dx, "dx", {{&x, "x"}, {&dy, "dy"}, {weight, "weight"}, {&mean, "mean"}, {&rstd, "rstd"}});
  }
  if (dweight) check_floats(*dweight, cols, "layer_norm_backward dweight");
  if (dbias) check_floats(*dbias, cols, "layer_norm_backward dbias");

  const uint32_t t = threads_per_row(cols, 1);
  const uint64_t rpw = kGroup / t;
  const bool want_parts = dweight || dbias;
  const uint64_t limit = span_limit(dev);
  // Rows one row slot walks: its dx passes (2 per row) and sums must stay within the trip limit.
  const uint64_t row_trips = 2 * ceil_div(cols, t) + 2 * log2u(t) + 4;
  const uint64_t kmax = std::max<uint64_t>(1, kMaxTrips / row_trips);
  // Partial rows per block: about kTargetParts, all [2][parts][cols] within one binding.
  const uint64_t by_binding = want_parts ? limit / (2 * uint64_t(cols)) : kTargetParts;
  const uint64_t cap = std::min(kTargetParts, by_binding);
  if (cap < 2 * rpw)
    throw ArgumentError(fn + ": rows of " + std::to_string(cols) + " elements leave no room for the partial sums");
  const uint64_t pcap = cap / rpw * rpw - rpw;  // a block's partial rows stay <= pcap + rpw <= cap
  const uint64_t per = std::min(limit / cols, kmax * pcap);

  auto plan = [&](uint64_t rc) {  // (rows per slot, workgroups) of a block of rc rows
    const uint64_t seg = std::min(kmax, ceil_div(rc, pcap));
    return std::pair{seg, ceil_div(rc, seg * rpw)};
  };
  const uint64_t max_parts = plan(std::min<uint64_t>(per, rows)).second * rpw;
  if (max_parts > cap) throw std::logic_error(fn + ": partial rows exceed their cap");
  // Scratch for the partial sums (wgpu keeps it alive for the encoder, a captured graph references it);
  // a small stand-in for whichever writable binding has no buffer.
  std::unique_ptr<Buffer> scratch, dummy;
  if (want_parts) scratch = std::make_unique<Buffer>(r.device_ptr(), 2 * max_parts * cols * 4, "pywgtrain.ln_partials");
  if (!dx || !want_parts || !dweight || !dbias)
    dummy = std::make_unique<Buffer>(r.device_ptr(), 16, "pywgtrain.ln_unused");

  uint32_t flags = (weight ? kHasW : 0) | (dx ? kWantDx : 0) | (want_parts ? kWantParts : 0) | (dweight ? kWantDw : 0) |
                   (dbias ? kWantDb : 0);
  const Kernel& bk = ln_kernel(dev, "ln_backward", half);
  const Kernel& gk = ln_kernel(dev, "ln_param_grads", false);
  for (uint64_t r0 = 0; r0 < rows; r0 += per) {
    const uint64_t rc = std::min<uint64_t>(per, rows - r0);
    const auto [seg, groups] = plan(rc);
    const uint64_t parts = groups * rpw;
    const Bound xb = bind_span(dev, x, r0 * cols, rc * cols, xs);
    const Bound yb = bind_span(dev, dy, r0 * cols, rc * cols);
    const Bound mb = bind_span(dev, mean, r0, rc);
    LnParams p;
    p.rows = uint32_t(rc);
    p.cols = cols;
    p.x_off = xb.off;  // dx shares it: same first element and element size, aligned bases
    p.y_off = yb.off;
    p.s_off = mb.off;  // rstd shares it
    p.tpr = t;
    p.seg_rows = uint32_t(seg);
    p.flags = flags;
    p.beta = beta;
    p.beta_w = r0 == 0 ? beta_weight : 1.0f;  // later blocks add to the earlier ones
    p.beta_b = r0 == 0 ? beta_bias : 1.0f;
    p.parts = uint32_t(parts);
    const Range parts_range = want_parts ? floats(*scratch, 0, 2 * parts * cols) : whole(*dummy);
    auto [gx, gy] = grid_1d(dev, groups);
    r.dispatch(bk,
               {{sh::x, xb.range},
                {sh::weight, weight ? whole(*weight) : xb.range},
                {sh::dy, yb.range},
                {sh::mean_in, mb.range},
                {sh::rstd_in, bind_span(dev, rstd, r0, rc).range},
                {sh::dx, dx ? bind_span(dev, *dx, r0 * cols, rc * cols, xs).range : whole(*dummy)},
                {sh::parts, parts_range}},
               p, gx, gy);
    if (want_parts) {
      auto [cx, cy] = grid_1d(dev, ceil_div(cols, sh::COLS));
      r.dispatch(gk,
                 {{sh::parts_in, parts_range},
                  {sh::dweight, dweight ? whole(*dweight) : whole(*dummy)},
                  {sh::dbias, dbias ? whole(*dbias) : whole(*dummy)}},
                 p, cx, cy);
    }
  }
}

}  // namespace pwt
