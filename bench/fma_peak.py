"""FFMA ceiling of a WGSL compute kernel through wgpu-native (via wgpu-py):
eight independent vec4 FMA chains per thread, no memory traffic. The ceiling
the GEMM is measured against (docs/gemm_notes.md #24), timed as
bench/smem_fma_probe.py times its variants (`measure`: a trusted module,
best of three runs of ten dispatches). On the GPU machine:

    source .gpu/prelude.sh && python3 bench/fma_peak.py [iterations]
"""

import sys

import wgpu
from smem_fma_probe import measure  # this script's directory is on sys.path

ITERS = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
src = """
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
  let s = f32(g.x) * 1e-9;
  var a0 = vec4<f32>(s); var a1 = a0 + 1.0; var a2 = a0 + 2.0; var a3 = a0 + 3.0;
  var a4 = a0 + 4.0; var a5 = a0 + 5.0; var a6 = a0 + 6.0; var a7 = a0 + 7.0;
  let m = vec4<f32>(0.999999); let c = vec4<f32>(1e-7);
  for (var i = 0u; i < ITERSu; i++) {
    a0 = fma(a0, m, c); a1 = fma(a1, m, c); a2 = fma(a2, m, c); a3 = fma(a3, m, c);
    a4 = fma(a4, m, c); a5 = fma(a5, m, c); a6 = fma(a6, m, c); a7 = fma(a7, m, c);
    a0 = fma(a0, m, c); a1 = fma(a1, m, c); a2 = fma(a2, m, c); a3 = fma(a3, m, c);
    a4 = fma(a4, m, c); a5 = fma(a5, m, c); a6 = fma(a6, m, c); a7 = fma(a7, m, c);
  }
  let t = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
  out[g.x] = t.x + t.y + t.z + t.w;
}
""".replace("ITERS", str(ITERS))
adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
dev = adapter.request_device_sync()
print(adapter.info["device"])
print(f"{measure(dev, src, 256, 2.0 * 64 * ITERS, 'fma_peak'):.1f} TFLOP/s")
