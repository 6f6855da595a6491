"""pywgtrain: train models on any GPU through WebGPU. Commands: info (adapters),
gpt (train a small GPT on Python's own sources: the main job), train (an MLP on
scikit-learn's digits), bench (benchmarks)."""

import argparse
import math
import os
import platform
import sys

EXIT_RUNTIME = 1  # the GPU, a file or the run failed
EXIT_USAGE = 2  # bad arguments (argparse uses 2 as well)
EXIT_INTERRUPTED = 130  # Ctrl-C, as shells report SIGINT


# -- help for a machine without a WebGPU adapter ------------------------------------


def _linux_distro():
    """IDs from /etc/os-release (ID and ID_LIKE), lower case; empty if unreadable."""
    ids = []
    try:
        with open("/etc/os-release") as f:
            for line in f:
                key, _, value = line.strip().partition("=")
                if key in ("ID", "ID_LIKE"):
                    ids += value.strip('"').lower().split()
    except OSError:
        pass
    return ids


def driver_help(system=None, distro=None):
    """What to install so that WebGPU finds an adapter, for this (or the given) OS."""
    system = system or platform.system()
    if system == "Linux":
        distro = _linux_distro() if distro is None else distro
        rows = [
            (("debian", "ubuntu"), "Debian/Ubuntu", "sudo apt-get install mesa-vulkan-drivers libvulkan1"),
            (("fedora", "rhel", "centos"), "Fedora/RHEL", "sudo dnf install mesa-vulkan-drivers vulkan-loader"),
            (
                ("arch",),
                "Arch Linux",
                "sudo pacman -S vulkan-swrast vulkan-icd-loader   (or mesa's vulkan-radeon, "
                "vulkan-intel for those GPUs)",
            ),
        ]
        lines = [
            "pywgtrain needs a Vulkan driver on Linux: a GPU vendor's, or Mesa's lavapipe, which runs on the CPU.",
            "Install one:",
        ]
        for ids, name, cmd in rows:
            here = "   <- this system" if any(i in distro for i in ids) else ""
            lines.append(f"  {name + ':':15} {cmd}{here}")
        lines += [
            "  NVIDIA GPUs:    the NVIDIA driver package installs its own Vulkan driver (nvidia_icd.json)",
            "Drivers register a JSON file under /usr/share/vulkan/icd.d or /etc/vulkan/icd.d.",
            "From a pywgtrain checkout, `bash scripts/train.sh` or `bash scripts/test.sh` installs Mesa's "
            "driver when none is present.",
            "Then check with: pywgtrain info",
        ]
        return "\n".join(lines)
    if system == "Darwin":
        return (
            "pywgtrain uses Metal on macOS, which is built in: nothing to install. It needs macOS 10.13 "
            "(High Sierra) or newer on a Mac with a Metal-capable GPU (every Mac from 2012 on; Apple silicon). "
            "A virtual machine without Metal has no adapter; update macOS if it is older than 10.13.\n"
            "Then check with: pywgtrain info"
        )
    if system == "Windows":
        return (
            "pywgtrain uses DirectX 12 or Vulkan on Windows: install or update the GPU vendor's driver "
            "(NVIDIA, AMD or Intel) with DirectX 12 or Vulkan support, on Windows 10 or newer. A remote "
            "desktop connection or a VM without GPU access may expose no adapter.\n"
            "Then check with: pywgtrain info"
        )
    return (
        f"pywgtrain needs a WebGPU adapter: Vulkan, Metal or DirectX 12. No install instructions for "
        f"{system or 'this OS'}; install a Vulkan driver for your GPU (or Mesa's lavapipe)."
    )


def _no_adapter(e):
    return "no WebGPU adapter found" in str(e)


# -- commands ----------------------------------------------------------------------


