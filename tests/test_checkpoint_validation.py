"""Checkpoints are checked whole before anything changes: every bad
checkpoint below raises, and the model's weights, the optimizer's moments,
step counts and hyperparameters and the Trainer's step count stay bit for
bit as they were. Malformed safetensors files are refused naming the file
and the entry. Saving: any-case ``.safetensors`` suffixes, symbolic links."""

import json
import os
import struct

import numpy as np
import pytest

import pywgtrain as pw
from pywgtrain.serialization import read_safetensors, write_safetensors
from pywgtrain.train import Trainer


def make_trainer(dev, seed=3):
    model = pw.nn.MLP([6, 8, 3], activation="relu", device=dev, seed=seed)
    opt = pw.optim.AdamW(
        [{"params": [model[0].weight, model[1].weight]}, {"params": [model[0].bias, model[1].bias], "weight_decay": 0}],
        lr=1e-2,
        max_grad_norm=1.0,
    )
    return Trainer(model, opt, pw.nn.CrossEntropyLoss())


def train(tr, steps, seed=0):
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        tr.step(rng.standard_normal((4, 6)).astype(np.float32), rng.integers(0, 3, 4))


def everything(tr):
    """Model weights, optimizer state (moments, steps, groups), step count, RNG state."""
    osd = tr.optimizer.state_dict()
    return {
        "model": tr.model.state_dict(),
        "moments": {i: (st["step"], st["exp_avg"], st["exp_avg_sq"]) for i, st in osd["state"].items()},
        "groups": osd["param_groups"],
        "step_count": tr.step_count,
        "rng": pw.get_rng_state(tr.device),
    }


def assert_unchanged(before, after):
    assert before.keys() == after.keys()
    for k, v in before["model"].items():
        np.testing.assert_array_equal(after["model"][k], v, err_msg=k)
    assert before["moments"].keys() == after["moments"].keys()
    for i, (step, m, v) in before["moments"].items():
        assert after["moments"][i][0] == step
        np.testing.assert_array_equal(after["moments"][i][1], m)
        np.testing.assert_array_equal(after["moments"][i][2], v)
    assert after["groups"] == before["groups"]
    assert after["step_count"] == before["step_count"]
    np.testing.assert_array_equal(after["rng"], before["rng"])


@pytest.fixture
def saved(dev, tmp_path):
    """A trainer and a good checkpoint in each format, saved at step 3 (the trainer then moves on)."""
    tr = make_trainer(dev)
    train(tr, 3)
    paths = {}
    for fmt in ("safetensors", "npz"):
        paths[fmt] = tmp_path / f"good.{fmt}"
        tr.save(paths[fmt], extra={"epoch": 1})
    train(tr, 2, seed=1)  # now the weights and moments differ from the checkpoint's
    return tr, paths


def rewrite(path, out, edit_tensors=None, edit_meta=None):
    """A copy of checkpoint ``path`` at ``out`` with its tensors ({name: array}, names as in the file) and
    metadata (a dict) edited in place by the callables."""
    if str(path).endswith(".npz"):
        with np.load(path) as z:
            tensors = {k: z[k] for k in z.files}
        meta = json.loads(bytes(tensors.pop("meta")).decode())
    else:
        tensors, md = read_safetensors(path)
        meta = json.loads(md["pywgtrain"])
    if edit_tensors:
        edit_tensors(tensors)
    if edit_meta:
        edit_meta(meta)
    raw = json.dumps(meta)
    if str(out).endswith(".npz"):
        np.savez(out, meta=np.frombuffer(raw.encode(), np.uint8), **tensors)
    else:
        with open(out, "wb") as f:
            write_safetensors(f, tensors, {"pywgtrain": raw})
    return out


def sep(fmt):
    return "/" if fmt == "npz" else "."


def weight(fmt):
    return f"model{sep(fmt)}0.weight"


def moment(fmt, i=0, which="exp_avg"):
    return f"optim{sep(fmt)}{i}{sep(fmt)}{which}"


def set_entry(name_of, value_of):
    def edit(t, fmt):
        name = name_of(fmt)
        t[name] = value_of(t[name])

    return edit


