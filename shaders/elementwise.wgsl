// Element-wise kernels of the autograd (csrc/tensor_ops.cpp): unary ops and
// their gradients over flat vectors, and broadcast binary ops, where and
// strided copies over an N-d index space. OP (the UnaryOp / BinaryOp number
// of tensor_ops.hpp), ACT (activations.wgsl) and WHICH (operand of a binary
// gradient) are pipeline constants: every op is its own pipeline.
// Four elements per thread (EPT), 256 threads per workgroup; the grid is 2-D
// past 65535 workgroups (linearized y * nx + x). A thread loads its four
// elements before it stores any: one element per thread kept too few loads in
// flight (H200: 2.0 TB/s on 1.6 GB operands, torch's 4.1).
// T0, T1, T2, TR (aliases emitted per kernel, csrc/tensor_ops.cpp): the element
// types of in0, in1, in2 and res, f32 or f16 (with `enable f16`). The math is
// f32 whatever they are: loads widen (exact), stores round once (store_res).
// RES_HALF: bool, TR is f16.
//!include activations
//!include half

// Flat kernels: n elements of this piece, the op's scalars, accumulation.
struct FlatParams { n: u32, a: f32, b: f32, beta: f32, }

// N-d kernels: operand k (slot = its binding 0..3; 3 is the output) lives at
// offs[k] + sum_d coord_d * strides[d][k] of its binding; shape[d >> 2][d & 3]
// is dimension d (outermost first) of this block of the index space.
struct NdParams {
  n: u32,
  ndim: u32,
  beta: f32,
  _pad: u32,
  offs: vec4<u32>,
  shape: array<vec4<u32>, 2>,
  strides: array<vec4<u32>, 6>,
}

@group(0) @binding(0) var<storage, read> in0: array<T0>;        // x / a / src
@group(0) @binding(1) var<storage, read> in1: array<T1>;        // y (forward output) / b
@group(0) @binding(2) var<storage, read> in2: array<T2>;        // dy / cond
@group(0) @binding(3) var<storage, read_write> res: array<TR>;  // y / dx / out / g / dst
@group(0) @binding(4) var<uniform> np: NdParams;
@group(0) @binding(5) var<uniform> fp: FlatParams;
// in0 and res again as raw 32-bit words (copy_bits): a copy through f32 values
// may quiet signaling-NaN patterns, which int32 tensors hold as ordinary ids.
@group(0) @binding(6) var<storage, read> in0_bits: array<u32>;
@group(0) @binding(7) var<storage, read_write> res_bits: array<u32>;
// res as the words holding 2-byte elements (copy_half_bits): two threads may
// write the two halves of one word, so each changes only its half, atomically.
@group(0) @binding(8) var<storage, read_write> res_words: array<atomic<u32>>;

fn ld0(i: u32) -> f32 { return f32(in0[i]); }
fn ld1(i: u32) -> f32 { return f32(in1[i]); }
fn ld2(i: u32) -> f32 { return f32(in2[i]); }
fn ldr(i: u32) -> f32 { return f32(res[i]); }

// res[i] = v rounded once to TR (half.wgsl: past f16's range to +-inf).
fn store_res(i: u32, v: f32) { res[i] = TR(half_range(v, RES_HALF)); }

