// Optimizer updates, one thread per parameter. Dispatches are 2-D when a
// vector needs more than 65535 workgroups; the index is linearized here.
//
// AdamW as torch.optim.AdamW (amsgrad=False): decoupled decay p *= 1 - lr*wd,
// then p -= (lr / bc1) * m / (sqrt(v) / sqrt(bc2) + eps). The host passes the
// bias corrections for this step.

struct AdamParams {
  n: u32,
  beta1: f32, beta2: f32, eps: f32,
  decay: f32,      // 1 - lr * weight_decay
  step_size: f32,  // lr / (1 - beta1^t)
  bc2_sqrt: f32,   // sqrt(1 - beta2^t)
  _pad: f32,
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

fn adamw_update(i: u32, g: f32) {
  let m = ap.beta1 * exp_avg[i] + (1.0 - ap.beta1) * g;
  let v = ap.beta2 * exp_avg_sq[i] + (1.0 - ap.beta2) * g * g;
  exp_avg[i] = m;
  exp_avg_sq[i] = v;
  let denom = sqrt(v) / ap.bc2_sqrt + ap.eps;
  param[i] = param[i] * ap.decay - ap.step_size * (m / denom);
}

@compute @workgroup_size(WG)
fn adamw(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) lid: u32) {
  let i = linear_index(wid, nwg, lid);
  if (i < ap.n) { adamw_update(i, grad[i]); }
}

// Gradient clipping fused into the update: the clip scale is applied to the
// gradient as it is read, so gradients are read once and never rewritten.
@compute @workgroup_size(WG)
fn adamw_clipped(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
  let i = linear_index(wid, nwg, lid);
  if (i < ap.n) { adamw_update(i, grad[i] * clip_scale()); }
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
