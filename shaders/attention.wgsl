// Causal multi-head self-attention, fused (FlashAttention-2 style): the
// T x T scores never reach memory. Operands are strided [B, H, T, D] views:
// element (b, h, t, d) of an operand with view (off, sb, sh, st) lies at
// off + b * sb + h * sh + t * st + d (d contiguous), so q, k, v and their
// gradients can be column blocks of one [B, T, 3C] tensor.
//
// HD (the head size) is a pipeline constant: every kernel is specialised per
// head size. Tiles are B = 64 rows x 64 columns per workgroup of 16 x 16
// threads; a thread owns rows ty + 16 i (i < 4, the components of a vec4)
// and score columns tx + 16 j (j < 4), or output columns tx + 16 c (c < DC).
//
//   attn_forward:   per (bh, query block): loop over key blocks up to the
//                   diagonal, S = Q K^T scaled in registers, online softmax
//                   (running max and sum), O += P V; writes O and the row
//                   log-sum-exp (natural log, [BH, T]).
//   attn_delta:     delta = rowsum(dO * O) per row ([BH, T]).
//   attn_dkdv:      per (bh, key block): loop over query blocks from the
//                   diagonal, P^T recomputed from lse, dV += P^T dO,
//                   dS^T = P^T (dP^T - delta), dK += dS^T Q * scale.
//   attn_dq:        per (bh, query block): loop over key blocks up to the
//                   diagonal, dQ += dS K * scale (no atomics: deterministic).
//
// The block loop covers inner blocks [blk0, blk1) only (the launcher splits
// long sequences over dispatches: lavapipe leaves loops after 65535 trips);
// a forward dispatch past the first resumes from the O and lse written by
// the previous one, backward dispatches past the first accumulate.
// Workgroup memory: a 64 x 65 tile (P or dS) and a 16 x 65 x 2 chunk area
// (operand chunks, V chunks, row reductions) = 6240 floats.

struct AttnParams {
  t: u32, heads: u32, bh0: u32, blocks: u32,  // sequence length, H, first bh of this dispatch, ceil(T / B)
  blk0: u32, blk1: u32, scale: f32, beta: f32,
  q: vec4<u32>, k: vec4<u32>, v: vec4<u32>, o: vec4<u32>,  // views: (off, sb, sh, st)
  g: vec4<u32>, dq: vec4<u32>, dk: vec4<u32>, dv: vec4<u32>,
}

@group(0) @binding(0) var<storage, read> q_in: array<f32>;
@group(0) @binding(1) var<storage, read> k_in: array<f32>;
@group(0) @binding(2) var<storage, read> v_in: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;      // forward: O (read when resuming)
@group(0) @binding(4) var<storage, read_write> lse_out: array<f32>;  // forward: log-sum-exp per row
@group(0) @binding(5) var<uniform> ap: AttnParams;
@group(0) @binding(6) var<storage, read> o_in: array<f32>;           // delta: O
@group(0) @binding(7) var<storage, read> dout: array<f32>;           // dO (the forward binds q here, unread)
@group(0) @binding(8) var<storage, read> lse_in: array<f32>;
@group(0) @binding(9) var<storage, read_write> delta_out: array<f32>;
@group(0) @binding(10) var<storage, read> delta_in: array<f32>;
@group(0) @binding(11) var<storage, read_write> dq: array<f32>;
@group(0) @binding(12) var<storage, read_write> dk: array<f32>;
@group(0) @binding(13) var<storage, read_write> dv: array<f32>;

const B: u32 = 64u;               // rows and columns of a tile
const BP: u32 = 65u;              // padded row pitch of tiles in workgroup memory
const WG: u32 = 256u;
const DC: u32 = (HD + 15u) / 16u; // output columns per thread
const DP: u32 = DC * 16u;         // HD padded to the thread columns
const CH: u32 = B * BP;           // chunk area: after the 64 x 65 tile
const CA: u32 = CH;               // operand A chunk [16][BP]
const CB: u32 = CH + 16u * BP;    // operand B chunk [16][BP]
const CHN: u32 = 32u * BP;        // chunk area size (>= 16 * DP for HD <= 128, >= B * 17)
const NEG: f32 = -3.0e38;         // masked score (finite: no inf - inf)
const LOG2E: f32 = 1.4426950408889634;
const LN2: f32 = 0.6931471805599453;
const ROWS: vec4<u32> = vec4<u32>(0u, 16u, 32u, 48u);