def set_group(key, value, gi=0):
    def edit(m):
        m["param_groups"][gi][key] = value

    return edit


# (id, tensor edit (tensors, fmt), meta edit, exception, message pattern)
BAD = [
    ("weight-missing", lambda t, f: t.pop(weight(f)), None, ValueError, "another model: missing keys"),
    ("weight-shape", set_entry(weight, lambda a: a[:, :3].copy()), None, ValueError, r"0\.weight has shape"),
    ("weight-int", set_entry(weight, lambda a: a.astype(np.int32)), None, TypeError, "int32, expected floating"),
    ("weight-uint8-bool", set_entry(weight, lambda a: (a > 0).astype(np.uint8)), None, TypeError, "uint8"),
    ("weight-f64-overflow", set_entry(weight, lambda a: np.full(a.shape, 1e39)), None, ValueError, "beyond float32"),
    ("moment-shape", set_entry(moment, lambda a: a.reshape(-1)), None, ValueError, r"state 0\.exp_avg has shape"),
    ("moment-int", set_entry(moment, lambda a: a.astype(np.int64)), None, TypeError, r"0\.exp_avg has dtype int64"),
    (
        "moment-sq-negative",
        set_entry(lambda f: moment(f, 1, "exp_avg_sq"), lambda a: -a - 1),
        None,
        ValueError,
        "negative",
    ),
    ("moment-missing", lambda t, f: t.pop(moment(f, 2)), None, ValueError, "state 2 must hold step, exp_avg and"),
    (
        "moment-unexpected",
        lambda t, f: t.update({moment(f, 9): t[moment(f)]}),
        None,
        ValueError,
        "names parameter 9|state 9 must hold",
    ),
    ("rng-size", lambda t, f: t.update(rng_state=t["rng_state"][:3]), None, ValueError, "RNG state is 4 integers"),
    ("groups-count", None, lambda m: m["param_groups"].pop(), ValueError, "has 1 parameter groups, this optimizer 2"),
    ("group-size", None, lambda m: m["param_groups"][1]["params"].pop(), ValueError, "group 1 has 1 parameters"),
    ("lr-negative", None, set_group("lr", -1.0, 1), ValueError, "group 1: Invalid learning rate"),
    ("lr-inf", None, set_group("lr", float("inf")), ValueError, "lr must be finite"),
    ("lr-nan", None, set_group("lr", float("nan")), ValueError, "lr must be finite"),
    ("lr-string", None, set_group("lr", "0.1"), ValueError, "lr must be a number, got str"),
    ("lr-bool", None, set_group("lr", True), ValueError, "lr must be a number, got bool"),
    ("betas-short", None, set_group("betas", [0.9]), ValueError, "betas must be a pair"),
    ("beta-one", None, set_group("betas", [0.9, 1.0]), ValueError, "Invalid beta parameter at index 1"),
    ("eps-zero", None, set_group("eps", 0.0), ValueError, "Invalid epsilon"),
    ("wd-inf", None, set_group("weight_decay", float("inf")), ValueError, "weight_decay must be finite"),
    ("group-unknown-option", None, set_group("momentum", 0.9), ValueError, r"unknown options \['momentum'\]"),
    ("max-grad-norm-negative", None, set_group("max_grad_norm", -1.0), ValueError, "max_grad_norm must be None"),
    ("max-grad-norm-disagree", None, set_group("max_grad_norm", 2.0), ValueError, "disagree on max_grad_norm"),
    ("step-count-missing", None, lambda m: m.pop("step_count"), ValueError, "no 'step_count'"),
    ("step-count-negative", None, lambda m: m.update(step_count=-1), ValueError, "'step_count' must be >= 0"),
    ("step-count-float", None, lambda m: m.update(step_count=3.0), ValueError, "'step_count' must be a int"),
    ("step-count-bool", None, lambda m: m.update(step_count=True), ValueError, "'step_count' must be a int"),
    ("param-step-negative", None, lambda m: m["steps"].update({"0": -2}), ValueError, "step must be an int >= 0"),
    ("param-step-float", None, lambda m: m["steps"].update({"0": 1.5}), ValueError, "step must be an int >= 0"),
    ("steps-not-index", None, lambda m: m["steps"].update({"x": 1}), ValueError, "names parameter 'x'"),
    ("steps-missing", None, lambda m: m.pop("steps"), ValueError, "no 'steps'"),
    ("groups-not-list", None, lambda m: m.update(param_groups={"lr": 1}), ValueError, "'param_groups' must be a list"),
]


