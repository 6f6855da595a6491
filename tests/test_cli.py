"""The command line and the set-up scripts: one-line errors with exit codes
instead of tracebacks, argument validation before any GPU work, help text,
progress output fit for logs, checkpoints saved periodically and on Ctrl-C,
resume running only the remaining steps, benchmarks that finish on a CPU
adapter, what `pywgtrain info` says on a machine without a driver, and the
README's two set-up commands."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import pywgtrain as pw
from helpers import spawn_interruptible
from pywgtrain.cli import driver_help, main

ROOT = Path(__file__).resolve().parents[1]
ENTRY = shutil.which("pywgtrain", path=os.path.dirname(sys.executable)) or shutil.which("pywgtrain")
SMALL = ["--hidden", "32", "--plot", ""]  # a small model: CLI behaviour, not accuracy


def run_main(capsys, argv):
    """main(argv) in this process -> (exit code, stdout, stderr); argparse's own exits included."""
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def run_entry(args, timeout=300, **kw):
    """The installed `pywgtrain` entry point in a subprocess, outside the checkout."""
    assert ENTRY, "the pywgtrain entry point is not installed next to this Python"
    kw.setdefault("cwd", "/")
    return subprocess.run([ENTRY, *args], capture_output=True, text=True, timeout=timeout, **kw)


def checkpoint_step(path):
    with np.load(path) as z:
        return json.loads(bytes(z["meta"]).decode())["step_count"]


# -- usage and errors ------------------------------------------------------------


def test_help_names_the_command_and_shows_defaults(capsys):
    code, out, _ = run_main(capsys, ["--help"])
    assert code == 0
    assert out.startswith("usage: pywgtrain ") and "python -m" not in out
    code, out, _ = run_main(capsys, ["train", "--help"])
    assert code == 0 and out.startswith("usage: pywgtrain train ")
    for text in (
        "(default: 64)",
        "(default: 30)",
        "(default: 0.001)",
        "(default: loss_curve.png)",
        "(default: [256, 256])",
        "--save-every",
        "--resume",
    ):
        assert text in " ".join(out.split()), text
    code, out, _ = run_main(capsys, ["bench", "--help"])
    assert code == 0 and "(default: False)" in out


@pytest.mark.parametrize(
    "argv,message",
    [
        (["train", "--epochs", "0"], "argument --epochs: must be an integer >= 1, got 0"),
        (["train", "--steps", "0"], "argument --steps: must be an integer >= 1, got 0"),
        (["train", "--batch-size", "0"], "argument --batch-size: must be an integer >= 1, got 0"),
        (["train", "--batch-size", "-4"], "argument --batch-size: must be an integer >= 1, got -4"),
        (["train", "--batch-size", "x"], "argument --batch-size: expected an integer >= 1, got 'x'"),
        (["train", "--hidden", "32", "0"], "argument --hidden: must be an integer >= 1, got 0"),
        (["train", "--lr", "nan"], "argument --lr: must be a finite number >= 0"),
        (["train", "--seed", "-1"], "argument --seed: must be an integer >= 0"),
        (["train", "--batch-size", "5000"], "batch size 5000 is larger than the 1437 training samples"),
        (["train", "--save-every", "5"], "--save-every needs --checkpoint"),
        (["train", "--checkpoint", "{tmp}/missing/run.npz"], "directory '{tmp}/missing' does not exist"),
        (["train", "--checkpoint", "{tmp}"], "is a directory"),
        (["train", "--plot", "{tmp}/missing/loss.png"], "directory '{tmp}/missing' does not exist"),
        (["train", "--plot", "{tmp}/loss.xyz"], "matplotlib cannot write .xyz files"),
        (["train", "--resume", "{tmp}/none.npz"], "--resume '{tmp}/none.npz': no such file"),
        (["train", "--adapter", "no-such-gpu"], "no adapter name contains 'no-such-gpu'"),
        (["bench", "gemm", "--shapes", "0x4x4"], "bad GEMM shape '0x4x4': every dimension must be >= 1"),
        (["bench", "gemm", "--shapes", "64x64"], "bad GEMM shape '64x64': expected MxKxN"),
        (["bench", "gemm", "--shapes", "4x4x4:NX"], "must be NN, NT, TN or TT"),
        (["bench", "gemm", "--json", "{tmp}/missing/b.json"], "directory '{tmp}/missing' does not exist"),
        (
            ["bench", "transfer", "--sizes", "1X"],
            "bad transfer size '1X': expected a number with an optional K, M or G",
        ),
        (["bench", "transfer", "--sizes", "6,0K"], "bad transfer size '0K': must be a positive multiple of 4 bytes"),
        (["info", "--adapter", "99"], "adapter index 99 out of range"),
    ],
)
def test_usage_errors_exit_2_with_one_line(capsys, tmp_path, argv, message):
    """Bad arguments: `pywgtrain: error: ...` (or argparse's usage line), exit 2,
    no traceback, and no training or benchmark started."""
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    code, out, err = run_main(capsys, argv)
    assert code == 2, (out, err)
    assert message.replace("{tmp}", str(tmp_path)) in err
    assert re.search(r"^pywgtrain( \w+)?: error: ", err, re.M), err
    assert "Traceback" not in err
    assert "compiling kernels" not in out and "pywgtrain " not in out  # nothing ran


