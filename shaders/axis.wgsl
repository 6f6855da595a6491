// Reductions along an axis and row softmax (csrc/tensor_ops.cpp).
// x is viewed as [outer, len, inner] (a block of it when the whole does not
// fit one binding): x[o, j, i] = src[x_off + o * x_row + j * x_col + i],
// out[o, i] = res[out_off + o * out_row + i]. OP: R_SUM or R_MAX (ReduceOp of
// tensor_ops.hpp); LOG: log_softmax instead of softmax. Softmax rows: src from
// x_off + row * x_row, res from out_off + row * out_row (src2 as src).
// ST, RT (aliases emitted per kernel): the element types of src and res, f32 or
// f16 (RES_HALF: bool, RT is f16); values widen to f32 on load, the math is f32.
//!include half
//!include lse

const_assert OP == R_SUM || OP == R_MAX;  // the reduce ops of shader_contract.hpp

struct AxisParams {
  outer: u32,
  len: u32,
  inner: u32,
  x_row: u32,
  x_col: u32,
  out_row: u32,
  x_off: u32,
  out_off: u32,
  j0: u32,       // first len index of this block (argmax values, max_backward)
  combine: u32,  // 1: max-merge with out / argmax of earlier len blocks
  scale: f32,
  beta: f32,
  // reduce_rows / reduce_cols: each line's len in `parts` runs of part_len, a
  // workgroup each, part p's result at out[o, p, i] = res[out_off + o * out_row
  // + p * inner + i] (a first pass over few long lines; 1 and len otherwise)
  parts: u32,
  part_len: u32,
  _pad0: u32,
  _pad1: u32,
}

@group(0) @binding(0) var<storage, read> src: array<ST>;           // x / y (softmax_backward) / dy (max_backward)
@group(0) @binding(1) var<storage, read> src2: array<f32>;         // dy (softmax_backward)
@group(0) @binding(2) var<storage, read> idx_in: array<i32>;       // argmax (max_backward)
@group(0) @binding(3) var<storage, read_write> res: array<RT>;     // out / y / dx
@group(0) @binding(4) var<storage, read_write> idx_out: array<i32>;  // argmax
@group(0) @binding(5) var<uniform> ap: AxisParams;

const EMPTY: u32 = 0xffffffffu;  // index of an accumulator that has seen nothing

// WG, COLS and LANES (reduce_cols) come from csrc/shader_contract.hpp.
var<workgroup> sval: array<f32, WG>;
var<workgroup> sidx: array<u32, WG>;

struct Acc { v: f32, i: u32, }

fn src_at(i: u32) -> f32 { return f32(src[i]); }
fn res_at(i: u32) -> f32 { return f32(res[i]); }
fn res_put(i: u32, v: f32) { res[i] = RT(half_range(v, RES_HALF)); }

fn is_nan(v: f32) -> bool { return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u; }

// Whether (v2, i2) replaces (v1, i1) as the max: larger, a NaN over a number
// (NaN propagates), or equal with a lower index (the first max, as torch).
fn takes_over(v1: f32, i1: u32, v2: f32, i2: u32) -> bool {
  if (i2 == EMPTY) { return false; }
  if (i1 == EMPTY) { return true; }
  let n1 = is_nan(v1);
  let n2 = is_nan(v2);
  if (n1 || n2) { return n2 && (!n1 || i2 < i1); }
  return v2 > v1 || (v2 == v1 && i2 < i1);
}

fn merge(is_max: bool, a: Acc, v: f32, j: u32) -> Acc {
  if (!is_max) { return Acc(a.v + v, 0u); }
  if (takes_over(a.v, a.i, v, j)) { return Acc(v, j); }
  return a;
}

// One thread's share of a line: j = first, first + stride, ... < end. Sums
// keep four loads in flight (four partial sums): one dependent add per load
// left a whole-tensor sum at half the memory's bandwidth.
fn scan(is_max: bool, base: u32, first: u32, end: u32, stride: u32) -> Acc {
  var a = Acc(0.0, EMPTY);
  var j = first;
  if (!is_max) {
    var s = vec4<f32>(0.0);
    let c = stride * ap.x_col;
    for (; j + 3u * stride < end; j += 4u * stride) {
      let e = base + j * ap.x_col;
      s += vec4<f32>(src_at(e), src_at(e + c), src_at(e + 2u * c), src_at(e + 3u * c));
    }
    a.v = (s.x + s.y) + (s.z + s.w);
  }
  for (; j < end; j += stride) { a = merge(is_max, a, src_at(base + j * ap.x_col), j); }
  return a;
}

// The len range [lo, hi) of part p.
fn part_range(p: u32) -> vec2<u32> {
  let lo = p * ap.part_len;
  return vec2<u32>(lo, min(ap.len, lo + ap.part_len));
}

