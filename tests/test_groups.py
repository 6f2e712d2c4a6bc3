"""Column groups: ``layout=[["obs", "action", ...], ["next_obs"], ...]``.

Fields grouped into record arrays, each group stored as AoS, the groups side by side as SoA. The
same seed gives the same batches, bit for bit, as ``"aos"`` and ``"soa"`` for every sampler and
transform (uniform, prioritized, n-step, elision, sequences, projections), through spilling
files, checkpoints (across layouts), datasets and the loader, and shared memory with writer
processes. Bad groupings are refused, naming the field, before anything is allocated or
written. The end of the file runs tests of other files on groupings of their specs.
"""

from __future__ import annotations

import gc
import json
import multiprocessing as mp
import os
import time

import numpy as np
import pytest

import tfdata
from tfdata import PrioritizedReplayBuffer, ReplayBuffer, Spec, SpecError, alloc
from tfdata.dataset import ArrayDataset, MmapDataset
from tfdata.errors import FormatError
from tfdata.shared import SharedReplayBuffer, SharedWriter
from tfdata.storage import (GroupStorage, group_dtype, make_storage, output_nbytes, resolve_layout,
                            storage_nbytes)

from . import naive
from .conftest import CARTPOLE, ODD, assert_batches_equal, random_rows
from .test_checkpoint import Streams as CartStreams
from .test_nothing_lost import snapshot
from .test_projection import subsets

CART = Spec(CARTPOLE)
ODDS = Spec(ODD)
HOT = ["obs", "action", "reward", "terminated", "truncated"]
FORK = mp.get_context("fork")


def _same_memory(a: np.ndarray, b: np.ndarray) -> bool:
    """``b`` is ``a`` or a view of the same bytes (a projection reads read-only views)."""
    return (a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
            and a.shape == b.shape and a.strides == b.strides)


def mixed(spec: Spec) -> tuple:
    """A grouping of any spec that mixes groups of several fields, not adjacent in the spec,
    with fields alone: the fields at even positions, those at odd positions but the last, and
    that one alone."""
    names = list(spec.names)
    groups = [names[::2]]
    if len(names[1::2]) > 1:
        groups.append(names[1::2][:-1])
    return resolve_layout(groups, spec)


GROUPINGS = {
    "cart-hot": (CART, [HOT, ["next_obs"]]),
    "cart-mixed": (CART, mixed(CART)),
    "cart-partial": (CART, [["next_obs", "reward"]]),  # the others: each a group of its own
    "cart-one": (CART, [list(CART.names)]),
    "odd-widths": (ODDS, [["a", "d", "e"], ["f"], ["b", "c"]]),
    "odd-mixed": (ODDS, mixed(ODDS)),
    "odd-singles": (ODDS, [[n] for n in ODDS.names]),
}


@pytest.fixture(params=list(GROUPINGS))
def grouped(request):
    """``(spec, grouping)``."""
    return GROUPINGS[request.param]


def layouts(grouping) -> list:
    return ["aos", "soa", grouping]


def same_bits(a, b, names) -> None:
    for k in names:
        x, y = np.ascontiguousarray(a[k]), np.ascontiguousarray(b[k])
        assert x.dtype == y.dtype and x.shape == y.shape, k
        assert x.tobytes() == y.tobytes(), k  # bytes: NaN- and -0.0-safe


def same_batches(batches: list, names=None) -> None:
    first = batches[0]
    names = list(first.keys()) if names is None else names
    for other in batches[1:]:
        np.testing.assert_array_equal(first.indices, other.indices)
        assert list(other.keys()) == list(first.keys())
        same_bits(first, other, names)
        for attr in ("weights", "versions", "discounts", "mask"):
            x, y = getattr(first, attr, None), getattr(other, attr, None)
            assert (x is None) == (y is None), attr
            if x is not None:
                assert np.asarray(x).tobytes() == np.asarray(y).tobytes(), attr


# -- the grouping: normal form and refusals -------------------------------------------------------
def test_a_grouping_is_normalised_and_rebuilds_the_same_storage():
    got = resolve_layout([["truncated", "obs"], ["reward"]], CART)
    # groups as given, each group's fields in spec order, the rest each alone in spec order
    assert got == (("obs", "truncated"), ("reward",), ("action",), ("next_obs",), ("terminated",))
    assert resolve_layout(got, CART) == got
    assert resolve_layout((("truncated", "obs"), ["reward"]), CART) == got  # tuples too
    buf = ReplayBuffer(CART, 8, layout=[["truncated", "obs"], ["reward"]])
    assert buf.layout == got and buf.storage.layout == got
    again = ReplayBuffer(CART, 8, layout=buf.layout)
    assert again.layout == got
    assert [b.dtype for b in again.storage.blocks] == [b.dtype for b in buf.storage.blocks]
    assert resolve_layout("SoA", CART) == "soa"  # names as before
    assert repr(buf).endswith(f"layout={got!r}, fields={list(CART.names)})")


def test_elided_fields_leave_their_groups_but_not_the_layout():
    g = [["obs", "next_obs"], ["reward", "action"]]
    buf = ReplayBuffer(CART, 16, layout=g, elide_next=True)
    assert buf.layout == (("obs", "next_obs"), ("action", "reward"), ("terminated",), ("truncated",))
    assert buf.storage.layout == (("obs",), ("action", "reward"), ("terminated",), ("truncated",))
    assert "next_obs" not in buf.storage.spec.names
    alone = ReplayBuffer(CART, 16, layout=[["next_obs"]], elide_next=True)  # its group goes
    assert alone.storage.layout == tuple((n,) for n in CART.names if n != "next_obs")


BAD = [
    ([["obs", "velocity"]], SpecError, r"group 0: unknown field 'velocity'"),
    ([["obs"], ["reward", "obs"]], SpecError, r"field 'obs' is in group 0 and in group 1"),
    ([["obs", "obs"]], SpecError, r"field 'obs' is twice in group 0"),
    ([["obs"], []], SpecError, r"group 1 is empty"),
    ([["obs", 3]], SpecError, r"group 0: field names must be str, got int 3"),
    (["obs", "reward"], SpecError, r"group 0: expected a list of field names, got str obs; for a "
                                   r"group of one field write \['obs'\]"),
    ([], ValueError, r"at least one group"),
    ([["obs"]] * 7, ValueError, r"7 groups for the 6 fields"),
    ([[f"x{i}" for i in range(7)]], SpecError, r"group 0 names 7 fields, the spec has 6"),
    ({"obs": 1}, ValueError, r"expected 'aos', 'soa' or a list of groups"),
    (3, ValueError, r"expected 'aos', 'soa' or a list of groups"),
    ("groups", ValueError, r"expected one of \('aos', 'soa'\)"),
]


