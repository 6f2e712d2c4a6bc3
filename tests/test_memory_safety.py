"""No input reaches memory it should not: priorities, request sizes, batches kept too long.

* Priorities whose leaf ``(p + eps) ** alpha`` underflows to 0 or whose sum overflows are
  refused (checked against ``naive.leaf_ok``, computed directly); the sampling kernel never
  returns a slot outside the live rows, whatever the trees hold (``naive.stratified_slots``).
* A request larger than the data is refused before anything is allocated; the loader's
  memory is bounded by the dataset's rows.
* A batch kept after its ring slot was reused raises ``StaleBatchError`` instead of showing
  (or updating the priorities of) another batch's rows.
"""

from __future__ import annotations

import re
import tracemalloc

import numpy as np
import pytest

import tfdata
from tfdata import PrioritizedReplayBuffer, ReplayBuffer
from tfdata import kernels

from . import naive
from .conftest import CARTPOLE, random_rows

X = {"x": "i8"}
FMAX = float(np.finfo(np.float64).max)


def filled(cls=PrioritizedReplayBuffer, n=100, capacity=100, **kw):
    buf = cls(X, capacity, seed=0, **kw)
    buf.extend({"x": np.arange(n)})
    return buf


def leaves_count(capacity: int) -> int:
    return 1 << max(0, (capacity - 1).bit_length())


# -- 8. priorities: underflow, overflow, and the kernel's last line -----------------------------
@pytest.mark.parametrize("alpha, p, what", [
    (60.0, 1e-7, "underflow"),   # (1.1e-6) ** 60 = 1e-357: every leaf 0, the root 0
    (1.0, 1e308, "overflow"),    # 100 leaves of 1e308: the root is inf
    (1.0, FMAX, "overflow"),
    (400.0, 10.0, "overflow"),   # one leaf alone is inf
])
def test_priorities_whose_leaves_or_sum_are_not_finite_and_positive_are_refused(alpha, p, what, layout):
    buf = filled(alpha=alpha, layout=layout)
    before = buf.priorities()
    state = buf.state_dict()
    v = re.escape(repr(p))
    with pytest.raises(ValueError, match=rf"update_priorities: priority {v} at position 0 gives the leaf"):
        buf.update_priorities(np.arange(100), np.full(100, p))
    np.testing.assert_array_equal(buf.priorities(), before)
    with pytest.raises(ValueError, match=rf"push: priority {v} at position 0"):
        buf.push({"x": 7}, priority=p)
    with pytest.raises(ValueError, match=rf"extend: priority {v} at position 1"):
        buf.extend({"x": np.arange(3)}, priorities=[1.0, p, 1.0])
    assert buf.state_dict()["writer"] == state["writer"]
    np.testing.assert_array_equal(buf.priorities(), before)
    # what the issue saw: slots beyond len, heap bytes, infinite weights
    s = buf.sample(4)
    assert s.indices.min() >= 0 and s.indices.max() < len(buf)
    np.testing.assert_array_equal(s["x"], s.indices)
    assert np.isfinite(s.weights).all() and (s.weights <= 1).all()


