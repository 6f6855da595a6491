"""The digits demo behind ``pywgtrain train``: an MLP classifier trained on
scikit-learn's bundled 8x8 digits (offline) with :class:`pywgtrain.train.Trainer`.

Output paths are checked before any training; the checkpoint (``checkpoint=``)
is saved every ``save_every`` steps, at the end, and on Ctrl-C; ``resume=``
runs only the steps the checkpoint has not done yet, on the same data order
an uninterrupted run would have used.
"""

import os
import signal
import sys
import threading
import time

import numpy as np

from .. import nn, optim
from ..benchmarks.common import check_output_path
from ..device import Device
from ..tensor import tensor
from ..train import Trainer

READ_EVERY = 20  # losses are read back (a GPU wait) at least this often


def predict(model, x, batch_size=1024):
    model.eval()
    try:
        out = [
            model(tensor(np.ascontiguousarray(x[i : i + batch_size]), model.device)).numpy()
            for i in range(0, len(x), batch_size)
        ]
    finally:
        model.train()
    return np.concatenate(out)


def load_digits_split(seed):
    """scikit-learn's bundled 8x8 digits (offline), standardized, 80/20 split."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x = d.data.astype(np.float32)
    y = d.target.astype(np.int32)
    idx = np.random.default_rng(seed).permutation(len(x))
    cut = int(0.8 * len(x))
    tr, te = idx[:cut], idx[cut:]
    mean, std = x[tr].mean(0), x[tr].std(0) + 1e-6
    x = (x - mean) / std
    return x[tr], y[tr], x[te], y[te]


def check_plot_path(plot):
    """check_output_path, and an extension matplotlib can write."""
    check_output_path(plot, "--plot")
    ext = os.path.splitext(plot or "")[1][1:].lower()
    if ext:
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        supported = FigureCanvasAgg.get_supported_filetypes()
        if ext not in supported:
            raise ValueError(
                f"--plot {plot!r}: matplotlib cannot write .{ext} files; "
                f"use one of {', '.join('.' + e for e in sorted(supported))}"
            )


def _check_count(value, name, allow_none=False):
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


class _StopOnInterrupt:
    """While active (main thread only): the first Ctrl-C (SIGINT) only sets
    ``requested``, so the loop stops at the next step boundary with a
    consistent model and optimizer to save; a second Ctrl-C raises
    KeyboardInterrupt at once. A SIGINT that is ignored stays ignored."""

    def __init__(self):
        self.requested = False
        self._previous = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            previous = signal.getsignal(signal.SIGINT)
            if previous is not signal.SIG_IGN:
                self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame):
        # Only a flag: printing from a signal handler can collide with the
        # progress output being written at that moment.
        self.requested = True
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def __exit__(self, *exc):
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None
        return False


def run_demo(
    hidden=(256, 256),
    batch_size=64,
    epochs=30,
    steps=None,
    lr=1e-3,
    weight_decay=1e-2,
    seed=0,
    adapter=None,
    activation="gelu",
    max_grad_norm=1.0,
    log_every=None,
    plot="loss_curve.png",
    checkpoint=None,
    resume=None,
    steps_per_submit=8,
    save_every=None,
    progress=None,
):
    """Train and evaluate; returns a dict with ``accuracy`` (None when
    interrupted), ``losses`` [(step, loss)], ``ms_per_step``, ``interrupted``,
    ``step`` (steps done, counting those of a resumed checkpoint) and ``total``.

    ``steps`` overrides ``epochs``. ``checkpoint``: saved every ``save_every``
    steps (default: once per epoch), at the end and on Ctrl-C. ``resume``: a
    checkpoint to continue from; only the remaining steps of ``total`` run.
    ``progress``: "bar" (tqdm), "lines" (a plain line every ``log_every``
    steps, default once per epoch) or None: the bar when stdout and stderr
    are terminals, lines otherwise (logs get no carriage-return floods)."""
    hidden = tuple(hidden)
    for h in hidden:
        _check_count(h, "hidden layer size")
    _check_count(batch_size, "batch_size")
    _check_count(epochs, "epochs")
    _check_count(steps, "steps", allow_none=True)
    _check_count(save_every, "save_every", allow_none=True)
    _check_count(log_every, "log_every", allow_none=True)
    if progress not in (None, "bar", "lines"):
        raise ValueError(f"progress must be None, 'bar' or 'lines', got {progress!r}")
    check_output_path(checkpoint, "--checkpoint")
    check_plot_path(plot)
    if resume and not os.path.isfile(resume):
        raise ValueError(f"--resume {resume!r}: no such file")

    xtr, ytr, xte, yte = load_digits_split(seed)
    if batch_size > len(xtr):
        raise ValueError(f"batch size {batch_size} is larger than the {len(xtr)} training samples")
    per_epoch = len(xtr) // batch_size
    total = steps if steps is not None else epochs * per_epoch
    save_every = save_every or per_epoch
    log_every = log_every or per_epoch

    dev = Device(adapter)
    sizes = [xtr.shape[1], *hidden, 10]
    model = nn.MLP(sizes, activation=activation, device=dev, seed=seed)
    opt = optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, max_grad_norm=max_grad_norm)
    trainer = Trainer(model, opt, nn.CrossEntropyLoss(), steps_per_submit=steps_per_submit)
    start = 0
    if resume:
        trainer.load(resume)
        start = trainer.step_count
    print(f"adapter: {dev.name} ({dev.backend}, {dev.info['driver']})")
    print(
        f"model: MLP {sizes} ({activation}), {sum(p.numel() for p in model.parameters())} parameters; "
        f"data: digits {len(xtr)} train / {len(xte)} held out; {total} steps of batch {batch_size}"
    )
    if resume:
        left = max(total - start, 0)
        print(
            f"resumed from {resume} at step {start}: {left} of {total} steps left"
            + ("" if left else " (nothing to train)")
        )
    sys.stdout.flush()

    # The data order of an uninterrupted run: one permutation per epoch from
    # one generator, so a resumed run replays the permutations of the epochs
    # before its first step and continues exactly where the checkpoint left off.
    rng = np.random.default_rng(seed + 1)
    order, order_epoch = rng.permutation(len(xtr)), 0
    losses, pending = [], []
    s = start
    t0, timed_from = None, start
    use_bar = progress == "bar" or (progress is None and sys.stdout.isatty() and sys.stderr.isatty())
    bar = None

    def read_losses():
        for step, loss in pending:
            losses.append((step, loss.item()))
        pending.clear()

    with _StopOnInterrupt() as stop:
        while s < total and not stop.requested:
            epoch = s // per_epoch
            while order_epoch < epoch:
                order, order_epoch = rng.permutation(len(xtr)), order_epoch + 1
            i = s % per_epoch
            b = order[i * batch_size : (i + 1) * batch_size]
            first = s == start
            if first:
                print("compiling kernels (first step)...", end=" ", flush=True)
                tc = time.perf_counter()
            pending.append((trainer.step_count, trainer.step(xtr[b], ytr[b])))
            s += 1
            if first:
                read_losses()  # waits for the step, compilation included
                print(f"done in {time.perf_counter() - tc:.1f} s", flush=True)
                t0, timed_from = time.perf_counter(), s
                if use_bar:
                    from tqdm import tqdm

                    bar = tqdm(total=total, initial=start, desc="train", unit="step")
            log_now = s % log_every == 0 or s == total
            if s % READ_EVERY == 0 or log_now or s % save_every == 0 or stop.requested:
                read_losses()
            if bar is not None:
                bar.update(1)
                if losses:
                    bar.set_postfix(loss=f"{losses[-1][1]:.4f}", refresh=False)
            elif log_now:
                rate = ""
                if s > timed_from:
                    rate = f", {(time.perf_counter() - t0) / (s - timed_from) * 1e3:.2f} ms/step"
                print(
                    f"step {s}/{total} (epoch {(s - 1) // per_epoch + 1}): loss {losses[-1][1]:.4f}{rate}", flush=True
                )
            if checkpoint and s % save_every == 0 and s < total and not stop.requested:
                trainer.save(checkpoint)
        read_losses()
        elapsed = time.perf_counter() - t0 if t0 is not None else 0.0
        if bar is not None:
            bar.close()
        interrupted = stop.requested and s < total
        ms_per_step = elapsed / (s - timed_from) * 1e3 if s > timed_from else None
        result = {
            "accuracy": None,
            "losses": losses,
            "ms_per_step": ms_per_step,
            "interrupted": interrupted,
            "step": s,
            "total": total,
        }
        if interrupted:
            print(f"interrupted at step {s} of {total}", flush=True)
        # Saved while a first Ctrl-C is still only a request: never half a step, never half a file.
        if checkpoint and (interrupted or s > start):
            trainer.save(checkpoint)
            print(f"checkpoint: {checkpoint} (step {s})", flush=True)
    if interrupted:
        return result

    acc = float(np.mean(np.argmax(predict(model, xte), 1) == yte))
    result["accuracy"] = acc
    summary = f"held-out accuracy {acc * 100:.2f}% ({len(xte)} samples)"
    if losses:
        summary = f"final loss {losses[-1][1]:.4f}; " + summary
    if ms_per_step is not None:
        summary += (
            f"; {ms_per_step:.2f} ms/step over {s - timed_from} steps "
            "(not counting the first, which compiled the kernels)"
        )
    print(summary)
    if plot and losses:
        _plot(plot, losses, dev, acc)
        print(f"loss curve: {plot}")
    sys.stdout.flush()
    return result


def _plot(path, losses, dev, acc):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([s for s, _ in losses], [v for _, v in losses], lw=1)
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy loss")
    ax.set_yscale("log")
    ax.set_title(f"pywgtrain MLP on digits ({dev.name[:40]})\nheld-out accuracy {acc * 100:.1f}%", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