@pytest.mark.parametrize("fmt", ["safetensors", "npz"])
@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_checkpoint_raises_before_anything_changes(saved, tmp_path, fmt, case):
    _, edit_tensors, edit_meta, exc, pattern = case
    tr, paths = saved
    bad = rewrite(
        paths[fmt],
        tmp_path / f"bad.{fmt}",
        edit_tensors and (lambda t: edit_tensors(t, fmt)),
        edit_meta,
    )
    before = everything(tr)
    with pytest.raises(exc, match=pattern) as info:
        tr.load(bad)
    assert str(bad) in str(info.value)
    assert_unchanged(before, everything(tr))
    # The good checkpoint still loads into the same trainer afterwards.
    assert tr.load(paths[fmt]) == {"epoch": 1}
    assert tr.step_count == 3


def test_npz_string_weights_and_pickles_are_refused(saved, tmp_path):
    tr, paths = saved
    before = everything(tr)
    strings = rewrite(paths["npz"], tmp_path / "s.npz", lambda t: t.update({weight("npz"): np.array(["a", "b"])}))
    with pytest.raises(ValueError, match="has shape|dtype"):
        tr.load(strings)
    pickled = tmp_path / "p.npz"
    with np.load(paths["npz"]) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["rng_state"] = np.array([{"a": 1}], dtype=object)
    np.savez(pickled, **arrays)
    with pytest.raises(ValueError, match="not a readable .npz checkpoint"):
        tr.load(pickled)
    assert_unchanged(before, everything(tr))


def test_load_state_dict_checks_every_entry_first(dev):
    model = pw.nn.MLP([6, 8, 3], device=dev, seed=0)
    before = model.state_dict()
    good = {k: np.zeros_like(v) for k, v in before.items()}
    for key, value, exc, pattern in [
        ("1.bias", np.zeros(4, np.float32), ValueError, r"1\.bias has shape \(4,\)"),
        ("1.bias", np.zeros(3, bool), TypeError, "bool"),
        ("1.bias", np.zeros(3, np.int64), TypeError, "int64"),
        ("1.bias", np.array(["a", "b", "c"]), TypeError, "str"),
        ("1.bias", np.full(3, -1e300), ValueError, "beyond float32"),
        ("1.bias", np.zeros(3, np.complex64), TypeError, "complex64"),
    ]:
        with pytest.raises(exc, match=pattern):
            model.load_state_dict({**good, key: value})
        for k, v in model.state_dict().items():
            np.testing.assert_array_equal(v, before[k], err_msg=k)
    # Accepted: float64 within range (rounded), float16, big-endian float32.
    model.load_state_dict({**good, "0.weight": good["0.weight"].astype(">f4") + 1, "1.bias": np.float16([1, 2, 3])})
    np.testing.assert_array_equal(model.state_dict()["0.weight"], np.ones_like(good["0.weight"]))
    np.testing.assert_array_equal(model.state_dict()["1.bias"], [1, 2, 3])


def test_optimizer_load_state_dict_checks_first(dev):
    tr = make_trainer(dev)
    train(tr, 2)
    sd = tr.optimizer.state_dict()
    before = everything(tr)
    bad = {**sd, "param_groups": [dict(sd["param_groups"][0]), dict(sd["param_groups"][1], lr=float("nan"))]}
    with pytest.raises(ValueError, match="group 1: lr must be finite"):
        tr.optimizer.load_state_dict(bad)
    bad = {**sd, "state": {**sd["state"], 3: {**sd["state"][3], "exp_avg": sd["state"][3]["exp_avg"][:2]}}}
    with pytest.raises(ValueError, match=r"state 3\.exp_avg has shape"):
        tr.optimizer.load_state_dict(bad)
    assert_unchanged(before, everything(tr))


