"""Views, in-place ops and saved-tensor versions with PyTorch's semantics (issue 34, items 4-6 and 9)."""

import numpy as np
import pytest
import torch

import pywgtrain as pw

from helpers import rand, run_threads


def pair(dev, arr, requires_grad=False):
    """The same float32 data as a pywgtrain tensor and a float64 torch tensor."""
    return (
        pw.tensor(np.ascontiguousarray(arr, np.float32), dev, requires_grad=requires_grad),
        torch.tensor(np.asarray(arr, np.float64), requires_grad=requires_grad),
    )


def close(ours, ref):
    np.testing.assert_allclose(np.asarray(ours), ref.detach().numpy(), rtol=1e-5, atol=1e-5)


# -- item 4: in-place methods on graph tensors ---------------------------------------
@pytest.mark.parametrize("op", ["mul_zero", "add_one", "mul_tensor", "div_tensor", "sub_tensor", "fill", "zero"])
def test_inplace_on_graph_tensor_matches_torch(dev, rng, op):
    a, ta = pair(dev, rand(rng, 7) + 3, requires_grad=True)
    w, tw = pair(dev, rand(rng, 7) + 3, requires_grad=True)
    results = []
    for x, y in ((a, w), (ta, tw)):
        h = x * 2
        if op == "mul_zero":
            h.mul_(0.0)
        elif op == "add_one":
            h.add_(1)
        elif op == "mul_tensor":
            h.mul_(y)
        elif op == "div_tensor":
            h.div_(y)
        elif op == "sub_tensor":
            h -= y
        elif op == "fill":
            h.fill_(4.0)
        else:
            h.zero_()
        (h * h).sum().backward()
        results.append((h, x.grad, y.grad))
    (h, ga, gw), (th, tga, tgw) = results
    close(h.numpy(), th)
    close(ga.numpy(), tga)
    if tgw is None:
        assert gw is None
    else:
        close(gw.numpy(), tgw)


def test_earlier_consumers_keep_the_value_before_the_inplace_op(dev, rng):
    a, ta = pair(dev, rand(rng, 5), requires_grad=True)
    for x in (a, ta):
        h = x * 2
        z = h * 3  # reads h before the write below
        h.mul_(0.0)
        (z.sum() + h.sum()).backward()
    close(a.grad.numpy(), ta.grad)


def test_inplace_on_plain_tensor_joins_the_graph(dev, rng):
    w, tw = pair(dev, rand(rng, 4), requires_grad=True)
    for x, acc in ((w, pw.zeros(4, device=dev)), (tw, torch.zeros(4))):
        acc.add_(x * 3)
        acc.sum().backward()
    close(w.grad.numpy(), tw.grad)