@pytest.mark.parametrize("layout,error,match", BAD)
def test_bad_groupings_are_refused_before_anything_is_allocated(layout, error, match, tmp_path):
    with alloc.open("numpy") as a:
        for make in (lambda: ReplayBuffer(CART, 64, layout=layout, allocator=a),
                     lambda: PrioritizedReplayBuffer(CART, 64, layout=layout, allocator=a),
                     lambda: ReplayBuffer(CART, 64, layout=layout, allocator=a,
                                          spill_path=tmp_path / "spill", hot_rows=8),
                     lambda: ReplayBuffer.plan_memory(CART, 64, layout=layout),
                     lambda: tfdata.memory.max_capacity(CART, "1MB", layout=layout),
                     lambda: SharedReplayBuffer(CART, 64, layout=layout, dir=str(tmp_path)),
                     lambda: ArrayDataset(random_rows(CART, 4, np.random.default_rng(0)),
                                          layout=layout, allocator=a)):
            with pytest.raises(error, match=match):
                make()
        assert a.live_bytes == 0
    if not isinstance(layout, str):  # the file functions name no default layout
        for write in (lambda: tfdata.io.save(str(tmp_path / "d"), random_rows(CART, 4, np.random.default_rng(0)), layout),
                      lambda: tfdata.io.Writer(str(tmp_path / "d"), CART, layout),
                      lambda: tfdata.io.create(str(tmp_path / "d"), CART, 4, layout)):
            with pytest.raises(error, match=match):
                write()
    assert os.listdir(tmp_path) == []


def test_env_layout_stays_a_name(monkeypatch):
    monkeypatch.setenv("TFDATA_LAYOUT", "obs,action")
    with pytest.raises(ValueError, match="TFDATA_LAYOUT"):
        ReplayBuffer(CART, 4)


# -- the storage ------------------------------------------------------------------------------------
def test_group_storage_lays_out_records_and_columns(grouped):
    spec, grouping = grouped
    g = resolve_layout(grouping, spec)
    st = make_storage(spec, 17, g)
    assert isinstance(st, GroupStorage) and st.layout == g and st.kernels is tfdata.kernels.soa
    for grp, block, kb in zip(g, st.blocks, st.kernel_store):
        assert kb.dtype == np.uint8 and kb.flags.c_contiguous and kb.shape[0] == 17
        assert kb.ctypes.data == block.ctypes.data
        if len(grp) == 1:  # a plain column: scanning it reads nothing else
            f = spec[grp[0]]
            assert block.dtype == f.dtype and block.shape == (17,) + f.shape and block.flags.c_contiguous
            assert st.field(f.name) is block and kb.shape[1] == f.nbytes
        else:  # records: the fields in spec order at natural alignment, itemsize a multiple of 8
            want = np.dtype([(n, spec[n].dtype, spec[n].shape) for n in grp], align=True)
            assert block.dtype.names == grp and block.dtype.itemsize % 8 == 0
            assert [block.dtype.fields[n][1] for n in grp] == [want.fields[n][1] for n in grp]
            assert block.dtype == group_dtype(spec, grp) and kb.shape[1] == block.dtype.itemsize
    assert st.nbytes == storage_nbytes(spec, 17, g) == sum(kb.nbytes for kb in st.kernel_store)
    # spans say where numpy finds each field
    for name, (b, off, width) in st.spans().items():
        view = st.field(name)
        assert np.shares_memory(view, st.blocks[b])
        assert view.ctypes.data - st.blocks[b].ctypes.data == off and width == spec[name].nbytes
        assert st.field_offset(name) == off


def test_writes_through_every_path_land_in_the_fields(grouped):
    """write_row, write_rows (short and the opaque long path), the byte regions the generated
    push packs into, and the words the episode kernels read: all the same bytes."""
    spec, grouping = grouped
    st = make_storage(spec, 50, grouping)
    data = random_rows(spec, 50, np.random.default_rng(0))
    values = [data[n] for n in spec.names]
    st.write_rows(0, values, 0, 40)  # >= 32 rows: opaque items for shaped record fields
    st.write_rows(40, values, 40, 5)
    for i in range(45, 50):
        st.write_row(i, [v[i] for v in values])
    for n in spec.names:
        np.testing.assert_array_equal(st.field(n), data[n], err_msg=n)
    index = {n: i for i, n in enumerate(spec.names)}
    for raw, stride, members in st.byte_regions(3, 9):
        assert raw.dtype == np.uint8 and raw.shape == (6 * stride,)
        for i, off in members:
            f = spec[spec.names[i]]
            got = raw.reshape(6, stride)[:, off:off + f.nbytes]
            want = np.ascontiguousarray(data[f.name][3:9]).reshape(6, -1).view(np.uint8)
            np.testing.assert_array_equal(got, want, err_msg=f.name)
    assert sorted(i for _, _, m in st.byte_regions() for i, _ in m) == sorted(index.values())
    out = st.new_output(7)
    st.gather(np.arange(7, dtype=np.int64), out)
    for n in spec.names:
        for word in (1, 2, 4, 8):
            if st.field_offset(n) % word or spec[n].nbytes % word:
                continue
            for words, off, width in (st.field_words(n, word), st.output_words(out, n, word)):
                got = words[:7, off:off + width]
                want = np.ascontiguousarray(data[n][:7]).reshape(7, -1).view(np.uint8).view(words.dtype)
                np.testing.assert_array_equal(got, want, err_msg=(n, word))
    st.wipe()
    assert all((kb == 0).all() for kb in st.kernel_store)


@pytest.mark.parametrize("batch", [1, 5, 64])
def test_gather_and_projections_match_numpy_and_the_span_reference(grouped, batch):
    spec, grouping = grouped
    st = make_storage(spec, 33, grouping)
    data = random_rows(spec, 33, np.random.default_rng(batch))
    st.write_rows(0, [data[n] for n in spec.names], 0, 33)
    idx = np.random.default_rng(batch).integers(0, 33, batch)
    out = st.new_output(batch + 3)
    st.gather(idx, out)
    for n in spec.names:
        np.testing.assert_array_equal(out.fields[n][:batch], data[n][idx], err_msg=n)
    assert out.nbytes == output_nbytes(spec, batch + 3, st.layout)
    groups = [list(g) for g in st.layout]
    for names in subsets(spec.names, per_size=3) + groups + ([groups[0] + groups[-1]] if len(groups) > 1 else []):
        sel = spec.select(names)
        proj = st.project(sel)
        pout = proj.new_output(batch)
        proj.gather(idx, pout)
        for n in sel:
            np.testing.assert_array_equal(pout.fields[n], data[n][idx], err_msg=n)
        assert pout.nbytes == output_nbytes(spec, batch, st.layout, sel)
        kouts = pout.kernel_out if isinstance(pout.kernel_out, tuple) else (pout.kernel_out.view(np.uint8),)
        # a group held whole is one record block, copied whole; every other field a column
        for grp in st.layout:
            if len(grp) > 1 and set(grp) <= set(sel):
                block = next(k for k in kouts if np.shares_memory(k, pout.fields[grp[0]]))
                assert block.shape[1] == group_dtype(spec, grp).itemsize
                assert all(np.shares_memory(block, pout.fields[n]) for n in grp)
            else:
                for n in set(grp) & set(sel):
                    assert pout.fields[n].flags.c_contiguous
        if proj.kernels is tfdata.kernels.aos:  # one group alone: its records by the AoS kernels
            (k,) = [i for i, grp in enumerate(st.layout) if set(grp) == set(sel)]
            assert len(st.layout[k]) > 1 and proj.kernel_store.dtype == np.uint64
            assert np.shares_memory(proj.kernel_store, st.kernel_store[k])
            np.testing.assert_array_equal(kouts[0][:batch], st.kernel_store[k][idx])
            continue
        assert proj.kernels is tfdata.kernels.spans
        # the bytes each piece copies, by the pure-Python reference
        bases = list(st.byte_bases())
        spans = [(b, off, kout.shape[1]) for (kb, off), kout in zip(proj.kernel_store, pout.kernel_out)
                 for b in [next(i for i, x in enumerate(bases) if _same_memory(x, kb))]]
        for got, want in zip(pout.kernel_out, naive.gather_spans(bases, spans, idx)):
            np.testing.assert_array_equal(got[:batch], want)


