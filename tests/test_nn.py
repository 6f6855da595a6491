import math

import numpy as np
import pytest

import pywgtrain as pw
from helpers import assert_close, bias_residual, poisoned, rand, switched_device

ERF = np.vectorize(math.erf)


def act_ref(name, z):
    if name is None:
        return z, np.ones_like(z)
    if name == "relu":
        return np.maximum(z, 0), (z > 0).astype(np.float64)
    if name == "silu":
        s = 1 / (1 + np.exp(-z))
        return z * s, s * (1 + z * (1 - s))
    if name == "gelu":
        cdf = 0.5 * (1 + ERF(z / math.sqrt(2)))
        return z * cdf, cdf + z * np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
    if name == "gelu_tanh":
        c = math.sqrt(2 / math.pi)
        u = c * (z + 0.044715 * z**3)
        t = np.tanh(u)
        return 0.5 * z * (1 + t), 0.5 * (1 + t) + 0.5 * z * (1 - t * t) * c * (1 + 3 * 0.044715 * z * z)
    raise ValueError(name)


ACTS = [None, "relu", "gelu", "gelu_tanh", "silu"]


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("batch,fin,fout", [(1, 7, 33), (33, 129, 7), (130, 65, 257)])
def test_fused_linear_forward(dev, rng, act, batch, fin, fout):
    x, w, b = rand(rng, batch, fin), rand(rng, fout, fin), rand(rng, fout)
    z = x.astype(np.float64) @ w.T + b
    y = pw.linear(pw.tensor(x, dev), pw.tensor(w, dev), pw.tensor(b, dev), activation=act)
    assert_close(y.numpy(), act_ref(act, z)[0], atol_scale=3e-5)
    y2 = pw.linear(pw.tensor(x, dev), pw.tensor(w, dev), None, activation=act)  # no bias: GEMM, then the activation
    assert_close(y2.numpy(), act_ref(act, z - b)[0], atol_scale=3e-5)


@pytest.mark.parametrize("act", ACTS)
def test_linear_backward_batched(dev, rng, act):
    """[batch, M, K] input: dW and db sum over batch and rows; dX per element."""
    batch, m, fin, fout = 3, 11, 37, 19
    x, w, b, dy = rand(rng, batch, m, fin), rand(rng, fout, fin), rand(rng, fout), rand(rng, batch, m, fout)
    layer = pw.nn.Linear(fin, fout, activation=act, device=dev)
    with pw.no_grad():
        layer.weight.copy_(w)
        layer.bias.copy_(b)
    tx = pw.tensor(x, dev, requires_grad=True)
    y = layer(tx)
    y.backward(pw.tensor(dy, dev))
    z = x.astype(np.float64) @ w.T + b
    out, dact = act_ref(act, z)
    dz = dy * dact
    assert_close(y.numpy(), out, atol_scale=3e-5)
    assert_close(layer.weight.grad.numpy(), dz.reshape(-1, fout).T @ x.reshape(-1, fin), atol_scale=3e-5)
    assert_close(layer.bias.grad.numpy(), dz.reshape(-1, fout).sum(0), atol_scale=3e-5)
    assert_close(tx.grad.numpy(), dz @ w, atol_scale=3e-5)


@pytest.mark.parametrize("act", ["gelu", "silu"])
def test_mlp_backward_through_split_k_epilogues(dev, rng, act):
    """Layers whose GEMMs split K (few output tiles, K >= 512): the forward
    bias+activation and the backward activation derivative then run in the
    split-K reduce pass; the dX GEMM carries the lower layer's act'. All
    gradients against a float64 reference."""
    sizes, batch = [600, 64, 600, 3], 9
    model = pw.nn.MLP(sizes, activation=act, device=dev, seed=4)
    layers = list(model)
    ws = [(l.weight.numpy().astype(np.float64), l.bias.numpy().astype(np.float64)) for l in layers]
    x = rand(rng, batch, sizes[0])
    dlogits = rand(rng, batch, sizes[-1])
    out = model(x)
    out.backward(pw.tensor(dlogits, dev))
    # float64 reference
    h, zs, hs = x.astype(np.float64), [], []
    for i, (w, b) in enumerate(ws):
        hs.append(h)
        z = h @ w.T + b
        zs.append(z)
        h = act_ref(act, z)[0] if i < len(ws) - 1 else z
    assert_close(out.numpy(), h, atol_scale=1e-4)
    dz = dlogits.astype(np.float64)
    for i in reversed(range(len(ws))):
        layer = layers[i]
        assert_close(layer.weight.grad.numpy(), dz.T @ hs[i], atol_scale=1e-4)
        assert_close(layer.bias.grad.numpy(), dz.sum(0), atol_scale=1e-4)
        if i > 0:
            dz = (dz @ ws[i][0]) * act_ref(act, zs[i - 1])[1]


