// Fused softmax cross-entropy launchers (cross_entropy.wgsl): forward rows +
// finalize, and the backward that recomputes the softmax from the logits.
#include <string>

#include "dispatch_util.hpp"
#include "ops.hpp"

namespace pwt {
namespace {

namespace sh = wgsl::cross_entropy;

// half: the logits and their gradient hold float16 (the alias LT).
const Kernel& xent_kernel(Device& dev, const char* entry, bool half) {
  static const PipelineCache::EntryBindings table = {
      {"xent_forward", {sh::logits, sh::labels, sh::row_stats, sh::row_loss, sh::row_valid, sh::xp}},
      {"xent_forward_short", {sh::logits, sh::labels, sh::row_stats, sh::row_loss, sh::row_valid, sh::xp}},
      {"xent_finalize", {sh::fin_loss, sh::fin_valid, sh::fin_out, sh::fp, sh::fin_scale}},
      {"xent_backward", {sh::logits, sh::labels, sh::xp, sh::stats_in, sh::upstream, sh::scale_in, sh::dlogits}},
      {"xent_backward_short", {sh::logits, sh::labels, sh::xp, sh::stats_in, sh::upstream, sh::scale_in, sh::dlogits}}};
  return dev.pipelines().get("cross_entropy", entry, table, {{"HALF", half ? "true" : "false"}},
                             {{"LT", half ? "f16" : "f32"}});
}

// Each thread loops over cols / 256 classes two or three times per row; lavapipe cuts
// loops past 65,535 trips without an error, so rows stay well inside that.
constexpr uint32_t kMaxClasses = 1u << 20;
// Workgroups covering `rc` rows: one per row, or one per WG rows for short rows
// (the *_short entries, a thread per row: short_row_cols).
uint64_t row_groups(const Device& dev, uint32_t rc, uint32_t cols) {
  return cols <= short_row_cols(dev) ? ceil_div(rc, sh::WG) : rc;
}

void check_rows(const Device& dev, uint32_t rows, uint32_t cols, const Buffer& logits, const Buffer& labels,
                uint64_t size) {
  if (rows == 0 || cols == 0) throw ArgumentError("cross_entropy: logits must have rows >= 1 and classes >= 1");
  if (cols > kMaxClasses)
    throw ArgumentError("cross_entropy: " + std::to_string(cols) + " classes, more than the " +
                        std::to_string(kMaxClasses) + " one workgroup per row handles");
  check_elements(logits, uint64_t(rows) * cols, size, "cross_entropy logits");
  if (labels.bytes() < uint64_t(rows) * 4) throw ArgumentError("cross_entropy: labels hold fewer than rows entries");
  if (uint64_t(rows) * 8 > dev.limits().max_storage_binding)
    throw ArgumentError("cross_entropy: " + std::to_string(rows) +
                        " rows exceed one storage binding of their statistics (8 bytes per row)");
}

// Calls fn(row0, row count, first bound element (aligned), offset of row0 inside it) per block of bindable rows
// (elements of `size` bytes; the element count per binding is the float32 one either way).
template <typename Fn>
void for_each_row_block(const Device& dev, uint32_t rows, uint32_t cols, uint64_t size, Fn fn) {
  const uint64_t align = std::max<uint32_t>(dev.limits().storage_offset_alignment, 4) / size;
  const uint64_t cap = dev.limits().max_storage_binding / 4;
  if (cols + align > cap)
    throw ArgumentError("cross_entropy: a row of " + std::to_string(cols) + " logits exceeds one storage binding");
  const uint64_t per = std::min<uint64_t>((cap - align) / cols, uint64_t(dev.limits().max_workgroups_per_dim) * 65535);
  for (uint64_t r0 = 0; r0 < rows; r0 += per) {
    const uint64_t rc = std::min<uint64_t>(per, rows - r0);
    const uint64_t first = r0 * cols, start = first / align * align;
    fn(uint32_t(r0), uint32_t(rc), start, uint32_t(first - start));
  }
}

// The params of one row block [r0, r0 + rc) whose first logit is at `inner` of its binding.
XentParams block_params(uint32_t r0, uint32_t rc, uint32_t cols, uint32_t inner, int32_t ignore_index) {
  XentParams p;
  p.rows = rc;
  p.cols = cols;
  p.row0 = r0;
  p.x_off = inner;
  p.ignore_index = ignore_index;
  return p;
}

}  // namespace

void cross_entropy_forward(Recorder& r, const Buffer& logits, const Buffer& labels, const Buffer& row_stats,
                           const Buffer& row_loss, const Buffer& row_valid, const Buffer& out, const Buffer& scale,
                           uint32_t rows, uint32_t cols, int32_t ignore_index, bool mean, bool half) {
  Device& dev = r.device();
  const uint64_t size = half ? 2 : 4;
  check_rows(dev, rows, cols, logits, labels, size);
  check_floats(row_stats, 2 * uint64_t(rows), "cross_entropy row statistics (2 per row)");
  for (auto* b : {&row_loss, &row_valid}) check_floats(*b, rows, "cross_entropy row buffer");
  check_floats(out, 1, "cross_entropy output");
  check_floats(scale, 1, "cross_entropy gradient scale");
  const Kernel& fk = xent_kernel(dev, cols <= short_row_cols(dev) ? "xent_forward_short" : "xent_forward", half);
  for_each_row_block(dev, rows, cols, size, [&](uint32_t r0, uint32_t rc, uint64_t start, uint32_t inner) {
    XentParams p = block_params(r0, rc, cols, inner, ignore_index);
    auto [gx, gy] = grid_1d(dev, row_groups(dev, rc, cols));
    r.dispatch(fk,
               {{sh::logits, elements(logits, start, inner + uint64_t(rc) * cols, size)},
                {sh::labels, whole(labels)},
                {sh::row_stats, whole(row_stats)},
                {sh::row_loss, whole(row_loss)},
                {sh::row_valid, whole(row_valid)}},
               p, gx, gy);
  });
  XentFinalParams q;
  q.rows = rows;
  q.mean = mean ? 1u : 0u;
  r.dispatch(xent_kernel(dev, "xent_finalize", false),
             {{sh::fin_loss, whole(row_loss)},
              {sh::fin_valid, whole(row_valid)},
              {sh::fin_out, whole(out)},
              {sh::fin_scale, whole(scale)}},
             q, 1);
}

void cross_entropy_backward(Recorder& r, const Buffer& logits, const Buffer& labels, const Buffer& row_stats,
                            const Buffer& upstream, const Buffer& scale, const Buffer& dlogits, uint32_t rows,
                            uint32_t cols, int32_t ignore_index, bool per_row, float beta, bool half) {
  Device& dev = r.device();
  const uint64_t size = half ? 2 : 4;
  check_rows(dev, rows, cols, logits, labels, size);
  check_elements(dlogits, uint64_t(rows) * cols, size, "cross_entropy dlogits");
  check_floats(row_stats, 2 * uint64_t(rows), "cross_entropy row statistics (2 per row)");
  check_floats(upstream, per_row ? rows : 1, "cross_entropy upstream gradient");
  check_floats(scale, 1, "cross_entropy scale");
  const Kernel& bk = xent_kernel(dev, cols <= short_row_cols(dev) ? "xent_backward_short" : "xent_backward", half);
  for_each_row_block(dev, rows, cols, size, [&](uint32_t r0, uint32_t rc, uint64_t start, uint32_t inner) {
    XentParams p = block_params(r0, rc, cols, inner, ignore_index);
    p.per_row = per_row ? 1u : 0u;
    p.beta = beta;
    auto [gx, gy] = grid_1d(dev, row_groups(dev, rc, cols));
    const uint64_t count = inner + uint64_t(rc) * cols;
    r.dispatch(bk,
               {{sh::logits, elements(logits, start, count, size)},
                {sh::labels, whole(labels)},
                {sh::stats_in, whole(row_stats)},
                {sh::upstream, whole(upstream)},
                {sh::scale_in, whole(scale)},
                {sh::dlogits, elements(dlogits, start, count, size)}},
               p, gx, gy);
  });
}

}  // namespace pwt