@pytest.mark.parametrize(
    "exc,code",
    [
        (pw.GpuError("device fell off the bus"), 1),
        (pw.OutOfMemoryError("allocating 9 bytes: out of memory"), 1),
        (OSError(28, "No space left on device"), 1),
        (RuntimeError("the training step of this loss was discarded"), 1),
        (ValueError("labels must lie in [0, 10)"), 2),
        (TypeError("x must have dtype float32, got float64"), 2),
    ],
)
def test_errors_become_one_line_and_exit_code(capsys, monkeypatch, exc, code):
    def fail(**kwargs):
        raise exc

    monkeypatch.setattr("pywgtrain.cli.demo.run_demo", fail)
    got, _, err = run_main(capsys, ["train"])
    assert got == code
    assert err.strip().splitlines() == [f"pywgtrain: error: {exc}"]


def test_unexpected_exceptions_keep_their_traceback(monkeypatch):
    """A bug is not an error message: it propagates (with its traceback)."""

    def fail(**kwargs):
        raise ZeroDivisionError("bug")

    monkeypatch.setattr("pywgtrain.cli.demo.run_demo", fail)
    with pytest.raises(ZeroDivisionError):
        main(["train"])


def test_traceback_on_request(monkeypatch):
    def fail(**kwargs):
        raise ValueError("bad")

    monkeypatch.setattr("pywgtrain.cli.demo.run_demo", fail)
    monkeypatch.setenv("PYWGTRAIN_TRACEBACK", "1")
    with pytest.raises(ValueError, match="bad"):
        main(["train"])


# -- no driver ---------------------------------------------------------------------


@pytest.mark.skipif(sys.platform != "linux", reason="simulates a Linux machine without a Vulkan driver")
def test_info_without_a_driver_says_what_to_install():
    env = dict(os.environ, VK_ICD_FILENAMES="/nonexistent", VK_DRIVER_FILES="/nonexistent")
    r = run_entry(["info"], timeout=120, env=env)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    assert "no WebGPU adapter found" in r.stderr
    assert "sudo apt-get install mesa-vulkan-drivers libvulkan1" in r.stderr
    assert "dnf install mesa-vulkan-drivers" in r.stderr and "vulkan-swrast" in r.stderr
    # Every command that needs a device says the same.
    r = run_entry(["train", "--steps", "1", *SMALL], timeout=120, env=env)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "pywgtrain: error: no WebGPU adapter found" in r.stderr and "mesa-vulkan-drivers" in r.stderr