def test_grads_accumulate_until_zero_grad(dev, rng):
    layer = pw.nn.Linear(5, 4, device=dev, seed=1)
    x, dy = rand(rng, 6, 5), rand(rng, 6, 4)
    layer(x).backward(pw.tensor(dy, dev))
    g1 = layer.weight.grad.numpy()
    layer(x).backward(pw.tensor(dy, dev))
    assert_close(layer.weight.grad.numpy(), 2 * g1.astype(np.float64))
    layer.zero_grad()
    assert layer.weight.grad is None
    layer(x).backward(pw.tensor(dy, dev))
    assert_close(layer.weight.grad.numpy(), g1.astype(np.float64))


# 20000 rows: past the one-workgroup sums of the reductions.
@pytest.mark.parametrize("batch,classes", [(1, 1), (7, 10), (129, 33), (64, 1000), (20000, 3)])
def test_cross_entropy_and_grad(dev, rng, batch, classes):
    logits = 3 * rand(rng, batch, classes)
    labels = rng.integers(0, classes, batch)
    l64 = logits.astype(np.float64)
    mx = l64.max(1, keepdims=True)
    lse = mx[:, 0] + np.log(np.exp(l64 - mx).sum(1))
    loss = np.mean(lse - l64[np.arange(batch), labels])
    sm = np.exp(l64 - lse[:, None])
    sm[np.arange(batch), labels] -= 1
    x = pw.tensor(logits, dev, requires_grad=True)
    got = pw.cross_entropy(x, labels)
    assert got.shape == ()
    assert got.item() == pytest.approx(loss, rel=1e-5, abs=1e-6)
    got.backward()
    assert_close(x.grad.numpy(), sm / batch)


@pytest.mark.parametrize("shape", [(1,), (7, 33), (129, 5), (130, 200)])
def test_mse_and_grad(dev, rng, shape):
    p, t = rand(rng, *shape), rand(rng, *shape)
    d = p.astype(np.float64) - t
    x = pw.tensor(p, dev, requires_grad=True)
    got = pw.mse_loss(x, t)
    assert got.item() == pytest.approx(np.mean(d * d), rel=1e-5)
    got.backward()
    assert_close(x.grad.numpy(), 2 * d / d.size)


def test_cross_entropy_rejects_bad_labels(dev, rng):
    logits = pw.tensor(rand(rng, 4, 3), dev)
    with pytest.raises(ValueError, match=r"target must lie in \[0, 3\)"):
        pw.cross_entropy(logits, np.array([0, 1, 3, 0]))
    with pytest.raises(TypeError, match="target must hold integer"):
        pw.cross_entropy(logits, np.zeros(4, np.float32))
    with pytest.raises(ValueError, match=r"target has shape \(3,\)"):
        pw.cross_entropy(logits, np.array([0, 1, 2]))


def test_linear_init_matches_torch_bounds_and_seed():
    a = pw.nn.Linear(100, 50, seed=3)
    b = pw.nn.Linear(100, 50, seed=3)
    w = a.weight.numpy()
    np.testing.assert_array_equal(w, b.weight.numpy())
    assert np.abs(w).max() <= 1 / math.sqrt(100) and np.abs(w).max() > 0.09
    assert np.abs(a.bias.numpy()).max() <= 1 / math.sqrt(100)


def test_sequential_takes_any_module_and_fuses_activations(dev, rng):
    seq = pw.nn.Sequential(pw.nn.ReLU(), pw.nn.Linear(4, 5, device=dev, seed=0), pw.nn.GELU(), pw.nn.Tanh())
    assert [n for n, _ in seq.named_parameters()] == ["1.weight", "1.bias"]
    x = rand(rng, 3, 4)
    w, b = seq[1].weight.numpy().astype(np.float64), seq[1].bias.numpy().astype(np.float64)
    assert_close(seq(x).numpy(), np.tanh(act_ref("gelu", np.maximum(x, 0) @ w.T + b)[0]), atol_scale=3e-5)
    with pytest.raises(TypeError, match="not a Module"):
        pw.nn.Sequential(pw.nn.Linear(2, 2, device=dev), object())


