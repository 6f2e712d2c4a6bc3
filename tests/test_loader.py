"""Datasets and the DataLoader against the pure-Python reference order in tests/naive.py."""

from __future__ import annotations

import asyncio
import gc
import itertools
import json
import os
import sys
import threading
import time
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tfdata
from tfdata.errors import FormatError, SpecError

from . import naive
from .conftest import CARTPOLE, LAYOUTS, ODD, random_rows

MODES = [False, True, "block"]
MODE_NAME = {False: "none", True: "full", "block": "block"}


def make_data(spec_dict, n, seed=0):
    spec = tfdata.Spec(spec_dict)
    return spec, random_rows(spec, n, np.random.default_rng(seed))


def make_dataset(kind, layout, cols, tmp_path=None, spec=None):
    if kind == "array":
        if layout == "aos":
            rec = np.empty(len(next(iter(cols.values()))), spec.aos_dtype)
            for k, v in cols.items():
                rec[k] = v
            return tfdata.ArrayDataset(rec)
        return tfdata.ArrayDataset(cols)
    path = os.path.join(tmp_path, "data.npy" if layout == "aos" else "data")
    tfdata.io.save(path, cols, layout=layout)
    return tfdata.MmapDataset.open(path)


def collect(loader):
    return [(b.indices.copy(), {k: np.array(v) for k, v in b.items()}) for b in loader]


def check_against_reference(loader, cols, n, batch, mode, seed, epoch, drop_last, block_rows=1, window_blocks=1):
    want = naive.loader_order(n, batch, MODE_NAME[mode], seed, epoch, drop_last, block_rows, window_blocks)
    got = collect(loader)
    assert len(got) == len(want) == len(loader)
    for (idx, fields), ref in zip(got, want):
        np.testing.assert_array_equal(idx, ref)
        for k, v in cols.items():
            np.testing.assert_array_equal(fields[k], v[ref], err_msg=k)


# -- order and contents ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["array", "mmap"])
@pytest.mark.parametrize("mode", MODES, ids=["none", "full", "block"])
@pytest.mark.parametrize("n,batch", [(1, 1), (7, 3), (33, 8), (33, 33), (7, 10)])
@pytest.mark.parametrize("drop_last", [False, True])
def test_batches_match_reference(tmp_path, layout, kind, mode, n, batch, drop_last):
    spec, cols = make_data(ODD, n)
    ds = make_dataset(kind, layout, cols, tmp_path, spec)
    if drop_last and n < batch:
        with pytest.raises(ValueError, match="fewer than one batch"):
            tfdata.DataLoader(ds, batch, shuffle=mode, drop_last=True)
        return
    loader = tfdata.DataLoader(ds, batch, shuffle=mode, drop_last=drop_last, seed=11, prefetch=2,
                               block_rows=3, window_blocks=2)
    for epoch in range(3):
        check_against_reference(loader, cols, n, batch, mode, 11, epoch, drop_last, 3, 2)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 200), batch=st.integers(1, 70), mode=st.sampled_from(MODES), drop_last=st.booleans(),
       block_rows=st.integers(1, 40), window_blocks=st.integers(1, 6), prefetch=st.integers(0, 3),
       seed=st.integers(0, 2**64 - 1), layout=st.sampled_from(LAYOUTS), zero_copy=st.booleans())
def test_any_configuration_matches_reference(n, batch, mode, drop_last, block_rows, window_blocks, prefetch, seed,
                                             layout, zero_copy):
    if drop_last and n < batch:
        return
    spec, cols = make_data(CARTPOLE, n, seed=n)
    ds = make_dataset("array", layout, cols, spec=spec)
    loader = tfdata.DataLoader(ds, batch, shuffle=mode, drop_last=drop_last, seed=seed, prefetch=prefetch,
                               block_rows=block_rows, window_blocks=window_blocks, zero_copy=zero_copy)
    check_against_reference(loader, cols, n, batch, mode, seed, 0, drop_last, block_rows, window_blocks)


@pytest.mark.parametrize("mode", [True, "block"], ids=["full", "block"])
def test_every_epoch_is_a_permutation_and_epochs_differ(mode):
    spec, cols = make_data(CARTPOLE, 1000)
    loader = tfdata.DataLoader(tfdata.ArrayDataset(cols), 64, shuffle=mode, seed=3, block_rows=10, window_blocks=4)
    orders = []
    for _ in range(3):
        order = np.concatenate([b.indices.copy() for b in loader])
        np.testing.assert_array_equal(np.sort(order), np.arange(1000))
        orders.append(order)
    assert not np.array_equal(orders[0], orders[1]) and not np.array_equal(orders[1], orders[2])


