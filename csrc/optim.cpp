// AdamW, global gradient norm and clipping launchers.
#include <cmath>
#include <functional>
#include <string>

#include "dispatch_util.hpp"
#include "ops.hpp"

namespace pwt {
namespace {

namespace sh = wgsl::optim;

const Kernel& optim_kernel(Device& dev, const char* entry) {
  static const PipelineCache::EntryBindings table = {
      {"scale_by_clip", {sh::clip, sh::grads, sh::sp}},
      {"adamw", {sh::param, sh::grad, sh::exp_avg, sh::exp_avg_sq, sh::ap, sh::param_half}},
      {"adamw_clipped", {sh::param, sh::grad, sh::exp_avg, sh::exp_avg_sq, sh::ap, sh::clip, sh::param_half}},
      {"adamw_prepare", {sh::hyper, sh::adam_state, sh::found_inf, sh::dp}},
      {"adamw_device",
       {sh::param, sh::grad, sh::exp_avg, sh::exp_avg_sq, sh::adam_state, sh::found_inf, sh::dp, sh::param_half}},
      {"adamw_device_clipped",
       {sh::param, sh::grad, sh::exp_avg, sh::exp_avg_sq, sh::adam_state, sh::found_inf, sh::dp, sh::clip,
        sh::param_half}},
      {"scaler_reset_found", {sh::found_inf}},
      {"scaler_unscale", {sh::grads, sh::scaler, sh::found_inf, sh::gp}},
      {"scaler_update", {sh::scaler, sh::gp}}};
  return dev.pipelines().get("optim", entry, table);
}

void check_adamw_config(const AdamWConfig& cfg) {
  if (!(cfg.lr >= 0.0f)) throw ArgumentError("AdamW: lr must be >= 0, got " + std::to_string(cfg.lr));
  if (!(cfg.beta1 >= 0.0f && cfg.beta1 < 1.0f))
    throw ArgumentError("AdamW: beta1 must be in [0, 1), got " + std::to_string(cfg.beta1));
  if (!(cfg.beta2 >= 0.0f && cfg.beta2 < 1.0f))
    throw ArgumentError("AdamW: beta2 must be in [0, 1), got " + std::to_string(cfg.beta2));
  if (!(cfg.eps > 0.0f)) throw ArgumentError("AdamW: eps must be > 0, got " + std::to_string(cfg.eps));
  if (!(cfg.weight_decay >= 0.0f))
    throw ArgumentError("AdamW: weight_decay must be >= 0, got " + std::to_string(cfg.weight_decay));
  if (!(cfg.l2 >= 0.0f)) throw ArgumentError("Adam: weight_decay must be >= 0, got " + std::to_string(cfg.l2));
}

AdamDevParams adam_device_params(const AdamWConfig& cfg, uint32_t slot, uint32_t group) {
  AdamDevParams p;
  p.slot = slot;
  p.group = group;
  p.beta1 = cfg.beta1;
  p.beta2 = cfg.beta2;
  p.eps = cfg.eps;
  p.weight_decay = cfg.weight_decay;
  p.l2 = cfg.l2;
  // In double, from the float32 betas the kernel multiplies by.
  p.one_minus_beta1 = float(1.0 - double(cfg.beta1));
  p.one_minus_beta2 = float(1.0 - double(cfg.beta2));
  return p;
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
  p.l2 = cfg.l2;
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

namespace {
// The per-element operands of one piece of an AdamW update. Without a float16
// copy the writable placeholder takes param_half's binding (half_copy = 0: the
// kernel never touches it).
std::vector<Operand> adamw_piece(Device& dev, const Buffer& param, const Buffer& grad, const Buffer& exp_avg,
                                 const Buffer& exp_avg_sq, const Buffer* param_half, uint64_t first, uint64_t count) {
  return {{sh::param, floats(param, first, count)},
          {sh::grad, floats(grad, first, count)},
          {sh::exp_avg, floats(exp_avg, first, count)},
          {sh::exp_avg_sq, floats(exp_avg_sq, first, count)},
          {sh::param_half, param_half ? elements(*param_half, first, count, 2) : Range{dev.placeholder(true), 0, 16}}};
}

void check_adamw_operands(const Buffer& param, const Buffer& grad, const Buffer& exp_avg, const Buffer& exp_avg_sq,
                          const Buffer* param_half, uint64_t n) {
  for (auto* b : {&param, &grad, &exp_avg, &exp_avg_sq}) check_floats(*b, n, "AdamW operand");
  if (param_half) {
    check_elements(*param_half, n, 2, "AdamW float16 copy");
    check_no_alias("AdamW", *param_half, "param_half", {{&param, "param"}, {&grad, "grad"}});
  }
}

// Pieces start where float32 and float16 offsets are both aligned (with or
// without a copy: one piece layout); a thread per two parameters.
void for_each_adamw_piece(Device& dev, uint64_t n,
                          const std::function<void(uint64_t, uint64_t, uint32_t, uint32_t)>& fn) {
  for_each_piece(
      dev, n,
      [&](uint64_t first, uint64_t count) {
        auto [gx, gy] = grid_1d(dev, ceil_div(ceil_div(count, 2), sh::WG));
        fn(first, count, gx, gy);
      },
      elem_bytes(true));
}
}  // namespace

void adamw(Recorder& r, const Buffer& param, const Buffer& grad, const Buffer& exp_avg, const Buffer& exp_avg_sq,
           uint64_t n, const AdamWConfig& cfg, uint64_t step, const Buffer* clip, const Buffer* param_half) {
  check_adamw_config(cfg);
  if (step < 1) throw ArgumentError("AdamW: step must be >= 1");
  check_adamw_operands(param, grad, exp_avg, exp_avg_sq, param_half, n);
  if (clip) check_floats(*clip, 2, "clip coefficient");
  Device& dev = r.device();
  const Kernel& k = optim_kernel(dev, clip ? "adamw_clipped" : "adamw");
  AdamWUniform p = adamw_uniform(0, cfg, step);
  p.half_copy = param_half ? 1 : 0;
  for_each_adamw_piece(dev, n, [&](uint64_t first, uint64_t count, uint32_t gx, uint32_t gy) {
    p.n = uint32_t(count);
    std::vector<Operand> operands = adamw_piece(dev, param, grad, exp_avg, exp_avg_sq, param_half, first, count);
    if (clip) operands.push_back({sh::clip, whole(*clip)});
    r.dispatch(k, operands, p, gx, gy);
  });
}

void adamw_prepare(Recorder& r, const Buffer& state, uint32_t first_slot, uint32_t slots, const Buffer& found_inf,
                   const AdamWConfig& cfg, const Buffer& hyper, uint32_t group) {
  check_adamw_config(cfg);
  check_floats(state, kAdamSlotWords * (uint64_t(first_slot) + slots), "AdamW step state");
  check_floats(found_inf, 1, "found_inf");
  check_floats(hyper, uint64_t(group) + 1, "AdamW learning rates");
  Device& dev = r.device();
  AdamDevParams p = adam_device_params(cfg, first_slot, group);
  p.n = slots;
  auto [gx, gy] = grid_1d(dev, ceil_div(slots, sh::WG));
  r.dispatch(optim_kernel(dev, "adamw_prepare"),
             {{sh::hyper, whole(hyper)}, {sh::adam_state, whole(state)}, {sh::found_inf, whole(found_inf)}}, p, gx, gy);
}

void adamw_device(Recorder& r, const Buffer& param, const Buffer& grad, const Buffer& exp_avg, const Buffer& exp_avg_sq,
                  uint64_t n, const AdamWConfig& cfg, const Buffer& state, uint32_t slot, const Buffer& found_inf,
                  const Buffer* clip, const Buffer* param_half) {
  check_adamw_config(cfg);
  check_adamw_operands(param, grad, exp_avg, exp_avg_sq, param_half, n);
  check_floats(state, kAdamSlotWords * (uint64_t(slot) + 1), "AdamW step state");
  check_floats(found_inf, 1, "found_inf");
  if (clip) check_floats(*clip, 2, "clip coefficient");
  Device& dev = r.device();
  const Kernel& k = optim_kernel(dev, clip ? "adamw_device_clipped" : "adamw_device");
  AdamDevParams p = adam_device_params(cfg, slot, 0);
  p.half_copy = param_half ? 1 : 0;
  for_each_adamw_piece(dev, n, [&](uint64_t first, uint64_t count, uint32_t gx, uint32_t gy) {
    p.n = uint32_t(count);
    std::vector<Operand> operands = adamw_piece(dev, param, grad, exp_avg, exp_avg_sq, param_half, first, count);
    operands.push_back({sh::adam_state, whole(state)});
    operands.push_back({sh::found_inf, whole(found_inf)});
    if (clip) operands.push_back({sh::clip, whole(*clip)});
    r.dispatch(k, operands, p, gx, gy);
  });
}

void scaler_unscale(Recorder& r, const Buffer& grad, uint64_t n, const Buffer& scaler, const Buffer& found_inf,
                    bool first) {
  check_floats(grad, n, "gradient");
  check_floats(scaler, 3, "GradScaler state");
  check_floats(found_inf, 1, "found_inf");
  Device& dev = r.device();
  if (first) r.dispatch(optim_kernel(dev, "scaler_reset_found"), {{sh::found_inf, whole(found_inf)}}, 1);
  const Kernel& k = optim_kernel(dev, "scaler_unscale");
  for_each_piece(dev, n, [&](uint64_t first_elem, uint64_t count) {
    ScalerParams p;
    p.n = uint32_t(count);
    auto [gx, gy] = grid_1d(dev, ceil_div(count, sh::WG));
    r.dispatch(
        k,
        {{sh::grads, floats(grad, first_elem, count)}, {sh::scaler, whole(scaler)}, {sh::found_inf, whole(found_inf)}},
        p, gx, gy);
  });
}

void scaler_update(Recorder& r, const Buffer& scaler, float growth_factor, float backoff_factor,
                   uint32_t growth_interval, const float* new_scale) {
  check_floats(scaler, 3, "GradScaler state");
  ScalerParams p;
  p.growth_factor = growth_factor;
  p.backoff_factor = backoff_factor;
  p.growth_interval = growth_interval;
  p.set_scale = new_scale != nullptr;
  p.new_scale = new_scale ? *new_scale : 0.0f;
  r.dispatch(optim_kernel(r.device(), "scaler_update"), {{sh::scaler, whole(scaler)}}, p, 1);
}

}  // namespace pwt