def test_driver_help_per_os():
    debian = driver_help("Linux", ["debian"])
    assert "apt-get install mesa-vulkan-drivers libvulkan1   <- this system" in debian
    fedora = driver_help("Linux", ["fedora"])
    assert "dnf install mesa-vulkan-drivers vulkan-loader   <- this system" in fedora
    arch = driver_help("Linux", ["arch"])
    assert "pacman -S vulkan-swrast" in arch and "<- this system" in arch
    mac = driver_help("Darwin")
    assert "Metal" in mac and "10.13" in mac and "nothing to install" in mac
    win = driver_help("Windows")
    assert "DirectX 12" in win and "Vulkan" in win and "driver" in win


# -- train: progress, checkpoints, resume, Ctrl-C ----------------------------------


def test_train_output_for_logs_is_plain_lines():
    """Redirected output: no progress bar (no carriage returns), a line every
    --log-every steps, and word of the first step's kernel compilation."""
    r = run_entry(["train", "--steps", "30", "--log-every", "10", *SMALL], timeout=300)
    assert r.returncode == 0, r.stderr
    assert "\r" not in r.stdout + r.stderr
    assert re.search(r"^compiling kernels \(first step\)\.\.\. done in \d+\.\d s$", r.stdout, re.M), r.stdout
    steps = re.findall(r"^step (\d+)/30 \(epoch \d+\): loss \d+\.\d+", r.stdout, re.M)
    assert steps == ["10", "20", "30"], r.stdout
    assert "held-out accuracy" in r.stdout


def test_train_saves_periodically_and_resume_runs_the_remaining_steps(capsys, tmp_path, monkeypatch):
    from pywgtrain.train import Trainer

    saved = []
    real_save = Trainer.save

    def recording_save(self, path):
        saved.append(self.step_count)
        real_save(self, path)

    monkeypatch.setattr(Trainer, "save", recording_save)
    full = tmp_path / "full.npz"
    code, out, err = run_main(
        capsys,
        [
            "train",
            "--steps",
            "30",
            "--save-every",
            "10",
            "--checkpoint",
            str(full),
            "--hidden",
            "32",
            "--plot",
            str(tmp_path / "loss.png"),
        ],
    )
    assert code == 0, err
    assert saved == [10, 20, 30]
    assert (tmp_path / "loss.png").stat().st_size > 0
    assert f"checkpoint: {full} (step 30)" in out

    # Interrupted after 12 steps, resumed to 30: the remaining 18 steps run,
    # on the data an uninterrupted run would have seen, to the same weights.
    part = tmp_path / "part.npz"
    assert run_main(capsys, ["train", "--steps", "12", "--checkpoint", str(part), *SMALL])[0] == 0
    saved.clear()
    code, out, err = run_main(
        capsys, ["train", "--steps", "30", "--resume", str(part), "--checkpoint", str(part), *SMALL]
    )
    assert code == 0, err
    assert "resumed from" in out and "at step 12: 18 of 30 steps left" in out
    assert "over 17 steps" in out  # 18 run, the first (kernel compilation) not timed
    assert saved == [22, 30]  # once per epoch (22 steps at batch 64) and at the end
    with np.load(full) as a, np.load(part) as b:
        assert sorted(a.files) == sorted(b.files)
        for k in a.files:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)

    # Nothing left: no step runs, the model is evaluated.
    code, out, _ = run_main(capsys, ["train", "--steps", "30", "--resume", str(full), *SMALL])
    assert code == 0
    assert "0 of 30 steps left (nothing to train)" in out and "compiling kernels" not in out
    assert "held-out accuracy" in out