// Combines `lanes` accumulators per column across the workgroup (slot lane * ncols + col);
// every thread gets its column's result.
fn tree(is_max: bool, lane: u32, col: u32, ncols: u32, lanes: u32, a: Acc) -> Acc {
  let me = lane * ncols + col;
  workgroupBarrier();
  sval[me] = a.v;
  sidx[me] = a.i;
  workgroupBarrier();
  for (var s = lanes / 2u; s > 0u; s >>= 1u) {
    if (lane < s) {
      let m = merge(is_max, Acc(sval[me], sidx[me]), sval[me + s * ncols], sidx[me + s * ncols]);
      sval[me] = m.v;
      sidx[me] = m.i;
    }
    workgroupBarrier();
  }
  return Acc(sval[col], sidx[col]);
}

// Writes a reduction result to res[o]; returns whether it was taken (a max
// merged into an earlier block's result keeps that one unless beaten).
fn store(o: u32, a: Acc) -> bool {
  if (ap.combine != 0u) {
    if (!takes_over(res_at(o), 0u, a.v, 1u)) { return false; }
    res_put(o, a.v);
    return true;
  }
  var v = ap.scale * a.v;
  if (ap.beta != 0.0) { v += ap.beta * res_at(o); }
  res_put(o, v);
  return true;
}

// inner == 1: a workgroup per (row, part), threads strided along the part (coalesced).
fn row_result(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> Acc {
  let g = wid.y * nwg.x + wid.x;
  let row = g / ap.parts;
  let js = part_range(g % ap.parts);
  var a = Acc(0.0, EMPTY);
  if (row < ap.outer) { a = scan(OP == R_MAX, ap.x_off + row * ap.x_row, js.x + lid, js.y, WG); }
  return tree(OP == R_MAX, lid, 0u, 1u, WG, a);
}

// Where workgroup g's (row, part) result goes; EMPTY past the last row.
fn row_out(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
  let g = wid.y * nwg.x + wid.x;
  let row = g / ap.parts;
  if (row >= ap.outer) { return EMPTY; }
  return ap.out_off + row * ap.out_row + g % ap.parts;
}

@compute @workgroup_size(WG)
fn reduce_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
  let a = row_result(wid, nwg, lid);
  let o = row_out(wid, nwg);
  if (lid == 0u && o != EMPTY) { _ = store(o, a); }
}

@compute @workgroup_size(WG)
fn reduce_rows_arg(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) lid: u32) {
  let a = row_result(wid, nwg, lid);
  let o = row_out(wid, nwg);
  if (lid == 0u && o != EMPTY && store(o, a)) { idx_out[o] = i32(ap.j0 + a.i); }
}

// inner > 1: 16 columns x 16 lanes along len per workgroup; workgroup g
// covers row g / (parts * column_blocks), part (g / column_blocks) % parts,
// columns 16 * (g % column_blocks) + 0..15.
fn col_result(wid: vec3<u32>, nwg: vec3<u32>, lid: vec3<u32>) -> Acc {
  let g = wid.y * nwg.x + wid.x;
  let blocks = (ap.inner + COLS - 1u) / COLS;
  let row = g / (blocks * ap.parts);
  let js = part_range((g / blocks) % ap.parts);
  let i = (g % blocks) * COLS + lid.x;
  var a = Acc(0.0, EMPTY);
  if (row < ap.outer && i < ap.inner) {
    a = scan(OP == R_MAX, ap.x_off + row * ap.x_row + i, js.x + lid.y, js.y, LANES);
  }
  return tree(OP == R_MAX, lid.y, lid.x, COLS, LANES, a);
}

fn col_out(wid: vec3<u32>, nwg: vec3<u32>, lid: vec3<u32>) -> u32 {
  let g = wid.y * nwg.x + wid.x;
  let blocks = (ap.inner + COLS - 1u) / COLS;
  let row = g / (blocks * ap.parts);
  let part = (g / blocks) % ap.parts;
  let i = (g % blocks) * COLS + lid.x;
  if (lid.y != 0u || row >= ap.outer || i >= ap.inner) { return EMPTY; }
  return ap.out_off + row * ap.out_row + part * ap.inner + i;
}

@compute @workgroup_size(COLS, LANES)
fn reduce_cols(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_id) lid: vec3<u32>) {
  let a = col_result(wid, nwg, lid);
  let o = col_out(wid, nwg, lid);
  if (o != EMPTY) { _ = store(o, a); }
}

@compute @workgroup_size(COLS, LANES)
fn reduce_cols_arg(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_id) lid: vec3<u32>) {
  let a = col_result(wid, nwg, lid);
  let o = col_out(wid, nwg, lid);
  if (o != EMPTY && store(o, a)) { idx_out[o] = i32(ap.j0 + a.i); }
}