// The thread's four elements: a stripe of WG apart each, coalesced across the
// workgroup (WG, EPT: csrc/shader_contract.hpp).
fn thread_elements(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> vec4<u32> {
  const_assert EPT == 4u;
  let first = (wid.y * nwg.x + wid.x) * (WG * EPT) + lid;
  return vec4<u32>(first, first + WG, first + 2u * WG, first + 3u * WG);
}

// Element indices clamped to the last one (loads past n read it, and their results are not stored).
fn clamped(i: vec4<u32>, n: u32) -> vec4<u32> { return min(i, vec4<u32>(n - 1u)); }

fn nan() -> f32 { return bitcast<f32>(0x7fc00000u); }

// is_nan (a bit test) comes from activations.wgsl.

// log(1 + e) for e >= 0 to a few ulps, also where 1 + e rounds to 1. Up to
// e = 1 as 2 atanh(s), s = e / (2 + e) <= 1/3, by its series (terms shrink by
// s^2 <= 1/9): log near 1 has only an absolute error bound (Vulkan: 2^-21,
// NVIDIA's reaches it), too coarse where log(1 + e) is small. inf for e = inf.
fn log1p_f(e: f32) -> f32 {
  if (e > 1.0) { return log(1.0 + e); }
  let s = e / (2.0 + e);
  let s2 = s * s;
  var p = 1.0 / 17.0;
  p = fma(p, s2, 1.0 / 15.0);
  p = fma(p, s2, 1.0 / 13.0);
  p = fma(p, s2, 1.0 / 11.0);
  p = fma(p, s2, 1.0 / 9.0);
  p = fma(p, s2, 1.0 / 7.0);
  p = fma(p, s2, 1.0 / 5.0);
  p = fma(p, s2, 1.0 / 3.0);
  p = fma(p, s2, 1.0);
  return 2.0 * s * p;
}

// torch's softplus: log(1 + exp(beta x)) / beta, or x where beta x > threshold.
fn softplus_f(x: f32, beta: f32, threshold: f32) -> f32 {
  let z = beta * x;
  return select(log1p_f(exp(z)) / beta, x, z > threshold);
}

// tanh with full relative precision near 0 (the exp form loses it to
// cancellation below |x| ~ 0.4) and no overflow for large |x|.
fn tanh_acc(x: f32) -> f32 {
  let z = abs(x);
  if (z < 0.4) {
    let s = x * x;
    return x * (1.0 + s * (-0.33333333 + s * (0.13333333 + s * (-0.053968254 + s * (0.021869488 + s * -0.0088632355)))));
  }
  return tanh_safe(x);
}

// erfc with relative error < 1.2e-7 (Numerical Recipes' Chebyshev fit, as erf_approx).
fn erfc_acc(z: f32) -> f32 {
  let a = abs(z);
  let t = 1.0 / (1.0 + 0.5 * a);
  let r = t * exp(-a * a - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 +
          t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 +
          t * (-0.82215223 + t * 0.17087277)))))))));
  return select(2.0 - r, r, z >= 0.0);
}

// GELU in forms without activations.wgsl's cancellation in 1 + erf / 1 + tanh
// for x << 0: erf form 0.5 x erfc(-x / sqrt 2); tanh form 0.5 x (1 + tanh u) = x sigmoid(2u).
fn gelu_erf(x: f32) -> f32 { return 0.5 * x * erfc_acc(-x * INV_SQRT_2); }
fn gelu_erf_grad(x: f32) -> f32 { return 0.5 * erfc_acc(-x * INV_SQRT_2) + x * INV_SQRT_2PI * exp(-0.5 * x * x); }
fn gelu_tanh_sig(x: f32) -> f32 { return 1.0 / (1.0 + exp(-2.0 * SQRT_2_OVER_PI * (x + 0.044715 * x * x * x))); }
fn gelu_tanh(x: f32) -> f32 { return x * gelu_tanh_sig(x); }
fn gelu_tanh_grad(x: f32) -> f32 {
  let s = gelu_tanh_sig(x);
  return s + 2.0 * x * s * (1.0 - s) * SQRT_2_OVER_PI * (1.0 + 3.0 * 0.044715 * x * x);
}

