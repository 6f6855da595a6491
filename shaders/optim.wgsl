// Optimizer updates. Dispatches are 2-D when a
// vector needs more than 65535 workgroups; the index is linearized here.
//
// AdamW as torch.optim.AdamW (amsgrad=False): decoupled decay p *= 1 - lr*wd,
// then p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps). Adam
// (torch.optim.Adam) is the same update with no decoupled decay (decay 1) and
// its weight decay l2 * p added to the gradient instead. `adamw` takes the
// bias corrections for this step from the host; the capturable form
// (`adamw_prepare`, `adamw_device`) keeps step counts and bias corrections in
// device memory and reads lr from a buffer, so a captured step replays with
// the current lr, and skips on the GPU when a GradScaler found inf/NaN.
// With half_copy set, the updates also write each new parameter's float16
// copy (param_half: autocast's products read it instead of casting), rounded
// as cast.wgsl rounds (half_bits), so it equals a cast of the new parameter
// bit for bit. Two copies share a word: each thread updates the two
// parameters of one word and writes it whole.

struct AdamParams {
  n: u32,
  beta1: f32, beta2: f32, eps: f32,
  decay: f32,      // 1 - lr * weight_decay
  step_size: f32,  // lr / (1 - beta1^t)
  bc2_sqrt: f32,   // sqrt(1 - beta2^t)
  half_copy: u32,  // 1: write param_half too
  l2: f32,         // Adam's weight_decay (added to the gradient); 0 for AdamW
  _pad0: u32, _pad1: u32, _pad2: u32,
}

@group(0) @binding(0) var<storage, read_write> param: array<f32>;
@group(0) @binding(1) var<storage, read> grad: array<f32>;
@group(0) @binding(2) var<storage, read_write> exp_avg: array<f32>;
@group(0) @binding(3) var<storage, read_write> exp_avg_sq: array<f32>;
@group(0) @binding(4) var<uniform> ap: AdamParams;
// [norm, clip coefficient] from reduce.wgsl's finalize_norm.
@group(0) @binding(5) var<storage, read> clip: array<f32>;

struct ScaleParams { n: u32, }
@group(0) @binding(6) var<storage, read_write> grads: array<f32>;
@group(0) @binding(7) var<uniform> sp: ScaleParams;

// Capturable AdamW: lr of each parameter group (written by the host per step,
// in stream order); per parameter slot 8 words: step, then as float bits
// bc1, bc2 (bc = 1 - beta^step), this step's lr / bc1, sqrt(bc2),
// 1 - lr * weight_decay, 0, 0; found_inf[0] != 0: skip the step (GradScaler).
struct AdamDevParams {
  n: u32, slot: u32, group: u32, half_copy: u32,
  beta1: f32, beta2: f32, eps: f32, weight_decay: f32,
  one_minus_beta1: f32, one_minus_beta2: f32, l2: f32, _pad2: f32,  // l2 as AdamParams'
}
@group(0) @binding(8) var<storage, read> hyper: array<f32>;
@group(0) @binding(9) var<storage, read_write> adam_state: array<u32>;
@group(0) @binding(10) var<storage, read_write> found_inf: array<f32>;
@group(0) @binding(11) var<uniform> dp: AdamDevParams;

// GradScaler: [scale, growth tracker, found inf in any unscale_ since update, 0].
struct ScalerParams {
  n: u32, growth_interval: u32, growth_factor: f32, backoff_factor: f32,
  new_scale: f32, set_scale: u32, _pad0: u32, _pad1: u32,
}
@group(0) @binding(12) var<storage, read_write> scaler: array<f32>;
@group(0) @binding(13) var<uniform> gp: ScalerParams;

// The float16 copy of `param`, two values to a word (element 2w in word w's low half).
@group(0) @binding(14) var<storage, read_write> param_half: array<u32>;

//!include half

fn linear_index(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
  return (wid.y * nwg.x + wid.x) * WG + lid;  // WG: csrc/shader_contract.hpp
}

// NaN by its bits: the NVIDIA driver compiles float comparisons as if no value
// were NaN (with a NaN coefficient `select(coef, 1.0, coef >= 1.0)` followed by
// `!(s == 1.0)` left the gradients unscaled on the H100), and lavapipe got
// `s != 1.0` wrong for NaN; integer tests are exact everywhere.
fn is_nan(x: f32) -> bool {
  return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;
}

