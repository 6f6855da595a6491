// Tiled, register-blocked GEMM: C = alpha * op(A) * op(B) + beta * C, row-major
// f32, op = transpose when TRANS_A / TRANS_B. Transposition happens in the tile
// loads, so backward products (dC*B^T, A^T*dC) run on untransposed buffers.
//
// Specialization constants (emitted by the pipeline cache):
//   BM, BN, BK: workgroup tile; TM, TN: per-thread tile (multiples of 4);
//   TRANS_A, TRANS_B: bool; EPILOGUE: one of the EPILOGUE_* values (below);
//   ACT: activation of the fused epilogues; WARP_W: thread_xy below;
//   LEAN_LOOP: bool, the K loop shape of tile_product;
//   A_VEC, B_VEC: bool, whole-vec4 unchecked tile loads (below);
//   B_PAIR: bool, transposed B's unchecked tile loads as 64-bit k pairs
//     (load_b_pair);
//   C_VEC: bool, the epilogue stores C and the pre-activation (and reads C
//     for beta) as vec4s where four columns are inside (the host found C's
//     leading dimension, offset and split stride multiples of 4).
//   GROUP_M: tile rows a run of workgroups walks per tile column (tile_of).
//   ALIGNED: bool, the dispatch's tiles need no bounds checks (tile_product;
//     the host checks M and N, with EDGE_SHIFT's shifts).
//   EDGE_SHIFT: bool, gemm moves its last tile row and column inside and,
//     when ALIGNED, runs a partial K step first (the host's edge_checks sets
//     it only where M, N or K is ragged and every ragged edge can move:
//     whole-tile dispatches compile without it).
//   TRANS_C: bool, the pass that writes C stores element (m, n) of the
//     product at C[n * ldc + m] (the host runs an NT product C = A B^T as
//     C^T = B A^T, NN on a transposed copy of A; see store_transposed).
//   AB, CT, TT (aliases, not consts): the element types of A and B, of C,
//     and of the workgroup tiles and the registers that prefetch them (f32,
//     or f16 with `enable f16`); loads convert AB to TT, the product
//     accumulates in f32 and C's stores narrow to CT.
//     Split-K and stream-K partials are f32 (CT = f32 in those passes), their
//     reduce writes CT. HALF_FMA: bool, f16 tiles (TT = f16) multiplied with
//     f16 FMAs per K tile (multiply_tiles_half); otherwise TT = f32.
//   BT, RT (aliases): the element types of the epilogue's bias and residual;
//     the pre-activation is stored and read as CT. The epilogue computes in
//     f32 and rounds once when it stores.
// Each thread owns TM x TN outputs spread in 4x4 blocks strided by the
// workgroup, so shared-memory reads are consecutive vec4s across threads.
// Edge tiles: loads outside op(A)/op(B) read 0, stores outside C are skipped.
// From csrc/shader_contract.hpp: EW_WG (threads of the elementwise entries)
// and the EPILOGUE_* values.
//!include activations

struct GemmParams {
  m: u32, n: u32, k: u32,
  lda: u32, ldb: u32, ldc: u32,
  a_off: u32, b_off: u32, c_off: u32,  // element offsets inside the bound ranges
  alpha: f32, beta: f32,
  bias_off: u32,
  // Split-K: workgroup z sums k in [z * k_chunk, (z + 1) * k_chunk) and writes
  // its partial product split_stride elements further on (plain entry only).
  k_chunk: u32, split_stride: u32, splits: u32,
  // Stream-K (gemm_stream_k, stream_k_fixup): the workgroups sharing the
  // product's K steps; `splits` is then the partial slots per tile.
  sk_workers: u32,
}

@group(0) @binding(0) var<storage, read> a: array<AB>;
@group(0) @binding(1) var<storage, read> b: array<AB>;
@group(0) @binding(2) var<storage, read_write> c: array<CT>;
@group(0) @binding(3) var<uniform> p: GemmParams;
@group(0) @binding(4) var<storage, read> bias: array<BT>;
@group(0) @binding(5) var<storage, read_write> preact: array<CT>;
@group(0) @binding(6) var<storage, read> partials: array<f32>;
@group(0) @binding(7) var<storage, read_write> row_sums: array<f32>;
// A and B again as vec4s (A_VEC / B_VEC), C and the pre-activation (C_VEC);
// otherwise a placeholder is bound.
@group(0) @binding(8) var<storage, read> a4: array<vec4<AB>>;
@group(0) @binding(9) var<storage, read> b4: array<vec4<AB>>;
@group(0) @binding(10) var<storage, read_write> c4: array<vec4<CT>>;
@group(0) @binding(11) var<storage, read_write> preact4: array<vec4<CT>>;
// A matrix added to the result at C's indices (BIAS_RESIDUAL: a transformer
// block's residual stream, x + proj(branch) in one pass).
@group(0) @binding(12) var<storage, read> residual: array<RT>;
// The split-K partials again as vec4s (splitk_reduce4).
@group(0) @binding(13) var<storage, read> partials4: array<vec4<f32>>;
// B again as pairs of floats (B_PAIR).
@group(0) @binding(14) var<storage, read> b2: array<vec2<AB>>;

// ROWSUM: tile_product also sums op(A) over k for the thread's rows (the bias
// gradient comes with the weight gradient: db = dZ^T 1 next to dW = dZ^T X).
const ROWSUM: bool = EPILOGUE == EPILOGUE_ROWSUM;
var<private> row_sum: array<vec4<f32>, VM>;