def cmd_info(args):
    import pywgtrain as pw

    adapters = pw.list_adapters()
    if not adapters:
        print(
            "pywgtrain: error: no WebGPU adapter found (Vulkan, Metal or DirectX 12)\n" + driver_help(), file=sys.stderr
        )
        return EXIT_RUNTIME
    for a in adapters:
        print(f"[{a['index']}] {a['name']} ({a['backend']}, {a['adapter_type']}) driver: {a['driver']}")
    dev = pw.Device(args.adapter)
    print(f"\nselected: {dev.name}")
    for key in (
        "backend",
        "adapter_type",
        "vendor",
        "architecture",
        "driver",
        "vendor_id",
        "device_id",
        "subgroup_min_size",
        "subgroup_max_size",
    ):
        print(f"  {key}: {dev.info[key]}")
    print("limits:")
    for k, v in dev.limits.items():
        print(f"  {k}: {v}")
    print("features: " + (", ".join(dev.features) or "(none)"))
    return 0


def _report_interrupted(args, result):
    """Ctrl-C during a training command: where it stopped and how to continue."""
    where = (
        f"checkpoint saved to {args.checkpoint}; continue with the same options and --resume {args.checkpoint}"
        if args.checkpoint
        else "nothing saved (no --checkpoint given)"
    )
    print(f"pywgtrain: interrupted at step {result['step']} of {result['total']}; {where}", file=sys.stderr)
    return EXIT_INTERRUPTED


def cmd_train(args):
    from .demo import run_demo

    if args.save_every is not None and not args.checkpoint:
        raise _UsageError("--save-every needs --checkpoint")
    result = run_demo(
        hidden=tuple(args.hidden),
        batch_size=args.batch_size,
        epochs=args.epochs,
        steps=args.steps,
        lr=args.lr,
        weight_decay=args.weight_decay,
        seed=args.seed,
        adapter=args.adapter,
        activation=args.activation,
        max_grad_norm=args.max_grad_norm,
        plot=args.plot,
        checkpoint=args.checkpoint,
        resume=args.resume,
        steps_per_submit=args.steps_per_submit,
        save_every=args.save_every,
        log_every=args.log_every,
    )
    if result["interrupted"]:
        return _report_interrupted(args, result)
    if result["accuracy"] < args.min_accuracy:
        print(
            f"pywgtrain: held-out accuracy {result['accuracy']:.4f} is below --min-accuracy {args.min_accuracy}",
            file=sys.stderr,
        )
        return EXIT_RUNTIME
    return 0


def cmd_gpt(args):
    from .gpt_demo import run_gpt

    result = run_gpt(
        config=args.config,
        steps=args.steps,
        batch_size=args.batch_size,
        block_size=args.block_size,
        lr=args.lr,
        weight_decay=args.weight_decay,
        seed=args.seed,
        adapter=args.adapter,
        eval_every=args.eval_every,
        eval_iters=args.eval_iters,
        max_bytes=args.max_bytes,
        plot=args.plot,
        checkpoint=args.checkpoint,
        resume=args.resume,
        sample_tokens=args.sample_tokens,
        attention=args.attention,
        steps_per_submit=args.steps_per_submit,
        max_grad_norm=args.max_grad_norm,
        log_every=args.log_every,
        precision=args.precision,
    )
    if result["interrupted"]:
        return _report_interrupted(args, result)
    if args.max_val_loss is not None and result["val_losses"] and result["val_losses"][-1][1] > args.max_val_loss:
        print(
            f"pywgtrain: validation loss {result['val_losses'][-1][1]:.4f} is above --max-val-loss {args.max_val_loss}",
            file=sys.stderr,
        )
        return EXIT_RUNTIME
    return 0


def cmd_bench(args):
    from .. import benchmarks

    return benchmarks.main(args)


# -- argument types ----------------------------------------------------------------


class _UsageError(ValueError):
    """A bad combination of arguments found after parsing (exit 2)."""


def _number(text, kind, expected, ok, must, shown):
    """``text`` as ``kind``, or an ArgumentTypeError naming what was expected."""
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"must be {must}, got {shown(text, value)}")
    return value


