// Index kernels (csrc/tensor_ops.cpp): embedding gather, the embedding
// backward for large tables (small ones: embedding_backward.wgsl, segmented),
// the NLL pick of cross-entropy and greedy decoding's next token.
// Rows of a [rows, cols] operand may be bound in blocks: offsets (in
// elements) of this block's first row in each binding come in the uniform.

struct GatherParams {
  rows: u32,        // ids / labels in this block
  cols: u32,        // embedding dim / classes
  vocab: u32,       // full vocabulary (ids outside [0, vocab) give NaN)
  v0: u32,          // first weight / dweight row bound in this block
  vcount: u32,      // weight / dweight rows bound
  src_off: u32,     // weight or x
  idx_off: u32,     // ids or labels (and dy of nll_pick_backward, indexed by row)
  dst_off: u32,     // out or dx (and mask)
  ignore_index: i32,
  first: u32,       // 1 in the first weight block (writes the NaN rows)
  beta: f32,        // nll_pick_backward
  _pad: u32,
}

@group(0) @binding(0) var<storage, read> src: array<f32>;
@group(0) @binding(1) var<storage, read> idx: array<i32>;
@group(0) @binding(2) var<storage, read_write> dst: array<f32>;
@group(0) @binding(3) var<storage, read_write> dst2: array<f32>;
@group(0) @binding(4) var<uniform> gp: GatherParams;

struct TokenParams {
  rows: u32,       // logits rows (sequences)
  cols: u32,       // vocabulary
  hist_cols: u32,  // token history row length
  _pad: u32,
}

@group(0) @binding(5) var<storage, read_write> tok_out: array<i32>;
@group(0) @binding(6) var<storage, read_write> hist: array<i32>;
@group(0) @binding(7) var<storage, read_write> pos_io: array<i32>;
@group(0) @binding(8) var<uniform> tp: TokenParams;

// VB (dweight rows per embedding_backward workgroup), CB (its columns, one per
// thread) and WG come from csrc/shader_contract.hpp.
var<workgroup> tile: array<i32, 64>;

fn nan() -> f32 { return bitcast<f32>(0x7fc00000u); }

fn linear_index(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
  return (wid.y * nwg.x + wid.x) * WG + lid;
}

// Whether id lies in [lo, lo + count) (no wrap for negative ids).
fn in_block(id: i32, lo: u32, count: u32) -> bool {
  return id >= 0 && u32(id) >= lo && u32(id) - lo < count;
}

// out[r, c] = weight[ids[r], c] for ids in this weight block; ids outside
// [0, vocab) give NaN (written in the first weight block only).
@compute @workgroup_size(WG)
fn embedding(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
  let e = linear_index(wid, nwg, lid);
  if (e >= gp.rows * gp.cols) { return; }
  let r = e / gp.cols;
  let c = e - r * gp.cols;
  let id = idx[gp.idx_off + r];
  if (in_block(id, gp.v0, gp.vcount)) {
    dst[gp.dst_off + e] = src[gp.src_off + (u32(id) - gp.v0) * gp.cols + c];
  } else if (gp.first != 0u && !in_block(id, 0u, gp.vocab)) {
    dst[gp.dst_off + e] = nan();
  }
}

// dweight[v, c] = beta * dweight[v, c] + sum over r (increasing) with ids[r] == v of dy[r, c].
// Workgroup g owns dweight rows VB * (g / column_blocks) + 0..VB-1 of this block and columns
// CB * (g % column_blocks) + 0..CB-1, a thread per column: no two threads touch the same
// element, and each element is summed in id order (deterministic, no atomics). Many vocabulary
// blocks give many workgroups: the launcher uses it for tables too large for segment partials.
@compute @workgroup_size(64)
fn embedding_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                      @builtin(local_invocation_index) lid: u32) {
  let g = wid.y * nwg.x + wid.x;
  let blocks = (gp.cols + CB - 1u) / CB;
  let vstart = (g / blocks) * VB;  // uniform per workgroup
  let c = (g % blocks) * CB + lid;
  if (vstart >= gp.vcount) { return; }
  let vcount = min(VB, gp.vcount - vstart);
  let owns_col = c < gp.cols;
  if (owns_col && gp.beta != 1.0) {
    for (var v = 0u; v < vcount; v++) {
      let o = gp.dst_off + (vstart + v) * gp.cols + c;
      if (gp.beta == 0.0) { dst[o] = 0.0; } else { dst[o] = gp.beta * dst[o]; }
    }
  }
  for (var t = 0u; t < gp.rows; t += 64u) {
    workgroupBarrier();
    if (t + lid < gp.rows) { tile[lid] = idx[gp.idx_off + t + lid]; }
    workgroupBarrier();
    let count = min(64u, gp.rows - t);
    for (var k = 0u; k < count; k++) {
      let id = tile[k];
      if (owns_col && in_block(id, gp.v0 + vstart, vcount)) {
        let o = gp.dst_off + (u32(id) - gp.v0) * gp.cols + c;
        dst[o] += src[gp.src_off + (t + k) * gp.cols + c];
      }
    }
  }
}

