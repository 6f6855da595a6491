// Fused LayerNorm over the rows of x [rows, cols] (csrc/layernorm.cpp).
// Forward: y = (x - mean) * rstd * weight + bias, mean and rstd = 1 / sqrt(var + eps)
// saved per row. Backward: dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * weight,
// and per-slot partial sums of dy * xhat and dy over rows (one partial row per row slot of a
// workgroup, no atomics) that ln_param_grads sums over slots in a fixed order.
//
// A workgroup of 256 threads handles 256 / tpr rows at a time, tpr threads per row (tpr a
// power of two <= 256: narrow rows share a workgroup). Statistics are two-pass around a shift
// (the row's first element), so a large mean costs no precision: the deviations x - shift
// are exact for values close to each other and are what gets summed. The backward recenters
// with the mean of x - saved mean (the saved fp32 mean is rounded; that residual is not).
// Operands past one storage binding run in row blocks: x_off / y_off / s_off are the block's
// first element in the XT bindings (x, dx), the f32 x-shaped ones (y, dy) and the per-row ones
// (mean, rstd). XT (an alias emitted per kernel): the element type of x and dx, f32 or f16
// (HALF: bool, XT is f16); y, the statistics and the math are f32 either way.
//!include half

struct LnParams {
  rows: u32,      // rows of this block
  cols: u32,
  x_off: u32,    // x, dx
  s_off: u32,
  tpr: u32,       // threads per row
  seg_rows: u32,  // backward: rows each row slot walks (its partial row sums them)
  flags: u32,     // HAS_W | HAS_B | WANT_DX | WANT_PARTS | WANT_DW | WANT_DB
  eps: f32,
  beta: f32,      // dx (+ beta * dx)
  beta_w: f32,    // dweight
  beta_b: f32,    // dbias
  parts: u32,     // partial rows of this block (backward writes, ln_param_grads reads)
  y_off: u32,     // y, dy
}

// The flags (HAS_W, ...), WG (threads per row workgroup) and COLS (columns per
// ln_param_grads workgroup) come from csrc/shader_contract.hpp.

@group(0) @binding(0) var<storage, read> x: array<XT>;
@group(0) @binding(1) var<storage, read> weight: array<f32>;          // [cols] (x when absent, not read)
@group(0) @binding(2) var<storage, read> bias: array<f32>;            // [cols] (x when absent, not read)
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read_write> mean_out: array<f32>;
@group(0) @binding(5) var<storage, read_write> rstd_out: array<f32>;
@group(0) @binding(6) var<uniform> lp: LnParams;
@group(0) @binding(7) var<storage, read> dy: array<f32>;
@group(0) @binding(8) var<storage, read> mean_in: array<f32>;
@group(0) @binding(9) var<storage, read> rstd_in: array<f32>;
@group(0) @binding(10) var<storage, read_write> dx: array<XT>;
@group(0) @binding(11) var<storage, read_write> parts: array<f32>;    // [2][parts][cols]: dy * xhat, then dy
@group(0) @binding(12) var<storage, read> parts_in: array<f32>;
@group(0) @binding(13) var<storage, read_write> dweight: array<f32>;
@group(0) @binding(14) var<storage, read_write> dbias: array<f32>;

var<workgroup> red: array<vec4<f32>, WG>;

// Sums v over the tpr threads of each row slot (threads slot * tpr ..); every thread gets its slot's sum.
fn slot_sum(lid: u32, v: vec4<f32>) -> vec4<f32> {
  let lane = lid % lp.tpr;
  workgroupBarrier();
  red[lid] = v;
  workgroupBarrier();
  for (var s = lp.tpr / 2u; s > 0u; s >>= 1u) {
    if (lane < s) { red[lid] += red[lid + s]; }
    workgroupBarrier();
  }
  return red[lid - lane];
}

fn x_at(i: u32) -> f32 { return f32(x[i]); }

fn w_at(j: u32) -> f32 {
  if ((lp.flags & HAS_W) != 0u) { return weight[j]; }
  return 1.0;
}

@compute @workgroup_size(WG)
fn ln_forward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
  let t = lp.tpr;
  let lane = lid % t;
  let r = (wid.y * nwg.x + wid.x) * (WG / t) + lid / t;
  let valid = r < lp.rows;
  let n = lp.cols;
  let nf = f32(n);
  let base = lp.x_off + r * n;
  var shift = 0.0;
  var s = 0.0;
  if (valid) {
    shift = x_at(base);
    for (var j = lane; j < n; j += t) { s += x_at(base + j) - shift; }
  }
  let m1 = slot_sum(lid, vec4<f32>(s, 0.0, 0.0, 0.0)).x / nf;  // mean - shift
  var q = vec2<f32>(0.0);
  if (valid) {
    for (var j = lane; j < n; j += t) {
      let d = (x_at(base + j) - shift) - m1;
      q += vec2<f32>(d * d, d);
    }
  }
  let qs = slot_sum(lid, vec4<f32>(q, 0.0, 0.0)).xy;
  // Corrected two-pass variance: the second term removes what rounding left in m1.
  let variance = max(qs.x - qs.y * qs.y / nf, 0.0) / nf;
  let rstd = 1.0 / sqrt(variance + lp.eps);
  if (!valid) { return; }
  if (lane == 0u) {
    mean_out[lp.s_off + r] = shift + m1;
    rstd_out[lp.s_off + r] = rstd;
  }
  let has_b = (lp.flags & HAS_B) != 0u;
  let ybase = lp.y_off + r * n;
  for (var j = lane; j < n; j += t) {
    var v = ((x_at(base + j) - shift) - m1) * rstd * w_at(j);
    if (has_b) { v += bias[j]; }
    y[ybase + j] = v;
  }
}

