// Multi-head attention, fused (FlashAttention-2 style): the T x S scores
// never reach memory. Queries (q, O, dO, dQ) are strided [B, H, T, D] views,
// keys and values (k, v, dK, dV) [B, H, S, D] ones (ap.t = T, ap.tk = S);
// with CAUSAL, query i sees keys 0..i (torch's is_causal: the top-left
// triangle), else every key. Operands are strided views:
// element (b, h, t, d) of an operand with view (off, sb, sh, st) lies at
// off + b * sb + h * sh + t * st + d (d contiguous), so q, k, v and their
// gradients can be column blocks of one [B, T, 3C] tensor.
//
// HD (the head size) and CAUSAL are pipeline constants: every kernel is
// specialised per head size and mask. Tiles are B = 64 rows x 64 columns per workgroup of 16 x 16
// threads; a thread owns rows ty + 16 i (i < 4, the components of a vec4)
// and score columns tx + 16 j (j < 4), or output columns 4 tx .. 4 tx + 3
// (and 64 + 4 tx .. for HD > 64). Operands are staged 64 rows x 64 head
// columns at a time into two row-major vec4 tiles in workgroup memory (XOR
// swizzled, 32 KiB in all); every product reads vec4s from both sides
// (register-blocked like gemm.wgsl: 16 FMAs per two vec4 reads); masks are
// applied on diagonal and tail tiles only.
//
//   attn_forward:   per (bh, query block): loop over key blocks (up to the
//                   diagonal when causal), S = Q K^T scaled in registers, online softmax
//                   (running max and sum), O += P V; writes O and the row
//                   log-sum-exp (natural log, [BH, T]).
//   attn_delta:     delta = rowsum(dO * O) per row ([BH, T]).
//   attn_dkdv:      per (bh, key block): loop over query blocks (from the
//                   diagonal when causal), P^T recomputed from lse, dV += P^T dO,
//                   dS^T = P^T (dP^T - delta), dK += dS^T Q * scale.
//   attn_dq:        per (bh, query block): loop over key blocks (up to the
//                   diagonal when causal), dQ += dS K * scale (no atomics: deterministic).
//
// The block loop covers inner blocks [blk0, blk1) only (the launcher splits
// long sequences over dispatches: lavapipe leaves loops after 65535 trips);
// a forward dispatch past the first resumes from the O and lse written by
// the previous one, backward dispatches past the first accumulate.
// Workgroup memory: two 64 x 64 tiles (operands, P / dS, row reductions) =
// 8192 floats. Operand tiles go global -> registers (fetch: 4 vec4 per
// thread, one 128-bit load each with VEC) -> workgroup memory (put): the
// operand a kernel reuses over its whole block loop (Q in the forward and
// dQ, dO in dQ, K and V in dK/dV) is fetched once and kept in registers, and
// the next block's operands are fetched while the current block computes. The pipelines are trusted (no injected bounds checks): every
// storage access is guarded by row < T and column < HD, and the host checks
// that each view's last element lies inside its binding.
//
// ET (an alias emitted per kernel, csrc/attention.cpp): the element type of
// q, k, v, dO, O and dq, dk, dv, f32 or f16 (HALF: bool, ET is f16). Operands
// widen to f32 as they enter workgroup memory, all math is f32 (scores,
// softmax max and sum, products), and each output element is rounded once
// (half.wgsl); lse and delta stay f32.
// With HALF, a result that several dispatches build (a split block loop)
// keeps its partial sums in f32 scratch (acc_ws) and only the dispatch that
// finishes an element rounds it into the output.
//!include half

struct AttnParams {
  t: u32, heads: u32, bh0: u32, blocks: u32,  // sequence length, H, first bh of this dispatch, ceil(T / B)
  blk0: u32, blk1: u32, scale: f32, beta: f32,
  q: vec4<u32>, k: vec4<u32>, v: vec4<u32>, o: vec4<u32>,  // views: (off, sb, sh, st)
  g: vec4<u32>, dq: vec4<u32>, dk: vec4<u32>, dv: vec4<u32>,
  tk: u32, kblocks: u32, _pad0: u32, _pad1: u32,  // S (keys), ceil(S / B)
}

@group(0) @binding(0) var<storage, read> q_in: array<ET>;
@group(0) @binding(1) var<storage, read> k_in: array<ET>;
@group(0) @binding(2) var<storage, read> v_in: array<ET>;
@group(0) @binding(3) var<storage, read_write> out: array<ET>;      // forward: O (read when resuming)
@group(0) @binding(4) var<storage, read_write> lse_out: array<f32>;  // forward: log-sum-exp per row
@group(0) @binding(5) var<uniform> ap: AttnParams;
@group(0) @binding(6) var<storage, read> o_in: array<ET>;           // delta: O
@group(0) @binding(7) var<storage, read> dout: array<ET>;           // dO (the forward binds q here, unread)
@group(0) @binding(8) var<storage, read> lse_in: array<f32>;
@group(0) @binding(9) var<storage, read_write> delta_out: array<f32>;
@group(0) @binding(10) var<storage, read> delta_in: array<f32>;
@group(0) @binding(11) var<storage, read_write> dq: array<ET>;
@group(0) @binding(12) var<storage, read_write> dk: array<ET>;
@group(0) @binding(13) var<storage, read_write> dv: array<ET>;
// q, k, v and dO again as vec4s (VEC: every view's offset and strides and HD
// are multiples of 4; otherwise a placeholder is bound and never read).
@group(0) @binding(14) var<storage, read> q4: array<vec4<ET>>;
@group(0) @binding(15) var<storage, read> k4: array<vec4<ET>>;
@group(0) @binding(16) var<storage, read> v4: array<vec4<ET>>;
@group(0) @binding(17) var<storage, read> g4: array<vec4<ET>>;
// attn_decode: the key/value caches it appends to, and the position (device-side, so replays move on).
@group(0) @binding(18) var<storage, read_write> kc: array<f32>;
@group(0) @binding(19) var<storage, read_write> vc: array<f32>;
@group(0) @binding(20) var<storage, read> pos_in: array<i32>;
// HALF: f32 partial results of split block loops, dense [B*H][T][HD] (dK at 0
// and dV after it in attn_dkdv; O or dQ at 0); a single dispatch never touches it.
@group(0) @binding(21) var<storage, read_write> acc_ws: array<f32>;
// KBIAS (a pipeline constant): a per-key bias [B][S] added to the scaled scores of every head
// and query (torch's additive key padding mask; -inf drops the key); a placeholder otherwise.
@group(0) @binding(22) var<storage, read> kbias: array<f32>;