var<workgroup> sm: array<f32, CH + CHN>;

// Operand reads by id (the kernels that call ld bind all four).
const OQ: u32 = 0u;
const OK: u32 = 1u;
const OV: u32 = 2u;
const OG: u32 = 3u;

fn ld(which: u32, idx: u32) -> f32 {
  switch which {
    case 0u: { return q_in[idx]; }
    case 1u: { return k_in[idx]; }
    case 2u: { return v_in[idx]; }
    default: { return dout[idx]; }
  }
}

// Element offset of row (b, h, 0) of a view.
fn head_base(view: vec4<u32>, bh: u32) -> u32 {
  return view.x + (bh / ap.heads) * view.y + (bh % ap.heads) * view.z;
}

// Stages rows r0..r0+63, head columns d0..d0+15 of an operand into
// sm[off + dd * BP + r] (transposed: a column per d); 0 past T or HD.
fn stage_rows(which: u32, base: u32, st: u32, r0: u32, d0: u32, off: u32, li: u32) {
  for (var s = 0u; s < B * 16u / WG; s++) {
    let e = li + s * WG;
    let dd = e % 16u;
    let r = e / 16u;
    let row = r0 + r;
    let d = d0 + dd;
    var x = 0.0;
    if (row < ap.t && d < HD) { x = ld(which, base + row * st + d); }
    sm[off + dd * BP + r] = x;
  }
}

// Scores of a tile: result[j][i] = sum_d A[ra + ty + 16 i][d] * Bm[rb + tx + 16 j][d].
fn qk_tile(wa: u32, base_a: u32, st_a: u32, ra: u32, wb: u32, base_b: u32, st_b: u32, rb: u32,
           li: u32, tx: u32, ty: u32) -> array<vec4<f32>, 4> {
  var s: array<vec4<f32>, 4>;
  for (var d0 = 0u; d0 < HD; d0 += 16u) {
    stage_rows(wa, base_a, st_a, ra, d0, CA, li);
    stage_rows(wb, base_b, st_b, rb, d0, CB, li);
    workgroupBarrier();
    let dn = min(16u, HD - d0);
    for (var dd = 0u; dd < dn; dd++) {
      let a0 = CA + dd * BP + ty;
      let a = vec4<f32>(sm[a0], sm[a0 + 16u], sm[a0 + 32u], sm[a0 + 48u]);
      let b0 = CB + dd * BP + tx;
      s[0] = fma(a, vec4<f32>(sm[b0]), s[0]);
      s[1] = fma(a, vec4<f32>(sm[b0 + 16u]), s[1]);
      s[2] = fma(a, vec4<f32>(sm[b0 + 32u]), s[2]);
      s[3] = fma(a, vec4<f32>(sm[b0 + 48u]), s[3]);
    }
    workgroupBarrier();
  }
  return s;
}

// Writes a thread's 4 x 4 values into the tile (row ty + 16 i, column tx + 16 j).
fn put_tile(p: array<vec4<f32>, 4>, tx: u32, ty: u32) {
  for (var j = 0u; j < 4u; j++) {
    let c = tx + 16u * j;
    sm[ty * BP + c] = p[j].x;
    sm[(ty + 16u) * BP + c] = p[j].y;
    sm[(ty + 32u) * BP + c] = p[j].z;
    sm[(ty + 48u) * BP + c] = p[j].w;
  }
}

// acc[c][i] += sum_j tile[ty + 16 i][j] * X[r0 + j][tx + 16 c] over the 64
// tile columns (X rows past T read 0). The tile must be complete (barrier).
fn pv_tile(acc: ptr<function, array<vec4<f32>, DC>>, which: u32, base: u32, st: u32, r0: u32, li: u32, tx: u32,
           ty: u32) {
  for (var j0 = 0u; j0 < B; j0 += 16u) {
    if (r0 + j0 >= ap.t) { break; }  // uniform: r0 is per workgroup
    for (var s = 0u; s < DC; s++) {  // 16 rows x DP columns, 256 at a time
      let e = li + s * WG;
      let c = e % DP;
      let jj = e / DP;
      let row = r0 + j0 + jj;
      var x = 0.0;
      if (row < ap.t && c < HD) { x = ld(which, base + row * st + c); }
      sm[CH + jj * DP + c] = x;
    }
    workgroupBarrier();
    for (var jj = 0u; jj < 16u; jj++) {
      let j = j0 + jj;
      let p = vec4<f32>(sm[ty * BP + j], sm[(ty + 16u) * BP + j], sm[(ty + 32u) * BP + j], sm[(ty + 48u) * BP + j]);
      let x0 = CH + jj * DP + tx;
      for (var c = 0u; c < DC; c++) { (*acc)[c] = fma(p, vec4<f32>(sm[x0 + 16u * c]), (*acc)[c]); }
    }
    workgroupBarrier();
  }
}