const WG_X: u32 = BN / TN;
const WG_Y: u32 = BM / TM;
const THREADS: u32 = WG_X * WG_Y;
const VM: u32 = TM / 4u;
const VN: u32 = TN / 4u;

// Thread (x, y) of the WG_X x WG_Y grid for invocation li. With WARP_W < WG_X
// each run of 32 invocations (a warp) covers a WARP_W x (32 / WARP_W) block of
// the grid, so its workgroup-tile reads touch fewer distinct vec4s.
fn thread_xy(li: u32) -> vec2<u32> {
  if (WARP_W == WG_X) { return vec2<u32>(li % WG_X, li / WG_X); }
  let lane = li % 32u;
  let warp = li / 32u;
  let warps_x = WG_X / WARP_W;
  return vec2<u32>((warp % warps_x) * WARP_W + lane % WARP_W, (warp / warps_x) * (32u / WARP_W) + lane / WARP_W);
}

// Rows of the workgroup tiles are padded by one vec4: slot stores that walk
// along k (non-transposed A, transposed B) then spread over all banks instead
// of hitting the same ones 16 times.
const A_STRIDE: u32 = BM / 4u + 1u;
const B_STRIDE: u32 = BN / 4u + 1u;
var<workgroup> tile_a: array<vec4<TT>, BK * A_STRIDE>;  // [k][m], m packed by 4
var<workgroup> tile_b: array<vec4<TT>, BK * B_STRIDE>;  // [k][n], n packed by 4

// Element index of op(A)[m, k] / op(B)[k, n] in the bound operand.
fn a_index(m: u32, k: u32) -> u32 { return p.a_off + select(m * p.lda + k, k * p.lda + m, TRANS_A); }
fn b_index(k: u32, n: u32) -> u32 { return p.b_off + select(k * p.ldb + n, n * p.ldb + k, TRANS_B); }
// The rows of op(A) (columns of op(B)) that tiles may load unchecked: with
// A_VEC (B_VEC) the operand's rows hold whole vec4s (the host binds whole
// rows of a leading dimension that is a multiple of 4), so M (N) rounded up
// to 4; the elements past M (N) feed only outputs that are never stored.
fn m_loadable() -> u32 { return select(p.m, (p.m + 3u) & ~3u, A_VEC); }
fn n_loadable() -> u32 { return select(p.n, (p.n + 3u) & ~3u, B_VEC); }
fn op_a(m: u32, k: u32) -> TT {
  if (m >= p.m || k >= p.k) { return 0.0; }
  return TT(a[a_index(m, k)]);
}
fn op_b(k: u32, n: u32) -> TT {
  if (k >= p.k || n >= p.n) { return 0.0; }
  return TT(b[b_index(k, n)]);
}

const A_SLOTS: u32 = BM * BK / 4u / THREADS;  // vec4 slots of the A tile per thread
const B_SLOTS: u32 = BN * BK / 4u / THREADS;