@pytest.mark.skipif(os.name != "posix", reason="POSIX signals")
def test_ctrl_c_saves_a_checkpoint_and_exits_130(tmp_path):
    ckpt = tmp_path / "run.npz"
    proc = spawn_interruptible(
        [ENTRY, "train", "--epochs", "1000", "--log-every", "5", "--checkpoint", str(ckpt), *SMALL], tmp_path
    )
    try:
        for line in proc.stdout:
            if line.startswith("step 10/"):
                proc.send_signal(signal.SIGINT)
                break
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    m = re.search(
        r"pywgtrain: interrupted at step (\d+) of 22000; checkpoint saved to (\S+); "
        r"continue with the same options and --resume",
        err,
    )
    assert m, err
    step = int(m.group(1))
    assert 10 <= step < 22000 and m.group(2) == str(ckpt)
    assert "Traceback" not in err
    assert checkpoint_step(ckpt) == step
    # --resume runs what is left of the run it is given.
    r = run_entry(["train", "--steps", str(step + 3), "--resume", str(ckpt), "--checkpoint", str(ckpt), *SMALL])
    assert r.returncode == 0, r.stderr
    assert f"at step {step}: 3 of {step + 3} steps left" in r.stdout
    assert checkpoint_step(ckpt) == step + 3


# -- bench ---------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("what", ["gemm", "adamw", "train", "gpt", "transfer", "all"])
def test_bench_quick_finishes_with_progress(tmp_path, what):
    """Each bench subcommand with --quick through the entry point, with a
    timeout: on lavapipe they used to run for 20 minutes without a word."""
    out_json = tmp_path / "b.json"
    r = run_entry(["bench", what, "--quick", "--no-baseline", "--json", str(out_json)], timeout=240)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    res = json.loads(out_json.read_text())
    kinds = ["gemm", "adamw", "train", "gpt", "transfer"] if what == "all" else [what]
    assert [k for k in res if k != "meta"] == kinds
    if "gemm" in kinds:
        n = len(res["gemm"])
        assert len(re.findall(r"^\[\d+/%d\] \d+x\d+x\d+ [NT]{2}: pywgtrain .* [TGM]FLOP/s$" % n, r.stdout, re.M)) == n
        assert all(row["pywgtrain_us"] > 0 for row in res["gemm"])
    if "adamw" in kinds:
        m = re.search(r"AdamW \d+ params: pywgtrain [\d.]+ us \(([\d.]+) (GB|MB)/s\)", r.stdout)
        assert m and float(m.group(1)) > 0, r.stdout
    if "train" in kinds:
        assert len(res["train"]) == 2 and all(row["pywgtrain_us"] > 0 for row in res["train"])
    if "transfer" in kinds:
        rows = res["transfer"]["rows"]
        assert rows and all(row["up_us"] > 0 and row["down_us"] > 0 for row in rows)


def test_bench_gemm_one_small_shape_is_quick():
    """`bench gemm --quick --no-baseline --shapes 64x64x64` once ran 1146 s (a
    2048^3 warm-up ignoring --quick) on lavapipe."""
    r = run_entry(["bench", "gemm", "--quick", "--no-baseline", "--shapes", "64x64x64"], timeout=60)
    assert r.returncode == 0, r.stderr
    assert re.search(r"^\[1/1\] 64x64x64 NN: pywgtrain", r.stdout, re.M), r.stdout


def test_bench_transfer_small_sizes(tmp_path):
    """`bench transfer` at small sizes: a line per size, the table, GB/s in the JSON."""
    out_json = tmp_path / "t.json"
    r = run_entry(["bench", "transfer", "--sizes", "64K,4M", "--no-baseline", "--json", str(out_json)], timeout=120)
    assert r.returncode == 0, r.stderr
    rate = r"[\d.]+ [MG]B/s"
    line = rf"^\[1/2\] 64 KiB: pywgtrain up {rate}, down {rate} \(out= {rate}, fresh array {rate}\)$"
    assert re.search(line, r.stdout, re.M), r.stdout
    assert re.search(r"^\s+4 MiB(\s+[\d.]+){4}$", r.stdout, re.M), r.stdout
    res = json.loads(out_json.read_text())["transfer"]
    assert [row["bytes"] for row in res["rows"]] == [64 << 10, 4 << 20]
    keys = ("up_us", "down_us", "down_out_us", "down_fresh_us")  # numpy(): pooled at 4 MiB
    assert all(row[k] > 0 for row in res["rows"] for k in keys)
    assert res["settings"]["chunk_bytes"] == 32 << 20


