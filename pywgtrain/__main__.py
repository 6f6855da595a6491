"""Command line: ``python -m pywgtrain {info,train,bench}``."""
import argparse
import sys


def cmd_info(args):
    import pywgtrain as pw

    adapters = pw.list_adapters()
    for a in adapters:
        print(f"[{a['index']}] {a['name']} ({a['backend']}, {a['adapter_type']}) driver: {a['driver']}")
    dev = pw.Device(args.adapter)
    print(f"\nselected: {dev.name}")
    for key in ("backend", "adapter_type", "vendor", "architecture", "driver", "vendor_id", "device_id",
                "subgroup_min_size", "subgroup_max_size"):
        print(f"  {key}: {dev.info[key]}")
    print("limits:")
    for k, v in dev.limits.items():
        print(f"  {k}: {v}")
    print("features: " + (", ".join(dev.features) or "(none)"))


def cmd_train(args):
    from .train import run_demo

    result = run_demo(hidden=tuple(args.hidden), batch_size=args.batch_size, epochs=args.epochs, steps=args.steps,
                      lr=args.lr, weight_decay=args.weight_decay, seed=args.seed, adapter=args.adapter,
                      activation=args.activation, max_grad_norm=args.max_grad_norm, plot=args.plot,
                      checkpoint=args.checkpoint, resume=args.resume, steps_per_submit=args.steps_per_submit)
    return 0 if result["accuracy"] >= args.min_accuracy else 1


def cmd_bench(args):
    from . import bench

    return bench.main(args)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m pywgtrain", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)

    info = sub.add_parser("info", help="adapter, backend, driver, limits, features")
    info.add_argument("--adapter", default=None, help="index or name substring (default: $PYWGTRAIN_ADAPTER or best)")
    info.set_defaults(fn=cmd_info)

    tr = sub.add_parser("train", help="train an MLP classifier on scikit-learn's digits")
    tr.add_argument("--hidden", type=int, nargs="+", default=[256, 256], help="hidden layer sizes")
    tr.add_argument("--batch-size", type=int, default=64)
    tr.add_argument("--epochs", type=int, default=30)
    tr.add_argument("--steps", type=int, default=None, help="overrides --epochs")
    tr.add_argument("--lr", type=float, default=1e-3)
    tr.add_argument("--weight-decay", type=float, default=1e-2)
    tr.add_argument("--max-grad-norm", type=float, default=1.0)
    tr.add_argument("--activation", default="gelu", choices=["relu", "gelu", "gelu_tanh", "silu"])
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--steps-per-submit", type=int, default=8,
                    help="replayed steps grouped into one GPU submission (1: one per step)")
    tr.add_argument("--adapter", default=None)
    tr.add_argument("--plot", default="loss_curve.png", help="loss-curve PNG path ('' to skip)")
    tr.add_argument("--checkpoint", default=None, help="save model+optimizer here (.npz) at the end")
    tr.add_argument("--resume", default=None, help="continue from this checkpoint")
    tr.add_argument("--min-accuracy", type=float, default=0.0, help="exit 1 below this held-out accuracy")
    tr.set_defaults(fn=cmd_train)

    b = sub.add_parser("bench", help="benchmarks (GPU timestamps; beside PyTorch CUDA when available)")
    b.add_argument("what", choices=["gemm", "adamw", "train", "all"])
    b.add_argument("--adapter", default=None)
    b.add_argument("--quick", action="store_true", help="fewer shapes and repetitions")
    b.add_argument("--json", default=None, help="write results here")
    b.add_argument("--shapes", default=None, help="GEMM shapes MxKxN[:NT],... (default: the standard set)")
    b.add_argument("--no-baseline", action="store_true", help="skip the PyTorch/cuBLAS columns (A/B experiments)")
    b.set_defaults(fn=cmd_bench)

    args = p.parse_args(argv)
    return args.fn(args) or 0


if __name__ == "__main__":
    sys.exit(main())