def test_checkpoint_resume_matches_uninterrupted_run(dev, rng, tmp_path):
    """Save after 3 steps, load into fresh objects: the next step equals the uninterrupted one."""
    from pywgtrain.train import Trainer

    xs = [rand(rng, 16, 12) for _ in range(5)]
    ys = [rng.integers(0, 4, 16) for _ in range(5)]

    def make():
        model = pw.nn.MLP([12, 24, 4], activation="silu", device=dev, seed=7)
        opt = pw.optim.AdamW(model.parameters(), lr=1e-2, max_grad_norm=0.3)
        return Trainer(model, opt, pw.nn.CrossEntropyLoss())

    straight = make()
    for i in range(4):
        last = straight.step(xs[i], ys[i]).item()
    resumed = make()
    for i in range(3):
        resumed.step(xs[i], ys[i])
    path = tmp_path / "ckpt.npz"
    resumed.save(path)
    fresh = make()
    fresh.load(path)
    assert fresh.step_count == 3
    assert fresh.step(xs[3], ys[3]).item() == last
    for (name, p), (_, q) in zip(straight.model.named_parameters(), fresh.model.named_parameters()):
        np.testing.assert_array_equal(p.numpy(), q.numpy(), err_msg=name)
    assert fresh.optimizer.state_dict()["state"][0]["step"] == 4


def test_training_step_is_one_submission(dev, rng):
    """Inside batch() nothing is submitted until the block ends."""
    model = pw.nn.MLP([6, 8, 3], device=dev, seed=0)
    opt = pw.optim.AdamW(model.parameters(), max_grad_norm=1.0)
    with dev.batch() as rec:
        opt.zero_grad()
        loss = pw.nn.CrossEntropyLoss()(model(rand(rng, 5, 6)), rng.integers(0, 3, 5))
        loss.backward()
        opt.step()
        assert rec.pending > 10  # every kernel so far is recorded, none submitted
    assert rec.pending == 0
    assert np.isfinite(loss.item())


def test_captured_steps_equal_uncaptured_steps(dev, rng):
    """Step graphs (capture on step 2, replay after) give bit-identical losses,
    gradient norms and weights; a batch of another shape falls back to eager."""
    from pywgtrain.train import Trainer

    xs = [rand(rng, 16, 12) for _ in range(6)] + [rand(rng, 5, 12)]
    ys = [rng.integers(0, 4, 16) for _ in range(6)] + [rng.integers(0, 4, 5)]

    def make(capture):
        model = pw.nn.MLP([12, 24, 24, 4], activation="gelu_tanh", device=dev, seed=5)
        opt = pw.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, max_grad_norm=0.5)
        return Trainer(model, opt, pw.nn.CrossEntropyLoss(), capture=capture)

    eager, captured = make(False), make(True)
    eager_losses = [eager.step(x, y) for x, y in zip(xs, ys)]
    captured_losses = [captured.step(x, y) for x, y in zip(xs, ys)]
    assert captured.graph is not None and len(captured.graph) > 10
    # Losses read late: each step kept its own value.
    assert [l.item() for l in captured_losses] == [l.item() for l in eager_losses]
    assert captured.optimizer.last_grad_norm() == eager.optimizer.last_grad_norm()
    for (name, p), (_, q) in zip(eager.model.named_parameters(), captured.model.named_parameters()):
        np.testing.assert_array_equal(p.numpy(), q.numpy(), err_msg=name)
    with pytest.raises(RuntimeError, match="does not require grad"):
        captured_losses[3].backward()


def test_step_graphs_leave_caller_tensors_alone(dev, rng):
    """Device-tensor batches rotated through a captured step: every replay
    trains on its own batch (same weights as without capture) and the
    caller's tensors keep their contents."""
    from pywgtrain.train import Trainer

    xs = [rand(rng, 16, 12) for _ in range(3)]
    ys = [rng.integers(0, 4, 16).astype(np.int32) for _ in range(3)]
    txs, tys = [pw.tensor(x, dev) for x in xs], [pw.tensor(y, dev) for y in ys]

    def make(capture):
        model = pw.nn.MLP([12, 24, 4], activation="relu", device=dev, seed=9)
        return Trainer(
            model,
            pw.optim.AdamW(model.parameters(), lr=1e-2, max_grad_norm=1.0),
            pw.nn.CrossEntropyLoss(),
            capture=capture,
        )

    eager, captured = make(False), make(True)
    for i in range(7):
        e, c = eager.step(txs[i % 3], tys[i % 3]), captured.step(txs[i % 3], tys[i % 3])
        assert c.item() == e.item(), f"step {i}"
    assert captured.graph is not None
    for x, tx, y, ty in zip(xs, txs, ys, tys):
        np.testing.assert_array_equal(tx.numpy(), x)
        np.testing.assert_array_equal(ty.numpy(), y)
    for (name, p), (_, q) in zip(eager.model.named_parameters(), captured.model.named_parameters()):
        np.testing.assert_array_equal(p.numpy(), q.numpy(), err_msg=name)


