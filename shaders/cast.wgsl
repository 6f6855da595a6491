// float32 <-> float16 conversions (csrc/cast.cpp), on 32-bit words with
// integer operations: exact round-to-nearest-even as torch and NumPy convert,
// infinities and NaN kept, finite values past float16's range to +-inf,
// subnormals both ways, and no need for the shader-f16 feature (WGSL leaves
// out-of-range f32 -> f16 conversions indeterminate).
// Both operands are bound from their first element: float16 values sit two to
// a word, element 2w in word w's low half (little-endian, as NumPy stores them).

struct CastParams {
  n: u32,  // elements of this piece
}

//!include half

@group(0) @binding(0) var<storage, read> src: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<u32>;
@group(0) @binding(2) var<uniform> cp: CastParams;

fn thread_index(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
  return (wid.y * nwg.x + wid.x) * WG + lid;
}

// The float32 bits of the float16 with bits h (exact).
fn float_bits(h: u32) -> u32 {
  let sign = (h & 0x8000u) << 16u;
  let e = (h >> 10u) & 0x1fu;
  let m = h & 0x3ffu;
  if (e == 31u) { return sign | 0x7f800000u | (m << 13u); }
  if (e != 0u) { return sign | ((e + 112u) << 23u) | (m << 13u); }
  if (m == 0u) { return sign; }
  let lz = countLeadingZeros(m);  // 22..31: the leading bit at 31 - lz, worth 2^(31 - lz - 24)
  return sign | ((134u - lz) << 23u) | ((m << (lz - 8u)) & 0x7fffffu);
}

// One output word (two float16 values) per thread.
@compute @workgroup_size(WG)
fn f32_to_f16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
  let w = thread_index(wid, nwg, lid);
  let i = 2u * w;
  if (i >= cp.n) { return; }
  let lo = half_bits(src[i]);
  if (i + 1u < cp.n) {
    dst[w] = lo | (half_bits(src[i + 1u]) << 16u);
  } else {  // an odd count's last word: its high half is not ours (only this thread writes the word)
    dst[w] = (dst[w] & 0xffff0000u) | lo;
  }
}

// One output element per thread.
@compute @workgroup_size(WG)
fn f16_to_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
  let i = thread_index(wid, nwg, lid);
  if (i >= cp.n) { return; }
  dst[i] = float_bits((src[i / 2u] >> (16u * (i & 1u))) & 0xffffu);
}
