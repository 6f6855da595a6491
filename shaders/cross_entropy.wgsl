// Softmax cross-entropy over [rows, cols] logits with int32 labels, fused:
// the forward keeps two numbers per row, its max m and log(sum(exp(x - m)))
// (no [rows, cols] softmax or gradient is stored), the backward recomputes the
// softmax from the logits. Like torch's log_softmax, x - m is formed before
// the log-sum is subtracted: m + log-sum, rounded to m's magnitude, would lose
// the log-sum for logits of 1e4 and more.
// Rows whose label is IGNORE contribute 0 and do not count in the mean; other
// labels outside [0, cols) give a NaN loss (never an out-of-bounds read).
// Logits past one storage binding run in row blocks (row0 / x_off).
// LT (an alias emitted per kernel): the element type of the logits and their
// gradient, f32 or f16 (HALF: bool, LT is f16); the math is f32 either way.
//!include half
//!include lse

struct XentParams {
  rows: u32, cols: u32, row0: u32, x_off: u32,  // block: rows row0..row0+rows, logits from x_off in the binding
  ignore_index: i32, per_row: u32, beta: f32, _pad: u32,
}

@group(0) @binding(0) var<storage, read> logits: array<LT>;
@group(0) @binding(1) var<storage, read> labels: array<i32>;
@group(0) @binding(2) var<storage, read_write> row_stats: array<vec2<f32>>;  // forward: (max, log-sum) per row
@group(0) @binding(3) var<storage, read_write> row_loss: array<f32>;   // forward: loss per row (0 if ignored)
@group(0) @binding(4) var<storage, read_write> row_valid: array<f32>;  // forward: 1 counted, 0 ignored
@group(0) @binding(5) var<uniform> xp: XentParams;
@group(0) @binding(6) var<storage, read> stats_in: array<vec2<f32>>;  // backward: row_stats
@group(0) @binding(7) var<storage, read> upstream: array<f32>;         // backward: d(loss) (1 value, or per row)
@group(0) @binding(8) var<storage, read> scale_in: array<f32>;         // backward: the forward's gradient scale
@group(0) @binding(9) var<storage, read_write> dlogits: array<LT>;
// finalize
struct XentFinalParams { rows: u32, mean: u32, }
@group(0) @binding(10) var<storage, read> fin_loss: array<f32>;
@group(0) @binding(11) var<storage, read> fin_valid: array<f32>;
@group(0) @binding(12) var<storage, read_write> fin_out: array<f32>;   // the loss
@group(0) @binding(14) var<storage, read_write> fin_scale: array<f32>; // the gradient scale
@group(0) @binding(13) var<uniform> fp: XentFinalParams;

// WG comes from csrc/shader_contract.hpp.
var<workgroup> red: array<f32, WG>;

fn wg_sum(lid: u32, v: f32) -> f32 {
  workgroupBarrier();
  red[lid] = v;
  workgroupBarrier();
  for (var s = WG / 2u; s > 0u; s >>= 1u) {
    if (lid < s) { red[lid] += red[lid + s]; }
    workgroupBarrier();
  }
  return red[0];
}

fn row_of(wid: vec3<u32>, nwg: vec3<u32>) -> u32 { return wid.y * nwg.x + wid.x; }

// Writes row r's statistics (max mx, sum of exp(x - mx) se), loss and count.
fn finish_row(r: u32, base: u32, mx: f32, se: f32) {
  let row = xp.row0 + r;
  let label = labels[row];
  let ls = log(se);  // NaN for a +inf logit (lse_sum), as torch
  row_stats[row] = vec2<f32>(mx, ls);
  if (label == xp.ignore_index) {
    row_loss[row] = 0.0;
    row_valid[row] = 0.0;
  } else if (label < 0 || u32(label) >= xp.cols) {
    row_loss[row] = bitcast<f32>(0x7fc00000u);
    row_valid[row] = 1.0;
  } else {
    row_loss[row] = ls - (f32(logits[base + u32(label)]) - mx);
    row_valid[row] = 1.0;
  }
}

