// Backward pieces of a linear layer that are not GEMMs.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

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
  namespace sh = wgsl::linear;
  // Both passes read `upstream` and write `result`; ACT is unused (activations.wgsl needs it set).
  static const PipelineCache::EntryBindings table = {{"bias_grad", {sh::upstream, sh::result, sh::cp}},
                                                     {"colsum_partial", {sh::upstream, sh::result, sh::cp}}};
  auto kernel = [&](const char* entry) -> const Kernel& {
    return dev.pipelines().get("linear", entry, table, {{"ACT", "0u"}});
  };
  const uint32_t col_groups = uint32_t(ceil_div(cols, sh::COLS));
  const uint32_t part_col_groups = uint32_t(ceil_div(cols, sh::PART_COLS));
  // Row blocks that fit one binding and keep each lane's loop bounded
  // (kMaxColumnSumRows, dispatch_util.hpp); later blocks accumulate.
  const uint64_t rows_per = std::min(rows_per_piece(dev, cols), kMaxColumnSumRows);
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
      r.dispatch(kernel("colsum_partial"), {{sh::upstream, floats(dz, r0 * cols, rc * cols)}, {sh::result, parts}}, p,
                 part_col_groups, uint32_t(used));
      ColParams q;
      q.rows = uint32_t(used);
      q.cols = cols;
      q.beta = b;
      r.dispatch(kernel("bias_grad"), {{sh::upstream, parts}, {sh::result, whole(db)}}, q, col_groups);
      continue;
    }
    ColParams p;
    p.rows = uint32_t(rc);
    p.cols = cols;
    p.beta = b;
    r.dispatch(kernel("bias_grad"), {{sh::upstream, floats(dz, r0 * cols, rc * cols)}, {sh::result, whole(db)}}, p,
               col_groups);
  }
}

}  // namespace pwt
