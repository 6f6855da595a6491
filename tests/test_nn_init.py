"""nn.init as torch.nn.init: gains and fans equal to torch's, bounds and spreads of the
draws, reproducibility through pywgtrain.manual_seed, in place without a recorded gradient."""

import math

import numpy as np
import pytest

import pywgtrain as pw
from pywgtrain.nn import init

torch = pytest.importorskip("torch")


@pytest.mark.parametrize(
    "nl,param", [("linear", None), ("sigmoid", None), ("tanh", None), ("relu", None), ("leaky_relu", None),
                 ("leaky_relu", 0.2), ("selu", None), ("conv2d", None)],
)  # fmt: skip
def test_calculate_gain_like_torch(nl, param):
    assert init.calculate_gain(nl, param) == pytest.approx(torch.nn.init.calculate_gain(nl, param))


@pytest.mark.parametrize("shape", [(64, 32), (16, 8, 3, 3)])
def test_fans_and_spreads_like_torch(dev, shape):
    t = pw.empty(shape, device=dev)
    ref = torch.empty(shape)
    assert init._calculate_fan_in_and_fan_out(t) == torch.nn.init._calculate_fan_in_and_fan_out(ref)
    fan_in, fan_out = init._calculate_fan_in_and_fan_out(t)
    cases = [
        (init.xavier_uniform_, {"gain": 1.5}, math.sqrt(6 / (fan_in + fan_out)) * 1.5, "uniform"),
        (init.kaiming_uniform_, {"a": math.sqrt(5)}, math.sqrt(3) * math.sqrt(2 / 6) / math.sqrt(fan_in), "uniform"),
        (init.xavier_normal_, {}, math.sqrt(2 / (fan_in + fan_out)), "normal"),
        (init.kaiming_normal_, {"mode": "fan_out", "nonlinearity": "relu"}, math.sqrt(2 / fan_out), "normal"),
    ]
    for fn, kw, spread, kind in cases:
        v = fn(t, **kw, generator=np.random.default_rng(0)).numpy()
        if kind == "uniform":  # bound = spread; the std of U(-b, b) is b / sqrt(3)
            assert np.abs(v).max() <= spread * (1 + 1e-6) and np.abs(v).max() > 0.95 * spread
            assert v.std() == pytest.approx(spread / math.sqrt(3), rel=0.1)
        else:
            assert v.std() == pytest.approx(spread, rel=0.1)


def test_fills_and_truncation(dev):
    t = pw.empty((300, 200), device=dev)
    v = init.trunc_normal_(t, mean=0.5, std=1.0, a=-0.5, b=1.0).numpy()
    assert v.min() >= -0.5 and v.max() <= 1.0 and v.std() > 0.3
    assert (init.constant_(t, 0.25).numpy() == 0.25).all()
    assert not init.zeros_(t).numpy().any() and (init.ones_(t).numpy() == 1).all()
    np.testing.assert_array_equal(init.eye_(pw.empty((3, 5), device=dev)).numpy(), torch.eye(3, 5).numpy())
    v = init.uniform_(t, -2.0, -1.0).numpy()
    assert v.min() >= -2.0 and v.max() <= -1.0
    with pytest.raises(ValueError, match="fewer than 2"):
        init.xavier_uniform_(pw.empty((5,), device=dev))
    with pytest.raises(ValueError, match="Mode"):
        init.kaiming_uniform_(t, mode="fan_avg")


def test_seeded_in_place_without_gradient(dev):
    """The weights of a module re-initialized in place (views follow, no graph), the draws
    repeated after manual_seed, different on the next call."""
    lin = pw.nn.Linear(8, 4, device=dev)
    weight = lin.weight
    pw.manual_seed(5)
    a = init.normal_(lin.weight, std=0.02).numpy()
    b = init.normal_(lin.weight, std=0.02).numpy()
    pw.manual_seed(5)
    c = init.normal_(lin.weight, std=0.02).numpy()
    np.testing.assert_array_equal(a, c)
    assert not np.array_equal(a, b)
    assert lin.weight is weight and lin.weight.grad_fn is None and lin.weight.requires_grad
    lin.apply(lambda m: init.zeros_(m.bias) if isinstance(m, pw.nn.Linear) else None)
    assert not lin.bias.numpy().any()