def test_same_batches_whatever_the_prefetch_depth_and_layout(tmp_path):
    spec, cols = make_data(ODD, 300)
    runs = []
    for layout in LAYOUTS:
        ds = make_dataset("mmap", layout, cols, tmp_path / layout, spec) if False else None
        path = os.path.join(tmp_path, f"d-{layout}" + (".npy" if layout == "aos" else ""))
        tfdata.io.save(path, cols, layout=layout)
        ds = tfdata.MmapDataset.open(path)
        for prefetch in (0, 1, 2, 4):
            for mode in MODES:
                loader = tfdata.DataLoader(ds, 32, shuffle=mode, seed=5, prefetch=prefetch, block_rows=7)
                runs.append(((mode, prefetch, layout), [collect(loader) for _ in range(2)]))
    by_mode = {}
    for (mode, _, _), epochs in runs:
        by_mode.setdefault(mode, []).append(epochs)
    for mode, all_runs in by_mode.items():
        first = all_runs[0]
        for other in all_runs[1:]:
            for e1, e2 in zip(first, other):
                for (i1, f1), (i2, f2) in zip(e1, e2):
                    np.testing.assert_array_equal(i1, i2)
                    for k in f1:
                        np.testing.assert_array_equal(f1[k], f2[k])


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("n", [0, 1, 2, 3, 17, 1000])
def test_the_one_shuffle_is_the_reference(n, dtype):
    """``kernels.permutation`` (the loader's epochs and, through ``_rng.shuffle``, its windows;
    the rollout buffer's epochs) against ``naive.fisher_yates``, the counter it leaves included."""
    from tfdata import kernels

    for key, ctr in ((0, 0), (2**64 - 1, 5), (naive.key_of(7), 2**63)):
        state = np.array([key, ctr], np.uint64)
        perm = np.full(n, -1, dtype)
        kernels.permutation(state, perm)
        want = list(range(n))
        counter = naive.fisher_yates(want, key, ctr)
        assert perm.tolist() == want
        assert (int(state[0]), int(state[1])) == (key, counter)
    # a window: the rows of some blocks, shuffled from where the epoch's draws stopped
    blocks = np.array([3, 0, 2, 1, 4], np.int64)
    state = np.array([naive.key_of(n), 9], np.uint64)
    out = np.full(40, -1, np.int64)
    m = kernels.window_order(blocks, 1, 4, 7, 33, state, out)
    rows = [r for b in (0, 2, 1) for r in range(b * 7, (b + 1) * 7)]
    counter = naive.fisher_yates(rows, naive.key_of(n), 9)
    assert m == 21 and out[:m].tolist() == rows and int(state[1]) == counter


def test_fisher_yates_is_uniform():
    # all 120 orders of 5 rows over 12,000 epochs: chi-square with 119 degrees of freedom
    spec, cols = make_data(CARTPOLE, 5)
    loader = tfdata.DataLoader(tfdata.ArrayDataset(cols), 5, shuffle=True, seed=2024, prefetch=0)
    counts = Counter(tuple(next(iter(loader)).indices) for _ in range(12_000))
    assert len(counts) == 120  # Sattolo's off-by-one would give only the 24 cycles
    expected = 12_000 / 120
    chi2 = sum((c - expected) ** 2 / expected for c in counts.values())
    assert chi2 < 180, chi2  # p ~ 3e-4 at 119 dof; fixed seed, so the test is deterministic


def test_state_dict_resumes_the_epoch_sequence():
    spec, cols = make_data(CARTPOLE, 50)
    a = tfdata.DataLoader(tfdata.ArrayDataset(cols), 8, shuffle=True, seed=9)
    collect(a)
    b = tfdata.DataLoader(tfdata.ArrayDataset(cols), 8, shuffle=True, seed=1)
    b.load_state_dict(a.state_dict())
    for (i1, _), (i2, _) in zip(collect(a), collect(b)):
        np.testing.assert_array_equal(i1, i2)
    assert a.epoch == b.epoch == 2


def test_seed_none_is_recorded_and_replays():
    spec, cols = make_data(CARTPOLE, 40)
    a = tfdata.DataLoader(tfdata.ArrayDataset(cols), 8, shuffle=True)
    b = tfdata.DataLoader(tfdata.ArrayDataset(cols), 8, shuffle=True, seed=a.seed)
    assert [x.tolist() for x, _ in collect(a)] == [x.tolist() for x, _ in collect(b)]


# -- zero copy, layouts, files --------------------------------------------------------------------


def test_unshuffled_mmap_batches_are_read_only_views(tmp_path, layout):
    spec, cols = make_data(CARTPOLE, 100)
    ds = make_dataset("mmap", layout, cols, tmp_path, spec)
    for b in tfdata.DataLoader(ds, 30, prefetch=1):
        for k in cols:
            assert np.shares_memory(b[k], ds.field(k))
            assert not b[k].flags.writeable
    copies = tfdata.DataLoader(ds, 30, zero_copy=False)
    for b in copies:
        assert not np.shares_memory(b["obs"], ds.field("obs"))


