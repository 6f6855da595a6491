// f32 results bound for f16 storage, shared by the kernels whose element types
// are aliases (pulled in with `//!include half`). WGSL leaves the f32 -> f16
// conversion of a value past f16's range indeterminate: half_range(v, true)
// makes those +-inf (from 65520 up, as torch and NumPy round), so the
// conversion that follows only rounds. NaN and in-range values pass unchanged.
fn half_range(v: f32, half: bool) -> f32 {
  let b = bitcast<u32>(v);
  let a = b & 0x7fffffffu;
  if (half && a >= 0x477ff000u && a < 0x7f800000u) { return bitcast<f32>((b & 0x80000000u) | 0x7f800000u); }
  return v;
}