// A slot is four elements at one k that one thread loads and stores. Spread
// slots hold elements a quarter tile apart (m, m + BM/4, ...) and land as
// four scalar stores; the others hold four consecutive m (n) and land as one
// vec4 store. Where the operand is stored k-major (A transposed, B not)
// spreading makes each load contiguous across neighbouring threads; stored
// along k, neighbouring threads walk k either way. Measured on the H100
// (docs/gemm_notes.md #28, #40): A spread in every mode but NT (NN +0.2-1%), B
// only where k-major (spread transposed B: NT -7%).
// A_VEC (B_VEC): the host found op(A) stored m-major (op(B) n-major) with
// leading dimension and offset multiples of 4, so a slot of four
// consecutive elements is one aligned vec4 of the operand; unchecked loads
// read it through the vec4 view as one 128-bit load instead of four
// (docs/gemm_notes.md #42).
const A_SPREAD: bool = (TRANS_A || !TRANS_B) && !A_VEC;
const B_SPREAD: bool = !TRANS_B && !B_VEC;
fn a_slot(s: u32) -> vec2<u32> {  // (kk, column of the slot)
  if (TRANS_A) { return vec2<u32>(s / (BM / 4u), s % (BM / 4u)); }
  return vec2<u32>(s % BK, s / BK);
}
fn b_slot(s: u32) -> vec2<u32> {
  if (B_PAIR) {
    // Slots 2q and 2q + 1 of thread t: k steps 2p and 2p + 1 of one column
    // quad. Lane bits: column, pair, pair, pair, column; so each 8-lane phase
    // of a 128-bit store hits 8 distinct bank groups (row stride 33 vec4s).
    let t = s % THREADS;
    let i = s / THREADS;
    let pair = ((t >> 1u) & 3u) | (((t >> 3u) & 1u) << 2u);
    let quad = (t & 1u) | (((t >> 4u) & 1u) << 1u) | ((t >> 5u) << 2u);
    return vec2<u32>(2u * pair + i % 2u, quad + (i / 2u) * (THREADS / 8u));
  }
  if (TRANS_B) { return vec2<u32>(s % BK, s / BK); }
  return vec2<u32>(s / (BN / 4u), s % (BN / 4u));
}
// First element (m, k) / (k, n) of slot s of the tile at (m0, k0) / (k0, n0);
// the slot's others follow at m + d, m + 2d, m + 3d (n + d, ...).
const A_D: u32 = select(1u, BM / 4u, A_SPREAD);
const B_D: u32 = select(1u, BN / 4u, B_SPREAD);
fn a_slot_origin(m0: u32, k0: u32, s: u32) -> vec2<u32> {
  let c = a_slot(s);
  return vec2<u32>(m0 + select(c.y * 4u, c.y, A_SPREAD), k0 + c.x);
}
fn b_slot_origin(n0: u32, k0: u32, s: u32) -> vec2<u32> {
  let c = b_slot(s);
  return vec2<u32>(k0 + c.x, n0 + select(c.y * 4u, c.y, B_SPREAD));
}
// Bounds-checked slot loads, for tiles at the edges of op(A) / op(B).
fn fetch_a(m0: u32, k0: u32, s: u32) -> vec4<TT> {
  let o = a_slot_origin(m0, k0, s);
  return vec4<TT>(op_a(o.x, o.y), op_a(o.x + A_D, o.y), op_a(o.x + 2u * A_D, o.y), op_a(o.x + 3u * A_D, o.y));
}
fn fetch_b(n0: u32, k0: u32, s: u32) -> vec4<TT> {
  let o = b_slot_origin(n0, k0, s);
  return vec4<TT>(op_b(o.x, o.y), op_b(o.x, o.y + B_D), op_b(o.x, o.y + 2u * B_D), op_b(o.x, o.y + 3u * B_D));
}
// The first K step's slot loads. With K_SHIFT the first step may start
// before the workgroup's K range at k_lo (gemm puts a partial step first):
// elements at k < k_lo read 0 (in both operands, so ROWSUM's sums of A stay
// exact too). A start before k = 0 wraps past p.k, where op_a / op_b read
// nothing.
fn first_fetch_a(m0: u32, k0: u32, s: u32, k_lo: u32) -> vec4<TT> {
  return select(vec4<TT>(0.0), fetch_a(m0, k0, s), !K_SHIFT || a_slot_origin(m0, k0, s).y >= k_lo);
}
fn first_fetch_b(n0: u32, k0: u32, s: u32, k_lo: u32) -> vec4<TT> {
  return select(vec4<TT>(0.0), fetch_b(n0, k0, s), !K_SHIFT || b_slot_origin(n0, k0, s).x >= k_lo);
}
// Unchecked slot loads, for tiles wholly inside: four elements `d` indices
// apart from index i, or with A_VEC (B_VEC) the i-th vec4.
const A_UNIT: u32 = select(1u, 4u, A_VEC);  // elements per unit of the slot indices
const B_UNIT: u32 = select(select(1u, 2u, B_PAIR), 4u, B_VEC);
fn load_a(i: u32, d: u32) -> vec4<TT> {
  if (A_VEC) { return vec4<TT>(a4[i]); }
  return vec4<TT>(vec4<AB>(a[i], a[i + d], a[i + 2u * d], a[i + 3u * d]));
}
fn load_b(i: u32, d: u32) -> vec4<TT> {
  if (B_VEC) { return vec4<TT>(b4[i]); }
  return vec4<TT>(vec4<AB>(b[i], b[i + d], b[i + 2u * d], b[i + 3u * d]));
}
// B_PAIR: transposed B (stored along k) with an even leading dimension and
// offset, BK 16 and an even number of slots per thread: two slots (k and
// k + 1 of one column quad) load as four 64-bit pairs, pair index i, the
// quad's rows d pairs apart. The host leaves it off in ALIGNED dispatches
// (wrong on the H100 there, docs/gemm_notes.md #108).
fn load_b_pair(i: u32, d: u32) -> array<vec4<TT>, 2> {
  let r0 = vec2<TT>(b2[i]);
  let r1 = vec2<TT>(b2[i + d]);
  let r2 = vec2<TT>(b2[i + 2u * d]);
  let r3 = vec2<TT>(b2[i + 3u * d]);
  return array<vec4<TT>, 2>(vec4<TT>(r0.x, r1.x, r2.x, r3.x), vec4<TT>(r0.y, r1.y, r2.y, r3.y));
}
// The thread's B slots of a tile wholly inside op(B), dk elements of k past
// the K step whose slot indices b_first holds (k_ref in tile_product).
fn load_b_slots(rb: ptr<function, array<vec4<TT>, B_SLOTS>>, b_first: ptr<function, array<u32, B_SLOTS>>, dk: u32) {
  if (B_PAIR) {
    for (var q = 0u; q < B_SLOTS / 2u; q++) {
      let v = load_b_pair((*b_first)[2u * q] + dk / 2u, p.ldb / 2u);
      (*rb)[2u * q] = v[0];
      (*rb)[2u * q + 1u] = v[1];
    }
  } else {
    let o = dk * (select(p.ldb, 1u, TRANS_B) / B_UNIT);  // index distance of dk
    let d = B_D * select(1u, p.ldb, TRANS_B);  // index distance of a slot's elements
    for (var i = 0u; i < B_SLOTS; i++) { (*rb)[i] = load_b((*b_first)[i] + o, d); }
  }
}
// Spread slots land as four scalars a quarter tile (BM/16 vec4s) apart.
fn store_a(s: u32, v: vec4<TT>) {
  let c = a_slot(s);
  if (A_SPREAD) {
    let i = c.x * A_STRIDE + c.y / 4u;
    let q = c.y % 4u;
    tile_a[i][q] = v.x; tile_a[i + BM / 16u][q] = v.y; tile_a[i + BM / 8u][q] = v.z;
    tile_a[i + 3u * BM / 16u][q] = v.w;
  } else {
    tile_a[c.x * A_STRIDE + c.y] = v;
  }
}
fn store_b(s: u32, v: vec4<TT>) {
  let c = b_slot(s);
  if (B_SPREAD) {
    let i = c.x * B_STRIDE + c.y / 4u;
    let q = c.y % 4u;
    tile_b[i][q] = v.x; tile_b[i + BN / 16u][q] = v.y; tile_b[i + BN / 8u][q] = v.z;
    tile_b[i + 3u * BN / 16u][q] = v.w;
  } else {
    tile_b[c.x * B_STRIDE + c.y] = v;
  }
}

