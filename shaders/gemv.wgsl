// y = alpha * x * op(B) + beta * y for one row x (GEMM with M = 1), memory bound.
// TRANS_B = false: B is K x N; 32 columns per workgroup (gemv_vec4: 32 column
//   quads read as 128-bit loads, 128 columns), 8 lanes split K, so each row of
//   B is read by 32 consecutive threads.
// TRANS_B = true:  B is N x K; 8 outputs per workgroup, 32 lanes split each dot
//   product, so each row of B is read contiguously.
// Both forms split K over workgroup rows (k_chunk below): the host keeps every
// chunk at most 32768 long, so no lane loops over an unbounded K (lavapipe
// silently ends loops after 65535 iterations; dispatch_util.hpp).

struct GemvParams {
  n: u32, k: u32, ldb: u32,
  x_off: u32, b_off: u32, y_off: u32,
  alpha: f32, beta: f32,
  // Split-K: workgroup row y sums k in
  // [y * k_chunk, (y + 1) * k_chunk) and writes split_stride floats further on.
  k_chunk: u32, split_stride: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: GemvParams;
// b and x again as vec4s (the vec4 forms: their offsets and ldb multiples of 4).
@group(0) @binding(4) var<storage, read> b4: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read> x4: array<vec4<f32>>;

var<workgroup> partial: array<f32, 256>;
var<workgroup> partial4: array<vec4<f32>, 256>;


fn store(n: u32, s: f32, split: u32) {
  let idx = p.y_off + split * p.split_stride + n;
  var v = p.alpha * s;
  if (p.beta != 0.0) { v = fma(p.beta, y[idx], v); }
  y[idx] = v;
}

// The row forms: the 32 lanes (lid.x) of workgroup row lid.y each hold a
// part s of output n's dot product; their sum is stored as a tree.
fn sum_row_lanes_and_store(lid: vec3<u32>, n: u32, s: f32, split: u32) {
  partial[lid.y * 32u + lid.x] = s;
  for (var stride = 16u; stride > 0u; stride >>= 1u) {
    workgroupBarrier();
    if (lid.x < stride) { partial[lid.y * 32u + lid.x] += partial[lid.y * 32u + lid.x + stride]; }
  }
  workgroupBarrier();
  if (lid.x == 0u && n < p.n) { store(n, partial[lid.y * 32u], split); }
}

// Column form with 128-bit loads: thread (x, y) owns columns 4x..4x+3 of the
// workgroup's 4 * GV_X and sums every GV_Y-th k of the chunk. GV_X (emitted
// by the host) is 32 for the split-K form, fewer where enough column blocks
// fill the GPU in one pass. Measured on the H100 (docs/gemm_notes.md #36):
// 8 chains beat 4 on 1x1024x4096 (15.3 vs 17.5 us); 16 did not help.
const GV_Y: u32 = 256u / GV_X;
const CHAINS: u32 = 8u;
@compute @workgroup_size(GV_X, GV_Y)
fn gemv_vec4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let n = wid.x * 4u * GV_X + lid.x * 4u;
  var total = vec4<f32>(0.0);
  if (n < p.n) {
    let col = (p.b_off + n) / 4u;
    let ld4 = p.ldb / 4u;
    let k_end = min(p.k, (wid.y + 1u) * p.k_chunk);
    var k = wid.y * p.k_chunk + lid.y;
    // CHAINS independent sums keep CHAINS 128-bit loads in flight per thread.
    var s: array<vec4<f32>, CHAINS>;
    for (; k + (CHAINS - 1u) * GV_Y < k_end; k += CHAINS * GV_Y) {
      for (var c = 0u; c < CHAINS; c++) {
        let kc = k + c * GV_Y;
        s[c] = fma(vec4<f32>(x[p.x_off + kc]), b4[col + kc * ld4], s[c]);
      }
    }
    for (; k < k_end; k += GV_Y) { s[0] = fma(vec4<f32>(x[p.x_off + k]), b4[col + k * ld4], s[0]); }
    for (var c = 0u; c < CHAINS; c++) { total += s[c]; }
  }
  // The GV_Y lanes of a column quad are summed as a tree.
  partial4[lid.y * GV_X + lid.x] = total;
  for (var half = GV_Y / 2u; half > 0u; half >>= 1u) {
    workgroupBarrier();
    if (lid.y < half) { partial4[lid.y * GV_X + lid.x] += partial4[(lid.y + half) * GV_X + lid.x]; }
  }
  if (lid.y == 0u && n < p.n) {
    let sum = partial4[lid.x];
    for (var q = 0u; q < 4u; q++) { store(n + q, sum[q], wid.y); }
  }
}