@pytest.mark.parametrize("device_batches", [False, True])
def test_grouped_steps_equal_one_submission_per_step(dev, rng, device_batches):
    """steps_per_submit=3 over 9 steps (eager, capture, then replays; NumPy or
    device batches): bit-identical losses, gradient norm and weights to one
    submission per step, every loss kept though read late."""
    from pywgtrain.train import Trainer

    xs = [rand(rng, 16, 12) for _ in range(9)]
    ys = [rng.integers(0, 4, 16).astype(np.int32) for _ in range(9)]
    if device_batches:
        xs, ys = [pw.tensor(x, dev) for x in xs], [pw.tensor(y, dev) for y in ys]

    def make(group):
        model = pw.nn.MLP([12, 24, 4], activation="gelu", device=dev, seed=3)
        opt = pw.optim.AdamW(model.parameters(), lr=1e-2, max_grad_norm=0.5)
        return Trainer(model, opt, pw.nn.CrossEntropyLoss(), steps_per_submit=group)

    single, grouped = make(1), make(3)
    want = [single.step(x, y) for x, y in zip(xs, ys)]
    got = [grouped.step(x, y) for x, y in zip(xs, ys)]
    assert [l.item() for l in got] == [l.item() for l in want]
    assert len({l.item() for l in got}) == len(got)
    assert grouped.optimizer.last_grad_norm() == single.optimizer.last_grad_norm()
    for (name, p), (_, q) in zip(single.model.named_parameters(), grouped.model.named_parameters()):
        np.testing.assert_array_equal(p.numpy(), q.numpy(), err_msg=name)


def test_grouped_steps_keep_order_with_other_work(dev, rng):
    """Reading a weight, writing one and recording other work in the middle
    of a group all see (and act after) the steps called before them."""
    from pywgtrain.train import Trainer

    xs = [rand(rng, 8, 6) for _ in range(6)]
    ys = [rng.standard_normal((8, 2)).astype(np.float32) for _ in range(6)]

    def make(group):
        model = pw.nn.MLP([6, 10, 2], activation="relu", device=dev, seed=4)
        return Trainer(model, pw.optim.AdamW(model.parameters(), lr=1e-2), pw.nn.MSELoss(), steps_per_submit=group)

    single, grouped = make(1), make(4)
    w_new = rand(rng, 10, 6)
    for t in (single, grouped):
        for i in range(3):
            t.step(xs[i], ys[i])
    w1 = grouped.model[0].weight
    np.testing.assert_array_equal(w1.numpy(), single.model[0].weight.numpy())  # read flushes the group
    outs = []
    for t in (single, grouped):
        t.step(xs[3], ys[3])
        with pw.no_grad():
            t.model[0].weight.copy_(w_new)  # a write after a grouped step lands after it
        t.step(xs[4], ys[4])
        outs.append(t.model(pw.tensor(xs[5], dev)))  # other work records after the group
        t.step(xs[5], ys[5])
    np.testing.assert_array_equal(outs[1].numpy(), outs[0].numpy())
    for (name, p), (_, q) in zip(single.model.named_parameters(), grouped.model.named_parameters()):
        np.testing.assert_array_equal(p.numpy(), q.numpy(), err_msg=name)


def test_step_recording_failure_marks_unsubmitted_losses(rng):
    """Steps recorded but not submitted when the device is lost: their losses
    raise on read (the device is gone, or their work never ran) instead of
    reading stale memory."""
    from pywgtrain.train import Trainer

    d = pw.Device()
    model = pw.nn.MLP([6, 8, 3], device=d, seed=1)
    t = Trainer(model, pw.optim.AdamW(model.parameters()), pw.nn.CrossEntropyLoss(), steps_per_submit=8)
    x, y = rand(rng, 4, 6), rng.integers(0, 3, 4)
    for _ in range(3):
        t.step(x, y).item()  # eager, capture, first replay
    pending = [t.step(x, y) for _ in range(2)]
    d.destroy()
    with pytest.raises(pw.DeviceLostError):
        t.step(x, y)
    for loss in pending:
        with pytest.raises(RuntimeError, match="never ran: a later operation failed to record|device destroyed"):
            loss.item()