// Stores the prefetched slots into the workgroup tiles.
fn store_tiles(tid: u32, ra: ptr<function, array<vec4<TT>, A_SLOTS>>, rb: ptr<function, array<vec4<TT>, B_SLOTS>>) {
  for (var i = 0u; i < A_SLOTS; i++) { store_a(tid + i * THREADS, (*ra)[i]); }
  for (var i = 0u; i < B_SLOTS; i++) { store_b(tid + i * THREADS, (*rb)[i]); }
}

// acc += the workgroup tiles' product for this thread's outputs.
fn multiply_tiles(acc: ptr<function, array<vec4<f32>, TM * VN>>, xy: vec2<u32>) {
  if (HALF_FMA) {
    multiply_tiles_half(acc, xy);
    return;
  }
  for (var kk = 0u; kk < BK; kk++) {
    var av: array<vec4<f32>, VM>;
    var bv: array<vec4<f32>, VN>;
    for (var i = 0u; i < VM; i++) { av[i] = vec4<f32>(tile_a[kk * A_STRIDE + i * WG_Y + xy.y]); }
    for (var j = 0u; j < VN; j++) { bv[j] = vec4<f32>(tile_b[kk * B_STRIDE + j * WG_X + xy.x]); }
    if (ROWSUM) { for (var i = 0u; i < VM; i++) { row_sum[i] += av[i]; } }
    for (var i = 0u; i < VM; i++) {
      for (var r = 0u; r < 4u; r++) {
        for (var j = 0u; j < VN; j++) {
          (*acc)[(i * 4u + r) * VN + j] = fma(vec4<f32>(av[i][r]), bv[j], (*acc)[(i * 4u + r) * VN + j]);
        }
      }
    }
  }
}

// HALF_FMA (tiles of TT = f16): the K tile's BK products summed by f16 FMAs
// (twice the f32 rate on GPUs with packed f16), then added to the f32
// accumulators, so f16 rounding spans BK terms only.
fn multiply_tiles_half(acc: ptr<function, array<vec4<f32>, TM * VN>>, xy: vec2<u32>) {
  var part: array<vec4<TT>, TM * VN>;
  for (var kk = 0u; kk < BK; kk++) {
    var av: array<vec4<TT>, VM>;
    var bv: array<vec4<TT>, VN>;
    for (var i = 0u; i < VM; i++) { av[i] = tile_a[kk * A_STRIDE + i * WG_Y + xy.y]; }
    for (var j = 0u; j < VN; j++) { bv[j] = tile_b[kk * B_STRIDE + j * WG_X + xy.x]; }
    if (ROWSUM) { for (var i = 0u; i < VM; i++) { row_sum[i] += vec4<f32>(av[i]); } }
    for (var i = 0u; i < VM; i++) {
      for (var r = 0u; r < 4u; r++) {
        for (var j = 0u; j < VN; j++) {
          part[(i * 4u + r) * VN + j] = fma(vec4<TT>(av[i][r]), bv[j], part[(i * 4u + r) * VN + j]);
        }
      }
    }
  }
  for (var q = 0u; q < TM * VN; q++) { (*acc)[q] += vec4<f32>(part[q]); }
}

// A partial K step runs first (gemm, aligned dispatches with EDGE_SHIFT).
const K_SHIFT: bool = ALIGNED && EDGE_SHIFT;

