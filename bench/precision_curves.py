"""Loss curves of `pywgtrain gpt` runs on one plot: reads the logs the runs
printed ("step N/M: loss L, ... tok/s[, val V]") and draws each run's training
loss (thin) and validation loss (dots), labelled by name; prints the final
validation losses and their relative difference to the first run's.
Usage: python bench/precision_curves.py OUT.png NAME=LOG [NAME=LOG ...]"""

import re
import sys

LINE = re.compile(r"step (\d+)/\d+: loss ([0-9.]+)[^\n]*?(?:val ([0-9.]+))?$")


def read(path):
    train, val = [], []
    with open(path) as f:
        for line in f:
            m = LINE.search(line.strip())
            if m:
                step = int(m.group(1))
                train.append((step, float(m.group(2))))
                if m.group(3):
                    val.append((step, float(m.group(3))))
    if not val:
        raise SystemExit(f"{path}: no validation losses found (run with --eval-every)")
    return train, val


def main():
    if len(sys.argv) < 3 or any("=" not in a for a in sys.argv[2:]):
        raise SystemExit(__doc__)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [(a.split("=", 1)[0], *read(a.split("=", 1)[1])) for a in sys.argv[2:]]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (name, train, val) in enumerate(runs):
        color = f"C{i}"
        ax.plot([s for s, _ in train], [v for _, v in train], lw=0.8, alpha=0.6, color=color, label=f"{name} train")
        ax.plot([s for s, _ in val], [v for _, v in val], "o-", ms=3, lw=1.5, color=color, label=f"{name} validation")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats per byte)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(sys.argv[1], dpi=120)
    first = runs[0][2][-1][1]
    for name, _, val in runs:
        step, v = val[-1]
        print(f"{name}: final validation loss {v:.4f} at step {step} ({(v - first) / first:+.2%} vs {runs[0][0]})")


if __name__ == "__main__":
    main()
