"""Disassemble the SASS the NVIDIA Vulkan driver compiled for our pipelines,
to read register use and the instruction mix of a kernel (docs/gemm_notes.md
#34). The driver keeps compiled pipelines in its shader disk cache: zstd
frames, each holding one pipeline's container, whose instructions start 8
bytes past the offset its header holds at 0x50 (0x198 for the 8x4 GEMM) and
end with EXIT (an observed layout, not a documented one).
On the GPU machine, fill a cache and bring it back (that machine has no
zstd; nvdisasm comes with the Triton wheel its PyTorch ships, copy it too):

    __GL_SHADER_DISK_CACHE=1 __GL_SHADER_DISK_CACHE_PATH=/tmp/glcache __GL_SHADER_DISK_CACHE_SKIP_CLEANUP=1 \\
        python3 -m pywgtrain bench gemm --no-baseline --shapes 4096x4096x4096:NT
    tar czf $OUT/cache.tgz /tmp/glcache

then here, with zstd installed and that nvdisasm on PATH:

    python3 bench/sass_dump.py tmp/glcache sass/

writes one pipelineN.sass per compiled pipeline and prints each one's highest
register and its counts of FFMA, LDS, LDG, STS, MOV, BAR and the local-memory
loads and stores of spilled registers (LDL, STL).
"""

import glob
import os
import re
import shutil
import struct
import subprocess
import sys

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
CODE_START = 0x198
EXIT = b"\x4d\x79"  # low bytes of the SM90 EXIT encoding


def frames(blob):
    starts = [m.start() for m in re.finditer(re.escape(ZSTD_MAGIC), blob)]
    for i, s in enumerate(starts):
        yield blob[s : starts[i + 1] if i + 1 < len(starts) else len(blob)]


def code_range(raw):
    """Where the instructions lie in a container: 8 bytes past the offset the
    header holds at 0x50 (u32), up to the last EXIT after it. Kernels with
    more registers or local memory have a longer header (offset 0x1d0 or
    0x1f0 instead of 0x190), so the start is read, not fixed."""
    start = CODE_START
    if len(raw) >= 0x54:
        header = struct.unpack_from("<I", raw, 0x50)[0] + 8
        if 0x100 <= header < len(raw) and header % 8 == 0:
            start = header
    exits = [i for i in range(start, len(raw) - 1, 16) if raw[i : i + 2] == EXIT]
    return start, (exits[-1] + 16 if exits else 0)


def decompress(frame):
    r = subprocess.run(["zstd", "-d", "-c"], input=frame, capture_output=True)
    return r.stdout


def nvdisasm():
    try:
        import triton

        hits = glob.glob(os.path.join(os.path.dirname(triton.__file__), "**", "nvdisasm"), recursive=True)
        if hits:
            return hits[0]
    except ImportError:
        pass
    return shutil.which("nvdisasm")


def main(cache, out):
    tool = nvdisasm()
    if tool is None or shutil.which("zstd") is None:
        sys.exit("needs nvdisasm (Triton wheel or PATH) and the zstd command")
    os.makedirs(out, exist_ok=True)
    n = 0
    for path in sorted(glob.glob(os.path.join(cache, "**", "*.bin"), recursive=True)):
        for frame in frames(open(path, "rb").read()):
            raw = decompress(frame)
            if not raw.startswith(b"NVDA"):
                continue
            start, end = code_range(raw)
            if end <= start:
                continue
            code = os.path.join(out, f"pipeline{n}.bin")
            with open(code, "wb") as f:
                f.write(raw[start:end])
            sass = subprocess.run([tool, "-b", "SM90", code], capture_output=True, text=True).stdout
            os.remove(code)
            with open(os.path.join(out, f"pipeline{n}.sass"), "w") as f:
                f.write(sass)
            regs = max((int(r) for r in re.findall(r"\bR(\d+)\b", sass)), default=-1)
            ops = ("FFMA", "LDS", "LDG", "STS", "MOV", "BAR", "LDL", "STL")
            counts = {op: len(re.findall(rf"\s{op}[\s.]", sass)) for op in ops}
            print(f"pipeline{n}: highest register R{regs}, " + ", ".join(f"{k} {v}" for k, v in counts.items()))
            n += 1
    print(f"{n} pipelines")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