// A workgroup per row (long rows): the row read once (lse.wgsl; two passes over
// GPT-2's 50,304-wide rows read 1.6 GB twice, none of a row left in the L2 by
// the second), four loads in flight per thread.
@compute @workgroup_size(WG)
fn xent_forward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
  let r = row_of(wid, nwg);
  let valid = r < xp.rows;  // uniform per workgroup
  let base = xp.x_off + r * xp.cols;
  var acc = LSE_START;
  if (valid) {
    var j = lid;
    for (; j + 3u * WG < xp.cols; j += 4u * WG) {
      let v0 = f32(logits[base + j]);
      let v1 = f32(logits[base + j + WG]);
      let v2 = f32(logits[base + j + 2u * WG]);
      let v3 = f32(logits[base + j + 3u * WG]);
      acc = lse_add(lse_add(lse_add(lse_add(acc, v0), v1), v2), v3);
    }
    for (; j < xp.cols; j += WG) { acc = lse_add(acc, f32(logits[base + j])); }
  }
  let tot = lse_workgroup(lid, acc);
  if (!valid || lid != 0u) { return; }
  finish_row(r, base, tot.x, lse_sum(tot));
}

// Short rows (short_row_cols of csrc/dispatch_util.hpp): a thread per row, WG rows
// per workgroup, no barriers (a workgroup per row of 8 classes leaves 248 of 256 idle).
@compute @workgroup_size(WG)
fn xent_forward_short(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                      @builtin(local_invocation_index) lid: u32) {
  let r = row_of(wid, nwg) * WG + lid;
  if (r >= xp.rows) { return; }
  let base = xp.x_off + r * xp.cols;
  var acc = LSE_START;
  for (var j = 0u; j < xp.cols; j++) { acc = lse_add(acc, f32(logits[base + j])); }
  finish_row(r, base, acc.x, lse_sum(acc));
}

// One workgroup: loss = sum(loss) / count (mean) or sum(loss); scale = the
// gradient scale (1 / count, or 1). Four chains per thread keep long row
// lists from being one dependent add chain.
@compute @workgroup_size(WG)
fn xent_finalize(@builtin(local_invocation_index) lid: u32) {
  var s = vec4<f32>(0.0);
  var c = vec4<f32>(0.0);
  var i = lid;
  for (; i + 3u * WG < fp.rows; i += 4u * WG) {
    s += vec4<f32>(fin_loss[i], fin_loss[i + WG], fin_loss[i + 2u * WG], fin_loss[i + 3u * WG]);
    c += vec4<f32>(fin_valid[i], fin_valid[i + WG], fin_valid[i + 2u * WG], fin_valid[i + 3u * WG]);
  }
  for (; i < fp.rows; i += WG) { s.x += fin_loss[i]; c.x += fin_valid[i]; }
  let total = wg_sum(lid, (s.x + s.y) + (s.z + s.w));
  let count = wg_sum(lid, (c.x + c.y) + (c.z + c.w));
  if (lid == 0u) {
    // torch: the mean over zero counted rows is 0/0 = NaN.
    let scale = select(1.0, 1.0 / count, fp.mean != 0u);
    fin_out[0] = select(total, total / count, fp.mean != 0u);
    fin_scale[0] = scale;
  }
}

// dlogits = (softmax(x) - onehot(label)) * d(loss) * scale (+ beta * dlogits); ignored rows get 0.
// Threads lid, lid + stride, ... < cols of row r.
fn backward_row(r: u32, first: u32, stride: u32) {
  let row = xp.row0 + r;
  let label = labels[row];
  let base = xp.x_off + r * xp.cols;
  var g = 0.0;
  if (label != xp.ignore_index) {
    g = select(upstream[0] * scale_in[0], upstream[row], xp.per_row != 0u);
  }
  let st = stats_in[row];
  for (var j = first; j < xp.cols; j += stride) {
    let p = exp((f32(logits[base + j]) - st.x) - st.y);
    var v = g * (p - select(0.0, 1.0, i32(j) == label));
    if (xp.beta != 0.0) { v += xp.beta * f32(dlogits[base + j]); }
    dlogits[base + j] = LT(half_range(v, HALF));
  }
}

@compute @workgroup_size(WG)
fn xent_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
  let r = row_of(wid, nwg);
  if (r < xp.rows) { backward_row(r, lid, WG); }
}

@compute @workgroup_size(WG)
fn xent_backward_short(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                       @builtin(local_invocation_index) lid: u32) {
  let r = row_of(wid, nwg) * WG + lid;
  if (r < xp.rows) { backward_row(r, 0u, 1u); }
}
