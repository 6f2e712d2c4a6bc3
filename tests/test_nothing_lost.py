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


# -- every public function that takes a path, against a tree of the user's files ---------------

SPEC = {"id": "i8", "x": ("f4", (3,))}


def _rows(n: int) -> dict:
    return {"id": np.arange(n, dtype=np.int64), "x": np.ones((n, 3), np.float32)}


def _user_tree(top) -> dict:
    """The user's files: a sentinel, a project, datasets and a checkpoint of theirs, a note named
    like a dataset, a link to the sentinel and a FIFO. Returns name -> path."""
    import tfdata

    paths = {n: os.path.join(top, n) for n in
             ("sentinel.txt", "proj", "data.npy", "soa", "ckpt", "notes.npy", "link.npy", "fifo.npy")}
    with open(paths["sentinel.txt"], "wb") as f:
        f.write(b"precious" * 1000)
    os.mkdir(paths["proj"])
    with open(os.path.join(paths["proj"], "main.py"), "w") as f:
        f.write("print('my project')\n")
    tfdata.io.save(paths["data.npy"], _rows(10))
    tfdata.io.save(paths["soa"], _rows(10), layout="soa")
    buf = tfdata.PrioritizedReplayBuffer(SPEC, 16, seed=0)
    buf.extend(_rows(12))
    buf.save(paths["ckpt"])
    with open(paths["notes.npy"], "w") as f:
        f.write("not a dataset\n")
    os.symlink(paths["sentinel.txt"], paths["link.npy"])
    os.mkfifo(paths["fifo.npy"])
    return paths


def _refused_calls(p: dict, buf, sbuf=None) -> list:
    """(description, call) pairs, every one of which must fail and change nothing."""
    import tfdata

    io = tfdata.io
    calls = []
    not_ours = [p[n] for n in ("sentinel.txt", "proj", "ckpt", "notes.npy", "link.npy", "fifo.npy")]
    for path in p.values():
        for layout in ("aos", "soa"):
            calls += [
                (f"io.save({path}, {layout})", lambda path=path, layout=layout: io.save(path, _rows(3), layout)),
                (f"io.Writer({path}, {layout})", lambda path=path, layout=layout: io.Writer(path, SPEC, layout)),
                (f"io.create({path}, {layout})", lambda path=path, layout=layout: io.create(path, SPEC, 3, layout)),
                (f"io.convert(data, {path}, {layout})",
                 lambda path=path, layout=layout: io.convert(p["data.npy"], path, layout)),
                (f"spill_path={path} {layout}", lambda path=path, layout=layout: tfdata.ReplayBuffer(
                    SPEC, 16, layout=layout, spill_path=path, hot_rows=4)),
            ]
        calls += [
            (f"buf.save({path})", lambda path=path: buf.save(path)),
            (f"load(ckpt, spill_path={path})", lambda path=path: tfdata.ReplayBuffer.load(
                p["ckpt"], spill_path=path, hot_rows=4)),
        ]
    for path in not_ours:
        for layout in ("aos", "soa"):
            calls += [
                (f"io.save({path}, overwrite)", lambda path=path, layout=layout: io.save(
                    path, _rows(3), layout, overwrite=True)),
                (f"io.Writer({path}, overwrite)", lambda path=path, layout=layout: io.Writer(
                    path, SPEC, layout, overwrite=True)),
                (f"io.create({path}, overwrite)", lambda path=path, layout=layout: io.create(
                    path, SPEC, 3, layout, overwrite=True)),
                (f"io.convert(data, {path}, overwrite)", lambda path=path, layout=layout: io.convert(
                    p["data.npy"], path, layout, overwrite=True)),
            ]
        calls += [(f"Writer.open({path})", lambda path=path: io.Writer.open(path))]
    for path in not_ours + [p["data.npy"], p["soa"]]:
        if path != p["ckpt"]:
            calls += [(f"buf.save({path}, overwrite)", lambda path=path: buf.save(path, overwrite=True)),
                      (f"ReplayBuffer.load({path})", lambda path=path: tfdata.ReplayBuffer.load(path))]
            if sbuf is not None:
                calls += [(f"shared.save({path}, overwrite)", lambda path=path: sbuf.save(path, overwrite=True)),
                          (f"SharedReplayBuffer.load({path})",
                           lambda path=path: shared.SharedReplayBuffer.load(path, dir=sbuf.path.rsplit(os.sep, 1)[0]))]
    mixed = tfdata.MixedReplayBuffer({"d": tfdata.ArrayDataset(_rows(10)), "b": buf}, seed=0)
    calls += [(f"mixed.save({path})", lambda path=path: mixed.save(path)) for path in p.values()]
    calls += [(f"mixed.save({path}, overwrite)", lambda path=path: mixed.save(path, overwrite=True))
              for path in p.values()]  # not one of them is a mixed checkpoint
    calls += [(f"MixedReplayBuffer.load({path})", lambda path=path: tfdata.MixedReplayBuffer.load(path))
              for path in p.values()]
    if sbuf is not None:
        calls += [(f"shared.save({path})", lambda path=path: sbuf.save(path)) for path in p.values()]
        calls += [("SharedReplayBuffer.load(ckpt of a ReplayBuffer)",
                   lambda: shared.SharedReplayBuffer.load(p["ckpt"], dir=sbuf.path.rsplit(os.sep, 1)[0]))]
    calls += [
        ("io.save(data.npy, unwritable name)", lambda: io.save(p["data.npy"], {"观测": np.arange(3)},
                                                              overwrite=True)),
        ("io.save(soa, ragged)", lambda: io.save(p["soa"], {"id": np.arange(3), "x": np.ones((2, 3))},
                                                 "soa", overwrite=True)),
        ("io.convert(data, data)", lambda: io.convert(p["data.npy"], p["data.npy"], "aos", overwrite=True)),
        ("io.convert(soa, soa)", lambda: io.convert(p["soa"], p["soa"], "soa", overwrite=True)),
        ("MmapDataset.open(fifo)", lambda: tfdata.MmapDataset.open(p["fifo.npy"])),
        ("MmapDataset.open(notes)", lambda: tfdata.MmapDataset.open(p["notes.npy"])),
        ("MmapDataset.open(link)", lambda: tfdata.MmapDataset.open(p["link.npy"])),
        ("MmapDataset.open(proj)", lambda: tfdata.MmapDataset.open(p["proj"])),
        ("SharedWriter(proj)", lambda: shared.SharedWriter(p["proj"], 0)),
    ]
    return calls