// Workgroup g walks rows g * seg_rows * rpw + k * rpw + slot, k < seg_rows (rpw = 256 / tpr):
// dx for each, and the sums of dy * xhat and dy over its rows into partial row g * rpw + slot.
@compute @workgroup_size(WG)
fn ln_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
  let t = lp.tpr;
  let rpw = WG / t;
  let lane = lid % t;
  let slot = lid / t;
  let g = wid.y * nwg.x + wid.x;
  let n = lp.cols;
  let nf = f32(n);
  let want_dx = (lp.flags & WANT_DX) != 0u;
  let want_parts = (lp.flags & WANT_PARTS) != 0u;
  let prow = (g * rpw + slot) * n;     // this slot's partial row (dy * xhat)
  let brow = (lp.parts + g * rpw + slot) * n;  // ... and its dy row
  for (var k = 0u; k < lp.seg_rows; k++) {
    let first = (g * lp.seg_rows + k) * rpw;
    if (first >= lp.rows) { break; }  // uniform: depends on the workgroup only
    let r = first + slot;
    let valid = r < lp.rows;
    let base = lp.x_off + r * n;
    let ybase = lp.y_off + r * n;
    var mu = 0.0;
    var rs = 0.0;
    var acc = vec3<f32>(0.0);
    if (valid) {
      mu = mean_in[lp.s_off + r];
      rs = rstd_in[lp.s_off + r];
      for (var j = lane; j < n; j += t) {
        let e = x_at(base + j) - mu;
        let gj = dy[ybase + j] * w_at(j);
        acc += vec3<f32>(e, gj, gj * e);
      }
    }
    let sums = slot_sum(lid, vec4<f32>(acc, 0.0)).xyz;
    let c = sums.x / nf;                        // true mean - saved mean
    let mg = sums.y / nf;                       // mean(g)
    let mgx = rs * (sums.z - c * sums.y) / nf;  // mean(g * xhat)
    if (valid) {
      for (var j = lane; j < n; j += t) {
        let d = dy[ybase + j];
        let xh = ((x_at(base + j) - mu) - c) * rs;
        if (want_dx) {
          var v = rs * (d * w_at(j) - mg - xh * mgx);
          if (lp.beta != 0.0) { v += lp.beta * f32(dx[base + j]); }
          dx[base + j] = XT(half_range(v, HALF));
        }
        if (want_parts) {
          if (k == 0u) {
            parts[prow + j] = d * xh;
            parts[brow + j] = d;
          } else {
            parts[prow + j] += d * xh;
            parts[brow + j] += d;
          }
        }
      }
    } else if (k == 0u && want_parts) {  // a slot without rows still owns a partial row
      for (var j = lane; j < n; j += t) {
        parts[prow + j] = 0.0;
        parts[brow + j] = 0.0;
      }
    }
  }
}

// dweight[j] = sum over partial rows p of parts[p][j] (+ beta_w * dweight), dbias likewise from
// the dy rows: 16 columns x 16 lanes per workgroup, lanes striding the partial rows, then a tree.
@compute @workgroup_size(COLS, 16)
fn ln_param_grads(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_id) lid: vec3<u32>) {
  let n = lp.cols;
  let j = (wid.y * nwg.x + wid.x) * COLS + lid.x;
  let ok = j < n;
  var s = vec2<f32>(0.0);
  if (ok) {
    for (var p = lid.y; p < lp.parts; p += 16u) {
      s += vec2<f32>(parts_in[p * n + j], parts_in[(lp.parts + p) * n + j]);
    }
  }
  let me = lid.y * 16u + lid.x;
  red[me] = vec4<f32>(s, 0.0, 0.0);
  workgroupBarrier();
  for (var h = 8u; h > 0u; h >>= 1u) {
    if (lid.y < h) { red[me] += red[me + h * 16u]; }
    workgroupBarrier();
  }
  if (lid.y != 0u || !ok) { return; }
  let tot = red[lid.x];
  if ((lp.flags & WANT_DW) != 0u) {
    var v = tot.x;
    if (lp.beta_w != 0.0) { v += lp.beta_w * dweight[j]; }
    dweight[j] = v;
  }
  if ((lp.flags & WANT_DB) != 0u) {
    var v = tot.y;
    if (lp.beta_b != 0.0) { v += lp.beta_b * dbias[j]; }
    dbias[j] = v;
  }
}
