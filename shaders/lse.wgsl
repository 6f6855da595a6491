// A one-pass log-sum-exp, shared by the kernels that need a row's max and its
// sum of exp(x - max) (pulled in with `//!include lse`): acc = (running max m,
// sum of exp(x - m)), the sum rescaled when x raises the max, so the row is
// read once. One exp per element: exp(-|x - m|) is exp(x - m) below the max and
// the rescale exp(m - x) above it. A NaN x makes the sum NaN; lse_sum makes it
// NaN under an infinite max too.
const LSE_START = vec2<f32>(-3.4028235e38, 0.0);

fn lse_add(acc: vec2<f32>, x: f32) -> vec2<f32> {
  let e = exp(-abs(x - acc.x));
  let up = x > acc.x;
  return vec2<f32>(select(acc.x, x, up), select(acc.y + e, acc.y * e + 1.0, up));
}

fn lse_merge(a: vec2<f32>, b: vec2<f32>) -> vec2<f32> {
  let m = max(a.x, b.x);
  return vec2<f32>(m, a.y * exp(a.x - m) + b.y * exp(b.x - m));
}

// The workgroup's accumulators merged in a tree (WG threads, the including
// shader's constant); every thread gets the total. Call from uniform control flow.
var<workgroup> lse_partials: array<vec2<f32>, WG>;

fn lse_workgroup(lid: u32, acc: vec2<f32>) -> vec2<f32> {
  workgroupBarrier();
  lse_partials[lid] = acc;
  workgroupBarrier();
  for (var h = WG / 2u; h > 0u; h >>= 1u) {
    if (lid < h) { lse_partials[lid] = lse_merge(lse_partials[lid], lse_partials[lid + h]); }
    workgroupBarrier();
  }
  return lse_partials[0];
}

// The sum of a finished accumulator: NaN under an infinite max, as torch's
// softmax meets inf - inf there.
fn lse_sum(acc: vec2<f32>) -> f32 {
  return select(acc.y, bitcast<f32>(0x7fc00000u), acc.x > 3.4028235e38);
}