// dx[o, j, i] = (argmax[o, i] == j0 + j ? dy[o, i] : 0) (+ beta * dx); a thread per dx element.
@compute @workgroup_size(WG)
fn max_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
  let e = (wid.y * nwg.x + wid.x) * WG + lid;
  if (e >= ap.outer * ap.len * ap.inner) { return; }
  let i = e % ap.inner;
  let t = e / ap.inner;
  let j = t % ap.len;
  let o = t / ap.len;
  let k = ap.out_off + o * ap.out_row + i;
  let x = ap.x_off + o * ap.x_row + j * ap.x_col + i;
  var v = select(0.0, src_at(k), idx_in[k] == i32(ap.j0 + j));
  if (ap.beta != 0.0) { v += ap.beta * res_at(x); }
  res_put(x, v);
}

// Row sums of f(j) for softmax: a workgroup per row of `cols` = ap.len.
fn row_sum(lid: u32, v: f32) -> f32 { return tree(false, lid, 0u, 1u, WG, Acc(v, 0u)).v; }

// Writes y[j] = softmax or log_softmax of the row at src base (max mx, sum of exp(x - mx) s) to
// res from out, j = first, first + stride, ... < len.
fn softmax_store(base: u32, out: u32, first: u32, stride: u32, mx: f32, s: f32) {
  let ls = log(s);
  for (var j = first; j < ap.len; j += stride) {
    let z = src_at(base + j) - mx;
    if (LOG) { res_put(out + j, z - ls); } else { res_put(out + j, exp(z) / s); }
  }
}

// y = softmax(x) or log_softmax(x) along rows; a workgroup per row. The row's
// max and sum of exponentials come from one pass (lse.wgsl), the output from a second.
@compute @workgroup_size(WG)
fn softmax(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32) {
  let row = wid.y * nwg.x + wid.x;
  let valid = row < ap.outer;  // uniform per workgroup
  let base = ap.x_off + row * ap.x_row;
  var acc = LSE_START;
  if (valid) { for (var j = lid; j < ap.len; j += WG) { acc = lse_add(acc, src_at(base + j)); } }
  let tot = lse_workgroup(lid, acc);
  if (!valid) { return; }
  softmax_store(base, ap.out_off + row * ap.out_row, lid, WG, tot.x, lse_sum(tot));
}

// softmax: dx = y * (dy - sum dy * y); log_softmax: dx = dy - exp(y) * sum dy (+ beta * dx).
// src holds y, src2 dy (f32: the forward's result and its gradient); the row's sum term and
// each element's dx (at res index o):
fn softmax_dot_term(i: u32) -> f32 {
  if (LOG) { return src2[i]; }
  return src2[i] * src_at(i);
}

fn softmax_store_dx(i: u32, o: u32, s: f32) {
  let y = src_at(i);
  let dy = src2[i];
  var v = y * (dy - s);
  if (LOG) { v = dy - exp(y) * s; }
  if (ap.beta != 0.0) { v += ap.beta * res_at(o); }
  res_put(o, v);
}

@compute @workgroup_size(WG)
fn softmax_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                    @builtin(local_invocation_index) lid: u32) {
  let row = wid.y * nwg.x + wid.x;
  let valid = row < ap.outer;
  let base = ap.x_off + row * ap.x_row;
  var s = 0.0;
  if (valid) {
    for (var j = lid; j < ap.len; j += WG) { s += softmax_dot_term(base + j); }
  }
  s = row_sum(lid, s);
  if (!valid) { return; }
  let out = ap.out_off + row * ap.out_row;
  for (var j = lid; j < ap.len; j += WG) { softmax_store_dx(base + j, out + j, s); }
}

// Short rows (ap.len <= short_row_cols of csrc/dispatch_util.hpp: 64 on GPUs,
// 1024 on CPU adapters): a thread per row, WG rows per workgroup, no barriers.
// The workgroup-per-row entries above leave most of their WG threads idle on
// such rows and pay barrier trees per row (lavapipe: 4.2M rows of 8 took minutes).
fn short_row(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 { return (wid.y * nwg.x + wid.x) * WG + lid; }

@compute @workgroup_size(WG)
fn softmax_short(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
  let row = short_row(wid, nwg, lid);
  if (row >= ap.outer) { return; }
  let base = ap.x_off + row * ap.x_row;
  var acc = LSE_START;
  for (var j = 0u; j < ap.len; j++) { acc = lse_add(acc, src_at(base + j)); }
  softmax_store(base, ap.out_off + row * ap.out_row, 0u, 1u, acc.x, lse_sum(acc));
}

@compute @workgroup_size(WG)
fn softmax_backward_short(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                          @builtin(local_invocation_index) lid: u32) {
  let row = short_row(wid, nwg, lid);
  if (row >= ap.outer) { return; }
  let base = ap.x_off + row * ap.x_row;
  let out = ap.out_off + row * ap.out_row;
  var s = 0.0;
  for (var j = 0u; j < ap.len; j++) { s += softmax_dot_term(base + j); }
  for (var j = 0u; j < ap.len; j++) { softmax_store_dx(base + j, out + j, s); }
}