def test_replay_rejects_inputs_of_another_size(dev, rng):
    from pywgtrain.train import Trainer

    model = pw.nn.MLP([6, 8, 3], device=dev, seed=1)
    t = Trainer(model, pw.optim.AdamW(model.parameters()), pw.nn.CrossEntropyLoss())
    for _ in range(2):
        t.step(rand(rng, 4, 6), rng.integers(0, 3, 4))
    g = t._graph
    with pytest.raises(
        ValueError, match=r"an input of shape \(2, 6\) and dtype float32 for a captured tensor of shape \(4, 6\)"
    ):
        g["graph"].replay({g["x"]: rand(rng, 2, 6)})
    with pytest.raises(ValueError, match="an input of shape"):
        g["graph"].replay({g["x"]: pw.tensor(rand(rng, 3, 6), dev)})
    with pytest.raises(ValueError, match="steps_per_submit"):
        Trainer(model, t.optimizer, pw.nn.CrossEntropyLoss(), steps_per_submit=0)


@pytest.mark.parametrize("train", [False, True])
def test_fused_linear_with_k_split_past_binding_limit(dev, rng, train):
    """op(B) = B stored K x N past the binding limit forces a K split, so the
    bias + activation runs as its own pass (with a scratch pre-activation
    buffer in the inference form)."""
    from pywgtrain import _core

    m, k, n = 5, 8200, 4100
    if k * n * 4 <= dev.limits["max_storage_buffer_binding_size"]:
        pytest.skip("binding limit larger than the operand on this adapter")
    a, b, bias = rand(rng, m, k), rand(rng, k, n), rand(rng, n)
    y, pre = poisoned(dev, (m, n)), poisoned(dev, (m, n))
    ta, tb, tbias = pw.tensor(a, dev), pw.tensor(b, dev), pw.tensor(bias, dev)
    with dev.batch() as rec:
        _core.gemm_bias_act(
            rec, ta._buf, tb._buf, tbias._buf, y._buf, pre._buf if train else None, m, n, k, False, False, 1
        )
    z = a.astype(np.float64) @ b + bias
    assert_close(y.numpy(), np.maximum(z, 0), atol_scale=1e-4)
    if train:
        assert_close(pre.numpy(), z, atol_scale=1e-4)


@pytest.mark.parametrize("m,k,n,act", [(7, 33, 129, "gelu"), (130, 65, 257, "silu"), (5, 8200, 4100, "gelu_tanh")])
def test_gemm_act_grad(dev, rng, m, k, n, act):
    """dZ = (dY W) * act'(Z) in the GEMM epilogue; the last shape puts W (K x N)
    past lavapipe's binding limit, so K is blocked and act' runs as its own pass."""
    from pywgtrain import _core
    from pywgtrain.functions import ACTIVATIONS

    dy, w, z = rand(rng, m, k), rand(rng, k, n), rand(rng, m, n)
    out = poisoned(dev, (m, n))
    with dev.batch() as rec:
        _core.gemm_act_grad(
            rec,
            pw.tensor(dy, dev)._buf,
            pw.tensor(w, dev)._buf,
            pw.tensor(z, dev)._buf,
            out._buf,
            m,
            n,
            k,
            False,
            False,
            ACTIVATIONS[act],
        )
    assert_close(
        out.numpy(),
        (dy.astype(np.float64) @ w) * act_ref(act, z.astype(np.float64))[1],
        atol_scale=1e-5 * max(1.0, math.sqrt(k) / 4),
    )


@pytest.mark.parametrize("rows,cols", [(1, 1), (7, 33), (255, 7), (256, 1), (4133, 65), (20000, 129), (16384, 384)])
@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_bias_grad_column_sums(dev, rng, rows, cols, beta):
    """db = column sums of dZ (+ beta db): few rows in one pass, many rows
    over few columns as row-block partials then a pass over them (linear.wgsl
    colsum_partial); every column and row counted once, output poisoned."""
    from pywgtrain import _core

    dz, db0 = rand(rng, rows, cols), rand(rng, cols)
    db = pw.tensor(db0, dev) if beta else poisoned(dev, (cols,))
    with dev.batch() as rec:
        _core.bias_grad(rec, pw.tensor(dz, dev)._buf, db._buf, rows, cols, beta)
    assert_close(db.numpy(), dz.astype(np.float64).sum(0) + beta * db0, atol_scale=1e-5 * max(1.0, math.sqrt(rows) / 4))