// The product of the tile at (m0, n0) over k in [k_lo, k_end), for this
// thread's outputs, in K steps from k_begin: k_lo, or with K_SHIFT up to a
// step before it (the first step masked below k_lo; u32 arithmetic, so
// k_begin may wrap below 0).
fn tile_product(m0: u32, n0: u32, k_lo: u32, k_begin: u32, k_end: u32, tid: u32) -> array<vec4<f32>, TM * VN> {
  let xy = thread_xy(tid);
  var acc: array<vec4<f32>, TM * VN>;
  // Software pipelining: the next K tile is fetched into registers while the
  // current one is multiplied out of workgroup memory.
  var ra: array<vec4<TT>, A_SLOTS>;
  var rb: array<vec4<TT>, B_SLOTS>;
  for (var i = 0u; i < A_SLOTS; i++) { ra[i] = first_fetch_a(m0, k_begin, tid + i * THREADS, k_lo); }
  for (var i = 0u; i < B_SLOTS; i++) { rb[i] = first_fetch_b(n0, k_begin, tid + i * THREADS, k_lo); }
  // Tiles wholly inside op(A) and op(B) (uniform across the workgroup) load
  // without bounds checks from slot indices computed here once: a K step adds
  // one offset (docs/gemm_notes.md #25, #35: +7% from skipping the checks,
  // +1-4% from not recomputing indices).
  // The indices are those at k_ref: with K_SHIFT the second K step, as the
  // first may start below k = 0 and the division by a vec4's four elements
  // needs a true index.
  let rows_inside = m0 + BM <= m_loadable();
  let cols_inside = n0 + BN <= n_loadable();
  let k_ref = select(k_begin, k_begin + BK, K_SHIFT);
  var a_first: array<u32, A_SLOTS>;
  var b_first: array<u32, B_SLOTS>;
  for (var i = 0u; i < A_SLOTS; i++) { let o = a_slot_origin(m0, k_ref, tid + i * THREADS); a_first[i] = a_index(o.x, o.y) / A_UNIT; }
  for (var i = 0u; i < B_SLOTS; i++) { let o = b_slot_origin(n0, k_ref, tid + i * THREADS); b_first[i] = b_index(o.x, o.y) / B_UNIT; }
  let a_k_step = select(1u, p.lda, TRANS_A) / A_UNIT;  // index distance of k to k + 1
  let a_d = A_D * select(p.lda, 1u, TRANS_A);  // index distance of a slot's elements
  var k0 = k_begin;
  // The unchecked K loop, up to the last K step. LEAN_LOOP: inside
  // workgroups run it as a loop of their own (#37: what the compiler makes of
  // the register copies at the loop's end differs with the loop's shape).
  // ALIGNED: every tile of the dispatch lies inside op(A), op(B) and C and
  // [k_begin, k_end) is whole K steps, so the last step needs no bounds check
  // either and the checked loop below is never compiled (H100: 8192^3 TN
  // 25.02 -> 24.59 ms). k0 + 2 BK is past any wrap of k_begin.
  if (ALIGNED || (LEAN_LOOP && rows_inside && cols_inside)) {
    for (; k0 + 2u * BK <= k_end; k0 += BK) {
      store_tiles(tid, &ra, &rb);
      workgroupBarrier();
      let oa = (k0 + BK - k_ref) * a_k_step;
      for (var i = 0u; i < A_SLOTS; i++) { ra[i] = load_a(a_first[i] + oa, a_d); }
      load_b_slots(&rb, &b_first, k0 + BK - k_ref);
      multiply_tiles(&acc, xy);
      workgroupBarrier();
    }
  }
  if (ALIGNED) {
    store_tiles(tid, &ra, &rb);
    workgroupBarrier();
    multiply_tiles(&acc, xy);
    workgroupBarrier();
    return acc;
  }
  for (; k0 < k_end; k0 += BK) {
    store_tiles(tid, &ra, &rb);
    workgroupBarrier();
    // Prefetch the next K tile. After the last one this reads a tile that is
    // dropped (zeros past K, or the next split's data): cheaper than the
    // register copies a conditional prefetch makes the compiler insert.
    let k_next = k0 + BK;
    let next_unchecked = !LEAN_LOOP && k_next + BK <= k_end;
    if (next_unchecked && rows_inside) {
      let o = (k_next - k_ref) * a_k_step;
      for (var i = 0u; i < A_SLOTS; i++) { ra[i] = load_a(a_first[i] + o, a_d); }
    } else {
      for (var i = 0u; i < A_SLOTS; i++) { ra[i] = fetch_a(m0, k_next, tid + i * THREADS); }
    }
    if (next_unchecked && cols_inside) {
      load_b_slots(&rb, &b_first, k_next - k_ref);
    } else {
      for (var i = 0u; i < B_SLOTS; i++) { rb[i] = fetch_b(n0, k_next, tid + i * THREADS); }
    }
    multiply_tiles(&acc, xy);
    workgroupBarrier();
  }
  return acc;
}

// Row (column) inside the tile of the thread's output block i (j), row r.
fn tile_row(xy: vec2<u32>, i: u32, r: u32) -> u32 { return i * 4u * WG_Y + xy.y * 4u + r; }
fn tile_col(xy: vec2<u32>, j: u32) -> u32 { return j * 4u * WG_X + xy.x * 4u; }

// What happens to v = alpha * (op(A) op(B))[m, n] on its way to C[idx]
// (EPILOGUE is a constant: each pipeline keeps one branch):
//   PLAIN, ROWSUM: C = v + beta * C (beta == 0 never reads C, so garbage, even
//     NaN, there is ignored);
//   BIAS_ACT: C = act(v + bias[bias_off + n]); BIAS_ACT_TRAIN also keeps the
//     pre-activation in `preact` (at C's indices) for backward;
//   ACT_GRAD: backward through the activation of the layer below,
//     C = v * act'(Z), Z read from `preact` at C's indices (relu: a select,
//     v where Z > 0 or NaN, else 0, as torch's threshold_backward);
//   BIAS_RESIDUAL: C = v + bias[bias_off + n] + residual[idx].
// Every pipeline binds all of them (the host binds placeholders for the ones
// its epilogue never touches).
fn epilogue(idx: u32, n: u32, v: f32) {
  if (EPILOGUE == EPILOGUE_BIAS_ACT) {
    c[idx] = CT(activate(v + f32(bias[p.bias_off + n])));
  } else if (EPILOGUE == EPILOGUE_BIAS_ACT_TRAIN) {
    // The activation reads z in f32; a float16 pre-activation is rounded once as it is stored
    // (rounding it first would be folded away by some drivers: NVIDIA's elides f32(f16(z))).
    let z = v + f32(bias[p.bias_off + n]);
    preact[idx] = CT(z);
    c[idx] = CT(activate(z));
  } else if (EPILOGUE == EPILOGUE_ACT_GRAD) {
    c[idx] = CT(act_dx(v, f32(preact[idx])));
  } else if (EPILOGUE == EPILOGUE_BIAS_RESIDUAL) {
    c[idx] = CT(v + f32(bias[p.bias_off + n]) + f32(residual[idx]));
  } else if (EPILOGUE == EPILOGUE_PLAIN || EPILOGUE == EPILOGUE_ROWSUM) {
    var s = v;
    if (p.beta != 0.0) { s = fma(p.beta, f32(c[idx]), s); }
    c[idx] = CT(s);
  }
}