def test_checked_state_is_applied_by_its_owner_only(dev):
    """check_state_dict changes nothing; load_state_dict applies its CheckedState as it is; another
    object's CheckedState is refused before anything changes (model, optimizer, scaler)."""
    tr, other = make_trainer(dev), make_trainer(dev)
    train(tr, 2)
    before = everything(tr)
    model_sd = {k: v + 1 for k, v in tr.model.state_dict().items()}
    osd = tr.optimizer.state_dict()
    checked_model = tr.model.check_state_dict(model_sd)
    checked_optim = tr.optimizer.check_state_dict(osd)
    scaler, other_scaler = pw.amp.GradScaler(init_scale=8.0), pw.amp.GradScaler()
    checked_scaler = scaler.check_state_dict({**other_scaler.state_dict(), "scale": 32.0})
    assert_unchanged(before, everything(tr))
    for owner, checked in (
        (other.model, checked_model),
        (other.optimizer, checked_optim),
        (other_scaler, checked_scaler),
    ):
        with pytest.raises(ValueError, match="another object"):
            owner.load_state_dict(checked)
    assert_unchanged(before, everything(tr))
    assert tr.model.load_state_dict(checked_model) == ([], [])
    for k, v in tr.model.state_dict().items():
        np.testing.assert_array_equal(v, model_sd[k], err_msg=k)
    tr.optimizer.load_state_dict(checked_optim)
    assert tr.optimizer.state_dict()["param_groups"] == osd["param_groups"]
    scaler.load_state_dict(checked_scaler)
    assert scaler.get_scale() == 32.0
    loose = tr.model.check_state_dict({"0.weight": model_sd["0.weight"], "extra": np.zeros(1)}, strict=False)
    assert "extra" in loose.unexpected and "0.weight" not in loose.missing and loose.missing


# -- malformed safetensors files ------------------------------------------------------


def raw_file(path, header, data=b"", pad=True):
    blob = header if isinstance(header, bytes) else json.dumps(header).encode()
    if pad:
        blob += b" " * (-len(blob) % 8)
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + data)
    return path


