"""safetensors checkpoints: files the official reader opens, files it wrote
that we read, and a resumed GPT run whose next step is bit-identical."""

import numpy as np
import pytest

import pywgtrain as pw
from pywgtrain.models import GPT, GPTConfig
from pywgtrain.serialization import read_safetensors, write_safetensors
from pywgtrain.train import Trainer

CFG = GPTConfig(vocab_size=50, block_size=16, n_layer=2, n_head=2, n_embd=16, dropout=0.1)


def test_round_trip_and_the_official_reader(tmp_path, rng):
    st = pytest.importorskip("safetensors.numpy")
    arrays = {
        "a": rng.standard_normal((3, 5)).astype(np.float32),
        "ids": np.arange(7, dtype=np.int32),
        "state": np.array([1, 2, 3, 4], np.uint32),
        "empty_dim": np.zeros((2, 1), np.float32),
    }
    path = tmp_path / "x.safetensors"
    with open(path, "wb") as f:
        write_safetensors(f, arrays, {"note": "hello"})
    theirs = st.load_file(str(path))
    ours, meta = read_safetensors(path)
    assert meta == {"note": "hello"}
    for k, v in arrays.items():
        np.testing.assert_array_equal(theirs[k], v)
        np.testing.assert_array_equal(ours[k], v)
        assert ours[k].dtype == v.dtype
    other = tmp_path / "y.safetensors"
    st.save_file(arrays, str(other))
    back, _ = read_safetensors(other)
    for k, v in arrays.items():
        np.testing.assert_array_equal(back[k], v)
    (tmp_path / "bad.safetensors").write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{oops")
    with pytest.raises(ValueError, match="not a safetensors file"):
        read_safetensors(tmp_path / "bad.safetensors")


def _trainer(dev, seed=0):
    model = GPT(CFG, device=dev, seed=seed)
    opt = pw.optim.AdamW(model.parameters(), lr=3e-3, max_grad_norm=1.0)
    return Trainer(model, opt, GPT.loss, steps_per_submit=2)


def test_resumed_gpt_step_is_bit_identical(dev, rng, tmp_path):
    """Dropout on: the checkpoint carries the RNG state, so masks continue too."""
    data = rng.integers(0, 50, (8, 4, 17)).astype(np.int32)
    pw.manual_seed(123, dev)
    straight = _trainer(dev)
    want = [straight.step(d[:, :-1], d[:, 1:]).item() for d in data]
    pw.manual_seed(123, dev)
    first = _trainer(dev)
    for d in data[:5]:
        first.step(d[:, :-1], d[:, 1:])
    path = tmp_path / "run.safetensors"
    first.save(path)
    pw.manual_seed(999, dev)  # a different state: the checkpoint must restore it
    resumed = _trainer(dev, seed=7)  # different initial weights: the checkpoint must replace them
    resumed.load(path)
    got = [resumed.step(d[:, :-1], d[:, 1:]).item() for d in data[5:]]
    assert got == want[5:]
    for (n, p), (_, q) in zip(straight.model.named_parameters(), resumed.model.named_parameters()):
        np.testing.assert_array_equal(p.numpy(), q.numpy(), err_msg=n)


def test_checkpoint_of_another_architecture_is_refused(dev, tmp_path):
    t = _trainer(dev)
    path = tmp_path / "a.safetensors"
    t.save(path)
    other = GPT(GPTConfig(vocab_size=50, block_size=16, n_layer=3, n_head=2, n_embd=16), device=dev)
    o = Trainer(other, pw.optim.AdamW(other.parameters()), GPT.loss)
    before = other.state_dict()
    with pytest.raises(ValueError, match="another model"):
        o.load(path)
    for k, v in other.state_dict().items():
        np.testing.assert_array_equal(v, before[k])
    npz = tmp_path / "a.npz"
    t.save(npz)  # the .npz format still loads
    t2 = _trainer(dev, seed=3)
    t2.load(npz)
    for (n, p), (_, q) in zip(t.model.named_parameters(), t2.model.named_parameters()):
        np.testing.assert_array_equal(p.numpy(), q.numpy(), err_msg=n)


def test_generate_uses_the_cache_consistently(dev, rng):
    """Greedy generation with the KV cache equals recomputing the full
    forward for every token, while the sequence fits the context."""
    model = GPT(GPTConfig(vocab_size=50, block_size=16, n_layer=2, n_head=2, n_embd=16), device=dev, seed=1)
    ids = rng.integers(0, 50, (2, 5))
    out = model.generate(ids, 11, temperature=0.0)
    ref = ids.copy()
    for _ in range(11):
        ref = np.concatenate([ref, model(ref).numpy()[:, -1].argmax(-1)[:, None]], 1)
    np.testing.assert_array_equal(out, ref)
    assert model.generate(ids, 30, temperature=1.0, top_k=5, seed=0).shape == (2, 35)  # past the context
    assert model.generate(np.zeros((1, 17), np.int64), 1).shape == (1, 18)  # prompt cropped to the context
    with pytest.raises(ValueError, match=r"\[0, 50\)"):
        model.generate(np.array([[50]]), 1)