// epilogue() for the four columns n..n+3 at C[idx..idx+3], idx a multiple
// of 4 (C_VEC): one 128-bit store instead of four scalar ones (the same arithmetic).
// ACT_GRAD never takes C_VEC (the host's choice: its vec4 reads were slower).
fn bias4(n: u32) -> vec4<f32> {
  let o = p.bias_off + n;
  return vec4<f32>(f32(bias[o]), f32(bias[o + 1u]), f32(bias[o + 2u]), f32(bias[o + 3u]));
}
fn activate4(z: vec4<f32>) -> vec4<f32> { return vec4<f32>(activate(z.x), activate(z.y), activate(z.z), activate(z.w)); }
fn epilogue4(idx: u32, n: u32, v: vec4<f32>) {
  let i = idx / 4u;
  if (EPILOGUE == EPILOGUE_BIAS_ACT) {
    c4[i] = vec4<CT>(activate4(v + bias4(n)));
  } else if (EPILOGUE == EPILOGUE_BIAS_ACT_TRAIN) {
    let z = v + bias4(n);
    preact4[i] = vec4<CT>(z);
    c4[i] = vec4<CT>(activate4(z));
  } else if (EPILOGUE == EPILOGUE_BIAS_RESIDUAL) {
    // Scalar loads: no vec4 view of the residual (one binding fewer).
    let r = vec4<f32>(f32(residual[idx]), f32(residual[idx + 1u]), f32(residual[idx + 2u]), f32(residual[idx + 3u]));
    c4[i] = vec4<CT>(v + bias4(n) + r);
  } else if (EPILOGUE == EPILOGUE_PLAIN || EPILOGUE == EPILOGUE_ROWSUM) {
    var s = v;
    if (p.beta != 0.0) { s = fma(vec4<f32>(p.beta), vec4<f32>(c4[i]), s); }
    c4[i] = vec4<CT>(s);
  }
}

// The output tile (column, row) of workgroup wid in the gemm entry's grid:
// consecutive workgroups walk GROUP_M tile rows down one tile column before
// the next column, so the workgroups in flight share B's column blocks as
// well as A's row blocks in L2. Row-major order (GROUP_M 1) streamed B once
// per tile row on wide products: H100, 1024x768x50304 NT 2001 -> 1935 us,
// 1024x768x3072 NN 161 -> 128 (docs/gemm_notes.md #84).
fn tile_of(wid: vec3<u32>, nwg: vec3<u32>) -> vec2<u32> {
  if (GROUP_M == 1u) { return wid.xy; }
  let id = wid.y * nwg.x + wid.x;
  let per_group = GROUP_M * nwg.x;
  let first = (id / per_group) * GROUP_M;
  let rows = min(GROUP_M, nwg.y - first);
  let r = id % per_group;
  return vec2<u32>(r / rows, first + r % rows);
}

// TRANS_C's stores of a thread's outputs (tile origin o, own rows and columns
// from lo, as in gemm): column q of each 4x4 block is four consecutive
// floats of C, one 128-bit store with C_VEC. The epilogue's column (the
// bias index) is C's column, the product's row.
fn store_transposed(acc: array<vec4<f32>, TM * VN>, xy: vec2<u32>, o: vec2<u32>, lo: vec2<u32>, z: u32) {
  for (var i = 0u; i < VM; i++) {
    let m = o.x + tile_row(xy, i, 0u);
    // With C_VEC, m and lo.x are multiples of 4: a group is stored whole or not at all.
    let whole = m + 4u <= p.m && (!EDGE_SHIFT || m >= lo.x);
    for (var j = 0u; j < VN; j++) {
      for (var q = 0u; q < 4u; q++) {
        let n = o.y + tile_col(xy, j) + q;
        if (n >= p.n || (EDGE_SHIFT && n < lo.y)) { continue; }
        let b = i * 4u * VN + j;
        let v = p.alpha * vec4<f32>(acc[b][q], acc[b + VN][q], acc[b + 2u * VN][q], acc[b + 3u * VN][q]);
        let idx = p.c_off + z * p.split_stride + n * p.ldc + m;
        if (C_VEC && whole) {
          epilogue4(idx, m, v);
          continue;
        }
        for (var r = 0u; r < 4u; r++) {
          if (m + r >= p.m || (EDGE_SHIFT && m + r < lo.x)) { continue; }
          epilogue(idx + r, m + r, v[r]);
        }
      }
    }
  }
}