F4 = np.arange(4, dtype=np.float32).tobytes()
MALFORMED = [
    ("list", [1, 2], b"", "header is a JSON list"),
    ("number", 7, b"", "header is a JSON int"),
    ("no-dtype", {"w": {"shape": [4], "data_offsets": [0, 16]}}, F4, "entry 'w' has no dtype"),
    (
        "float-offsets",
        {"w": {"dtype": "F32", "shape": [4], "data_offsets": [0.0, 16.0]}},
        F4,
        "entry 'w': data_offsets",
    ),
    ("bool-shape", {"w": {"dtype": "F32", "shape": [True], "data_offsets": [0, 4]}}, F4[:4], "entry 'w': shape"),
    ("entry-not-object", {"w": [1, 2]}, b"", "entry 'w' is a list"),
    (
        "unknown-dtype",
        {"w": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}},
        F4[:4],
        "entry 'w' has dtype BF16",
    ),
    ("size-mismatch", {"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}}, F4, "entry 'w': data_offsets"),
    (
        "overlap",
        {
            "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
            "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
        },
        F4[:12],
        "entry 'b' .*overlaps 'a'",
    ),
    (
        "gap",
        {
            "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
            "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]},
        },
        F4,
        "entry 'b' .*gap after 'a'",
    ),
    ("truncated-data", {"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, F4[:8], "truncated"),
    ("trailing-data", {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, F4, "describes 8 bytes"),
    ("metadata-not-strings", {"__metadata__": {"a": 1}}, b"", "__metadata__ must be an object of strings"),
]


@pytest.mark.parametrize("case", MALFORMED, ids=[c[0] for c in MALFORMED])
def test_malformed_safetensors_are_refused(tmp_path, case):
    _, header, data, pattern = case
    path = raw_file(tmp_path / "m.safetensors", header, data)
    with pytest.raises(ValueError, match=pattern) as info:
        read_safetensors(path)
    assert str(path) in str(info.value)


def test_duplicate_keys_and_a_cut_inside_the_padding(tmp_path):
    entry = '{"dtype":"F32","shape":[1],"data_offsets":[0,4]}'
    dup = raw_file(tmp_path / "d.safetensors", f'{{"w":{entry},"w":{entry}}}'.encode(), F4[:4])
    with pytest.raises(ValueError, match="names 'w' twice"):
        read_safetensors(dup)
    # A file cut inside the header's trailing spaces: the JSON still parses, the header is short.
    good = tmp_path / "g.safetensors"
    with open(good, "wb") as f:
        write_safetensors(f, {"w": np.ones(1, np.float32)})
    n = struct.unpack("<Q", good.read_bytes()[:8])[0]
    raw = good.read_bytes()
    assert raw[8 + n - 1 : 8 + n] == b" "  # there is padding to cut into
    cut = tmp_path / "c.safetensors"
    cut.write_bytes(raw[: 8 + n - 1])
    with pytest.raises(ValueError, match=f"{cut}: truncated inside its header"):
        read_safetensors(cut)
    np.testing.assert_array_equal(read_safetensors(good)[0]["w"], [1.0])


def test_official_reader_agrees_on_what_is_valid(tmp_path):
    st = pytest.importorskip("safetensors.numpy")
    from safetensors import SafetensorError

    for name, header, data, _ in MALFORMED:
        if name == "unknown-dtype":
            continue  # BF16 is valid safetensors; NumPy (either reader) has no such dtype
        path = raw_file(tmp_path / f"{name}.safetensors", header, data)
        with pytest.raises(SafetensorError):
            st.load_file(str(path))


# -- saving: suffix case, symbolic links, big-endian batches ----------------------------


def test_upper_case_suffix_is_safetensors(dev, tmp_path):
    tr = make_trainer(dev)
    train(tr, 2)
    path = tmp_path / "RUN.SAFETENSORS"
    tr.save(path)
    assert path.read_bytes()[:4] != b"PK\x03\x04"
    tensors, md = read_safetensors(path)
    assert "pywgtrain" in md and "model.0.weight" in tensors
    other = make_trainer(dev, seed=5)
    other.load(path)
    assert_unchanged(everything(tr), everything(other))


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="symbolic links")
def test_save_through_a_symlink_replaces_the_target(dev, tmp_path):
    tr = make_trainer(dev)
    train(tr, 2)
    target = tmp_path / "store" / "run.safetensors"
    target.parent.mkdir()
    target.write_bytes(b"old")
    link = tmp_path / "latest.safetensors"
    link.symlink_to(target)
    tr.save(link)
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert read_safetensors(target)[0]["model.0.weight"].shape == (8, 6)
    assert sorted(os.listdir(target.parent)) == ["run.safetensors"]  # no temporary file left


def test_big_endian_batch_trains_like_native(dev):
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((4, 6)).astype(np.float32), rng.integers(0, 3, 4)
    a, b = make_trainer(dev), make_trainer(dev)
    got = [a.step(x.astype(">f4"), y).item() for _ in range(3)]
    want = [b.step(x, y).item() for _ in range(3)]
    assert got == want
    with pytest.raises(TypeError, match="float32 .* got float64"):
        a.step(x.astype(">f8"), y)


def test_gpt_resume_at_or_past_steps_says_so(tmp_path, capsys):
    from pywgtrain.cli.gpt_demo import run_gpt

    ckpt = tmp_path / "run.safetensors"
    small = dict(
        config="tiny", batch_size=2, block_size=16, max_bytes=200_000, eval_iters=1, plot=None, sample_tokens=0
    )
    run_gpt(steps=2, checkpoint=str(ckpt), **small)
    capsys.readouterr()
    result = run_gpt(steps=2, resume=str(ckpt), **small)
    out = capsys.readouterr().out
    assert f"{ckpt} is at step 2, at or past --steps 2: nothing to train" in out
    assert result["step"] == 2 and result["train_losses"] == []