# (300, 2048, 2048): past the multiply-add count up to which the sums ride along.
@pytest.mark.parametrize(
    "rows,fout,fin", [(7, 33, 129), (256, 130, 65), (1, 5, 3), (600, 7, 9), (2000, 70, 33), (300, 2048, 2048)]
)
@pytest.mark.parametrize("beta", [0.0, 1.0])
def test_linear_weight_grads(dev, rng, rows, fout, fin, beta):
    """dW = dZ^T X and db = column sums of dZ from one GEMM (row sums in the
    kernel); K = rows >= 512 with few output tiles splits K, and large products
    take a plain GEMM: the bias gradient then takes its own pass. beta = 1
    accumulates into both."""
    from pywgtrain import _core

    dz, x = rand(rng, rows, fout), rand(rng, rows, fin)
    dw0, db0 = rand(rng, fout, fin), rand(rng, fout)
    dw, db = pw.tensor(dw0, dev), pw.tensor(db0, dev)
    with dev.batch() as rec:
        _core.linear_weight_grads(
            rec, pw.tensor(dz, dev)._buf, pw.tensor(x, dev)._buf, dw._buf, db._buf, rows, fout, fin, beta
        )
    d64 = dz.astype(np.float64)
    tol = 1e-5 * max(1.0, math.sqrt(rows) / 4)
    assert_close(dw.numpy(), d64.T @ x + beta * dw0, atol_scale=tol)
    assert_close(db.numpy(), d64.sum(0) + beta * db0, atol_scale=tol)


# Rows x out features: one row, odd counts, and 128 (vec4 stores of C) beside 129 (vec4 then scalar stores).
RESIDUAL_ROWS = [1, 7, 33, 129, 1000]
RESIDUAL_OUT = [1, 7, 33, 128, 129]


def _bias_residual_into_poison(dev, x, w, b, res):
    return bias_residual(dev, x, w, b, res, poisoned(dev, (x.shape[0], w.shape[0])))


@pytest.mark.parametrize("rows", RESIDUAL_ROWS)
@pytest.mark.parametrize("fout", RESIDUAL_OUT)
def test_gemm_bias_residual(dev, rng, rows, fout):
    """Y = X W^T + b + R from the GEMM epilogue, into a NaN-poisoned output."""
    fin = 37
    x, w, b, res = rand(rng, rows, fin), rand(rng, fout, fin), rand(rng, fout), rand(rng, rows, fout)
    want = x.astype(np.float64) @ w.T + b + res
    assert_close(_bias_residual_into_poison(dev, x, w, b, res), want, atol_scale=3e-5)


@pytest.mark.parametrize("m,k,n,splits", [(7, 3000, 33, None), (129, 64, 129, "3"), (33, 700, 128, "5")])
def test_gemm_bias_residual_split_k(dev, rng, monkeypatch, m, k, n, splits):
    """The split-K reduce pass applies bias and residual: few output tiles
    with long K split by the heuristic, or splits forced (on a Device opened
    with PYWGTRAIN_GEMM_SPLITS set)."""
    if splits is not None:
        dev = switched_device(monkeypatch, PYWGTRAIN_GEMM_SPLITS=splits)
    x, w, b, res = rand(rng, m, k), rand(rng, n, k), rand(rng, n), rand(rng, m, n)
    want = x.astype(np.float64) @ w.T + b + res
    assert_close(_bias_residual_into_poison(dev, x, w, b, res), want, atol_scale=1e-5 * max(1.0, math.sqrt(k) / 4))


def test_gemm_bias_residual_errors(dev, rng):
    """A residual too small, or in the output's GPU buffer (bound read-only
    and writable in one dispatch), is refused naming the argument."""
    from pywgtrain import _core

    x, w, b = pw.tensor(rand(rng, 4, 3), dev), pw.tensor(rand(rng, 5, 3), dev), pw.tensor(rand(rng, 5), dev)
    y = poisoned(dev, (4, 5))
    with dev.batch() as rec, pytest.raises(ValueError, match="residual holds 19 floats, needs 20"):
        _core.gemm_bias_residual(
            rec, x._buf, w._buf, b._buf, pw.tensor(rand(rng, 19), dev)._buf, y._buf, 4, 5, 3, False, True
        )
    with dev.batch() as rec, pytest.raises(ValueError, match="the output y shares a GPU buffer with residual"):
        _core.gemm_bias_residual(rec, x._buf, w._buf, b._buf, y._buf, y._buf, 4, 5, 3, False, True)


