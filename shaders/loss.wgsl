// Losses with their gradients in the same pass. Per-row / per-element losses
// go to `losses`; reduce.wgsl's finalize_sum turns them into the mean.

struct XentParams { rows: u32, cols: u32, grad_scale: f32, _pad: u32, }
struct MseParams { n: u32, grad_scale: f32, }

@group(0) @binding(0) var<storage, read> logits: array<f32>;
@group(0) @binding(1) var<storage, read> labels: array<i32>;
@group(0) @binding(2) var<storage, read_write> dlogits: array<f32>;
@group(0) @binding(3) var<storage, read_write> losses: array<f32>;
@group(0) @binding(4) var<uniform> xp: XentParams;

@group(0) @binding(5) var<storage, read> pred: array<f32>;
@group(0) @binding(6) var<storage, read> targets: array<f32>;
@group(0) @binding(7) var<uniform> mp: MseParams;

var<workgroup> scratch: array<f32, 64>;

fn row_reduce(lid: u32, v: f32, is_max: bool) -> f32 {
  workgroupBarrier();
  scratch[lid] = v;
  workgroupBarrier();
  for (var stride = 32u; stride > 0u; stride >>= 1u) {
    if (lid < stride) {
      if (is_max) { scratch[lid] = max(scratch[lid], scratch[lid + stride]); }
      else { scratch[lid] += scratch[lid + stride]; }
    }
    workgroupBarrier();
  }
  return scratch[0];
}

// One workgroup per row: loss = logsumexp(x) - x[label];
// dlogits = grad_scale * (softmax(x) - onehot(label)). Labels outside
// [0, cols) give a NaN loss rather than reading out of bounds.
@compute @workgroup_size(64)
fn softmax_xent(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
  let row = wid.y * nwg.x + wid.x;
  let valid = row < xp.rows;  // uniform per workgroup
  let base = row * xp.cols;
  var mx = -3.4028235e38;
  if (valid) { for (var j = lid; j < xp.cols; j += 64u) { mx = max(mx, logits[base + j]); } }
  mx = row_reduce(lid, mx, true);
  var se = 0.0;
  if (valid) { for (var j = lid; j < xp.cols; j += 64u) { se += exp(logits[base + j] - mx); } }
  se = row_reduce(lid, se, false);
  if (!valid) { return; }
  let label = labels[row];
  let in_range = label >= 0 && u32(label) < xp.cols;
  for (var j = lid; j < xp.cols; j += 64u) {
    let sm = exp(logits[base + j] - mx) / se;
    dlogits[base + j] = xp.grad_scale * (sm - select(0.0, 1.0, i32(j) == label));
  }
  if (lid == 0u) {
    let lse = mx + log(se);
    losses[row] = select(bitcast<f32>(0x7fc00000u), lse - logits[base + u32(max(label, 0))], in_range);
  }
}

// Elementwise squared error; dpred = grad_scale * (pred - target).
@compute @workgroup_size(256)
fn mse(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
       @builtin(local_invocation_index) lid: u32) {
  let i = (wid.y * nwg.x + wid.x) * 256u + lid;
  if (i >= mp.n) { return; }
  let d = pred[i] - targets[i];
  dlogits[i] = mp.grad_scale * d;
  losses[i] = d * d;
}