def test_gathered_batches_reuse_a_preallocated_ring():
    spec, cols = make_data(CARTPOLE, 100)
    loader = tfdata.DataLoader(tfdata.ArrayDataset(cols), 10, shuffle=True, seed=0, prefetch=2)
    seen = {b["obs"].__array_interface__["data"][0] for b in loader}
    assert len(seen) == 3  # prefetch + 1 buffers, reused for all ten batches


def test_array_dataset_layout_conversion_and_odd_records(tmp_path):
    # a packed 46-byte record written by plain numpy: any itemsize works
    dt = np.dtype([("obs", "f4", (4,)), ("action", "i8"), ("reward", "f4"), ("next_obs", "f4", (4,)),
                   ("terminated", "?"), ("truncated", "?")])
    assert dt.itemsize == 46
    rng = np.random.default_rng(0)
    rec = np.zeros(37, dt)
    rec["obs"] = rng.normal(size=(37, 4))
    rec["action"] = np.arange(37)
    path = str(tmp_path / "packed.npy")
    np.save(path, rec)
    ds = tfdata.MmapDataset.open(path)
    assert ds.layout == "aos" and ds.row_nbytes == 46
    soa = tfdata.ArrayDataset(rec, layout="soa")
    aos2 = tfdata.ArrayDataset({k: rec[k] for k in dt.names}, layout="aos")
    out = [tfdata.DataLoader(d, 5, shuffle=True, seed=4) for d in (ds, soa, aos2)]
    for bs in zip(*out):
        for k in dt.names:
            np.testing.assert_array_equal(bs[0][k], rec[k][bs[0].indices])
            np.testing.assert_array_equal(bs[0][k], bs[1][k])
            np.testing.assert_array_equal(bs[0][k], bs[2][k])


def test_saved_files_are_readable_by_plain_numpy(tmp_path):
    spec, cols = make_data(ODD, 20)
    tfdata.io.save(str(tmp_path / "a.npy"), cols, layout="aos")
    rec = np.load(tmp_path / "a.npy", mmap_mode="r", allow_pickle=False)
    tfdata.io.save(str(tmp_path / "s"), cols, layout="soa")
    manifest = json.loads((tmp_path / "s" / "manifest.json").read_text())
    for k, v in cols.items():
        np.testing.assert_array_equal(rec[k], v)
        entry = next(e for e in manifest["fields"] if e["name"] == k)
        np.testing.assert_array_equal(np.load(tmp_path / "s" / entry["file"], allow_pickle=False), v)


def test_create_fills_a_file_in_chunks(tmp_path, layout):
    spec, cols = make_data(CARTPOLE, 50)
    path = str(tmp_path / ("c.npy" if layout == "aos" else "c"))
    out = tfdata.io.create(path, spec, 50, layout=layout)
    for s in range(0, 50, 16):
        for k in cols:
            out[k][s:s + 16] = cols[k][s:s + 16]
    del out
    ds = tfdata.MmapDataset.open(path)
    for k in cols:
        np.testing.assert_array_equal(ds.field(k), cols[k])


def test_gather_checks_indices():
    spec, cols = make_data(CARTPOLE, 10)
    ds = tfdata.ArrayDataset(cols)
    out = ds.new_output(4)
    with pytest.raises(IndexError, match=r"\[0, 10\)"):
        ds.gather(np.array([1, 10]), out)
    with pytest.raises(SpecError, match="int64"):
        ds.gather(np.array([1, 2], np.int32), out)
    with pytest.raises(SpecError, match="do not fit"):
        ds.gather(np.arange(5), out)
    ds.gather(np.array([3, 1]), out)
    np.testing.assert_array_equal(out.fields["obs"][:2], cols["obs"][[3, 1]])


def test_torch_from_numpy_shares_memory():
    torch = pytest.importorskip("torch")
    spec, cols = make_data(CARTPOLE, 64)
    for b in tfdata.DataLoader(tfdata.ArrayDataset(cols), 16, shuffle=True, seed=0):
        t = torch.from_numpy(b["obs"])
        assert t.data_ptr() == b["obs"].__array_interface__["data"][0]
        np.testing.assert_array_equal(t.numpy(), cols["obs"][b.indices])


# -- bad input --------------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs,match", [
    (dict(batch_size=0), "batch_size must be an int >= 1, got 0"),
    (dict(batch_size=-3), "batch_size"),
    (dict(batch_size=2.5), "batch_size"),
    (dict(batch_size=4, prefetch=-1), "prefetch"),
    (dict(batch_size=4, shuffle="yes"), "shuffle must be"),
    (dict(batch_size=4, shuffle="block", block_rows=0), "block_rows"),
    (dict(batch_size=4, resident_bytes=10), "resident_bytes"),
    (dict(batch_size=4, resident_bytes="lots"), "resident_bytes"),
])
def test_bad_loader_options(kwargs, match):
    spec, cols = make_data(CARTPOLE, 10)
    with pytest.raises(ValueError, match=match):
        tfdata.DataLoader(tfdata.ArrayDataset(cols), **kwargs)


