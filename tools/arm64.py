"""tfdata on aarch64 under emulation: a Debian arm64 root, a subset of the tests, the determinism check.

    python3 dev.py arm64                  # build the root once, then the subset and the check
    python3 dev.py arm64 --tests all      # every test file instead of the subset (hours)
    python3 dev.py arm64 --tests tests/test_buffer.py -- -x    # chosen files, pytest arguments after --
    python3 dev.py arm64 --edge           # also `experiments/edge_profile.py --quick` in the root
    python3 dev.py arm64 --save-checkpoint    # also copy the checkpoint the root saves into tests/fixtures

What it does, each step skipped when already done:

1. **Host tools**: ``debootstrap`` and ``qemu-aarch64-static`` (Debian's ``debootstrap``,
   ``qemu-user-static`` and ``binfmt-support``, installed with apt-get when missing), and the
   kernel's ``binfmt_misc`` with qemu's aarch64 interpreter registered with the ``F`` flag, so that
   an aarch64 program started inside the root runs under qemu without the interpreter in the root.
   On an aarch64 host nothing is emulated.
2. **The root**: ``debootstrap --arch=arm64 --variant=minbase`` of Debian bookworm with its
   ``python3`` and ``python3-venv`` (Python 3.11), into ``~/.cache/tfdata/arm64-bookworm``
   (``--root`` or ``TFDATA_ARM64_ROOT``), built in ``<root>.partial`` and renamed when complete.
3. **The wheels**: pip on the host downloads the aarch64 wheels of the versions of numpy, numba,
   llvmlite, psutil, pytest, hypothesis and gymnasium that ``.venv`` holds (same versions on both
   architectures, so a difference is the architecture's), and the root's ``/opt/venv`` installs
   them from that folder, with no network inside the root.
4. **The run**, in a private mount namespace (``unshare``: its mounts of ``/proc``, ``/dev`` and
   ``/dev/shm`` vanish with it): this checkout's tracked files are copied to ``/src`` in the root,
   then ``python tests/determinism.py --check`` (the golden digests made on x86-64) and pytest on
   :data:`SUBSET`. numba's cache stays in the root between runs (``/var/cache/tfdata-numba``).

Its output goes to ``build/arm64/`` (``run.log``, ``determinism.json``, ``summary.json``, and with
``--edge`` the emulated edge profile under ``reports/``, not for publishing).
Timings under emulation say nothing about ARM hardware; the summary records the wall clock of
each step only to plan the next run. Needs root (debootstrap, chroot and mount do). Standard
library only.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUITE = "bookworm"
MIRROR = os.environ.get("TFDATA_DEBIAN_MIRROR", "http://deb.debian.org/debian")
DEFAULT_ROOT = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
                            "tfdata", f"arm64-{SUITE}")
HOST_PACKAGES = ("debootstrap", "qemu-user-static", "binfmt-support")
#: What the root's Python gets; versions are taken from the development venv.
PACKAGES = ("numpy", "numba", "llvmlite", "psutil", "pytest", "hypothesis", "gymnasium")
PLATFORMS = ("manylinux2014_aarch64", "manylinux_2_17_aarch64", "manylinux_2_27_aarch64", "manylinux_2_28_aarch64")
#: Debian bookworm's python3 is 3.11: wheels for that interpreter.
PY_VERSION = "3.11"
BINFMT = "/proc/sys/fs/binfmt_misc"
# qemu's own registration of aarch64 ELF executables (the magic and mask of Debian's
# qemu-user-static), with the F flag: the interpreter is opened once, at registration, so a
# chroot needs no copy of it
BINFMT_LINE = (r":qemu-aarch64:M::\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00"
               r":\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff"
               r":/usr/bin/qemu-aarch64-static:F")
#: The tests run under emulation: core sampling on every layout, prioritized, n-step, frames,
#: checkpoints, rollouts and GAE, the nn kernels: about 15 minutes of emulation with an empty
#: kernel cache (the determinism check's compiles included), 2 with a warm one.
SUBSET = (
    "tests/test_buffer.py",
    "tests/test_groups.py",
    "tests/test_kernels.py",
    "tests/test_prioritized.py",
    "tests/test_episodes.py",
    "tests/test_sampler_rules.py",
    "tests/test_frames.py",
    "tests/test_frames_kernels.py",
    "tests/test_checkpoint.py",
    "tests/test_rollout.py",
    "tests/test_nn.py",
    "tests/test_nn_ppo.py",
    "tests/test_nn_sac.py",
    "tests/test_determinism.py",
)
NUMBA_CACHE = "/var/cache/tfdata-numba"
#: The CPU qemu emulates: the Raspberry Pi 5's core. qemu's default, ``max``, offers SVE and SME,
#: and OpenBLAS then picks its SME kernels, whose float32 products came out NaN under qemu 7.2
#: (Debian bookworm's); a Cortex-A76 has neither, like the board.
QEMU_CPU = "cortex-a76"


def say(msg: str) -> None:
    print(f"arm64: {msg}", flush=True)


def fail(msg: str) -> None:
    sys.exit(f"arm64: {msg}")


def emulated() -> bool:
    return platform.machine() not in ("aarch64", "arm64")


# -- 1. host tools -----------------------------------------------------------------------------
def ensure_host_tools() -> None:
    if sys.platform != "linux":
        fail(f"needs Linux (debootstrap, chroot, binfmt_misc); this is {sys.platform}")
    if os.geteuid() != 0:
        fail("needs root: debootstrap, chroot and mount do (run it as root, or with sudo)")
    need = [p for p, exe in (("debootstrap", "debootstrap"), ("qemu-user-static", "qemu-aarch64-static"))
            if shutil.which(exe) is None and (p == "debootstrap" or emulated())]
    if need:
        if not os.path.exists("/usr/bin/apt-get"):
            fail("needs debootstrap and qemu-user-static; install them with your package manager")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        cmd = ["apt-get", "install", "-y", "--no-install-recommends", *HOST_PACKAGES]
        say("installing " + " ".join(HOST_PACKAGES))
        if subprocess.call(cmd, env=env):
            subprocess.call(["apt-get", "update"], env=env)
            if subprocess.call(cmd, env=env):
                fail("could not install " + " ".join(HOST_PACKAGES) + " with apt-get")
    if emulated():
        ensure_binfmt()


def _binfmt_flags() -> str | None:
    try:
        with open(os.path.join(BINFMT, "qemu-aarch64")) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    if "enabled" not in lines:
        return None
    return next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("flags:")), "")


def ensure_binfmt() -> None:
    if not os.path.exists(os.path.join(BINFMT, "register")):
        if subprocess.call(["mount", "-t", "binfmt_misc", "binfmt_misc", BINFMT]):
            fail(f"the kernel's binfmt_misc is not mounted at {BINFMT} and mounting it failed "
                 "(a container may forbid it; run on the host or in a VM)")
    if _binfmt_flags() is None and shutil.which("update-binfmts"):
        subprocess.call(["update-binfmts", "--enable", "qemu-aarch64"])
    if _binfmt_flags() is None:
        with open(os.path.join(BINFMT, "register"), "w") as f:
            f.write(BINFMT_LINE)
    flags = _binfmt_flags()
    if flags is None:
        fail("could not register qemu-aarch64 with binfmt_misc")
    if "F" not in flags:
        fail(f"qemu-aarch64 is registered with binfmt_misc without the F flag (flags {flags!r}): a chroot "
             "cannot find its interpreter. Re-register it: update-binfmts --disable qemu-aarch64; "
             "then rerun this command")


# -- 2. the root -------------------------------------------------------------------------------
STAMP = ".tfdata-arm64-root"


def ensure_root(root: str) -> None:
    if os.path.exists(os.path.join(root, STAMP)):
        return
    if os.path.exists(root):
        fail(f"{root} exists but is not a root this command built (no {STAMP}); "
             "move it away or pass --root")
    partial = root + ".partial"
    if os.path.exists(partial):
        if not os.path.exists(os.path.join(partial, STAMP + ".building")):
            fail(f"{partial} exists but was not made by this command; move it away")
        say(f"removing the unfinished root {partial}")
        shutil.rmtree(partial)
    os.makedirs(partial)
    with open(os.path.join(partial, STAMP + ".building"), "w") as f:
        f.write("debootstrap in progress\n")
    cmd = ["debootstrap", "--arch=arm64", "--variant=minbase", "--include=python3,python3-venv",
           SUITE, partial, MIRROR]
    say("building the arm64 root (a few minutes): " + " ".join(cmd))
    t0 = time.monotonic()
    if subprocess.call(cmd):
        fail(f"debootstrap failed; its log is {partial}/debootstrap/debootstrap.log")
    os.remove(os.path.join(partial, STAMP + ".building"))
    with open(os.path.join(partial, STAMP), "w") as f:
        f.write(" ".join(cmd) + "\n")
    os.rename(partial, root)
    say(f"root built in {time.monotonic() - t0:.0f} s: {root}")


def in_root(root: str, script: str, *, env: dict | None = None, log=None, cpu: str = QEMU_CPU) -> int:
    """Run ``script`` (sh) in ``root`` under chroot, with /proc, /dev and /dev/shm mounted in a
    private mount namespace (they go when it ends, whatever happens). ``cpu``: the CPU qemu
    emulates (qemu reads ``QEMU_CPU`` from the environment of every program it starts)."""
    variables = {"PATH": "/opt/venv/bin:/usr/bin:/bin", "HOME": "/root", "LANG": "C.UTF-8",
                 "PYTHONDONTWRITEBYTECODE": "1", **(env or {})}
    if emulated():
        variables["QEMU_CPU"] = cpu
    inner = " ".join(["exec", "env", "-i", *(f"{k}={shlex.quote(v)}" for k, v in variables.items()),
                      "sh", "-c", shlex.quote(script)])
    r = shlex.quote(root)
    outer = (f"mount --make-rprivate / && mount -t proc proc {r}/proc && mount --rbind /dev {r}/dev "
             f"&& mount -t tmpfs -o size=1g tmpfs {r}/dev/shm && exec chroot {r} sh -c {shlex.quote(inner)}")
    host_env = dict(os.environ, QEMU_CPU=cpu) if emulated() else None
    return subprocess.call(["unshare", "--mount", "sh", "-c", outer], env=host_env, stdout=log,
                           stderr=subprocess.STDOUT if log else None)


# -- 3. the wheels -----------------------------------------------------------------------------
def venv_versions(py: str) -> dict:
    code = ("import importlib.metadata as m, json, sys; "
            f"print(json.dumps({{p: m.version(p) for p in {list(PACKAGES)!r}}}))")
    out = subprocess.run([py, "-c", code], capture_output=True, text=True)
    if out.returncode:
        fail(f"could not read the package versions of {py}:\n{out.stderr}")
    return json.loads(out.stdout)


def ensure_wheels(root: str, py: str) -> dict:
    versions = venv_versions(py)
    pins = [f"{p}=={v}" for p, v in versions.items()]
    stamp = os.path.join(root, "opt", "venv", ".tfdata-packages")
    if os.path.exists(stamp) and open(stamp).read() == " ".join(pins):
        return versions
    wheels = os.path.join(root, "opt", "wheels")
    os.makedirs(wheels, exist_ok=True)
    cmd = [py, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--only-binary=:all:",
           "--dest", wheels, "--python-version", PY_VERSION, "--implementation", "cp",
           *(a for p in PLATFORMS for a in ("--platform", p)), *pins]
    say("downloading the aarch64 wheels of " + ", ".join(pins))
    if subprocess.call(cmd):
        fail("pip could not download the aarch64 wheels (see above)")
    script = ("test -x /opt/venv/bin/python || python3 -m venv /opt/venv; "
              "/opt/venv/bin/pip install --quiet --disable-pip-version-check --no-index "
              "--find-links /opt/wheels " + " ".join(pins))
    say("installing them in the root's /opt/venv")
    if in_root(root, script):
        fail("installing the wheels in the root failed (see above)")
    with open(stamp, "w") as f:
        f.write(" ".join(pins))
    return versions


# -- 4. the run --------------------------------------------------------------------------------
def tracked_files() -> list:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True)
    if out.returncode == 0:
        return [p for p in out.stdout.decode().split("\0") if p and os.path.isfile(os.path.join(ROOT, p))]
    found = []
    for top in ("tfdata", "tests", "experiments"):
        for d, _, files in os.walk(os.path.join(ROOT, top)):
            found += [os.path.relpath(os.path.join(d, f), ROOT) for f in files
                      if not f.endswith((".pyc", ".nbi", ".nbc"))]
    return found + ["pyproject.toml"]


def copy_source(root: str) -> None:
    """This checkout's files to ``<root>/src``: a new copy, then renamed over the old one."""
    new, dst = os.path.join(root, "src.new"), os.path.join(root, "src")
    if os.path.exists(new):
        shutil.rmtree(new)
    for rel in tracked_files():
        target = os.path.join(new, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copy2(os.path.join(ROOT, rel), target)
    if os.path.exists(dst):
        shutil.rmtree(dst)
    os.rename(new, dst)


def main(argv: list, py: str) -> int:
    ap = argparse.ArgumentParser(prog="dev.py arm64", description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", default=os.environ.get("TFDATA_ARM64_ROOT", DEFAULT_ROOT),
                    help=f"the arm64 root (default {DEFAULT_ROOT.replace(os.path.expanduser('~'), '~')})")
    ap.add_argument("--tests", nargs="*", default=None,
                    help="test files to run (default: the subset; 'all': every file; none: no tests)")
    ap.add_argument("--cpu", default=QEMU_CPU, help=f"the CPU qemu emulates (default {QEMU_CPU}, the "
                    "Raspberry Pi 5's; qemu-aarch64-static -cpu help lists them)")
    ap.add_argument("--edge", action="store_true", help="also run experiments/edge_profile.py --quick")
    ap.add_argument("--save-checkpoint", action="store_true",
                    help="copy the checkpoint saved in the root into tests/fixtures/determinism/")
    argv = list(argv)
    pytest_args = []
    if "--" in argv:
        cut = argv.index("--")
        argv, pytest_args = argv[:cut], argv[cut + 1:]
    args = ap.parse_args(argv)
    root = os.path.abspath(args.root)
    t0 = time.monotonic()
    ensure_host_tools()
    ensure_root(root)
    versions = ensure_wheels(root, py)
    copy_source(root)
    out_dir = os.path.join(ROOT, "build", "arm64")
    os.makedirs(out_dir, exist_ok=True)
    shared = os.path.join(root, "out")
    if os.path.exists(shared):
        shutil.rmtree(shared)
    os.makedirs(shared)
    tests = list(SUBSET) if args.tests is None else (["tests"] if args.tests == ["all"] else args.tests)
    steps = [("determinism", "python tests/determinism.py --check --json /out/determinism.json")]
    if args.save_checkpoint:
        steps.append(("checkpoint", "python tests/determinism.py --write-checkpoint /out/checkpoint"))
    if tests:
        steps.append(("tests", "python -m pytest -q -p no:cacheprovider --durations=20 " + " ".join(map(shlex.quote, tests + pytest_args))))
    if args.edge:
        steps.append(("edge", "TFDATA_REPORTS_DIR=/out/reports python experiments/edge_profile.py --quick"))
    # numba targets the CPU LLVM detects, from /proc/cpuinfo, which under qemu-user is the host's:
    # name the emulated one, as LLVM would detect it on the board
    env = {"PYTHONPATH": "/src", "NUMBA_CACHE_DIR": NUMBA_CACHE}
    if emulated():
        env["NUMBA_CPU_NAME"] = args.cpu
    summary = {"machine": f"aarch64 (qemu-user, -cpu {args.cpu})" if emulated() else "aarch64",
               "host": platform.machine(), "versions": versions, "tests": tests, "steps": {}}
    failed = []
    with open(os.path.join(out_dir, "run.log"), "w", encoding="utf-8") as log:
        for name, command in steps:
            say(f"{name}: {command}")
            log.write(f"$ {command}\n")
            log.flush()
            s0 = time.monotonic()
            rc = in_root(root, "cd /src && " + command, env=env, log=log, cpu=args.cpu)
            summary["steps"][name] = {"command": command, "exit": rc, "wall_s": round(time.monotonic() - s0, 1)}
            say(f"{name}: {'ok' if rc == 0 else f'FAILED (exit {rc})'} in {time.monotonic() - s0:.0f} s")
            if rc:
                failed.append(name)
    if os.path.exists(os.path.join(shared, "determinism.json")):
        shutil.copy2(os.path.join(shared, "determinism.json"), os.path.join(out_dir, "determinism.json"))
    if os.path.isdir(os.path.join(shared, "reports")):  # the emulated edge profile: not a board's
        if os.path.exists(os.path.join(out_dir, "reports")):
            shutil.rmtree(os.path.join(out_dir, "reports"))
        shutil.copytree(os.path.join(shared, "reports"), os.path.join(out_dir, "reports"))
    made = os.path.join(shared, "checkpoint", "aarch64")
    if args.save_checkpoint and os.path.isdir(made):
        dst = os.path.join(ROOT, "tests", "fixtures", "determinism", "checkpoints", "aarch64")
        if os.path.exists(dst + ".new"):
            shutil.rmtree(dst + ".new")
        shutil.copytree(made, dst + ".new")
        if os.path.exists(dst):  # a fixture of this command's: replaced by the new copy
            shutil.rmtree(dst)
        os.rename(dst + ".new", dst)
        say(f"the checkpoints saved on aarch64 are in {os.path.relpath(dst, ROOT)}")
    summary["wall_s"] = round(time.monotonic() - t0, 1)
    with open(os.path.join(out_dir, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=1)
    say(f"{'FAILED: ' + ', '.join(failed) if failed else 'all steps passed'} in {summary['wall_s']:.0f} s "
        f"(timings under emulation say nothing about ARM hardware); log: build/arm64/run.log")
    return 1 if failed else 0