@pytest.mark.parametrize("rows,fout", [(1, 1), (7, 33), (33, 128), (1000, 129)])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_residual_grads_match_torch(dev, rng, rows, fout, bias):
    """linear(x, W, b, residual=r) against torch autograd: output and the
    gradients of x, W, b and r (r's is the upstream gradient, shared)."""
    torch = pytest.importorskip("torch")
    fin = 37
    x, w, b = rand(rng, 2, rows, fin), rand(rng, fout, fin), rand(rng, fout)
    res, dy = rand(rng, 2, rows, fout), rand(rng, 2, rows, fout)
    tx, tw, tr = (pw.tensor(v, dev, requires_grad=True) for v in (x, w, res))
    tb = pw.tensor(b, dev, requires_grad=True) if bias else None
    y = pw.linear(tx, tw, tb, residual=tr)
    y.backward(pw.tensor(dy, dev))
    qx, qw, qb, qr = (torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in (x, w, b, res))
    qy = torch.nn.functional.linear(qx, qw, qb if bias else None) + qr
    qy.backward(torch.from_numpy(dy.astype(np.float64)))
    assert_close(y.numpy(), qy.detach().numpy(), atol_scale=3e-5)
    assert_close(tx.grad.numpy(), qx.grad.numpy(), atol_scale=3e-5)
    assert_close(tw.grad.numpy(), qw.grad.numpy(), atol_scale=3e-5)
    assert_close(tr.grad.numpy(), qr.grad.numpy())
    if bias:
        assert_close(tb.grad.numpy(), qb.grad.numpy(), atol_scale=3e-5)


def test_linear_residual_is_also_the_input(dev, rng):
    """x + (x W^T + b), x used twice: the gradient shared with the residual
    slot must not be overwritten by the input gradient written into that slot."""
    torch = pytest.importorskip("torch")
    x, w, b, dy = rand(rng, 9, 16), rand(rng, 16, 16), rand(rng, 16), rand(rng, 9, 16)
    tx = pw.tensor(x, dev, requires_grad=True)
    layer = pw.nn.Linear(16, 16, device=dev)
    with pw.no_grad():
        layer.weight.copy_(w)
        layer.bias.copy_(b)
    h = tx * 1.0  # an intermediate: its gradient goes through the shared slots
    y = layer(h, residual=h)
    (y * pw.tensor(dy, dev)).sum().backward()
    qx = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    qy = torch.nn.functional.linear(qx, torch.from_numpy(w).double(), torch.from_numpy(b).double()) + qx
    (qy * torch.from_numpy(dy).double()).sum().backward()
    assert_close(y.numpy(), qy.detach().numpy(), atol_scale=3e-5)
    assert_close(tx.grad.numpy(), qx.grad.numpy(), atol_scale=3e-5)


def test_linear_residual_errors(dev, rng):
    x, w, b = pw.tensor(rand(rng, 4, 3), dev), pw.tensor(rand(rng, 5, 3), dev), pw.tensor(rand(rng, 5), dev)
    with pytest.raises(ValueError, match=r"residual has shape \(4, 6\), the output has shape \(4, 5\)"):
        pw.linear(x, w, b, residual=pw.tensor(rand(rng, 4, 6), dev))
    with pytest.raises(ValueError, match="residual is only supported without an activation"):
        pw.linear(x, w, b, activation="relu", residual=pw.tensor(rand(rng, 4, 5), dev))
    with pytest.raises(TypeError, match="residual must be float32"):
        pw.linear(x, w, b, residual=pw.tensor(np.zeros((4, 5), np.int32), dev))
    with pytest.raises(TypeError, match="residual must have dtype float32"):
        pw.linear(x, w, b, residual=np.zeros((4, 5), np.float64))


