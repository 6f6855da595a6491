// Linear-layer pieces around the GEMMs: activation backward, bias gradient,
// and the unfused bias + activation used when a GEMM had to be split along K.
//!include activations

struct EwParams { n: u32, cols: u32, bias_off: u32, _pad: u32, }
struct ColParams { rows: u32, cols: u32, beta: f32, _pad: u32, }

@group(0) @binding(0) var<storage, read> upstream: array<f32>;   // dY, or Z for bias_act
@group(0) @binding(1) var<storage, read> preact: array<f32>;     // Z
@group(0) @binding(2) var<storage, read_write> result: array<f32>;
@group(0) @binding(3) var<uniform> ep: EwParams;
@group(0) @binding(4) var<storage, read> bias: array<f32>;
@group(0) @binding(5) var<storage, read_write> zio: array<f32>;  // Z, biased in place
@group(0) @binding(6) var<uniform> cp: ColParams;

fn linear_index(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
  return (wid.y * nwg.x + wid.x) * 256u + lid;
}

// dZ = dY * act'(Z)
@compute @workgroup_size(256)
fn act_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
  let i = linear_index(wid, nwg, lid);
  if (i < ep.n) { result[i] = upstream[i] * activate_grad(preact[i]); }
}

// Z += bias (per column); Y = act(Z).
@compute @workgroup_size(256)
fn bias_act(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
  let i = linear_index(wid, nwg, lid);
  if (i < ep.n) {
    let z = zio[i] + bias[ep.bias_off + i % ep.cols];
    zio[i] = z;
    result[i] = activate(z);
  }
}

var<workgroup> colsum: array<f32, 256>;

// db[j] = sum_i dZ[i, j] (+ beta * db[j]); 64 columns x 4 row lanes per workgroup.
@compute @workgroup_size(64, 4)
fn bias_grad(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let j = wid.x * 64u + lid.x;
  var s = 0.0;
  if (j < cp.cols) {
    for (var i = lid.y; i < cp.rows; i += 4u) { s += upstream[i * cp.cols + j]; }
  }
  colsum[lid.y * 64u + lid.x] = s;
  workgroupBarrier();
  if (lid.y == 0u && j < cp.cols) {
    var t = colsum[lid.x] + colsum[64u + lid.x] + colsum[128u + lid.x] + colsum[192u + lid.x];
    if (cp.beta != 0.0) { t += cp.beta * result[j]; }
    result[j] = t;
  }
}
