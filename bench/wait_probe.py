"""Does a wait for the GPU block until it is done? 64 GEMMs of 2048^3 (~24 ms
on the H100) per trial, wall clock around submit + Device.wait and around
submit + synchronize(), then a readback. Until session 12 both waits returned
in under 1 ms on the H100 (docs/performance.md, measurement caveats).

    source .gpu/prelude.sh && python3 bench/wait_probe.py
"""

import time

import pywgtrain as pw
from pywgtrain import _core

N = 2048
GEMMS = 64


def record(dev, a, c):
    dev.flush()  # work recorded outside this recording (the operands' clears) goes first
    rec = _core._Recorder(dev._dev)
    for _ in range(GEMMS):
        _core.gemm(rec, a._buf, a._buf, c._buf, N, N, N, False, False, 1.0, 0.0)
    return rec


def main():
    dev = pw.Device()
    dev.gemm_autotune = False  # the same plan every trial, no tuning runs in between
    a = pw.zeros((N, N), device=dev)
    c = pw.zeros((N, N), device=dev)
    for _ in range(3):
        rec = record(dev, a, c)
        t0 = time.perf_counter()
        dev._dev.wait(rec.submit())
        t1 = time.perf_counter()
        c.numpy()
        t2 = time.perf_counter()
        print(f"submit+wait {1e3 * (t1 - t0):.2f} ms, then readback {1e3 * (t2 - t1):.2f} ms", flush=True)
        rec = record(dev, a, c)
        t0 = time.perf_counter()
        rec.submit()
        dev.synchronize()
        print(f"submit+synchronize {1e3 * (time.perf_counter() - t0):.2f} ms", flush=True)


if __name__ == "__main__":
    main()