// x^y as torch.pow: negative bases with integer exponents keep their sign
// rule, other negative bases give NaN; x^0 = 1 (also for x = 0 or NaN);
// 0^y = 0 for y > 0, inf for y < 0 (WGSL's pow leaves x = 0 undefined).
fn pow_f(x: f32, y: f32) -> f32 {
  if (y == 0.0) { return 1.0; }
  if (y == 1.0) { return x; }
  if (y == 2.0) { return x * x; }
  if (x == 0.0) { return select(0.0, bitcast<f32>(0x7f800000u), y < 0.0); }
  let r = pow(abs(x), y);
  if (x >= 0.0) { return r; }
  if (floor(y) != y) { return nan(); }
  return select(r, -r, floor(y * 0.5) * 2.0 != y);
}

fn unary_f(x: f32) -> f32 {
  switch OP {
    case U_COPY: { return x; }
    case U_NEG: { return -x; }
    case U_ABS: { return abs(x); }
    case U_EXP: { return exp(x); }
    case U_LOG: { return log(x); }
    case U_SQRT, U_SQRT_STD: { return sqrt(x); }
    case U_RSQRT: { return 1.0 / sqrt(x); }
    case U_TANH: { return tanh_acc(x); }
    case U_SIGMOID: { return 1.0 / (1.0 + exp(-x)); }
    case U_RELU, U_SILU: { return activate(x); }
    case U_GELU_ERF: { return gelu_erf(x); }
    case U_GELU_TANH: { return gelu_tanh(x); }
    case U_POW_SCALAR: { return pow_f(x, fp.a); }
    case U_CLAMP: {  // NaN in x or a bound gives NaN, as torch
      return select(min(max(x, fp.a), fp.b), nan(), is_nan(x) || is_nan(fp.a) || is_nan(fp.b));
    }
    case U_ADD_SCALAR: { return x + fp.a; }
    case U_MUL_SCALAR: { return x * fp.a; }
    case U_RSUB_SCALAR: { return fp.a - x; }
    case U_RDIV_SCALAR: { return fp.a / x; }
    case U_SOFTPLUS: { return softplus_f(x, fp.a, fp.b); }
    default: { return nan(); }
  }
}

// d f / d x at x, given the forward output y.
fn unary_grad(x: f32, y: f32) -> f32 {
  switch OP {
    case U_COPY: { return 1.0; }
    case U_NEG: { return -1.0; }
    case U_ABS: { return select(sign(x), 0.0, is_nan(x)); }  // torch: sign(NaN) = 0
    case U_EXP: { return y; }
    case U_LOG: { return 1.0 / x; }
    case U_SQRT, U_SQRT_STD: { return 0.5 / y; }
    case U_RSQRT: { return -0.5 * y * y * y; }
    case U_TANH: { return 1.0 - y * y; }
    case U_SIGMOID: { return y * (1.0 - y); }
    case U_RELU: { return select(0.0, 1.0, relu_passes(x)); }
    case U_GELU_ERF: { return gelu_erf_grad(x); }
    case U_GELU_TANH: { return gelu_tanh_grad(x); }
    case U_SILU: { return activate_grad(x); }
    case U_POW_SCALAR: { return select(fp.a * pow_f(x, fp.a - 1.0), 0.0, fp.a == 0.0); }
    case U_CLAMP: { return select(0.0, 1.0, x >= fp.a && x <= fp.b); }
    case U_ADD_SCALAR: { return 1.0; }
    case U_MUL_SCALAR: { return fp.a; }
    case U_RSUB_SCALAR: { return -1.0; }
    case U_RDIV_SCALAR: { return -fp.a / (x * x); }
    case U_SOFTPLUS: {  // torch's: e / (e + 1), e = exp(beta x); 1 where beta x > threshold
      let e = exp(fp.a * x);
      return select(e / (e + 1.0), 1.0, fp.a * x > fp.b);
    }
    default: { return nan(); }
  }
}