// torch scales by min(coef, 1); NaN coefficients (non-finite norms) propagate.
fn clip_scale() -> f32 {
  let coef = clip[1];
  if (is_nan(coef)) { return bitcast<f32>(0x7fc00000u); }
  return select(coef, 1.0, coef >= 1.0);
}

// Inf and NaN by their bits (see is_nan).
fn is_finite(x: f32) -> bool {
  return (bitcast<u32>(x) & 0x7f800000u) != 0x7f800000u;
}

// Updates parameter i and returns its new value.
fn adam_update(i: u32, g_in: f32, beta1: f32, beta2: f32, eps: f32, decay: f32, l2: f32, step_size: f32,
               bc2_sqrt: f32) -> f32 {
  // Only where there is an L2 term: 0 * an infinite parameter would make the gradient NaN.
  let g = select(g_in, g_in + l2 * param[i], l2 != 0.0);
  let m = beta1 * exp_avg[i] + (1.0 - beta1) * g;
  let v = beta2 * exp_avg_sq[i] + (1.0 - beta2) * g * g;
  exp_avg[i] = m;
  exp_avg_sq[i] = v;
  let denom = sqrt(v) / bc2_sqrt + eps;
  let p = param[i] * decay - step_size * (m / denom);
  param[i] = p;
  return p;
}

fn adamw_update(i: u32, g: f32) -> f32 {
  return adam_update(i, g, ap.beta1, ap.beta2, ap.eps, ap.decay, ap.l2, ap.step_size, ap.bc2_sqrt);
}

// Word i / 2 of the float16 copy from the new values of parameters i (even) and i + 1; an odd
// count's last word keeps its high half (the element past the piece is not this thread's).
fn store_half_pair(i: u32, n: u32, lo: f32, hi: f32) {
  let l = half_bits(bitcast<u32>(lo));
  if (i + 1u < n) {
    param_half[i / 2u] = l | (half_bits(bitcast<u32>(hi)) << 16u);
  } else {
    param_half[i / 2u] = (param_half[i / 2u] & 0xffff0000u) | l;
  }
}

fn skipped() -> bool {
  return bitcast<u32>(found_inf[0]) != 0u;
}

// The capturable update, with the coefficients adamw_prepare left in the slot.
fn adamw_device_update(i: u32, g: f32) -> f32 {
  let base = 8u * dp.slot;
  let step_size = bitcast<f32>(adam_state[base + 3u]);
  let bc2_sqrt = bitcast<f32>(adam_state[base + 4u]);
  let decay = bitcast<f32>(adam_state[base + 5u]);
  return adam_update(i, g, dp.beta1, dp.beta2, dp.eps, decay, dp.l2, step_size, bc2_sqrt);
}

// Every update entry runs a thread per two parameters and writes their float16
// copy when the uniform's half_copy says so: one pipeline with and without a
// copy, so the master values are the same bits either way (NVIDIA's compiler
// contracts multiply-adds differently in different entry points).
@compute @workgroup_size(WG)
fn adamw(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) lid: u32) {
  let i = 2u * linear_index(wid, nwg, lid);
  if (i >= ap.n) { return; }
  let lo = adamw_update(i, grad[i]);
  var hi = 0.0;
  if (i + 1u < ap.n) { hi = adamw_update(i + 1u, grad[i + 1u]); }
  if (ap.half_copy != 0u) { store_half_pair(i, ap.n, lo, hi); }
}

// Gradient clipping fused into the update: the clip scale is applied to the
// gradient as it is read, so gradients are read once and never rewritten.
@compute @workgroup_size(WG)
fn adamw_clipped(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
  let i = 2u * linear_index(wid, nwg, lid);
  if (i >= ap.n) { return; }
  let lo = adamw_update(i, grad[i] * clip_scale());
  var hi = 0.0;
  if (i + 1u < ap.n) { hi = adamw_update(i + 1u, grad[i + 1u] * clip_scale()); }
  if (ap.half_copy != 0u) { store_half_pair(i, ap.n, lo, hi); }
}

// In-place clipping for clip_grad_norm_: only writes when the norm exceeds
// max_norm or is NaN (torch then makes every gradient NaN; the NaN test on
// bits, see is_nan).
@compute @workgroup_size(WG)
fn scale_by_clip(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
  let i = linear_index(wid, nwg, lid);
  let s = clip_scale();
  if (i >= sp.n) { return; }
  if (is_nan(s)) {
    grads[i] = s;  // torch's g * NaN, stored as is: no float arithmetic on a NaN to fold away
  } else if (s < 1.0) {
    grads[i] = grads[i] * s;
  }
}