// Row form with 128-bit loads (TRANS_B; k, ldb, b_off, x_off and k_chunk
// multiples of 4): the 32 lanes of workgroup row y read output n's row of B
// and x as vec4s, CHAINS_T loads in flight per lane; 8 outputs per workgroup.
const CHAINS_T: u32 = 4u;
@compute @workgroup_size(32, 8)
fn gemv_t_vec4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let n = wid.x * 8u + lid.y;
  var s = 0.0;
  if (n < p.n) {
    let row4 = (p.b_off + n * p.ldb) / 4u;
    let x4_off = p.x_off / 4u;
    let k4_end = min(p.k, (wid.y + 1u) * p.k_chunk) / 4u;
    var k4 = wid.y * p.k_chunk / 4u + lid.x;
    var acc = array<vec4<f32>, CHAINS_T>();
    for (; k4 + (CHAINS_T - 1u) * 32u < k4_end; k4 += CHAINS_T * 32u) {
      for (var c = 0u; c < CHAINS_T; c++) {
        acc[c] = fma(x4[x4_off + k4 + c * 32u], b4[row4 + k4 + c * 32u], acc[c]);
      }
    }
    for (; k4 < k4_end; k4 += 32u) { acc[0] = fma(x4[x4_off + k4], b4[row4 + k4], acc[0]); }
    var t = acc[0];
    for (var c = 1u; c < CHAINS_T; c++) { t += acc[c]; }
    s = t.x + t.y + t.z + t.w;
  }
  sum_row_lanes_and_store(lid, n, s, wid.y);
}

@compute @workgroup_size(32, 8)
fn gemv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  var s = 0.0;
  var n: u32;
  if (TRANS_B) {
    n = wid.x * 8u + lid.y;
    if (n < p.n) {
      let row = p.b_off + n * p.ldb;
      let k_end = min(p.k, (wid.y + 1u) * p.k_chunk);
      // Four independent chains keep several loads in flight per thread.
      var s4 = vec4<f32>(0.0);
      var k = wid.y * p.k_chunk + lid.x;
      for (; k + 96u < k_end; k += 128u) {
        s4 = fma(vec4<f32>(x[p.x_off + k], x[p.x_off + k + 32u], x[p.x_off + k + 64u], x[p.x_off + k + 96u]),
                 vec4<f32>(b[row + k], b[row + k + 32u], b[row + k + 64u], b[row + k + 96u]), s4);
      }
      for (; k < k_end; k += 32u) { s4.x = fma(x[p.x_off + k], b[row + k], s4.x); }
      s = s4.x + s4.y + s4.z + s4.w;
    }
  } else {
    n = wid.x * 32u + lid.x;
    if (n < p.n) {
      var s4 = vec4<f32>(0.0);
      let col = p.b_off + n;
      let k_end = min(p.k, (wid.y + 1u) * p.k_chunk);
      var k = wid.y * p.k_chunk + lid.y;
      for (; k + 24u < k_end; k += 32u) {
        s4 = fma(vec4<f32>(x[p.x_off + k], x[p.x_off + k + 8u], x[p.x_off + k + 16u], x[p.x_off + k + 24u]),
                 vec4<f32>(b[col + k * p.ldb], b[col + (k + 8u) * p.ldb], b[col + (k + 16u) * p.ldb],
                           b[col + (k + 24u) * p.ldb]), s4);
      }
      for (; k < k_end; k += 8u) { s4.x = fma(x[p.x_off + k], b[col + k * p.ldb], s4.x); }
      s = s4.x + s4.y + s4.z + s4.w;
    }
  }
  if (TRANS_B) {
    sum_row_lanes_and_store(lid, n, s, wid.y);
  } else {
    partial[lid.y * 32u + lid.x] = s;
    workgroupBarrier();
    if (lid.y == 0u && n < p.n) {
      var t = 0.0;
      for (var l = 0u; l < 8u; l++) { t += partial[l * 32u + lid.x]; }
      store(n, t, wid.y);
    }
  }
}