def test_bad_array_data():
    with pytest.raises(SpecError, match="same number of rows"):
        tfdata.ArrayDataset({"a": np.zeros(3), "b": np.zeros(4)})
    with pytest.raises(SpecError, match="'s'"):
        tfdata.ArrayDataset({"s": np.array(["x", "y"])})
    with pytest.raises(SpecError, match="scalar"):
        tfdata.ArrayDataset({"a": np.float32(1)})
    with pytest.raises(SpecError, match="1-D"):
        tfdata.ArrayDataset(np.zeros((2, 2), [("a", "f4")]))


def _write_header(path, header: dict, data: bytes = b""):
    import io as _bio
    buf = _bio.BytesIO()
    np.lib.format.write_array_header_1_0(buf, header)
    with open(path, "wb") as f:
        f.write(buf.getvalue() + data)


def test_bad_files(tmp_path):
    dt = np.dtype([("x", "f4", (2,)), ("y", "i8")])
    good = np.zeros(10, dt)
    p = str(tmp_path / "f.npy")
    with pytest.raises(FileNotFoundError, match="no such"):
        tfdata.MmapDataset.open(str(tmp_path / "missing.npy"))
    np.save(p, good)
    raw = open(p, "rb").read()
    open(p, "wb").write(raw[:-5])
    with pytest.raises(FormatError, match="truncated"):
        tfdata.MmapDataset.open(p)
    open(p, "wb").write(raw + b"\0" * 8)
    with pytest.raises(FormatError, match="trailing"):
        tfdata.MmapDataset.open(p)
    _write_header(p, {"descr": np.lib.format.dtype_to_descr(dt), "fortran_order": False, "shape": (10**15,)},
                  good.tobytes())
    with pytest.raises(FormatError, match="header says shape"):
        tfdata.MmapDataset.open(p)
    _write_header(p, {"descr": "|O", "fortran_order": False, "shape": (2,)}, b"\0" * 16)
    with pytest.raises(FormatError, match="objects"):
        tfdata.MmapDataset.open(p)
    open(p, "wb").write(b"not a numpy file at all")
    with pytest.raises(FormatError, match="not an NPY file"):
        tfdata.MmapDataset.open(p)
    np.save(p, np.zeros((3, 2), "f4"))
    with pytest.raises(FormatError, match="structured"):
        tfdata.MmapDataset.open(p)
    np.save(p, np.zeros(3, [("s", "U3")]))
    with pytest.raises(FormatError, match="'s'"):
        tfdata.MmapDataset.open(p)


def test_bad_soa_directories(tmp_path):
    spec, cols = make_data(CARTPOLE, 10)
    d = tmp_path / "s"
    tfdata.io.save(str(d), cols, layout="soa")
    m = json.loads((d / "manifest.json").read_text())

    def with_manifest(change):
        doc = json.loads(json.dumps(m))
        change(doc)
        (d / "manifest.json").write_text(json.dumps(doc))

    with_manifest(lambda doc: doc.update(version=[2, 0]))
    with pytest.raises(FormatError, match="version 2.0 is not supported"):
        tfdata.MmapDataset.open(str(d))
    with_manifest(lambda doc: doc["fields"][0].update(file="../../etc/passwd"))
    with pytest.raises(FormatError, match="plain file name"):
        tfdata.MmapDataset.open(str(d))
    with_manifest(lambda doc: doc.update(rows=11))
    with pytest.raises(FormatError, match="manifest says"):
        tfdata.MmapDataset.open(str(d))
    with_manifest(lambda doc: doc["fields"][0].update(dtype="<f8"))
    with pytest.raises(FormatError, match="'obs'"):
        tfdata.MmapDataset.open(str(d))
    (d / "manifest.json").write_text("{not json")
    with pytest.raises(FormatError, match="not valid JSON"):
        tfdata.MmapDataset.open(str(d))
    os.remove(d / "manifest.json")
    with pytest.raises(FileNotFoundError, match="manifest"):
        tfdata.MmapDataset.open(str(d))


# -- threads, errors, async ---------------------------------------------------------------------------


