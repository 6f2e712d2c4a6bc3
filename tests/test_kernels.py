"""Every kernel against its slow reference in tests/naive.py."""

from __future__ import annotations

import numpy as np
import pytest

from tfdata import kernels
from tfdata.replay.samplers.uniform import UniformSampler
from tfdata.spec import Spec
from tfdata.storage import make_storage

from . import naive
from .conftest import CARTPOLE, ODD, random_rows


@pytest.mark.parametrize("n", [1, 2, 3, 7, 33, 1000, 2**31 + 11, 2**32 - 1])
@pytest.mark.parametrize("seed", [0, 1, 2**64 - 1])
def test_draw_indices_matches_reference(n, seed):
    s = UniformSampler(seed)
    s.state[1] = 5
    idx = np.empty(300, np.int64)
    kernels.draw_indices(n, s.state, idx)
    ref, counter = naive.draw_indices(naive.key_of(seed), 5, n, 300)
    np.testing.assert_array_equal(idx, ref)
    assert s.counter == counter
    assert idx.min() >= 0 and idx.max() < n


def test_draw_indices_uniform():
    # chi-square over 7 bins with 70,000 draws; the 0.999 quantile for 6 dof is 22.46
    s = UniformSampler(123)
    idx = np.empty(70_000, np.int64)
    kernels.draw_indices(7, s.state, idx)
    counts = np.bincount(idx, minlength=7)
    chi2 = ((counts - 10_000) ** 2 / 10_000).sum()
    assert chi2 < 22.46, counts


@pytest.mark.parametrize("layout", ["aos", "soa"])
@pytest.mark.parametrize("fields", [CARTPOLE, ODD, {"x": "u1"}, {"img": ("u1", (4, 21, 21))}],
                         ids=["cartpole", "odd", "one-byte", "image"])
@pytest.mark.parametrize("capacity", [1, 7, 33])
def test_gather_matches_fancy_indexing(layout, fields, capacity):
    spec = Spec(fields)
    st = make_storage(spec, capacity, layout)
    data = random_rows(spec, capacity, np.random.default_rng(capacity))
    st.write_rows(0, [data[n] for n in spec.names], 0, capacity)
    idx = np.random.default_rng(1).integers(0, capacity, 50)
    out = st.new_output(64)  # larger than the batch: kernels fill only the first rows
    st.gather(idx, out)
    ref = naive.gather_fields(data, idx)
    for name in spec.names:
        np.testing.assert_array_equal(out.fields[name][:50], ref[name])
        assert not out.fields[name][50:].any()


@pytest.mark.parametrize("layout", ["aos", "soa"])
@pytest.mark.parametrize("capacity", [1, 7, 33])
def test_sample_uniform_matches_reference(layout, capacity):
    spec = Spec(ODD)
    st = make_storage(spec, capacity, layout)
    data = random_rows(spec, capacity, np.random.default_rng(0))
    st.write_rows(0, [data[n] for n in spec.names], 0, capacity)
    s = UniformSampler(99)
    out = st.new_output(40)
    key, counter = naive.key_of(99), 0
    for n in range(1, capacity + 1):
        st.kernels.sample_uniform(st.kernel_store, n, s.state, out.indices, out.kernel_out)
        ref_idx, counter = naive.draw_indices(key, counter, n, 40)
        np.testing.assert_array_equal(out.indices, ref_idx)
        assert s.counter == counter
        ref = naive.gather_fields(data, ref_idx)
        for name in spec.names:
            np.testing.assert_array_equal(out.fields[name], ref[name])


def _filled(layout, fields, capacity, seed=0):
    spec = Spec(fields)
    st = make_storage(spec, capacity, layout)
    data = random_rows(spec, capacity, np.random.default_rng(seed))
    st.write_rows(0, [data[n] for n in spec.names], 0, capacity)
    return spec, st, data


def _assert_rows(spec, out, data, idx, batch):
    ref = naive.gather_fields(data, idx)
    for name in spec.names:
        np.testing.assert_array_equal(out.fields[name][:batch], ref[name], err_msg=name)
        assert not out.fields[name][batch:].any()  # only the batch's rows are written