// The tiled product. Split-K (plain epilogue): workgroup z writes its partial
// product split_stride elements further on. ROWSUM: row_sums[bias_off + m] =
// sum_k op(A)[m, k] + beta * row_sums[...], written by the first column of
// workgroups, one thread per row group (unsplit K only: the sums must be complete).
@compute @workgroup_size(WG_X, WG_Y)
fn gemm(@builtin(workgroup_id) wid_in: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
  let wid = vec3<u32>(tile_of(wid_in, nwg), wid_in.z);
  // The tile's own rows and columns start at (m_lo, n_lo); it is computed
  // from (m0, n0). EDGE_SHIFT: the last tile row is moved up to end at the
  // last loadable row (m_loadable), so it lies inside and loads without
  // checks, and its rows that belong to the tile row above are computed again
  // but not stored; the last tile column likewise (the host found at least
  // one whole tile each way and vec4-aligned moved origins where C stores
  // vec4s along that edge).
  let m_lo = wid.y * BM;
  let n_lo = wid.x * BN;
  let m0 = select(m_lo, min(m_lo, m_loadable() - BM), EDGE_SHIFT);
  let n0 = select(n_lo, min(n_lo, n_loadable() - BN), EDGE_SHIFT);
  // K_SHIFT: a partial K step goes first, where the first step's loads mask
  // it, so every later step is whole and the end of K needs no check.
  let k_lo = wid.z * p.k_chunk;
  let k_end = min(p.k, k_lo + p.k_chunk);
  let k_begin = select(k_lo, k_end - (k_end - k_lo + BK - 1u) / BK * BK, K_SHIFT);
  let acc = tile_product(m0, n0, k_lo, k_begin, k_end, li);
  let xy = thread_xy(li);
  if (TRANS_C) {
    store_transposed(acc, xy, vec2<u32>(m0, n0), vec2<u32>(m_lo, n_lo), wid.z);
    return;
  }
  for (var i = 0u; i < VM; i++) {
    for (var r = 0u; r < 4u; r++) {
      let m = m0 + tile_row(xy, i, r);
      if (m >= p.m || (EDGE_SHIFT && m < m_lo)) { continue; }
      if (ROWSUM && wid.x == 0u && xy.x == 0u) {
        var s = row_sum[i][r];
        if (p.beta != 0.0) { s = fma(p.beta, row_sums[p.bias_off + m], s); }
        row_sums[p.bias_off + m] = s;
      }
      for (var j = 0u; j < VN; j++) {
        let v = p.alpha * acc[(i * 4u + r) * VN + j];
        let n = n0 + tile_col(xy, j);
        let idx = p.c_off + wid.z * p.split_stride + m * p.ldc + n;
        // With C_VEC, n and n_lo are multiples of 4: a group is stored whole or not at all.
        if (C_VEC && n + 4u <= p.n && (!EDGE_SHIFT || n >= n_lo)) {
          epilogue4(idx, n, v);
          continue;
        }
        for (var q = 0u; q < 4u; q++) {
          if (n + q >= p.n || (EDGE_SHIFT && n + q < n_lo)) { continue; }
          epilogue(idx + q, n + q, v[q]);
        }
      }
    }
  }
}

// Split-K second pass: sums the partial products of element e, then applies
// the epilogue the one-pass product applies.
fn split_element(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 { return (wid.y * nwg.x + wid.x) * EW_WG + lid; }

@compute @workgroup_size(EW_WG)
fn splitk_reduce(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32) {
  let e = split_element(wid, nwg, lid);
  if (e >= p.m * p.n) { return; }
  var s = 0.0;
  for (var z = 0u; z < p.splits; z++) { s += partials[z * p.split_stride + e]; }
  epilogue(p.c_off + (e / p.n) * p.ldc + e % p.n, e % p.n, p.alpha * s);
}

// splitk_reduce for four consecutive columns per thread, where the host
// found N, C's leading dimension and offset and the split stride multiples
// of 4 (not ACT_GRAD, which has no epilogue4): one 128-bit load per split and
// one 128-bit store (H100, 256x4096x4096 NN in 2 splits: 222.8 -> 221.2 us,
// docs/gemm_notes.md #101).
@compute @workgroup_size(EW_WG)
fn splitk_reduce4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
  let e = split_element(wid, nwg, lid) * 4u;
  if (e >= p.m * p.n) { return; }
  var s = vec4<f32>(0.0);
  for (var z = 0u; z < p.splits; z++) { s += partials4[(z * p.split_stride + e) / 4u]; }
  let n = e % p.n;
  epilogue4(p.c_off + (e / p.n) * p.ldc + n, n, p.alpha * s);
}

