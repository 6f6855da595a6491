// Activation functions and their derivatives, shared by the GEMM epilogue and
// the linear-layer backward kernels (pulled in with `//!include activations`).
// ACT: 0 none, 1 relu, 2 gelu (tanh form), 3 gelu (erf form), 4 silu.

const SQRT_2_OVER_PI: f32 = 0.7978845608028654;
const INV_SQRT_2: f32 = 0.7071067811865476;
const INV_SQRT_2PI: f32 = 0.3989422804014327;

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
fn tanh_safe(x: f32) -> f32 {
  let e = exp(-2.0 * clamp(abs(x), 0.0, 15.0));
  let r = (1.0 - e) / (1.0 + e);
  return select(-r, r, x >= 0.0);
}

fn activate(x: f32) -> f32 {
  if (ACT == 1u) { return max(x, 0.0); }
  if (ACT == 2u) { return 0.5 * x * (1.0 + tanh_safe(SQRT_2_OVER_PI * (x + 0.044715 * x * x * x))); }
  if (ACT == 3u) { return 0.5 * x * (1.0 + erf_approx(x * INV_SQRT_2)); }
  if (ACT == 4u) { return x / (1.0 + exp(-x)); }
  return x;
}

fn activate_grad(x: f32) -> f32 {
  if (ACT == 1u) { return select(0.0, 1.0, x > 0.0); }
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
