// Linear-layer pieces around the GEMMs: activation backward, bias gradient,
// and the unfused bias + activation used when a GEMM had to be split along K.
// UT, PT, RT (aliases, f32 or f16): the element types of upstream, preact and
// result; the arithmetic is f32, each stored value rounded once.
//!include activations

struct EwParams { n: u32, cols: u32, bias_off: u32, _pad: u32, }
struct ColParams { rows: u32, cols: u32, beta: f32, block_rows: u32, }

@group(0) @binding(0) var<storage, read> upstream: array<UT>;   // dY, or Z for bias_act
@group(0) @binding(1) var<storage, read> preact: array<PT>;     // Z
@group(0) @binding(2) var<storage, read_write> result: array<RT>;
@group(0) @binding(3) var<uniform> ep: EwParams;
@group(0) @binding(4) var<storage, read> bias: array<f32>;
@group(0) @binding(5) var<storage, read_write> zio: array<f32>;  // Z, biased in place
@group(0) @binding(6) var<uniform> cp: ColParams;

fn linear_index(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
  return (wid.y * nwg.x + wid.x) * WG + lid;
}

// dZ = dY * act'(Z)
@compute @workgroup_size(WG)
fn act_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
  let i = linear_index(wid, nwg, lid);
  if (i < ep.n) { result[i] = RT(act_dx(f32(upstream[i]), f32(preact[i]))); }
}

// Z += bias (per column); Y = act(Z).
@compute @workgroup_size(WG)
fn bias_act(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
  let i = linear_index(wid, nwg, lid);
  if (i < ep.n) {
    let z = zio[i] + bias[ep.bias_off + i % ep.cols];
    zio[i] = z;
    result[i] = RT(activate(z));
  }
}

// COLS (columns per workgroup), LANES (row lanes per column) and WG: csrc/shader_contract.hpp.
var<workgroup> colsum: array<f32, COLS * LANES>;

// db[j] = sum_i dZ[i, j] (+ beta * db[j]). Narrow column blocks give many
// workgroups even for a few hundred columns (64-column blocks left most of
// the H100 idle: 16 workgroups for 1024 columns).
@compute @workgroup_size(COLS, LANES)
fn bias_grad(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let j = wid.x * COLS + lid.x;
  var s = 0.0;
  if (j < cp.cols) {
    // Eight loads per iteration before any add: one load in flight per
    // thread left this pass latency-bound (0.44 TB/s on the H100).
    var i = lid.y;
    for (; i + 7u * LANES < cp.rows; i += 8u * LANES) {
      let c = cp.cols * LANES;
      let e = i * cp.cols + j;
      let v0 = f32(upstream[e]);
      let v1 = f32(upstream[e + c]);
      let v2 = f32(upstream[e + 2u * c]);
      let v3 = f32(upstream[e + 3u * c]);
      let v4 = f32(upstream[e + 4u * c]);
      let v5 = f32(upstream[e + 5u * c]);
      let v6 = f32(upstream[e + 6u * c]);
      let v7 = f32(upstream[e + 7u * c]);
      s += ((v0 + v1) + (v2 + v3)) + ((v4 + v5) + (v6 + v7));
    }
    for (; i < cp.rows; i += LANES) { s += f32(upstream[i * cp.cols + j]); }
  }
  colsum[lid.y * COLS + lid.x] = s;
  workgroupBarrier();
  if (lid.y == 0u && j < cp.cols) {
    var t = 0.0;
    for (var l = 0u; l < LANES; l++) { t += colsum[l * COLS + lid.x]; }
    if (cp.beta != 0.0) { t += cp.beta * f32(result[j]); }
    result[j] = RT(t);
  }
}

var<workgroup> partsum: array<f32, PART_COLS * PART_LANES>;

// First pass of a column sum over many rows: partial[b, j] = sum of dZ[i, j]
// over the rows of block b (block_rows each), one workgroup per 64 columns of
// a block, so even a few hundred columns spread over the whole GPU; then
// bias_grad sums the [blocks, cols] partials (deterministic, no atomics).
// H100: 16384 x 384 took 80 us in bias_grad alone (24 workgroups), ~3x the
// memory time.
@compute @workgroup_size(PART_COLS, PART_LANES)
fn colsum_partial(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let j = wid.x * PART_COLS + lid.x;
  let first = wid.y * cp.block_rows;
  let end = min(first + cp.block_rows, cp.rows);
  var s = 0.0;
  if (j < cp.cols) {
    var i = first + lid.y;
    let c = cp.cols * PART_LANES;
    for (; i + 3u * PART_LANES < end; i += 4u * PART_LANES) {
      let e = i * cp.cols + j;
      s += (f32(upstream[e]) + f32(upstream[e + c])) + (f32(upstream[e + 2u * c]) + f32(upstream[e + 3u * c]));
    }
    for (; i < end; i += PART_LANES) { s += f32(upstream[i * cp.cols + j]); }
  }
  partsum[lid.y * PART_COLS + lid.x] = s;
  workgroupBarrier();
  if (lid.y == 0u && j < cp.cols) {
    var t = 0.0;
    for (var l = 0u; l < PART_LANES; l++) { t += partsum[l * PART_COLS + lid.x]; }
    result[wid.y * cp.cols + j] = RT(t);
  }
}
