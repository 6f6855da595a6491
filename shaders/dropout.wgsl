// Dropout with a counter-based RNG (csrc/dropout.cpp), deterministic under replay.
//
// A per-device state buffer holds [seed_lo, seed_hi, counter_lo, counter_hi]. Each dropout
// call first records rng_take, which copies the state into the call's own 4-word key buffer
// and advances the counter, all on the GPU: a captured step graph replays both dispatches and
// so draws a fresh mask every replay, and saving / restoring the state reproduces the masks.
//
// Mask: element e (index into the whole tensor) is kept when word e % 4 of
// Philox-4x32-10(counter = (e / 4 as 64 bits, counter_lo, counter_hi), key = (seed_lo, seed_hi))
// is >= threshold = round(p * 2^32); kept elements are scaled by 1 / (1 - p). The backward
// recomputes the same mask from the same key buffer (nothing stored per element).
// ET (an alias emitted per kernel): the element type of src and dst, f32 or f16 (HALF: bool,
// ET is f16): the same mask for either, the math in f32, rounded once on the store.
//!include half

struct DropParams {
  n: u32,          // elements of this piece
  first_lo: u32,   // index of the piece's first element in the tensor (64 bits)
  first_hi: u32,
  threshold: u32,
  scale: f32,
  beta: f32,       // dst = src * mask * scale (+ beta * dst)
  _pad0: u32,
  _pad1: u32,
}

@group(0) @binding(0) var<storage, read> src: array<ET>;
@group(0) @binding(1) var<storage, read> key: array<u32>;
@group(0) @binding(2) var<storage, read_write> dst: array<ET>;
@group(0) @binding(3) var<uniform> dp: DropParams;
@group(0) @binding(4) var<storage, read_write> state: array<u32>;
@group(0) @binding(5) var<storage, read_write> key_out: array<u32>;

// key_out = state; state.counter += 1 (64 bits).
@compute @workgroup_size(1)
fn rng_take() {
  let s = vec4<u32>(state[0], state[1], state[2], state[3]);
  key_out[0] = s.x;
  key_out[1] = s.y;
  key_out[2] = s.z;
  key_out[3] = s.w;
  let lo = s.z + 1u;
  state[2] = lo;
  state[3] = s.w + select(0u, 1u, lo == 0u);
}

// High 32 bits of the 64-bit product a * b.
fn mulhi(a: u32, b: u32) -> u32 {
  let a0 = a & 0xffffu;
  let a1 = a >> 16u;
  let b0 = b & 0xffffu;
  let b1 = b >> 16u;
  let lo = a0 * b0;
  let m0 = a1 * b0;
  let m1 = a0 * b1;
  let mid = (lo >> 16u) + (m0 & 0xffffu) + (m1 & 0xffffu);
  return a1 * b1 + (m0 >> 16u) + (m1 >> 16u) + (mid >> 16u);
}

// Philox-4x32-10 (Salmon et al., SC'11; the Random123 reference constants).
fn philox(ctr_in: vec4<u32>, key_in: vec2<u32>) -> vec4<u32> {
  var c = ctr_in;
  var k = key_in;
  for (var i = 0u; i < 10u; i++) {
    let hi0 = mulhi(0xD2511F53u, c.x);
    let lo0 = 0xD2511F53u * c.x;
    let hi1 = mulhi(0xCD9E8D57u, c.z);
    let lo1 = 0xCD9E8D57u * c.z;
    c = vec4<u32>(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
    k += vec2<u32>(0x9E3779B9u, 0xBB67AE85u);
  }
  return c;
}

// One thread per group of 4 consecutive tensor elements (one Philox block); a piece that
// starts inside a group leaves that group's earlier elements to the previous piece.
// WG: csrc/shader_contract.hpp.
@compute @workgroup_size(WG)
fn dropout(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32) {
  let t = (wid.y * nwg.x + wid.x) * WG + lid;
  let lead = dp.first_lo & 3u;
  if (t * 4u >= lead + dp.n) { return; }
  // 64-bit group index (first / 4) + t
  let g0 = (dp.first_lo >> 2u) | (dp.first_hi << 30u);
  let glo = g0 + t;
  let ghi = (dp.first_hi >> 2u) + select(0u, 1u, glo < t);
  let kv = vec4<u32>(key[0], key[1], key[2], key[3]);
  let bits = philox(vec4<u32>(glo, ghi, kv.z, kv.w), kv.xy);
  for (var w = 0u; w < 4u; w++) {
    let local = t * 4u + w;  // lead + index into this piece
    if (local < lead || local - lead >= dp.n) { continue; }
    let i = local - lead;
    let m = select(0.0, dp.scale, bits[w] >= dp.threshold);
    var v = f32(src[i]) * m;  // NaN and inf propagate through dropped elements, as torch's x * mask
    if (dp.beta != 0.0) { v += dp.beta * f32(dst[i]); }
    dst[i] = ET(half_range(v, HALF));
  }
}
