"""tfdata.alloc: arrays from numpy, jemalloc, mimalloc and anonymous maps, freed by their owner.

The real libraries are used (Debian's libjemalloc2 and libmimalloc2.0). Where one is not
installed its tests skip, unless ``TFDATA_REQUIRE_ALLOCATORS=1`` (set by ``.ci/run``, which installs
them): then a missing library fails the run instead of hiding behind a skip. A missing library and
the static-TLS trap are also simulated, so their error messages are tested on every machine.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import mmap
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import tfdata
from tfdata import alloc

from .conftest import CARTPOLE, LAYOUTS, assert_batches_equal, random_rows

REQUIRE = os.environ.get("TFDATA_REQUIRE_ALLOCATORS") == "1"


def usable(name: str) -> alloc.Allocator:
    ok, why = alloc.available(name)
    if not ok:
        if REQUIRE:
            pytest.fail(f"TFDATA_REQUIRE_ALLOCATORS=1 but {name} is unusable: {why}")
        pytest.skip(why)
    return alloc.open(name)


@pytest.fixture(params=alloc.NAMES)
def handle(request):
    a = usable(request.param)
    yield a
    a.close()


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * mmap.PAGESIZE


# -- the contract ----------------------------------------------------------------------------------
@pytest.mark.parametrize("shape,dtype", [((7,), np.float32), ((33, 3), np.int64), ((1,), np.bool_),
                                         ((5, 2, 3), np.uint8), ((0,), np.float64), ((4,), tfdata.Spec(CARTPOLE).aos_dtype)])
def test_zeros_and_empty_give_aligned_writable_arrays(handle, shape, dtype):
    z = handle.zeros(shape, dtype)
    e = handle.empty(shape, dtype)
    for arr in (z, e):
        assert arr.shape == shape and arr.dtype == np.dtype(dtype)
        assert arr.flags.c_contiguous and arr.flags.writeable
        if arr.size:
            assert arr.ctypes.data % 64 == 0
    assert not z.view(np.uint8).any()
    e.view(np.uint8)[...] = 0xAB  # the whole block is ours to write
    assert (e.view(np.uint8) == 0xAB).all()
    assert (z.ctypes.data, z.nbytes) != (e.ctypes.data, e.nbytes) or z.nbytes == 0


def test_huge_page_arrays_start_on_a_huge_page_and_small_ones_cost_no_huge_page():
    a = usable("hugepages")
    big = a.zeros(5 << 20, np.uint8)
    assert big.ctypes.data % (2 << 20) == 0
    before = _rss()
    small = [a.zeros(1000, np.uint8) for _ in range(50)]
    for x in small:
        x[0] = 1
    assert _rss() - before < 4 << 20  # was 98 MiB when every mapping was padded to 2 MiB


def test_zeros_are_zero_after_reuse(handle):
    # a freed block that comes back from the allocator must still be zeroed by zeros()
    for _ in range(20):
        x = handle.empty(4096, np.uint8)
        x[:] = 0xFF
        del x
        z = handle.zeros(4096, np.uint8)
        assert not z.any()
        del z


def test_counters_follow_the_last_view(handle):
    x = handle.zeros((1000, 4), np.float32)
    s = handle.stats()
    assert (s["live_blocks"], s["live_bytes"], s["allocations"]) == (1, 16000, 1)
    view = x[10:20, 1]
    del x
    gc.collect()
    assert handle.stats()["live_blocks"] == 1  # the view keeps the block
    view[:] = 3.0
    del view
    gc.collect()
    s = handle.stats()
    assert (s["live_blocks"], s["live_bytes"], s["peak_bytes"]) == (0, 0, 16000)


def test_freed_from_another_thread(handle):
    arrays = [handle.zeros(1 << 16, np.uint8) for _ in range(8)]
    box = {"a": arrays}
    del arrays

    def drop():
        box.clear()
        gc.collect()

    t = threading.Thread(target=drop)
    t.start()
    t.join()
    assert handle.stats()["live_blocks"] == 0


def test_memory_returns_to_the_system(handle):
    # 64 MiB touched, then freed: RSS comes back down (trim for the allocators that cache)
    n = 64 << 20
    before = _rss()
    x = handle.empty(n, np.uint8)
    x[::4096] = 1
    assert _rss() - before > n * 0.9
    del x
    gc.collect()
    handle.trim()
    assert _rss() - before < n * 0.25


def test_library_figures():
    for name in ("jemalloc", "mimalloc"):
        ok, _ = alloc.available(name)
        if not ok:
            continue
        with alloc.open(name) as a:
            key = "allocated" if name == "jemalloc" else "commit"
            before = a.stats()[key]
            x = a.zeros(32 << 20, np.uint8)
            x[::4096] = 1
            assert a.stats()[key] - before >= 32 << 20
            del x
            gc.collect()
            a.trim()
            if name == "jemalloc":  # freed by jemalloc itself: its own count goes down
                assert a.stats()["allocated"] - before < 1 << 20


def test_closed_handle_refuses_and_live_arrays_survive():
    with alloc.open("numpy") as a:
        x = a.zeros(100, np.int64)
    assert a.closed
    with pytest.raises(tfdata.AllocatorError, match="closed"):
        a.zeros(1)
    with pytest.raises(tfdata.AllocatorError, match="closed"):
        alloc.resolve(a)
    x[:] = 7
    assert x.sum() == 700
    del x
    gc.collect()
    assert a.stats()["live_blocks"] == 0


def test_shared_handles_and_resolve(monkeypatch):
    assert alloc.get("numpy") is alloc.get("NumPy")
    assert alloc.resolve(None) is alloc.get("numpy")
    monkeypatch.setenv("TFDATA_ALLOCATOR", "nohugepages")
    assert alloc.resolve(None) is alloc.get("nohugepages")
    monkeypatch.setenv("TFDATA_ALLOCATOR", "tcmalloc")
    with pytest.raises(ValueError, match="TFDATA_ALLOCATOR.*tcmalloc"):
        alloc.resolve(None)
    with pytest.raises(ValueError, match="expected one of"):
        alloc.resolve("malloc")
    with pytest.raises(ValueError, match="negative"):
        alloc.get("numpy").zeros((3, -1))


# -- errors that say what to do -------------------------------------------------------------------
def test_missing_library_is_explained(monkeypatch):
    monkeypatch.setitem(alloc.LIBRARIES, "jemalloc", ("libjemalloc-not-here.so.9",))
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    monkeypatch.delenv("TFDATA_JEMALLOC", raising=False)
    with pytest.raises(tfdata.AllocatorError) as exc:
        alloc.open("jemalloc")
    msg = str(exc.value)
    assert "apt-get install libjemalloc2" in msg and "TFDATA_JEMALLOC" in msg
    assert "libjemalloc-not-here.so.9" in msg
    monkeypatch.setenv("TFDATA_MIMALLOC", "/nonexistent/libmimalloc.so")
    with pytest.raises(tfdata.AllocatorError, match="TFDATA_MIMALLOC.*apt-get install libmimalloc2.0"):
        alloc.open("mimalloc")


def test_static_tls_failure_is_explained(monkeypatch):
    def refuse(path, mode=0, **kw):
        raise OSError(f"{path}: cannot allocate memory in static TLS block")

    monkeypatch.setattr(ctypes, "CDLL", refuse)
    with pytest.raises(tfdata.AllocatorError) as exc:
        alloc.open("jemalloc")
    assert f"GLIBC_TUNABLES={alloc.TUNABLE}" in str(exc.value)
    assert "reexec_with_tunables" in str(exc.value)


def _env_without_tunable() -> dict:
    env = dict(os.environ)
    env.pop("GLIBC_TUNABLES", None)
    env.pop("_TFDATA_REEXEC", None)
    return env


def test_real_static_tls_failure_and_reexec(tmp_path):
    """The trap itself, in real processes: without the tunable jemalloc fails with the clear
    message; a script that calls reexec_with_tunables() first loads it."""
    usable("jemalloc").close()
    code = "import tfdata.alloc as a; a.get('jemalloc')"
    out = subprocess.run([sys.executable, "-c", code], env=_env_without_tunable(),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "AllocatorError" in out.stderr and f"GLIBC_TUNABLES={alloc.TUNABLE}" in out.stderr
    script = tmp_path / "job.py"
    script.write_text("import sys, tfdata.alloc as a\n"
                      "a.reexec_with_tunables()\n"
                      "x = a.get('jemalloc').zeros(10, 'f8')\n"
                      "print('ok', a.has_tunable(), sys.argv[1:], float(x.sum()))\n")
    out = subprocess.run([sys.executable, str(script), "--flag", "v"], env=_env_without_tunable(),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok True ['--flag', 'v'] 0.0"


def test_tunable_env_keeps_other_tunables():
    env = alloc.tunable_env({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"})
    assert env["GLIBC_TUNABLES"] == f"glibc.malloc.arena_max=2:{alloc.TUNABLE}"
    assert alloc.tunable_env(env)["GLIBC_TUNABLES"] == env["GLIBC_TUNABLES"]
    assert alloc.has_tunable(env) and not alloc.has_tunable({})


def test_arrays_alive_at_exit_are_safe():
    """Blocks still referenced when the interpreter exits are not freed under live views."""
    names = [n for n in alloc.NAMES if alloc.available(n)[0]]
    code = ("import numpy as np, tfdata.alloc as a\n"
            f"keep = [a.get(n).zeros((1000, 3), np.float32) for n in {names!r}]\n"
            "keep.append(keep[0][1:])\n"
            "import atexit; atexit.register(lambda: [k.sum() for k in keep])\n"
            "print('done')\n")
    out = subprocess.run([sys.executable, "-c", code], env=alloc.tunable_env(),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "done" and out.stderr == "", out.stderr


def test_madvise_without_the_gil():
    a = alloc.get("nohugepages").zeros(1 << 20, np.uint8)
    a[:] = 1
    alloc.madvise(a, mmap.MADV_DONTNEED)  # private anonymous pages read back as zero
    assert not a.any()
    with pytest.raises(OSError):
        alloc.madvise(a, 12345)


# -- buffers and loaders on every allocator ---------------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", ["uniform", "prioritized", "nstep_elided"])
def test_buffers_sample_the_same_on_every_allocator(handle, layout, kind):
    rng = np.random.default_rng(5)
    rows = random_rows(tfdata.Spec(CARTPOLE), 70, rng)
    rows["terminated"][:] = False
    rows["truncated"][:] = False
    rows["terminated"][[9, 40]] = True
    rows["next_obs"][:-1] = rows["obs"][1:]
    rows["next_obs"][[9, 40]] += 1.0  # final observations differ from the next row's obs
    cls = tfdata.PrioritizedReplayBuffer if kind == "prioritized" else tfdata.ReplayBuffer
    extra = dict(n_step=3, elide_next=True) if kind == "nstep_elided" else {}
    bufs = [cls(CARTPOLE, 33, layout=layout, seed=3, allocator=a, **extra)
            for a in (alloc.get("numpy"), handle)]
    for b in bufs:
        b.extend(rows)
    assert handle.stats()["live_bytes"] == bufs[1].nbytes  # every array came from the handle
    for bs in (1, 7, 33):
        got = [b.sample(bs) for b in bufs]
        assert_batches_equal(dict(got[0]), dict(got[1]))
        np.testing.assert_array_equal(got[0].indices, got[1].indices)
    assert handle.stats()["live_bytes"] == bufs[1].nbytes
    del bufs, got, b
    gc.collect()
    assert handle.stats()["live_blocks"] == 0


def test_loader_batches_come_from_the_allocator(handle):
    spec = tfdata.Spec(CARTPOLE)
    ds = tfdata.ArrayDataset(random_rows(spec, 100, np.random.default_rng(0)))
    loader = tfdata.DataLoader(ds, 16, shuffle=True, seed=1, prefetch=1, allocator=handle)
    assert handle.stats()["live_bytes"] == loader.nbytes
    ref = tfdata.DataLoader(ds, 16, shuffle=True, seed=1, prefetch=1)
    for a, b in zip(loader, ref):
        assert_batches_equal(dict(a), dict(b))


def test_loader_refuses_an_allocator_the_dataset_cannot_use():
    spec = tfdata.Spec(CARTPOLE)
    ds = tfdata.ArrayDataset(random_rows(spec, 10, np.random.default_rng(0)))

    class Old:  # a dataset of the first contract: new_output(batch_size) only
        def __init__(self):
            self.spec, self.layout, self.row_nbytes = ds.spec, ds.layout, ds.row_nbytes

        def __len__(self):
            return len(ds)

        def new_output(self, batch_size):
            return ds.new_output(batch_size)

        def gather(self, idx, out):
            ds.gather(idx, out)

        def rows(self, start, stop):
            return ds.rows(start, stop)

    assert len(list(tfdata.DataLoader(Old(), 4, shuffle=True, seed=0))) == 3
    with pytest.raises(TypeError, match="new_output.*no allocator"):
        tfdata.DataLoader(Old(), 4, shuffle=True, seed=0, allocator="numpy")


def test_only_alloc_touches_ctypes():
    root = os.path.dirname(tfdata.__file__)
    offenders = []
    for dirpath, _, files in os.walk(root):
        for f in files:
            if f.endswith(".py") and f != "alloc.py":
                with open(os.path.join(dirpath, f)) as fh:
                    if "ctypes" in fh.read().replace(".ctypes.data", ""):
                        offenders.append(f)
    assert offenders == []


@pytest.mark.parametrize("kind", ["uniform", "prioritized"])
def test_steady_state_takes_nothing_from_the_allocator(handle, layout, kind):
    cls = tfdata.PrioritizedReplayBuffer if kind == "prioritized" else tfdata.ReplayBuffer
    buf = cls(CARTPOLE, 33, layout=layout, seed=0, allocator=handle, n_step=2)
    rows = random_rows(tfdata.Spec(CARTPOLE), 40, np.random.default_rng(0))
    buf.extend(rows)
    b = buf.sample(8)  # the first sample of a batch size makes its ring
    before = handle.stats()["allocations"]
    for i in range(50):
        buf.push({k: v[i % 40] for k, v in rows.items()})
        buf.extend({k: v[:7] for k, v in rows.items()})
        b = buf.sample(8)
        if kind == "prioritized":
            buf.update_priorities(b, np.ones(8))
    assert handle.stats()["allocations"] == before


def test_array_dataset_copies_through_the_allocator(handle):
    spec = tfdata.Spec(CARTPOLE)
    cols = random_rows(spec, 50, np.random.default_rng(0))
    ds = tfdata.ArrayDataset(cols, layout="aos", allocator=handle)
    assert handle.stats()["live_bytes"] == 50 * spec.aos_dtype.itemsize
    for name in spec.names:
        np.testing.assert_array_equal(ds.records[name], cols[name])
    back = tfdata.ArrayDataset(ds.records, layout="soa", allocator=handle)
    for name in spec.names:
        np.testing.assert_array_equal(back.columns[name], cols[name])
        assert back.columns[name].flags.c_contiguous
    assert handle.stats()["live_bytes"] == 50 * (spec.aos_dtype.itemsize + spec.row_nbytes)
    same = tfdata.ArrayDataset(cols, allocator=handle)  # nothing to copy: the caller's arrays
    assert same.columns["obs"] is cols["obs"]
    with pytest.raises(tfdata.MemoryBudgetError, match="ArrayDataset of 50 AoS rows"):
        tfdata.ArrayDataset(cols, layout="aos", allocator=handle, memory_budget=100)


def test_checkpoint_loads_onto_the_chosen_allocator(handle, tmp_path):
    buf = tfdata.PrioritizedReplayBuffer(CARTPOLE, 33, seed=2)
    buf.extend(random_rows(tfdata.Spec(CARTPOLE), 40, np.random.default_rng(0)))
    buf.save(tmp_path / "ck")
    got = tfdata.PrioritizedReplayBuffer.load(tmp_path / "ck", allocator=handle)
    assert handle.stats()["live_bytes"] == got.nbytes
    np.testing.assert_array_equal(got.sample(8).indices, buf.sample(8).indices)
    # 16 rows: 768 B of rows, 80 of episode numbers and 8-bit versions, 160 of trees and 4 of
    # the update's scratch (<= 1 KiB)
    with pytest.raises(tfdata.MemoryBudgetError, match="largest capacity that fits is 16"):  # not a bad file
        tfdata.PrioritizedReplayBuffer.load(tmp_path / "ck", memory_budget="1k")


@pytest.mark.parametrize("name", ["jemalloc", "mimalloc"])
def test_allocation_leaves_nothing_for_the_cycle_collector(name):
    """A training loop may run with gc disabled: allocating and freeing must not pile up objects
    only the cycle collector frees (a ctypes array type per distinct size did: 186 MiB per 60k)."""
    a = usable(name)
    gc.collect()
    gc.disable()
    try:
        before = _rss()
        for n in range(4096, 4096 + 20_000):  # 20k distinct sizes
            x = a.empty(n, np.uint8)
            x[0] = 1
            del x
        a.trim()
        assert a.stats()["live_blocks"] == 0
        assert _rss() - before < 16 << 20
    finally:
        gc.enable()
        a.close()
