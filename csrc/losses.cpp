// Loss launchers: per-row/per-element loss and gradient in one pass, then a
// mean through the shared reduction (one more dispatch for a batch of rows).
#include <string>

#include "dispatch_util.hpp"
#include "ops.hpp"

namespace pwt {

void softmax_cross_entropy(Recorder& r, const Buffer& logits, const Buffer& labels, const Buffer& dlogits,
                           const Buffer& row_losses, const Buffer& scratch, const Buffer& out, uint32_t out_index,
                           uint32_t rows, uint32_t cols) {
  if (rows == 0 || cols == 0) throw ArgumentError("cross_entropy: logits must have rows >= 1 and classes >= 1");
  if (cols > kMaxClasses)
    throw ArgumentError("cross_entropy: logits has " + std::to_string(cols) + " classes, more than the " +
                        std::to_string(kMaxClasses) + " one row's workgroup supports");
  const uint64_t total = uint64_t(rows) * cols;
  if (total * 4 > r.device().limits().max_storage_binding)
    throw ArgumentError("cross_entropy: logits of " + std::to_string(total * 4) + " bytes exceed one storage binding");
  check_floats(logits, total, "logits");
  check_floats(dlogits, total, "dlogits");
  if (labels.bytes() < uint64_t(rows) * 4) throw ArgumentError("cross_entropy: labels hold fewer than rows entries");
  check_floats(row_losses, rows, "row losses");
  check_floats(scratch, reduce_scratch_floats(rows), "loss scratch");
  check_floats(out, out_index + 1, "loss output");
  Device& dev = r.device();
  KernelDesc d;
  d.shader = "loss";
  d.entry = "softmax_xent";
  d.bindings = {{0, Bind::ReadOnly}, {1, Bind::ReadOnly}, {2, Bind::ReadWrite}, {3, Bind::ReadWrite}, {4, Bind::Uniform}};
  struct { uint32_t rows, cols; float grad_scale; uint32_t pad; } p{rows, cols, float(1.0 / rows), 0};
  auto [gx, gy] = grid_1d(dev, rows);
  r.dispatch(dev.pipelines().get(d), {whole(logits), whole(labels), whole(dlogits), whole(row_losses)}, p, gx, gy);
  record_scaled_sum(r, row_losses, rows, scratch, out, out_index, float(1.0 / rows));
}

void mse_loss(Recorder& r, const Buffer& pred, const Buffer& target, const Buffer& dpred, const Buffer& sq,
              const Buffer& scratch, const Buffer& out, uint32_t out_index, uint64_t n) {
  if (n == 0) throw ArgumentError("mse: empty prediction");
  if (n * 4 > r.device().limits().max_storage_binding)
    throw ArgumentError("mse: predictions of " + std::to_string(n * 4) + " bytes exceed one storage binding");
  for (auto* b : {&pred, &target, &dpred, &sq}) check_floats(*b, n, "mse operand");
  check_floats(scratch, reduce_scratch_floats(n), "loss scratch");
  check_floats(out, out_index + 1, "loss output");
  Device& dev = r.device();
  KernelDesc d;
  d.shader = "loss";
  d.entry = "mse";
  d.bindings = {{2, Bind::ReadWrite}, {3, Bind::ReadWrite}, {5, Bind::ReadOnly}, {6, Bind::ReadOnly}, {7, Bind::Uniform}};
  struct { uint32_t n; float grad_scale; } p{uint32_t(n), float(2.0 / double(n))};
  auto [gx, gy] = grid_1d(dev, ceil_div(n, 256));
  r.dispatch(dev.pipelines().get(d), {whole(dpred), whole(sq), whole(pred), whole(target)}, p, gx, gy);
  record_scaled_sum(r, sq, n, scratch, out, out_index, float(1.0 / double(n)));
}

}  // namespace pwt
