// Backward pieces of a linear layer that are not GEMMs.
#include <algorithm>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "dispatch_util.hpp"
#include "ops.hpp"

namespace pwt {

namespace {

const char* elem_type(bool half) { return half ? "f16" : "f32"; }

// A linear.wgsl pipeline with its operand types: upstream (UT), pre-activation (PT), result (RT).
const Kernel& linear_kernel(Device& dev, const char* entry, std::vector<Slot> bindings, Activation act, bool half_up,
                            bool half_result) {
  KernelDesc d;
  d.shader = "linear";
  d.entry = entry;
  d.bindings = std::move(bindings);
  d.constants = {{"ACT", std::to_string(uint32_t(act)) + "u"}};
  d.aliases = {{"UT", elem_type(half_up)}, {"PT", elem_type(half_up)}, {"RT", elem_type(half_result)}};
  return dev.pipelines().get(d);
}

}  // namespace

void activation_backward(Recorder& r, const Buffer& dy, const Buffer& z, const Buffer& dz, uint64_t n, Activation act,
                         bool half) {
  for (auto* b : {&dy, &z, &dz}) check_elements(*b, n, elem_bytes(half), "activation_backward operand");
  Device& dev = r.device();
  namespace sh = wgsl::linear;
  const Kernel& k = linear_kernel(dev, "act_backward", {sh::upstream, sh::preact, sh::result, sh::ep}, act, half, half);
  const uint64_t el = half ? 2 : 4;
  for_each_piece(
      dev, n,
      [&](uint64_t first, uint64_t count) {
        EwParams p;
        p.n = uint32_t(count);
        p.cols = 1;
        auto [gx, gy] = grid_1d(dev, ceil_div(count, sh::WG));
        r.dispatch(k,
                   {{sh::upstream, elements(dy, first, count, el)},
                    {sh::preact, elements(z, first, count, el)},
                    {sh::result, elements(dz, first, count, el)}},
                   p, gx, gy);
      },
      el);
}

void bias_grad(Recorder& r, const Buffer& dz, const Buffer& db, uint32_t rows, uint32_t cols, float beta, bool half) {
  check_elements(dz, uint64_t(rows) * cols, elem_bytes(half), "bias_grad input");
  check_elements(db, cols, elem_bytes(half), "bias gradient");
  Device& dev = r.device();
  namespace sh = wgsl::linear;
  const uint64_t el = half ? 2 : 4;
  // Both passes read `upstream` and write `result` (ACT is unused; activations.wgsl needs it set).
  // The partial sums between them are float32.
  auto kernel = [&](const char* entry, bool half_up, bool half_result) -> const Kernel& {
    return linear_kernel(dev, entry, {sh::upstream, sh::result, sh::cp}, Activation::None, half_up, half_result);
  };
  const uint32_t col_groups = uint32_t(ceil_div(cols, sh::COLS));
  const uint32_t part_col_groups = uint32_t(ceil_div(cols, sh::PART_COLS));
  // Row blocks that fit one binding and keep each lane's loop bounded
  // (kMaxColumnSumRows, dispatch_util.hpp); later blocks accumulate.
  uint64_t rows_per = std::min(rows_per_piece(dev, cols), kMaxColumnSumRows);
  if (half) {  // float16 blocks start at aligned bytes too: twice the float32 row step
    const uint64_t step = 2 * align_floats(dev) / std::gcd<uint64_t>(cols, align_floats(dev));
    rows_per = rows_per / step * step;
    if (rows_per == 0)
      throw ArgumentError("bias_grad: a row of " + std::to_string(cols) + " values exceeds one binding");
  }
  for (uint64_t r0 = 0; r0 < rows; r0 += rows_per) {
    const uint64_t rc = std::min<uint64_t>(rows_per, rows - r0);
    const float b = r0 == 0 ? beta : 1.0f;
    // Many rows over few columns: partial sums over row blocks first (about
    // 1024 workgroups, >= 64 rows each), then the column pass over them.
    const uint64_t blocks = std::min<uint64_t>(ceil_div(1024, part_col_groups), rc / 64);
    if (blocks >= 4 && blocks * cols <= dev.limits().max_storage_binding / 4) {
      const uint64_t block_rows = ceil_div(rc, blocks), used = ceil_div(rc, block_rows);
      const Range parts{dev.workspace(used * cols * 4), 0, used * cols * 4};
      ColParams p;
      p.rows = uint32_t(rc);
      p.cols = cols;
      p.block_rows = uint32_t(block_rows);
      r.dispatch(kernel("colsum_partial", half, false),
                 {{sh::upstream, elements(dz, r0 * cols, rc * cols, el)}, {sh::result, parts}}, p, part_col_groups,
                 uint32_t(used));
      ColParams q;
      q.rows = uint32_t(used);
      q.cols = cols;
      q.beta = b;
      r.dispatch(kernel("bias_grad", false, half), {{sh::upstream, parts}, {sh::result, whole(db)}}, q, col_groups);
      continue;
    }
    ColParams p;
    p.rows = uint32_t(rc);
    p.cols = cols;
    p.beta = b;
    r.dispatch(kernel("bias_grad", half, half),
               {{sh::upstream, elements(dz, r0 * cols, rc * cols, el)}, {sh::result, whole(db)}}, p, col_groups);
  }
}

}  // namespace pwt