@pytest.mark.parametrize("alpha, eps, capacity", [
    (0.6, 1e-6, 100), (60.0, 1e-6, 100), (1.0, 1e-6, 7), (1.0, 1e-300, 1 << 20), (0.0, 1e-6, 5),
    (3.5, 0.5, 33), (250.0, 1e-3, 2), (1e-9, 1e-6, 9),
])
def test_accepted_priorities_are_exactly_those_with_good_leaves(alpha, eps, capacity):
    """``priority_range`` and the kernel's check against leaves computed directly."""
    buf = PrioritizedReplayBuffer(X, capacity, alpha=alpha, eps=eps, seed=0)
    leaves = leaves_count(capacity)
    low, high = buf.priority_range
    assert naive.leaf_ok(low, eps, alpha, leaves) and naive.leaf_ok(high, eps, alpha, leaves)
    if low > 0:  # the first accepted priority: the one just below is refused
        assert not naive.leaf_ok(np.nextafter(low, 0.0), eps, alpha, leaves)
    if high < FMAX:
        assert not naive.leaf_ok(np.nextafter(high, np.inf), eps, alpha, leaves)
    rng = np.random.default_rng(capacity)
    values = np.concatenate([
        [0.0, -0.0, -1e-300, np.nan, np.inf, -np.inf, FMAX, 1.0, low, high,
         np.nextafter(low, -1.0), np.nextafter(high, np.inf) if high < FMAX else np.inf, 1e-7, 1e308],
        10.0 ** rng.uniform(-320, 308, 400), rng.random(100),
    ])
    for v in values:  # one priority at a time: the kernel's verdict is the reference's
        arr = np.array([1.0 if naive.leaf_ok(1.0, eps, alpha, leaves) else low, v])
        got = kernels.first_bad_priority(arr, low, high)
        assert got == naive.first_bad_priority(arr, eps, alpha, leaves), v
    rng.shuffle(values)
    assert kernels.first_bad_priority(values, low, high) == naive.first_bad_priority(values, eps, alpha, leaves)


def test_a_buffer_where_no_priority_is_valid_is_refused():
    with pytest.raises(ValueError, match=r"alpha=1000.0, eps=10.0: no priority p gives a leaf"):
        PrioritizedReplayBuffer(X, 8, alpha=1000.0, eps=10.0)  # eps ** alpha alone is inf


def corrupt_trees(capacity, leaves):
    """The kernels' tree of ``leaves`` (sums, min/max, float32 leaves), whatever they hold."""
    return naive.block_tree(np.asarray(leaves, np.float64), naive.tree_leaves(capacity))


@pytest.mark.parametrize("layout", ["aos", "soa"])
@pytest.mark.parametrize("case", ["mass_past_n", "all_past_n", "nan_leaf", "inf_root", "zero_root",
                                  "nan_root", "n_past_capacity"])
def test_the_sampling_kernel_never_leaves_the_live_rows(layout, case):
    """Whatever the trees hold, every slot drawn is in [0, n) (the reference clamps the same
    way), or nothing is drawn at all when the root is not finite and positive."""
    cap, n = 8, 5
    buf = ReplayBuffer(X, cap, layout=layout, seed=0)  # its storage and kernels
    buf.extend({"x": np.arange(cap) * 10})
    leaves = np.array([1.0, 2.0, 1.0, 3.0, 1.0, 0.0, 0.0, 0.0])
    if case == "mass_past_n":  # slots 5..7 hold mass though only 5 rows are live
        leaves[5:] = [4.0, 8.0, 16.0]
    elif case == "all_past_n":
        leaves[:] = [0, 0, 0, 0, 0, 1.0, 1.0, 1.0]
    elif case == "nan_leaf":
        leaves[2] = np.nan
    elif case == "inf_root":
        leaves[:5] = FMAX
    elif case == "zero_root":
        leaves[:] = 0.0
    elif case == "nan_root":
        leaves[0] = np.inf
        leaves[1] = -np.inf
    elif case == "n_past_capacity":
        n = 10 ** 6  # more rows than the storage holds: the storage's rows bound the draw
    with np.errstate(over="ignore", invalid="ignore"):  # the corrupt sums the test is about
        tree = corrupt_trees(cap, leaves)
        leaves = naive.leaf32(leaves).astype(np.float64)  # what the tree holds
    version = np.arange(cap, dtype=np.uint8)
    state = np.array([naive.key_of(3), 0], np.uint64)
    batch = 16
    idx = np.full(batch, -7, np.int64)
    u, w = np.zeros(batch), np.zeros(batch, np.float32)
    vers = np.zeros(batch, np.uint32)
    out = buf.storage.new_output(batch)
    k = buf.storage.kernels.sample_prioritized
    ret = k(buf.storage.kernel_store, n, *tree, version, cap, state, 0.5, idx, u, w, vers,
            out.kernel_out)
    with np.errstate(over="ignore", invalid="ignore"):
        ref = naive.stratified_slots(naive.key_of(3), 0, leaves, batch, min(n, cap))
    if ref is None:
        assert ret == -1
        assert (idx == -7).all() and state[1] == 0  # nothing drawn, nothing written
        return
    assert ret == 0
    np.testing.assert_array_equal(idx, ref[0])
    assert idx.min() >= 0 and idx.max() < min(n, cap)
    np.testing.assert_array_equal(out.fields["x"][:batch], idx * 10)
    np.testing.assert_array_equal(vers, idx.astype(np.uint32))