// Stream-K: the product's tiles times their K steps, in one tile-major
// sequence, are cut into sk_workers equal ranges, one per workgroup of a
// single wave, so products of few tiles keep every slot busy instead of
// running a part-empty last wave or a whole split per tile. A range covers
// the end of one tile's K steps, any whole tiles, and the start of another;
// each such piece goes unscaled into the tile's partial slot for that
// workgroup, and stream_k_fixup sums each tile's slots through the epilogue.
// The host keeps tiles * steps * sk_workers below 2^32.
fn sk_tiles_n() -> u32 { return (p.n + BN - 1u) / BN; }
fn sk_steps() -> u32 { return (p.k + BK - 1u) / BK; }
fn sk_total() -> u32 { return ((p.m + BM - 1u) / BM) * sk_tiles_n() * sk_steps(); }
// The workgroup whose range holds step x of `total`: the last g with
// g * total / sk_workers <= x.
fn sk_worker_of(x: u32, total: u32) -> u32 { return ((x + 1u) * p.sk_workers - 1u) / total; }
// First float of slot j of tile t (`splits` slots of BM x BN floats per tile).
fn sk_slot(t: u32, j: u32) -> u32 { return (t * p.splits + j) * BM * BN; }

@compute @workgroup_size(WG_X, WG_Y)
fn gemm_stream_k(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
  let steps = sk_steps();
  let total = sk_total();
  let xy = thread_xy(li);
  var it = wid.x * total / p.sk_workers;
  let end = (wid.x + 1u) * total / p.sk_workers;
  loop {
    if (it >= end) { break; }
    let t = it / steps;
    let s0 = it % steps;
    let s1 = min(steps, s0 + end - it);
    let acc = tile_product((t / sk_tiles_n()) * BM, (t % sk_tiles_n()) * BN, s0 * BK, s0 * BK, min(p.k, s1 * BK), li);
    // Outputs outside C hold zeros (the tile loads read 0 there): the whole
    // tile is stored, no checks.
    let slot = sk_slot(t, wid.x - sk_worker_of(t * steps, total));
    for (var i = 0u; i < VM; i++) {
      for (var r = 0u; r < 4u; r++) {
        for (var j = 0u; j < VN; j++) {
          let idx = slot + tile_row(xy, i, r) * BN + tile_col(xy, j);
          let v = acc[(i * 4u + r) * VN + j];
          if (C_VEC) {
            c4[idx / 4u] = vec4<CT>(v);
          } else {
            c[idx] = CT(v.x); c[idx + 1u] = CT(v.y); c[idx + 2u] = CT(v.z); c[idx + 3u] = CT(v.w);
          }
        }
      }
    }
    it += s1 - s0;
  }
}

// Stream-K second pass: C[m, n] = epilogue(alpha * the sum of its tile's
// slots, one per workgroup whose range met the tile).
@compute @workgroup_size(EW_WG)
fn stream_k_fixup(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                  @builtin(local_invocation_index) lid: u32) {
  let e = split_element(wid, nwg, lid);
  if (e >= p.m * p.n) { return; }
  // TRANS_C: e walks C's rows (the product's columns), so the stores coalesce.
  let row = select(e / p.n, e % p.m, TRANS_C);
  let col = select(e % p.n, e / p.m, TRANS_C);
  let steps = sk_steps();
  let total = sk_total();
  let t = (row / BM) * sk_tiles_n() + col / BN;
  let first = sk_worker_of(t * steps, total);
  let count = sk_worker_of((t + 1u) * steps - 1u, total) - first + 1u;
  let inner = (row % BM) * BN + col % BN;
  var s = 0.0;
  for (var j = 0u; j < count; j++) { s += partials[sk_slot(t, j) + inner]; }
  if (TRANS_C) {
    epilogue(p.c_off + col * p.ldc + row, row, p.alpha * s);
  } else {
    epilogue(p.c_off + row * p.ldc + col, col, p.alpha * s);
  }
}

// Copies a rows x cols matrix (m x n in the params) from leading dimension
// lda at a_off in `partials` to leading dimension ldc at c_off in C: operands
// whose leading dimension is not a multiple of 4 get a padded copy, so the
// GEMM can read them with 128-bit loads (A_VEC / B_VEC).
@compute @workgroup_size(EW_WG)
fn repack(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
  let e = split_element(wid, nwg, lid);
  if (e >= p.m * p.n) { return; }
  let row = e / p.n;
  let col = e % p.n;
  c[p.c_off + row * p.ldc + col] = CT(partials[p.a_off + row * p.lda + col]);
}

// Transposes the m x n matrix at a_off in `a` (leading dimension lda) into C
// (leading dimension ldc): C[j][i] = a[i][j], float16 to float16 or float32
// to float32 (AB = CT). Through a padded tile in workgroup memory, so reads
// and writes both run along rows.
var<workgroup> tile_t: array<f32, TRANSPOSE_TILE * (TRANSPOSE_TILE + 1u)>;

@compute @workgroup_size(TRANSPOSE_TILE, TRANSPOSE_ROWS)
fn transpose(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let row0 = wid.y * TRANSPOSE_TILE;
  let col0 = wid.x * TRANSPOSE_TILE;
  for (var i = lid.y; i < TRANSPOSE_TILE; i += TRANSPOSE_ROWS) {
    let row = row0 + i;
    let col = col0 + lid.x;
    if (row < p.m && col < p.n) { tile_t[i * (TRANSPOSE_TILE + 1u) + lid.x] = f32(a[p.a_off + row * p.lda + col]); }
  }
  workgroupBarrier();
  for (var i = lid.y; i < TRANSPOSE_TILE; i += TRANSPOSE_ROWS) {
    let col = col0 + i;  // row of C
    let row = row0 + lid.x;
    if (row < p.m && col < p.n) { c[p.c_off + col * p.ldc + row] = CT(tile_t[lid.x * (TRANSPOSE_TILE + 1u) + i]); }
  }
}