def test_every_refused_call_leaves_every_user_file(tmp_path):
    import signal

    import tfdata

    top = str(tmp_path / "user")
    os.mkdir(top)
    paths = _user_tree(top)
    buf = tfdata.ReplayBuffer(SPEC, 16, seed=1)
    buf.extend(_rows(5))
    shm = tmp_path / "shm"
    shm.mkdir()
    sbuf = shared.SharedReplayBuffer(SPEC, 8, dir=str(shm))
    before = snapshot(top)

    def hang(*_):
        raise TimeoutError("the call blocked")

    old = signal.signal(signal.SIGALRM, hang)
    succeeded = []
    try:
        for what, call in _refused_calls(paths, buf, sbuf):
            signal.alarm(20)  # a FIFO opened for reading blocks: that is a failure, not a wait
            try:
                result = call()
            except TimeoutError:
                raise AssertionError(f"{what}: blocked") from None
            except Exception:  # noqa: BLE001 - every refusal is fine; what matters is the tree
                pass
            else:
                succeeded.append(what)
                close = getattr(result, "close", None)
                if close is not None:
                    close()
            finally:
                signal.alarm(0)
            assert snapshot(top) == before, f"{what} changed the user's files"
    finally:
        signal.signal(signal.SIGALRM, old)
    assert succeeded == []
    assert shared.sweep(top) == [] and snapshot(top) == before


def test_from_minari_refused_calls_leave_every_user_file(tmp_path):
    """``tfdata.datasets.from_minari`` takes two paths: it writes neither over a user's file nor
    through one, and reads no FIFO (a Minari directory whose metadata.json is one)."""
    import json
    import signal

    h5py = pytest.importorskip("h5py", reason="the minari extra (h5py) is not installed")
    from tfdata.datasets import from_minari

    top = str(tmp_path / "user")
    os.mkdir(top)
    p = _user_tree(top)
    src = str(tmp_path / "minari" / "data")  # a valid Minari dataset, outside the user's tree
    os.makedirs(src)
    with open(os.path.join(src, "metadata.json"), "w") as f:
        json.dump({"total_episodes": 1, "total_steps": 3, "data_format": "hdf5"}, f)
    with h5py.File(os.path.join(src, "main_data.hdf5"), "w") as f:
        g = f.create_group("episode_0")
        g["observations"] = np.zeros((4, 2), np.float32)
        g["actions"], g["rewards"] = np.zeros(3, np.int64), np.zeros(3)
        g["terminations"], g["truncations"] = np.arange(3) == 2, np.zeros(3, bool)
    fifo_src = str(tmp_path / "fifo_minari")
    os.mkdir(fifo_src)
    os.mkfifo(os.path.join(fifo_src, "metadata.json"))
    not_ours = [p[n] for n in ("sentinel.txt", "proj", "ckpt", "notes.npy", "link.npy", "fifo.npy")]
    calls = [(f"from_minari(src, {path}, {layout})", lambda path=path, layout=layout: from_minari(src, path, layout))
             for path in p.values() for layout in ("aos", "soa")]
    calls += [(f"from_minari(src, {path}, {layout}, overwrite)",
               lambda path=path, layout=layout: from_minari(src, path, layout, overwrite=True))
              for path in not_ours for layout in ("aos", "soa")]
    calls += [(f"from_minari({path}, new)", lambda path=path: from_minari(path, str(tmp_path / "new")))
              for path in p.values()]
    calls += [("from_minari(fifo metadata)", lambda: from_minari(fifo_src, os.path.join(top, "new")))]
    before = snapshot(top)

    def hang(*_):
        raise TimeoutError("the call blocked")

    old = signal.signal(signal.SIGALRM, hang)
    try:
        for what, call in calls:
            signal.alarm(20)
            try:
                with pytest.raises(Exception) as info:  # noqa: PT011 - any refusal; the tree matters
                    call()
                assert not isinstance(info.value, TimeoutError), f"{what}: blocked"
            finally:
                signal.alarm(0)
            assert snapshot(top) == before, f"{what} changed the user's files"
            assert not os.path.exists(tmp_path / "new")
    finally:
        signal.signal(signal.SIGALRM, old)
    from_minari(src, os.path.join(top, "fresh"), "soa")  # the source itself is fine
    assert os.path.isdir(os.path.join(top, "fresh"))
