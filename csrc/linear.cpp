// Backward pieces of a linear layer that are not GEMMs.
#include <algorithm>
#include <string>

#include "dispatch_util.hpp"
#include "ops.hpp"

namespace pwt {

void activation_backward(Recorder& r, const Buffer& dy, const Buffer& z, const Buffer& dz, uint64_t n, Activation act) {
  for (auto* b : {&dy, &z, &dz}) check_floats(*b, n, "activation_backward operand");
  Device& dev = r.device();
  KernelDesc d;
  d.shader = "linear";
  d.entry = "act_backward";
  namespace sh = wgsl::linear;
  d.bindings = {sh::upstream, sh::preact, sh::result, sh::ep};
  d.constants = {{"ACT", std::to_string(uint32_t(act)) + "u"}};
  const Kernel& k = dev.pipelines().get(d);
  for_each_piece(dev, n, [&](uint64_t first, uint64_t count) {
    EwParams p;
    p.n = uint32_t(count);
    p.cols = 1;
    auto [gx, gy] = grid_1d(dev, ceil_div(count, sh::WG));
    r.dispatch(k,
               {{sh::upstream, floats(dy, first, count)},
                {sh::preact, floats(z, first, count)},
                {sh::result, floats(dz, first, count)}},
               p, gx, gy);
  });
}

void bias_grad(Recorder& r, const Buffer& dz, const Buffer& db, uint32_t rows, uint32_t cols, float beta) {
  check_floats(dz, uint64_t(rows) * cols, "bias_grad input");
  check_floats(db, cols, "bias gradient");
  Device& dev = r.device();
  KernelDesc d;
  d.shader = "linear";
  d.entry = "bias_grad";
  namespace sh = wgsl::linear;
  d.bindings = {sh::upstream, sh::result, sh::cp};
  d.constants = {{"ACT", "0u"}};
  const Kernel& k = dev.pipelines().get(d);
  // Row blocks that fit one binding and keep each lane's loop bounded
  // (kMaxColumnSumRows, dispatch_util.hpp); later blocks accumulate.
  const uint64_t rows_per = std::min(rows_per_piece(dev, cols), kMaxColumnSumRows);
  for (uint64_t r0 = 0; r0 < rows; r0 += rows_per) {
    const uint64_t rc = std::min<uint64_t>(rows_per, rows - r0);
    ColParams p;
    p.rows = uint32_t(rc);
    p.cols = cols;
    p.beta = r0 == 0 ? beta : 1.0f;
    r.dispatch(k, {{sh::upstream, floats(dz, r0 * cols, rc * cols)}, {sh::result, whole(db)}}, p,
               uint32_t(ceil_div(cols, sh::COLS)));
  }
}

}  // namespace pwt
