"""Smoke test of an installed pywgtrain (a wheel): import, GEMM against NumPy,
a few training steps of a tiny GPT, a safetensors checkpoint round trip.

Run it from an empty directory with the environment's interpreter, so the
source checkout (which has no compiled extension) does not shadow the
installed package:

    cd "$(mktemp -d)" && /path/to/venv/bin/python /path/to/scripts/wheel_smoke.py

CI (.ci/run) runs it against the manylinux wheel from scripts/wheel.sh with no
compiler or cmake on PATH; cibuildwheel's test-command runs it too. Needs a
WebGPU adapter (on Linux without a GPU: Mesa's lavapipe). Exits non-zero on
any failed check.
"""

import importlib.metadata
import math
import os
import sys
import tempfile

import numpy as np

import pywgtrain as pw
from pywgtrain.models import GPT, GPTConfig
from pywgtrain.train import Trainer


def check_installed():
    here = os.path.dirname(os.path.abspath(pw.__file__))
    assert "site-packages" in here or "dist-packages" in here, f"pywgtrain imported from {here}, not an installation"
    assert pw.__version__ == importlib.metadata.version("pywgtrain"), (
        pw.__version__,
        importlib.metadata.version("pywgtrain"),
    )
    adapters = pw.list_adapters()
    assert adapters, "no WebGPU adapter (on Linux, install Mesa's Vulkan driver: mesa-vulkan-drivers)"
    print(f"pywgtrain {pw.__version__} from {here}; adapters: {len(adapters)}")


def check_gemm(dev):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((67, 45)).astype(np.float32)
    b = rng.standard_normal((67, 33)).astype(np.float32)
    c = rng.standard_normal((45, 33)).astype(np.float32)
    got = pw.gemm(pw.tensor(a, dev), b, trans_a=True, alpha=0.5, beta=2.0, out=pw.tensor(c, dev)).numpy()
    ref = 0.5 * a.astype(np.float64).T @ b.astype(np.float64) + 2.0 * c.astype(np.float64)
    assert got.shape == ref.shape and got.dtype == np.float32, (got.shape, got.dtype)
    err = np.abs(got - ref).max() / np.abs(ref).max()
    assert err < 1e-4, f"GEMM relative error {err:.2e} against the float64 reference"
    print(f"gemm 0.5 * A.T @ B + 2 C (67x45x33): max relative error {err:.1e}")


def tiny_gpt(dev, seed):
    cfg = GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32)
    model = GPT(cfg, device=dev, seed=seed)
    opt = pw.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    return model, Trainer(model, opt, GPT.loss)


def check_training_and_checkpoint(dev, tmp):
    model, trainer = tiny_gpt(dev, seed=0)
    vocab, t = model.config.vocab_size, model.config.block_size
    # Counting sequences mod vocab: the next token is the current one plus one, learnt in a few steps.
    starts = np.arange(8).reshape(8, 1) * 7
    seq = (starts + np.arange(t + 1)) % vocab
    x, y = seq[:, :-1].astype(np.int32), seq[:, 1:].astype(np.int32)
    losses = [trainer.step(x, y).item() for _ in range(12)]
    assert all(math.isfinite(v) for v in losses), losses
    assert abs(losses[0] - math.log(vocab)) < 0.5, f"first loss {losses[0]:.3f}, ln(vocab) = {math.log(vocab):.3f}"
    assert losses[-1] < losses[0] - 0.5 and losses[-1] < math.log(vocab), losses
    print(f"tiny GPT, 12 steps: loss {losses[0]:.3f} -> {losses[-1]:.3f} (ln {vocab} = {math.log(vocab):.3f})")

    path = os.path.join(tmp, "ckpt.safetensors")
    trainer.save(path)
    with open(path, "rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
        assert f.read(1) == b"{" and 0 < header_len < os.path.getsize(path), "not a safetensors file"
    fresh, fresh_trainer = tiny_gpt(dev, seed=1)  # other initial weights
    before, trained = fresh.state_dict(), model.state_dict()
    assert any(not np.array_equal(before[k], trained[k]) for k in trained), "the fresh model already matches"
    fresh_trainer.load(path)
    loaded = fresh.state_dict()
    assert list(loaded) == list(trained), (list(loaded), list(trained))
    for k, v in trained.items():
        assert loaded[k].dtype == v.dtype and loaded[k].shape == v.shape, k
        assert np.array_equal(loaded[k], v), f"{k} differs after the checkpoint round trip"
    assert fresh_trainer.step_count == trainer.step_count == 12
    # The restored model computes what the trained one does.
    assert np.array_equal(fresh(x).numpy(), model(x).numpy()), "logits differ after loading the checkpoint"
    print(f"safetensors checkpoint: {len(trained)} parameters identical after save and load")


def main():
    assert not os.path.exists(os.path.join(os.getcwd(), "pywgtrain", "__init__.py")), (
        "run from a directory without a pywgtrain/ source tree"
    )
    check_installed()
    dev = pw.Device()
    check_gemm(dev)
    with tempfile.TemporaryDirectory() as tmp:
        check_training_and_checkpoint(dev, tmp)
    print("wheel smoke: ok")


if __name__ == "__main__":
    sys.exit(main())
