"""Field projection: ``sample(batch, fields=[...])``, ``sample_sequences(..., fields=)``,
``SharedReplayBuffer.sample(fields=)`` and ``DataLoader(..., fields=)``.

A projected batch is the full batch restricted to the named fields: the same slots, the same
random numbers consumed, the same weights, versions and discounts, for every sampler and
transform, and bit for bit the same on both layouts. The projection kernels
(:mod:`tfdata.kernels.spans`) are checked against ``naive.gather_spans`` (the bytes) and the rows'
field values (numpy's indexing).
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import time
import tracemalloc

import numpy as np
import pytest

import tfdata
from tfdata import PrioritizedReplayBuffer, ReplayBuffer, Spec, SpecError, alloc
from tfdata import kernels
from tfdata.replay.samplers import Sampler
from tfdata.replay.samplers.uniform import UniformSampler
from tfdata.shared import SharedReplayBuffer, SharedWriter
from tfdata.storage import Projection, make_storage

from . import naive
from .conftest import CARTPOLE, LAYOUTS, ODD, random_rows
from .test_episodes import BYTES, Streams

ODD_SPEC = Spec(ODD)
CART = Spec(CARTPOLE)


#: the numbers of fields the tests project: the projection kernels compile once per number of
#: fields (a tuple of that length), and every path is taken by one, two or three fields; each
#: further count would compile every projection kernel again for the same paths
PROJECTED = (1, 2, 3)


def subsets(names, per_size: int = 3, seed: int = 0) -> list:
    """Up to ``per_size`` subsets of ``names`` of each size of :data:`PROJECTED`, each in a
    shuffled order (the order asked for need not be the spec's)."""
    rng = np.random.default_rng(seed)
    out = []
    for k in PROJECTED:
        combos = list(itertools.combinations(names, k))
        for i in rng.permutation(len(combos))[:per_size]:
            c = list(combos[i])
            rng.shuffle(c)
            out.append(c)
    return out


def filled_storage(layout, spec, capacity, seed=0):
    st = make_storage(spec, capacity, layout)
    data = random_rows(spec, capacity, np.random.default_rng(seed))
    st.write_rows(0, [data[n] for n in spec.names], 0, capacity)
    return st, data


def numpy_spans(st, spec, layout, names):
    """The storage's memory as numpy describes it (not as the storage does): byte bases and
    ``(base, offset, width)`` of every field of ``names``."""
    if layout == "aos":
        rec = st.data
        return ([rec.view(np.uint8).reshape(len(rec), rec.dtype.itemsize)],
                [(0, rec.dtype.fields[n][1], spec[n].nbytes) for n in names])
    cols = [st.field(n).reshape(st.capacity, -1).view(np.uint8) for n in spec.names]
    return cols, [(spec.names.index(n), 0, spec[n].nbytes) for n in names]


def row_bytes(arr):
    return arr.reshape(arr.shape[0], -1).view(np.uint8)


def canary(out, start: int) -> None:
    for arr in out.fields.values():
        row_bytes(arr)[start:] = 0xA5


def assert_canary(out, start: int) -> None:
    for name, arr in out.fields.items():
        assert (row_bytes(arr)[start:] == 0xA5).all(), f"{name}: a row past the batch was written"


# -- the kernels ---------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("names", subsets(ODD_SPEC.names, per_size=2), ids=lambda n: "".join(n))
@pytest.mark.parametrize("batch", [1, 5, 64])
def test_gather_spans_matches_the_references(layout, names, batch):
    st, data = filled_storage(layout, ODD_SPEC, 33)
    proj = st.project(ODD_SPEC.select(names))
    assert proj.kernels is kernels.spans
    idx = np.random.default_rng(batch).integers(0, 33, batch)
    out = proj.new_output(batch + 2)
    canary(out, batch)
    proj.gather(idx, out)
    bases, spans = numpy_spans(st, ODD_SPEC, layout, proj.names)
    for name, got, want in zip(proj.names, out.kernel_out, naive.gather_spans(bases, spans, idx)):
        np.testing.assert_array_equal(got[:batch], want, err_msg=name)
    for name in proj.names:
        np.testing.assert_array_equal(out.fields[name][:batch], data[name][idx], err_msg=name)
        assert out.fields[name].flags.c_contiguous and out.fields[name].dtype == ODD_SPEC[name].dtype
    assert list(out.fields) == [n for n in ODD_SPEC.names if n in names]
    assert_canary(out, batch)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("capacity", [1, 7, 33])
def test_sample_uniform_spans_matches_the_reference(layout, capacity):
    st, data = filled_storage(layout, ODD_SPEC, capacity)
    for names in subsets(ODD_SPEC.names, per_size=1, seed=capacity):
        proj = st.project(ODD_SPEC.select(names))
        s = UniformSampler(99)
        out = proj.new_output(40)
        key, counter = naive.key_of(99), 0
        for n in range(1, capacity + 1):
            proj.kernels.sample_uniform(proj.kernel_store, n, s.state, out.indices, out.kernel_out)
            ref_idx, counter = naive.draw_indices(key, counter, n, 40)
            np.testing.assert_array_equal(out.indices, ref_idx)
            assert s.counter == counter
            for name in proj.names:
                np.testing.assert_array_equal(out.fields[name], data[name][ref_idx], err_msg=name)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("capacity", [1, 7, 33])
def test_sample_prioritized_spans_matches_the_reference(layout, capacity):
    st, data = filled_storage(layout, ODD_SPEC, capacity)
    n = max(1, capacity // 2)
    rng = np.random.default_rng(capacity)
    leaves = np.zeros(capacity)
    leaves[:n] = rng.integers(0, 9, n) + 0.5
    sums, mm, lv = naive.block_tree(leaves, naive.tree_leaves(capacity))
    version = (np.arange(capacity) * 3).astype(np.uint8)
    batch = 5
    for names in subsets(ODD_SPEC.names, per_size=1, seed=capacity):
        proj = st.project(ODD_SPEC.select(names))
        state = np.array([naive.key_of(7), 0], np.uint64)
        idx, u = np.empty(batch, np.int64), np.empty(batch)
        weights, versions = np.empty(batch, np.float32), np.empty(batch, np.uint32)
        out = proj.new_output(batch + 3)
        canary(out, batch)
        ret = proj.kernels.sample_prioritized(proj.kernel_store, n, sums, mm, lv, version, capacity,
                                              state, 0.7, idx, u, weights, versions, out.kernel_out)
        ref, counter = naive.stratified_slots(naive.key_of(7), 0, leaves, batch, n)
        assert ret == 0 and int(state[1]) == counter
        np.testing.assert_array_equal(idx, ref)
        np.testing.assert_allclose(weights, ((leaves[:n].min() / leaves[ref]) ** 0.7).astype(np.float32),
                                   rtol=1e-6)
        np.testing.assert_array_equal(versions, version[ref])
        for name in proj.names:
            np.testing.assert_array_equal(out.fields[name][:batch], data[name][ref], err_msg=name)
        assert_canary(out, batch)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("case", ["idle", "writing"])
def test_sample_shared_spans_matches_the_reference(layout, case):
    """As the whole-row test in test_kernels: draws landing on slots being written are drawn
    again one at a time, and the redrawn rows' projected fields are copied to their places."""
    cap, heads = 7, np.array([3, 7, 12], np.uint64)
    st, data = filled_storage(layout, ODD_SPEC, 3 * cap)
    reserved = heads.copy()
    busy = set()
    if case == "writing":
        reserved[1] += 2
        reserved[2] += 3
        busy = {7, 8, 19, 20, 14}
    batch = 15
    for names in subsets(ODD_SPEC.names, per_size=1, seed=3):
        proj = st.project(ODD_SPEC.select(names))
        state = np.array([naive.key_of(11), 4], np.uint64)
        scratch = np.zeros(7 * 3 + batch, np.int64)
        idx = np.full(batch, -1, np.int64)
        out = proj.new_output(batch + 3)
        canary(out, batch)
        ret = proj.kernels.sample_shared(proj.kernel_store, heads, reserved, cap, scratch, state, idx,
                                         out.kernel_out, 1000)
        ref, counter, redraws = naive.shared_sample_redrawn(naive.key_of(11), 4, [3, 7, 7], cap,
                                                            batch, busy, 1000)
        assert ret == redraws and int(state[1]) == counter
        assert (redraws > 0) == (case == "writing")
        np.testing.assert_array_equal(idx, ref)
        for name in proj.names:
            np.testing.assert_array_equal(out.fields[name][:batch], data[name][ref], err_msg=name)
        assert_canary(out, batch)


WIDTHS = (1, 2, 5, 7, 9, 63, 64, 65, 72, 127, 128, 129, 200)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_spans_of_every_width(layout):
    # the span copy switches on the width (1 to 64 bytes and multiples of 8 to 128 by fixed-size
    # copies, memcpy otherwise), at every offset a record puts a field at
    spec = Spec({f"w{w}": ("u1", (w,)) for w in WIDTHS} | {"x": "i8"})
    st, data = filled_storage(layout, spec, 40, seed=5)
    idx = np.random.default_rng(4).integers(0, 40, 25)
    for names in [[n] for n in spec.names] + subsets(spec.names, per_size=2, seed=1):
        proj = st.project(spec.select(names))
        out = proj.new_output(27)
        canary(out, 25)
        proj.gather(idx, out)
        bases, spans = numpy_spans(st, spec, layout, proj.names)
        for name, got, want in zip(proj.names, out.kernel_out, naive.gather_spans(bases, spans, idx)):
            np.testing.assert_array_equal(got[:25], want, err_msg=name)
            np.testing.assert_array_equal(out.fields[name][:25], data[name][idx], err_msg=name)
        assert_canary(out, 25)


def test_a_span_outside_its_rows_copies_nothing_and_is_refused_when_built():
    base = np.arange(10 * 16, dtype=np.uint8).reshape(10, 16)
    idx = np.arange(10, dtype=np.int64)
    for offset in (-1, 9, 16, 1 << 40):  # 8 bytes from there leave the 16-byte rows
        out = np.full((10, 8), 0xA5, np.uint8)
        kernels.spans.gather(((base, offset),), idx, (out,))
        assert (out == 0xA5).all(), offset
    out = np.zeros((10, 8), np.uint8)
    kernels.spans.gather(((base, 8),), idx, (out,))  # the last 8 bytes: in range
    np.testing.assert_array_equal(out, base[:, 8:])
    spec = Spec({"x": ("u1", (8,))})
    a = alloc.resolve(None)
    for span, bases in [((0, 9, 8), (base,)), ((0, -1, 8), (base,)), ((0, 0, 7), (base,)),
                        ((0, 0, 8), (base[:, ::2],)), ((0, 0, 8), (base.view(np.uint16),))]:
        with pytest.raises(ValueError, match="'x': span"):
            Projection(spec, ["x"], bases, {"x": span}, a)


# -- buffers: the projected batch is the full batch restricted --------------------------------
def assert_restricted(proj, full, names) -> None:
    """``proj`` is ``full`` restricted to ``names``: fields, slots and what the parts add."""
    assert list(proj.keys()) == [n for n in full.keys() if n in names]
    for n in proj:
        np.testing.assert_array_equal(proj[n], full[n], err_msg=n)
        assert proj[n].dtype == full[n].dtype and proj[n].shape == full[n].shape, n
        # a column, or (a group of a grouping held whole) a field of one record block
        assert proj[n].flags.c_contiguous or any(np.may_share_memory(proj[n], proj[m])
                                                 for m in proj if m != n), n
    np.testing.assert_array_equal(proj.indices, full.indices)
    for attr in ("weights", "versions", "discounts", "mask"):
        a, b = getattr(proj, attr), getattr(full, attr)
        assert (a is None) == (b is None), attr
        if a is not None:
            np.testing.assert_array_equal(a, b, err_msg=attr)


def two_buffers(cls, spec, rows, layout="aos", layout2=None, capacity=None, **kw):
    capacity = capacity or len(next(iter(rows.values())))
    a = cls(spec, capacity, layout=layout, seed=7, **kw)
    b = cls(spec, capacity, layout=layout2 or layout, seed=7, **kw)
    a.extend(rows)
    b.extend(rows)
    return a, b


@pytest.mark.parametrize("spec", [CART, ODD_SPEC], ids=["cartpole", "odd"])
@pytest.mark.parametrize("batch", [1, 7, 50])
def test_uniform_projection_is_the_full_batch_restricted(layout, spec, batch):
    rows = random_rows(spec, 50, np.random.default_rng(1))
    a, b = two_buffers(ReplayBuffer, spec, rows, layout)
    for names in subsets(spec.names, per_size=3):
        # each buffer alternates full and projected samples: a projected sample must use the
        # random numbers exactly as a full one does, or the next batches would differ
        assert_restricted(b.sample(batch, fields=names), a.sample(batch), names)
        assert_restricted(a.sample(batch, fields=names), b.sample(batch), names)
        assert a.sampler.counter == b.sampler.counter
    assert_restricted(b.sample(batch, fields=tuple(spec.names)), a.sample(batch), spec.names)


@pytest.mark.parametrize("spec", [CART, ODD_SPEC], ids=["cartpole", "odd"])
def test_projected_batches_are_the_same_bits_on_both_layouts(spec):
    rows = random_rows(spec, 64, np.random.default_rng(2))
    a, b = two_buffers(ReplayBuffer, spec, rows, "aos", "soa")
    for names in subsets(spec.names, per_size=4, seed=2):
        pa, pb = a.sample(16, fields=names), b.sample(16, fields=names)
        assert list(pa) == list(pb)
        for n in pa:
            assert pa[n].dtype == pb[n].dtype and pa[n].tobytes() == pb[n].tobytes(), n
        np.testing.assert_array_equal(pa.indices, pb.indices)


def test_a_projection_reuses_its_ring_whatever_order_or_container():
    rows = random_rows(CART, 64, np.random.default_rng(3))
    buf = ReplayBuffer(CART, 64, seed=0)
    buf.extend(rows)
    buf.sample(8, fields=["obs", "reward"])
    grown = buf.nbytes_parts["output_rings"]
    for fields in (("reward", "obs"), ["reward", "obs"], iter(["obs", "reward"]),
                   {"obs": 1, "reward": 2}.keys()):
        b = buf.sample(8, fields=fields)
        assert list(b) == ["obs", "reward"]
    assert buf.nbytes_parts["output_rings"] == grown
    buf.sample(8, fields=["reward"])
    assert buf.nbytes_parts["output_rings"] > grown


@pytest.mark.parametrize("layout", LAYOUTS)
def test_prioritized_projection_is_the_full_batch_restricted(layout):
    rows = random_rows(ODD_SPEC, 60, np.random.default_rng(4))
    a, b = two_buffers(PrioritizedReplayBuffer, ODD_SPEC, rows, layout, beta_steps=40)
    rng = np.random.default_rng(5)
    for names in subsets(ODD_SPEC.names, per_size=3, seed=4):
        full, proj = a.sample(9), b.sample(9, fields=names)
        assert_restricted(proj, full, names)
        assert a.beta == b.beta
        p = rng.random(9) * 3
        a.update_priorities(full, p)
        b.update_priorities(proj, p)  # the projected batch's slots and versions work as well
        np.testing.assert_array_equal(a.priorities(), b.priorities())
        assert_restricted(a.sample(9, fields=names), b.sample(9), names)


NSTEP_CONFIGS = {
    "nstep": (ReplayBuffer, {"n_step": 3}),
    "elide": (ReplayBuffer, {"elide_next": True}),
    "nstep+elide": (ReplayBuffer, {"n_step": 3, "elide_next": True}),
    "per-nstep+elide": (PrioritizedReplayBuffer, {"n_step": 2, "elide_next": True}),
    "nstep-envs": (ReplayBuffer, {"n_step": 4, "num_envs": 2}),
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("config", list(NSTEP_CONFIGS))
@pytest.mark.parametrize("spec", [CART, BYTES], ids=["cartpole", "bytes"])
def test_nstep_and_elision_projections_are_the_full_batch_restricted(layout, config, spec):
    """Every subset of the fields of up to three (:data:`PROJECTED`), those that leave out what
    n-step rewrites (reward, flags, next_obs) or what elision reads (obs) included: n-step and
    elision read those from storage or write them to scratch, and the batch equals the full one
    restricted."""
    cls, kw = NSTEP_CONFIGS[config]
    envs = kw.get("num_envs", 1)
    rows = Streams(spec, envs, np.random.default_rng(6)).steps(90 // envs)
    a, b = two_buffers(cls, spec, rows, layout, capacity=64, **kw)
    combos = [list(c) for k in PROJECTED for c in itertools.combinations(spec.names, k)]
    for names in combos:
        assert_restricted(b.sample(6, fields=names), a.sample(6), names)
    assert_restricted(a.sample(64, fields=["next_obs"]), b.sample(64), ["next_obs"])


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("policy", ["mask", "reject"])
@pytest.mark.parametrize("config", ["plain", "elide", "prioritized"])
def test_sequence_projections_are_the_full_slices_restricted(layout, policy, config):
    cls, kw = {"plain": (ReplayBuffer, {}), "elide": (ReplayBuffer, {"elide_next": True}),
               "prioritized": (PrioritizedReplayBuffer, {"elide_next": True})}[config]
    rows = Streams(CART, 1, np.random.default_rng(7), p_term=0.05, p_trunc=0.02).steps(80)
    a, b = two_buffers(cls, CART, rows, layout, capacity=64, **kw)
    for names in subsets(CART.names, per_size=2, seed=7):
        assert_restricted(b.sample_sequences(4, 5, policy=policy, fields=names),
                          a.sample_sequences(4, 5, policy=policy), names)
        assert_restricted(a.sample_sequences(3, 2, policy=policy, fields=names),
                          b.sample_sequences(3, 2, policy=policy), names)


def test_a_spilling_buffer_projects_too(tmp_path, layout):
    rows = Streams(CART, 1, np.random.default_rng(13)).steps(300)
    path = str(tmp_path / ("spill.npy" if layout == "aos" else "spill"))
    a = ReplayBuffer(CART, 256, layout=layout, seed=2, n_step=2)
    b = ReplayBuffer(CART, 256, layout=layout, seed=2, n_step=2, spill_path=path, hot_rows=64)
    a.extend(rows)
    b.extend(rows)
    for names in subsets(CART.names, per_size=2, seed=13):
        assert_restricted(b.sample(32, fields=names), a.sample(32), names)


def test_projected_steady_state_allocates_nothing(layout):
    buf = ReplayBuffer(CART, 5000, layout=layout, seed=0, n_step=3)
    rows = Streams(CART, 1, np.random.default_rng(0)).steps(1000)
    buf.extend(rows)
    lists = [["obs"], ["reward", "next_obs"], ("action",)]
    for _ in range(3):
        for f in lists:
            buf.sample(256, fields=f)
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        for _ in range(300):
            buf.extend(rows)
            for f in lists:
                buf.sample(256, fields=f)
        current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert current - base < 1024, current - base
    assert peak - base < 2048, peak - base


# -- bad input -----------------------------------------------------------------------------------
BAD_FIELDS = [
    (["obs", "nope"], "unknown field 'nope'"),
    (["obsv"], "unknown field 'obsv'; did you mean 'obs'"),
    ([], "at least one field name"),
    ((), "at least one field name"),
    (["obs", "obs"], "'obs' is named twice"),
    (["obs", 3], "must be str, got int 3"),
    ([None], "must be str, got NoneType"),
    ([["obs"]], "must be str, got list"),
    ("obs", r"got the string 'obs'; for one field write \['obs'\]"),
    (3, "expected a list of field names, got int 3"),
]


def rings_of(buf) -> set:
    return set(getattr(buf._local, "rings", {}))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("fields,match", BAD_FIELDS)
def test_bad_fields_are_refused_before_anything_changes(layout, fields, match):
    for buf in (ReplayBuffer(CART, 32, layout=layout, seed=1, n_step=2),
                PrioritizedReplayBuffer(CART, 32, layout=layout, seed=1)):
        buf.extend(random_rows(CART, 32, np.random.default_rng(0)))
        buf.sample(4)
        before = (buf.nbytes_parts, buf.sampler.counter, rings_of(buf),
                  buf.state_dict()["data"]["obs"].tobytes())
        with pytest.raises(SpecError, match=match):
            buf.sample(4, fields=fields)
        with pytest.raises(SpecError, match=match):
            buf.sample(4, fields=fields)  # and again: nothing was cached on the way
        if buf.episodes is not None:
            with pytest.raises(SpecError, match=match):
                buf.sample_sequences(2, 3, fields=fields)
        assert (buf.nbytes_parts, buf.sampler.counter, rings_of(buf),
                buf.state_dict()["data"]["obs"].tobytes()) == before


def test_too_large_a_projected_batch_allocates_nothing():
    buf = ReplayBuffer(CART, 32, seed=1)
    buf.extend(random_rows(CART, 10, np.random.default_rng(0)))
    before = buf.nbytes_parts
    with pytest.raises(ValueError, match="larger than the 10 rows held"):
        buf.sample(11, fields=["obs"])
    with pytest.raises(ValueError, match="batch_size"):
        buf.sample(0, fields=["obs"])
    with pytest.raises(TypeError, match="batch_size must be an int, got float"):
        buf.sample(2.0, fields=["obs"])
    assert buf.nbytes_parts == before and not rings_of(buf)


class WholeRowSampler(Sampler):
    """A sampler of the contract before projections: gathers through the storage."""

    def sample(self, n, out, arrays) -> None:
        out.indices[:] = np.arange(out.indices.shape[0]) % n
        self.storage.gather(out.indices, out)


def test_a_sampler_that_does_not_project_is_refused():
    buf = ReplayBuffer(CART, 16, sampler=WholeRowSampler(0))
    buf.extend(random_rows(CART, 16, np.random.default_rng(0)))
    buf.sample(4)
    before = buf.nbytes_parts
    with pytest.raises(NotImplementedError, match="WholeRowSampler does not gather projected"):
        buf.sample(4, fields=["obs"])
    assert buf.nbytes_parts == before


# -- memory: plans and budgets --------------------------------------------------------------------
MEMORY_CONFIGS = {
    "uniform": (ReplayBuffer, {}),
    "prioritized": (PrioritizedReplayBuffer, {}),
    "nstep": (ReplayBuffer, {"n_step": 3}),
    "elide": (ReplayBuffer, {"elide_next": True}),
    "per_nstep_elided": (PrioritizedReplayBuffer, {"n_step": 2, "elide_next": True}),
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("config", list(MEMORY_CONFIGS))
def test_projected_rings_are_what_the_plan_predicts(layout, config):
    cls, kw = MEMORY_CONFIGS[config]
    rows = Streams(CART, 1, np.random.default_rng(8)).steps(40)
    asks = [(5, None, ["obs"]), (5, None, ["next_obs"]), (3, None, ["reward", "terminated"]),
            (1, None, ["truncated", "action", "next_obs"]), (2, 4, ["next_obs", "obs"])]
    with alloc.open("numpy") as a:
        buf = cls(CART, 40, layout=layout, seed=0, allocator=a, **kw)
        buf.extend(rows)
        for b, length, fields in asks:
            if length is None:
                buf.sample(b, fields=fields)
            else:
                buf.sample_sequences(b, length, fields=fields)
        want = cls.plan_memory(CART, 40, layout=layout, batch_sizes=asks, **kw)
        got = buf.nbytes_parts
        if kw.get("elide_next"):  # the final-value table grows with the episode ends held
            assert got.pop("bookkeeping") >= want.pop("bookkeeping")
        assert got == want
        assert a.live_bytes == buf.nbytes


def test_a_projected_ring_over_budget_is_refused_and_nothing_changes():
    plan = ReplayBuffer.plan_memory(ODD_SPEC, 100, batch_sizes=[(16, None, ["a", "d"])])
    buf = ReplayBuffer(ODD_SPEC, 100, seed=4, memory_budget=sum(plan.values()))
    ref = ReplayBuffer(ODD_SPEC, 100, seed=4)
    rows = random_rows(ODD_SPEC, 100, np.random.default_rng(3))
    buf.extend(rows)
    ref.extend(rows)
    buf.sample(16, fields=["d", "a"])
    with pytest.raises(tfdata.MemoryBudgetError, match=r"of fields \['a', 'f'\]"):
        buf.sample(16, fields=["a", "f"])
    ref.sample(16)
    assert sum(buf.nbytes_parts.values()) == sum(plan.values())
    assert_restricted(buf.sample(16, fields=["a", "d"]), ref.sample(16), ["a", "d"])


# -- the data loader -------------------------------------------------------------------------------
def datasets(tmp_path, spec, rows):
    out = []
    for layout in LAYOUTS:
        out.append(tfdata.ArrayDataset(rows, layout=layout))
        path = str(tmp_path / (f"d.npy" if layout == "aos" else "d"))
        tfdata.io.save(path, rows, layout=layout)
        out.append(tfdata.MmapDataset.open(path))
    return out


@pytest.mark.parametrize("shuffle", [False, True, "block"])
@pytest.mark.parametrize("zero_copy", [True, False])
@pytest.mark.parametrize("prefetch", [0, 2])
def test_loader_projection_is_the_full_batches_restricted(tmp_path, shuffle, zero_copy, prefetch):
    rows = random_rows(ODD_SPEC, 300, np.random.default_rng(9))
    opts = dict(shuffle=shuffle, seed=3, prefetch=prefetch, zero_copy=zero_copy,
                block_rows=7, window_blocks=4)
    for ds in datasets(tmp_path, ODD_SPEC, rows):
        for names in subsets(ODD_SPEC.names, per_size=1, seed=9):
            loader = tfdata.DataLoader(ds, 64, fields=names, **opts)
            assert loader.fields == ODD_SPEC.select(names)
            proj = [b.copy() for b in loader]
            full = [b.copy() for b in tfdata.DataLoader(ds, 64, **opts)]
            assert len(proj) == len(full) == 5
            for p, f in zip(proj, full):
                assert list(p) == [n for n in ODD_SPEC.names if n in names]
                for n in p:
                    np.testing.assert_array_equal(p[n], f[n], err_msg=n)
                    assert p[n].dtype == f[n].dtype, n
                np.testing.assert_array_equal(p.indices, f.indices)
            planned = loader._planned_parts(loader.source, loader.config, len(ds), 7)
            assert loader.nbytes_parts["output_ring"] == planned["output_ring"]
        ds.close()


def test_loader_projection_keeps_the_record_dtype():
    # a record array of another byte order: the bytes are copied as they are, and the projected
    # field reads them as the full batch does
    dt = np.dtype([("a", ">f4", (3,)), ("b", "<i2"), ("c", ">i8")])
    rec = np.zeros(50, dt)
    rng = np.random.default_rng(10)
    rec["a"] = rng.standard_normal((50, 3))
    rec["b"] = rng.integers(-99, 99, 50)
    rec["c"] = rng.integers(-99, 99, 50)
    ds = tfdata.ArrayDataset(rec)
    full = next(iter(tfdata.DataLoader(ds, 16, shuffle=True, seed=1)))
    proj = next(iter(tfdata.DataLoader(ds, 16, shuffle=True, seed=1, fields=["c", "a"])))
    for n in ("a", "c"):
        assert proj[n].dtype == full[n].dtype == dt[n].base
        np.testing.assert_array_equal(proj[n], full[n])


def test_loader_projection_reads_only_its_columns(tmp_path):
    rows = random_rows(ODD_SPEC, 300, np.random.default_rng(11))
    path = str(tmp_path / "cols")
    tfdata.io.save(path, rows, layout="soa")
    with tfdata.MmapDataset.open(path) as ds:
        proj = ds.project(["f", "a"])
        assert proj.mapped_nbytes == 300 * (ODD_SPEC["a"].nbytes + ODD_SPEC["f"].nbytes)
        assert proj.row_nbytes == ODD_SPEC["a"].nbytes + ODD_SPEC["f"].nbytes
        assert list(proj.rows(3, 5)) == ["a", "f"]
    path = str(tmp_path / "recs.npy")
    tfdata.io.save(path, rows, layout="aos")
    with tfdata.MmapDataset.open(path) as ds:
        assert ds.project(["f"]).mapped_nbytes == ds.mapped_nbytes  # records hold every field


@pytest.mark.parametrize("fields,match", BAD_FIELDS[:3] + BAD_FIELDS[4:5] + BAD_FIELDS[8:])
def test_loader_bad_fields_are_refused_before_anything_is_allocated(fields, match):
    rows = random_rows(CART, 64, np.random.default_rng(0))
    with alloc.open("numpy") as a:
        ds = tfdata.ArrayDataset(rows)
        with pytest.raises(SpecError, match=match):
            tfdata.DataLoader(ds, 8, shuffle=True, fields=fields, allocator=a)
        assert a.live_bytes == 0

    class Plain:  # a dataset of the contract without project()
        spec, row_nbytes = CART, 46

        def __len__(self):
            return 64

        gather = new_output = rows = None

    with pytest.raises(TypeError, match="Plain has no 'project'"):
        tfdata.DataLoader(Plain(), 8, fields=["obs"])


# -- shared memory ---------------------------------------------------------------------------------
@pytest.fixture
def shm_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TFDATA_SHM_DIR", str(tmp_path))
    return tmp_path


ID_SPEC = Spec({"id": "i8", "a": ("i8", (64,)), "b": "f8", "c": ("i2", (33,)), "d": "?"})


def id_rows(ids) -> dict:
    ids = np.asarray(ids, np.int64)
    return {"id": ids, "a": np.repeat(ids[:, None], 64, axis=1), "b": ids.astype(np.float64),
            "c": np.repeat((ids % 30000)[:, None], 33, axis=1).astype(np.int16), "d": ids % 2 == 1}


SHARED_CONFIGS = {"uniform": {}, "prioritized": {"prioritized": True}, "nstep": {"n_step": 3},
                  "prioritized-nstep": {"prioritized": True, "n_step": 2}}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("config", list(SHARED_CONFIGS))
def test_shared_projection_is_the_full_batch_restricted(layout, config, shm_dir):
    kw = SHARED_CONFIGS[config]
    rows = Streams(CART, 1, np.random.default_rng(12)).steps(100)
    with SharedReplayBuffer(CART, 80, num_writers=2, layout=layout, seed=4, **kw) as a, \
            SharedReplayBuffer(CART, 80, num_writers=2, layout=layout, seed=4, **kw) as b:
        for buf in (a, b):
            with SharedWriter(buf.name, 0) as w0, SharedWriter(buf.name, 1) as w1:
                w0.extend({k: v[:70] for k, v in rows.items()})
                w1.extend({k: v[70:] for k, v in rows.items()})
        for names in subsets(CART.names, per_size=2, seed=12):
            assert_restricted(b.sample(9, fields=names), a.sample(9), names)
            assert_restricted(a.sample(9, fields=names), b.sample(9), names)
            assert_restricted(b.sample_sequences(3, 4, fields=names), a.sample_sequences(3, 4), names)
        before = (b.nbytes_parts, b.sampler.counter, rings_of(b))
        for fields, match in BAD_FIELDS:
            with pytest.raises(SpecError, match=match):
                b.sample(9, fields=fields)
            with pytest.raises(SpecError, match=match):
                b.sample_sequences(3, 4, fields=fields)
        assert (b.nbytes_parts, b.sampler.counter, rings_of(b)) == before


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("prioritized", [False, True])
def test_shared_redraws_copy_the_projected_fields_again(layout, prioritized, shm_dir):
    """Draws that land on slots a writer is writing are drawn again; the redrawn rows' projected
    fields are copied again (else the batch would hold the slot being written)."""
    with SharedReplayBuffer(ID_SPEC, 14, num_writers=2, layout=layout, seed=4,
                            prioritized=prioritized) as buf:
        with SharedWriter(buf.name, 0) as w0:
            w0.extend(id_rows(range(3)))
        w = SharedWriter(buf.name, 1)
        w.extend(id_rows(100 + np.arange(10)))
        buf.sample(10)  # folds the published rows (prioritized) before the slots go in flight
        buf._k.shard_begin(w._words, 12)  # rows 10, 11 begun: slots 10 and 11 in flight
        redrawn = 0
        for _ in range(20):
            start = buf.sampler.state.copy()
            redraws = buf.redraws
            full = buf.sample(10).copy()
            after = buf.sampler.state.copy()
            buf.sampler.state[:] = start
            proj = buf.sample(10, fields=["b", "id"])
            assert_restricted(proj, full, ["b", "id"])
            np.testing.assert_array_equal(buf.sampler.state, after)
            assert not set(proj.indices.tolist()) & {10, 11}
            assert set(proj["id"].tolist()) <= {0, 1, 2} | set(range(105, 110))
            np.testing.assert_array_equal(proj["b"], proj["id"])
            redrawn += buf.redraws - redraws
        assert redrawn > 0  # some draws did land in flight
        w.close()


def _replay_worker(name, shard, stop, errors):
    try:
        with SharedWriter(name, shard) as w:
            i = 0
            while not stop.is_set():
                w.extend(id_rows(np.arange(i, i + 64) + 1_000_000 * shard))
                i += 64
    except BaseException as exc:
        errors.put(f"shard {shard}: {exc!r}")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_no_torn_projected_rows_while_worker_processes_write(layout, shm_dir):
    """Two processes overwrite their rings while the learner samples two of five fields: every
    projected row is whole (the control reads the same memory without the protocol and sees
    mixed rows, so the test can fail)."""
    fork = mp.get_context("fork")
    errors, stop = fork.Queue(), fork.Event()
    with SharedReplayBuffer(ID_SPEC, 2 * 512, num_writers=2, layout=layout, seed=0) as buf:
        procs = [fork.Process(target=_replay_worker, args=(buf.name, s, stop, errors)) for s in range(2)]
        for p in procs:
            p.start()
        try:
            deadline = time.monotonic() + 60
            while len(buf) < 2 * 512 and time.monotonic() < deadline and errors.empty():
                time.sleep(0.01)
            buf.sample(256, fields=["a", "id"])
            ids, a = buf.storage.field("id"), buf.storage.field("a")
            sampled = torn_raw = 0
            # until half a million rows were checked (some 0.25 s on an idle machine), the control
            # saw a torn row and the protocol redrew one: a count, not a time; the cap ends a hang
            deadline = time.monotonic() + 300
            while (sampled < 500_000 or torn_raw == 0 or buf.redraws == 0) and time.monotonic() < deadline:
                b = buf.sample(256, fields=["a", "id"])
                ok = (b["a"] == b["id"][:, None]).all(1)
                assert ok.all(), b["id"][~ok]
                sampled += 256
                idx = np.random.default_rng(sampled).integers(0, 1024, 256)
                raw_id = ids[idx]
                torn_raw += int((~(a[idx] == raw_id[:, None]).all(1)).sum())
        finally:
            stop.set()
            for p in procs:
                p.join(30)
        assert errors.empty(), errors.get()
        redraws = buf.redraws
    assert sampled >= 500_000
    assert torn_raw > 0, "the control saw no torn row: the writers did not race the reader"
    assert redraws > 0, "no row was ever redrawn: the writers did not race the protected reads"