def test_bandwidth_and_flop_units():
    from pywgtrain.benchmarks.common import fmt_bandwidth, fmt_flops

    assert fmt_bandwidth(0.5) == "0.5 MB/s"  # bytes per microsecond in, never "0 GB/s" out
    assert fmt_bandwidth(300) == "300.0 MB/s"
    assert fmt_bandwidth(2100) == "2.1 GB/s"
    assert fmt_bandwidth(3.0e6) == "3000 GB/s"
    assert fmt_flops(40.6e6).strip() == "40.60 TFLOP/s"
    assert fmt_flops(3.1e3).strip() == "3.10 GFLOP/s"


# -- the README's set-up commands ---------------------------------------------------


def test_readme_has_two_setup_commands_and_ci_runs_both():
    readme = (ROOT / "README.md").read_text()
    setup = readme.split("## Set up on a fresh machine", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```bash\n(.*?)\n```", setup, re.S)
    assert commands == ["bash scripts/train.sh", "bash scripts/test.sh"], commands
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^bash scripts/test\.sh$", ci, re.M)
    assert re.search(r"^bash scripts/train\.sh --steps \d+ ", ci, re.M)


def test_readme_python_example_runs(tmp_path):
    """The README's Python block runs as written (in a process of its own: it opens devices)."""
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert len(blocks) == 1
    script = tmp_path / "readme_example.py"
    script.write_text(blocks[0])
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    loss, norm = (float(v) for v in done.stdout.split()[:2])  # the first print: loss and gradient norm
    assert 0.0 < loss < 10.0 and norm > 0.0


def test_readme_lists_every_environment_variable():
    """Each variable the C++ core, the package, the scripts and the benchmarks
    read appears in the README's table, or in docs/gemm_notes.md's table of
    the GEMM's experiment switches."""
    patterns = [
        r'getenv\("(\w+)"\)',
        r'env_switched_off\("(\w+)"\)',
        r'environ\.get\("(\w+)"',
        r'environ\["(\w+)"\]',
        r"\$\{([A-Za-z_]\w*):-",
    ]
    found = set()
    for top in ("csrc", "pywgtrain", "scripts", "bench"):
        for path in (ROOT / top).rglob("*"):
            if path.suffix in (".cpp", ".hpp", ".py", ".pyx", ".sh") or path.name == "prepare":
                text = path.read_text(errors="replace")
                for pattern in patterns:
                    found |= set(re.findall(pattern, text))
    table = (ROOT / "README.md").read_text().split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    table += (ROOT / "docs" / "gemm_notes.md").read_text().split("## Environment switches for experiments", 1)[1]
    assert {"PYWGTRAIN_ADAPTER", "PYWGTRAIN_GEMM_TILES", "XDG_CACHE_HOME"} <= found
    missing = sorted(v for v in found if f"`{v}`" not in table)
    assert not missing, missing


def _stub(path, body):
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)


