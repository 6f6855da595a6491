"""Ceiling of the GEMM's multiply loop through this stack: a synthetic kernel
that runs only the inner product of a register-blocked GEMM out of workgroup
memory (no global loads), for several per-thread tiles, thread counts and code
shapes (the plain FMA ceiling beside it: bench/fma_peak.py, through the same
`measure`). It answers whether any multiply loop the
driver compiles from WGSL runs far above the ~45 TFLOP/s that #77 measured for
the GEMM's own loop (docs/gemm_notes.md #86). On the GPU machine:

    source .gpu/prelude.sh && python3 bench/smem_fma_probe.py [variant ...]

Shader modules are created trusted (no injected bounds checks), as the GEMM's
are. Each variant: TMxTN per thread, THREADS per workgroup, code shape
(`loop`: the GEMM's own loops over arrays; `flat`: straight-line code over
scalar locals, in a k loop or `unrolled` one block per k step), how many
barriers end each BK block of k, and `stores`: each BK block begins as the
GEMM's K step does, with new tiles stored between two barriers.
"""

import sys
import time

import wgpu
from wgpu.backends.wgpu_native import _api
from wgpu.backends.wgpu_native._ffi import ffi, lib

SMS = 132
SRC_VEC4 = 1 << 20  # 16 MB of tile data for the variants with loads: stays in L2
PITCH4 = 1024  # row pitch in vec4s of the operands the `global` variants read


