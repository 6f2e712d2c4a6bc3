#!/usr/bin/env python3
"""Set up and run tfdata on a machine that has only python3.

    python3 dev.py demo    # the main job: quick experiments, report under reports/
    python3 dev.py test    # the whole test suite
    python3 dev.py bench   # asv over the benchmark suite, once, quick (what CI runs)

Each command creates ``.venv`` (once) and installs the package with the extras it needs; a
change to pyproject.toml triggers a reinstall. Standard library only.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv

ROOT = os.path.dirname(os.path.abspath(__file__))
VENV = os.environ.get("TFDATA_VENV", os.path.join(ROOT, ".venv"))
BIN = os.path.join(VENV, "bin")
PY = os.path.join(BIN, "python")
EXTRAS = "test,bench,rl,torch"


def _stamp() -> str:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return hashlib.sha256(f.read() + EXTRAS.encode()).hexdigest()


def ensure_env() -> None:
    stamp_file = os.path.join(VENV, ".tfdata-installed")
    if os.path.exists(stamp_file) and open(stamp_file).read() == _stamp():
        return
    if not os.path.exists(PY):
        print(f"creating virtual environment {VENV}", flush=True)
        try:
            venv.EnvBuilder(with_pip=True).create(VENV)
        except Exception as exc:  # ensurepip missing on some distributions
            sys.exit(f"could not create a virtual environment ({exc}).\n"
                     "On Debian/Ubuntu install it with: apt-get install python3-venv")
    print(f"installing tfdata[{EXTRAS}] into {VENV}", flush=True)
    run([PY, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         "-e", f"{ROOT}[{EXTRAS}]"])
    with open(stamp_file, "w") as f:
        f.write(_stamp())


def run(cmd: list[str], **kw) -> None:
    rc = subprocess.call(cmd, cwd=ROOT, **kw)
    if rc:
        sys.exit(rc)


def main(argv: list[str]) -> None:
    if not argv or argv[0] not in ("demo", "test", "bench"):
        sys.exit(__doc__)
    cmd, rest = argv[0], argv[1:]
    ensure_env()
    if cmd == "demo":
        run([PY, os.path.join("experiments", "layout.py"), "--quick", *rest])
    elif cmd == "test":
        run([PY, "-m", "pytest", *rest])
    elif cmd == "bench":
        run([os.path.join(BIN, "asv"), "machine", "--yes"])
        run([os.path.join(BIN, "asv"), "run", "--python=same", "--quick", "--show-stderr", *rest])


if __name__ == "__main__":
    main(sys.argv[1:])