// From csrc/shader_contract.hpp (emitted ahead of this file): B (rows and columns of a tile),
// DELTA_WG (threads of attn_delta).
const NV: u32 = 16u;               // vec4s per tile row (64 columns)
const DCH: u32 = (HD + 63u) / 64u; // 64-column chunks of a head row (1 or 2)
const R0: u32 = 0u;                // tile region 0: [64 rows][NV vec4], rows swizzled
const R1: u32 = B * NV;            // tile region 1 (also the row-reduction scratch)
const NEG: f32 = -3.0e38;          // masked score (finite: no inf - inf)
const LOG2E: f32 = 1.4426950408889634;
const LN2: f32 = 0.6931471805599453;
const ROWS: vec4<u32> = vec4<u32>(0u, 16u, 32u, 48u);

// Two 64 x 64 tiles (32 KiB). Vec4 column c4 of tile row r lies at
// reg + r * NV + (c4 ^ (r & 15)): the XOR swizzle keeps both the row-wise
// reads (16 rows tx + 16 j at one c4) and the column-wise ones (one row, 16
// c4) on distinct banks without padding.
var<workgroup> sm: array<vec4<f32>, 2u * B * NV>;

// Operand reads by id (the kernels that call ld bind all four).
const OQ: u32 = 0u;
const OK: u32 = 1u;
const OV: u32 = 2u;
const OG: u32 = 3u;

fn ld(which: u32, idx: u32) -> ET {
  switch which {
    case 0u: { return q_in[idx]; }
    case 1u: { return k_in[idx]; }
    case 2u: { return v_in[idx]; }
    default: { return dout[idx]; }
  }
}

// An f32 result rounded once to the element type.
fn st(v: f32) -> ET { return ET(half_range(v, HALF)); }

// Element offset of row (b, h, 0) of a view.
fn head_base(view: vec4<u32>, bh: u32) -> u32 {
  return view.x + (bh / ap.heads) * view.y + (bh % ap.heads) * view.z;
}

fn ld4(which: u32, i4: u32) -> vec4<ET> {
  switch which {
    case 0u: { return q4[i4]; }
    case 1u: { return k4[i4]; }
    case 2u: { return v4[i4]; }
    default: { return g4[i4]; }
  }
}

// A thread's share of a staged tile (rows r0..r0+63, head columns d0..d0+63
// of an operand): slot s is tile row li / 16 + 16 s, vec4 column li % 16; 0
// past T or HD. Tiles go global -> registers (fetch) -> workgroup memory
// (put), so loads are issued early (prefetch) and operands reused across
// block iterations stay in registers instead of being read again, in the
// element type (float16 slices take half the registers), widened as they are
// put.
alias Slice = array<vec4<ET>, 4>;

// Rows of an operand: S for keys and values, T for queries and dO.
fn seq_len(which: u32) -> u32 { return select(ap.t, ap.tk, which == OK || which == OV); }

fn fetch1(which: u32, base: u32, st: u32, row: u32, d: u32) -> vec4<ET> {
  var x = vec4<ET>();
  if (row < seq_len(which) && d < HD) {
    let i = base + row * st + d;
    if (VEC) {
      x = ld4(which, i / 4u);
    } else if (d + 4u <= HD) {
      x = vec4<ET>(ld(which, i), ld(which, i + 1u), ld(which, i + 2u), ld(which, i + 3u));
    } else {
      x.x = ld(which, i);
      if (d + 1u < HD) { x.y = ld(which, i + 1u); }
      if (d + 2u < HD) { x.z = ld(which, i + 2u); }
    }
  }
  return x;
}

fn fetch(which: u32, base: u32, st: u32, r0: u32, d0: u32, li: u32) -> Slice {
  let row = r0 + li / NV;
  let d = d0 + 4u * (li % NV);
  return Slice(fetch1(which, base, st, row, d), fetch1(which, base, st, row + 16u, d),
               fetch1(which, base, st, row + 32u, d), fetch1(which, base, st, row + 48u, d));
}

// Stores a fetched slice into the tile at reg (row-major, swizzled).
fn put(x: Slice, reg: u32, li: u32) {
  let r = li / NV;
  let i = reg + r * NV + ((li % NV) ^ r);
  sm[i] = vec4<f32>(x[0]);
  sm[i + 16u * NV] = vec4<f32>(x[1]);
  sm[i + 32u * NV] = vec4<f32>(x[2]);
  sm[i + 48u * NV] = vec4<f32>(x[3]);
}

// Vec4 columns of chunk ch holding head columns.
fn chunk_c4(ch: u32) -> u32 { return min(NV, (HD - ch * 64u + 3u) / 4u); }