// Sum (or max) of a per-thread row partial over the 16 threads of each row;
// every thread gets its 4 rows' results. Call after a barrier that ends the
// previous use of the chunk area.
fn row_reduce(x: vec4<f32>, tx: u32, ty: u32, is_max: bool) -> vec4<f32> {
  for (var i = 0u; i < 4u; i++) { sm[CH + (ty + 16u * i) * 17u + tx] = x[i]; }
  workgroupBarrier();
  var r = vec4<f32>(select(0.0, NEG, is_max));
  for (var t = 0u; t < 16u; t++) {
    let v = vec4<f32>(sm[CH + ty * 17u + t], sm[CH + (ty + 16u) * 17u + t], sm[CH + (ty + 32u) * 17u + t],
                      sm[CH + (ty + 48u) * 17u + t]);
    if (is_max) { r = max(r, v); } else { r += v; }
  }
  return r;
}

@compute @workgroup_size(16, 16)
fn attn_forward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
                @builtin(local_invocation_index) li: u32) {
  let tx = lid.x;
  let ty = lid.y;
  let bh = ap.bh0 + wid.y;
  // Query blocks blk0.. (earlier ones have no keys in this dispatch), heaviest first.
  let qb = ap.blocks - 1u - wid.x;
  let r0 = qb * B;
  let rows = vec4<u32>(r0 + ty) + ROWS;
  let qbase = head_base(ap.q, bh);
  let kbase = head_base(ap.k, bh);
  let vbase = head_base(ap.v, bh);
  let obase = head_base(ap.o, bh);
  let c = ap.scale * LOG2E;
  var m = vec4<f32>(NEG);  // running row max (log2 units)
  var l = vec4<f32>(0.0);  // this thread's share of the running row sum
  var acc: array<vec4<f32>, DC>;
  if (ap.blk0 > 0u) {  // resume: O and lse of the earlier key blocks (l = 1 at m = lse)
    for (var i = 0u; i < 4u; i++) {
      if (rows[i] < ap.t) {
        m[i] = lse_out[bh * ap.t + rows[i]] * LOG2E;
        for (var cc = 0u; cc < DC; cc++) {
          let col = tx + 16u * cc;
          if (col < HD) { acc[cc][i] = out[obase + rows[i] * ap.o.w + col]; }
        }
      }
    }
    l = vec4<f32>(select(0.0, 1.0, tx == 0u));
  }
  let kend = min(ap.blk1, qb + 1u);
  for (var kb = ap.blk0; kb < kend; kb++) {
    let c0 = kb * B;
    let s = qk_tile(OQ, qbase, ap.q.w, r0, OK, kbase, ap.k.w, c0, li, tx, ty);
    var sc: array<vec4<f32>, 4>;
    var mloc = vec4<f32>(NEG);
    for (var j = 0u; j < 4u; j++) {
      let key = vec4<u32>(c0 + tx + 16u * j);
      let ok = (key <= rows) & (key < vec4<u32>(ap.t));
      sc[j] = select(vec4<f32>(NEG), s[j] * c, ok);
      mloc = max(mloc, sc[j]);
    }
    let mnew = max(m, row_reduce(mloc, tx, ty, true));
    let alpha = exp2(m - mnew);
    var p: array<vec4<f32>, 4>;
    var ps = vec4<f32>(0.0);
    for (var j = 0u; j < 4u; j++) {
      p[j] = select(vec4<f32>(0.0), exp2(sc[j] - mnew), sc[j] > vec4<f32>(NEG));
      ps += p[j];
    }
    l = l * alpha + ps;
    m = mnew;
    for (var cc = 0u; cc < DC; cc++) { acc[cc] *= alpha; }
    put_tile(p, tx, ty);
    workgroupBarrier();
    pv_tile(&acc, OV, vbase, ap.v.w, c0, li, tx, ty);
  }
  let lt = row_reduce(l, tx, ty, false);
  for (var i = 0u; i < 4u; i++) {
    if (rows[i] >= ap.t) { continue; }
    let inv = 1.0 / lt[i];
    for (var cc = 0u; cc < DC; cc++) {
      let col = tx + 16u * cc;
      if (col < HD) { out[obase + rows[i] * ap.o.w + col] = acc[cc][i] * inv; }
    }
    if (tx == 0u) { lse_out[bh * ap.t + rows[i]] = (m[i] + log2(lt[i])) * LN2; }
  }
}

