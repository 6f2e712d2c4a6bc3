"""Nothing is lost: no tfdata call deletes, truncates or writes a path it did not create.

A tree of the user's files (a sentinel, a project directory, a dataset, a checkpoint, links and
a FIFO) is snapshotted before each call and compared after it: a refused or failed call must
leave every byte, link and file type as it was. The per-area tests of the same rule are in
``test_file_safety.py`` (datasets), ``test_checkpoint_hostile.py`` (checkpoints) and
``test_memory_safety.py`` (what reaches memory); this file holds the cross-cutting sweep over
every public function that takes a path, and the shared-memory regions.
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys

import numpy as np
import pytest

from tfdata import shared

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def snapshot(top: str) -> dict:
    """Every path below ``top``: its kind and, for a regular file, a digest of its bytes; for a
    link, its target. Links are not followed."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            rel = os.path.relpath(p, top)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(p))
            elif stat.S_ISREG(st.st_mode):
                with open(p, "rb") as f:
                    out[rel] = ("file", hashlib.sha256(f.read()).hexdigest())
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir",)
            else:
                out[rel] = ("special", stat.S_IFMT(st.st_mode))
    return out


# -- shared-memory regions ---------------------------------------------------------------------

def _orphan_region(base: str) -> str:
    """A real region whose owner died without closing it (``os._exit`` skips every finalizer);
    returns its path."""
    os.makedirs(base, exist_ok=True)
    code = ("import os, sys; from tfdata.shared import SharedReplayBuffer; "
            "b = SharedReplayBuffer({'x': 'i8'}, 8, dir=sys.argv[1]); "
            "print(b.path, flush=True); os._exit(0)")
    out = subprocess.run([sys.executable, "-c", code, base], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    path = out.stdout.strip()
    assert os.path.isdir(path)
    return path


def test_sweep_removes_an_orphaned_region_and_only_its_files(tmp_path):
    path = _orphan_region(str(tmp_path))
    assert shared.sweep(str(tmp_path)) == [path]
    assert not os.path.exists(path)


def test_sweep_leaves_a_look_alike_directory_with_user_files(tmp_path):
    # named like a region, with a free owner.lock, but holding a file no region has
    path = _orphan_region(str(tmp_path))
    with open(os.path.join(path, "notes.txt"), "w") as f:
        f.write("mine")
    before = snapshot(str(tmp_path))
    assert shared.sweep(str(tmp_path)) == []
    assert snapshot(str(tmp_path)) == before


@pytest.mark.parametrize("victim", ["region", "owner.lock", "region.json"])
def test_sweep_never_writes_through_a_planted_link(tmp_path, victim):
    path = _orphan_region(str(tmp_path / "shm"))
    sentinel = tmp_path / "sentinel.bin"
    sentinel.write_bytes(bytes(range(256)) * 64)
    os.unlink(os.path.join(path, victim))
    os.symlink(sentinel, os.path.join(path, victim))
    before = snapshot(str(tmp_path))
    assert shared.sweep(str(tmp_path / "shm")) == []
    assert snapshot(str(tmp_path)) == before


def test_a_writer_refuses_a_region_whose_file_is_a_link(tmp_path):
    sentinel = tmp_path / "sentinel.bin"
    sentinel.write_bytes(b"\x07" * 65536)
    (tmp_path / "shm").mkdir()
    with shared.SharedReplayBuffer({"x": "i8"}, 8, dir=str(tmp_path / "shm")) as buf:
        region = os.path.join(buf.path, "region")
        os.rename(region, region + ".moved")  # the owner's map stays valid
        os.symlink(sentinel, region)
        with pytest.raises(shared.FormatError, match="not a shared buffer region"):
            shared.SharedWriter(buf.path, 0)
        os.unlink(region)
        os.rename(region + ".moved", region)
    assert sentinel.read_bytes() == b"\x07" * 65536


def test_a_writer_refuses_a_fifo_in_a_region_without_blocking(tmp_path):
    (tmp_path / "shm").mkdir()
    with shared.SharedReplayBuffer({"x": "i8"}, 8, dir=str(tmp_path / "shm")) as buf:
        lock = os.path.join(buf.path, "writer-0.lock")
        os.unlink(lock)
        os.mkfifo(lock)
        with pytest.raises(shared.FormatError):
            shared.SharedWriter(buf.path, 0)
        os.unlink(lock)
        open(lock, "wb").close()
        with shared.SharedWriter(buf.path, 0) as w:  # the repaired region works
            w.push({"x": np.int64(3)})
        assert buf.sample(1)["x"][0] == 3