// s[j][i] += sum over nc4 vec4 columns of A[ty + 16 i] . Bt[tx + 16 j] (tiles at ra, rb).
fn mul_nt(s: ptr<function, array<vec4<f32>, 4>>, ra: u32, rb: u32, nc4: u32, tx: u32, ty: u32) {
  for (var c4 = 0u; c4 < nc4; c4++) {
    let ia = ra + ty * NV + (c4 ^ ty);
    let a0 = sm[ia];
    let a1 = sm[ia + 16u * NV];
    let a2 = sm[ia + 32u * NV];
    let a3 = sm[ia + 48u * NV];
    let ax = vec4<f32>(a0.x, a1.x, a2.x, a3.x);
    let ay = vec4<f32>(a0.y, a1.y, a2.y, a3.y);
    let az = vec4<f32>(a0.z, a1.z, a2.z, a3.z);
    let aw = vec4<f32>(a0.w, a1.w, a2.w, a3.w);
    let ib = rb + tx * NV + (c4 ^ tx);
    let b0 = sm[ib];
    let b1 = sm[ib + 16u * NV];
    let b2 = sm[ib + 32u * NV];
    let b3 = sm[ib + 48u * NV];
    (*s)[0] = fma(aw, vec4<f32>(b0.w), fma(az, vec4<f32>(b0.z), fma(ay, vec4<f32>(b0.y), fma(ax, vec4<f32>(b0.x), (*s)[0]))));
    (*s)[1] = fma(aw, vec4<f32>(b1.w), fma(az, vec4<f32>(b1.z), fma(ay, vec4<f32>(b1.y), fma(ax, vec4<f32>(b1.x), (*s)[1]))));
    (*s)[2] = fma(aw, vec4<f32>(b2.w), fma(az, vec4<f32>(b2.z), fma(ay, vec4<f32>(b2.y), fma(ax, vec4<f32>(b2.x), (*s)[2]))));
    (*s)[3] = fma(aw, vec4<f32>(b3.w), fma(az, vec4<f32>(b3.z), fma(ay, vec4<f32>(b3.y), fma(ax, vec4<f32>(b3.x), (*s)[3]))));
  }
}

// acc[i] += sum_k P[ty + 16 i][k] * X[k][4 tx .. 4 tx + 3] over the first
// 4 nk4 columns of P (tile at rp) and rows of X (tile at rx).
fn mul_pn(acc: ptr<function, array<vec4<f32>, 4>>, rp: u32, rx: u32, nk4: u32, tx: u32, ty: u32) {
  for (var k4 = 0u; k4 < nk4; k4++) {
    let ip = rp + ty * NV + (k4 ^ ty);
    let p0 = sm[ip];
    let p1 = sm[ip + 16u * NV];
    let p2 = sm[ip + 32u * NV];
    let p3 = sm[ip + 48u * NV];
    let k = 4u * k4;  // rows k .. k + 3 of X: (k + m) & 15 = (k & 15) + m
    let ix = rx + k * NV;
    let s = k & 15u;
    let x0 = sm[ix + (tx ^ s)];
    let x1 = sm[ix + NV + (tx ^ (s + 1u))];
    let x2 = sm[ix + 2u * NV + (tx ^ (s + 2u))];
    let x3 = sm[ix + 3u * NV + (tx ^ (s + 3u))];
    (*acc)[0] = fma(vec4<f32>(p0.w), x3, fma(vec4<f32>(p0.z), x2, fma(vec4<f32>(p0.y), x1, fma(vec4<f32>(p0.x), x0, (*acc)[0]))));
    (*acc)[1] = fma(vec4<f32>(p1.w), x3, fma(vec4<f32>(p1.z), x2, fma(vec4<f32>(p1.y), x1, fma(vec4<f32>(p1.x), x0, (*acc)[1]))));
    (*acc)[2] = fma(vec4<f32>(p2.w), x3, fma(vec4<f32>(p2.z), x2, fma(vec4<f32>(p2.y), x1, fma(vec4<f32>(p2.x), x0, (*acc)[2]))));
    (*acc)[3] = fma(vec4<f32>(p3.w), x3, fma(vec4<f32>(p3.z), x2, fma(vec4<f32>(p3.y), x1, fma(vec4<f32>(p3.x), x0, (*acc)[3]))));
  }
}

// Writes a thread's scores p[j][i] (row ty + 16 i, column tx + 16 j) into the tile at reg.
fn put_tile(p: array<vec4<f32>, 4>, reg: u32, tx: u32, ty: u32) {
  let q = tx % 4u;
  for (var j = 0u; j < 4u; j++) {
    let c4 = (tx / 4u + 4u * j) ^ ty;
    sm[reg + ty * NV + c4][q] = p[j].x;
    sm[reg + (ty + 16u) * NV + c4][q] = p[j].y;
    sm[reg + (ty + 32u) * NV + c4][q] = p[j].z;
    sm[reg + (ty + 48u) * NV + c4][q] = p[j].w;
  }
}

// Row reductions over the 16 threads of a row, through R1 (free when called):
// row_partials stores, and after a barrier row_combine gives each thread its
// 4 rows' sums (maxima), added in a fixed order (deterministic).
fn row_partials(x: vec4<f32>, tx: u32, ty: u32) {
  let q = tx % 4u;
  let c = R1 + tx / 4u;
  sm[c + ty * 4u][q] = x.x;
  sm[c + (ty + 16u) * 4u][q] = x.y;
  sm[c + (ty + 32u) * 4u][q] = x.z;
  sm[c + (ty + 48u) * 4u][q] = x.w;
}