@pytest.mark.skipif(sys.platform != "linux" or not shutil.which("bash"), reason="scripts/setup.sh's Linux path")
@pytest.mark.parametrize(
    "manager,uid,icd,expected",
    [
        (
            "apt-get",
            "1000",
            False,
            [
                "sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq",
                "sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mesa-vulkan-drivers libvulkan1",
            ],
        ),
        (
            "apt-get",
            "0",
            False,
            [
                "env DEBIAN_FRONTEND=noninteractive apt-get update -qq",
                "env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mesa-vulkan-drivers libvulkan1",
            ],
        ),
        ("dnf", "1000", False, ["sudo dnf install -y -q mesa-vulkan-drivers vulkan-loader"]),
        ("pacman", "0", False, ["pacman -S --noconfirm --needed vulkan-swrast vulkan-icd-loader"]),
        ("apt-get", "1000", True, []),  # a driver is there (a GPU's or Mesa's): nothing is installed
    ],
)
def test_setup_installs_a_vulkan_driver_only_where_none_is(tmp_path, manager, uid, icd, expected):
    """scripts/setup.sh against stub package managers (this machine's driver
    stays as it is): an ICD-less machine gets Mesa's driver through the
    system's package manager, via sudo when not root."""
    stubs, log = tmp_path / "bin", tmp_path / "log"
    stubs.mkdir()
    icd_dir = tmp_path / "icd.d"
    icd_dir.mkdir()
    if icd:
        (icd_dir / "nvidia_icd.json").write_text("{}")
    _stub(stubs / manager, f'echo "{manager} $*" >> "{log}"')
    _stub(stubs / "sudo", f'printf "sudo " >> "{log}"; exec "$@"')
    _stub(
        stubs / "env",
        f'printf "env " >> "{log}"; '
        + 'for a; do case "$a" in *=*) printf "%s " "$a" >> "'
        + str(log)
        + '"; shift;; *) break;; esac; '
        'done; exec "$@"',
    )
    _stub(stubs / "id", f"echo {uid}")
    _stub(stubs / "python3", f'exec "{sys.executable}" "$@"')
    _stub(stubs / "c++", "exit 0")
    script = f'source "{ROOT}/scripts/setup.sh" && _pw_linux_prerequisites'
    env = {"PATH": str(stubs), "HOME": str(tmp_path), "PYWGTRAIN_ICD_DIRS": str(icd_dir)}
    r = subprocess.run([shutil.which("bash"), "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = log.read_text().splitlines() if log.exists() else []
    assert lines == expected, (lines, r.stderr)
    if not icd:
        assert "no Vulkan driver registered" in r.stderr


def _can_unshare_mounts():
    if sys.platform != "linux" or os.geteuid() != 0 or not shutil.which("unshare"):
        return False
    try:
        return subprocess.run(["unshare", "--mount", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


LAVAPIPE_ICD = Path("/usr/share/vulkan/icd.d/lvp_icd.x86_64.json")


@pytest.mark.skipif(
    not _can_unshare_mounts() or not LAVAPIPE_ICD.exists(),
    reason="needs root, unshare --mount and lavapipe's ICD to hide and restore",
)
def test_setup_on_a_machine_without_a_driver_in_a_mount_namespace(tmp_path):
    """End to end without touching this machine: in a private mount namespace
    every ICD directory is hidden (empty tmpfs), so WebGPU finds no adapter;
    scripts/setup.sh must notice and run the package manager, here a stub
    apt-get whose "install" puts lavapipe's real ICD JSON back; then the
    installed pywgtrain finds the adapter."""
    stubs = tmp_path / "bin"
    stubs.mkdir()
    saved = tmp_path / LAVAPIPE_ICD.name
    shutil.copy(LAVAPIPE_ICD, saved)
    _stub(
        stubs / "apt-get",
        f'echo "apt-get $*" >&2\ncase " $* " in *" install "*mesa-vulkan-drivers*) '
        f'cp "{saved}" /usr/share/vulkan/icd.d/ ;; esac',
    )
    dirs = [
        d for d in ("/usr/share/vulkan/icd.d", "/etc/vulkan/icd.d", "/usr/local/share/vulkan/icd.d") if os.path.isdir(d)
    ]
    script = "\n".join(
        [
            "set -u",
            *[f"mount -t tmpfs none {d}" for d in dirs],
            f'"{ENTRY}" info >/dev/null 2>&1; echo "before: $?"',
            f'source "{ROOT}/scripts/setup.sh"',
            f'PATH="{stubs}:$PATH" _pw_linux_prerequisites || echo "setup failed"',
            f'"{ENTRY}" info > "{tmp_path}/info.txt" 2>&1; echo "after: $?"',
        ]
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VK_", "PYWGTRAIN_"))}
    r = subprocess.run(
        ["unshare", "--mount", "bash", "-c", script], capture_output=True, text=True, env=env, timeout=120, cwd="/"
    )
    assert "before: 1" in r.stdout, (r.stdout, r.stderr)  # no adapter: the help text, exit 1
    assert "no Vulkan driver registered" in r.stderr
    assert "apt-get install -y -qq mesa-vulkan-drivers libvulkan1" in r.stderr
    assert "after: 0" in r.stdout, (r.stdout, r.stderr, (tmp_path / "info.txt").read_text())
    assert "llvmpipe" in (tmp_path / "info.txt").read_text()
    assert LAVAPIPE_ICD.exists()  # the machine's own driver was never touched


def test_gemm_sweep_covers_the_three_linear_layer_modes():
    from pywgtrain.benchmarks.gemm import SWEEP_LAYERS, SWEEP_ROWS, sweep_shapes

    shapes = sweep_shapes(cpu=False)
    assert len(shapes) == len(SWEEP_LAYERS) * (3 * len(SWEEP_ROWS) - 1)  # no dW for a single row
    for m, k, n, ta, tb, (fin, fout), mode in shapes:
        if mode == "forward NT":
            assert (k, n, ta, tb) == (fin, fout, False, True)
        elif mode == "dX NN":
            assert (k, n, ta, tb) == (fout, fin, False, False)
        else:
            assert (m, n, ta, tb) == (fout, fin, True, False)


# -- bench/run_on_gpu.sh's prerequisites ----------------------------------------------


@pytest.mark.skipif(not shutil.which("bash"), reason="a bash script")
def test_run_on_gpu_says_what_it_needs_and_stops_early(tmp_path):
    """--help names the prerequisites; a bad argument or a missing .gpu/ ends
    the script at once with one line and a nonzero status (run in a copy
    without .gpu/, so a prepared checkout does not start the real thing)."""
    script = ROOT / "bench" / "run_on_gpu.sh"
    (tmp_path / "bench").mkdir()
    shutil.copy(script, tmp_path / "bench" / "run_on_gpu.sh")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")

    def run(*args, cwd=tmp_path):
        return subprocess.run(
            ["bash", "bench/run_on_gpu.sh", *args], cwd=cwd, capture_output=True, text=True, timeout=60
        )

    helped = run("--help")
    assert helped.returncode == 0 and "shared/gpu/prepare" in helped.stdout and "Vulkan driver" in helped.stdout
    bad = run("everything")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "unknown argument" in bad.stderr
    missing = run("tests")
    assert missing.returncode == 1 and missing.stderr.count("\n") == 1 and ".gpu/prelude.sh missing" in missing.stderr
    assert not (tmp_path / "out").exists()  # stopped before any work
    elsewhere = subprocess.run(
        ["bash", str(tmp_path / "bench" / "run_on_gpu.sh")],
        cwd=tmp_path / "bench",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert elsewhere.returncode == 1 and "project's root" in elsewhere.stderr


def test_bench_gemm_gpu_rounds_alternate_and_keep_the_best(dev, monkeypatch):
    """The GPU branch of bench_gemm (two alternating timing rounds per side,
    each keeping its faster one) runs here with the adapter taken for a GPU:
    every round is recorded and the reported time is their minimum."""
    from pywgtrain.benchmarks import gemm

    monkeypatch.setattr(gemm, "is_cpu_adapter", lambda d: False)
    monkeypatch.setattr(gemm, "warm_up", lambda *a, **k: None)
    rows = gemm.bench_gemm(dev, False, None, [(33, 70, 17, True, False)])
    (row,) = rows
    assert len(row["pywgtrain_rounds_us"]) == gemm.GPU_ROUNDS
    assert row["pywgtrain_us"] == min(row["pywgtrain_rounds_us"]) > 0
