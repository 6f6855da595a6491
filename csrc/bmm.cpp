// Strided batched GEMM launcher (bmm.wgsl): batches in chunks whose operand
// windows fit one storage binding and the z grid limit.
#include <algorithm>
#include <string>

#include "dispatch_util.hpp"
#include "ops.hpp"

namespace pwt {
namespace {

namespace sh = wgsl::bmm;

}  // namespace

void gemm_batched(Recorder& r, const Buffer& a, const Buffer& b, const Buffer& c, uint32_t batch, uint32_t m,
                  uint32_t n, uint32_t k, bool ta, bool tb, float alpha, float beta) {
  if (batch == 0 || m == 0 || n == 0 || k == 0) throw ArgumentError("gemm_batched: batch, M, N and K must be >= 1");
  const uint64_t sa = uint64_t(m) * k, sb = uint64_t(k) * n, sc = uint64_t(m) * n;
  check_floats(a, sa * batch, "gemm_batched operand A");
  check_floats(b, sb * batch, "gemm_batched operand B");
  check_floats(c, sc * batch, "gemm_batched output C");
  Device& dev = r.device();
  const uint64_t slack = std::max<uint32_t>(dev.limits().storage_offset_alignment, 4) / 4;
  const uint64_t cap = dev.limits().max_storage_binding / 4;
  const uint64_t largest = std::max({sa, sb, sc});
  if (largest + slack > cap)
    throw ArgumentError("gemm_batched: one matrix of " + std::to_string(largest * 4) +
                        " bytes exceeds the device's max_storage_buffer_binding_size of " +
                        std::to_string(dev.limits().max_storage_binding) + " bytes");
  const uint64_t per_chunk = std::min<uint64_t>(
      {(cap - slack) / largest, dev.limits().max_workgroups_per_dim, uint64_t(UINT32_MAX) / largest});
  KernelDesc d;
  d.shader = "bmm";
  d.entry = "bmm";
  d.bindings = {sh::a, sh::b, sh::c, sh::p};
  d.constants = {{"TRANS_A", ta ? "true" : "false"}, {"TRANS_B", tb ? "true" : "false"}};
  // Every access in bmm.wgsl is guarded (row < M, k < K, column < N, batch <
  // the dispatched z) and bind_span puts each chunk's matrices inside its
  // binding. Without wgpu's injected checks: on the H100 a [6, 1, 64] x
  // [6, 64, 20] product took 201.6 us with them and 9.2 without (a fixed
  // ~50 us per K step, whatever the batch; docs/gemm_notes.md #113).
  d.trusted = true;
  const Kernel& kern = dev.pipelines().get(d);
  const uint64_t gx = ceil_div(n, sh::TILE), gy = ceil_div(m, sh::TILE);
  if (gx > dev.limits().max_workgroups_per_dim || gy > dev.limits().max_workgroups_per_dim)
    throw ArgumentError("gemm_batched: M or N exceeds the workgroup grid (" + std::to_string(m) + " x " +
                        std::to_string(n) + ")");
  for (uint64_t b0 = 0; b0 < batch; b0 += per_chunk) {
    const uint64_t bc = std::min<uint64_t>(per_chunk, batch - b0);
    const Bound ab = bind_span(dev, a, b0 * sa, bc * sa), bb = bind_span(dev, b, b0 * sb, bc * sb),
                cb = bind_span(dev, c, b0 * sc, bc * sc);
    BmmParams p;
    p.m = m;
    p.n = n;
    p.k = k;
    p.batch = uint32_t(bc);
    p.a_off = ab.off;
    p.b_off = bb.off;
    p.c_off = cb.off;
    p.a_stride = uint32_t(sa);
    p.b_stride = uint32_t(sb);
    p.c_stride = uint32_t(sc);
    p.alpha = alpha;
    p.beta = beta;
    r.dispatch(kern, {{sh::a, ab.range}, {sh::b, bb.range}, {sh::c, cb.range}}, p, uint32_t(gx), uint32_t(gy),
               uint32_t(bc));
  }
}

}  // namespace pwt
