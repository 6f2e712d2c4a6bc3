#!/usr/bin/env python3
"""Set up and run tfdata on a machine that has only python3.

    python3 dev.py demo    # the main job: the experiments that answer tfdata's main questions, quick
                           # (about 5 minutes), reports and the index under reports/quick/;
                           # --all: every experiment in quick mode
    python3 dev.py test    # the whole test suite, on every core (pytest-xdist, one test file per
                           # worker at a time; TFDATA_TEST_WORKERS=N to choose, 1 for one process)
    python3 dev.py bench   # asv over the benchmark suite, once, quick (what CI runs; each
                           # benchmark forked from a server that imported the suite once)
    python3 dev.py docs    # the documentation site into docs/_build/html (warnings are errors)
    python3 dev.py compile [dqn|ppo|suite|all] [--cold]
                           # kernel specializations compiled and cold compile time (default: the
                           # DQN and PPO loops; suite: its count, --cold: on an empty numba cache,
                           # timed, about 30 min); reports/compile_budget/
    python3 dev.py system  # install the allocator libraries (jemalloc, mimalloc) with apt-get;
                           # --browser: Chromium too (the test that opens the docs site in it)
    python3 dev.py arm64   # aarch64 under emulation: a Debian arm64 root, a subset of the tests and
                           # the cross-architecture determinism check (tools/arm64.py; needs root)
    python3 dev.py edge [--quick] [--no-cgroup]
                           # the edge profile: the torch-free DQN, PPO and SAC loops, capacities,
                           # microbenchmarks and first-step latency in a 512 MiB, one-CPU cgroup
                           # (root makes it; else unconfined, said so); reports/edge/<machine>/.
                           # Needs only the rl extra; about 3 min on a 2-core x86-64 VM

Each command creates ``.venv`` (once) and installs the package with the extras it needs; a
change to pyproject.toml triggers a reinstall (``edge`` takes a venv with every extra as it is,
else installs the ``rl`` extra alone: what a small board can install). Standard library only.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import venv

ROOT = os.path.dirname(os.path.abspath(__file__))
VENV = os.environ.get("TFDATA_VENV", os.path.join(ROOT, ".venv"))
BIN = os.path.join(VENV, "bin")
PY = os.path.join(BIN, "python")
EXTRAS = "test,bench,rl,torch,dqn,ppo,sac,sb3,ray,atari,compress,minari,docs"
# Debian's jemalloc can be loaded into Python only with this glibc tunable set before the
# interpreter starts (see tfdata/alloc.py); every command runs with it
TUNABLE = "glibc.rtld.optional_static_tls=4096"


#: the edge profile's extras: gymnasium only (a board installs no torch)
EDGE_EXTRAS = "rl"


def _stamp(extras: str = EXTRAS) -> str:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return hashlib.sha256(f.read() + extras.encode()).hexdigest()


def ensure_env(extras: str = EXTRAS) -> None:
    """The venv with ``extras`` installed; one installed with every extra serves any command."""
    stamp_file = os.path.join(VENV, ".tfdata-installed")
    if os.path.exists(stamp_file) and open(stamp_file).read() in (_stamp(extras), _stamp(EXTRAS)):
        return
    if not os.path.exists(PY):
        print(f"creating virtual environment {VENV}", flush=True)
        try:
            venv.EnvBuilder(with_pip=True).create(VENV)
        except Exception as exc:  # ensurepip missing on some distributions
            sys.exit(f"could not create a virtual environment ({exc}).\n"
                     "On Debian/Ubuntu install it with: apt-get install python3-venv")
    print(f"installing tfdata[{extras}] into {VENV}", flush=True)
    run([PY, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         "-e", f"{ROOT}[{extras}]"])
    with open(stamp_file, "w") as f:
        f.write(_stamp(extras))


# Debian/Ubuntu packages of the allocators tfdata.alloc loads with ctypes
SYSTEM_PACKAGES = ("libjemalloc2", "libmimalloc2.0")
LIBRARY_FILES = ("libjemalloc.so.2", "libmimalloc.so.2")


def _have_libraries() -> bool:
    import ctypes.util

    found = [ctypes.util.find_library(n) for n in ("jemalloc", "mimalloc")]
    return all(found)


def system(browser: bool = False) -> int:
    """Install the allocator libraries with apt-get (as root, or with sudo without a password),
    and with ``browser`` Chromium (tests/test_docs_site.py opens the built site in it).

    Returns 0 when they are present afterwards, else 1 after saying what to do.
    """
    if browser and not any(shutil.which(n) for n in ("chromium", "chromium-browser")):
        if _apt(["chromium"]) != 0:
            print("could not install chromium (Debian/Ubuntu: sudo apt-get install chromium)",
                  file=sys.stderr)
            return 1
    if _have_libraries():
        print("allocator libraries present: " + ", ".join(LIBRARY_FILES))
        return 0
    if _apt(list(SYSTEM_PACKAGES)) == 0 and _have_libraries():
        return 0
    print("could not install the allocator libraries (jemalloc, mimalloc).\n"
          "  Debian/Ubuntu: sudo apt-get install " + " ".join(SYSTEM_PACKAGES) + "\n"
          "  elsewhere: install jemalloc and mimalloc and set TFDATA_JEMALLOC / TFDATA_MIMALLOC to\n"
          "  their shared libraries. Without them tfdata works with allocator='numpy' (the default);\n"
          "  their tests and benchmarks skip.", file=sys.stderr)
    return 1


def _apt(packages: list[str]) -> int:
    """``apt-get install`` of ``packages``: its exit code, 1 without apt-get."""
    apt = "/usr/bin/apt-get"
    if not os.path.exists(apt):
        return 1
    prefix = [] if os.geteuid() == 0 else ["sudo", "-n"]
    cmd = prefix + [apt, "install", "-y", "--no-install-recommends", *packages]
    print("installing " + " ".join(packages) + ": " + " ".join(cmd), flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    rc = subprocess.call(cmd, env=env)
    if rc and not prefix:  # package lists may be missing on a fresh machine
        subprocess.call([apt, "update"], env=env)
        rc = subprocess.call(cmd, env=env)
    return rc


def _env() -> dict:
    env = dict(os.environ)
    old = env.get("GLIBC_TUNABLES", "")
    if TUNABLE not in old.split(":"):
        env["GLIBC_TUNABLES"] = f"{old}:{TUNABLE}" if old else TUNABLE
    return env


def run(cmd: list[str], **kw) -> None:
    rc = subprocess.call(cmd, cwd=ROOT, env=_env(), **kw)
    if rc:
        sys.exit(rc)


def _workers(rest: list[str]) -> list[str]:
    """pytest-xdist's arguments for ``test``: a worker per core, each test file on one worker
    (the kernels a file compiles are compiled once, and a file's tests share its process, as
    the tests of shared memory, Ray and memory accounting expect); none when the caller chose
    (``-n``, ``-p no:xdist``) or asked for one worker."""
    n = os.environ.get("TFDATA_TEST_WORKERS") or str(os.cpu_count() or 1)
    if n == "1" or any(a == "-n" or a.startswith(("-n", "--numprocesses")) or "no:xdist" in a for a in rest):
        return []
    return ["-n", n, "--dist", "loadfile"]


def main(argv: list[str]) -> None:
    if not argv or argv[0] not in ("demo", "test", "bench", "docs", "compile", "system", "arm64", "edge"):
        sys.exit(__doc__)
    cmd, rest = argv[0], argv[1:]
    if cmd == "system":
        sys.exit(system(browser="--browser" in rest))
    if cmd == "edge":  # no allocator libraries, no torch: what a board has
        ensure_env(EDGE_EXTRAS)
        run([PY, os.path.join(ROOT, "experiments", "edge_profile.py"), *rest])
        return
    if not _have_libraries():
        system()  # best effort: without them only the jemalloc/mimalloc runs skip
    ensure_env()
    if cmd == "demo":
        which = "all" if "--all" in rest else "demo"
        run([PY, "-m", "tfdata", "run", which, "--quick", *[a for a in rest if a != "--all"]])
    elif cmd == "test":
        run([PY, "-m", "pytest", *_workers(rest), *rest])
    elif cmd == "docs":
        run([PY, "-m", "sphinx", "-b", "html", "-W", "--keep-going",
             os.path.join(ROOT, "docs"), os.path.join(ROOT, "docs", "_build", "html"), *rest])
    elif cmd == "compile":
        run([PY, os.path.join(ROOT, "experiments", "compile_budget.py"), *rest])
    elif cmd == "arm64":
        sys.path.insert(0, os.path.join(ROOT, "tools"))
        import arm64

        sys.exit(arm64.main(rest, PY))
    elif cmd == "bench":
        run([os.path.join(BIN, "asv"), "machine", "--yes"])
        # asv 0.6 exits with 2 when a benchmark fails, so a broken benchmark fails CI. The quick
        # pass forks each benchmark from a server that imported the suite once (asv's default
        # starts an interpreter per benchmark: most of the pass was imports)
        launch = [] if any(a.startswith("--launch-method") for a in rest) else ["--launch-method", "forkserver"]
        run([os.path.join(BIN, "asv"), "run", "--python=same", "--quick", "--show-stderr", *launch, *rest])


if __name__ == "__main__":
    main(sys.argv[1:])