// dy * f'(x); ops whose gradient is a mask select dy instead of multiplying
// (torch's threshold_backward / clamp_backward / std_backward: a zeroed
// gradient stays 0 for an infinite or NaN dy).
fn unary_dx(x: f32, y: f32, dy: f32) -> f32 {
  switch OP {
    case U_RELU, U_SILU: { return act_dx(dy, x); }  // relu (ACT 1), silu
    case U_CLAMP: { return select(0.0, dy, x >= fp.a && x <= fp.b); }  // NaN: 0, as torch
    case U_SQRT_STD: { return select(dy * (0.5 / y), 0.0, y == 0.0); }  // std: 0 at std 0
    default: { return dy * unary_grad(x, y); }
  }
}

// res[i] = v (+ beta * res[i]) unless i is past the piece (flat kernels).
fn put_flat(i: u32, v: f32) {
  if (i >= fp.n) { return; }
  var r = v;
  if (fp.beta != 0.0) { r += fp.beta * ldr(i); }
  store_res(i, r);
}

// y = f(x) (+ beta * y)
@compute @workgroup_size(WG)
fn unary(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) lid: u32) {
  let i = thread_elements(wid, nwg, lid);
  let c = clamped(i, fp.n);
  let x = vec4<f32>(ld0(c.x), ld0(c.y), ld0(c.z), ld0(c.w));
  put_flat(i.x, unary_f(x.x));
  put_flat(i.y, unary_f(x.y));
  put_flat(i.z, unary_f(x.z));
  put_flat(i.w, unary_f(x.w));
}

// dx = dy * f'(x) (+ beta * dx)
@compute @workgroup_size(WG)
fn unary_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
  let i = thread_elements(wid, nwg, lid);
  let c = clamped(i, fp.n);
  let x = vec4<f32>(ld0(c.x), ld0(c.y), ld0(c.z), ld0(c.w));
  let y = vec4<f32>(ld1(c.x), ld1(c.y), ld1(c.z), ld1(c.w));
  let dy = vec4<f32>(ld2(c.x), ld2(c.y), ld2(c.z), ld2(c.w));
  put_flat(i.x, unary_dx(x.x, y.x, dy.x));
  put_flat(i.y, unary_dx(x.y, y.y, dy.y));
  put_flat(i.z, unary_dx(x.z, y.z, dy.z));
  put_flat(i.w, unary_dx(x.w, y.w, dy.w));
}

// out = a (the value in fp.a)
@compute @workgroup_size(WG)
fn fill(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
  let i = thread_elements(wid, nwg, lid);
  if (i.x < fp.n) { store_res(i.x, fp.a); }
  if (i.y < fp.n) { store_res(i.y, fp.a); }
  if (i.z < fp.n) { store_res(i.z, fp.a); }
  if (i.w < fp.n) { store_res(i.w, fp.a); }
}

// Element offsets of the four operands for element i of the block.
fn nd_index(i: u32) -> vec4<u32> {
  var rem = i;
  var idx = np.offs;
  for (var d = np.ndim; d > 0u; d--) {
    let k = d - 1u;
    let s = np.shape[k >> 2u][k & 3u];
    idx += (rem % s) * np.strides[k];
    rem /= s;
  }
  return idx;
}

fn binary_f(a: f32, b: f32) -> f32 {
  switch OP {
    case B_ADD: { return a + b; }
    case B_SUB: { return a - b; }
    case B_MUL: { return a * b; }
    case B_DIV: { return a / b; }
    case B_MAXIMUM: { return select(max(a, b), nan(), is_nan(a) || is_nan(b)); }
    case B_MINIMUM: { return select(min(a, b), nan(), is_nan(a) || is_nan(b)); }
    case B_POW: { return pow_f(a, b); }
    case B_GT: { return select(0.0, 1.0, a > b); }
    case B_LT: { return select(0.0, 1.0, a < b); }
    case B_GE: { return select(0.0, 1.0, a >= b); }
    case B_LE: { return select(0.0, 1.0, a <= b); }
    case B_EQ: { return select(0.0, 1.0, a == b); }
    // NaN is unequal to everything, as torch; `!=` alone may compile to an ordered compare (false with NaN).
    case B_NE: { return select(0.0, 1.0, a != b || is_nan(a) || is_nan(b)); }
    case B_EQ_NAN: { return select(0.0, 1.0, a == b || (is_nan(a) && is_nan(b))); }  // NaN equals NaN
    default: { return nan(); }
  }
}