// One thread per parameter slot, before the update: step += 1, the bias
// corrections by bc_t = beta * bc_(t-1) + (1 - beta) (1 - beta exact from the
// host: 1 - beta^t itself would cancel in float32) and the update's
// coefficients from this step's lr (once here, not per element), unless the
// step is skipped.
@compute @workgroup_size(WG)
fn adamw_prepare(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
  let i = linear_index(wid, nwg, lid);
  if (i >= dp.n || skipped()) { return; }
  let base = 8u * (dp.slot + i);
  let bc1 = dp.beta1 * bitcast<f32>(adam_state[base + 1u]) + dp.one_minus_beta1;
  let bc2 = dp.beta2 * bitcast<f32>(adam_state[base + 2u]) + dp.one_minus_beta2;
  let lr = hyper[dp.group];
  adam_state[base] = adam_state[base] + 1u;
  adam_state[base + 1u] = bitcast<u32>(bc1);
  adam_state[base + 2u] = bitcast<u32>(bc2);
  adam_state[base + 3u] = bitcast<u32>(lr / bc1);
  adam_state[base + 4u] = bitcast<u32>(sqrt(bc2));
  adam_state[base + 5u] = bitcast<u32>(1.0 - lr * dp.weight_decay);
}

// A skipped step leaves parameters, moments and the float16 copy as they
// were, and reads no gradient or clip coefficient (a non-finite norm cannot
// reach them).
@compute @workgroup_size(WG)
fn adamw_device(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
  let i = 2u * linear_index(wid, nwg, lid);
  if (i >= dp.n || skipped()) { return; }
  let lo = adamw_device_update(i, grad[i]);
  var hi = 0.0;
  if (i + 1u < dp.n) { hi = adamw_device_update(i + 1u, grad[i + 1u]); }
  if (dp.half_copy != 0u) { store_half_pair(i, dp.n, lo, hi); }
}

@compute @workgroup_size(WG)
fn adamw_device_clipped(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                        @builtin(local_invocation_index) lid: u32) {
  let i = 2u * linear_index(wid, nwg, lid);
  if (i >= dp.n || skipped()) { return; }
  let lo = adamw_device_update(i, grad[i] * clip_scale());
  var hi = 0.0;
  if (i + 1u < dp.n) { hi = adamw_device_update(i + 1u, grad[i + 1u] * clip_scale()); }
  if (dp.half_copy != 0u) { store_half_pair(i, dp.n, lo, hi); }
}

// GradScaler.unscale_, first pass: this optimizer has found nothing yet.
@compute @workgroup_size(1)
fn scaler_reset_found() {
  found_inf[0] = 0.0;
}

// g *= 1 / scale (torch's order: the value is checked before the multiply);
// any non-finite gradient sets the optimizer's and the scaler's found flags
// (every writer writes 1, so the race is harmless).
@compute @workgroup_size(WG)
fn scaler_unscale(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
  let i = linear_index(wid, nwg, lid);
  if (i >= gp.n) { return; }
  let g = grads[i];
  if (!is_finite(g)) {
    found_inf[0] = 1.0;
    scaler[2] = 1.0;
  }
  grads[i] = g * (1.0 / scaler[0]);
}

// GradScaler.update: torch's _amp_update_scale_ (backoff on found inf, growth
// after growth_interval clean steps when the grown scale is finite), or the
// scale given by the caller; either way the found flag starts over.
@compute @workgroup_size(1)
fn scaler_update() {
  if (gp.set_scale != 0u) {
    scaler[0] = gp.new_scale;
  } else if (bitcast<u32>(scaler[2]) != 0u) {
    scaler[0] = scaler[0] * gp.backoff_factor;
    scaler[1] = 0.0;
  } else {
    let successful = scaler[1] + 1.0;
    if (successful == f32(gp.growth_interval)) {
      let grown = scaler[0] * gp.growth_factor;
      if (is_finite(grown)) { scaler[0] = grown; }
      scaler[1] = 0.0;
    } else {
      scaler[1] = successful;
    }
  }
  scaler[2] = 0.0;
}
