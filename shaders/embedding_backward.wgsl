// Deterministic embedding backward (csrc/tensor_ops.cpp, embedding_backward):
// dweight[v, c] = sum over i with ids[i] == v of dy[i, c] (+ beta * dweight),
// without atomics. The launcher cuts the ids into segments of `seg` ids:
//   emb_bwd_segments: workgroup (segment s, block of VB dweight rows, block of
//     CB columns); each thread owns one column and sums its segment's matching
//     dy rows into workgroup memory in increasing i (rows without ids in the
//     segment stay exact zeros), then writes them out as the partial row sums
//     part[s, v, c]. (Tables too large for partials take embedding.wgsl's scan.)
//   emb_bwd_combine: dweight[v, c] = beta * dweight[v, c] + (part[0, v, c] +
//     part[1, v, c] + ... ) summed in segment order.
// Every element's sum has a fixed order, so results are bit-identical across runs.

struct EmbBwdParams {
  rows: u32,      // ids of this dispatch
  cols: u32,      // embedding dim
  v0: u32,        // first dweight row of this block (ids are compared against v0 + row)
  vcount: u32,    // dweight rows of this block
  src_off: u32,   // segments: dy; combine: partials
  idx_off: u32,   // ids
  dst_off: u32,   // partials (segments) or dweight (combine)
  seg: u32,       // ids per segment
  segs: u32,      // segments of this dispatch
  _pad0: u32,
  beta: f32,
  _pad: u32,
}

@group(0) @binding(0) var<storage, read> src: array<f32>;
@group(0) @binding(1) var<storage, read> idx: array<i32>;
@group(0) @binding(2) var<storage, read_write> dst: array<f32>;
@group(0) @binding(4) var<uniform> ep: EmbBwdParams;

// VB (u32): dweight rows per workgroup, set by the launcher from the device's
// workgroup memory (VB * CB floats of accumulators plus the id tile).
// CB (columns per workgroup, one per thread) and WG: csrc/shader_contract.hpp.
const IT: u32 = 64u;  // ids staged in workgroup memory at a time

var<workgroup> acc: array<f32, VB * CB>;  // [row][column]
var<workgroup> tile: array<i32, 64>;   // IT

@compute @workgroup_size(64)
fn emb_bwd_segments(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                    @builtin(local_invocation_index) lid: u32) {
  let g = wid.y * nwg.x + wid.x;
  let cblocks = (ep.cols + CB - 1u) / CB;
  let vblocks = (ep.vcount + VB - 1u) / VB;
  let s = g / (cblocks * vblocks);  // all uniform per workgroup
  if (s >= ep.segs) { return; }
  let rest = g - s * cblocks * vblocks;
  let vstart = (rest / cblocks) * VB;
  let c = (rest % cblocks) * CB + lid;
  let vn = min(VB, ep.vcount - vstart);
  let lo = ep.v0 + vstart;
  let owns_col = c < ep.cols;
  // Each thread touches only its own column of acc: no barrier needed around it.
  for (var v = 0u; v < vn; v++) { acc[v * CB + lid] = 0.0; }
  let i0 = s * ep.seg;
  let i1 = min(i0 + ep.seg, ep.rows);
  for (var t = i0; t < i1; t += IT) {
    workgroupBarrier();
    if (t + lid < i1) { tile[lid] = idx[ep.idx_off + t + lid]; }
    workgroupBarrier();
    let count = min(IT, i1 - t);
    for (var k = 0u; k < count; k++) {
      let id = tile[k];
      if (owns_col && id >= 0 && u32(id) >= lo && u32(id) - lo < vn) {
        let a = (u32(id) - lo) * CB + lid;
        acc[a] += src[ep.src_off + (t + k) * ep.cols + c];
      }
    }
  }
  if (!owns_col) { return; }
  let base = ep.dst_off + (s * ep.vcount + vstart) * ep.cols + c;
  for (var v = 0u; v < vn; v++) { dst[base + v * ep.cols] = acc[v * CB + lid]; }
}

@compute @workgroup_size(WG)
fn emb_bwd_combine(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) lid: u32) {
  let e = (wid.y * nwg.x + wid.x) * WG + lid;
  let n = ep.vcount * ep.cols;
  if (e >= n) { return; }
  var a = src[ep.src_off + e];
  for (var s = 1u; s < ep.segs; s++) { a += src[ep.src_off + s * n + e]; }
  let o = ep.dst_off + e;
  if (ep.beta == 0.0) { dst[o] = a; } else { dst[o] = ep.beta * dst[o] + a; }
}