def test_inplace_on_leaf_or_its_view_raises(dev):
    a = pw.tensor(np.ones(3, np.float32), dev, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf tensor that requires grad"):
        a.add_(1)
    with pytest.raises(RuntimeError, match="view of a leaf tensor that requires grad"):
        a.reshape(3).add_(1)
    with pytest.raises(RuntimeError, match="view of a leaf"):
        a[0:2].fill_(0)
    np.testing.assert_array_equal(a.numpy(), [1, 1, 1])  # nothing was written
    with pw.no_grad():
        a[1:].mul_(3)
    np.testing.assert_array_equal(a.numpy(), [1, 3, 3])


@pytest.mark.parametrize("case", ["mul_row", "setitem_scalar", "setitem_tensor", "copy_column", "add_strided"])
def test_inplace_on_view_of_graph_tensor_matches_torch(dev, rng, case):
    a, ta = pair(dev, rand(rng, 3, 4), requires_grad=True)
    v, tv = pair(dev, rand(rng, 4), requires_grad=True)
    c, tc = pair(dev, rand(rng, 3), requires_grad=True)
    for x, y, z in ((a, v, c), (ta, tv, tc)):
        h = x * 2
        early = h.sum(1)  # reads h before the write
        if case == "mul_row":
            h[1].mul_(y)
        elif case == "setitem_scalar":
            h[0, 1:] = 5.0
        elif case == "setitem_tensor":
            h[2] = y * 3
        elif case == "copy_column":
            h[:, 3].copy_(z)
        else:
            h.T[::2].add_(z)
        ((h * h).sum() + early.sum()).backward()
    (ga, gv, gc), (tga, tgv, tgc) = (a.grad, v.grad, c.grad), (ta.grad, tv.grad, tc.grad)
    close(ga.numpy(), tga)
    for ours, ref in ((gv, tgv), (gc, tgc)):
        assert (ours is None) == (ref is None)
        if ref is not None:
            close(ours.numpy(), ref)


def test_stale_view_after_inplace_on_base_raises(dev):
    a = pw.tensor(np.ones((2, 3), np.float32), dev, requires_grad=True)
    h = a * 2
    v = h[0]
    h.mul_(3)  # autograd rebases h: v's recorded history is out of date
    np.testing.assert_array_equal(v.numpy(), [6, 6, 6])  # its values are current
    with pytest.raises(RuntimeError, match="take the view again"):
        v * 2
    (h[0] * 2).sum().backward()  # a view taken afterwards is fine
    np.testing.assert_array_equal(a.grad.numpy(), [[12, 12, 12], [0, 0, 0]])


def test_expanded_tensor_refuses_writes(dev):
    x = pw.tensor(np.ones((1, 3), np.float32), dev).expand(4, 3)
    with pytest.raises(RuntimeError, match="single memory location"):
        x.fill_(2)


# -- item 5: views share memory --------------------------------------------------------
def test_view_writes_reach_the_base(dev, rng):
    base = rand(rng, 5, 6)
    w, tw = pair(dev, base, requires_grad=True)
    m, tm = pair(dev, rand(rng, 4, 3))
    src, tsrc = pair(dev, rand(rng, 3))
    with pw.no_grad():
        w[0].zero_()
        w.narrow(0, 1, 2).fill_(7)
        w[:, ::4].mul_(-1)
        w.T[5].add_(100)
    with torch.no_grad():
        tw[0].zero_()
        tw.narrow(0, 1, 2).fill_(7)
        tw[:, ::4].mul_(-1)
        tw.T[5].add_(100)
    close(w.numpy(), tw)
    m[1].copy_(src)
    tm[1].copy_(tsrc)
    m.T[0].zero_()
    tm.T[0].zero_()
    m[2, 1:] = 5.0
    tm[2, 1:] = 5.0
    m[3] = np.array([1, 2, 3], np.float32)
    tm[3] = torch.tensor([1.0, 2, 3])
    close(m.numpy(), tm)


def test_views_share_storage_and_version(dev):
    x = pw.tensor(np.arange(24, dtype=np.float32).reshape(2, 3, 4), dev)
    views = [
        x[0],
        x[:, 1],
        x.transpose(0, 2),
        x.permute(2, 0, 1),
        x.narrow(2, 1, 2),
        x.select(1, 2),
        x.unsqueeze(1),
        x.reshape(6, 4),
        x.view(-1),
        x[..., None],
        x.detach(),
        *x.split(1, 2),
        *x.chunk(2, 0),
    ]
    for v in views:
        assert v._store is x._store
    before = x._version
    views[0].add_(1)
    assert x._version == before + 1 and views[3]._version == before + 1
    assert not x.transpose(0, 1).is_contiguous() and x.transpose(0, 1).stride() == (4, 12, 1)


def test_view_values_and_strides_match_torch(dev):
    arr = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
    x, t = pw.tensor(arr, dev), torch.tensor(arr)
    cases = [
        lambda z: z[1, :, ::2],
        lambda z: z.transpose(1, 3)[:, 2:],
        lambda z: z.permute(3, 1, 0, 2).narrow(0, 1, 3),
        lambda z: z[None, :, 1, None, ::3],
        lambda z: z.transpose(0, 1).unsqueeze(2).squeeze(),
        lambda z: z[:, 1:2].expand(2, 5, 4, 5),
        lambda z: z.select(3, -1),
        lambda z: z.transpose(2, 3).reshape(6, 20),
        lambda z: z[..., 1:4].contiguous(),
    ]
    for f in cases:
        ours, ref = f(x), f(t)
        assert ours.shape == tuple(ref.shape)
        if ours._store is x._store:
            # Strides of size-1 dimensions are arbitrary (torch's own rule for them varies by op).
            sized = [i for i, n in enumerate(ours.shape) if n != 1]
            assert [ours.stride()[i] for i in sized] == [ref.stride()[i] for i in sized]
            assert ours.storage_offset() == ref.storage_offset()
        np.testing.assert_array_equal(ours.numpy(), ref.numpy())


def test_view_of_noncontiguous_tensor_raises_like_torch(dev):
    x = pw.tensor(np.ones((3, 4), np.float32), dev)
    with pytest.raises(RuntimeError, match="not contiguous"):
        x.T.view(12)
    assert x.T.reshape(12).shape == (12,)


# -- item 6: saved tensors modified in place ------------------------------------------
def test_modified_saved_input_raises(dev):
    x = pw.tensor(np.ones(3, np.float32), dev)
    w = pw.tensor(np.ones(3, np.float32), dev, requires_grad=True)
    y = (x * w).sum()
    x += 100
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.backward()
    assert w.grad is None  # refused before anything was recorded


def test_modified_saved_output_raises_through_detach(dev):
    a = pw.tensor(np.ones(3, np.float32), dev, requires_grad=True)
    y = a.exp()
    y.detach().mul_(0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_inputs_not_read_by_backward_may_change(dev, rng):
    # add's backward reads neither input: torch allows the write, and so do we.
    x, tx = pair(dev, rand(rng, 3))
    w, tw = pair(dev, rand(rng, 3), requires_grad=True)
    for a, b in ((x, w), (tx, tw)):
        y = (a + b).sum()
        with pw.no_grad() if a is x else torch.no_grad():
            a.mul_(2)
        y.backward()
    close(w.grad.numpy(), tw.grad)


def test_optimizer_step_bumps_parameter_versions(dev):
    lin = pw.nn.Linear(3, 2, device=dev)
    opt = pw.optim.AdamW(lin.parameters(), lr=0.1)
    x = np.ones((4, 3), np.float32)
    lin(x).sum().backward()
    loss = lin(x).sum()
    opt.step()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_retain_graph_and_retain_grad(dev, rng):
    a, ta = pair(dev, rand(rng, 4), requires_grad=True)
    outs = []
    for x in (a, ta):
        h = x * 3
        h.retain_grad()
        y = (h * h).sum()
        y.backward(retain_graph=True)
        y.backward()
        outs.append(h.grad)
    close(a.grad.numpy(), ta.grad)
    close(outs[0].numpy(), outs[1])
    y = (a * 2).sum()
    y.backward()
    with pytest.raises(RuntimeError, match="second time"):
        y.backward()


# -- item 9: concurrent backward into one leaf ---------------------------------------
def test_concurrent_backward_into_one_leaf_loses_nothing(dev):
    for _ in range(5):
        w = pw.tensor(np.ones(8, np.float32), dev, requires_grad=True)

        def work():
            for _ in range(20):
                (w * 2).sum().backward()

        run_threads([work] * 4)
        np.testing.assert_array_equal(w.grad.numpy(), np.full(8, 160.0))


# -- random programs against torch -----------------------------------------------------
def _random_view(rng, z):
    """One random view op applied identically to a pywgtrain tensor or a torch tensor."""
    nd = z.ndim
    kind = rng.integers(0, 6)
    if nd == 0:
        return z
    if kind == 0:
        d = int(rng.integers(0, nd))
        start = int(rng.integers(0, z.shape[d]))
        return z.narrow(d, start, int(rng.integers(1, z.shape[d] - start + 1)))
    if kind == 1 and nd >= 2:
        d0, d1 = (int(v) for v in rng.choice(nd, 2, replace=False))
        return z.transpose(d0, d1)
    if kind == 2:
        d = int(rng.integers(0, nd))
        step = int(rng.integers(1, 3))
        idx = [slice(None)] * nd
        idx[d] = slice(int(rng.integers(0, z.shape[d])), None, step)
        return z[tuple(idx)]
    if kind == 3:
        return z.unsqueeze(int(rng.integers(0, nd + 1)))
    if kind == 4 and z.shape[0] > 1 and nd >= 2:
        return z.select(0, int(rng.integers(0, z.shape[0])))
    return z.reshape(-1) if nd > 1 else z


@pytest.mark.parametrize("seed", range(200))
def test_random_view_inplace_autograd_programs_match_torch(dev, seed):
    rng = np.random.default_rng(seed)
    shape = tuple(int(s) for s in rng.integers(1, 5, size=int(rng.integers(1, 4))))
    base = rng.standard_normal(shape).astype(np.float32)
    other = rng.standard_normal(shape).astype(np.float32)
    results = []
    for lib in ("pw", "torch"):
        p_rng = np.random.default_rng(seed + 1000)  # the same choices for both libraries
        if lib == "pw":
            w = pw.tensor(base, dev, requires_grad=True)
            buf = pw.tensor(other, dev)
            ng = pw.no_grad
        else:
            w = torch.tensor(base, requires_grad=True)
            buf = torch.tensor(other)
            ng = torch.no_grad
        # A write through a view of a plain tensor, then a graph over views of both.
        with ng():
            v = _random_view(p_rng, buf)
            if v.ndim == 0 or 0 not in v.stride():
                v.mul_(float(p_rng.integers(-2, 3)))
        h = w * buf  # reads buf after the write
        hv = _random_view(p_rng, h)
        if p_rng.integers(0, 2) and hv._base is not None and (hv.ndim == 0 or 0 not in hv.stride()):
            hv.mul_(hv.detach() + 0.5)  # in place on a view of a graph tensor: h's history is rebased
        g = hv * hv.exp() if p_rng.integers(0, 2) else hv + 1.5
        if p_rng.integers(0, 2):
            g.mul_(0.5)  # in place on a graph tensor (not a view: g is a fresh result)
        loss = (g * g).sum() + (w * w).sum() + (h * 0.25).sum()
        loss.backward()
        results.append((buf, loss, w.grad))
    (buf, loss, grad), (tbuf, tloss, tgrad) = results
    close(buf.numpy(), tbuf)
    np.testing.assert_allclose(loss.item(), tloss.item(), rtol=1e-4)
    np.testing.assert_allclose(grad.numpy(), tgrad.numpy(), rtol=1e-4, atol=1e-4)


def test_size_is_torchs_method(dev):
    x, t = pw.zeros((2, 3, 4), device=dev), torch.zeros(2, 3, 4)
    assert x.size() == tuple(t.size()) and x.size(0) == t.size(0) and x.size(-1) == t.size(-1)
    assert x.numel() == t.numel() == 24
    with pytest.raises(IndexError, match="out of range"):
        x.size(3)
    with pytest.raises(TypeError, match="must be an int"):
        x.size(1.0)


def test_a_released_graph_keeps_no_memory(dev):
    """After backward, a loss tensor kept by the caller must not hold the inputs
    its graph saved (version records reference storages)."""
    w = pw.tensor(np.ones((256, 256), np.float32), dev, requires_grad=True)
    dev.synchronize()
    before = dev.memory_stats()["allocated_bytes"]
    x = pw.tensor(np.ones((256, 256), np.float32), dev)
    loss = (x @ w).exp().sum()
    del x
    loss.backward()
    w.grad = None
    dev.synchronize()
    assert dev.memory_stats()["allocated_bytes"] - before <= 64 * 1024  # the loss and small scratch only
    assert loss.item() > 0


# -- set_, is_set_to, untyped_storage, grad_home: how an optimizer moves parameters and gradients --
def test_set_takes_the_source_memory_and_old_views_keep_theirs_as_in_torch(dev, rng):
    """x.set_(src): x views src's memory (writes through either show in both), its shape and
    strides become src's, its version is bumped; a view of x taken before keeps the old memory."""
    x0, s0 = rand(rng, 33), rand(rng, 7, 9)
    outs = []
    for lib in (pw, torch):
        x = pw.tensor(x0, dev) if lib is pw else torch.tensor(x0)
        src = pw.tensor(s0, dev) if lib is pw else torch.tensor(s0)
        old_view = x[3:10]
        version = x._version
        assert x.set_(src) is x
        assert x._version > version and x.shape == tuple(src.shape) and x.is_set_to(src)
        x[0, 0:2] = 5.0  # through x: seen by src
        src[6].fill_(-1.0)  # through src: seen by x
        old_view.add_(1.0)  # the old memory only
        outs.append([t.numpy() for t in (x, src, old_view)])
    for ours, ref in zip(*outs):
        np.testing.assert_array_equal(ours, ref)
    x = pw.tensor(x0, dev)
    assert x.untyped_storage() is not pw.tensor(x0, dev).untyped_storage()
    assert x[2:5].untyped_storage() is x.untyped_storage() and not x[2:5].is_set_to(x)


def test_set_keeps_saved_tensors_of_a_graph_valid_and_refuses_what_torch_refuses(dev, rng):
    w = pw.tensor(rand(rng, 5, 4), dev, requires_grad=True)
    x = rand(rng, 3, 4)
    loss = (pw.tensor(x, dev) @ w.T).sum()
    home = pw.zeros((5, 4), device=dev)
    with pytest.raises(RuntimeError, match="a leaf tensor that requires grad is used in an in-place operation"):
        w.set_(home)
    with pw.no_grad():
        w.set_(home)
    assert w.requires_grad and w.is_leaf and float(np.abs(w.numpy()).max()) == 0.0
    loss.backward()  # the graph saved the old memory, which set_ left as it was
    np.testing.assert_allclose(w.grad.numpy(), np.tile(x.sum(0), (5, 1)), rtol=1e-5, atol=1e-5)
    t = pw.tensor(rand(rng, 6), dev)
    with pytest.raises(TypeError, match="set_: source must be a pywgtrain.Tensor, got ndarray"):
        t.set_(rand(rng, 6))
    with pytest.raises(TypeError, match="set_: source has dtype int32, this tensor float32"):
        t.set_(pw.tensor(np.zeros(6, np.int32), dev))
    with pytest.raises(RuntimeError, match="set_: this tensor is a view of another"):
        t[1:3].set_(pw.zeros(2, device=dev))
    with pytest.raises(RuntimeError, match="set_: this tensor has autograd history"):
        (w * 2).set_(pw.zeros((5, 4), device=dev))
    with pytest.raises(RuntimeError, match="set_: source requires grad"):
        t.set_(pw.zeros(6, device=dev, requires_grad=True))
    assert t.shape == (6,) and t._version == 0  # refused before anything changed


def test_grad_home_receives_a_new_gradient_without_a_copy(dev, rng):
    w = pw.tensor(rand(rng, 7, 3), dev, requires_grad=True)
    arena = pw.tensor(np.full(40, np.nan, np.float32), dev)
    home = arena[:21].view(7, 3)  # an aligned view of a larger buffer, as an optimizer's arena hands out
    w.grad_home = home
    assert w.grad_home is home
    x = rand(rng, 5, 3)
    for step in range(2):  # a new gradient lands in home; an existing one accumulates where it is
        (pw.tensor(x, dev) @ w.T).sum().backward()
        assert w.grad is home
        np.testing.assert_allclose(home.numpy(), (step + 1) * np.tile(x.sum(0), (7, 1)), rtol=1e-5, atol=1e-5)
    assert np.isnan(arena.numpy()[21:]).all()  # nothing outside the home was written
    for bad, exc, msg in [
        (rand(rng, 7, 3), TypeError, "grad_home must be a pywgtrain.Tensor or None, got ndarray"),
        (pw.zeros((3, 7), device=dev), ValueError, r"grad_home must have this tensor's shape \(7, 3\)"),
        (pw.zeros((7, 3), device=dev).T.contiguous().T, ValueError, "must be contiguous at an aligned offset"),
    ]:
        with pytest.raises(exc, match=msg):
            w.grad_home = bad
    with pytest.raises(RuntimeError, match="only a leaf's gradient is kept"):
        (w * 2).grad_home = pw.zeros((7, 3), device=dev)
    w.grad_home = None
    w.grad = None
    (pw.tensor(x, dev) @ w.T).sum().backward()
    assert w.grad is not home and w.grad_home is None


def test_views_of_a_parameter_follow_it_into_a_fused_optimizer(dev, rng):
    """AdamW gathers parameters into one buffer (Tensor.move_storage_): a view a user took
    before keeps reading the parameter, as a view of a torch parameter does across steps."""
    lin = pw.nn.Linear(9, 5, device=dev, rng=np.random.default_rng(0))
    row = lin.weight[2]
    opt = pw.optim.AdamW(lin.parameters(), lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        lin(pw.tensor(rand(rng, 3, 9), dev)).sum().backward()
        opt.step()
    np.testing.assert_array_equal(row.numpy(), lin.weight.numpy()[2])
    t = pw.tensor(rand(rng, 4), dev)
    with pytest.raises(RuntimeError, match="move_storage_: both tensors must cover their whole storage"):
        t[1:3].move_storage_(pw.zeros(2, device=dev))
    with pytest.raises(ValueError, match=r"move_storage_: dest must have this tensor's shape \(4,\)"):
        t.move_storage_(pw.zeros(5, device=dev))


def test_copies_of_32_bit_words_are_bit_exact(dev):
    """Copies out of views move words, not float values: int32 values whose bits read as a
    signaling NaN (e.g. -5,000,000) and float32 NaN payloads arrive unchanged, as in torch."""
    ids = np.array([1, 0x7FAB0000, -5000000, -4194305, -8388607, 7, 0x7F800001], np.int32)
    words = np.array([0x7FAB0000, 0xFFB3B4C0, 0x7F800001, 0x7FC00000, 0x3F800000, 0xFFFFFFFF], np.uint32)
    for host in (ids, words.view(np.float32)):
        t = pw.tensor(host, dev)
        cases = [
            (t[1:].numpy(), host[1:]),
            (t[1:].contiguous().numpy(), host[1:]),
            (t[::2].numpy(), host[::2]),
        ]
        if host.dtype == np.float32:  # cat takes float tensors
            cases.append((pw.cat([t[1:], t[:2]]).numpy(), np.concatenate([host[1:], host[:2]])))
        for got, want in cases:
            np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
