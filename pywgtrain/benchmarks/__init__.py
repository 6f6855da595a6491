"""Benchmarks: ``pywgtrain bench {gemm,adamw,train,gpt,transfer,ddp,all}``
(``main``; the GEMM, AdamW and training benchmarks in ``gemm``, the GPT step
in ``gpt``, host <-> device copies in ``transfer``, data-parallel training
over several processes in ``ddp`` (not part of ``all``), what they share in
``common``).

pywgtrain kernels are timed with GPU timestamp queries around their compute
passes (median of many runs after warm-up, fresh random data, inputs rotated
across buffer sets larger than the L2 cache). When PyTorch with CUDA is
importable, the same work runs through cuBLAS / PyTorch in the same process
(CUDA events, TF32 off) and the ratio is printed.

On a CPU adapter (lavapipe, WARP, SwiftShader: ``adapter_type == "cpu"``,
a few GFLOP/s) the GPU-sized problems would take hours, so sizes,
repetitions and warm-up are scaled down there (no clock warm-up at all:
CPUs have no idle GPU clocks to leave). Every shape or configuration prints
its name before it runs and its result when done.
"""

import json

from ..device import Device
from .common import _torch_cuda, check_output_path, is_cpu_adapter
from .gemm import bench_adamw, bench_gemm, bench_gemm_sweep, bench_train, parse_shapes
from .gpt import bench_gpt
from .transfer import bench_transfer, parse_sizes


def main(args):
    if args.what == "ddp":  # launches its own processes, one per GPU: this one opens no device for it
        from .ddp import bench_ddp

        bench_ddp(args)
        return 0
    # Arguments first, so a bad one fails before any GPU work.
    shapes = args.shapes
    if isinstance(shapes, str):  # the CLI has parsed them already
        shapes = parse_shapes(shapes)
    sizes = getattr(args, "sizes", None)
    if isinstance(sizes, str):
        sizes = parse_sizes(sizes)
    if args.json:
        check_output_path(args.json, "--json")
    dev = Device(args.adapter)
    torch = None if args.no_baseline else _torch_cuda()
    header = {
        "adapter": dev.name,
        "backend": dev.backend,
        "driver": dev.info["driver"],
        "adapter_type": dev.info.get("adapter_type"),
        "torch_cuda": None if torch is None else torch.cuda.get_device_name(0),
    }
    print(
        f"adapter: {dev.name} ({dev.backend}, {dev.info['driver']}); "
        f"baseline: {header['torch_cuda'] or 'none (PyTorch with CUDA not importable)'}",
        flush=True,
    )
    if is_cpu_adapter(dev):
        print(
            "CPU adapter: problem sizes, repetitions and warm-up scaled down "
            "(the GPU-sized runs would take hours here)",
            flush=True,
        )
    results = {"meta": header}
    kinds = ["gemm", "adamw", "train", "gpt", "transfer"] if args.what == "all" else [args.what]
    for kind in kinds:
        if len(kinds) > 1:
            print(f"== {kind} ==", flush=True)
        dtype = getattr(args, "dtype", "float32")
        if kind == "gemm" and getattr(args, "sweep", False):
            results[kind] = bench_gemm_sweep(dev, args.quick, torch, dtype)
        elif kind == "gemm" and (shapes or dtype != "float32"):
            results[kind] = bench_gemm(dev, args.quick, torch, shapes, dtype)
        elif kind == "transfer":
            results[kind] = bench_transfer(dev, args.quick, torch, sizes)
        else:
            results[kind] = {"gemm": bench_gemm, "adamw": bench_adamw, "train": bench_train, "gpt": bench_gpt}[kind](
                dev, args.quick, torch
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0