def positive_int(text):
    return _number(text, int, "an integer >= 1", lambda v: v >= 1, "an integer >= 1", lambda t, v: v)


def non_negative_int(text):
    return _number(text, int, "an integer >= 0", lambda v: v >= 0, "an integer >= 0", lambda t, v: v)


def non_negative_float(text):
    return _number(
        text, float, "a number", lambda v: math.isfinite(v) and v >= 0.0, "a finite number >= 0", lambda t, v: t
    )


def gemm_shapes(text):
    from ..benchmarks.gemm import parse_shapes

    try:
        return parse_shapes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def transfer_sizes(text):
    from ..benchmarks.transfer import parse_sizes

    try:
        return parse_sizes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


ADAPTER_HELP = "index into the adapter list or a name substring; unset: $PYWGTRAIN_ADAPTER, else the best adapter"


def build_parser():
    fmt = argparse.ArgumentDefaultsHelpFormatter
    p = argparse.ArgumentParser(
        prog="pywgtrain",
        description=__doc__,
        formatter_class=fmt,
        epilog="Exit status: 0 ok, 1 runtime error (no adapter, GPU fault, file error, "
        "accuracy below --min-accuracy), 2 bad arguments, 130 interrupted (Ctrl-C). "
        "PYWGTRAIN_TRACEBACK=1 shows the Python traceback of an error.",
    )
    sub = p.add_subparsers(dest="cmd", required=True, metavar="{info,gpt,train,bench}")

    info = sub.add_parser(
        "info", help="adapter, backend, driver, limits, features (or what to install)", formatter_class=fmt
    )
    info.add_argument("--adapter", default=None, help=ADAPTER_HELP)
    info.set_defaults(fn=cmd_info)

    from ..models.gpt import CONFIGS

    g = sub.add_parser(
        "gpt",
        help="train a GPT on the Python standard library's sources (the main job)",
        formatter_class=fmt,
        description="Train a small GPT (byte tokens) on the Python standard library's own source "
        "files, report validation loss, plot the loss curve and sample text with a KV "
        "cache. --config picks a size: tiny (a few minutes on a CPU adapter), small, "
        "char (nanoGPT's character model), gpt2 (GPT-2 small's shape). Ctrl-C stops "
        "after the current step and saves --checkpoint.",
    )
    g.add_argument("--config", default="tiny", choices=sorted(CONFIGS), help="model size")
    g.add_argument("--steps", type=positive_int, default=None, help="training steps; unset: the config's default")
    g.add_argument("--batch-size", type=positive_int, default=None, help="sequences per step; unset: the config's")
    g.add_argument("--block-size", type=positive_int, default=None, help="context length; unset: the config's")
    g.add_argument("--lr", type=non_negative_float, default=None, help="peak AdamW learning rate; unset: the config's")
    g.add_argument("--weight-decay", type=non_negative_float, default=0.1, help="AdamW weight decay (matrices only)")
    g.add_argument("--max-grad-norm", type=non_negative_float, default=1.0, help="clip the global gradient norm")
    g.add_argument(
        "--attention",
        default="fused",
        choices=["fused", "plain"],
        help="fused kernel (no T x T scores in memory) or batched GEMMs + softmax",
    )
    g.add_argument(
        "--precision",
        default="fp32",
        choices=["fp32", "fp16"],
        help="fp16: forward and loss under pywgtrain.autocast, gradients through a GradScaler (needs shader-f16)",
    )
    g.add_argument("--eval-every", type=positive_int, default=None, help="steps between validation losses")
    g.add_argument("--eval-iters", type=positive_int, default=10, help="batches per validation loss")
    g.add_argument("--max-bytes", type=positive_int, default=None, help="use only this much of the corpus")
    g.add_argument("--sample-tokens", type=non_negative_int, default=300, help="tokens to sample at the end")
    g.add_argument("--seed", type=non_negative_int, default=0, help="seeds the initialization and the batches")
    g.add_argument(
        "--steps-per-submit", type=positive_int, default=8, help="replayed steps grouped into one GPU submission"
    )
    g.add_argument("--adapter", default=None, help=ADAPTER_HELP)
    g.add_argument("--plot", default="gpt_loss_curve.png", help="loss-curve image path ('' to skip)")
    g.add_argument(
        "--checkpoint", default=None, help="save model+optimizer here at the end and on Ctrl-C (.safetensors, or .npz)"
    )
    g.add_argument("--resume", default=None, help="continue from this checkpoint (the remaining steps)")
    g.add_argument(
        "--log-every",
        type=positive_int,
        default=None,
        help="steps between progress lines when the output is not a terminal",
    )
    g.add_argument(
        "--max-val-loss",
        type=non_negative_float,
        default=None,
        help="exit 1 if the final validation loss is above this",
    )
    g.set_defaults(fn=cmd_gpt)

    tr = sub.add_parser(
        "train",
        help="train an MLP classifier on scikit-learn's digits",
        formatter_class=fmt,
        description="Train an MLP on scikit-learn's bundled 8x8 digits and report held-out accuracy. "
        "Ctrl-C stops after the current step, saves --checkpoint and exits 130; a second "
        "Ctrl-C exits at once.",
    )
    tr.add_argument("--hidden", type=positive_int, nargs="+", default=[256, 256], help="hidden layer sizes")
    tr.add_argument("--batch-size", type=positive_int, default=64, help="examples per step")
    tr.add_argument("--epochs", type=positive_int, default=30, help="passes over the 1437 training examples")
    tr.add_argument("--steps", type=positive_int, default=None, help="total steps; overrides --epochs")
    tr.add_argument("--lr", type=non_negative_float, default=1e-3, help="AdamW learning rate")
    tr.add_argument("--weight-decay", type=non_negative_float, default=1e-2, help="AdamW weight decay")
    tr.add_argument(
        "--max-grad-norm", type=non_negative_float, default=1.0, help="clip the global gradient norm to this"
    )
    tr.add_argument(
        "--activation",
        default="gelu",
        choices=["relu", "gelu", "gelu_tanh", "silu"],
        help="activation of the hidden layers",
    )
    tr.add_argument(
        "--seed",
        type=non_negative_int,
        default=0,
        help="seeds the initialization, the train/held-out split and the data order",
    )
    tr.add_argument(
        "--steps-per-submit",
        type=positive_int,
        default=8,
        help="replayed steps grouped into one GPU submission (1: one per step)",
    )
    tr.add_argument("--adapter", default=None, help=ADAPTER_HELP)
    tr.add_argument("--plot", default="loss_curve.png", help="loss-curve image path ('' to skip)")
    tr.add_argument(
        "--checkpoint",
        default=None,
        help="save model+optimizer here (.npz): every --save-every steps, at the end and on Ctrl-C",
    )
    tr.add_argument(
        "--save-every", type=positive_int, default=None, help="steps between checkpoint saves; unset: once per epoch"
    )
    tr.add_argument(
        "--resume", default=None, help="continue from this checkpoint: only the steps it has not done yet run"
    )
    tr.add_argument(
        "--log-every",
        type=positive_int,
        default=None,
        help="steps between progress lines when the output is not a terminal (a terminal gets a "
        "progress bar); unset: once per epoch",
    )
    tr.add_argument("--min-accuracy", type=non_negative_float, default=0.0, help="exit 1 below this held-out accuracy")
    tr.set_defaults(fn=cmd_train)

    b = sub.add_parser(
        "bench",
        help="benchmarks (GPU timestamps; beside PyTorch CUDA when available)",
        formatter_class=fmt,
        description="GPU-timestamp benchmarks (transfer: wall-clock time of host <-> device copies). On a CPU "
        "adapter (lavapipe) sizes and repetitions are scaled down.",
    )
    b.add_argument("what", choices=["gemm", "adamw", "train", "gpt", "transfer", "ddp", "all"])
    b.add_argument("--adapter", default=None, help=ADAPTER_HELP)
    b.add_argument("--quick", action="store_true", help="fewer shapes, repetitions and warm-up")
    b.add_argument("--json", default=None, help="write results here")
    b.add_argument(
        "--shapes",
        type=gemm_shapes,
        default=None,
        help="GEMM shapes MxKxN[:NN|NT|TN|TT],... each dimension >= 1; unset: the standard set",
    )
    b.add_argument(
        "--sizes",
        type=transfer_sizes,
        default=None,
        help="transfer: sizes such as 64K,1M,1G (K, M, G: KiB, MiB, GiB; no suffix: MiB); unset: 1 MiB .. 1 GiB "
        "(1-16 MiB on a CPU adapter)",
    )
    b.add_argument("--no-baseline", action="store_true", help="skip the PyTorch/cuBLAS columns (A/B experiments)")
    b.add_argument(
        "--dtype",
        choices=["float32", "float16"],
        default="float32",
        help="gemm: operand type; float16 rows also show our float32 GEMM, cuBLAS fp32 and torch fp16 on the "
        "shape and both float16 products' error against float64 (PYWGTRAIN_GEMM_F16_FMA=1: f16 FMAs per K tile)",
    )
    b.add_argument(
        "--sweep",
        action="store_true",
        help="gemm: the linear-layer grid (rows 1..8192 x common layer widths x forward/dX/dW modes); "
        "bench/sweep_heatmap.py draws the time ratios to cuBLAS",
    )
    b.add_argument(
        "--gpus",
        default=None,
        help="ddp: process counts to run, one process per GPU, e.g. 1,2,4; unset: 1, 2 and 4 as far as "
        "there are GPUs (1,2 on a CPU adapter, whose processes share it)",
    )
    b.add_argument(
        "--config",
        default=None,
        choices=["tiny", "gpt2"],
        help="ddp: the GPT; unset: gpt2 (GPT-2 small), tiny on a CPU adapter",
    )
    b.add_argument(
        "--accumulate", type=positive_int, default=8, help="ddp: micro-batches per step (also run: 1, no accumulation)"
    )
    b.add_argument("--no-overlap", action="store_true", help="ddp: reduce only after backward (no bucket overlap)")
    b.add_argument("--compression", default=None, choices=["fp16"], help="ddp: gradient compression")
    b.add_argument(
        "--host-reduction",
        default="shm",
        choices=["shm", "gloo"],
        help="ddp: how the processes of one host average gradients (shared memory, or all through gloo)",
    )
    b.add_argument("--bucket-cap-mb", type=non_negative_float, default=25.0, help="ddp: gradient bucket size")
    b.add_argument("--timeout", type=positive_int, default=1200, help="ddp: seconds allowed per process group")
    b.set_defaults(fn=cmd_bench)
    return p


def _exit_code(e):
    """Exit status for an exception the CLI reports in one line; None: not ours to hide (a bug: traceback)."""
    try:
        from .._core import GpuError
    except ImportError:
        GpuError = ()
    if GpuError and isinstance(e, GpuError):
        return EXIT_RUNTIME
    if isinstance(e, (ValueError, TypeError)):
        return EXIT_USAGE
    if isinstance(e, (OSError, RuntimeError, ImportError)):
        return EXIT_RUNTIME
    return None


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)  # bad arguments: usage and exit 2
    try:
        return args.fn(args) or 0
    except KeyboardInterrupt:
        print("pywgtrain: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as e:
        code = _exit_code(e)
        if code is None or os.environ.get("PYWGTRAIN_TRACEBACK"):
            raise
        message = str(e) or type(e).__name__
        if isinstance(e, ImportError) and getattr(e, "name", None) in ("sklearn", "matplotlib", "tqdm"):
            message += " (pywgtrain train needs its extras: pip install 'pywgtrain[train]')"
        print(f"pywgtrain: error: {message}", file=sys.stderr)
        if _no_adapter(e):
            print(driver_help(), file=sys.stderr)
        return code
