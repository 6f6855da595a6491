"""Host cost of small eager operations: what Python, recording and submitting
cost per call when the GPU work is trivial (one row of a 384-wide model).
Inside ``dev.batch()`` a call records into the open batch; outside it into
the device's stream (submitted every 64 commands); nothing waits inside those
timed loops. "then synchronize" is one call submitted and waited for on its own.
"_core.gemm ... recorded" is the core's recording of one GEMM on the same
tensors again and again into one recorder, submitted after the clock stops
(no Python op layer, no allocation, no submission): what the bind-group cache
spares shows there (``PYWGTRAIN_BIND_GROUP_CACHE=0`` turns it off for an A/B).
CPU adapters record a 64x64x64 product, GPUs 64x768x768; on CPU adapters the
linear layer is 384 -> 64 (GPUs: 384 -> 1536) and the loops are shorter, since
there the device's own work runs on the same cores. "pw.gemm" is one call of
bench/gemm_stream.py's loop (64 x 768 x 768 on GPUs), "(nothing recorded) then
synchronize" a synchronize alone, "_core.binary, submit, wait" the core's part of
"x + y then synchronize". ``--json PATH`` also writes the rows.

    python bench/eager_costs.py [--json PATH]   # any adapter; on the GPU machine after the prelude
"""

import argparse
import json
import statistics
import time

import numpy as np

import pywgtrain as pw
import pywgtrain.nn.functional as F
from pywgtrain import _core
from pywgtrain._opcodes import BINARY
from pywgtrain.benchmarks.common import is_cpu_adapter


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="also write the rows (name, min_us, median_us) to this file")
    args = parser.parse_args()
    dev = pw.Device()
    cpu = is_cpu_adapter(dev)
    out_f = 64 if cpu else 1536
    x = pw.tensor(np.ones((1, 384), np.float32), dev)
    y = pw.tensor(np.ones((1, 384), np.float32), dev)
    w = pw.tensor(np.ones((out_f, 384), np.float32), dev)
    b = pw.tensor(np.ones((out_f,), np.float32), dev)
    print(f"adapter: {dev.info['name']}")
    rows = []

    def report(name, where, per_call):
        label = name + " " + where
        rows.append({"name": label, "min_us": min(per_call), "median_us": statistics.median(per_call)})
        print(f"{label:52s} {min(per_call):7.2f} us per call (median {statistics.median(per_call):7.2f})", flush=True)

    def timed(name, fn, batch, n=2000, sync=False):
        n = max(n // 8, 50) if cpu else n
        per_call = []
        for _ in range(5):
            dev.synchronize()
            t0 = time.perf_counter()
            if batch:
                with dev.batch():
                    for _ in range(n):
                        fn()
            elif sync:
                for _ in range(n):
                    fn()
                    dev.synchronize()
            else:
                for _ in range(n):
                    fn()
            per_call.append((time.perf_counter() - t0) * 1e6 / n)
            dev.synchronize()
        report(name, "in a batch" if batch else "then synchronize" if sync else "outside a batch", per_call)

    timed("_core._Buffer(1536 bytes), created and freed", lambda: _core._Buffer(dev._dev, 1536), batch=False)
    timed("pw.empty((1, 384)), created and freed", lambda: pw.empty((1, 384), np.float32, dev), batch=False)
    for batch in (True, False):
        timed("x + y", lambda: x + y, batch)
        timed("F.linear(x, w, b)", lambda: F.linear(x, w, b), batch)
    m, nk = (64, 64) if cpu else (64, 768)
    ga, gb, gc = (pw.tensor(np.ones(s, np.float32), dev) for s in ((m, nk), (nk, nk), (m, nk)))
    timed(f"pw.gemm(a, b) {m}x{nk}x{nk}", lambda: pw.gemm(ga, gb), batch=False)
    per_call = []
    for _ in range(20):  # 50 calls into one recorder, submitted after the clock stops
        dev.synchronize()
        rec = _core._Recorder(dev._dev)
        t0 = time.perf_counter()
        for _ in range(50):
            _core.gemm(rec, ga._buf, gb._buf, gc._buf, m, nk, nk, False, False, 1.0, 0.0)
        per_call.append((time.perf_counter() - t0) * 1e6 / 50)
        rec.submit()
    report(f"_core.gemm {m}x{nk}x{nk}", "recorded", per_call)
    timed("(nothing recorded)", lambda: None, batch=False, n=500, sync=True)
    xb, yb, zb, rec = x._buf, y._buf, _core._Buffer(dev._dev, 384 * 4), _core._Recorder(dev._dev)

    def core_add_sync():  # what "x + y then synchronize" costs without the Python layers
        _core.binary(rec, BINARY["add"], xb, yb, zb, [1, 384], [384, 1], [384, 1], 0.0)
        rec.submit()
        dev._dev.wait(0)

    timed("_core.binary, submit, wait (no Python layers)", core_add_sync, batch=False, n=500)
    timed("x + y", lambda: x + y, batch=False, n=500, sync=True)
    timed("F.linear(x, w, b)", lambda: F.linear(x, w, b), batch=False, n=500, sync=True)
    timed("x[:, :128]", lambda: x[:, :128], batch=True)
    timed("x.reshape(1, 6, 64).permute(1, 0, 2)", lambda: x.reshape(1, 6, 64).permute(1, 0, 2), batch=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"adapter": dev.info["name"], "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
