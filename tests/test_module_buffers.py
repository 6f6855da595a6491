"""Module buffers as torch's (register_buffer, persistent or not, state_dict order and
loading, reassignment), apply / get_submodule / get_parameter / get_buffer, and Trainer
following a buffer that is replaced between steps."""

import numpy as np
import pytest

import pywgtrain as pw
from pywgtrain.train import Trainer

torch = pytest.importorskip("torch")


class Masked(pw.nn.Module):
    def __init__(self, dev, torch_twin=False):
        super().__init__()
        self.fc = pw.nn.Linear(4, 3, device=dev, seed=0)
        self.register_buffer("scale", pw.tensor(np.array([1.0, 2.0, 3.0], np.float32), dev))
        self.register_buffer("steps", pw.tensor(np.array([7], np.int32), dev))
        self.register_buffer("cache", pw.tensor(np.zeros(2, np.float32), dev), persistent=False)

    def forward(self, x):
        return self.fc(x) * self.scale


class TorchMasked(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)
        self.register_buffer("scale", torch.tensor([1.0, 2.0, 3.0]))
        self.register_buffer("steps", torch.tensor([7], dtype=torch.int32))
        self.register_buffer("cache", torch.zeros(2), persistent=False)


def test_buffers_like_torch(dev):
    m = Masked(dev)
    assert list(m.state_dict()) == list(TorchMasked().state_dict())  # ['fc.weight', 'fc.bias', 'scale', 'steps']
    assert [n for n, _ in m.named_buffers()] == ["scale", "steps", "cache"]
    assert len(m.buffers()) == 3 and m.get_buffer("scale") is m.scale
    sd = m.state_dict()
    sd["scale"] = np.array([4.0, 5.0, 6.0], np.float32)
    sd["steps"] = np.array([9], np.int64)
    m.load_state_dict(sd)
    np.testing.assert_array_equal(m.scale.numpy(), [4, 5, 6])
    assert m.steps.numpy().tolist() == [9] and m.steps.dtype == np.int32
    with pytest.raises(TypeError, match="steps has dtype float32, expected int32"):
        m.load_state_dict(sd | {"steps": np.array([1.5], np.float32)})
    with pytest.raises(ValueError, match="outside int32"):
        m.load_state_dict(sd | {"steps": np.array([2**40])})
    m.scale = pw.tensor(np.ones(3, np.float32), dev)  # stays a buffer
    assert m.get_buffer("scale") is m.scale and "scale" in m.state_dict()
    with pytest.raises(TypeError, match="buffer 'scale'"):
        m.scale = 3
    with pytest.raises(KeyError, match="already exists"):
        m.register_buffer("fc", pw.tensor(np.ones(1, np.float32), dev))
    assert m.get_parameter("fc.weight") is m.fc.weight and m.get_submodule("fc") is m.fc
    with pytest.raises(AttributeError, match="no submodule"):
        m.get_submodule("nope")
    names = []
    m.apply(lambda mod: names.append(type(mod).__name__))
    assert names == ["Linear", "Masked"]


def test_trainer_follows_a_replaced_buffer(dev):
    """A captured step reads a buffer's memory: replacing the buffer must not replay the old one."""
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((8, 4)).astype(np.float32), rng.integers(0, 3, 8)
    losses = []
    for trainer in (True, False):
        m = Masked(dev)
        opt = pw.optim.SGD(m.parameters(), lr=0.0)  # weights fixed: losses depend on the buffer only
        loss_fn = pw.nn.CrossEntropyLoss()
        tr = Trainer(m, opt, loss_fn)
        run = []
        for step in range(4):
            if step == 3:
                m.scale = pw.tensor(np.array([-5.0, 0.0, 5.0], np.float32), dev)
            run.append(tr.step(x, y).item() if trainer else loss_fn(m(x), y).item())
        losses.append(run)
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-6)
    assert losses[0][3] != losses[0][2]
