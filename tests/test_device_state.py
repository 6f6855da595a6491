"""State pywgtrain keeps outside tensors: the per-device Python caches
(declared on the Device, not stuffed into its __dict__)."""
import numpy as np

import pywgtrain as pw
from pywgtrain.device import DeviceCache

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