fn combine4(a: vec4<f32>, b: vec4<f32>, c: vec4<f32>, d: vec4<f32>, is_max: bool) -> f32 {
  if (is_max) {
    let m = max(max(a, b), max(c, d));
    return max(max(m.x, m.y), max(m.z, m.w));
  }
  let s = (a + b) + (c + d);
  return (s.x + s.y) + (s.z + s.w);
}

fn row_combine(ty: u32, is_max: bool) -> vec4<f32> {
  var r: vec4<f32>;
  for (var i = 0u; i < 4u; i++) {
    let c = R1 + (ty + 16u * i) * 4u;
    r[i] = combine4(sm[c], sm[c + 1u], sm[c + 2u], sm[c + 3u], is_max);
  }
  return r;
}

// Index of output element (row, col) of a view of len rows; 0xffffffff past len or HD.
fn out_index(base: u32, st: u32, row: u32, col: u32, len: u32) -> u32 {
  if (row >= len || col >= HD) { return 0xffffffffu; }
  return base + row * st + col;
}

// Element (bh, row, col) of the dense f32 scratch acc_ws, len rows per head.
fn ws_index(bh: u32, row: u32, col: u32, len: u32) -> u32 { return (bh * len + row) * HD + col; }

fn causal() -> bool { return CAUSAL; }

// Key blocks query block qb reaches, and whether a dispatch ending at key
// block blk1 leaves some of them to a later one.
fn key_blocks(qb: u32) -> u32 { return select(ap.kblocks, min(qb + 1u, ap.kblocks), causal()); }
fn more_keys_later(qb: u32) -> bool { return ap.blk1 < key_blocks(qb); }

// The key bias of (bh, key) in log2 units (the scores' units), 0 without KBIAS or past S.
fn key_bias(bh: u32, key: u32) -> f32 {
  if (!KBIAS || key >= ap.tk) { return 0.0; }
  return kbias[(bh / ap.heads) * ap.tk + key] * LOG2E;
}

fn key_bias4(bh: u32, keys: vec4<u32>) -> vec4<f32> {
  return vec4<f32>(key_bias(bh, keys.x), key_bias(bh, keys.y), key_bias(bh, keys.z), key_bias(bh, keys.w));
}

// Which of a tile's scores are real: key < S, and key <= query when causal.
fn visible(key: vec4<u32>, query: vec4<u32>) -> vec4<bool> {
  return (key < vec4<u32>(ap.tk)) & ((key <= query) | vec4<bool>(!causal()));
}

// What a dispatch's share of a gradient element adds to: on the first dispatch
// that reaches the element, the caller's beta times the output's old value;
// on later ones the sum the earlier ones left (in the output, or with HALF in
// acc_ws[w], since an f16 partial sum would be rounded at every dispatch).
fn grad_base(old: f32, w: u32, first: bool) -> f32 {
  if (first) { return select(ap.beta * old, 0.0, ap.beta == 0.0); }
  if (HALF) { return acc_ws[w]; }
  return old;
}