def shader(
    tm,
    tn,
    threads,
    wg_x,
    shape="flat",
    barriers=1,
    warp_w=8,
    bk=16,
    stores=False,
    dbuf=False,
    loads="",
    frag="shared",
    iters=None,
    half=False,
    flush=False,
):
    """WGSL for one variant and its multiply-adds per thread x 2: a wg_x x
    (threads / wg_x) grid of threads, laid out as the GEMM lays out its tile
    (thread_xy, 4x4 blocks strided by the grid). `iters` blocks of BK k steps
    (two with dbuf); by default about 2^17 multiply-adds per thread.
    `half`: f16 tiles, fragments and FMAs (packed HFMA2 where the driver
    makes them); with `flush` each BK block's f16 sums are then added to f32
    accumulators (the GEMM's HALF_FMA), else they run in f16 throughout."""
    t = "f16" if half else "f32"
    k_per_iter = bk * (2 if dbuf else 1)
    iters = iters or max(1, 2**17 // (tm * tn * k_per_iter))
    vm, vn = tm // 4, tn // 4
    wg_y = threads // wg_x
    bm, bn = wg_y * tm, wg_x * tn
    wide = frag == "wide"  # f16 tiles as pairs of vec4<f16> (16 bytes): one shared load per 8 values
    per = 8 if wide else 4
    a_stride, b_stride = bm // per + 1, bn // per + 1
    tile_t = "array<vec4<f16>, 2>" if wide else f"vec4<{t}>"

    def tile_value(x):
        v = f"vec4<{t}>({t}({x}))"
        return f"array<vec4<f16>, 2>({v}, {v})" if wide else v

    head = (
        ("enable f16;\n" if half else "")
        + f"""
const VM: u32 = {vm}u; const VN: u32 = {vn}u; const TM: u32 = {tm}u;
const WG_X: u32 = {wg_x}u; const WG_Y: u32 = {wg_y}u; const WARP_W: u32 = {warp_w}u;
const A_STRIDE: u32 = {a_stride}u; const B_STRIDE: u32 = {b_stride}u; const BK: u32 = {bk}u;
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@group(0) @binding(1) var<storage, read> src: array<vec4<f32>>;
var<workgroup> tile_a: array<{tile_t}, {(2 if dbuf else 1) * bk * a_stride}>;
var<workgroup> tile_b: array<{tile_t}, {(2 if dbuf else 1) * bk * b_stride}>;
fn thread_xy(li: u32) -> vec2<u32> {{
  if (WARP_W == WG_X) {{ return vec2<u32>(li % WG_X, li / WG_X); }}
  let lane = li % 32u; let warp = li / 32u; let warps_x = WG_X / WARP_W;
  return vec2<u32>((warp % warps_x) * WARP_W + lane % WARP_W, (warp / warps_x) * (32u / WARP_W) + lane / WARP_W);
}}
"""
    )
    fill = f"""
  for (var i = li; i < {bk * a_stride}u; i += {threads}u) {{ tile_a[i] = {tile_value("f32(i % 64u) * 1e-3")}; }}
  for (var i = li; i < {bk * b_stride}u; i += {threads}u) {{ tile_b[i] = {tile_value("f32(i % 64u) * 1e-3 + 1.0")}; }}
  workgroupBarrier();
  let xy = thread_xy(li);
"""
    bar = "workgroupBarrier(); " * barriers
    pre = ""
    if loads:  # tiles from global memory (L2-resident), stored between two barriers as the GEMM does
        sa, sb = bk * bm // 4 // threads, bk * bn // 4 // threads
        regs = [f"r{i}" for i in range(sa + sb)]
        src = "src[(base + {s}u * {t}u + li) & {mask}u]"
        get = "\n".join(f"    {r} = " + src.format(s=i, t=threads, mask=SRC_VEC4 - 1) + ";" for i, r in enumerate(regs))
        put = "\n".join(
            f"    tile_{'a' if i < sa else 'b'}[{(i if i < sa else i - sa) * threads}u + li] = {r};"
            for i, r in enumerate(regs)
        )
        decl = "".join(f"  var {r}: vec4<f32>;\n" for r in regs)
        nxt = "    let base = ((it + 1u) * 1031u + wid.x * 7919u) * 64u;\n" + get
        if loads == "prefetch":  # the next K step's tiles are loaded into registers during the multiply
            pre = decl + "  { let it = 0u; let base = wid.x * 7919u * 64u;\n" + get + "\n  }\n"
            top = f"\n    workgroupBarrier();\n{put}\n    workgroupBarrier();\n{nxt}\n"
        else:  # "direct": loaded and stored at the top of the K step
            pre = decl
            top = f"\n    workgroupBarrier();\n    let base = (it * 1031u + wid.x * 7919u) * 64u;\n{get}\n{put}\n    workgroupBarrier();\n"
        bar = ""
    elif stores:  # as the GEMM's K step: new tiles stored between two barriers, then the multiply
        bar = ""
        top = f"""
    workgroupBarrier();
    for (var i = li; i < {bk * a_stride}u; i += {threads}u) {{ tile_a[i] = {tile_value("f32((i + it) % 64u) * 1e-3")}; }}
    for (var i = li; i < {bk * b_stride}u; i += {threads}u) {{ tile_b[i] = {tile_value("f32((i + it) % 64u) * 1e-3 + 1.0")}; }}
    workgroupBarrier();
"""
    else:
        top = ""
    if shape == "loop":
        body = f"""{pre}
  var acc: array<vec4<f32>, TM * VN>;
  for (var it = 0u; it < {iters}u; it++) {{{top}
    for (var kk = 0u; kk < BK; kk++) {{
      var av: array<vec4<f32>, VM>;
      var bv: array<vec4<f32>, VN>;
      for (var i = 0u; i < VM; i++) {{ av[i] = tile_a[kk * A_STRIDE + i * WG_Y + xy.y]; }}
      for (var j = 0u; j < VN; j++) {{ bv[j] = tile_b[kk * B_STRIDE + j * WG_X + xy.x]; }}
      for (var i = 0u; i < VM; i++) {{
        for (var r = 0u; r < 4u; r++) {{
          for (var j = 0u; j < VN; j++) {{
            acc[(i * 4u + r) * VN + j] = fma(vec4<f32>(av[i][r]), bv[j], acc[(i * 4u + r) * VN + j]);
          }}
        }}
      }}
    }}
    {bar}
  }}
  var s = vec4<f32>(0.0);
  for (var i = 0u; i < TM * VN; i++) {{ s += acc[i]; }}
"""
    else:
        decl = "".join(f"  var c{i}_{j} = vec4<{t}>(0.0);\n" for i in range(tm) for j in range(vn))
        if flush:
            decl += "".join(f"  var w{i}_{j} = vec4<f32>(0.0);\n" for i in range(tm) for j in range(vn))
            bar += "".join(
                f"w{i}_{j} += vec4<f32>(c{i}_{j}); c{i}_{j} = vec4<{t}>(0.0); " for i in range(tm) for j in range(vn)
            )
        step = []
        if frag == "global":  # fragments straight from global memory (L1/L2), no workgroup tiles
            for i in range(vm):
                step.append(f"      let a{i} = src[arow + kk * {PITCH4}u + {i}u * WG_Y + xy.y];")
            for j in range(vn):
                step.append(f"      let b{j} = src[brow + kk * {PITCH4}u + {j}u * WG_X + xy.x];")
        elif wide:  # eight halves per load, split into the two vec4<f16> blocks a{2i}, a{2i+1}
            for x, n, grid, stride in (("a", vm, "WG_Y + xy.y", "A_STRIDE"), ("b", vn, "WG_X + xy.x", "B_STRIDE")):
                for i in range(n // 2):
                    step.append(f"      let {x}w{i} = tile_{x}[kk * {stride} + {i}u * {grid}];")
                    step.append(f"      let {x}{2 * i} = {x}w{i}[0];")
                    step.append(f"      let {x}{2 * i + 1} = {x}w{i}[1];")
        else:
            for i in range(vm):
                step.append(f"      let a{i} = tile_a[kk * A_STRIDE + {i}u * WG_Y + xy.y];")
            for j in range(vn):
                step.append(f"      let b{j} = tile_b[kk * B_STRIDE + {j}u * WG_X + xy.x];")
        comp = "xyzw"
        for i in range(vm):
            for r in range(4):
                for j in range(vn):
                    c = f"c{i * 4 + r}_{j}"
                    step.append(f"      {c} = fma(vec4<{t}>(a{i}.{comp[r]}), b{j}, {c});")
        steps = "\n".join(step)
        if shape == "flat":
            ksteps = f"""    for (var kk = 0u; kk < BK; kk++) {{
{steps}
    }}"""
        elif not dbuf:  # "unrolled": one block per k step, kk a constant
            ksteps = "\n".join(f"    {{ let kk = {kk}u;\n{steps}\n    }}" for kk in range(bk))
        else:  # double-buffered: two K steps per iteration, each storing the other buffer, one barrier each
            ksteps = ""
            for h in (0, 1):
                o = 1 - h
                ksteps += f"""
    for (var i = li; i < {bk * a_stride}u; i += {threads}u) {{ tile_a[{o * bk * a_stride}u + i] = vec4<f32>(f32(i + it) * 1e-6); }}
    for (var i = li; i < {bk * b_stride}u; i += {threads}u) {{ tile_b[{o * bk * b_stride}u + i] = vec4<f32>(f32(i + it) * 1e-6 + 1.0); }}
"""
                ksteps += "\n".join(f"    {{ let kk = {h * bk + kk}u;\n{steps}\n    }}" for kk in range(bk))
                ksteps += "\n    workgroupBarrier();"
            top = bar = ""
        if frag == "global":  # a workgroup walks 32 K blocks of one tile column of A and B, as a GEMM would
            top += f"""
    let arow = ((it + wid.x) % 32u) * {bk * PITCH4}u + (wid.x % 8u) * 32u;
    let brow = arow + {SRC_VEC4 // 2}u;"""
        body = f"""{decl}{pre}
  for (var it = 0u; it < {iters}u; it++) {{{top}
{ksteps}
    {bar}
  }}
  let s = {" + ".join(f"{'w' if flush else 'c'}{i}_{j}" if flush else f"vec4<f32>(c{i}_{j})" for i in range(tm) for j in range(vn))};
"""
    return (
        head
        + f"""
@compute @workgroup_size({threads})
fn main(@builtin(local_invocation_index) li: u32, @builtin(global_invocation_id) g: vec3<u32>,
        @builtin(workgroup_id) wid: vec3<u32>) {{
  if (li == 0u && wid.x == 0u) {{ out[0] = src[0].x; }}  // keeps binding 1 in the layout
{fill}{body}
  out[g.x] = s.x + s.y + s.z + s.w;
}}
"""
    ), 2.0 * tm * tn * k_per_iter * iters


def trusted_module(dev, code, label):
    src = _api.new_struct_p("WGPUShaderSourceWGSL *", code=_api.to_c_string_view(code))
    src[0].chain.next = ffi.NULL
    src[0].chain.sType = lib.WGPUSType_ShaderSourceWGSL
    desc = _api.new_struct_p(
        "WGPUShaderModuleDescriptor *",
        nextInChain=ffi.cast("WGPUChainedStruct *", src),
        label=_api.to_c_string_view(label),
    )
    mid = lib.wgpuDeviceCreateShaderModuleTrusted(dev._internal, desc, lib.WGPUShaderRuntimeChecks_None)
    if mid == ffi.NULL:
        raise RuntimeError("shader module creation failed")
    return _api.GPUShaderModule(label, mid, dev)


def measure(dev, code, threads, flops_per_thread, label):
    """Best TFLOP/s of three runs of 10 dispatches of SMS * 16 workgroups of
    `code`'s `main` (a trusted module); binding 0 is an output of one f32 per
    thread, binding 1 (where the code declares it) SRC_VEC4 vec4s to read."""
    mod = trusted_module(dev, code, label)
    pipe = dev.create_compute_pipeline(layout="auto", compute={"module": mod, "entry_point": "main"})
    wgs = SMS * 16  # several waves at any occupancy
    buf = dev.create_buffer(size=wgs * threads * 4, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
    entries = [{"binding": 0, "resource": {"buffer": buf}}]
    if "@binding(1)" in code:
        src = dev.create_buffer(size=SRC_VEC4 * 16, usage=wgpu.BufferUsage.STORAGE)
        entries.append({"binding": 1, "resource": {"buffer": src}})
    bg = dev.create_bind_group(layout=pipe.get_bind_group_layout(0), entries=entries)

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

    run(2)
    best = 0.0
    for _ in range(3):
        t = time.perf_counter()
        run(10)
        dt = time.perf_counter() - t
        best = max(best, flops_per_thread * wgs * threads * 10 / dt / 1e12)
    return best


def variant(*dims, **options):
    """Keyword arguments of shader(): TM, TN, threads, grid width[, code shape], options."""
    return dict(zip(("tm", "tn", "threads", "wg_x", "shape"), dims), **options)


VARIANTS = {
    "8x4-256-loop": variant(8, 4, 256, 32, "loop"),  # the GEMM's 64x128 tile and loop
    "8x4-256": variant(8, 4, 256, 32),
    "8x4-256-bar0": variant(8, 4, 256, 32, barriers=0),
    "8x4-256-bar2": variant(8, 4, 256, 32, barriers=2),  # as the GEMM: two per K step
    "8x4-256-bk32": variant(8, 4, 256, 32, bk=32),
    "8x8-128-loop": variant(8, 8, 128, 16, "loop"),  # 64x128 on 128 threads (#74)
    "8x8-128": variant(8, 8, 128, 16),
    "8x8-128-bar0": variant(8, 8, 128, 16, barriers=0),
    "8x8-128-bk32": variant(8, 8, 128, 16, bk=32),
    "8x8-128-bk8": variant(8, 8, 128, 16, bk=8),
    "8x8-256": variant(8, 8, 256, 16),  # 128x128 on 256 threads
    "8x8-256-bar0": variant(8, 8, 256, 16, barriers=0),
    "8x8-256-bk32": variant(8, 8, 256, 16, bk=32),
    "8x8-256-w16": variant(8, 8, 256, 16, warp_w=16),
    "12x8-128": variant(12, 8, 128, 16),
    "16x8-128": variant(16, 8, 128, 16),
    "4x4-256": variant(4, 4, 256, 32, warp_w=16),
    # k steps written out one by one (kk a constant): whether the driver then
    # keeps the loop unrolled with barriers and tile stores in it
    "8x4-256-unr-st": variant(8, 4, 256, 32, "unrolled", stores=True),
    "8x4-256-loop-st": variant(8, 4, 256, 32, "loop", stores=True),
    "8x8-256-unr": variant(8, 8, 256, 16, "unrolled"),
    "8x8-256-unr-st": variant(8, 8, 256, 16, "unrolled", stores=True),
    "8x8-256-unr-st-bk8": variant(8, 8, 256, 16, "unrolled", stores=True, bk=8),
    "8x8-256-unr-st-bk32": variant(8, 8, 256, 16, "unrolled", stores=True, bk=32),
    "8x8-128-unr": variant(8, 8, 128, 16, "unrolled"),
    "8x8-128-unr-st": variant(8, 8, 128, 16, "unrolled", stores=True),
    "8x8-128-unr-st-bk8": variant(8, 8, 128, 16, "unrolled", stores=True, bk=8),
    "12x8-128-unr-st": variant(12, 8, 128, 16, "unrolled", stores=True),
    "16x8-128-unr-st": variant(16, 8, 128, 16, "unrolled", stores=True),
    "8x16-128-unr-st": variant(8, 16, 128, 16, "unrolled", stores=True),
    # double-buffered tiles: one barrier per K step
    "8x4-256-db": variant(8, 4, 256, 32, "unrolled", dbuf=True),
    "8x8-256-db": variant(8, 8, 256, 16, "unrolled", dbuf=True),
    "8x8-256-db-bk8": variant(8, 8, 256, 16, "unrolled", dbuf=True, bk=8),
    "8x8-128-db": variant(8, 8, 128, 16, "unrolled", dbuf=True),
    "12x8-128-db": variant(12, 8, 128, 16, "unrolled", dbuf=True),
    # global loads as the GEMM's K step has them: prefetched into registers
    # during the multiply, or loaded and stored at the step's top
    "8x4-256-loop-pf": variant(8, 4, 256, 32, "loop", loads="prefetch"),
    "8x4-256-unr-pf": variant(8, 4, 256, 32, "unrolled", loads="prefetch"),
    "8x8-256-unr-pf": variant(8, 8, 256, 16, "unrolled", loads="prefetch"),
    "8x8-256-unr-direct": variant(8, 8, 256, 16, "unrolled", loads="direct"),
    "8x8-256-unr-pf-bk8": variant(8, 8, 256, 16, "unrolled", loads="prefetch", bk=8),
    "8x8-128-unr-pf-bk8": variant(8, 8, 128, 16, "unrolled", loads="prefetch", bk=8),
    "8x8-128-unr-direct": variant(8, 8, 128, 16, "unrolled", loads="direct"),
    "12x8-128-unr-direct": variant(12, 8, 128, 16, "unrolled", loads="direct"),
    "16x8-128-unr-direct": variant(16, 8, 128, 16, "unrolled", loads="direct"),
    # no workgroup tiles: every thread reads its fragments from global memory (L1 / L2), no barriers
    "8x8-256-glob": variant(8, 8, 256, 16, "unrolled", barriers=0, frag="global"),
    "8x8-128-glob": variant(8, 8, 128, 16, "unrolled", barriers=0, frag="global"),
    "8x4-256-glob": variant(8, 4, 256, 32, "unrolled", barriers=0, frag="global"),
    "8x8-256-glob-bk8": variant(8, 8, 256, 16, "unrolled", barriers=0, frag="global", bk=8),
    "12x8-128-glob": variant(12, 8, 128, 16, "unrolled", barriers=0, frag="global"),
    # isolating the K step's costs: a second barrier; stores without a loop
    "8x8-256-unr-bar2": variant(8, 8, 256, 16, "unrolled", barriers=2),
    "8x8-256-unr-pf-bk32": variant(8, 8, 256, 16, "unrolled", loads="prefetch", bk=32),
    # float16: f16 tiles and FMAs ("-h"), their sums flushed into f32 accumulators per BK block ("-hf")
    "8x8-256-bar0-h": variant(8, 8, 256, 16, barriers=0, half=True),
    "8x8-256-unr-h": variant(8, 8, 256, 16, "unrolled", half=True),
    "8x8-256-unr-hf": variant(8, 8, 256, 16, "unrolled", half=True, flush=True),
    "8x8-256-unr-st-h": variant(8, 8, 256, 16, "unrolled", stores=True, half=True),
    "8x8-256-unr-st-hf": variant(8, 8, 256, 16, "unrolled", stores=True, half=True, flush=True),
    "8x8-256-unr-st-hf-bk32": variant(8, 8, 256, 16, "unrolled", stores=True, half=True, flush=True, bk=32),
    "8x16-128-unr-h": variant(8, 16, 128, 8, "unrolled", half=True),
    "8x16-128-unr-st-hf": variant(8, 16, 128, 8, "unrolled", stores=True, half=True, flush=True),
    "16x8-128-unr-st-hf": variant(16, 8, 128, 16, "unrolled", stores=True, half=True, flush=True),
    "16x16-64-unr-h": variant(16, 16, 64, 8, "unrolled", half=True),
    "8x8-128-unr-st-hf": variant(8, 8, 128, 16, "unrolled", stores=True, half=True, flush=True),
    # f16 tiles read as 128-bit words of eight halves ("-w"): half the shared loads per multiply-add
    "8x8-256-bar0-hw": variant(8, 8, 256, 16, barriers=0, half=True, frag="wide"),
    "8x8-256-unr-hw": variant(8, 8, 256, 16, "unrolled", half=True, frag="wide"),
    "8x8-256-unr-st-hfw": variant(8, 8, 256, 16, "unrolled", stores=True, half=True, flush=True, frag="wide"),
    "8x8-256-unr-st-hfw-bk32": variant(
        8, 8, 256, 16, "unrolled", stores=True, half=True, flush=True, frag="wide", bk=32
    ),
    "8x16-128-unr-hw": variant(8, 16, 128, 8, "unrolled", half=True, frag="wide"),
    "16x8-128-unr-st-hfw": variant(16, 8, 128, 16, "unrolled", stores=True, half=True, flush=True, frag="wide"),
    "16x16-64-unr-hw": variant(16, 16, 64, 8, "unrolled", half=True, frag="wide"),
    "8x16-128-unr-st-hfw": variant(8, 16, 128, 8, "unrolled", stores=True, half=True, flush=True, frag="wide"),
}


def main():
    names = sys.argv[1:] or list(VARIANTS)
    adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    limits = {"max-compute-workgroup-storage-size": adapter.limits["max-compute-workgroup-storage-size"]}
    half = any(VARIANTS[n].get("half") for n in names)
    dev = adapter.request_device_sync(required_limits=limits, required_features=["shader-f16"] if half else [])
    print(adapter.info["device"], adapter.info.get("driver_description", ""))
    for name in names:
        v = VARIANTS[name]
        code, flops = shader(**v)
        try:
            tf = measure(dev, code, v["threads"], flops, name)
            print(f"{name:24s} {tf:6.1f} TFLOP/s", flush=True)
        except Exception as e:  # one variant failing must not hide the others
            print(f"{name:24s} failed: {type(e).__name__}: {str(e)[:200]}", flush=True)


if __name__ == "__main__":
    main()
