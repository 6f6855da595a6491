// f32 results bound for f16 storage, shared by the kernels that write float16
// (pulled in with `//!include half`). WGSL leaves the f32 -> f16
// conversion of a value past f16's range indeterminate: half_range(v, true)
// makes those +-inf (from 65520 up, as torch and NumPy round), so the
// conversion that follows only rounds. NaN and in-range values pass unchanged.
fn half_range(v: f32, half: bool) -> f32 {
  let b = bitcast<u32>(v);
  let a = b & 0x7fffffffu;
  if (half && a >= 0x477ff000u && a < 0x7f800000u) { return bitcast<f32>((b & 0x80000000u) | 0x7f800000u); }
  return v;
}

// The float16 bit pattern nearest to the float32 with bits x (ties to even).
fn half_bits(x: u32) -> u32 {
  let sign = (x >> 16u) & 0x8000u;
  let ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) { return sign | 0x7e00u | ((ax >> 13u) & 0x3ffu); }  // NaN, made quiet
  if (ax >= 0x477ff000u) { return sign | 0x7c00u; }  // >= 65520 (half-way past 65504) and inf
  if (ax >= 0x38800000u) {  // normal float16 (>= 2^-14): rebias the exponent, round off 13 bits
    let v = ax - 0x38000000u;
    return sign | ((v + 0xfffu + ((v >> 13u) & 1u)) >> 13u);
  }
  if (ax < 0x33000000u) { return sign; }  // <= 2^-25 rounds to zero
  // Subnormal float16: the value in units of 2^-24 is m >> (126 - e), rounded.
  let e = ax >> 23u;
  let m = (ax & 0x7fffffu) | 0x800000u;
  let s = 126u - e;  // 14..24
  var q = m >> s;
  let rem = m & ((1u << s) - 1u);
  let mid = 1u << (s - 1u);
  if (rem > mid || (rem == mid && (q & 1u) == 1u)) { q += 1u; }
  return sign | q;  // q may reach 0x400, the smallest normal: its bits
}