// Whether grad_base reads `old`: the loads below are skipped where it does
// not (beta 0, or a later float16 dispatch), which spares a full read of the
// gradient outputs.
fn reads_old(first: bool) -> bool { return select(!HALF, ap.beta != 0.0, first); }
fn old_dk(i: u32, first: bool) -> f32 {
  if (reads_old(first)) { return f32(dk[i]); }
  return 0.0;
}
fn old_dv(i: u32, first: bool) -> f32 {
  if (reads_old(first)) { return f32(dv[i]); }
  return 0.0;
}
fn old_dq(i: u32, first: bool) -> f32 {
  if (reads_old(first)) { return f32(dq[i]); }
  return 0.0;
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
  var acc0: array<vec4<f32>, 4>;  // rows ty + 16 i, head columns 4 tx .. 4 tx + 3
  var acc1: array<vec4<f32>, 4>;  // the same, columns 64 + 4 tx .. (HD > 64)
  if (ap.blk0 > 0u) {  // resume: O and lse of the earlier key blocks (l = 1 at m = lse)
    for (var i = 0u; i < 4u; i++) {
      if (rows[i] < ap.t) {
        m[i] = lse_out[bh * ap.t + rows[i]] * LOG2E;
        for (var e = 0u; e < 4u; e++) {
          let col = 4u * tx + e;
          if (HALF) {  // the f32 partial O of the earlier dispatches
            let w = ws_index(bh, rows[i], col, ap.t);
            if (col < HD) { acc0[i][e] = acc_ws[w]; }
            if (DCH > 1u && col + 64u < HD) { acc1[i][e] = acc_ws[w + 64u]; }
          } else {
            if (col < HD) { acc0[i][e] = f32(out[obase + rows[i] * ap.o.w + col]); }
            if (DCH > 1u && col + 64u < HD) { acc1[i][e] = f32(out[obase + rows[i] * ap.o.w + col + 64u]); }
          }
        }
      }
    }
    l = vec4<f32>(select(0.0, 1.0, tx == 0u));
  }
  // Q stays in registers; K of the next block is fetched during this one's
  // softmax and P V, V of this block during its Q K^T.
  var qr = array<Slice, DCH>();
  var kr = array<Slice, DCH>();
  var vr = array<Slice, DCH>();
  for (var ch = 0u; ch < DCH; ch++) {
    qr[ch] = fetch(OQ, qbase, ap.q.w, r0, ch * 64u, li);
    kr[ch] = fetch(OK, kbase, ap.k.w, ap.blk0 * B, ch * 64u, li);
  }
  let kend = min(ap.blk1, key_blocks(qb));
  for (var kb = ap.blk0; kb < kend; kb++) {
    let c0 = kb * B;
    for (var ch = 0u; ch < DCH; ch++) { vr[ch] = fetch(OV, vbase, ap.v.w, c0, ch * 64u, li); }
    var s = array<vec4<f32>, 4>();
    for (var ch = 0u; ch < DCH; ch++) {
      put(qr[ch], R0, li);
      put(kr[ch], R1, li);
      workgroupBarrier();
      mul_nt(&s, R0, R1, chunk_c4(ch), tx, ty);
      workgroupBarrier();
    }
    if (kb + 1u < kend) {
      for (var ch = 0u; ch < DCH; ch++) { kr[ch] = fetch(OK, kbase, ap.k.w, c0 + B, ch * 64u, li); }
    }
    let masked = (causal() && kb == qb) || c0 + B > ap.tk;  // uniform: only diagonal and tail tiles
    var mloc = vec4<f32>(NEG);
    for (var j = 0u; j < 4u; j++) {
      s[j] = s[j] * c + key_bias(bh, c0 + tx + 16u * j);
      if (masked) { s[j] = select(vec4<f32>(NEG), s[j], visible(vec4<u32>(c0 + tx + 16u * j), rows)); }
      mloc = max(mloc, s[j]);
    }
    row_partials(mloc, tx, ty);
    let nk4 = min(NV, (ap.tk - c0 + 3u) / 4u);
    put(vr[0], R0, li);
    workgroupBarrier();
    let mnew = max(m, row_combine(ty, true));
    let alpha = exp2(m - mnew);
    var ps = vec4<f32>(0.0);
    for (var j = 0u; j < 4u; j++) {
      var p = exp2(s[j] - mnew);
      // Masked scores are exactly NEG; a NaN score (a NaN key row) keeps its NaN p, so the
      // rows that see it come out NaN, as torch (whatever max() made of the NaN above).
      if (masked) { p = select(p, vec4<f32>(0.0), s[j] == vec4<f32>(NEG)); }
      s[j] = p;
      ps += p;
    }
    l = l * alpha + ps;
    m = mnew;
    for (var i = 0u; i < 4u; i++) { acc0[i] *= alpha[i]; acc1[i] *= alpha[i]; }
    workgroupBarrier();  // the row maxima are read: R1 takes P
    put_tile(s, R1, tx, ty);
    workgroupBarrier();
    mul_pn(&acc0, R1, R0, nk4, tx, ty);  // O += P V
    workgroupBarrier();
    for (var ch = 1u; ch < DCH; ch++) {
      put(vr[ch], R0, li);
      workgroupBarrier();
      mul_pn(&acc1, R1, R0, nk4, tx, ty);
      workgroupBarrier();
    }
  }
  row_partials(l, tx, ty);
  workgroupBarrier();
  let lt = row_combine(ty, false);
  let partial = HALF && more_keys_later(qb);  // a later dispatch goes on with this block's keys
  for (var i = 0u; i < 4u; i++) {
    if (rows[i] >= ap.t) { continue; }
    let inv = 1.0 / lt[i];
    for (var e = 0u; e < 4u; e++) {
      let col = 4u * tx + e;
      if (partial) {
        let w = ws_index(bh, rows[i], col, ap.t);
        if (col < HD) { acc_ws[w] = acc0[i][e] * inv; }
        if (DCH > 1u && col + 64u < HD) { acc_ws[w + 64u] = acc1[i][e] * inv; }
      } else {
        if (col < HD) { out[obase + rows[i] * ap.o.w + col] = st(acc0[i][e] * inv); }
        if (DCH > 1u && col + 64u < HD) { out[obase + rows[i] * ap.o.w + col + 64u] = st(acc1[i][e] * inv); }
      }
    }
    if (tx == 0u) { lse_out[bh * ap.t + rows[i]] = (m[i] + log2(lt[i])) * LN2; }
  }
}