// delta[bh, t] = sum_d dO * O: a thread per row (ap.blocks = rows B*H*T of this dispatch, from bh0 * T).
@compute @workgroup_size(256)
fn attn_delta(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) li: u32) {
  let e = (wid.y * nwg.x + wid.x) * 256u + li;
  if (e >= ap.blocks) { return; }
  let row = ap.bh0 * ap.t + e;
  let bh = row / ap.t;
  let t = row % ap.t;
  let ob = head_base(ap.o, bh) + t * ap.o.w;
  let gb = head_base(ap.g, bh) + t * ap.g.w;
  var s = vec4<f32>(0.0);
  var d = 0u;
  for (; d + 4u <= HD; d += 4u) {
    s = fma(vec4<f32>(o_in[ob + d], o_in[ob + d + 1u], o_in[ob + d + 2u], o_in[ob + d + 3u]),
            vec4<f32>(dout[gb + d], dout[gb + d + 1u], dout[gb + d + 2u], dout[gb + d + 3u]), s);
  }
  for (; d < HD; d++) { s.x = fma(o_in[ob + d], dout[gb + d], s.x); }
  delta_out[row] = (s.x + s.y) + (s.z + s.w);
}

// Index of a gradient element: row rows[i], column tx + 16 cc of a view; 0xffffffff past T or HD.
fn grad_index(base: u32, st: u32, rows: vec4<u32>, i: u32, tx: u32, cc: u32) -> u32 {
  let col = tx + 16u * cc;
  if (rows[i] >= ap.t || col >= HD) { return 0xffffffffu; }
  return base + rows[i] * st + col;
}

@compute @workgroup_size(16, 16)
fn attn_dkdv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
             @builtin(local_invocation_index) li: u32) {
  let tx = lid.x;
  let ty = lid.y;
  let bh = ap.bh0 + wid.y;
  let kb = wid.x;  // key blocks 0 .. blk1 - 1
  let r0 = kb * B;
  let keys = vec4<u32>(r0 + ty) + ROWS;
  let qbase = head_base(ap.q, bh);
  let kbase = head_base(ap.k, bh);
  let vbase = head_base(ap.v, bh);
  let gbase = head_base(ap.g, bh);
  let c = ap.scale * LOG2E;
  var dk_acc: array<vec4<f32>, DC>;
  var dv_acc: array<vec4<f32>, DC>;
  let qstart = max(kb, ap.blk0);
  let qend = min(ap.blk1, ap.blocks);
  for (var qb = qstart; qb < qend; qb++) {
    let c0 = qb * B;
    let s = qk_tile(OK, kbase, ap.k.w, r0, OQ, qbase, ap.q.w, c0, li, tx, ty);  // S^T: rows keys, columns queries
    var p: array<vec4<f32>, 4>;
    var dl: vec4<f32>;
    for (var j = 0u; j < 4u; j++) {
      let qr = c0 + tx + 16u * j;
      var lq = 0.0;
      var dq_ = 0.0;
      if (qr < ap.t) {
        lq = lse_in[bh * ap.t + qr] * LOG2E;
        dq_ = delta_in[bh * ap.t + qr];
      }
      dl[j] = dq_;
      let ok = (vec4<u32>(qr) >= keys) & vec4<bool>(qr < ap.t);
      p[j] = select(vec4<f32>(0.0), exp2(s[j] * c - lq), ok);
    }
    put_tile(p, tx, ty);
    workgroupBarrier();
    pv_tile(&dv_acc, OG, gbase, ap.g.w, c0, li, tx, ty);          // dV += P^T dO
    let dp = qk_tile(OV, vbase, ap.v.w, r0, OG, gbase, ap.g.w, c0, li, tx, ty);  // dP^T = V dO^T
    var ds: array<vec4<f32>, 4>;
    for (var j = 0u; j < 4u; j++) { ds[j] = p[j] * (dp[j] - vec4<f32>(dl[j])); }
    put_tile(ds, tx, ty);
    workgroupBarrier();
    pv_tile(&dk_acc, OQ, qbase, ap.q.w, c0, li, tx, ty);          // dK += dS^T Q
  }
  // The first dispatch that reaches this key block applies the caller's beta; later ones accumulate.
  let beta = select(1.0, ap.beta, kb >= ap.blk0);
  let dkb = head_base(ap.dk, bh);
  let dvb = head_base(ap.dv, bh);
  for (var i = 0u; i < 4u; i++) {
    for (var cc = 0u; cc < DC; cc++) {
      let ik = grad_index(dkb, ap.dk.w, keys, i, tx, cc);
      if (ik == 0xffffffffu) { continue; }
      var x = dk_acc[cc][i] * ap.scale;
      if (beta != 0.0) { x += beta * dk[ik]; }
      dk[ik] = x;
      let iv = grad_index(dvb, ap.dv.w, keys, i, tx, cc);
      var y = dv_acc[cc][i];
      if (beta != 0.0) { y += beta * dv[iv]; }
      dv[iv] = y;
    }
  }
}

