// Activation functions and their derivatives, shared by the GEMM epilogue and
// the linear-layer backward kernels (pulled in with `//!include activations`).
// ACT: 0 none, 1 relu, 2 gelu (tanh form), 3 gelu (erf form), 4 silu.

const SQRT_2_OVER_PI: f32 = 0.7978845608028654;
const INV_SQRT_2: f32 = 0.7071067811865476;
const INV_SQRT_2PI: f32 = 0.3989422804014327;

// Bit test: compilers may fold `v != v` away, and WGSL leaves max/min/clamp
// of a NaN unspecified, so NaN-propagating ops select on this explicitly.
fn is_nan(v: f32) -> bool { return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u; }

// relu as torch: NaN stays NaN (a select, not max(x, 0)).
fn relu_nan(x: f32) -> f32 { return select(max(x, 0.0), x, is_nan(x)); }

// Whether relu's backward passes the gradient: torch's threshold_backward
// zeroes it where the output is <= 0 only, so a NaN input passes it.
fn relu_passes(x: f32) -> bool { return x > 0.0 || is_nan(x); }

// erf with |error| < 1.2e-7 (Numerical Recipes' erfc Chebyshev fit); WGSL has no erf.
fn erf_approx(x: f32) -> f32 {
  let z = abs(x);
  let t = 1.0 / (1.0 + 0.5 * z);
  let poly = -z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 +
             t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 +
             t * (-0.82215223 + t * 0.17087277))))))));
  let r = 1.0 - t * exp(poly);
  return select(-r, r, x >= 0.0);
}

// tanh through exp of a clamped argument: some drivers return NaN for large |x|.
// NaN in, NaN out (the clamp would make it finite).
fn tanh_safe(x: f32) -> f32 {
  let e = exp(-2.0 * clamp(abs(x), 0.0, 15.0));
  let r = (1.0 - e) / (1.0 + e);
  return select(select(-r, r, x >= 0.0), x, is_nan(x));
}

fn activate(x: f32) -> f32 {
  if (ACT == 1u) { return relu_nan(x); }
  if (ACT == 2u) { return 0.5 * x * (1.0 + tanh_safe(SQRT_2_OVER_PI * (x + 0.044715 * x * x * x))); }
  if (ACT == 3u) { return 0.5 * x * (1.0 + erf_approx(x * INV_SQRT_2)); }
  if (ACT == 4u) { return x / (1.0 + exp(-x)); }
  return x;
}

fn activate_grad(x: f32) -> f32 {
  if (ACT == 1u) { return select(0.0, 1.0, relu_passes(x)); }
  if (ACT == 2u) {
    let u = SQRT_2_OVER_PI * (x + 0.044715 * x * x * x);
    let t = tanh_safe(u);
    let du = SQRT_2_OVER_PI * (1.0 + 3.0 * 0.044715 * x * x);
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du;
  }
  if (ACT == 3u) { return 0.5 * (1.0 + erf_approx(x * INV_SQRT_2)) + x * INV_SQRT_2PI * exp(-0.5 * x * x); }
  if (ACT == 4u) { let s = 1.0 / (1.0 + exp(-x)); return s * (1.0 + x * (1.0 - s)); }
  return 1.0;
}

// dx = dy * act'(x); relu selects instead of multiplying (as torch's
// threshold_backward: a zeroed gradient stays 0 for an infinite or NaN dy).
fn act_dx(dy: f32, x: f32) -> f32 {
  if (ACT == 1u) { return select(0.0, dy, relu_passes(x)); }
  return dy * activate_grad(x);
}
