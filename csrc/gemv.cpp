// GEMV: one row times a matrix (gemv.wgsl), in pieces where the matrix
// exceeds one binding, split along K where few columns leave the GPU idle.
#include <algorithm>
#include <string>

#include "gemm_internal.hpp"

namespace pwt::gemm_detail {

namespace {

// gemv.wgsl's entry points: scalar loads (either layout of B), 128-bit
// column quads (B stored K x N), 128-bit rows of B and x (B stored N x K).
enum class GemvForm { Scalar, Columns4, Rows4 };

// A GEMV pipeline and the bindings its x and B take.
struct GemvKernel {
  const Kernel& kern;
  const Slot& x;
  const Slot& b;
};

GemvKernel gemv_kernel(Device& dev, bool tb, GemvForm form, uint32_t gv_x) {
  namespace gv = wgsl::gemv;
  const Slot& x = form == GemvForm::Rows4 ? gv::x4 : gv::x;
  const Slot& b = form == GemvForm::Scalar ? gv::b : gv::b4;
  const char* entry = form == GemvForm::Scalar ? "gemv" : form == GemvForm::Columns4 ? "gemv_vec4" : "gemv_t_vec4";
  const Kernel& k = dev.pipelines().get(KernelKey(entry, {x, b, gv::y, gv::p}, tb, gv_x), [&] {
    KernelDesc d;
    d.shader = "gemv";
    d.entry = entry;
    d.bindings = {x, b, gv::y, gv::p};
    d.constants = {{"TRANS_B", bool_literal(tb)}, {"GV_X", u32_literal(gv_x)}};
    d.trusted = true;
    return d;
  });
  return {k, x, b};
}

}  // namespace

void record_gemv(Recorder& r, const GemvProblem& g) {
  Device& dev = r.device();
  const uint32_t n = g.n, k = g.k;
  const bool tb = g.tb;
  // B is stored (tb ? N x K : K x N).
  const uint64_t ld = tb ? k : n;
  // Column form with n a multiple of 4: 128-bit loads of column quads
  // (PYWGTRAIN_GEMV_VEC4=0 turns them off for A/B runs, docs/gemm_notes.md).
  const bool vec4 = dev.gemm_switches().gemv_vec4 && !tb && n % 4 == 0;
  // vec4 column form: from 4096 columns the column blocks alone fill the GPU,
  // one pass with gv_x quads across (about 256 workgroups); fewer columns take
  // 32 quads across and split K (partials + reduce; docs/gemm_notes.md #41).
  uint32_t gv_x = 32;
  if (vec4 && n >= 4096) {
    gv_x = 4;
    while (gv_x < 32 && n / (4 * gv_x) >= 384) gv_x *= 2;
  }
  // Row form (tb) with 128-bit loads of B's rows and of x where K and both
  // windows' starts are multiples of 4 (decided per dispatch below;
  // PYWGTRAIN_GEMV_T_VEC4=0 turns them off, #55).
  const bool rows4_possible = dev.gemm_switches().gemv_t_vec4 && tb && k % 4 == 0;
  namespace gv = wgsl::gemv;
  const uint64_t per_group = tb ? 8 : vec4 ? 4 * gv_x : 32;
  const uint64_t n_limit = uint64_t(dev.limits().max_workgroups_per_dim) * per_group;
  // Pieces of B that each fit one binding: whole rows where a row fits, else
  // pieces of one row (an output's K range (tb), or a k's columns).
  const uint64_t cap = dev.limits().max_storage_binding / 4;
  const uint64_t slack = std::max<uint32_t>(dev.limits().storage_offset_alignment, 4) / 4;
  uint64_t kb, nb;
  if (ld + slack <= cap) {
    const uint64_t rows_cap = (cap - slack) / ld;
    kb = tb ? k : block_along(k, rows_cap, 1);
    nb = tb ? block_along(n, std::min(rows_cap, n_limit), per_group) : block_along(n, n_limit, per_group);
  } else if (tb) {
    nb = 1;
    kb = cap - slack;
  } else {
    kb = 1;
    nb = block_along(n, std::min(cap - slack, n_limit), per_group);
  }
  // Bounded K loops (dispatch_util.hpp): K beyond one pass of split partials
  // accumulates into y with beta = 1.
  kb = std::min(kb, kMaxKPerPass);
  for (uint64_t n0 = 0; n0 < n; n0 += nb) {
    const uint64_t nc = std::min<uint64_t>(nb, n - n0);
    for (uint64_t k0 = 0; k0 < k; k0 += kb) {
      const uint64_t kc = std::min<uint64_t>(kb, k - k0);
      RowWindow bw =
          tb ? block_window(dev, *g.b, 0, n0, nc, k0, kc, ld) : block_window(dev, *g.b, 0, k0, kc, n0, nc, ld);
      RowWindow xw = row_window(dev, *g.x, g.x_base, k0, kc, 1);
      RowWindow yw = row_window(dev, *g.y, g.y_base, n0, nc, 1);
      GemvParams p;
      p.n = uint32_t(nc);
      p.k = uint32_t(kc);
      p.ldb = uint32_t(ld);
      p.x_off = xw.inner;
      p.b_off = bw.inner;
      p.y_off = yw.inner;
      p.alpha = g.alpha;
      p.beta = k0 == 0 ? g.beta : 1.0f;
      p.k_chunk = uint32_t(kc);
      const bool rows4 = rows4_possible && xw.inner % 4 == 0 && bw.inner % 4 == 0;
      const GemvKernel kn = gemv_kernel(dev, tb,
                                        vec4    ? GemvForm::Columns4
                                        : rows4 ? GemvForm::Rows4
                                                : GemvForm::Scalar,
                                        gv_x);
      const uint64_t groups = ceil_div(nc, per_group);
      // Split K over workgroups (partials + reduce): always past kMaxKPerSplit
      // (bounded loops), and in the column-parallel form with few columns so
      // enough loads are in flight to saturate memory.
      uint64_t splits = ceil_div(kc, kMaxKPerSplit);
      if (!tb && nb == n && kb == k && groups < 256 && kc >= 1024)
        splits = std::max<uint64_t>(splits, std::min<uint64_t>({ceil_div(512, groups), kc / 256, 32}));
      if (splits > 1) {
        uint32_t k_chunk = uint32_t(ceil_div(kc, splits));
        if (rows4) k_chunk = (k_chunk + 3) & ~3u;  // whole vec4s per split
        splits = ceil_div(kc, k_chunk);
        const Range ws{dev.workspace(uint64_t(nc) * splits * 4), 0, uint64_t(nc) * splits * 4};
        GemvParams q = p;
        q.y_off = 0;
        q.alpha = 1.0f;
        q.beta = 0.0f;
        q.k_chunk = k_chunk;
        q.split_stride = uint32_t(nc);
        r.dispatch(kn.kern, {{kn.x, xw.range}, {kn.b, bw.range}, {gv::y, ws}}, q, uint32_t(groups), uint32_t(splits));
        GemmParams s;
        s.m = 1;
        s.n = uint32_t(nc);
        s.ldc = uint32_t(nc);
        s.c_off = yw.inner;
        s.alpha = g.alpha;
        s.beta = k0 == 0 ? g.beta : 1.0f;
        s.split_stride = uint32_t(nc);
        s.splits = uint32_t(splits);
        SplitRanges sr;
        sr.partials = ws;
        sr.c = yw.range;
        record_split_reduce(r, s, sr, EpilogueArgs{});
        continue;
      }
      r.dispatch(kn.kern, {{kn.x, xw.range}, {kn.b, bw.range}, {gv::y, yw.range}}, p, uint32_t(groups));
    }
  }
}

}  // namespace pwt::gemm_detail
