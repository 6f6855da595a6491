"""FFMA ceiling of a WGSL compute kernel through wgpu-native (via wgpu-py):
eight independent vec4 FMA chains per thread, no memory traffic. The ceiling
the GEMM is measured against (docs/gemm_notes.md #24). On the GPU machine:

    source .gpu/prelude.sh && python3 bench/fma_peak.py [iterations]
"""

import sys
import time

import wgpu

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
mod = dev.create_shader_module(code=src)
pipe = dev.create_compute_pipeline(layout="auto", compute={"module": mod, "entry_point": "main"})
wgs = 132 * 8 * 4
buf = dev.create_buffer(size=wgs * 256 * 4, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
bg = dev.create_bind_group(layout=pipe.get_bind_group_layout(0), entries=[{"binding": 0, "resource": {"buffer": buf}}])


def run(n):
    enc = dev.create_command_encoder()
    for _ in range(n):
        p = enc.begin_compute_pass()
        p.set_pipeline(pipe)
        p.set_bind_group(0, bg)
        p.dispatch_workgroups(wgs)
        p.end()
    dev.queue.submit([enc.finish()])
    dev.queue.read_buffer(buf, 0, 4)


run(3)
for n in (5, 20):
    t = time.perf_counter()
    run(n)
    dt = time.perf_counter() - t
    flops = 2.0 * 64 * ITERS * wgs * 256 * n
    print(f"{n} dispatches: {dt * 1e3:.1f} ms  {flops / dt / 1e12:.1f} TFLOP/s")