def test_a_wrong_record_block_is_an_error_not_a_copy():
    st = make_storage(ODDS, 8, [["a", "d", "e"]])
    blocks = st.record_blocks()
    ((grp, (b, dtype)),) = blocks.items()
    spans = st.spans()
    bad = dict(spans, d=(b, spans["d"][1] + 1, spans["d"][2]))
    with pytest.raises(ValueError, match="record block"):
        tfdata.storage.Projection(ODDS, grp, st.byte_bases(), bad, st.allocator, blocks=blocks)
    narrow = {grp: (b, group_dtype(ODDS, ["a", "d"]))}
    with pytest.raises(ValueError, match="record block"):
        tfdata.storage.Projection(ODDS, grp, st.byte_bases(), spans, st.allocator, blocks=narrow)


# -- the same batches on the three layouts --------------------------------------------------------
def twins(cls, spec, grouping, capacity, **kw) -> list:
    return [cls(spec, capacity, layout=lay, seed=2024, **kw) for lay in layouts(grouping)]


def test_uniform_batches_are_the_same_bits(grouped):
    spec, grouping = grouped
    rng = np.random.default_rng(5)
    bufs = twins(ReplayBuffer, spec, grouping, 33)
    names = subsets(spec.names, per_size=2) + [list(g) for g in resolve_layout(grouping, spec)]
    for step in range(25):
        data = random_rows(spec, int(rng.integers(1, 9)), rng)
        for b in bufs:
            if step % 3 == 0:  # the generated push too
                for i in range(len(data[spec.names[0]])):
                    b.push({k: v[i] for k, v in data.items()})
            else:
                b.extend(data)
        n = int(rng.integers(1, len(bufs[0]) + 1))
        same_batches([b.sample(n) for b in bufs])
        fields = names[step % len(names)]
        same_batches([b.sample(n, fields=fields) for b in bufs])
        assert len({b.sampler.counter for b in bufs}) == 1


def test_prioritized_batches_weights_and_updates_are_the_same(grouped):
    spec, grouping = grouped
    rng = np.random.default_rng(6)
    bufs = twins(PrioritizedReplayBuffer, spec, grouping, 40, alpha=0.7, beta=0.4, beta_steps=30)
    for step in range(20):
        data = random_rows(spec, int(rng.integers(1, 12)), rng)
        for b in bufs:
            b.extend(data)
        n = min(len(bufs[0]), 9)
        full = [b.sample(n) for b in bufs]
        same_batches(full)
        p = rng.random(n) * 3 + 0.1
        for b, x in zip(bufs, full):
            b.update_priorities(x, p)
        same_batches([b.sample(n, fields=list(spec.names[1::2])) for b in bufs])
    np.testing.assert_array_equal(bufs[0].priorities(), bufs[2].priorities())


EPISODIC = {
    "nstep": (ReplayBuffer, {"n_step": 3, "gamma": 0.9}),
    "elide-2env": (ReplayBuffer, {"elide_next": True, "num_envs": 2}),
    "nstep-elide": (ReplayBuffer, {"n_step": 4, "gamma": 0.5, "elide_next": True}),
    "per-nstep-2env": (PrioritizedReplayBuffer, {"n_step": 2, "num_envs": 2, "beta_steps": 9}),
    "per-elide": (PrioritizedReplayBuffer, {"elide_next": True}),
}
CART_GROUPINGS = [k for k, (s, _) in GROUPINGS.items() if s is CART]