class Flaky:
    """A dataset implemented outside tfdata (the protocol only) whose gather fails on one batch."""

    def __init__(self, cols, fail_on_row=None, delay=0.0):
        self.inner = tfdata.ArrayDataset(cols)
        self.spec = self.inner.spec
        self.row_nbytes = self.inner.row_nbytes
        self.fail_on_row = fail_on_row
        self.delay = delay

    def __len__(self):
        return len(self.inner)

    def new_output(self, b):
        return self.inner.new_output(b)

    def rows(self, start, stop):
        return self.inner.rows(start, stop)

    def gather(self, idx, out):
        if self.delay:
            time.sleep(self.delay)
        if self.fail_on_row is not None and self.fail_on_row in idx:
            raise KeyError(f"row {self.fail_on_row} is unreadable")
        self.inner.gather(idx, out)


def _prefetch_threads():
    return [t for t in threading.enumerate() if t.name.startswith("tfdata-prefetch")]


@pytest.mark.parametrize("prefetch", [0, 1, 3])
@pytest.mark.parametrize("step", [0, 0.002], ids=["fast", "slow"])
def test_error_surfaces_at_the_batch_that_failed(prefetch, step):
    spec, cols = make_data(CARTPOLE, 100)
    loader = tfdata.DataLoader(Flaky(cols, fail_on_row=55), 10, prefetch=prefetch, zero_copy=False)
    it = iter(loader)
    got = []
    for _ in range(5):
        got.append(next(it).indices.copy())
        time.sleep(step)  # slow: the thread has gathered ahead, up to the failing batch
    assert [g[0] for g in got] == [0, 10, 20, 30, 40]
    with pytest.raises(KeyError, match="row 55 is unreadable"):
        next(it)
    with pytest.raises(StopIteration):
        next(it)
    assert not _prefetch_threads()


def _slow_steps(it, count, seconds=0.002):
    """Take ``count`` batches with a step of ``seconds`` after each: the consumer then works
    between batches, which is what starts the prefetch thread."""
    got = []
    for _ in range(count):
        got.append(next(it).indices.copy())
        time.sleep(seconds)
    return got


def test_no_leaked_threads():
    spec, cols = make_data(CARTPOLE, 1000)
    loader = tfdata.DataLoader(tfdata.ArrayDataset(cols), 10, shuffle=True, seed=0, prefetch=3)
    for i, _ in enumerate(loader):  # break: the iterator is dropped
        time.sleep(0.002)
        if i == 4:
            break
    gc.collect()
    assert not _prefetch_threads()
    it = iter(loader)
    _slow_steps(it, 4)
    assert len(_prefetch_threads()) == 1  # the consumer worked between batches: the thread runs
    it.close()
    assert not _prefetch_threads()
    it = iter(loader)
    _slow_steps(it, 4)
    del it
    assert not _prefetch_threads()
    it = iter(loader)
    _slow_steps(it, 4)
    loader.close()
    assert not _prefetch_threads()
    with pytest.raises(StopIteration):
        next(it)
    for _ in loader:  # to the end, the thread running
        time.sleep(0.0005)
    assert not _prefetch_threads()


def test_a_consumer_that_only_reads_batches_starts_no_thread(monkeypatch):
    # the loader's clock moves 1 ns per reading: every step outside next() is measured short,
    # as it is for this loop on an idle machine (a loaded one may pause it anywhere, twice)
    tfdata._prefetch.spin_reads()  # measured once per process, with the real clock
    clock = itertools.count()
    monkeypatch.setattr(tfdata.loader, "_pc", lambda: next(clock))
    spec, cols = make_data(CARTPOLE, 1000)
    loader = tfdata.DataLoader(tfdata.ArrayDataset(cols), 10, shuffle=True, seed=0, prefetch=2)
    for _ in range(3):  # epochs: nothing carried over starts one either
        it = iter(loader)
        for _ in range(50):
            next(it)
        assert not _prefetch_threads()
        it.close()


class Recording(Flaky):
    """An ArrayDataset whose gathers and touches record the thread that ran them, and may be
    slowed down (a sleep releases the GIL, as the gather kernel does)."""

    def __init__(self, cols, delay=0.0):
        super().__init__(cols, delay=delay)
        self.threads = []

    def gather(self, idx, out):
        self.threads.append(threading.get_ident())
        if self.delay:
            time.sleep(self.delay)
        self.inner.gather(idx, out)


def _consume(loader, pattern, hold_check=True):
    """One epoch, consumed with a step per batch given by ``pattern(k)`` (seconds, 0 for none).

    Each batch is copied when it arrives and compared again with its copy after the step, just
    before the next request: a thread that wrote into the slot the consumer holds would be caught.
    Returns the copies."""
    got = []
    for k, b in enumerate(loader):
        copy = (b.indices.copy(), {f: np.array(v) for f, v in b.items()})
        s = pattern(k)
        if s:
            time.sleep(s)
        if hold_check:
            np.testing.assert_array_equal(b.indices, copy[0])
            for f, v in copy[1].items():
                np.testing.assert_array_equal(b[f], v, err_msg=f"batch {k} changed while held")
        got.append(copy)
    return got