@pytest.mark.parametrize(
    "acts, biases, residual",
    [
        (["gelu", None], [True, True], True),
        (["relu", "silu", "gelu_tanh"], [True, False, True], False),
        ([None, "gelu", None], [False, True, False], True),
        (["silu"], [True], False),
    ],
)
def test_mlp_chain_matches_torch(dev, rng, acts, biases, residual):
    """F.mlp (a chain of linear layers whose backward fuses each activation's
    derivative into the next GEMM) against torch autograd in float64: output,
    every weight, bias and input gradient, and a retained output gradient."""
    torch = pytest.importorskip("torch")
    widths = [7, 33, 17, 129][: len(acts) + 1]
    x = rand(rng, 3, 5, widths[0])
    ws = [rand(rng, o, i) * 0.3 for i, o in zip(widths, widths[1:])]
    bs = [rand(rng, o) if has else None for o, has in zip(widths[1:], biases)]
    res = rand(rng, 3, 5, widths[-1]) if residual else None
    dy = rand(rng, 3, 5, widths[-1])
    tx = pw.tensor(x, dev, requires_grad=True)
    tws = [pw.tensor(w, dev, requires_grad=True) for w in ws]
    tbs = [None if b is None else pw.tensor(b, dev, requires_grad=True) for b in bs]
    tres = None if res is None else pw.tensor(res, dev, requires_grad=True)
    y = pw.nn.functional.mlp(tx, tws, tbs, acts, tres)
    y.retain_grad()
    (y * pw.tensor(dy, dev)).sum().backward()

    fn = {
        None: lambda v: v,
        "relu": torch.relu,
        "silu": torch.nn.functional.silu,
        "gelu": torch.nn.functional.gelu,
        "gelu_tanh": lambda v: torch.nn.functional.gelu(v, approximate="tanh"),
    }
    q = lambda v: None if v is None else torch.tensor(v, dtype=torch.float64, requires_grad=True)  # noqa: E731
    qx, qws, qbs, qres = q(x), [q(w) for w in ws], [q(b) for b in bs], q(res)
    h = qx
    for w, b, act in zip(qws, qbs, acts):
        h = fn[act](torch.nn.functional.linear(h, w, b))
    if qres is not None:
        h = h + qres
    (h * torch.from_numpy(dy).double()).sum().backward()

    assert_close(y.numpy(), h.detach().numpy())
    np.testing.assert_array_equal(y.grad.numpy(), dy)
    assert_close(tx.grad.numpy(), qx.grad.numpy())
    for t, ref in zip(tws, qws):
        assert_close(t.grad.numpy(), ref.grad.numpy())
    for t, ref in zip(tbs, qbs):
        if t is not None:
            assert_close(t.grad.numpy(), ref.grad.numpy())
    if tres is not None:
        np.testing.assert_array_equal(tres.grad.numpy(), dy)


def test_mlp_refuses_bad_chains(dev, rng):
    x = pw.tensor(rand(rng, 4, 6), dev)
    w1, w2 = pw.tensor(rand(rng, 8, 6), dev), pw.tensor(rand(rng, 3, 9), dev)
    with pytest.raises(ValueError, match="one entry per layer, got 2, 1 and 2"):
        pw.nn.functional.mlp(x, [w1, w2], [None], ["relu", None])
    with pytest.raises(ValueError, match=r"input has 8 features \(the output of layer 0\), weight expects 9"):
        pw.nn.functional.mlp(x, [w1, w2], [None, None], ["relu", None])
    with pytest.raises(ValueError, match="activation must be one of"):
        pw.nn.functional.mlp(x, [w1], [None], ["tanh"])
    with pytest.raises(ValueError, match="residual is only supported without an activation"):
        pw.nn.functional.mlp(x, [w1], [None], ["relu"], residual=rand(rng, 4, 8))


def test_sequential_runs_linear_chains_as_one_op(dev, rng):
    """Linear, GELU, Linear, ReLU, Linear in a Sequential: one 'mlp' node, the same result as calling the layers."""
    model = pw.nn.Sequential(
        pw.nn.Linear(6, 16, device=dev, rng=np.random.default_rng(0)),
        pw.nn.GELU(),
        pw.nn.Linear(16, 9, device=dev, rng=np.random.default_rng(1)),
        pw.nn.ReLU(),
        pw.nn.Linear(9, 4, device=dev, rng=np.random.default_rng(2)),
    )
    x = pw.tensor(rand(rng, 5, 6), dev)
    y = model(x)
    assert y.grad_fn.name == "mlp"
    h = x
    for m in model:
        h = m(h)
    assert_close(y.numpy(), h.numpy().astype(np.float64))


def test_retained_grad_of_an_activated_linear_feeding_another(dev, rng):
    """h = relu(x @ W1.T); y = h @ W2.T: h.retain_grad() gives h's gradient (the
    activation fusion of an earlier design left it None), as torch does."""
    torch = pytest.importorskip("torch")
    x, w1, w2 = rand(rng, 4, 6), rand(rng, 8, 6), rand(rng, 3, 8)
    tw1, tw2 = pw.tensor(w1, dev, requires_grad=True), pw.tensor(w2, dev, requires_grad=True)
    h = pw.nn.functional.linear(pw.tensor(x, dev), tw1, None, "relu")
    h.retain_grad()
    pw.nn.functional.linear(h, tw2).sum().backward()
    qw1 = torch.tensor(w1, dtype=torch.float64, requires_grad=True)
    qh = torch.relu(torch.from_numpy(x).double() @ qw1.T)
    qh.retain_grad()
    (qh @ torch.from_numpy(w2).double().T).sum().backward()
    assert h.grad is not None
    assert_close(h.grad.numpy(), qh.grad.numpy())