// d op(a, b) / d a (WHICH == 0) or / d b (WHICH == 1).
fn binary_grad(a: f32, b: f32) -> f32 {
  let wa = WHICH == 0u;
  switch OP {
    case B_ADD: { return 1.0; }
    case B_SUB: { return select(-1.0, 1.0, wa); }
    case B_MUL: { return select(a, b, wa); }
    case B_DIV: { return select(-a / (b * b), 1.0 / b, wa); }
    // maximum / minimum as torch: ties split the gradient in halves; the side
    // that lost gets 0; a NaN on either side sends it whole to both (no
    // comparison holds).
    case B_MAXIMUM: { return select(select(1.0, 0.5, a == b), 0.0, select((a > b), (a < b), wa)); }
    case B_MINIMUM: { return select(select(1.0, 0.5, a == b), 0.0, select((a < b), (a > b), wa)); }
    case B_POW: {
      if (wa) { return select(b * pow_f(a, b - 1.0), 0.0, b == 0.0); }
      if (a < 0.0) { return nan(); }  // log(a): torch gives NaN for every negative base
      return select(pow_f(a, b) * log(a), 0.0, a == 0.0 && b >= 0.0);
    }
    default: { return 0.0; }
  }
}

// The four elements' operand offsets (nd_index), each element clamped to the last one.
struct Nd4 { e: vec4<u32>, a: vec4<u32>, b: vec4<u32>, c: vec4<u32>, d: vec4<u32>, }

fn nd_elements(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> Nd4 {
  let e = thread_elements(wid, nwg, lid);
  let k = clamped(e, np.n);
  return Nd4(e, nd_index(k.x), nd_index(k.y), nd_index(k.z), nd_index(k.w));
}

// Stores v at element e (operand offsets idx) unless e is past the block.
fn put_nd(e: u32, idx: vec4<u32>, v: f32) {
  if (e >= np.n) { return; }
  var r = v;
  if (np.beta != 0.0) { r += np.beta * ldr(idx.w); }
  store_res(idx.w, r);
}

// out = op(a, b) (+ beta * out)
@compute @workgroup_size(WG)
fn binary(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
  let q = nd_elements(wid, nwg, lid);
  let a = vec4<f32>(ld0(q.a.x), ld0(q.b.x), ld0(q.c.x), ld0(q.d.x));
  let b = vec4<f32>(ld1(q.a.y), ld1(q.b.y), ld1(q.c.y), ld1(q.d.y));
  put_nd(q.e.x, q.a, binary_f(a.x, b.x));
  put_nd(q.e.y, q.b, binary_f(a.y, b.y));
  put_nd(q.e.z, q.c, binary_f(a.z, b.z));
  put_nd(q.e.w, q.d, binary_f(a.w, b.w));
}

// g = dy * d op / d operand
fn binary_dx(a: f32, b: f32, dy: f32) -> f32 {
  let f = binary_grad(a, b);
  if ((OP == B_MAXIMUM || OP == B_MINIMUM) && f == 0.0) { return 0.0; }  // torch's masked_fill: 0 also for dy = inf / NaN
  return dy * f;
}

// g = dy * d op / d operand (+ beta * g)
@compute @workgroup_size(WG)
fn binary_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) lid: u32) {
  let q = nd_elements(wid, nwg, lid);
  let a = vec4<f32>(ld0(q.a.x), ld0(q.b.x), ld0(q.c.x), ld0(q.d.x));
  let b = vec4<f32>(ld1(q.a.y), ld1(q.b.y), ld1(q.c.y), ld1(q.d.y));
  let dy = vec4<f32>(ld2(q.a.z), ld2(q.b.z), ld2(q.c.z), ld2(q.d.z));
  put_nd(q.e.x, q.a, binary_dx(a.x, b.x, dy.x));
  put_nd(q.e.y, q.b, binary_dx(a.y, b.y, dy.y));
  put_nd(q.e.z, q.c, binary_dx(a.z, b.z, dy.z));
  put_nd(q.e.w, q.d, binary_dx(a.w, b.w, dy.w));
}