// out[r] = labels[r] == ignore_index ? 0 : -x[r, labels[r]] (NaN for a label outside [0, cols));
// mask[r] = labels[r] == ignore_index ? 0 : 1.
@compute @workgroup_size(WG)
fn nll_pick(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
  let r = linear_index(wid, nwg, lid);
  if (r >= gp.rows) { return; }
  let label = idx[gp.idx_off + r];
  let ignored = label == gp.ignore_index;
  let ok = in_block(label, 0u, gp.cols);
  var v = nan();
  if (ignored) { v = 0.0; } else if (ok) { v = -src[gp.src_off + r * gp.cols + u32(label)]; }
  dst[gp.dst_off + r] = v;
  dst2[gp.dst_off + r] = select(1.0, 0.0, ignored);
}

// dx[r, c] = (c == labels[r] != ignore_index ? -dy[r] : 0) (+ beta * dx); dy is indexed like labels.
@compute @workgroup_size(WG)
fn nll_pick_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                     @builtin(local_invocation_index) lid: u32) {
  let e = linear_index(wid, nwg, lid);
  if (e >= gp.rows * gp.cols) { return; }
  let r = e / gp.cols;
  let c = e - r * gp.cols;
  let label = idx[gp.idx_off + r];
  var v = select(0.0, -src[gp.idx_off + r], label != gp.ignore_index && label == i32(c));
  if (gp.beta != 0.0) { v += gp.beta * dst[gp.dst_off + e]; }
  dst[gp.dst_off + e] = v;
}

// Greedy decoding's next token, on the device so that decode steps chain
// without the host: tok_out[r] = argmax of logits row r (src [rows, cols]; the
// first of equal maxima, a NaN counting as the largest, as NumPy's argmax);
// hist[r, pos + 1] = the same id (skipped past hist_cols), then pos += 1
// (pos_io[0]: the position of the token the next step feeds). One workgroup:
// a thread per column stride, a tree over the workgroup per row.
var<workgroup> best_v: array<f32, WG>;
var<workgroup> best_i: array<u32, WG>;

// By its bits: a compiler may fold v != v to false.
fn is_nan(v: f32) -> bool { return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u; }

// Whether (v, i) comes before (bv, bi) in argmax order.
fn beats(v: f32, i: u32, bv: f32, bi: u32) -> bool {
  let vn = is_nan(v);
  let bn = is_nan(bv);
  if (vn != bn) { return vn; }
  if (vn || v == bv) { return i < bi; }
  return v > bv;
}

@compute @workgroup_size(WG)
fn next_token(@builtin(local_invocation_index) lid: u32) {
  for (var r = 0u; r < tp.rows; r++) {
    var bv = bitcast<f32>(0xff800000u);  // -inf
    var bi = 0xffffffffu;
    for (var c = lid; c < tp.cols; c += WG) {
      let v = src[r * tp.cols + c];
      if (beats(v, c, bv, bi)) { bv = v; bi = c; }
    }
    best_v[lid] = bv;
    best_i[lid] = bi;
    workgroupBarrier();
    for (var w = WG / 2u; w > 0u; w = w / 2u) {
      if (lid < w && beats(best_v[lid + w], best_i[lid + w], best_v[lid], best_i[lid])) {
        best_v[lid] = best_v[lid + w];
        best_i[lid] = best_i[lid + w];
      }
      workgroupBarrier();
    }
    if (lid == 0u) {
      let id = i32(best_i[0]);
      tok_out[r] = id;
      let col = u32(max(pos_io[0], 0)) + 1u;
      if (col < tp.hist_cols) { hist[r * tp.hist_cols + col] = id; }
    }
    workgroupBarrier();
  }
  if (lid == 0u) { pos_io[0] = pos_io[0] + 1; }
}