// delta[bh, t] = sum_d dO * O: a thread per row (ap.blocks = rows B*H*T of this dispatch, from bh0 * T).
@compute @workgroup_size(DELTA_WG)
fn attn_delta(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) li: u32) {
  let e = (wid.y * nwg.x + wid.x) * DELTA_WG + li;
  if (e >= ap.blocks) { return; }
  let row = ap.bh0 * ap.t + e;
  let bh = row / ap.t;
  let t = row % ap.t;
  let ob = head_base(ap.o, bh) + t * ap.o.w;
  let gb = head_base(ap.g, bh) + t * ap.g.w;
  var s = vec4<f32>(0.0);
  var d = 0u;
  for (; d + 4u <= HD; d += 4u) {
    s = fma(vec4<f32>(vec4<ET>(o_in[ob + d], o_in[ob + d + 1u], o_in[ob + d + 2u], o_in[ob + d + 3u])),
            vec4<f32>(vec4<ET>(dout[gb + d], dout[gb + d + 1u], dout[gb + d + 2u], dout[gb + d + 3u])), s);
  }
  for (; d < HD; d++) { s.x = fma(f32(o_in[ob + d]), f32(dout[gb + d]), s.x); }
  delta_out[row] = (s.x + s.y) + (s.z + s.w);
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
  let kb_rows = key_bias4(bh, keys);  // this block's keys are the tile's rows
  var dk0: array<vec4<f32>, 4>;  // key rows ty + 16 i, head columns 4 tx .. (and 64 + 4 tx ..)
  var dk1: array<vec4<f32>, 4>;
  var dv0: array<vec4<f32>, 4>;
  var dv1: array<vec4<f32>, 4>;
  // K and V stay in registers; Q and dO of the next query block are fetched
  // while this one's products run.
  let qstart = select(ap.blk0, max(kb, ap.blk0), causal());
  let qend = min(ap.blk1, ap.blocks);
  var kr = array<Slice, DCH>();
  var vr = array<Slice, DCH>();
  var qr = array<Slice, DCH>();
  var gr = array<Slice, DCH>();
  for (var ch = 0u; ch < DCH; ch++) {
    kr[ch] = fetch(OK, kbase, ap.k.w, r0, ch * 64u, li);
    vr[ch] = fetch(OV, vbase, ap.v.w, r0, ch * 64u, li);
    qr[ch] = fetch(OQ, qbase, ap.q.w, qstart * B, ch * 64u, li);
    gr[ch] = fetch(OG, gbase, ap.g.w, qstart * B, ch * 64u, li);
  }
  for (var qb = qstart; qb < qend; qb++) {
    let c0 = qb * B;
    let more = qb + 1u < qend;
    let nk4 = min(NV, (ap.t - c0 + 3u) / 4u);
    var lq = vec4<f32>(0.0);  // lse (log2 units) and delta of query columns tx + 16 j
    var dl = vec4<f32>(0.0);
    for (var j = 0u; j < 4u; j++) {
      let qr_ = c0 + tx + 16u * j;
      if (qr_ < ap.t) {
        lq[j] = lse_in[bh * ap.t + qr_] * LOG2E;
        dl[j] = delta_in[bh * ap.t + qr_];
      }
    }
    // S^T = K Q^T (rows keys, columns queries) and dP^T = V dO^T.
    var s = array<vec4<f32>, 4>();
    var dp = array<vec4<f32>, 4>();
    for (var ch = 0u; ch < DCH; ch++) {
      put(kr[ch], R0, li);
      put(qr[ch], R1, li);
      workgroupBarrier();
      mul_nt(&s, R0, R1, chunk_c4(ch), tx, ty);
      workgroupBarrier();
    }
    for (var ch = 0u; ch < DCH; ch++) {
      put(vr[ch], R0, li);
      put(gr[ch], R1, li);
      workgroupBarrier();
      mul_nt(&dp, R0, R1, chunk_c4(ch), tx, ty);
      workgroupBarrier();
    }
    if (DCH == 1u && more) { gr[0] = fetch(OG, gbase, ap.g.w, c0 + B, 0u, li); }  // dO is staged: fetch the next
    let masked = (causal() && qb == kb) || c0 + B > ap.t;
    var p = array<vec4<f32>, 4>();
    for (var j = 0u; j < 4u; j++) {
      let qr_ = c0 + tx + 16u * j;
      p[j] = exp2(s[j] * c + kb_rows - lq[j]);
      if (masked) {
        let keep = ((vec4<u32>(qr_) >= keys) | vec4<bool>(!causal())) & vec4<bool>(qr_ < ap.t);
        p[j] = select(vec4<f32>(0.0), p[j], keep);
      }
      s[j] = p[j] * (dp[j] - vec4<f32>(dl[j]));  // dS^T
    }
    // dV += P^T dO: P^T into R0; dO (chunk DCH - 1) is still in R1.
    put_tile(p, R0, tx, ty);
    if (DCH > 1u) { put(gr[0], R1, li); }
    workgroupBarrier();
    mul_pn(&dv0, R0, R1, nk4, tx, ty);
    workgroupBarrier();
    for (var ch = 1u; ch < DCH; ch++) {
      put(gr[ch], R1, li);
      workgroupBarrier();
      mul_pn(&dv1, R0, R1, nk4, tx, ty);
      workgroupBarrier();
    }
    if (DCH > 1u && more) {
      for (var ch = 0u; ch < DCH; ch++) { gr[ch] = fetch(OG, gbase, ap.g.w, c0 + B, ch * 64u, li); }
    }
    // dK += dS^T Q (scaled at the end).
    put_tile(s, R0, tx, ty);
    put(qr[0], R1, li);
    if (DCH == 1u && more) { qr[0] = fetch(OQ, qbase, ap.q.w, c0 + B, 0u, li); }
    workgroupBarrier();
    mul_pn(&dk0, R0, R1, nk4, tx, ty);
    workgroupBarrier();
    for (var ch = 1u; ch < DCH; ch++) {
      put(qr[ch], R1, li);
      workgroupBarrier();
      mul_pn(&dk1, R0, R1, nk4, tx, ty);
      workgroupBarrier();
    }
    if (DCH > 1u && more) {
      for (var ch = 0u; ch < DCH; ch++) { qr[ch] = fetch(OQ, qbase, ap.q.w, c0 + B, ch * 64u, li); }
    }
  }
  // The first dispatch that reaches this key block applies the caller's beta;
  // later ones accumulate; the last one (all query blocks done) finishes it.
  // Constant indices only: left to a loop the compiler might not unroll, the
  // accumulators live in local memory for the whole kernel (the float16
  // kernel's did on the H100, 1.75x the float32 kernel's time).
  let first = select(ap.blk0 == 0u, kb >= ap.blk0, causal());
  dkdv_row(bh, keys.x, tx, first, dk0[0], dv0[0], dk1[0], dv1[0]);
  dkdv_row(bh, keys.y, tx, first, dk0[1], dv0[1], dk1[1], dv1[1]);
  dkdv_row(bh, keys.z, tx, first, dk0[2], dv0[2], dk1[2], dv1[2]);
  dkdv_row(bh, keys.w, tx, first, dk0[3], dv0[3], dk1[3], dv1[3]);
}

