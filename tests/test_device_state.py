"""State pywgtrain keeps outside tensors: the process environment (importing
the package or opening a device leaves it as it was) and the per-device
Python caches (declared on the Device, not stuffed into its __dict__)."""

import json
import os
import subprocess
import sys

import numpy as np

import pywgtrain as pw
from pywgtrain.device import DeviceCache

PROBE = """
import json, os, sys
import numpy as np
before = dict(os.environ)
import pywgtrain as pw
after_import = dict(os.environ)
pw.list_adapters()
dev = pw.Device()
(pw.tensor(np.ones(4, np.float32), dev) * 2.0).numpy()
print(json.dumps({"import": after_import == before, "device": dict(os.environ) == before,
                  "xdg": os.environ.get("XDG_RUNTIME_DIR")}))
"""


def _probe(env, cwd):
    # cwd outside the checkout: `-c` puts it first on sys.path, and the source tree has no extension.
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def test_import_and_device_leave_the_environment_unchanged(tmp_path):
    """With XDG_RUNTIME_DIR unset (headless machines, CI) neither the import
    nor opening a device changes os.environ, and Mesa's device-selection
    layer still says nothing about the variable on stderr."""
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    result, err = _probe(env, tmp_path)
    assert result == {"import": True, "device": True, "xdg": None}, result
    assert "XDG_RUNTIME_DIR" not in err, err


def test_a_set_runtime_dir_is_left_alone(tmp_path):
    env = dict(os.environ, XDG_RUNTIME_DIR=str(tmp_path))
    result, _ = _probe(env, tmp_path)
    assert result == {"import": True, "device": True, "xdg": str(tmp_path)}, result


def test_device_caches_are_declared_per_device():
    """Scratch tensors (clip_grad_norm_) and the autograd's seed 1.0 live in
    Device._cache, one per device."""
    a, b = pw.Device(), pw.Device()
    assert isinstance(a._cache, DeviceCache) and a._cache is not b._cache
    assert a._cache.scratch == {} and a._cache.one is None
    p = pw.tensor(np.ones(4, np.float32), a, requires_grad=True)
    (p * p).sum().backward()
    one = a._cache.one
    assert one is not None and one.device is a and one.numpy().tolist() == [1.0]
    (p * 2.0).sum().backward()
    assert a._cache.one is one  # uploaded once, reused
    pw.clip_grad_norm_([p], 1.0)
    assert a._cache.scratch and all(t.device is a for t in a._cache.scratch.values())
    assert b._cache.scratch == {} and b._cache.one is None
    assert not {"_scratch", "_autograd_one"} & set(vars(a))