@compute @workgroup_size(16, 16)
fn attn_dq(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
           @builtin(local_invocation_index) li: u32) {
  let tx = lid.x;
  let ty = lid.y;
  let bh = ap.bh0 + wid.y;
  let qb = ap.blocks - 1u - wid.x;  // query blocks blk0 .., heaviest first
  let r0 = qb * B;
  let rows = vec4<u32>(r0 + ty) + ROWS;
  let qbase = head_base(ap.q, bh);
  let kbase = head_base(ap.k, bh);
  let vbase = head_base(ap.v, bh);
  let gbase = head_base(ap.g, bh);
  let c = ap.scale * LOG2E;
  var lse2: vec4<f32>;
  var dl: vec4<f32>;
  for (var i = 0u; i < 4u; i++) {
    if (rows[i] < ap.t) {
      lse2[i] = lse_in[bh * ap.t + rows[i]] * LOG2E;
      dl[i] = delta_in[bh * ap.t + rows[i]];
    }
  }
  var acc: array<vec4<f32>, DC>;
  let kend = min(ap.blk1, qb + 1u);
  for (var kb = ap.blk0; kb < kend; kb++) {
    let c0 = kb * B;
    let s = qk_tile(OQ, qbase, ap.q.w, r0, OK, kbase, ap.k.w, c0, li, tx, ty);
    let dp = qk_tile(OG, gbase, ap.g.w, r0, OV, vbase, ap.v.w, c0, li, tx, ty);  // dP = dO V^T
    var ds: array<vec4<f32>, 4>;
    for (var j = 0u; j < 4u; j++) {
      let key = vec4<u32>(c0 + tx + 16u * j);
      let ok = (key <= rows) & (key < vec4<u32>(ap.t)) & (rows < vec4<u32>(ap.t));
      let p = select(vec4<f32>(0.0), exp2(s[j] * c - lse2), ok);
      ds[j] = p * (dp[j] - dl);
    }
    put_tile(ds, tx, ty);
    workgroupBarrier();
    pv_tile(&acc, OK, kbase, ap.k.w, c0, li, tx, ty);  // dQ += dS K
  }
  let beta = select(1.0, ap.beta, ap.blk0 == 0u);
  let dqb = head_base(ap.dq, bh);
  for (var i = 0u; i < 4u; i++) {
    for (var cc = 0u; cc < DC; cc++) {
      let iq = grad_index(dqb, ap.dq.w, rows, i, tx, cc);
      if (iq == 0xffffffffu) { continue; }
      var x = acc[cc][i] * ap.scale;
      if (beta != 0.0) { x += beta * dq[iq]; }
      dq[iq] = x;
    }
  }
}