// dK and dV of one key row at head columns 4 tx .. 4 tx + 3 (and 64 more).
fn dkdv_row(bh: u32, key: u32, tx: u32, first: bool, dk_a: vec4<f32>, dv_a: vec4<f32>, dk_b: vec4<f32>,
            dv_b: vec4<f32>) {
  dkdv_element(bh, key, 4u * tx, first, dk_a.x, dv_a.x, dk_b.x, dv_b.x);
  dkdv_element(bh, key, 4u * tx + 1u, first, dk_a.y, dv_a.y, dk_b.y, dv_b.y);
  dkdv_element(bh, key, 4u * tx + 2u, first, dk_a.z, dv_a.z, dk_b.z, dv_b.z);
  dkdv_element(bh, key, 4u * tx + 3u, first, dk_a.w, dv_a.w, dk_b.w, dv_b.w);
}

fn dkdv_element(bh: u32, key: u32, col: u32, first: bool, dk_a: f32, dv_a: f32, dk_b: f32, dv_b: f32) {
  let partial = HALF && ap.blk1 < ap.blocks;
  let ik = out_index(head_base(ap.dk, bh), ap.dk.w, key, col, ap.tk);
  if (ik == 0xffffffffu) { return; }
  let iv = out_index(head_base(ap.dv, bh), ap.dv.w, key, col, ap.tk);
  let w = 2u * ws_index(bh, key, col, ap.tk);  // dK and dV partials interleaved
  let x = dk_a * ap.scale + grad_base(old_dk(ik, first), w, first);
  let y = dv_a + grad_base(old_dv(iv, first), w + 1u, first);
  if (partial) {
    acc_ws[w] = x;
    acc_ws[w + 1u] = y;
  } else {
    dk[ik] = st(x);
    dv[iv] = st(y);
  }
  if (DCH > 1u && col + 64u < HD) {
    let x1 = dk_b * ap.scale + grad_base(old_dk(ik + 64u, first), w + 128u, first);
    let y1 = dv_b + grad_base(old_dv(iv + 64u, first), w + 129u, first);
    if (partial) {
      acc_ws[w + 128u] = x1;
      acc_ws[w + 129u] = y1;
    } else {
      dk[ik + 64u] = st(x1);
      dv[iv + 64u] = st(y1);
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
  var lse2 = vec4<f32>(0.0);
  var dl = vec4<f32>(0.0);
  for (var i = 0u; i < 4u; i++) {
    if (rows[i] < ap.t) {
      lse2[i] = lse_in[bh * ap.t + rows[i]] * LOG2E;
      dl[i] = delta_in[bh * ap.t + rows[i]];
    }
  }
  var acc0: array<vec4<f32>, 4>;
  var acc1: array<vec4<f32>, 4>;
  // Q and dO stay in registers; K and V of the next key block are fetched
  // while this one's products run.
  var qr = array<Slice, DCH>();
  var gr = array<Slice, DCH>();
  var kr = array<Slice, DCH>();
  var vr = array<Slice, DCH>();
  for (var ch = 0u; ch < DCH; ch++) {
    gr[ch] = fetch(OG, gbase, ap.g.w, r0, ch * 64u, li);
    qr[ch] = fetch(OQ, qbase, ap.q.w, r0, ch * 64u, li);
    vr[ch] = fetch(OV, vbase, ap.v.w, ap.blk0 * B, ch * 64u, li);
    kr[ch] = fetch(OK, kbase, ap.k.w, ap.blk0 * B, ch * 64u, li);
  }
  let kend = min(ap.blk1, key_blocks(qb));
  for (var kb = ap.blk0; kb < kend; kb++) {
    let c0 = kb * B;
    let more = kb + 1u < kend;
    let nk4 = min(NV, (ap.tk - c0 + 3u) / 4u);
    var dp = array<vec4<f32>, 4>();  // dP = dO V^T
    var s = array<vec4<f32>, 4>();   // S = Q K^T; K (chunk 0) stays in R1 for dQ += dS K
    for (var ch = 0u; ch < DCH; ch++) {
      put(gr[ch], R0, li);
      put(vr[ch], R1, li);
      workgroupBarrier();
      mul_nt(&dp, R0, R1, chunk_c4(ch), tx, ty);
      workgroupBarrier();
    }
    if (more) {
      for (var ch = 0u; ch < DCH; ch++) { vr[ch] = fetch(OV, vbase, ap.v.w, c0 + B, ch * 64u, li); }
    }
    for (var ch = DCH; ch > 0u; ch--) {  // chunk 0 last
      put(qr[ch - 1u], R0, li);
      put(kr[ch - 1u], R1, li);
      workgroupBarrier();
      mul_nt(&s, R0, R1, chunk_c4(ch - 1u), tx, ty);
      workgroupBarrier();
    }
    if (DCH == 1u && more) { kr[0] = fetch(OK, kbase, ap.k.w, c0 + B, 0u, li); }
    let masked = (causal() && kb == qb) || c0 + B > ap.tk || r0 + B > ap.t;
    for (var j = 0u; j < 4u; j++) {
      var p = exp2(s[j] * c + key_bias(bh, c0 + tx + 16u * j) - lse2);
      if (masked) {
        p = select(vec4<f32>(0.0), p, visible(vec4<u32>(c0 + tx + 16u * j), rows) & (rows < vec4<u32>(ap.t)));
      }
      s[j] = p * (dp[j] - dl);  // dS
    }
    put_tile(s, R0, tx, ty);
    workgroupBarrier();
    mul_pn(&acc0, R0, R1, nk4, tx, ty);  // dQ += dS K
    workgroupBarrier();
    for (var ch = 1u; ch < DCH; ch++) {
      put(kr[ch], R1, li);
      workgroupBarrier();
      mul_pn(&acc1, R0, R1, nk4, tx, ty);
      workgroupBarrier();
    }
    if (DCH > 1u && more) {
      for (var ch = 0u; ch < DCH; ch++) { kr[ch] = fetch(OK, kbase, ap.k.w, c0 + B, ch * 64u, li); }
    }
  }
  let first = ap.blk0 == 0u;
  let partial = HALF && more_keys_later(qb);  // a later dispatch goes on with this block's keys
  let dqb = head_base(ap.dq, bh);
  for (var i = 0u; i < 4u; i++) {
    for (var e = 0u; e < 4u; e++) {
      let iq = out_index(dqb, ap.dq.w, rows[i], 4u * tx + e, ap.t);
      if (iq == 0xffffffffu) { continue; }
      let w = ws_index(bh, rows[i], 4u * tx + e, ap.t);
      let x = acc0[i][e] * ap.scale + grad_base(old_dq(iq, first), w, first);
      if (partial) { acc_ws[w] = x; } else { dq[iq] = st(x); }
      if (DCH > 1u && 4u * tx + e + 64u < HD) {
        let x1 = acc1[i][e] * ap.scale + grad_base(old_dq(iq + 64u, first), w + 64u, first);
        if (partial) { acc_ws[w + 64u] = x1; } else { dq[iq + 64u] = st(x1); }
      }
    }
  }
}

// attn_decode: one new query row per (b, h) against a key/value cache of
// capacity ap.t ([B, H, capacity, D] views ap.dk, ap.dv). The position
// comes from the device (pos_in[0]), so a captured decode step replays at
// every position: the new key and value (views ap.k, ap.v of the [B, 1, 3C]
// projection, like the query ap.q) are written to cache row pos, and the
// query attends over rows 0..pos (the new row read from the projection, not
// back from the cache). A workgroup per bh; every loop stops at pos + 1 keys,
// so the cost follows the filled length, not the capacity. Scores and the
// weights live in workgroup memory (DEC_KEYS of them: the host's capacity
// limit); the weighted sum runs DEC_WG / 64 key lanes of 64 columns each.
const DEC_LANES: u32 = DEC_WG / 64u;
var<workgroup> dec_s: array<f32, DEC_KEYS>;
var<workgroup> dec_r: array<f32, DEC_WG>;
var<workgroup> dec_o: array<f32, DEC_LANES * 128u>;
var<workgroup> dec_q: array<f32, 128>;

fn dec_reduce(li: u32, is_max: bool) -> f32 {
  workgroupBarrier();
  for (var w = DEC_WG / 2u; w > 0u; w = w / 2u) {
    if (li < w) {
      let a = dec_r[li];
      let b = dec_r[li + w];
      dec_r[li] = select(a + b, max(a, b), is_max);
    }
    workgroupBarrier();
  }
  let r = dec_r[0];
  workgroupBarrier();  // dec_r is reused by the next reduction
  return r;
}

@compute @workgroup_size(DEC_WG)
fn attn_decode(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
  let bh = wid.x;
  let pos = min(u32(max(pos_in[0], 0)), ap.t - 1u);  // the host keeps pos < capacity; clamped for memory safety
  let n = pos + 1u;
  let qb = head_base(ap.q, bh);
  let kb = head_base(ap.k, bh);
  let vb = head_base(ap.v, bh);
  let kcb = head_base(ap.dk, bh);
  let vcb = head_base(ap.dv, bh);
  if (li < HD) {
    dec_q[li] = f32(q_in[qb + li]);
    kc[kcb + pos * ap.dk.w + li] = f32(q_in[kb + li]);
    vc[vcb + pos * ap.dv.w + li] = f32(q_in[vb + li]);
  }
  workgroupBarrier();
  var m = NEG;
  for (var j = li; j < n; j += DEC_WG) {
    var s = 0.0;
    if (j == pos) {
      for (var d = 0u; d < HD; d++) { s = fma(dec_q[d], f32(q_in[kb + d]), s); }
    } else {
      let row = kcb + j * ap.dk.w;
      for (var d = 0u; d < HD; d++) { s = fma(dec_q[d], kc[row + d], s); }
    }
    s *= ap.scale;
    dec_s[j] = s;
    m = max(m, s);
  }
  dec_r[li] = m;
  let mx = dec_reduce(li, true);
  var l = 0.0;
  for (var j = li; j < n; j += DEC_WG) {
    let p = exp(dec_s[j] - mx);
    dec_s[j] = p;
    l += p;
  }
  dec_r[li] = l;
  let total = dec_reduce(li, false);  // its barriers also publish dec_s
  let lane = li % 64u;
  let grp = li / 64u;
  for (var ch = 0u; ch < DCH; ch++) {
    let col = ch * 64u + lane;
    var acc = 0.0;
    if (col < HD) {
      for (var j = grp; j < n; j += DEC_LANES) {
        let v = select(vc[vcb + j * ap.dv.w + col], f32(q_in[vb + col]), j == pos);
        acc = fma(dec_s[j], v, acc);
      }
    }
    dec_o[grp * 128u + col] = acc;
  }
  workgroupBarrier();
  if (li < HD) {
    var acc = 0.0;
    for (var g = 0u; g < DEC_LANES; g++) { acc += dec_o[g * 128u + li]; }
    out[head_base(ap.o, bh) + li] = st(acc / total);
  }
}