// A condition operand's truth: nonzero, NaN included (torch's bool(NaN); an ordered `!=` says false).
fn truthy(c: f32) -> bool { return c != 0.0 || is_nan(c); }

// out = cond != 0 ? a : b (+ beta * out)
@compute @workgroup_size(WG)
fn where_select(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
  let q = nd_elements(wid, nwg, lid);
  let a = vec4<f32>(ld0(q.a.x), ld0(q.b.x), ld0(q.c.x), ld0(q.d.x));
  let b = vec4<f32>(ld1(q.a.y), ld1(q.b.y), ld1(q.c.y), ld1(q.d.y));
  let cond = vec4<f32>(ld2(q.a.z), ld2(q.b.z), ld2(q.c.z), ld2(q.d.z));
  put_nd(q.e.x, q.a, select(b.x, a.x, truthy(cond.x)));
  put_nd(q.e.y, q.b, select(b.y, a.y, truthy(cond.y)));
  put_nd(q.e.z, q.c, select(b.z, a.z, truthy(cond.z)));
  put_nd(q.e.w, q.d, select(b.w, a.w, truthy(cond.w)));
}

// dst = src (+ beta * dst), both strided (also a cast where T0 and TR differ)
@compute @workgroup_size(WG)
fn strided_copy(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
  let q = nd_elements(wid, nwg, lid);
  let a = vec4<f32>(ld0(q.a.x), ld0(q.b.x), ld0(q.c.x), ld0(q.d.x));
  put_nd(q.e.x, q.a, a.x);
  put_nd(q.e.y, q.b, a.y);
  put_nd(q.e.z, q.c, a.z);
  put_nd(q.e.w, q.d, a.w);
}

// dst = src, both strided, bit for bit (any 32-bit dtype)
@compute @workgroup_size(WG)
fn copy_bits(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
  let q = nd_elements(wid, nwg, lid);
  let v = vec4<u32>(in0_bits[q.a.x], in0_bits[q.b.x], in0_bits[q.c.x], in0_bits[q.d.x]);
  if (q.e.x < np.n) { res_bits[q.a.w] = v.x; }
  if (q.e.y < np.n) { res_bits[q.b.w] = v.y; }
  if (q.e.z < np.n) { res_bits[q.c.w] = v.z; }
  if (q.e.w < np.n) { res_bits[q.d.w] = v.w; }
}

// Half e & 1 of word e / 2 of in0 (little-endian, as NumPy stores float16) into
// element `dst` of res_words, whose other half stays as it is.
fn put_half_bits(e: u32, src: u32, dst: u32) {
  if (e >= np.n) { return; }
  let h = (in0_bits[src >> 1u] >> (16u * (src & 1u))) & 0xffffu;
  let shift = 16u * (dst & 1u);
  atomicAnd(&res_words[dst >> 1u], ~(0xffffu << shift));
  atomicOr(&res_words[dst >> 1u], h << shift);
}

// dst = src, both strided, bit for bit, 2-byte elements (float16).
@compute @workgroup_size(WG)
fn copy_half_bits(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
  let q = nd_elements(wid, nwg, lid);
  put_half_bits(q.e.x, q.a.x, q.a.w);
  put_half_bits(q.e.y, q.b.x, q.b.w);
  put_half_bits(q.e.z, q.c.x, q.c.w);
  put_half_bits(q.e.w, q.d.x, q.d.w);
}