PATTERNS = {
    "fast": lambda k: 0,
    "slow": lambda k: 0.001,
    # bursts: slow steps start the thread, fast ones find it behind and gather themselves
    "bursts": lambda k: 0.001 if (k // 4) % 2 else 0,
    "jitter": lambda k: [0, 0.0003, 0.002, 0][k % 4],
}


@pytest.mark.parametrize("mode", MODES, ids=["none", "full", "block"])
@pytest.mark.parametrize("pattern", list(PATTERNS))
def test_batches_identical_for_every_depth_and_consumer(mode, pattern):
    n, batch = 230, 8
    spec, cols = make_data(ODD, n)
    for prefetch in (0, 1, 2, 3):
        ds = Recording(cols, delay=0.0002)
        loader = tfdata.DataLoader(ds, batch, shuffle=mode, seed=7, prefetch=prefetch, zero_copy=False,
                                   block_rows=5, window_blocks=3)
        me = threading.get_ident()
        # slow steps start the prefetch thread; whether it wins a batch from the consumer is
        # the machine's scheduling: with those, epochs go on until it has gathered one (a cap
        # ends a hang)
        until_thread = prefetch and pattern in ("slow", "bursts")
        deadline = time.monotonic() + 120
        e = 0
        while e < 2 or (until_thread and all(t == me for t in ds.threads) and time.monotonic() < deadline):
            got = _consume(loader, PATTERNS[pattern])
            want = naive.loader_order(n, batch, MODE_NAME[mode], 7, e, False, 5, 3)
            assert [i.tolist() for i, _ in got] == [list(w) for w in want]
            for (idx, fields), w in zip(got, want):
                for f, v in cols.items():
                    np.testing.assert_array_equal(fields[f], v[w], err_msg=f)
            e += 1
        others = sum(t != me for t in ds.threads)
        if until_thread:
            assert others > 0, "the prefetch thread never gathered: the test would not test it"
        if prefetch and pattern in ("fast", "bursts"):
            assert len(ds.threads) - others > 0, "the consumer never gathered a batch itself"
        if prefetch == 0:
            assert others == 0
        assert not _prefetch_threads()


class HeldBack(Recording):
    """The prefetch thread's first gather waits until the consumer has gathered a batch while
    it waited (at most 60 s: a consumer that waits for the thread instead fails, not hangs)."""

    def __init__(self, cols, consumer):
        super().__init__(cols)
        self.consumer = consumer
        self.entered, self.gate = threading.Event(), threading.Event()
        self.held = None  # the rows of the batch the thread held back
        self.released = None  # whether the consumer's gather released it

    def gather(self, idx, out):
        if threading.get_ident() != self.consumer and self.held is None:
            self.held = idx.copy()
            self.entered.set()
            self.released = self.gate.wait(60)
        elif threading.get_ident() == self.consumer and self.entered.is_set():
            self.gate.set()
        super().gather(idx, out)


def test_consumer_gathers_ahead_while_the_thread_is_behind():
    # the thread is gathering the batch the consumer wants (held back until the consumer has
    # gathered one): the consumer gathers a later batch meanwhile instead of waiting for it
    n, batch = 120, 4
    spec, cols = make_data(CARTPOLE, n)
    ds = HeldBack(cols, threading.get_ident())
    loader = tfdata.DataLoader(ds, batch, shuffle=True, seed=3, prefetch=3, zero_copy=False)

    def step(k):
        if k < 2:
            return 0.012  # long steps: the thread starts at the request of batch 2
        if k == 2:  # a step until the thread is inside its first gather (the cap ends a hang)
            assert ds.entered.wait(60), "the prefetch thread never gathered"
        return 0

    got = _consume(loader, step)
    want = naive.loader_order(n, batch, "full", 3, 0, False)
    assert [i.tolist() for i, _ in got] == [list(w) for w in want]
    for (idx, fields), w in zip(got, want):
        np.testing.assert_array_equal(fields["obs"], cols["obs"][w])
    assert ds.released, "the consumer waited for the thread's batch instead of gathering another"
    mine = ds.threads.count(threading.get_ident())
    assert mine >= 3 and len(ds.threads) - mine >= 1  # batches 0, 1 and the one gathered ahead


@pytest.mark.parametrize("prefetch", [1, 2, 3])
@pytest.mark.parametrize("stop_at", [0, 1, 5, 13])
def test_an_epoch_stopped_anywhere_leaves_the_next_one_intact(prefetch, stop_at):
    n, batch = 150, 9
    spec, cols = make_data(CARTPOLE, n)
    for mode in MODES:
        loader = tfdata.DataLoader(Recording(cols, delay=0.0003), batch, shuffle=mode, seed=1, prefetch=prefetch,
                                   zero_copy=False, block_rows=4, window_blocks=2)
        it = iter(loader)
        for k in range(stop_at + 1):
            next(it)
            time.sleep(0.002 if k % 3 else 0)  # the thread is running ahead when the epoch stops
        if stop_at % 2:
            it.close()
        else:
            del it
            gc.collect()
        assert not _prefetch_threads()
        got = _consume(loader, PATTERNS["jitter"])
        want = naive.loader_order(n, batch, MODE_NAME[mode], 1, 1, False, 4, 2)
        assert [i.tolist() for i, _ in got] == [list(w) for w in want]


@pytest.mark.parametrize("mode", MODES, ids=["none", "full", "block"])
def test_slow_consumer_gets_prefetched_batches_from_a_preallocated_ring(mode):
    spec, cols = make_data(CARTPOLE, 400)
    ds = Recording(cols)
    loader = tfdata.DataLoader(ds, 10, shuffle=mode, seed=0, prefetch=2, zero_copy=False, block_rows=7)
    seen = set()
    me = threading.get_ident()
    deadline = time.monotonic() + 120  # epochs until the thread has gathered a batch (a cap ends a hang)
    while True:
        for b in loader:
            seen.add(b["obs"].__array_interface__["data"][0])
            time.sleep(0.001)
        assert len(seen) == 3  # prefetch + 1 buffers, whoever gathered
        if any(t != me for t in ds.threads) or time.monotonic() > deadline:
            break
    assert any(t != me for t in ds.threads)


def test_mmap_views_are_identical_with_a_slow_consumer(tmp_path, layout):
    spec, cols = make_data(CARTPOLE, 500)
    ds = make_dataset("mmap", layout, cols, tmp_path, spec)
    for prefetch in (0, 1, 3):
        loader = tfdata.DataLoader(ds, 16, prefetch=prefetch)
        got = _consume(loader, PATTERNS["bursts"])
        assert [i[0] for i, _ in got] == list(range(0, 500, 16))
        for (idx, fields) in got:
            for f, v in cols.items():
                np.testing.assert_array_equal(fields[f], v[idx])


def test_spin_kernel_against_reference_and_sees_another_threads_store():
    from tfdata.kernels._loader import wait_change

    state = np.array([5, 9], np.int64)
    for i, value, spins in [(0, 5, 100), (1, 5, 100), (1, 9, 0), (0, 4, 1)]:
        assert wait_change(state, i, value, spins) == naive.wait_change_naive(state, i, value, spins)

    # the store comes while the kernel spins: the storing thread needs the GIL, which this thread
    # keeps (a long switch interval) from the moment it says it calls until the nogil kernel runs
    calling = []

    def later():
        while not calling:
            time.sleep(0.001)
        state[0] = 6

    old = sys.getswitchinterval()
    t = threading.Thread(target=later)
    t.start()
    sys.setswitchinterval(1.0)
    try:
        calling.append(True)
        # a load hoisted out of the loop would spin on the stale value for all 10**11 reads
        # (minutes) and return 5
        got = wait_change(state, 0, 5, 10**11)
    finally:
        sys.setswitchinterval(old)
    t.join(60)
    assert got == 6


def test_a_new_epoch_stops_the_previous_one_loudly():
    spec, cols = make_data(CARTPOLE, 100)
    loader = tfdata.DataLoader(tfdata.ArrayDataset(cols), 10, shuffle=True, seed=0)
    a = iter(loader)
    next(a)
    b = iter(loader)
    with pytest.raises(RuntimeError, match="epoch 0 was stopped after 1 of 10"):
        next(a)
    assert len(list(b)) == 10
    assert len(_prefetch_threads()) == 0


class Ticked(Flaky):
    """A dataset whose every gather waits until the event loop has ticked during it (at most
    60 s: a gather that blocks the loop fails, it does not hang)."""

    def __init__(self, cols):
        super().__init__(cols)
        self.tick = threading.Event()
        self.gathers = 0

    def gather(self, idx, out):
        self.tick.clear()
        if not self.tick.wait(60):
            raise RuntimeError("the event loop did not run while a batch was gathered")
        self.gathers += 1
        self.inner.gather(idx, out)


@pytest.mark.parametrize("prefetch", [0, 2])
def test_async_iteration_yields_the_same_batches_without_blocking_the_loop(prefetch):
    spec, cols = make_data(CARTPOLE, 60)
    sync = [i.tolist() for i, _ in collect(tfdata.DataLoader(tfdata.ArrayDataset(cols), 10, shuffle=True, seed=1))]
    ds = Ticked(cols)
    loader = tfdata.DataLoader(ds, 10, shuffle=True, seed=1, prefetch=prefetch)

    async def main():
        done = False

        async def ticker():
            while not done:
                ds.tick.set()
                await asyncio.sleep(0.001)

        task = asyncio.create_task(ticker())
        got = []
        try:
            async for b in loader:
                got.append(b.indices.tolist())
        finally:
            done = True
            await task
        return got

    assert asyncio.run(main()) == sync
    assert ds.gathers == 6  # each gather waited for a tick of the loop: it kept running meanwhile


# -- streaming beyond memory --------------------------------------------------------------------------


def _rss():
    import psutil

    return psutil.Process().memory_info().rss


@pytest.mark.parametrize("mode,block_rows,window_blocks", [(False, None, 1), ("block", 1024, 8), ("block", 64, 256),
                                                          (True, None, 1)],
                         ids=["sequential", "block-1MiB", "block-64KiB", "full"])
def test_streaming_a_file_larger_than_the_bound_keeps_rss_bounded(tmp_path, mode, block_rows, window_blocks):
    # a 192 MiB file read with a 16 MiB resident target; RSS may grow by at most 48 MiB
    rows = 192 * 1024  # 1 KiB rows
    spec = tfdata.Spec({"x": ("u1", (1016,)), "i": "i8"})
    path = str(tmp_path / "big.npy")
    cols = tfdata.io.create(path, spec, rows)
    for s in range(0, rows, 8192):
        cols["i"][s:s + 8192] = np.arange(s, min(s + 8192, rows))
        cols["x"][s:s + 8192] = 7
    cols["x"].flush()
    del cols
    gc.collect()
    # compile every kernel first: numba's compiler memory is not what this test is about
    tfdata.io.save(str(tmp_path / "small.npy"), {"x": np.zeros((600, 1016), "u1"), "i": np.arange(600)})
    for _ in tfdata.DataLoader(tfdata.MmapDataset.open(str(tmp_path / "small.npy")), 256, shuffle=mode,
                               prefetch=2, block_rows=50, window_blocks=2, resident_bytes=4096):
        pass
    ds = tfdata.MmapDataset.open(path)
    loader = tfdata.DataLoader(ds, 256, shuffle=mode, seed=0, prefetch=2, resident_bytes=16 << 20,
                               block_rows=block_rows, window_blocks=window_blocks)
    base = _rss()
    peak = 0
    total = 0
    for b in loader:
        total += int(b["x"][:, ::512].sum(dtype=np.int64))  # read every page of the batch
        np.testing.assert_array_equal(b["i"], b.indices)
        peak = max(peak, _rss() - base)
    assert total == rows * 2 * 7
    assert peak < 48 << 20, f"RSS grew by {peak / 2**20:.0f} MiB reading a 192 MiB file"


@pytest.mark.parametrize("mode", [True, "block", False], ids=["full", "block", "copied"])
def test_steady_state_iteration_allocates_nothing(layout, mode):
    import tracemalloc

    spec, cols = make_data(CARTPOLE, 100_000)
    ds = make_dataset("array", layout, cols, spec=spec)
    loader = tfdata.DataLoader(ds, 256, shuffle=mode, seed=0, prefetch=0, zero_copy=False, block_rows=100,
                               window_blocks=64)
    it = iter(loader)
    for _ in range(5):  # warm: compile, first window
        next(it)
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        for _ in range(300):
            next(it)
        current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # one batch is 256 x 48 bytes = 12 KiB: a per-batch array would blow these bounds
    assert current - base < 1024, current - base
    assert peak - base < 4096, peak - base


def test_empty_datasets_yield_nothing(tmp_path, layout):
    spec, cols = make_data(CARTPOLE, 0)
    for ds in (make_dataset("array", layout, cols, spec=spec), make_dataset("mmap", layout, cols, tmp_path, spec)):
        assert len(ds) == 0
        for mode in MODES:
            loader = tfdata.DataLoader(ds, 4, shuffle=mode, seed=0)
            assert len(loader) == 0 and list(loader) == []
        with pytest.raises(ValueError, match="0 rows, fewer than one batch of 4"):
            tfdata.DataLoader(ds, 4, drop_last=True)


def test_config_object_and_keywords():
    spec, cols = make_data(CARTPOLE, 20)
    ds = tfdata.ArrayDataset(cols)
    cfg = tfdata.LoaderConfig(batch_size=6, shuffle="block", seed=3, block_rows=4, window_blocks=2)
    a = tfdata.DataLoader(ds, config=cfg)
    b = tfdata.DataLoader(ds, 6, shuffle="block", seed=3, block_rows=4, window_blocks=2)
    assert [x.tolist() for x, _ in collect(a)] == [x.tolist() for x, _ in collect(b)]
    with pytest.raises(TypeError, match="either config"):
        tfdata.DataLoader(ds, 6, config=cfg)
    with pytest.raises(TypeError, match="batch_size"):
        tfdata.DataLoader(ds)
    with pytest.raises(TypeError, match="no 'gather'"):
        tfdata.DataLoader(object(), 4)
