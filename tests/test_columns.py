"""Column operations: the column kernels against their references, running statistics against
numpy over the live rows, column views, relabelling (update_field), state and checkpoints.

Tolerance. The statistics are float64 sums in an order fixed by the kernels (lanes, then Chan
merges up a tree), so they are compared with exactly rounded references (``math.fsum``, two
passes) at ``rtol=1e-10`` (mean, var, std; ``atol`` 1e-10 times the values' scale, for means
near 0); min and max exactly. Layouts and the tree against a fresh build are compared bit for
bit.
"""

from __future__ import annotations

import numpy as np
import pytest

import tfdata
from tfdata import FormatError, PrioritizedReplayBuffer, ReplayBuffer, Spec, SpecError
from tfdata.kernels import _columns as kc
from tfdata.replay.columns import FieldStats

from . import naive
from .conftest import CARTPOLE, LAYOUTS, ODD, random_rows

ODD_SPEC = Spec(ODD)
CART = Spec(CARTPOLE)
# column groups: reward inside a record group (a strided column), obs inside another, next_obs
# and the flags columns of their own
CART_GROUPS = (("obs", "action"), ("reward", "terminated"))
ODD_GROUPS = (("a", "c", "e"), ("b", "f"))
CART_LAYOUTS = [*LAYOUTS, CART_GROUPS]