@pytest.mark.parametrize("layout", ["aos", "soa"])
@pytest.mark.parametrize("capacity", [1, 7, 33])
@pytest.mark.parametrize("live", ["all", "half"])
def test_sample_prioritized_matches_reference(layout, capacity, live):
    spec, st, data = _filled(layout, ODD, capacity)
    n = capacity if live == "all" else max(1, capacity // 2)
    rng = np.random.default_rng(capacity)
    leaves = np.zeros(capacity)
    leaves[:n] = rng.integers(0, 9, n) + 0.5  # half-integers: every sum is exact
    sums, mm, lv = naive.block_tree(leaves, naive.tree_leaves(capacity))
    version = (np.arange(capacity) * 3).astype(np.uint8)
    batch = 5
    state = np.array([naive.key_of(7), 0], np.uint64)
    idx, u = np.empty(batch, np.int64), np.empty(batch)
    weights, versions = np.empty(batch, np.float32), np.empty(batch, np.uint32)
    out = st.new_output(batch + 3)
    counter = 0
    sums[0] = 2 * capacity + 3  # rows written: the laps of the ring are the versions' epoch
    for _ in range(4):
        ret = st.kernels.sample_prioritized(st.kernel_store, n, sums, mm, lv, version, capacity,
                                            state, 0.7, idx, u, weights, versions, out.kernel_out)
        ref, counter = naive.stratified_slots(naive.key_of(7), counter, leaves, batch, n)
        assert ret == 0
        np.testing.assert_array_equal(idx, ref)
        assert int(state[1]) == counter
        np.testing.assert_allclose(weights, ((leaves[:n].min() / leaves[ref]) ** 0.7).astype(np.float32),
                                   rtol=1e-6)
        epoch = (2 * capacity + 3) // capacity
        np.testing.assert_array_equal(versions, (epoch << 8) | version[ref].astype(np.uint32))
        _assert_rows(spec, out, data, ref, batch)
    for ring, count in ((0, 5.0), (capacity, np.nan), (capacity, -1.0), (capacity, np.inf)):
        sums[0] = count  # no ring, or no count of rows: no epoch (the versions stay in range)
        assert st.kernels.sample_prioritized(st.kernel_store, n, sums, mm, lv, version, ring, state,
                                             0.7, idx, u, weights, versions, out.kernel_out) == 0
        np.testing.assert_array_equal(versions, version[idx])


@pytest.mark.parametrize("layout", ["aos", "soa"])
@pytest.mark.parametrize("case", ["idle", "writing", "out_of_redraws", "too_few_rows"])
def test_sample_shared_matches_reference(layout, case):
    """Shards of 7 slots holding 3, 7 and 7 rows (the third has wrapped); while writers hold
    slots (``writing``), draws that land there are drawn again one at a time, and the redrawn
    rows are copied to their own place in the batch."""
    cap, heads = 7, np.array([3, 7, 12], np.uint64)
    spec, st, data = _filled(layout, ODD, 3 * cap)
    reserved = heads.copy()
    busy = set()
    if case in ("writing", "out_of_redraws"):
        reserved[1] += 2  # rows 7, 8 of shard 1: its slots 0, 1
        reserved[2] += 3  # rows 12, 13, 14 of shard 2: its slots 5, 6 and, wrapped, 0
        busy = {7, 8, 19, 20, 14}
    batch = 18 if case == "too_few_rows" else 15
    max_redraws = 0 if case == "out_of_redraws" else 1000
    state = np.array([naive.key_of(11), 4], np.uint64)
    scratch = np.zeros(7 * 3 + batch, np.int64)
    idx = np.full(batch, -1, np.int64)
    out = st.new_output(batch + 3)
    ret = st.kernels.sample_shared(st.kernel_store, heads, reserved, cap, scratch, state, idx,
                                   out.kernel_out, max_redraws)
    if case == "too_few_rows":  # 17 rows held
        assert ret == -2 and (idx == -1).all() and int(state[1]) == 4
        return
    ref, counter, redraws = naive.shared_sample_redrawn(naive.key_of(11), 4, [3, 7, 7], cap, batch,
                                                        busy, max_redraws)
    assert ret == redraws and int(state[1]) == counter
    np.testing.assert_array_equal(idx, ref)
    if case == "writing":
        assert redraws > 0  # the seed makes some draws land on busy slots
        assert not busy & set(idx.tolist())
    if case == "out_of_redraws":
        assert ret == -1
        return
    _assert_rows(spec, out, data, ref, batch)


@pytest.mark.parametrize("layout", ["aos", "soa"])
@pytest.mark.parametrize("fields", [{"x": ("u8", (w,))} for w in range(1, 19)]
                         + [{"x": ("u1", (3,)), "y": ("u8", (w,))} for w in (1, 5, 15, 16, 40)]
                         + [{"x": ("u1", (w,))}
                            for w in (1, 2, 5, 7, 9, 63, 64, 65, 72, 127, 128, 129)],
                         ids=lambda f: "+".join(f"{v[0]}x{v[1][0] if isinstance(v, tuple) else 1}"
                                                for v in f.values()))
def test_gather_every_row_width(layout, fields):
    # the copies switch on the row width (AoS records: a fixed-size copy for 8 to 128 bytes;
    # SoA fields: 1 to 64 bytes and multiples of 8 to 128; memcpy otherwise): widths on both
    # sides of each case copy exactly the row and leave the output's other rows alone
    spec = Spec(fields)
    st = make_storage(spec, 40, layout)
    data = random_rows(spec, 40, np.random.default_rng(3))
    st.write_rows(0, [data[n] for n in spec.names], 0, 40)
    idx = np.random.default_rng(4).integers(0, 40, 25)
    out = st.new_output(27)
    for name in spec.names:
        out.fields[name][25:] = 0xA5 if out.fields[name].dtype != bool else True
    st.gather(idx, out)
    ref = naive.gather_fields(data, idx)
    for name in spec.names:
        np.testing.assert_array_equal(out.fields[name][:25], ref[name], err_msg=name)
        assert (out.fields[name][25:] == (0xA5 if out.fields[name].dtype != bool else True)).all()
    s = UniformSampler(5)
    key, counter = naive.key_of(5), 0
    for n in (1, 17, 40):
        st.kernels.sample_uniform(st.kernel_store, n, s.state, out.indices, out.kernel_out)
        ref_idx, counter = naive.draw_indices(key, counter, n, 27)
        np.testing.assert_array_equal(out.indices, ref_idx)
        ref = naive.gather_fields(data, ref_idx)
        for name in spec.names:
            np.testing.assert_array_equal(out.fields[name], ref[name], err_msg=name)
