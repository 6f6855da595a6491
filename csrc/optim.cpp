// AdamW, global gradient norm and clipping launchers.
#include <cmath>
#include <string>

#include "dispatch_util.hpp"
#include "ops.hpp"

namespace pwt {
namespace {

namespace sh = wgsl::optim;

const Kernel& optim_kernel(Device& dev, const char* entry) {
  static const PipelineCache::EntryBindings table = {
      {"scale_by_clip", {sh::clip, sh::grads, sh::sp}},
      {"adamw", {sh::param, sh::grad, sh::exp_avg, sh::exp_avg_sq, sh::ap}},
      {"adamw_clipped", {sh::param, sh::grad, sh::exp_avg, sh::exp_avg_sq, sh::ap, sh::clip}}};
  return dev.pipelines().get("optim", entry, table);
}

}  // namespace

AdamWUniform adamw_uniform(uint32_t n, const AdamWConfig& cfg, uint64_t step) {
  // Bias corrections in double on the host, as torch computes them in Python floats.
  const double bc1 = 1.0 - std::pow(double(cfg.beta1), double(step));
  const double bc2 = 1.0 - std::pow(double(cfg.beta2), double(step));
  AdamParams p;
  p.n = n;
  p.beta1 = cfg.beta1;
  p.beta2 = cfg.beta2;
  p.eps = cfg.eps;
  p.decay = float(1.0 - double(cfg.lr) * cfg.weight_decay);
  p.step_size = float(cfg.lr / bc1);
  p.bc2_sqrt = float(std::sqrt(bc2));
  return p;
}

uint64_t grad_norm_scratch_floats(const Device& dev, const std::vector<uint64_t>& counts) {
  uint64_t total = 0;
  const uint64_t piece = max_piece_floats(dev);
  for (auto n : counts) {
    for (uint64_t first = 0; first < n; first += piece) total += ceil_div(std::min(piece, n - first), kReduceGroup);
  }
  return std::max<uint64_t>(total, 1);
}

void grad_norm(Recorder& r, const std::vector<const Buffer*>& grads, const std::vector<uint64_t>& counts,
               const Buffer& scratch, const Buffer& out, float max_norm) {
  if (grads.size() != counts.size()) throw ArgumentError("grad_norm: one count per gradient buffer expected");
  if (grads.empty()) throw ArgumentError("grad_norm: no gradients given");
  check_floats(scratch, grad_norm_scratch_floats(r.device(), counts), "grad_norm scratch");
  check_floats(out, 2, "grad_norm output");
  uint64_t partials = 0;
  for (size_t i = 0; i < grads.size(); ++i) {
    check_floats(*grads[i], counts[i], "gradient");
    partials = record_partials(r, *grads[i], counts[i], true, scratch, partials);
  }
  record_finalize(r, "finalize_norm", scratch, partials, out, 0, 1.0f, max_norm);
}

void scale_by_clip(Recorder& r, const Buffer& grad, uint64_t n, const Buffer& norm_out) {
  check_floats(grad, n, "gradient");
  check_floats(norm_out, 2, "norm output");
  Device& dev = r.device();
  const Kernel& k = optim_kernel(dev, "scale_by_clip");
  for_each_piece(dev, n, [&](uint64_t first, uint64_t count) {
    ScaleParams p;
    p.n = uint32_t(count);
    auto [gx, gy] = grid_1d(dev, ceil_div(count, sh::WG));
    r.dispatch(k, {{sh::clip, whole(norm_out)}, {sh::grads, floats(grad, first, count)}}, p, gx, gy);
  });
}

void adamw(Recorder& r, const Buffer& param, const Buffer& grad, const Buffer& exp_avg, const Buffer& exp_avg_sq,
           uint64_t n, const AdamWConfig& cfg, uint64_t step, const Buffer* clip) {
  if (!(cfg.lr >= 0.0f)) throw ArgumentError("AdamW: lr must be >= 0, got " + std::to_string(cfg.lr));
  if (!(cfg.beta1 >= 0.0f && cfg.beta1 < 1.0f))
    throw ArgumentError("AdamW: beta1 must be in [0, 1), got " + std::to_string(cfg.beta1));
  if (!(cfg.beta2 >= 0.0f && cfg.beta2 < 1.0f))
    throw ArgumentError("AdamW: beta2 must be in [0, 1), got " + std::to_string(cfg.beta2));
  if (!(cfg.eps > 0.0f)) throw ArgumentError("AdamW: eps must be > 0, got " + std::to_string(cfg.eps));
  if (!(cfg.weight_decay >= 0.0f))
    throw ArgumentError("AdamW: weight_decay must be >= 0, got " + std::to_string(cfg.weight_decay));
  if (step < 1) throw ArgumentError("AdamW: step must be >= 1");
  for (auto* b : {&param, &grad, &exp_avg, &exp_avg_sq}) check_floats(*b, n, "AdamW operand");
  if (clip) check_floats(*clip, 2, "clip coefficient");
  Device& dev = r.device();
  const Kernel& k = optim_kernel(dev, clip ? "adamw_clipped" : "adamw");
  AdamWUniform p = adamw_uniform(0, cfg, step);
  for_each_piece(dev, n, [&](uint64_t first, uint64_t count) {
    p.n = uint32_t(count);
    auto [gx, gy] = grid_1d(dev, ceil_div(count, sh::WG));
    std::vector<Operand> operands{{sh::param, floats(param, first, count)},
                                  {sh::grad, floats(grad, first, count)},
                                  {sh::exp_avg, floats(exp_avg, first, count)},
                                  {sh::exp_avg_sq, floats(exp_avg_sq, first, count)}};
    if (clip) operands.push_back({sh::clip, whole(*clip)});
    r.dispatch(k, operands, p, gx, gy);
  });
}

}  // namespace pwt