def close(got, want, what=""):
    """Statistics ``out`` (5, k) against a reference: mean/var/std to 1e-10, min/max exact."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = np.nanmax(np.abs(want[3:5]), initial=1.0, where=np.isfinite(want[3:5]))
    np.testing.assert_allclose(got[:3], want[:3], rtol=1e-10, atol=1e-10 * scale, equal_nan=True,
                               err_msg=what)
    np.testing.assert_array_equal(got[3:], want[3:], err_msg=what)


def records(spec: Spec, rows: dict) -> np.recarray:
    """``rows`` as AoS records of ``spec`` (the storage's strided form of every field)."""
    rec = np.zeros(len(next(iter(rows.values()))), spec.aos_dtype)
    for name, v in rows.items():
        rec[name] = v
    return rec


def call(kernel, x, *rest):
    """Column kernel ``kernel`` on the operand ``x`` (``kc.operand``'s pair) as the buffers call
    it: through ``kernels.strided``, ``x`` typed as a strided array."""
    args = (*x, *rest)
    return kc.strided(kernel, args, kc.STRIDED)(*args)


def scan(view2d, n=None):
    k = view2d.shape[1]
    lanes = np.zeros((kc.LANE_ROWS, kc.lane_count(k)))
    cnt, vals, out = np.zeros(2, np.int64), np.zeros((2, 4, k)), np.zeros((5, k))
    ranges = np.array([[0, view2d.shape[0] if n is None else n]], np.int64)
    got = call(kc.column_scan_ranges, kc.operand(view2d), k, ranges, kc.SCAN_CHUNK, lanes, cnt, vals, out)
    return got, out


def both_forms(spec: Spec, rows: dict, name: str):
    """Field ``name`` of ``rows`` as a contiguous column and as a strided field of records."""
    f = spec[name]
    k = int(np.prod(f.shape, dtype=np.int64))
    col = np.ascontiguousarray(rows[name]).reshape(len(rows[name]), k)
    rec = records(spec, rows)
    if len(rec) == 0:
        return col, np.zeros((0, k), f.dtype)[:, :]
    strided = np.ndarray((len(rec), k), f.dtype, rec, spec.aos_dtype.fields[name][1],
                         (spec.aos_dtype.itemsize, f.dtype.itemsize))
    assert not strided.flags.c_contiguous or len(rec) <= 1
    return col, strided


# -- kernels against the references -----------------------------------------------------------
@pytest.mark.parametrize("n", [0, 1, 7, 33, 255, 257, 1000, 4100])
@pytest.mark.parametrize("spec", [ODD_SPEC, CART], ids=["odd", "cartpole"])
def test_column_scan_matches_reference_in_both_forms(spec, n):
    rng = np.random.default_rng(n)
    rows = random_rows(spec, n, rng)
    for f in spec:
        col, strided = both_forms(spec, rows, f.name)
        want_n, want = naive.column_stats_naive(rows[f.name])
        got = []
        for x in (col, strided):
            count, out = scan(x)
            assert count == want_n == n, f.name
            close(out, want, f"{f.name} {x.flags.c_contiguous}")
            got.append(out)
        np.testing.assert_array_equal(got[0], got[1], err_msg=f"{f.name}: forms differ")


def test_column_scan_chunks_and_offsets_are_accurate():
    """A large common offset, the first value an outlier, chunks of SCAN_CHUNK rows merged."""
    rng = np.random.default_rng(1)
    x = 1e6 + rng.standard_normal((3 * kc.SCAN_CHUNK + 17, 2))
    x[0] = [1e6 + 1e4, 1e6 - 1e4]
    count, out = scan(x)
    _, want = naive.column_stats_naive(x)
    close(out, want)


def scan_ranges(view2d, ranges):
    k = view2d.shape[1]
    lanes = np.zeros((kc.LANE_ROWS, kc.lane_count(k)))
    cnt, vals, out = np.zeros(2, np.int64), np.zeros((2, 4, k)), np.zeros((5, k))
    got = call(kc.column_scan_ranges, kc.operand(view2d), k,
               np.asarray(ranges, np.int64).reshape(-1, 2), kc.SCAN_CHUNK, lanes, cnt, vals, out)
    return got, out


@pytest.mark.parametrize("spec", [ODD_SPEC, CART], ids=["odd", "cartpole"])
def test_column_scan_ranges_matches_reference_in_both_forms(spec):
    """Rows of several ranges (empty ones, ones past the rows: clamped) against the reference
    over the same rows; ``[[0, n]]`` is the whole column's pass bit for bit."""
    rng = np.random.default_rng(5)
    n = 3 * kc.SCAN_CHUNK // 2
    rows = random_rows(spec, n, rng)
    cases = [[[0, n]], [[5, 5]], [[0, 10], [40, 41], [300, 2000]], [[n - 7, n + 50], [-3, 4]],
             [[100, 90], [17, 18000]], np.zeros((0, 2))]
    for ranges in cases:
        sel = np.concatenate([np.arange(max(0, min(a, n)), max(0, min(b, n)))
                              for a, b in np.asarray(ranges, np.int64).reshape(-1, 2)] + [[]]).astype(int)
        for f in spec:
            col, strided = both_forms(spec, rows, f.name)
            want_n, want = naive.column_stats_naive(rows[f.name][sel])
            got = [scan_ranges(x, ranges) for x in (col, strided)]
            for count, out in got:
                assert count == want_n == len(sel), (f.name, ranges)
                close(out, want, f"{f.name} {ranges}")
            np.testing.assert_array_equal(got[0][1], got[1][1], err_msg=f"{f.name}: forms differ")
            if len(ranges) == 1 and ranges[0] == [0, n]:
                np.testing.assert_array_equal(got[0][1], scan(col)[1])
    x = np.arange(10.0).reshape(10, 1)
    out = np.zeros((5, 1))
    bad = np.zeros((1, 1), np.int64)  # a range needs two columns
    assert call(kc.column_scan_ranges, kc.operand(x), 1, bad, 7, np.zeros((kc.LANE_ROWS, 32)),
                np.zeros(2, np.int64), np.zeros((2, 4, 1)), out) == -1


@pytest.mark.parametrize("dtype", ["f4", "f8"])
def test_non_finite_values_follow_numpy(dtype):
    x = np.arange(600, dtype=dtype).reshape(100, 6) - 300
    x[10, 0] = np.nan
    x[20, 1], x[30, 1] = np.inf, 5.0
    x[40, 2] = -np.inf
    x[50, 3], x[60, 3] = np.inf, -np.inf
    x[:, 4] = np.inf  # every value
    x[0, 5] = np.inf  # the shift of the first chunk
    spec = Spec({"x": (dtype, (6,)), "pad": "u1"})
    for form in both_forms(spec, {"x": x, "pad": np.zeros(100, np.uint8)}, "x"):
        count, out = scan(form)
        _, want = naive.column_stats_naive(x)
        close(out, want)
        with np.errstate(invalid="ignore"):
            np.testing.assert_array_equal(out[0], x.astype(np.float64).mean(0))
            np.testing.assert_array_equal(out[1], x.astype(np.float64).var(0))
        np.testing.assert_array_equal(out[3], x.min(0))
        np.testing.assert_array_equal(out[4], x.max(0))


def new_tree(k, capacity, block):
    P = kc.tree_leaves(capacity, block)
    return (np.zeros((kc.LANE_ROWS, kc.lane_count(k))), np.zeros(2 * P, np.int64),
            np.zeros((2 * P, 4, k)), np.zeros(2 * P, np.uint8), P)


def fresh(x, k, live, block, capacity):
    lanes, cnt, vals, dirty, P = new_tree(k, capacity, block)
    kc.stats_clear(cnt, vals, dirty)
    assert call(kc.stats_ranges, x, k, live, block, 0, P, 0, 0, lanes, cnt, vals) == 0
    return cnt, vals


def assert_trees_equal(a, b):
    (ca, va), (cb, vb) = a, b
    np.testing.assert_array_equal(ca, cb)
    held = ca > 0  # empty nodes carry no values
    np.testing.assert_array_equal(va[held], vb[held])


@pytest.mark.parametrize("contiguous", [True, False], ids=["flat", "strided"])
def test_tree_updates_equal_a_fresh_build_and_the_reference(contiguous):
    """Random rewrites of rows, then the leaves of the changed blocks recomputed by ranges or by
    dirty flags: every node equals a fresh build bit for bit, and the reference tree."""
    rng = np.random.default_rng(2)
    capacity, k, block = 1000, 3, 64
    rec = np.zeros(capacity, np.dtype([("pad", "u1"), ("x", "f4", (k,))], align=True))
    x2 = rec["x"] if not contiguous else np.zeros((capacity, k), np.float32)
    x = kc.operand(x2)
    assert (x[1].size > 0) == contiguous
    lanes, cnt, vals, dirty, P = new_tree(k, capacity, block)
    kc.stats_clear(cnt, vals, dirty)
    live = cursor = 0
    for step in range(60):
        if rng.random() < 0.5:  # a write at the cursor (may wrap), then the ranges it touched
            start, n = cursor, int(rng.integers(1, 400))
            slots = (start + np.arange(n)) % capacity
            x2[slots] = rng.standard_normal((n, k)).astype(np.float32)
            live, cursor = min(capacity, live + n), (cursor + n) % capacity
            stop = start + n
            ranges = (start // block, min(stop - 1, capacity - 1) // block + 1, 0,
                      (stop - capacity - 1) // block + 1 if stop > capacity else 0)
            assert call(kc.stats_ranges, x, k, live, block, *ranges, lanes, cnt, vals) == 0
        else:  # scattered rewrites, flagged
            slots = rng.choice(max(live, 1), size=min(5, max(live, 1)), replace=False)
            x2[slots] = rng.standard_normal((len(slots), k)).astype(np.float32) * 100
            dirty[P + slots // block] = 1
            assert call(kc.stats_dirty, x, k, live, block, dirty, lanes, cnt, vals) >= 1
            assert not dirty.any()
        assert_trees_equal((cnt, vals), fresh(x, k, live, block, capacity))
    ref_cnt, ref = naive.stats_tree_naive(np.asarray(x2), live, block, P)
    np.testing.assert_array_equal(cnt, ref_cnt)
    for i in range(1, 2 * P):
        if cnt[i]:
            got = vals[i]
            want = np.array([[s[1], s[2], s[3], s[4]] for s in ref[i]]).T
            np.testing.assert_allclose(got[:2], want[:2], rtol=1e-10, atol=1e-9)
            np.testing.assert_array_equal(got[2:], want[2:])
    out = np.zeros((5, k))
    assert kc.stats_summary(cnt, vals, out) == live
    close(out, naive.column_stats_naive(np.asarray(x2)[:live])[1])


def test_merge_of_non_finite_nodes_matches_the_reference():
    rng = np.random.default_rng(3)
    choices = [0.0, 1.5, -2.0, np.inf, -np.inf, np.nan]
    cnt, vals = np.zeros(4, np.int64), np.zeros((4, 4, 1))
    for _ in range(300):
        a = (int(rng.integers(0, 3)), *(float(v) for v in rng.choice(choices, 4)))
        b = (int(rng.integers(0, 3)), *(float(v) for v in rng.choice(choices, 4)))
        for node, s in ((2, a), (3, b)):
            cnt[node] = s[0]
            vals[node, :, 0] = s[1:]
        lanes = np.zeros((kc.LANE_ROWS, 32))
        # stats_ranges over no leaf recomputes nothing; a range over an empty column merges
        # the root from nodes 2 and 3 (live=0 empties leaves 2..3 first, so merge by hand)
        call(kc.stats_dirty, kc.operand(np.zeros((0, 1), np.float32)), 1, 0, 1,
             np.array([0, 1, 0, 0], np.uint8), lanes, cnt, vals)
        want = naive.chan_merge_naive(a, b)
        assert cnt[1] == want[0]
        np.testing.assert_allclose(vals[1, :2, 0], want[1:3], rtol=1e-14, equal_nan=True)
        np.testing.assert_array_equal(vals[1, 2:, 0], np.array(want[3:], np.float64))


def test_kernels_refuse_inconsistent_arrays_and_clamp_ranges():
    values = np.arange(100, dtype=np.float32)
    x = kc.operand(values.reshape(100, 1))
    lanes, cnt, vals, dirty, P = new_tree(1, 100, 16)
    kc.stats_clear(cnt, vals, dirty)
    before = vals.copy()
    # (C-contiguous arrays of the wrong shape: the kernels' checks, not a strided array's type)
    assert call(kc.stats_ranges, x, 1, 100, 16, 0, P, 0, 0, np.zeros((3, 32)), cnt, vals) == -1
    assert call(kc.stats_ranges, x, 2, 100, 16, 0, P, 0, 0, np.zeros((kc.LANE_ROWS, 31)), cnt, vals) == -1
    assert call(kc.stats_ranges, x, 1, 100, 16, 0, P, 0, 0, lanes, cnt[:-1], vals) == -1
    assert call(kc.stats_ranges, x, 1, 100, 16, 0, P, 0, 0, lanes, cnt,
                np.ascontiguousarray(vals[:, :2])) == -1
    assert call(kc.stats_ranges, kc.operand(values.reshape(50, 2)), 3, 100, 16, 0, P, 0, 0, lanes, cnt,
                vals) == -1
    assert call(kc.stats_ranges, (x[0], values[:50]), 1, 100, 16, 0, P, 0, 0, lanes, cnt, vals) == -1
    assert call(kc.stats_dirty, x, 1, 100, 16, dirty[:3], lanes, cnt, vals) == -1
    np.testing.assert_array_equal(vals, before)
    # ranges past the leaves and a live count past the rows are clamped
    assert call(kc.stats_ranges, x, 1, 10**9, 16, -5, 10**9, 3, 10**9, lanes, cnt, vals) == 0
    assert cnt[1] == 100
    out = np.zeros((5, 1))
    whole = np.array([[0, 10**9]], np.int64)
    assert call(kc.column_scan_ranges, x, 1, whole, 7, lanes, cnt[:2], vals[:2], out) == 100
    assert call(kc.column_scan_ranges, x, 1, whole, 0, lanes, cnt[:2], vals[:2], out) == -1
    assert kc.stats_summary(cnt, vals, np.zeros((4, 1))) == -1


def test_first_bad_slot_matches_reference():
    rng = np.random.default_rng(19)
    for trial in range(400):
        k = int(rng.integers(0, 60))
        n = int(rng.integers(1, 200))
        idx = rng.integers(-2 if trial % 5 == 0 else 0, n + (2 if trial % 7 == 0 else 0), k)
        if trial % 3 == 0:  # mostly distinct
            idx = rng.permutation(n)[:k] if k <= n else idx
        if trial % 11 == 0:  # colliding hashes: multiples of a power of two
            idx = (np.arange(k) * 1024) % max(n, 1)
        idx = np.asarray(idx, np.int64)
        table = np.empty(max(2, 1 << (2 * k - 1).bit_length()), np.int64)
        assert kc.first_bad_slot(idx, n, table) == naive.first_bad_slot_naive(idx, n), (idx, n)
    assert kc.first_bad_slot(np.arange(4), 10, np.empty(6, np.int64)) == -2  # not a power of two
    assert kc.first_bad_slot(np.arange(4), 10, np.empty(4, np.int64)) == -2  # too small


def test_column_kernels_allocate_nothing():
    """numba's runtime counts one allocation per array argument (the wrapper of the caller's
    array, at the call); anything more would be the kernel's own."""
    nrt = pytest.importorskip("numba.core.runtime._nrt_python")
    from numba.core.runtime import rtsys

    if not hasattr(nrt, "memsys_enable_stats"):
        pytest.skip("this numba cannot count its allocations")
    nrt.memsys_enable_stats()

    def extra(f, *args):
        if f in (kc.stats_ranges, kc.stats_dirty, kc.column_scan_ranges):
            args = (*args[0], *args[1:])
            f = kc.strided(f, args, kc.STRIDED)
        f(*args)  # compiled, or loaded from the cache
        before = rtsys.get_allocation_stats().alloc
        f(*args)
        return rtsys.get_allocation_stats().alloc - before - sum(isinstance(a, np.ndarray) for a in args)

    rec = np.zeros(3000, np.dtype([("p", "u1"), ("x", "f4", (3,))], align=True))
    rec["x"] = np.random.default_rng(0).standard_normal((3000, 3))
    rec["x"][7, 1] = np.nan  # the slow path too
    for x in (kc.operand(np.ascontiguousarray(rec["x"])), kc.operand(rec["x"])):
        lanes, cnt, vals, dirty, P = new_tree(3, 3000, 256)
        dirty[P + 2] = 1
        assert extra(kc.stats_ranges, x, 3, 3000, 256, 0, P, 0, 0, lanes, cnt, vals) == 0
        assert extra(kc.stats_dirty, x, 3, 3000, 256, dirty, lanes, cnt, vals) == 0
        assert extra(kc.column_scan_ranges, x, 3, np.array([[0, 50], [900, 3000]]), 100, lanes,
                     cnt[:2], vals[:2], np.zeros((5, 3))) == 0
        assert extra(kc.stats_summary, cnt, vals, np.zeros((5, 3))) == 0
        assert extra(kc.stats_clear, cnt, vals, dirty) == 0
    assert extra(kc.first_bad_slot, np.arange(10), 20, np.empty(32, np.int64)) == 0


@pytest.mark.parametrize("layout", CART_LAYOUTS)
def test_steady_state_with_stats_holds_no_memory(layout):
    import tracemalloc

    buf = ReplayBuffer(CART, 5000, layout=layout, seed=0, stats=["obs", "reward"])
    rows = random_rows(CART, 1000, np.random.default_rng(0))
    one = {k: v[0] for k, v in rows.items()}
    for _ in range(8):  # warm: compile, fill, wrap
        buf.extend(rows)
        buf.push(one)
        buf.stats("obs")
        buf.update_field("reward", [3, 4], [1.0, 2.0])
    held = []
    tracemalloc.start()
    try:
        for rounds in (50, 300):
            for i in range(rounds):
                buf.push(one)
                buf.extend(rows)
                buf.stats("obs")
                buf.stats("reward")
                buf.update_field("reward", [3, 4], [1.0, 2.0])
            held.append(tracemalloc.get_traced_memory()[0])
    finally:
        tracemalloc.stop()
    # what is held (the cached statistics of each field) does not grow with the rounds
    assert held[1] - held[0] < 1024, held


# -- the buffer ---------------------------------------------------------------------------------
def ring_rows(model: naive.RingModel, name: str) -> np.ndarray:
    """Field ``name`` of the model's live rows, oldest first."""
    start = model.cursor if model.size == model.capacity else 0
    order = [(start + j) % model.capacity for j in range(model.size)]
    if not order:
        return np.zeros(0)
    return np.stack([model.slots[i][name] for i in order])


def check_stats(buf, model, names):
    for name in names:
        s = buf.stats(name)
        count, want = naive.column_stats_naive(ring_rows(model, name))
        assert s.count == count == len(buf), name
        close(s.values.reshape(5, -1), want, name)
        c = buf.column_stats(name)
        assert c.count == count
        close(c.values.reshape(5, -1), want, name)


def drive(buf, model, rng, steps: int, envs: int = 1, names=("obs", "reward")):
    """Random pushes and extends (wrapping, some larger than the capacity), reads in between."""
    spec = buf.spec
    for step in range(steps):
        r = rng.random()
        if r < 0.3 and envs == 1:
            for _ in range(int(rng.integers(1, 40))):
                row = {k: v[0] for k, v in random_rows(spec, 1, rng).items()}
                buf.push(row)
                model.push(row)
        else:
            n = envs * int(rng.integers(1, 2 * buf.capacity // envs if r > 0.9 else 300 // envs + 2))
            batch = random_rows(spec, n, rng)
            buf.extend(batch)
            model.extend(batch)
        if rng.random() < 0.5:
            check_stats(buf, model, names)
    check_stats(buf, model, names)


@pytest.mark.parametrize("layout", CART_LAYOUTS)
@pytest.mark.parametrize("kind", ["uniform", "prioritized", "envs", "nstep_elide"])
def test_running_stats_match_numpy_over_the_live_rows(layout, kind):
    rng = np.random.default_rng(4)
    opts = {"uniform": {}, "prioritized": {}, "envs": {"num_envs": 4},
            "nstep_elide": {"n_step": 3, "elide_next": True}}[kind]
    cls = PrioritizedReplayBuffer if kind == "prioritized" else ReplayBuffer
    capacity = 1200
    buf = cls(CART, capacity, layout=layout, seed=0, stats=["obs", "reward", "terminated"], **opts)
    model = naive.RingModel(capacity)
    if kind == "nstep_elide":  # a continuous stream: each obs is the previous row's next_obs
        obs = np.zeros(4, np.float32)
        for step in range(2500):
            row = {k: v[0] for k, v in random_rows(buf.spec, 1, rng).items()}
            row["obs"] = obs
            ended = row["terminated"] or row["truncated"]
            obs = np.zeros(4, np.float32) if ended else row["next_obs"]
            buf.push(row)
            model.push(row)
            if step % 400 == 0:
                check_stats(buf, model, buf.stats_fields)
        check_stats(buf, model, buf.stats_fields)
        return
    drive(buf, model, rng, 40, envs=opts.get("num_envs", 1), names=buf.stats_fields)


@pytest.mark.parametrize("layout", CART_LAYOUTS)
@pytest.mark.parametrize("rows", [1, 4], ids=["push", "extend4"])
def test_running_stats_through_the_generated_calls_across_wraps(layout, rows):
    """Pushes and small extends go through the generated calls, which tell the statistics only
    of laps (on_wrap): read at every phase of several laps, also right at a wrap."""
    rng = np.random.default_rng(18)
    buf = ReplayBuffer(CART, 100, layout=layout, stats=["obs", "reward"])
    model = naive.RingModel(100)
    for step in range(130):
        batch = random_rows(CART, rows, rng)
        if rows == 1:
            buf.push({k: v[0] for k, v in batch.items()})
        else:
            buf.extend(batch)
        model.extend(batch)
        if step % 7 == 0 or step % 25 == 24:
            check_stats(buf, model, ["obs", "reward"])
    check_stats(buf, model, ["obs", "reward"])


def test_stats_of_odd_dtypes_and_both_layouts_are_bit_identical():
    rng = np.random.default_rng(5)
    names = list(ODD_SPEC.names)
    bufs = [ReplayBuffer(ODD_SPEC, 700, layout=layout, seed=0, stats=names) for layout in [*LAYOUTS, ODD_GROUPS]]
    model = naive.RingModel(700)
    for step in range(12):
        batch = random_rows(ODD_SPEC, int(rng.integers(1, 900)), rng)
        for b in bufs:
            b.extend(batch)
        model.extend(batch)
        for name in names:
            a, *others = (x.stats(name) for x in bufs)
            for b in others:
                np.testing.assert_array_equal(a.values, b.values, err_msg=name)
            a, *others = (x.column_stats(name) for x in bufs)
            for b in others:
                np.testing.assert_array_equal(a.values, b.values, err_msg=name)
    check_stats(bufs[0], model, names)


@pytest.mark.parametrize("layout", CART_LAYOUTS)
def test_running_stats_equal_a_fresh_build_bit_for_bit(layout):
    """After any history of writes, relabels and reads, the statistics are those of a buffer
    given the same rows at once (the tree holds no history)."""
    rng = np.random.default_rng(6)
    buf = ReplayBuffer(CART, 3000, layout=layout, seed=0, stats=["obs", "reward"])
    for step in range(30):
        buf.extend(random_rows(CART, int(rng.integers(1, 700)), rng))
        if step % 3 == 0:
            buf.stats("obs")
        if len(buf) > 10 and step % 4 == 0:
            idx = rng.choice(len(buf), 10, replace=False)
            buf.update_field("reward", idx, rng.standard_normal(10).astype(np.float32) * 50)
    other = ReplayBuffer(CART, 3000, layout="soa" if layout == "aos" else "aos", stats=["obs", "reward"])
    other.load_state_dict(buf.state_dict())
    for name in ("obs", "reward"):
        np.testing.assert_array_equal(buf.stats(name).values, other.stats(name).values)


@pytest.mark.parametrize("layout", CART_LAYOUTS)
def test_clear_and_empty_buffers(layout):
    buf = ReplayBuffer(CART, 100, layout=layout, stats=["reward"])
    s = buf.stats("reward")
    assert s.count == 0 and np.isnan(s.values).all()
    assert buf.column_stats("obs").count == 0
    with pytest.raises(ValueError, match="no row"):
        s.normalize(1.0)
    buf.extend(random_rows(CART, 150, np.random.default_rng(7)))
    assert buf.stats("reward").count == 100
    buf.clear()
    assert buf.stats("reward").count == 0
    batch = random_rows(CART, 30, np.random.default_rng(8))
    buf.extend(batch)
    _, want = naive.column_stats_naive(batch["reward"])
    close(buf.stats("reward").values.reshape(5, 1), want)


def test_field_stats_are_read_only_and_normalize():
    buf = ReplayBuffer(CART, 100, stats=["obs"])
    buf.extend(random_rows(CART, 60, np.random.default_rng(9)))
    s = buf.stats("obs")
    assert s.mean.shape == (4,) and s.mean.dtype == np.float64
    with pytest.raises(AttributeError):
        s.count = 3
    with pytest.raises(ValueError):
        s.mean[0] = 1.0
    x = np.ones((5, 4), np.float32)
    y = s.normalize(x)
    assert y.dtype == np.float32 and y.shape == (5, 4)
    np.testing.assert_allclose(y, ((x - s.mean) / np.sqrt(s.var + 1e-8)).astype(np.float32))
    assert np.abs(s.normalize(x * 1e6, clip=5.0)).max() == 5.0
    assert buf.stats("obs") is s  # nothing changed: the same object
    # eps inside the root: a constant element (variance 0) with eps = 1 is divided by 1, and a
    # varying element by sqrt(var + 1), not by std + 1
    c = ReplayBuffer(CART, 100, stats=["obs"])
    rows = random_rows(CART, 50, np.random.default_rng(4))
    rows["obs"][:, 0] = 2.5
    rows["obs"][:, 1] *= 30.0
    c.extend(rows)
    cs = c.stats("obs")
    assert cs.var[0] == 0.0 and cs.var[1] > 100
    z = cs.normalize(np.array([[3.5, 1.0, 0.0, 0.0]], np.float64), eps=1.0)
    assert z[0, 0] == 1.0
    np.testing.assert_allclose(z[0, 1], (1.0 - cs.mean[1]) / np.sqrt(cs.var[1] + 1.0), rtol=1e-12)
    assert abs(z[0, 1] - (1.0 - cs.mean[1]) / (cs.std[1] + 1.0)) > 1e-6
    r = ReplayBuffer(CART, 10, stats=["reward"])
    r.push({k: v[0] for k, v in random_rows(CART, 1, np.random.default_rng(0)).items()})
    assert r.stats("reward").mean.shape == () and r.stats("reward").var == 0.0


def test_stats_argument_is_checked():
    for bad, err in ((["nope"], SpecError), (["obs", "obs"], SpecError), ("obs", TypeError), (3, TypeError)):
        with pytest.raises(err):
            ReplayBuffer(CART, 10, stats=bad)
    with pytest.raises(SpecError, match="complex"):
        ReplayBuffer({"z": "c8", "r": "f4"}, 10, stats=["z"])
    with pytest.raises(SpecError, match="not stored"):
        ReplayBuffer(CART, 10, elide_next=True, stats=["next_obs"])
    with pytest.raises(SpecError, match="no running statistics"):
        ReplayBuffer(CART, 10, stats=["obs"]).stats("reward")
    assert ReplayBuffer(CART, 10, elide_next=False, stats=["next_obs"]).stats_fields == ("next_obs",)
    with pytest.raises(NotImplementedError):
        tfdata.SharedReplayBuffer(CART, 64, stats=["obs"])


def test_generated_push_and_extend_stay_in_use_with_stats():
    spec = {"obs": ("f4", (4,)), "reward": "f4"}  # no episode flags: no other wrap hook
    plain = ReplayBuffer(spec, 100, seed=0)
    buf = ReplayBuffer(spec, 100, seed=0, stats=["obs"])
    assert hasattr(buf.push, "__source__") and hasattr(buf.extend, "__source__")
    # every push calls on_wrap at the ring's end (the writer counts laps: its write position);
    # the statistics' hook joins it there, and nothing else
    assert "on_wrap()" in buf.push.__source__ and "on_wrap()" in plain.push.__source__
    assert buf.push.__source__ == plain.push.__source__
    assert "on_write" not in buf.push.__source__  # nothing per row
    # the large-batch path that writes the fields straight into the storage is kept
    assert "no wrap, no lap" in buf.extend.__source__
    assert buf.extend.__source__ == plain.extend.__source__
    for b in (ReplayBuffer(CART, 100, stats=["obs"]), PrioritizedReplayBuffer(CART, 100, stats=["obs"])):
        assert hasattr(b._fast_push, "__source__")


# -- plan, memory, spill ------------------------------------------------------------------------
@pytest.mark.parametrize("layout", CART_LAYOUTS)
def test_plan_equals_allocation_with_stats(layout):
    opts = dict(layout=layout, stats=["obs", "reward", "terminated"])
    for cls, extra in ((ReplayBuffer, {}), (PrioritizedReplayBuffer, {"alpha": 0.5}),
                       (ReplayBuffer, {"elide_next": True, "num_envs": 2})):
        with tfdata.alloc.open("numpy") as a:
            buf = cls(CART, 5000, allocator=a, **opts, **extra)
            plan = cls.plan_memory(CART, 5000, **opts, **extra)
            assert buf.nbytes_parts == plan
            assert a.live_bytes == buf.nbytes == sum(plan.values())
            assert plan["trees"] > cls.plan_memory(CART, 5000, layout=layout, **extra)["trees"]
            buf.extend(random_rows(CART, 600, np.random.default_rng(0)) if not extra.get("elide_next")
                       else {k: np.zeros((600,) + CART[k].shape, CART[k].dtype) for k in CART.names})
            buf.stats("obs")
            assert a.live_bytes == buf.nbytes  # reads allocate nothing of the buffer's
            del buf
    buf = ReplayBuffer(CART, 5000, **opts)
    with pytest.raises(tfdata.MemoryBudgetError):
        ReplayBuffer(CART, 5000, memory_budget=buf.nbytes - 1, **opts)
    assert tfdata.memory.max_capacity(CART, buf.nbytes, **opts) == 5000


@pytest.mark.parametrize("layout", CART_LAYOUTS)
def test_spilling_buffer_keeps_stats_and_relabels(tmp_path, layout):
    rng = np.random.default_rng(10)
    ram = ReplayBuffer(CART, 2000, layout=layout, seed=0, stats=["obs", "reward"])
    big = ReplayBuffer(CART, 2000, layout=layout, seed=0, stats=["obs", "reward"],
                       spill_path=tmp_path / "spill", hot_rows=300)
    for step in range(8):
        batch = random_rows(CART, 700, rng)
        ram.extend(batch)
        big.extend(batch)
        idx = rng.choice(len(ram), 20, replace=False)
        vals = rng.standard_normal(20).astype(np.float32)
        ram.update_field("reward", idx, vals)
        big.update_field("reward", idx, vals)
        for name in ("obs", "reward"):
            np.testing.assert_array_equal(ram.stats(name).values, big.stats(name).values)
    np.testing.assert_array_equal(np.asarray(ram.column("reward")), np.asarray(big.column("reward")))


# -- column views -------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", CART_LAYOUTS)
def test_column_segments_are_the_live_rows_in_ring_order(layout):
    rng = np.random.default_rng(11)
    buf = ReplayBuffer(CART, 50, layout=layout)
    model = naive.RingModel(50)
    col = buf.column("obs")
    assert col.segments == () and len(col) == 0 and np.asarray(col).shape == (0, 4)
    for n in (10, 30, 25, 50, 7, 120):
        batch = random_rows(CART, n, rng)
        buf.extend(batch)
        model.extend(batch)
        for name in CART.names:
            col = buf.column(name)
            want = ring_rows(model, name)
            assert len(col) == len(buf) == len(want) and col.shape == want.shape
            np.testing.assert_array_equal(np.asarray(col), want)
            assert len(col.segments) == (2 if len(buf) == 50 and buf.writer.cursor else 1)
            assert all(not s.flags.writeable for s in col.segments)
            np.testing.assert_array_equal(np.concatenate(col.segments), want)
    col = buf.column("reward")
    with pytest.raises(ValueError):
        col.segments[0][0] = 1.0
    if len(col.segments) == 2:
        with pytest.raises(ValueError, match="copy"):
            np.asarray(col, copy=False) if np.lib.NumpyVersion(np.__version__) >= "2.0.0" else col.__array__(copy=False)
    # live memory: a later write shows through
    first = col.segments[0]
    slot = buf.writer.cursor
    buf.extend(random_rows(CART, 1, rng))
    assert first[0] == buf.storage.field("reward")[slot]
    with pytest.raises(SpecError, match="not stored"):
        ReplayBuffer(CART, 10, elide_next=True).column("next_obs")
    with pytest.raises(SpecError):
        buf.column("rewrd")


# -- relabelling ----------------------------------------------------------------------------------
def full_state(buf) -> dict:
    """Everything a refused call must leave as it was: the state dict (rows included), the
    storage bytes and every field's statistics."""
    st = buf.state_dict()
    st["storage"] = {n: np.array(buf.storage.field(n)) for n in buf.storage.spec.names}
    st["stats_now"] = {n: buf.stats(n).values.copy() for n in buf.stats_fields}
    return st


def assert_same(a, b, path=""):
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            assert_same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, np.ndarray):
        np.testing.assert_array_equal(a, b, err_msg=path)
        assert a.dtype == b.dtype, path
    else:
        assert a == b, path


@pytest.mark.parametrize("layout", CART_LAYOUTS)
@pytest.mark.parametrize("cls", [ReplayBuffer, PrioritizedReplayBuffer])
def test_update_field_rewrites_rows_and_statistics(layout, cls):
    rng = np.random.default_rng(12)
    buf = cls(CART, 1000, layout=layout, seed=0, stats=["obs", "reward"])
    model = naive.RingModel(1000)
    for step in range(10):
        batch = random_rows(CART, int(rng.integers(50, 500)), rng)
        buf.extend(batch)
        model.extend(batch)
        k = int(rng.integers(0, 40))
        idx = rng.choice(len(buf), k, replace=False)
        for name, values in (("reward", rng.standard_normal(k) * 100),  # float64 into float32
                             ("obs", rng.standard_normal((k, 4)).astype(np.float32)),
                             ("action", rng.integers(0, 5, k))):
            before = buf.priorities() if cls is PrioritizedReplayBuffer else None
            buf.update_field(name, idx.tolist() if step % 2 else idx, values)
            for i, v in zip(idx, values):
                model.slots[i][name] = np.asarray(v).astype(CART[name].dtype)
            if before is not None:
                np.testing.assert_array_equal(buf.priorities(), before)
        check_stats(buf, model, ["obs", "reward"])
        for name in CART.names:
            np.testing.assert_array_equal(np.asarray(buf.column(name)), ring_rows(model, name))
    b = buf.sample(64)
    np.testing.assert_array_equal(b["reward"], model.rows(b.indices)["reward"])


@pytest.mark.parametrize("layout", CART_LAYOUTS)
@pytest.mark.parametrize("opts", [{"n_step": 3, "num_envs": 2}, {"elide_next": True, "n_step": 2},
                                  {"num_envs": 4}], ids=["nstep_envs", "elide", "envs"])
def test_relabelled_buffer_samples_as_one_given_the_new_rows(layout, opts):
    """Rewriting rewards (or obs) in place gives the samples of a buffer that was given the
    rewritten rows in the first place: n-step returns, elided next fields and episode numbers
    read the new values."""
    rng = np.random.default_rng(17)
    envs = opts.get("num_envs", 1)
    steps = 300
    rows = random_rows(CART, steps * envs, rng)
    if opts.get("elide_next"):  # one continuous stream
        ends = rows["terminated"] | rows["truncated"]
        for t in range(1, steps):
            rows["obs"][t] = rows["next_obs"][t - 1] if not ends[t - 1] else rows["obs"][t]
    a = ReplayBuffer(CART, 200 * envs, layout=layout, seed=3, stats=["reward"], **opts)
    a.extend(rows)
    idx = rng.choice(len(a), 50, replace=False)
    new = rng.standard_normal(50).astype(np.float32)
    a.update_field("reward", idx, new)
    if not opts.get("elide_next"):
        a.update_field("obs", idx[:5], np.full((5, 4), 7.0, np.float32))
    changed = {k: v.copy() for k, v in rows.items()}
    cap = 200 * envs
    slot_row = {s: (len(rows["reward"]) - cap) + ((s - len(rows["reward"])) % cap) for s in range(cap)}
    for s, v in zip(idx, new):
        changed["reward"][slot_row[int(s)]] = v
    if not opts.get("elide_next"):
        for s in idx[:5]:
            changed["obs"][slot_row[int(s)]] = 7.0
    b = ReplayBuffer(CART, 200 * envs, layout=layout, seed=3, stats=["reward"], **opts)
    b.extend(changed)
    for _ in range(5):
        x, y = a.sample(64), b.sample(64)
        for name in CART.names:
            np.testing.assert_array_equal(x[name], y[name], err_msg=name)
        if "n_step" in opts:
            np.testing.assert_array_equal(x.discounts, y.discounts)
    np.testing.assert_array_equal(a.stats("reward").values, b.stats("reward").values)


@pytest.mark.parametrize("layout", CART_LAYOUTS)
def test_update_field_refusals_change_nothing(layout):
    rng = np.random.default_rng(13)
    buf = ReplayBuffer(CART, 100, layout=layout, seed=0, stats=["obs", "reward"])
    buf.extend(random_rows(CART, 60, rng))
    elided = ReplayBuffer(CART, 100, layout=layout, elide_next=True)
    plain = ReplayBuffer({"r": "f4", "terminated": "?"}, 10)  # no episode tracking: just data
    plain.push({"r": 1.0, "terminated": False})
    plain.update_field("terminated", [0], [True])
    cases = [
        (buf, ("rewrd", [1], [1.0]), SpecError, "unknown field"),
        (buf, ("terminated", [1], [True]), SpecError, "episode flag"),
        (buf, ("truncated", [1], [False]), SpecError, "episode flag"),
        (elided, ("next_obs", [0], np.zeros((1, 4), np.float32)), SpecError, "not stored"),
        (elided, ("obs", [0], np.zeros((1, 4), np.float32)), SpecError, "next_obs"),
        (buf, ("reward", [1.0, 2.0], [1.0, 2.0]), SpecError, "1-D integer"),
        (buf, ("reward", [[1, 2]], [[1.0, 2.0]]), SpecError, "1-D integer"),
        (buf, ("reward", np.array([True, False]), [1.0, 2.0]), SpecError, "1-D integer"),
        (buf, ("reward", [3, -1], [1.0, 2.0]), IndexError, r"indices\[1\] = -1"),
        (buf, ("reward", [3, 60], [1.0, 2.0]), IndexError, r"indices\[1\] = 60 .*\[0, 60\)"),
        (buf, ("reward", np.array([3, 2**63], np.uint64), [1.0, 2.0]), IndexError, "9223372036854775808"),
        (buf, ("reward", [3, 7, 3], [1.0, 2.0, 3.0]), ValueError, r"index 3 is given twice \(indices\[0\] and indices\[2\]\)"),
        (buf, ("reward", [3, 7], [1.0]), SpecError, "reward"),
        (buf, ("reward", [3, 7], [[1.0], [2.0]]), SpecError, "reward"),
        (buf, ("obs", [3, 7], np.zeros((2, 3), np.float32)), SpecError, "obs"),
        (buf, ("action", [3, 7], [1.5, 2.0]), SpecError, "action"),
        (buf, ("action", [3, 7], np.array([1, 2**63], np.uint64)), SpecError, "action"),
        (buf, ("reward", [3, 7], ["a", "b"]), SpecError, "reward"),
    ]
    for target, args, err, match in cases:
        before = full_state(target) if target.stats_fields else target.state_dict()
        with pytest.raises(err, match=match):
            target.update_field(*args)
        after = full_state(target) if target.stats_fields else target.state_dict()
        assert_same(before, after)
    buf.update_field("reward", [], [])  # nothing to do
    with pytest.raises(NotImplementedError):
        tfdata.SharedReplayBuffer.update_field(None, "reward", [0], [1.0])


def test_update_field_after_clear_refuses_stale_indices():
    buf = ReplayBuffer(CART, 100, stats=["reward"])
    buf.extend(random_rows(CART, 50, np.random.default_rng(14)))
    buf.clear()
    with pytest.raises(IndexError, match=r"\[0, 0\)"):
        buf.update_field("reward", [3], [1.0])
    assert buf.stats("reward").count == 0


# -- relabelling a batch: refused once a row of it was overwritten ---------------------------------
ID_SPEC = {"id": "i8", "label": "f4", "terminated": "?", "truncated": "?"}
SEED_OFFSET = 0
BATCH_KINDS = ["uniform", "without_replacement", "exactly_k-drop", "exactly_k-overwrite",
               "exactly_k-block", "prioritized"]


def _id_buffer(kind: str, cap: int, layout="aos"):
    if kind == "prioritized":
        return PrioritizedReplayBuffer(ID_SPEC, cap, layout=layout, seed=1, stats=["label"])
    if kind.startswith("exactly_k"):
        return ReplayBuffer(ID_SPEC, cap, layout=layout, seed=1, sampler="exactly_k", replays=2,
                            policy=kind.split("-")[1], stats=["label"])
    return ReplayBuffer(ID_SPEC, cap, layout=layout, seed=1, sampler=kind, stats=["label"])


def _id_rows(ids) -> dict:
    ids = np.asarray(ids, np.int64)
    return {"id": ids, "label": np.zeros(len(ids), np.float32), "terminated": ids % 4 == 3,
            "truncated": np.zeros(len(ids), bool)}


@pytest.mark.parametrize("kind", BATCH_KINDS)
@pytest.mark.parametrize("layout, laps", [("aos", 0), ("soa", 0), ("aos", 2 ** 32 - 3)])
def test_update_field_of_a_batch_refuses_rows_overwritten_since(kind, layout, laps):
    """Rows carry a unique id; a batch is stale exactly when one of its slots holds another id
    than it sampled (or the rows were replaced by a load or a clear). Random pushes (the
    generated push and the generic one), extends (some longer than the ring), samples, clears and
    state loads; every update_field(batch) is accepted exactly when the batch is fresh, and a
    refused one changes nothing. ``laps``: where the writer's position starts (exactly-k keeps
    each slot's lap modulo 2**32: the laps cross it)."""
    rng = np.random.default_rng([BATCH_KINDS.index(kind), len(layout), SEED_OFFSET, laps % 7])
    cap = 7
    buf = _id_buffer(kind, cap, layout)
    buf.writer.laps = laps
    next_id = 0
    kept = []  # [batch (a copy), the ids it sampled, replaced-since flag]
    accepted = refused = 0
    for step in range(400):
        r = rng.random()
        sampler = buf.sampler
        room = sampler.free if kind == "exactly_k-block" else cap + 5
        if r < 0.3 and room >= 1:
            n = int(rng.integers(1, min(room, cap + 4) + 1))
            if n == 1 and rng.random() < 0.5:
                row = {k: v[0] for k, v in _id_rows([next_id]).items()}
                if kind == "prioritized" and rng.random() < 0.5:
                    buf.push(row, priority=float(rng.random() + 0.1))  # the generic push
                else:
                    buf.push(row)  # the generated push (exactly-k: its sweep's place)
            else:
                buf.extend(_id_rows(range(next_id, next_id + n)))
            next_id += n
        elif r < 0.55 and len(buf):
            want = int(rng.integers(1, min(3, len(buf)) + 1))
            if kind.startswith("exactly_k") and sampler.awaiting < want:
                continue
            batch = buf.sample(want, copy=bool(rng.random() < 0.5))
            kept.append([batch, batch["id"].copy(), False])
            kept = kept[-6:]
        elif r < 0.58:
            buf.clear()
            for k in kept:
                k[2] = True
        elif r < 0.62:
            buf.load_state_dict(buf.state_dict())  # the same rows, loaded: batches before are stale
            for k in kept:
                k[2] = True
        elif kept:
            batch, ids, replaced = kept[int(rng.integers(len(kept)))]
            try:
                slots = batch.indices
            except tfdata.StaleBatchError:  # a view whose ring slot a later sample reused
                with pytest.raises(tfdata.StaleBatchError):
                    buf.update_field("label", batch, [1.0])
                continue
            n, seen, problem = len(buf), set(), None
            for s in slots.tolist():  # the first slot not held (a clear since) or given twice
                if s >= n or s in seen:  # (drawn with replacement)
                    problem = (IndexError, "not a live row") if s >= n else (ValueError, "given twice")
                    break
                seen.add(s)
            if problem is not None:
                with pytest.raises(problem[0], match=problem[1]):
                    buf.update_field("label", batch, np.ones(len(slots), np.float32))
                continue
            now = np.asarray(buf.storage.field("id"))[slots]
            stale = replaced or bool((now != ids).any())
            values = rng.random(len(slots)).astype(np.float32)
            if stale:
                before = full_state(buf)
                with pytest.raises(ValueError, match=r"update_field: stale batch: \d+ of its "):
                    buf.update_field("label", batch, values)
                assert_same(before, full_state(buf))
                if not replaced:  # the count named is the rows whose id changed
                    k = int((now != ids).sum())
                    with pytest.raises(ValueError, match=f"stale batch: {k} of its {len(slots)} rows"):
                        buf.update_field("label", batch, values)
                refused += 1
            else:
                buf.update_field("label", batch, values)
                np.testing.assert_array_equal(np.asarray(buf.storage.field("label"))[slots], values)
                accepted += 1
    assert accepted and refused, (accepted, refused)


def test_an_exactly_k_batch_older_than_2_32_laps_is_stale():
    buf = _id_buffer("exactly_k-drop", 8)
    buf.extend(_id_rows(range(8)))
    b = buf.sample(2, copy=True)
    buf.update_field("label", b, [1.0, 2.0])
    buf.writer.laps += 2 ** 32 - 1  # (as if that many laps had been written: none of b's rows)
    with pytest.raises(ValueError, match="stale batch: 2 of its 2"):
        buf.update_field("label", b, [1.0, 2.0])
    # exactly 2**32 - 1 laps on, sampled mid-ring: the lap kept modulo 2**32 would read as the
    # batch's own lap, and the rows before the batch's cursor as unwritten; refused whole
    buf = _id_buffer("exactly_k-drop", 8)
    buf.extend(_id_rows(range(4)))
    b = buf.sample(2, copy=True)
    assert buf.writer.cursor == 4 and (b.indices < 4).all()
    buf.update_field("label", b, [1.0, 2.0])
    buf.writer.laps += 2 ** 32 - 1
    with pytest.raises(ValueError, match="stale batch: 2 of its 2"):
        buf.update_field("label", b, [1.0, 2.0])


def test_update_field_of_a_batch_through_every_push_path():
    """The write position counts the laps of every write path: the generated push and extend, the
    generic ones, a frame-stacked buffer's push."""
    from .test_frames_everything import Twin

    buf = ReplayBuffer(ID_SPEC, 4, seed=0)
    buf.extend(_id_rows(range(4)))
    b = buf.sample(2, copy=True)
    for i in range(4):  # a lap of generated pushes: every row overwritten
        buf.push({k: v[0] for k, v in _id_rows([10 + i]).items()})
    with pytest.raises(ValueError, match="stale batch: 2 of its 2"):
        buf.update_field("label", b, [1.0, 2.0])
    b = buf.sample(2, copy=True)
    buf.extend(_id_rows(range(20, 22)))  # the generated extend of a few rows, to the end
    buf.extend(_id_rows(range(30, 32)))  # past the end: the ring's first two slots
    stale = int(np.isin(b.indices, [0, 1, 2, 3]).sum())
    with pytest.raises(ValueError, match=f"stale batch: {stale} of its 2"):
        buf.update_field("label", b, [1.0, 2.0])
    tw = Twin(k=3, num_envs=1, capacity=6, p_end=0.2)
    tw.feed(6)  # (pushes half the time: the frame-stacked buffer's generated push)
    b = tw.a.sample(1, copy=True)
    tw.a.update_field("reward", b, [1.0])
    tw.feed(6)  # a lap: every row overwritten
    with pytest.raises(ValueError, match="stale batch: 1 of its 1"):
        tw.a.update_field("reward", b, [2.0])


def test_update_field_of_a_batch_it_cannot_check():
    buf = ReplayBuffer(CART, 16, seed=0)
    buf.extend(random_rows(CART, 10, np.random.default_rng(3)))
    before = buf.state_dict()
    for batch, err, match in (
            (buf.sample_sequences(2, 2), ValueError, "carries no write position"),
            (tfdata.Batch({}, np.array([1, 2])), ValueError, "carries no write position"),
            (tfdata.Batch({}, np.array([1, 2]), write_position=10 ** 9), ValueError, "another buffer"),
    ):
        with pytest.raises(err, match=match):
            buf.update_field("reward", batch, [1.0, 2.0])
    old = buf.sample(2)
    for _ in range(2):
        buf.sample(2)  # the ring slot of ``old`` is reused while it is held: retired
    with pytest.raises(tfdata.StaleBatchError):
        buf.update_field("reward", old, [1.0, 2.0])
    assert_same(before["data"], buf.state_dict()["data"])
    fresh = buf.sample(2, copy=True)
    fresh_slots = fresh.indices
    if fresh_slots[0] != fresh_slots[1]:
        buf.update_field("reward", fresh, [5.0, 6.0])  # plain indices and batches both still work
    buf.update_field("reward", [3], [7.0])
    assert buf.storage.field("reward")[3] == 7.0


# -- state and checkpoints ----------------------------------------------------------------------
def filled(layout="aos", n=1500, **kw):
    buf = ReplayBuffer(CART, 1000, layout=layout, seed=0, stats=["obs", "reward"], **kw)
    buf.extend(random_rows(CART, n, np.random.default_rng(15)))
    return buf


def test_state_dict_carries_stats_and_a_bad_state_changes_nothing():
    buf = filled()
    st = buf.state_dict()
    assert set(st["stats"]) == {"obs", "reward"} and st["stats"]["reward"]["count"] == 1000
    assert st["stats"]["reward"]["mean"].shape == () and st["stats"]["obs"]["mean"].shape == (4,)
    target = filled("soa", n=300)
    before = full_state(target)
    for change, match in (
            (lambda s: s["stats"]["obs"]["mean"].__setitem__(2, 0.5), r"stats\['obs'\].mean differs"),
            (lambda s: s["stats"]["reward"].__setitem__("var", np.float64(2.0)), r"stats\['reward'\].var"),
            (lambda s: s["stats"]["obs"].__setitem__("min", np.zeros(4, np.float32)), r"stats\['obs'\].min"),
            (lambda s: s["stats"]["obs"].__setitem__("max", np.zeros(3)), r"stats\['obs'\].max"),
            (lambda s: s["stats"]["obs"].__setitem__("count", 999), r"stats\['obs'\].count"),
            (lambda s: s["stats"]["obs"].__setitem__("count", True), r"stats\['obs'\].count"),
            (lambda s: s["stats"]["obs"].pop("var"), r"stats\['obs'\]"),
            (lambda s: s.__setitem__("stats", [1]), "stats"),
            (lambda s: s["stats"]["reward"]["max"].__setitem__((), np.inf), r"stats\['reward'\].max")):
        bad = buf.state_dict()
        change(bad)
        with pytest.raises(ValueError, match=match):
            target.load_state_dict(bad)
        assert_same(before, full_state(target))
    # a state without statistics (an older state) loads: they are computed from the rows
    old = buf.state_dict()
    del old["stats"]
    target.load_state_dict(old)
    np.testing.assert_array_equal(target.stats("obs").values, buf.stats("obs").values)
    # entries for fields this buffer keeps no statistics of are not used
    other = ReplayBuffer(CART, 1000, stats=["reward"])
    other.load_state_dict(buf.state_dict())
    np.testing.assert_array_equal(other.stats("reward").values, buf.stats("reward").values)
    none = ReplayBuffer(CART, 1000)
    none.load_state_dict(buf.state_dict())
    assert "stats" not in none.state_dict()


@pytest.mark.parametrize("layout", CART_LAYOUTS)
def test_checkpoint_round_trip_with_stats(tmp_path, layout):
    buf = filled(layout, n=1234)
    buf.update_field("reward", [5, 6], [1e3, -1e3])
    buf.save(tmp_path / "ck")
    back = ReplayBuffer.load(tmp_path / "ck")
    assert back.stats_fields == ("obs", "reward") and back.config == buf.config
    assert "stats" not in ReplayBuffer(CART, 10).config  # no key: checkpoints as before
    for name in ("obs", "reward"):
        np.testing.assert_array_equal(back.stats(name).values, buf.stats(name).values)
    batch = random_rows(CART, 77, np.random.default_rng(16))
    buf.extend(batch)
    back.extend(batch)
    np.testing.assert_array_equal(back.stats("obs").values, buf.stats("obs").values)


def rewrite_state(path, change):
    import json

    p = path / "state.json"
    doc = json.loads(p.read_text())
    change(doc)
    p.write_text(json.dumps(doc))


def test_checkpoint_stats_are_validated(tmp_path):
    import shutil

    buf = filled(n=1100)
    buf.save(tmp_path / "good")

    def fresh_copy(name):
        shutil.copytree(tmp_path / "good", tmp_path / name)
        return tmp_path / name

    # a statistic that disagrees with the rows, in its file
    p = fresh_copy("mean")
    f = p / "arrays" / "stats.obs.mean.npy"
    a = np.load(f)
    a[1] = np.nextafter(a[1], 1.0)
    f.unlink()
    np.save(f, a)
    with pytest.raises(FormatError, match=r"stats.obs.mean.npy: state.stats\['obs'\].mean"):
        ReplayBuffer.load(p)
    p = fresh_copy("dtype")
    f = p / "arrays" / "stats.reward.var.npy"
    f.unlink()
    np.save(f, np.float32(1.0))
    with pytest.raises(FormatError, match=r"state.stats\['reward'\].var: expected float64"):
        ReplayBuffer.load(p)
    for name, change, match in (
            ("count", lambda d: d["state"]["stats"]["obs"].__setitem__("count", 5), r"stats\['obs'\].count"),
            ("countbool", lambda d: d["state"]["stats"]["obs"].__setitem__("count", True), r"stats\['obs'\].count"),
            ("extra", lambda d: d["state"]["stats"].__setitem__("action", {}), "state.stats"),
            ("missing", lambda d: d["state"]["stats"].pop("reward"), "state.stats"),
            ("keys", lambda d: d["state"]["stats"]["obs"].pop("min"), r"state.stats\['obs'\]"),
            ("cfg_unknown", lambda d: d["config"].__setitem__("stats", ["obs", "nope"]), r"config.stats\[1\]"),
            ("cfg_dup", lambda d: d["config"].__setitem__("stats", ["obs", "obs"]), "config.stats"),
            ("cfg_type", lambda d: d["config"].__setitem__("stats", "obs"), "config.stats"),
            ("cfg_none", lambda d: d["config"].__setitem__("stats", None), "config.stats"),
            ("cfg_empty", lambda d: d["config"].__setitem__("stats", []), "config.stats"),
            ("cfg_gone", lambda d: d["config"].pop("stats"), "state.stats: expected absent"),
            ("nostats", lambda d: d["state"].pop("stats"), "state.stats: expected the statistics"),
            ("cfg_next", lambda d: d["config"].update(stats=["next_obs"], elide_next=True), "config")):
        p = fresh_copy(name)
        rewrite_state(p, change)
        with pytest.raises(FormatError, match=match):
            ReplayBuffer.load(p)
    # a config without the key (an older checkpoint) builds a buffer without statistics
    p = fresh_copy("nokey")
    rewrite_state(p, lambda d: (d["config"].pop("stats"), d["state"].pop("stats")))
    for f in (p / "arrays").glob("stats.*"):
        f.unlink()
    assert ReplayBuffer.load(p).stats_fields == ()
    # ... unless asked for: computed from the rows
    back = ReplayBuffer.load(p, stats=["obs"])
    assert back.stats_fields == ("obs",) and back.config["stats"] == ["obs"]
    np.testing.assert_array_equal(back.stats("obs").values, buf.stats("obs").values)
    with pytest.raises(SpecError, match="nope"):  # the caller's error, not the file's
        ReplayBuffer.load(p, stats=["nope"])
    # stats= in place of a checkpoint's own: the saved ones of fields in both are still checked
    p = fresh_copy("override")
    f = p / "arrays" / "stats.reward.max.npy"
    f.unlink()
    np.save(f, np.float64(99.0))
    assert ReplayBuffer.load(p, stats=["obs"]).stats_fields == ("obs",)
    assert ReplayBuffer.load(p, stats=None).stats_fields == ()
    with pytest.raises(FormatError, match=r"stats\['reward'\].max"):
        ReplayBuffer.load(p, stats=["reward"])


def test_merge_stats_of_disjoint_row_sets_matches_the_reference():
    """merge_stats (the merge RayReplayBuffer uses over shards) against the reference over the
    union, empty parts skipped, non-finite values as numpy's functions give them."""
    from tfdata.replay.columns import merge_stats

    rng = np.random.default_rng(23)
    for trial in range(40):
        sizes = rng.integers(0, 300, int(rng.integers(1, 5)))
        parts = [1e3 * trial + rng.standard_normal((int(n), 3)) * (1 + trial) for n in sizes]
        if trial % 5 == 1 and sizes.sum():
            j = int(np.argmax(sizes))
            parts[j][0, 0] = np.nan
            parts[j][-1, 1] = np.inf
        got = merge_stats("x", (3,), [(len(p), scan(p)[1]) for p in parts])
        n, want = naive.column_stats_naive(np.concatenate(parts))
        assert got.count == n
        close(np.stack([got.mean, got.var, got.std, got.min, got.max]), want, f"trial {trial}")
    one = scan(parts[0])[1]
    assert merge_stats("x", (3,), [(0, one), (7, one)]).values.tobytes() == one.tobytes()
    assert np.isnan(merge_stats("r", (), []).mean)