def test_the_tree_kernels_skip_slots_outside_the_tree():
    """Slots and spans past the tree are dropped: the tree's arrays and versions are views in
    the middle of larger arrays, and the guard zones around them must stay untouched (the old
    kernels wrote there, and into the tree's inner nodes for negative slots)."""
    size = 32  # two blocks of 16 leaves
    nb = size // naive.BLOCK

    def guarded(n, fill, dtype, width=None):
        shape = (3 * n,) if width is None else (3 * n, width)
        a = np.full(shape, fill, dtype)
        return a, a[n:2 * n]

    gs, s = guarded(2 * nb, 0.0, np.float64)
    gmm, mm = guarded(2 * nb, 0.0, np.float32, 2)
    mm[:, 0] = np.inf
    glv, lv = guarded(size, 0.0, np.float32)
    gv, version = guarded(size, 0, np.uint8)
    kernels.tree_set(s, mm, lv, np.array([-1, 3, 32, 33]), np.array([5.0, 2.0, 7.0, 9.0]))
    # a slot outside the tree at each place of a group of four blocks, and in the tail after one
    for bad in (-1, 32, 47):
        for at in range(5):
            slots = np.full(5, 3)
            slots[at] = bad
            kernels.tree_set(s, mm, lv, slots, np.full(5, 2.0))
    kernels.tree_fill(s, mm, lv, 30, 10, 1.0)
    kernels.tree_fill(s, mm, lv, -4, 5, 0.5)
    kernels.tree_fill_values(s, mm, lv, 31, np.array([3.0, 3.0, 3.0]))
    kernels.tree_fill_values(s, mm, lv, -2, np.array([3.0, 3.0]))
    kernels.tree_overwrite_max(s, mm, lv, version, size)
    kernels.tree_overwrite_max(s, mm, lv, version, -1)
    for g, n, fill in ((gs, 2 * nb, 0.0), (gmm, 2 * nb, 0.0), (glv, size, 0.0), (gv, size, 0)):
        assert (g[:n] == fill).all() and (g[2 * n:] == fill).all()
    assert not version.any()
    leaves = np.zeros(size)
    leaves[0], leaves[3], leaves[30], leaves[31] = 0.5, 2.0, 1.0, 3.0
    for got, want in zip((s, mm, lv), naive.block_tree(leaves, size)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("start, count", [(16, 48), (0, 64), (8, 56), (33, 31), (0, 40), (20, 1)])
def test_tree_fills_write_only_the_blocks_of_their_range(start, count):
    """The fills recompute blocks four at a time: whatever the number of blocks in the range
    and where it ends, no block past it (and nothing past the tree's arrays) is written."""
    size = 64
    nb = size // naive.BLOCK
    pad = 5
    gs = np.full(2 * nb + 2 * pad, -7.0)
    gmm = np.full((2 * nb + 2 * pad, 2), -7.0, np.float32)
    glv = np.full(size + 2 * naive.BLOCK, 9.0, np.float32)  # a whole poisoned block each side
    s, mm, lv = gs[pad:-pad], gmm[pad:-pad], glv[naive.BLOCK:-naive.BLOCK]
    leaves = np.random.default_rng(start).random(size) + 0.5
    for got, want in zip((s, mm, lv), naive.block_tree(leaves, size)):
        got[...] = want
    values = np.arange(1.0, count + 1.0)
    for fill in ("fill", "values"):
        if fill == "fill":
            kernels.tree_fill(s, mm, lv, start, count, 2.0)
            leaves[start:start + count] = 2.0
        else:
            kernels.tree_fill_values(s, mm, lv, start, values)
            leaves[start:start + count] = values
        for got, want in zip((s, mm, lv), naive.block_tree(leaves, size)):
            np.testing.assert_array_equal(got, want)
        assert (gs[:pad] == -7.0).all() and (gs[-pad:] == -7.0).all()
        assert (gmm[:pad] == -7.0).all() and (gmm[-pad:] == -7.0).all()
        assert (glv[:naive.BLOCK] == 9.0).all() and (glv[-naive.BLOCK:] == 9.0).all()


@pytest.mark.parametrize("bad", [-1, -16, -17, 256, 271, 2 ** 40])
def test_tree_set_skips_a_slot_outside_the_tree_wherever_it_is_in_the_batch(bad):
    """The update recomputes blocks four at a time: a slot outside the tree at any place of a
    group of four, or in the tail, is skipped, and no node of the tree (an inner one for a
    negative slot, or past the arrays) is written from it."""
    size = 256
    rng = np.random.default_rng(3)
    leaves = rng.random(size) + 0.5
    s, mm, lv = (a.copy() for a in naive.block_tree(leaves, size))
    for at in range(6):
        slots = rng.integers(0, 16, 6)  # all in block 0: the other blocks' ancestors are left alone
        slots[at] = bad
        values = rng.random(6) + 0.5
        kernels.tree_set(s, mm, lv, slots, values)
        keep = slots != bad
        leaves[slots[keep]] = values[keep]
    for got, want in zip((s, mm, lv), naive.block_tree(leaves, size)):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("bad", ["overflowing_sum", "inf", "zero", "nan", "huge_leaf"])
def test_a_state_whose_leaves_or_their_sum_are_not_finite_and_positive_is_refused(bad):
    buf = filled(alpha=1.0)
    state = buf.state_dict()
    leaves = state["prioritized"]["leaves"]
    if bad == "overflowing_sum":  # each leaf finite, their sum inf
        leaves[:] = 1e308
    elif bad == "inf":
        leaves[3] = np.inf
    elif bad == "zero":
        leaves[3] = 0.0
    elif bad == "nan":
        leaves[3] = np.nan
    else:  # one leaf alone above the largest float32
        leaves[3] = FMAX / 4
    fresh = PrioritizedReplayBuffer(X, 100, alpha=1.0, seed=1)
    fresh.extend({"x": np.arange(5)})
    with pytest.raises(ValueError, match="state priorities: leaf"):
        fresh.load_state_dict(state)
    assert len(fresh) == 5
    s = fresh.sample(5)
    assert s.indices.max() < 5


# -- 9. check, then allocate ---------------------------------------------------------------
def traced(fn):
    """(exception raised, bytes still held after, peak) of ``fn()``, by tracemalloc."""
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        exc = None
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - returned to the test
            exc = e
        current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return exc, current - base, peak - base


@pytest.mark.parametrize("cls", [ReplayBuffer, PrioritizedReplayBuffer])
def test_a_refused_sample_allocates_nothing(cls, layout):
    buf = cls(X, 100, layout=layout, seed=0)
    buf.extend({"x": np.arange(10)})
    buf.sample(2)  # compile and warm
    rings = buf.nbytes_parts["output_rings"]
    exc, held, peak = traced(lambda: buf.sample(10 ** 6))
    assert isinstance(exc, ValueError) and "larger than the 10 rows held" in str(exc)
    assert buf.nbytes_parts["output_rings"] == rings
    assert held < 4096 and peak < 1 << 16  # the old ring of 10**6 rows: 32 MB and more
    # the ring of an accepted size is built on its first sample, and counted
    buf.sample(10)
    assert buf.nbytes_parts["output_rings"] > rings


def test_refused_slice_sizes_allocate_nothing(layout):
    from .test_episodes import VEC, Streams

    buf = ReplayBuffer(VEC, 40, layout=layout, seed=0)
    buf.extend(Streams(VEC, 1, np.random.default_rng(0)).steps(10))
    buf.sample_sequences(2, 2)  # compile and warm
    rings = buf.nbytes_parts["output_rings"]
    for args, match in [((10 ** 5, 2), "batch_size 100000 is larger than the 10 rows held"),
                        ((1, 10 ** 6), "length 1000000 is longer than any slice can be.*40 steps"),
                        ((2, 11, "reject"), "no slice of length 11 exists")]:
        exc, held, peak = traced(lambda: buf.sample_sequences(*args[:2], policy=(args[2:] or ("mask",))[0]))
        assert isinstance(exc, ValueError) and re.search(match, str(exc)), exc
        assert held < 4096 and peak < 1 << 16
    assert buf.nbytes_parts["output_rings"] == rings
    empty = ReplayBuffer(VEC, 40, layout=layout)
    exc, held, _ = traced(lambda: empty.sample_sequences(10 ** 5, 3))
    assert isinstance(exc, ValueError) and "empty" in str(exc) and held < 4096
    assert empty.nbytes_parts["output_rings"] == 0


@pytest.mark.parametrize("shuffle", [False, True, "block"])
def test_loader_memory_is_bounded_by_the_data(shuffle):
    ds = tfdata.ArrayDataset({"x": np.arange(1000)})
    big = 10 ** 6  # the 5e7 took 762 MiB; the old ring here would be 3 x 10**6 rows
    loader = tfdata.DataLoader(ds, big, shuffle=shuffle, seed=0, prefetch=2, zero_copy=False)
    per_row = ds.row_nbytes + 8
    assert loader.nbytes_parts["output_ring"] <= 2 * 1000 * per_row  # one batch: one slot + 1
    assert loader.nbytes_parts["indices"] <= 3 * 1000 * 8
    batches = list(loader)
    assert len(batches) == 1 and sorted(batches[0]["x"].tolist()) == list(range(1000))
    np.testing.assert_array_equal(batches[0]["x"], batches[0].indices)
    with pytest.raises(ValueError, match="drop_last=True: the dataset has 1000 rows"):
        tfdata.DataLoader(ds, big, shuffle=shuffle, drop_last=True)
    # prefetch beyond the batches of an epoch takes no slot
    deep = tfdata.DataLoader(ds, 100, shuffle=shuffle, seed=0, prefetch=1000, zero_copy=False)
    assert deep.nbytes_parts["output_ring"] == 11 * 100 * per_row
    got = np.concatenate([b["x"].copy() for b in deep])
    want = np.concatenate(naive.loader_order(1000, 100, {False: "none", True: "full"}.get(shuffle, "block"),
                                             0, 0, False, deep.config.block_rows or getattr(deep, "block_rows", 1),
                                             deep.config.window_blocks))
    np.testing.assert_array_equal(got, want)


def test_shared_refused_sample_allocates_nothing(tmp_path, monkeypatch):
    from tfdata.shared import SharedReplayBuffer, SharedWriter

    monkeypatch.setenv("TFDATA_SHM_DIR", str(tmp_path))
    with SharedReplayBuffer(X, 64, seed=0) as buf, SharedWriter(buf.name, 0) as w:
        w.extend({"x": np.arange(10)})
        buf.sample(2)
        exc, held, peak = traced(lambda: buf.sample(10 ** 6))
        assert isinstance(exc, ValueError) and "larger than the 10 rows held" in str(exc)
        assert held < 4096 and peak < 1 << 16


# -- 10. a batch kept past its lifetime ---------------------------------------------------
def test_a_kept_batch_goes_stale_instead_of_changing(layout):
    buf = ReplayBuffer(CARTPOLE, 50, layout=layout, seed=3, ring_size=2)
    buf.extend(random_rows(buf.spec, 50, np.random.default_rng(0)))
    b1 = buf.sample(8)
    want = b1.copy()
    b2 = buf.sample(8)
    assert np.array_equal(b1["obs"], want["obs"]) and np.array_equal(b1.indices, want.indices)
    buf.sample(8)  # reuses b1's slot
    for access in (lambda b: b["obs"], lambda b: b.indices, lambda b: b.weights, lambda b: b.versions,
                   lambda b: b.discounts, lambda b: b.mask, lambda b: list(b), lambda b: dict(b),
                   lambda b: len(b), lambda b: "obs" in b, lambda b: b.copy(), lambda b: b.get("obs"),
                   lambda b: b == want):
        with pytest.raises(tfdata.StaleBatchError, match="stale.*copy=True"):
            access(b1)
    assert "stale" in repr(b1)
    assert isinstance(b1, tfdata.Batch) and isinstance(tfdata.StaleBatchError(), ValueError)
    np.testing.assert_array_equal(b2.indices, b2.copy().indices)  # b2 is still valid
    # copies never go stale
    kept = buf.sample(8, copy=True)
    for _ in range(5):
        buf.sample(8)
    assert np.array_equal(kept["obs"], kept.copy()["obs"])
    np.testing.assert_array_equal(want.indices, want.copy().indices)


def test_update_priorities_with_a_stale_batch_is_refused(layout):
    """The issue's case: the versions were overwritten with the rows, so only the batch's own
    staleness can tell that ``old`` no longer holds the rows trained on."""
    buf = filled(layout=layout, alpha=1.0, ring_size=2)
    old = buf.sample(16)
    for _ in range(2):
        buf.sample(16)
    before = buf.priorities()
    with pytest.raises(tfdata.StaleBatchError):
        buf.update_priorities(old, np.full(16, 50.0))
    np.testing.assert_array_equal(buf.priorities(), before)
    fresh = buf.sample(16)  # a valid batch still updates
    buf.update_priorities(fresh, np.full(16, 50.0))
    assert (buf.priorities()[fresh.indices] == np.float32(50.0 + buf.eps)).all()  # float32 leaves


def test_sequence_batches_go_stale(layout):
    from .test_episodes import VEC, Streams

    buf = ReplayBuffer(VEC, 40, layout=layout, seed=0, ring_size=1)
    buf.extend(Streams(VEC, 1, np.random.default_rng(0)).steps(30))
    a = buf.sample_sequences(3, 4)
    mask = a.mask.copy()
    b = buf.sample_sequences(3, 4)
    with pytest.raises(tfdata.StaleBatchError):
        a.mask
    assert b.mask.shape == mask.shape


def test_a_batch_held_by_another_thread_goes_stale(layout):
    import threading

    buf = filled(ReplayBuffer, layout=layout)
    box = []
    t = threading.Thread(target=lambda: box.append(buf.sample(4)))
    t.start()
    t.join(60)  # a deadline for a hang only
    assert box, "the other thread did not sample"
    mine = buf.sample(4)  # this thread's ring: the other thread's batch is unaffected
    np.testing.assert_array_equal(box[0]["x"], box[0].indices)
    kept = [mine]
    buf.sample(4)
    buf.sample(4)
    with pytest.raises(tfdata.StaleBatchError):
        kept[0]["x"]


def test_shared_batches_go_stale(tmp_path, monkeypatch):
    from tfdata.shared import SharedReplayBuffer, SharedWriter

    monkeypatch.setenv("TFDATA_SHM_DIR", str(tmp_path))
    with SharedReplayBuffer(X, 64, seed=0, ring_size=2) as buf, SharedWriter(buf.name, 0) as w:
        w.extend({"x": np.arange(20)})
        old = buf.sample(4)
        buf.sample(4)
        buf.sample(4)
        with pytest.raises(tfdata.StaleBatchError):
            old["x"]
    with SharedReplayBuffer(X, 64, mode="fifo", ring_size=1) as buf, SharedWriter(buf.name, 0) as w:
        w.extend({"x": np.arange(20)})
        first = buf.get_batch(4)
        assert first["x"].tolist() == [0, 1, 2, 3]
        second = buf.get_batch(4)
        assert second["x"].tolist() == [4, 5, 6, 7]
        with pytest.raises(tfdata.StaleBatchError):
            first["x"]
        with pytest.raises(tfdata.StaleBatchError):
            first.metrics