@pytest.mark.parametrize("config", list(EPISODIC))
@pytest.mark.parametrize("name", CART_GROUPINGS)
def test_nstep_elision_and_sequences_are_the_same(config, name):
    cls, kw = EPISODIC[config]
    grouping = GROUPINGS[name][1]
    envs = kw.get("num_envs", 1)
    bufs = twins(cls, CART, grouping, 48, **kw)
    streams = CartStreams(np.random.default_rng(3), envs)
    asks = [None, HOT, ["next_obs"], ["reward", "next_obs"], ["obs", "terminated"], list(CART.names)]
    for i, s in enumerate(streams.take(60)):
        for b in bufs:
            b.extend(s)
        if i % 5 == 4:
            n = min(len(bufs[0]), 7)
            fields = asks[(i // 5) % len(asks)]
            batches = [b.sample(n, fields=fields) for b in bufs]
            same_batches(batches)
            if cls is PrioritizedReplayBuffer:
                p = np.linspace(0.5, 2.0, n)
                for b, x in zip(bufs, batches):
                    b.update_priorities(x, p)
            for policy in ("mask", "reject") if i >= 19 else ("mask",):
                seqs = [b.sample_sequences(3, 4, policy=policy, fields=fields) for b in bufs]
                same_batches(seqs)


# -- checkpoints --------------------------------------------------------------------------------
def same_future(bufs, streams, steps: int = 8) -> None:
    for s in streams.take(steps):
        for b in bufs:
            b.extend(s)
        n = min(len(bufs[0]), 5)
        same_batches([b.sample(n) for b in bufs])
        same_batches([b.sample(n, fields=HOT) for b in bufs])


@pytest.mark.parametrize("config", ["plain", "per-nstep-2env", "elide-2env"])
def test_checkpoints_continue_exactly_and_load_into_any_layout(tmp_path, config):
    cls, kw = EPISODIC.get(config, (ReplayBuffer, {}))
    grouping = resolve_layout([HOT, ["next_obs"]], CART)
    streams = CartStreams(np.random.default_rng(7), kw.get("num_envs", 1))
    buf = cls(CART, 40, layout=grouping, seed=11, **kw)
    for s in streams.take(30):
        buf.extend(s)
    buf.sample(4)
    buf.save(tmp_path / "ck")
    # the rows are a grouped dataset of the stored fields
    with MmapDataset.open(tmp_path / "ck" / "rows") as ds:
        assert ds.layout == buf.storage.layout and len(ds) == len(buf)
        for n in buf.storage.spec.names:
            np.testing.assert_array_equal(ds.field(n), buf.storage.field(n)[:len(buf)], err_msg=n)
    back = ReplayBuffer.load(tmp_path / "ck")
    assert type(back) is cls and back.layout == grouping
    others = [ReplayBuffer.load(tmp_path / "ck", layout=lay) for lay in ("aos", "soa", [["action", "obs"]])]
    assert [o.layout for o in others][:2] == ["aos", "soa"]
    # and the other way: a checkpoint of AoS rows into a grouping
    buf.save(tmp_path / "ck2")
    aos = ReplayBuffer.load(tmp_path / "ck2", layout="aos")
    aos.save(tmp_path / "ck3")
    into = ReplayBuffer.load(tmp_path / "ck3", layout=grouping)
    assert into.layout == grouping
    same_future([buf, back, *others, into], streams)


def test_state_dicts_cross_layouts(grouped):
    spec, grouping = grouped
    a = ReplayBuffer(spec, 20, layout=grouping, seed=3)
    a.extend(random_rows(spec, 27, np.random.default_rng(0)))
    a.sample(3)
    state = a.state_dict()
    for lay in ("aos", "soa", grouping):
        b = ReplayBuffer(spec, 20, layout=lay, seed=99)
        b.load_state_dict(state)
        same_batches([a.sample(6), b.sample(6)])
        a.load_state_dict(state)  # a samples again from the same state


def edit_state(path, edit) -> None:
    p = os.path.join(path, "state.json")
    doc = json.loads(open(p).read())
    edit(doc)
    with open(p, "w") as f:
        json.dump(doc, f)


HOSTILE_LAYOUTS = [
    ([["obs", "velocity"]], r"config.layout: group 0: unknown field 'velocity'"),
    ([["obs", "action", "reward", "terminated", "truncated"], ["next_obs", "obs"]],
     r"field 'obs' is in group 0 and in group 1"),
    ([["action", "obs", "reward", "terminated", "truncated"], ["next_obs"]], r"not in normal form"),
    ([["obs", "action", "reward", "terminated", "truncated"]], r"not in normal form"),  # next_obs left out
    ([["obs"]] * 100_000, r"100000 groups for the 6 fields"),
    ([["obs", 1]], r"field names must be str"),
    ([[]], r"group 0 is empty"),
    (["obs"], r"expected a list of field names"),
    ("columns", r"expected 'aos', 'soa' or a list of groups"),
    ({"g": 1}, r"config.layout: expected 'aos', 'soa' or a list of groups"),
    (7, r"config.layout: expected 'aos', 'soa' or a list of groups"),
]


@pytest.mark.parametrize("layout,match", HOSTILE_LAYOUTS)
def test_hostile_layouts_in_a_checkpoint_are_refused_naming_the_field(tmp_path, layout, match):
    buf = ReplayBuffer(CART, 8, layout=[HOT, ["next_obs"]], seed=0)
    buf.extend(random_rows(CART, 5, np.random.default_rng(0)))
    buf.save(tmp_path / "ck")

    def edit(doc):
        doc["config"]["layout"] = layout
        doc["state"]["layout"] = layout

    edit_state(tmp_path / "ck", edit)
    before = snapshot(str(tmp_path))
    with alloc.open("numpy") as a:
        with pytest.raises(FormatError, match=match) as exc:
            ReplayBuffer.load(tmp_path / "ck", allocator=a)
        assert "state.json" in str(exc.value)
        assert a.live_bytes == 0
    assert snapshot(str(tmp_path)) == before


def test_state_layout_must_be_the_configs(tmp_path):
    buf = ReplayBuffer(CART, 8, layout=[HOT, ["next_obs"]], seed=0)
    buf.save(tmp_path / "ck")
    edit_state(tmp_path / "ck", lambda d: d["state"].update(layout=[["obs", "action", "reward", "next_obs",
                                                                         "terminated", "truncated"]]))
    with pytest.raises(FormatError, match=r"state.layout: expected \[\['obs', 'action'"):
        ReplayBuffer.load(tmp_path / "ck")
    edit_state(tmp_path / "ck", lambda d: d["state"].update(layout="aos"))
    with pytest.raises(FormatError, match=r"state.layout"):
        ReplayBuffer.load(tmp_path / "ck")


def test_a_grouped_checkpoint_is_replaced_only_whole(tmp_path):
    buf = ReplayBuffer(CART, 8, layout=[HOT, ["next_obs"]], seed=0)
    buf.extend(random_rows(CART, 8, np.random.default_rng(0)))
    buf.save(tmp_path / "ck")
    buf.save(tmp_path / "ck", overwrite=True)  # a checkpoint whose rows are a grouped directory
    (tmp_path / "ck" / "rows" / "notes.txt").write_text("mine")
    before = snapshot(str(tmp_path))
    with pytest.raises(FileExistsError, match="notes.txt"):
        buf.save(tmp_path / "ck", overwrite=True)
    assert snapshot(str(tmp_path)) == before


# -- spilling buffers ---------------------------------------------------------------------------
@pytest.mark.parametrize("config", ["plain", "nstep", "per-elide"])
def test_a_spilling_grouped_buffer_is_the_ram_buffer(tmp_path, config):
    cls, kw = EPISODIC.get(config, (ReplayBuffer, {}))
    grouping = [HOT, ["next_obs"]]
    ram = cls(CART, 33, layout="aos", seed=3, **kw)
    disk = cls(CART, 33, layout=grouping, seed=3, spill_path=tmp_path / "spill", hot_rows=5, **kw)
    same_future([ram, disk], CartStreams(np.random.default_rng(4), 1), steps=50)
    assert disk.nbytes_parts["storage"] == 5 * disk.storage.nbytes // 33
    # the spill directory is a grouped dataset of every slot
    with MmapDataset.open(tmp_path / "spill") as ds:
        assert ds.layout == disk.storage.layout and len(ds) == 33
        for n in disk.storage.spec.names:
            np.testing.assert_array_equal(ds.field(n), disk.storage.field(n), err_msg=n)
    with pytest.raises(FileExistsError, match="never replaces"):
        cls(CART, 33, layout=grouping, spill_path=tmp_path / "spill", hot_rows=5, **kw)


# -- shared memory --------------------------------------------------------------------------------
@pytest.fixture
def shm_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TFDATA_SHM_DIR", str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("kw", [{}, {"prioritized": True}, {"n_step": 3, "gamma": 0.8}],
                         ids=["uniform", "prioritized", "nstep"])
def test_shared_grouped_buffers_sample_as_aos_and_as_a_replay_buffer(kw, shm_dir):
    grouping = [HOT, ["next_obs"]]
    rows = CartStreams(np.random.default_rng(5), 1).take(90)
    cls = PrioritizedReplayBuffer if kw.get("prioritized") else ReplayBuffer
    ref = cls(CART, 40, layout=grouping, seed=8, **{k: v for k, v in kw.items() if k != "prioritized"})
    with SharedReplayBuffer(CART, 40, layout="aos", seed=8, **kw) as a, \
            SharedReplayBuffer(CART, 40, layout=grouping, seed=8, **kw) as g:
        assert g.layout == resolve_layout(grouping, CART)
        wa, wg = SharedWriter(a.name, 0), SharedWriter(g.name, 0)
        for i, r in enumerate(rows):
            for w in (wa, wg, ref):
                w.extend(r) if i % 2 else w.push({k: v[0] for k, v in r.items()})
            if i % 9 == 8:
                n = min(len(ref), 6)
                same_batches([a.sample(n), g.sample(n), ref.sample(n)])
                same_batches([a.sample(n, fields=HOT), g.sample(n, fields=HOT), ref.sample(n, fields=HOT)])
        wa.close()
        wg.close()


ID_SPEC = Spec({"id": "i8", "a": ("i8", (8,)), "b": "f8", "c": ("i2", (5,)), "d": "?"})
ID_GROUPS = [["id", "a", "d"], ["c"]]


def id_rows(ids) -> dict:
    ids = np.asarray(ids, np.int64)
    return {"id": ids, "a": np.repeat(ids[:, None], 8, 1), "b": ids.astype(np.float64),
            "c": np.repeat((ids % 30000)[:, None], 5, 1).astype(np.int16), "d": ids % 2 == 1}


def whole(batch) -> np.ndarray:
    ids = np.asarray(batch["id"])
    ok = (np.asarray(batch["a"]) == ids[:, None]).all(1) & (np.asarray(batch["b"]) == ids)
    ok &= (np.asarray(batch["c"]) == (ids % 30000)[:, None]).all(1)
    return ok & (np.asarray(batch["d"]) == (ids % 2 == 1))


def _writer_process(name, shard, stop, errors):
    try:
        w = SharedWriter(name, shard)
        i = 0
        while not stop.is_set():
            w.extend(id_rows(np.arange(i, i + 16) + 1_000_000 * shard))
            i += 16
        w.close()
    except Exception as exc:  # noqa: BLE001 - reported to the test
        errors.put(repr(exc))


def test_no_torn_grouped_rows_while_writer_processes_write(shm_dir):
    errors, stop = FORK.Queue(), FORK.Event()
    with SharedReplayBuffer(ID_SPEC, 2 * 256, num_writers=2, layout=ID_GROUPS, seed=0) as buf:
        procs = [FORK.Process(target=_writer_process, args=(buf.name, s, stop, errors)) for s in range(2)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + 60
        while len(buf) < 512 and time.monotonic() < deadline and errors.empty():
            time.sleep(0.01)
        buf.sample(128)  # compiled (or loaded) before the loop
        buf.sample(64, fields=["id", "a", "d"])
        fields = {f: buf.storage.field(f) for f in ID_SPEC.names}
        sampled = torn_raw = 0
        # until a million rows were checked (some 0.4 s on an idle machine), the control saw a
        # torn row and the protocol redrew one: a count, not a time; the cap only ends a hang
        deadline = time.monotonic() + 300
        while (sampled < 1_000_000 or torn_raw == 0 or buf.redraws == 0) and time.monotonic() < deadline:
            b = buf.sample(128)
            assert whole(b).all(), b["id"][~whole(b)]
            p = buf.sample(64, fields=["id", "a", "d"])  # a group held whole: one record copy
            assert ((np.asarray(p["a"]) == np.asarray(p["id"])[:, None]).all(1)).all()
            sampled += 128
            idx = np.random.default_rng(sampled).integers(0, 512, 128)
            torn_raw += int((~whole({f: v[idx] for f, v in fields.items()})).sum())  # no protocol
        stop.set()
        for p in procs:
            p.join(30)
        assert errors.empty(), errors.get()
        redraws = buf.redraws
    assert sampled >= 1_000_000
    assert torn_raw > 0, "the control saw no torn row: the writers did not race the reader"
    assert redraws > 0, "no row was ever redrawn: the writers did not race the protected reads"


def test_shared_grouped_checkpoint_and_a_bad_region_description(shm_dir, tmp_path):
    with SharedReplayBuffer(ID_SPEC, 40, num_writers=2, layout=ID_GROUPS, seed=1, prioritized=True) as buf:
        for s in range(2):
            with SharedWriter(buf.name, s) as w:
                w.extend(id_rows(np.arange(30) + 100 * s))
        buf.save(tmp_path / "ck")
        first = buf.sample(8, copy=True)
        with SharedReplayBuffer.load(tmp_path / "ck", name="back") as back, \
                SharedReplayBuffer.load(tmp_path / "ck", name="aos", layout="aos") as aos, \
                SharedReplayBuffer.load(tmp_path / "ck", name="soa", layout="soa") as soa:
            assert back.layout == buf.layout and (aos.layout, soa.layout) == ("aos", "soa")
            same_batches([first, back.sample(8), aos.sample(8), soa.sample(8)])
            aos.save(tmp_path / "ck-aos")
            with SharedReplayBuffer.load(tmp_path / "ck-aos", name="into", layout=ID_GROUPS) as into:
                assert into.layout == buf.layout
                same_batches([back.sample(8), into.sample(8)])
        # a region whose description names an unknown field: writers refuse to attach
        doc_path = os.path.join(buf.path, "region.json")
        doc = json.loads(open(doc_path).read())
        doc["layout"] = [["id", "zzz"]]
        with open(doc_path, "w") as f:
            json.dump(doc, f)
        with pytest.raises(FormatError, match="unknown field 'zzz'"):
            SharedWriter(buf.name, 0)


# -- datasets, files and the loader ---------------------------------------------------------------
def path_of(tmp_path, layout, name="d") -> str:
    return str(tmp_path / (name + (".npy" if layout == "aos" else "")))


def test_grouped_files_round_trip_and_convert(tmp_path, grouped):
    spec, grouping = grouped
    g = resolve_layout(grouping, spec)
    data = random_rows(spec, 57, np.random.default_rng(1))
    tfdata.io.save(path_of(tmp_path, g), data, grouping)
    with open(os.path.join(tmp_path, "d", "manifest.json")) as f:
        doc = json.load(f)
    assert doc["format"] == "tfdata.groups" and [e["fields"] for e in doc["groups"]] == [list(x) for x in g]
    for e in doc["groups"]:  # every group file is plain numpy
        arr = np.load(os.path.join(tmp_path, "d", e["file"]), mmap_mode="r")
        assert arr.shape[0] == 57
        if len(e["fields"]) > 1:
            for n in e["fields"]:
                np.testing.assert_array_equal(arr[n], data[n])
        else:
            np.testing.assert_array_equal(arr, data[e["fields"][0]])
    with MmapDataset.open(path_of(tmp_path, g)) as ds:
        assert ds.layout == g and ds.spec == spec and len(ds) == 57
        for n in spec.names:
            np.testing.assert_array_equal(ds.field(n), data[n])
    # through every other layout and back
    prev = path_of(tmp_path, g)
    for i, lay in enumerate(["aos", "soa", list(reversed([list(x) for x in g])), g]):
        nxt = path_of(tmp_path, lay, f"c{i}")
        tfdata.io.convert(prev, nxt, lay)
        with MmapDataset.open(nxt) as ds:
            for n in spec.names:
                np.testing.assert_array_equal(ds.field(n), data[n], err_msg=(lay, n))
        prev = nxt


def test_a_grouped_writer_appends_commits_and_reopens(tmp_path):
    g = [["obs", "reward"], ["truncated", "action"]]
    path = str(tmp_path / "d")
    rows = random_rows(CART, 30, np.random.default_rng(2))
    part = lambda a, b: {k: v[a:b] for k, v in rows.items()}  # noqa: E731
    w = tfdata.io.Writer(path, CART, g)
    w.append(part(0, 10))
    assert len(MmapDataset.open(path)) == 0
    assert w.commit() == 10
    w.append(part(10, 15))
    w.close(commit=False)
    assert len(MmapDataset.open(path)) == 10  # the uncommitted tail is invisible
    w = tfdata.io.Writer.open(path)
    assert w.layout == resolve_layout(g, CART) and w.rows == 10
    st = make_storage(CART, 20, g)
    st.write_rows(0, [rows[n] for n in CART.names], 10, 20)
    with pytest.raises(SpecError, match="expected 4 arrays"):
        w.append_blocks(st.blocks[:2])
    with pytest.raises(SpecError, match="expected"):
        w.append_blocks([b[:3] if i else b[:4] for i, b in enumerate(st.blocks)])
    with pytest.raises(ValueError, match="needs an AoS file"):
        w.append_records(np.zeros(2, CART.aos_dtype))
    st.append_to(w, 0, 20)
    w.close()
    with MmapDataset.open(path) as ds:
        for n in CART.names:
            np.testing.assert_array_equal(ds.field(n), rows[n], err_msg=n)
    with pytest.raises(RuntimeError, match="another writer"):
        w1 = tfdata.io.Writer.open(path)
        try:
            tfdata.io.Writer.open(path)
        finally:
            w1.close()


def test_overwrite_replaces_only_a_grouped_dataset(tmp_path):
    rows = random_rows(CART, 5, np.random.default_rng(3))
    d = str(tmp_path / "d")
    tfdata.io.save(d, rows, "soa")
    before = snapshot(str(tmp_path))
    with pytest.raises(FileExistsError, match="not a tfdata grouped dataset"):
        tfdata.io.save(d, rows, [HOT], overwrite=True)
    assert snapshot(str(tmp_path)) == before
    g = str(tmp_path / "g")
    tfdata.io.save(g, rows, [HOT])
    tfdata.io.save(g, rows, [["obs", "next_obs"]], overwrite=True)  # another grouping: replaced
    assert MmapDataset.open(g).layout[0] == ("obs", "next_obs")
    (tmp_path / "g" / "notes.txt").write_text("mine")
    before = snapshot(str(tmp_path))
    with pytest.raises(FileExistsError, match="notes.txt"):
        tfdata.io.save(g, rows, [HOT], overwrite=True)
    assert snapshot(str(tmp_path)) == before


MANIFEST_EDITS = [
    (lambda d: d["groups"][0].update(fields=["obs", "ghost"]), r"unknown field 'ghost'"),
    (lambda d: d["groups"][1].update(fields=["next_obs", "obs"]), r"field 'obs' is in group 0 and in group 1"),
    (lambda d: d["groups"].pop(), r"not in normal form"),
    (lambda d: d["groups"][0].update(fields=list(reversed(d["groups"][0]["fields"]))), r"not in normal form"),
    (lambda d: d["groups"][1].update(file="../outside.npy"), r"not a plain file name"),
    (lambda d: d["groups"][1].update(file="manifest.json"), r"not a plain file name"),
    (lambda d: d["groups"][1].update(file=d["groups"][0]["file"]), r"two groups name the same file"),
    (lambda d: d.update(groups=[[1]] * 10**5), r"groups must be a list of objects"),
    (lambda d: d.update(groups=[{"fields": ["obs"]}] * 10**4), r"10000 groups for the 6 fields"),
    (lambda d: d["fields"][0].update(dtype="<f8"), r"manifest says"),  # the file holds float32
    (lambda d: d.update(rows=58), r"manifest says"),
    (lambda d: d.update(version=[2, 0]), r"format version 2.0 is not supported"),
]


@pytest.mark.parametrize("edit,match", MANIFEST_EDITS)
def test_hostile_grouped_manifests_are_refused_and_change_nothing(tmp_path, edit, match):
    d = tmp_path / "d"
    tfdata.io.save(str(d), random_rows(CART, 57, np.random.default_rng(0)), [HOT, ["next_obs"]])
    (tmp_path / "outside.npy").write_bytes(b"not mine to read")
    doc = json.loads((d / "manifest.json").read_text())
    edit(doc)
    (d / "manifest.json").write_text(json.dumps(doc))
    before = snapshot(str(tmp_path))
    with pytest.raises(FormatError, match=match):
        MmapDataset.open(str(d))
    with pytest.raises(FormatError, match=match):
        tfdata.io.Writer.open(str(d))
    assert snapshot(str(tmp_path)) == before


def test_links_and_fifos_in_a_grouped_directory_are_refused(tmp_path):
    d = tmp_path / "d"
    tfdata.io.save(str(d), random_rows(CART, 5, np.random.default_rng(0)), [HOT, ["next_obs"]])
    victim = d / json.loads((d / "manifest.json").read_text())["groups"][1]["file"]
    data = victim.read_bytes()
    (tmp_path / "outside.npy").write_bytes(data)
    os.unlink(victim)
    os.symlink(tmp_path / "outside.npy", victim)
    with pytest.raises(FormatError, match="symbolic link"):
        MmapDataset.open(str(d))
    os.unlink(victim)
    os.mkfifo(victim)
    with pytest.raises(FormatError, match="not a regular file"):
        MmapDataset.open(str(d))


@pytest.mark.parametrize("shuffle", [False, True, "block"])
def test_the_loader_gives_the_same_batches_on_every_layout(tmp_path, grouped, shuffle):
    spec, grouping = grouped
    data = random_rows(spec, 300, np.random.default_rng(4))
    sets = [ArrayDataset(data, layout=lay) for lay in layouts(grouping)]
    for lay in layouts(grouping):
        tfdata.io.save(path_of(tmp_path, lay, str(len(sets))), data, lay)
        sets.append(MmapDataset.open(path_of(tmp_path, lay, str(len(sets)))))
    # a tiny resident limit: mapped datasets gather shuffled batches a row at a time (into
    # rows of the output past the first)
    kw = dict(shuffle=shuffle, seed=3, resident_bytes=4096)
    if shuffle == "block":
        kw.update(block_rows=16, window_blocks=4)
    first = list(resolve_layout(grouping, spec)[0])  # a group alone: its records whole
    mix = list(dict.fromkeys(first + [spec.names[-1]]))
    # in file order: views of the rows, or (zero_copy=False) copies of consecutive rows
    for f, zero_copy in [(None, True), (first, True), (mix, True), (None, False), (first, False), (mix, False)]:
        epochs = [[{k: np.array(v) for k, v in b.items()}
                   for b in tfdata.DataLoader(ds, 32, fields=f, zero_copy=zero_copy, **kw)] for ds in sets]
        for other in epochs[1:]:
            assert len(other) == len(epochs[0])
            for x, y in zip(epochs[0], other):
                same_bits(x, y, list(x))
        want = [{k: v[i:i + 32] for k, v in data.items() if f is None or k in f} for i in range(0, 300, 32)]
        if shuffle is False:  # and they are the rows
            for x, y in zip(epochs[-1], want):
                same_bits(x, y, list(y))
    # the ring is counted with its padding: rows of row_nbytes, as planned for every layout
    per_row = set()
    for ds in sets[:3]:
        loader = tfdata.DataLoader(ds, 32, shuffle=True, seed=1)
        for _ in loader:
            pass
        per_row.add(loader.nbytes_parts["output_ring"] / (ds.row_nbytes + 8))
    assert len(per_row) == 1
    for ds in sets:
        ds.close()


# -- memory -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,config", [(name, "plain") for name in GROUPINGS]
                         + [(name, c) for name in CART_GROUPINGS for c in ("nstep", "elide-2env", "per-elide")])
def test_nbytes_is_what_the_allocator_gave_and_the_plan_predicts(name, config):
    spec, grouping = GROUPINGS[name]
    cls, kw = EPISODIC.get(config, (ReplayBuffer, {}))
    with alloc.open("numpy") as a:
        buf = cls(spec, 64, layout=grouping, seed=0, allocator=a, **kw)
        plan = cls.plan_memory(spec, 64, layout=grouping, **kw)
        assert buf.nbytes_parts == plan and a.live_bytes == buf.nbytes
        rows = (CartStreams(np.random.default_rng(1), kw.get("num_envs", 1)).take(40) if kw
                else [random_rows(spec, 40, np.random.default_rng(1))])
        for r in rows:
            buf.extend(r)
        groups = [list(g) for g in buf.storage.layout]
        asks = [4, (3, None, groups[0]), (3, None, list(spec.names[:2])), (2, None, groups[-1])]
        for b in asks:
            if isinstance(b, tuple):
                buf.sample(b[0], fields=b[2])
            else:
                buf.sample(b)
        got = buf.nbytes_parts
        want = cls.plan_memory(spec, 64, layout=grouping, batch_sizes=asks, **kw)
        if kw.get("elide_next"):
            assert got.pop("bookkeeping") >= want.pop("bookkeeping")
        assert got == want
        assert a.live_bytes == buf.nbytes
        del buf
        gc.collect()
        assert a.live_bytes == 0


def test_max_capacity_with_a_grouping():
    g = [HOT, ["next_obs"]]
    cap = tfdata.memory.max_capacity(CART, "3MB", batch_size=256, layout=g)
    total = lambda c: sum(ReplayBuffer.plan_memory(CART, c, layout=g, batch_sizes=[256]).values())  # noqa: E731
    assert total(cap) <= 3 << 20 < total(cap + 1)
    # a grouping of a 46-byte row: 32-byte records plus a 16-byte column, against AoS's 48
    assert storage_nbytes(CART, 1, resolve_layout(g, CART)) == 48
    assert storage_nbytes(CART, 1, resolve_layout([["obs", "next_obs"]], CART)) == 46


# -- tests of other files, run on groupings of their specs ------------------------------------------
# Each of these tests takes a layout and holds for any: here it runs on ``mixed(spec)`` (groups of
# several fields not adjacent in the spec, and fields alone) of the spec it uses.
from . import test_buffer as t_buffer  # noqa: E402
from . import test_checkpoint as t_checkpoint  # noqa: E402
from . import test_episodes as t_episodes  # noqa: E402
from . import test_io as t_io  # noqa: E402
from . import test_loader as t_loader  # noqa: E402
from . import test_memory as t_memory  # noqa: E402
from . import test_projection as t_projection  # noqa: E402
from . import test_sampler_contract as t_contract  # noqa: E402
from . import test_shared as t_shared  # noqa: E402
from . import test_shared_nstep as t_shared_nstep  # noqa: E402
from . import test_shared_prioritized as t_shared_prioritized  # noqa: E402
from . import test_spill as t_spill  # noqa: E402
from . import test_threads_memory as t_threads  # noqa: E402
from . import test_write_path as t_write  # noqa: E402

SPECS = [CART, ODDS]
SPEC_IDS = ["cartpole", "odd"]


@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
@pytest.mark.parametrize("capacity", [1, 7, 33])
def test_buffer_against_the_ring_model(spec, capacity):
    t_buffer.test_push_then_sample_matches_model(mixed(spec), spec, capacity)
    for chunks in ([1, 2, 3], [33, 1], [0, 7, 8], [100, 5]):
        t_buffer.test_extend_wraps_like_single_pushes(mixed(spec), spec, capacity, chunks)


@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
def test_buffer_state_clear_copies_and_fast_push(spec):
    g = mixed(spec)
    t_buffer.test_state_dict_round_trip_continues_sequence(g, spec)
    g = mixed(CART)
    for test in (t_buffer.test_state_dict_is_a_copy, t_buffer.test_bad_state_changes_nothing,
                 t_buffer.test_clear, t_buffer.test_sample_returns_ring_views_and_copies,
                 t_buffer.test_refused_sample_releases_the_lock):
        test(g)
    for i in range(len(t_buffer.FAST_AND_SLOW_ROWS)):
        t_buffer.test_fast_push_writes_what_the_checked_push_writes(g, i)


@pytest.mark.parametrize("variant", list(t_checkpoint.VARIANTS))
def test_checkpoint_save_load_continues(tmp_path, variant):
    for i, (capacity, n_steps) in enumerate([(2, 1), (14, 40), (66, 20)]):
        os.mkdir(tmp_path / str(i))
        t_checkpoint.test_save_load_continues_exactly(tmp_path / str(i), mixed(CART), variant, capacity, n_steps)


@pytest.mark.parametrize("variant", list(t_spill.VARIANTS))
def test_spill_behaves_like_ram(tmp_path, variant):
    for i, (capacity, hot, n_steps) in enumerate([(1, 1, 3), (7, 2, 20), (33, 5, 50)]):
        os.mkdir(tmp_path / str(i))
        t_spill.test_spilling_buffer_behaves_exactly_like_the_ram_buffer(tmp_path / str(i), mixed(CART), variant,
                                                                          capacity, hot, n_steps)
    t_spill.test_a_checkpoint_of_a_spilling_buffer_loads_spilling_or_in_ram(tmp_path, mixed(CART))


@pytest.mark.parametrize("config", list(t_projection.NSTEP_CONFIGS))
@pytest.mark.parametrize("spec", [CART, t_episodes.BYTES], ids=["cartpole", "bytes"])
def test_projection_nstep_and_elision(config, spec):
    t_projection.test_nstep_and_elision_projections_are_the_full_batch_restricted(mixed(spec), config, spec)


def test_projection_sequences_rings_and_prioritized(tmp_path):
    g = mixed(CART)
    for policy in ("mask", "reject"):
        for config in ("plain", "elide", "prioritized"):
            t_projection.test_sequence_projections_are_the_full_slices_restricted(g, policy, config)
    for config in t_projection.MEMORY_CONFIGS:
        t_projection.test_projected_rings_are_what_the_plan_predicts(g, config)
    t_projection.test_prioritized_projection_is_the_full_batch_restricted(mixed(ODDS))
    for spec in (t_projection.CART, t_projection.ODD_SPEC):
        t_projection.test_uniform_projection_is_the_full_batch_restricted(mixed(spec), spec, 7)
    t_projection.test_a_spilling_buffer_projects_too(tmp_path, g)
    t_projection.test_projected_steady_state_allocates_nothing(g)


@pytest.mark.parametrize("config", list(t_projection.SHARED_CONFIGS))
def test_projection_shared(config, shm_dir):
    t_projection.test_shared_projection_is_the_full_batch_restricted(mixed(CART), config, shm_dir)


@pytest.mark.parametrize("config", list(t_memory.CONFIGS))
def test_memory_plan_and_allocation(config):
    for capacity in (1, 33, 1000):
        t_memory.test_nbytes_is_what_the_allocator_gave_and_the_plan_predicts(mixed(CART), capacity, config)
    t_memory.test_max_capacity_is_the_largest_that_fits(mixed(CART), config)


def test_memory_budget_refuses_a_new_ring():
    t_memory.test_a_new_batch_size_over_budget_is_refused_and_nothing_changes(mixed(ODDS))
    t_memory.test_elision_growth_counts(mixed(CART))


def test_episodes_on_a_grouping():
    g = mixed(t_episodes.VEC)
    for policy in ("mask", "reject"):
        t_episodes.test_prioritized_sequences_match_the_reference(g, policy)
    for elide in (False, True):
        t_episodes.test_nstep_windows_by_hand(g, elide)
    for num_envs in (1, 2):
        t_episodes.test_elision_refuses_a_broken_stream_and_changes_nothing(g, num_envs)
    for test in (t_episodes.test_streams_are_interleaved_step_by_step, t_episodes.test_elision_final_table_grows_and_recycles,
                 t_episodes.test_nstep_never_crosses_another_environment, t_episodes.test_clear_wipe_also_forgets_the_kept_next_values,
                 t_episodes.test_reject_without_any_valid_slice_consumes_no_randomness):
        test(g)


def test_threads_and_steady_state():
    t_threads.test_steady_state_allocates_nothing(mixed(CART), 256)
    t_threads.test_prioritized_steady_state_allocates_nothing(mixed(CART))
    for elide in (False, True):
        t_threads.test_nstep_and_elided_sampling_allocate_nothing(mixed(t_episodes.VEC), elide)
    for cls in (ReplayBuffer, PrioritizedReplayBuffer):
        t_threads.test_no_torn_rows_with_one_writer_and_two_samplers(mixed(Spec(t_threads.SEQ_SPEC)), cls)


def test_generated_push_and_extend():
    g = mixed(t_write.WIDE)
    t_write.test_generated_push_writes_and_refuses_what_the_checked_push_does(layout=g)
    for num_envs in (1, 2):
        t_write.test_generated_extend_writes_and_refuses_what_the_checked_extend_does(layout=g, num_envs=num_envs)
    t_write.test_first_tier_bytes_equal_numpy_assignment_for_edge_values(g)


def test_an_outside_sampler_plugs_into_a_grouping():
    t_contract.test_an_outside_sampler_plugs_in(mixed(t_contract.SPEC))


@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
def test_shared_one_writer_is_a_replay_buffer(spec, shm_dir):
    for cap in (1, 7, 33):
        t_shared.test_one_writer_samples_as_a_replay_buffer(mixed(spec), spec, cap, shm_dir)


def test_shared_nstep_prioritized_and_fifo(shm_dir):
    for prioritized in (False, True):
        t_shared_nstep.test_one_writer_gives_the_single_process_windows(mixed(t_shared_nstep.SPEC), prioritized, 10,
                                                                        shm_dir)
    t_shared_prioritized.test_one_writer_samples_as_a_prioritized_buffer(mixed(t_shared_prioritized.SPEC), 12, shm_dir)
    g = mixed(Spec(t_shared.ID_SPEC))
    t_shared.test_fifo_delivers_in_publication_order_exactly_once(g, shm_dir)
    t_shared.test_sample_skips_slots_being_written(g, shm_dir)
    # fields ["b", "id"] of a group ("id", "b"): one record block, redrawn rows copied again
    for prioritized in (False, True):
        t_projection.test_shared_redraws_copy_the_projected_fields_again(
            resolve_layout([["id", "b"]], t_projection.ID_SPEC), prioritized, shm_dir)
    g = mixed(CART)
    with SharedReplayBuffer(CART, 4096, num_writers=2, layout=g) as buf:
        rows = storage_nbytes(CART, 4096, g)
        assert buf.nbytes == tfdata.shared.region_nbytes(CART, 4096, num_writers=2, layout=g)
        assert rows < buf.nbytes <= rows + 2 * 4096  # + control words, alignment


def test_files_writer_and_loader(tmp_path):
    g = mixed(Spec(t_io.ID_SPEC))
    for i, test in enumerate((t_io.test_append_commit_and_reopen, t_io.test_a_rejected_batch_writes_nothing,
                              t_io.test_one_writer_at_a_time)):
        os.mkdir(tmp_path / str(i))
        test(tmp_path / str(i), g)
    for mode in t_loader.MODES:
        for j, (n, batch) in enumerate([(1, 1), (33, 8), (7, 10)]):
            d = tmp_path / f"l{mode}{j}"
            os.mkdir(d)
            t_loader.test_batches_match_reference(d, mixed(ODDS), "mmap", mode, n, batch, False)
    os.mkdir(tmp_path / "views")
    t_loader.test_unshuffled_mmap_batches_are_read_only_views(tmp_path / "views", mixed(CART))
