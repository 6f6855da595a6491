// Strided batched GEMM: C[b] = alpha * op(A[b]) op(B[b]) + beta * C[b] for
// b < batch, row-major f32, op = transpose when TRANS_A / TRANS_B; matrices of
// one operand lie `stride` elements apart from `off` on (attention's per-head
// products, matmul over leading dimensions). 64x64 output tiles, 16x16
// threads of 4x4 outputs, the batch along workgroup z. Tile loads outside the
// matrices read 0; stores outside C are skipped.

struct BmmParams {
  m: u32, n: u32, k: u32, batch: u32,
  a_off: u32, b_off: u32, c_off: u32, _pad0: u32,
  a_stride: u32, b_stride: u32, c_stride: u32, _pad1: u32,
  alpha: f32, beta: f32, _pad2: u32, _pad3: u32,
}

@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> c: array<f32>;
@group(0) @binding(3) var<uniform> p: BmmParams;

// From csrc/shader_contract.hpp (emitted ahead of this file): TILE (rows and columns of C per workgroup).
const BK: u32 = 16u;
var<workgroup> as_: array<array<f32, 65>, 16>;  // [k][m], padded against bank conflicts
var<workgroup> bs: array<array<f32, 65>, 16>;   // [k][n]

fn load_a(base: u32, row: u32, kk: u32) -> f32 {
  if (row >= p.m || kk >= p.k) { return 0.0; }
  if (TRANS_A) { return a[base + kk * p.m + row]; }
  return a[base + row * p.k + kk];
}

fn load_b(base: u32, kk: u32, col: u32) -> f32 {
  if (col >= p.n || kk >= p.k) { return 0.0; }
  if (TRANS_B) { return b[base + col * p.k + kk]; }
  return b[base + kk * p.n + col];
}

@compute @workgroup_size(16, 16)
fn bmm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
       @builtin(local_invocation_index) li: u32) {
  let batch = wid.z;
  let a_base = p.a_off + batch * p.a_stride;
  let b_base = p.b_off + batch * p.b_stride;
  let c_base = p.c_off + batch * p.c_stride;
  let m0 = wid.y * TILE;
  let n0 = wid.x * TILE;
  var acc: array<array<f32, 4>, 4>;
  for (var k0 = 0u; k0 < p.k; k0 += BK) {
    // 64x16 elements per operand tile, 4 per thread.
    for (var s = 0u; s < 4u; s++) {
      let e = li + s * 256u;
      if (TRANS_A) {  // consecutive threads along m (contiguous in A^T storage)
        let mm = e % TILE; let kk = e / TILE;
        as_[kk][mm] = load_a(a_base, m0 + mm, k0 + kk);
      } else {
        let kk = e % BK; let mm = e / BK;
        as_[kk][mm] = load_a(a_base, m0 + mm, k0 + kk);
      }
      if (TRANS_B) {
        let kk = e % BK; let nn = e / BK;
        bs[kk][nn] = load_b(b_base, k0 + kk, n0 + nn);
      } else {
        let nn = e % TILE; let kk = e / TILE;
        bs[kk][nn] = load_b(b_base, k0 + kk, n0 + nn);
      }
    }
    workgroupBarrier();
    for (var kk = 0u; kk < BK; kk++) {
      var av: array<f32, 4>;
      var bv: array<f32, 4>;
      for (var i = 0u; i < 4u; i++) { av[i] = as_[kk][lid.y + 16u * i]; bv[i] = bs[kk][lid.x + 16u * i]; }
      for (var i = 0u; i < 4u; i++) {
        for (var j = 0u; j < 4u; j++) { acc[i][j] = fma(av[i], bv[j], acc[i][j]); }
      }
    }
    workgroupBarrier();
  }
  for (var i = 0u; i < 4u; i++) {
    let row = m0 + lid.y + 16u * i;
    if (row >= p.m) { continue; }
    for (var j = 0u; j < 4u; j++) {
      let col = n0 + lid.x + 16u * j;
      if (col >= p.n) { continue; }
      let idx = c_base + row * p.n + col;
      var v = p.alpha * acc[i][j];
      if (p.beta != 0.0) { v += p.beta * c[idx]; }
      c[idx] = v;
    }
  }
}
