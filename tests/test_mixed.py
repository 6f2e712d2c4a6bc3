"""MixedReplayBuffer: batches drawn from several sources (datasets and replay buffers) in fixed
shares, each source's rows checked against what that source's own sampler draws (a twin buffer
with the same seed and rows, or the naive uniform draw for a dataset), the weights and versions
of a prioritized source, the routing of priority updates, stale batches, layouts, checkpoints
(a dataset by reference, refused when it changed) and every refusal changing nothing.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tfdata
from tfdata import (ArrayDataset, MixedReplayBuffer, MmapDataset, PrioritizedReplayBuffer,
                    ReplayBuffer, Spec, SpecError, StaleBatchError)
from tfdata.errors import FormatError
from tfdata.replay.mixed import split

from . import naive
from .conftest import CARTPOLE, ODD, assert_batches_equal, random_rows, traced_growth

CART = Spec(CARTPOLE)
LAYOUTS = ["aos", "soa", [["obs", "action", "reward"], ["next_obs"], ["terminated", "truncated"]]]
N_DS, CAP = 200, 64


def rows(n=N_DS, seed=0, spec=CART):
    return random_rows(spec, n, np.random.default_rng(seed))


def online(kind="uniform", layout="aos", seed=7, n=50, capacity=CAP, spec=CART, data_seed=1):
    cls = PrioritizedReplayBuffer if kind == "prioritized" else ReplayBuffer
    buf = cls(spec, capacity, layout=layout, seed=seed)
    data = rows(n, data_seed, spec)
    if kind == "prioritized":
        buf.extend(data, priorities=np.linspace(0.1, 3.0, n))
    else:
        buf.extend(data)
    return buf


def dataset_draw(seed, i, counter, n, k):
    """The naive uniform draw of dataset source ``i`` (seeded seed + i)."""
    return naive.draw_indices(naive.key_of(seed + i), counter, n, k)


def test_dataset_alone_is_sampled_like_a_buffer():
    data = rows()
    m = MixedReplayBuffer({"d": ArrayDataset(data)}, seed=11)
    counter = 0
    for B in (1, 5, 32, 32):
        b = m.sample(B)
        idx, counter = dataset_draw(11, 0, counter, N_DS, B)
        np.testing.assert_array_equal(b.indices, idx)
        assert_batches_equal(dict(b), {k: v[idx] for k, v in data.items()})
        assert b.source.dtype == np.uint8 and not b.source.any()
        assert b.weights.dtype == np.float32 and (b.weights == 1).all() and b.versions is None
        for k in b:
            assert b[k].flags.c_contiguous and b[k].shape == (B,) + CART[k].shape
    assert m.state_dict() == {"seed": 11, "datasets": {"d": counter}}


# (dataset layout, buffer layout): one row format (records, columns, blocks), or two
PAIRS = [("aos", "aos"), ("soa", "soa"), (LAYOUTS[2], LAYOUTS[2]), ("soa", "aos")]
PAIR_IDS = ["aos", "soa", "groups", "soa+aos"]


@pytest.mark.parametrize("kind", ["uniform", "prioritized"])
@pytest.mark.parametrize("lay_d, lay_b", PAIRS, ids=PAIR_IDS)
def test_each_sources_rows_are_its_own_samplers(kind, lay_d, lay_b):
    data = rows()
    buf, twin = online(kind, lay_b), online(kind, lay_b)
    m = MixedReplayBuffer({"off": ArrayDataset(data, layout=lay_d), "on": buf},
                          {"off": 0.75, "on": 0.25}, seed=3)
    assert m.shared_format == (lay_d == lay_b)
    counter = 0
    for B in (8, 13, 8):
        b = m.sample(B)
        k0, k1 = split(B, [0.75, 0.25])
        np.testing.assert_array_equal(b.source, [0] * k0 + [1] * k1)
        idx, counter = dataset_draw(3, 0, counter, N_DS, k0)
        np.testing.assert_array_equal(b.indices[:k0], idx)
        assert_batches_equal({k: v[:k0] for k, v in b.items()}, {k: v[idx] for k, v in data.items()})
        t = twin.sample(k1)
        for k in t:  # one format: the fields are what that layout's batches show
            assert (b[k].strides == t[k].strides) == m.shared_format, k
        np.testing.assert_array_equal(b.indices[k0:], t.indices)
        assert_batches_equal({k: v[k0:] for k, v in b.items()}, {k: np.asarray(t[k]) for k in t})
        np.testing.assert_array_equal(b.weights[:k0], 1)
        if kind == "prioritized":
            np.testing.assert_array_equal(b.weights[k0:], t.weights)
            np.testing.assert_array_equal(b.versions[k0:], t.versions)
            np.testing.assert_array_equal(b.versions[:k0], 0)
            m.update_priorities(b, np.r_[np.full(k0, np.nan), np.arange(1.0, k1 + 1)])
            twin.update_priorities(t, np.arange(1.0, k1 + 1))
            np.testing.assert_array_equal(buf.priorities(), twin.priorities())
        else:
            np.testing.assert_array_equal(b.weights, 1)
        buf.push({k: v[0] for k, v in rows(1, B).items()})  # the user keeps writing
        twin.push({k: v[0] for k, v in rows(1, B).items()})


def test_two_prioritized_sources_update_all_or_nothing():
    a, b = online("prioritized", seed=1), online("prioritized", seed=2)
    m = MixedReplayBuffer({"a": a, "b": b}, seed=0)
    batch = m.sample(16)
    before = a.priorities(), b.priorities()
    for _ in range(CAP):  # every row of b overwritten: its rows of the batch are stale
        b.push({k: v[0] for k, v in rows(1, 9).items()})
    after_b = b.priorities()
    with pytest.raises(ValueError, match="stale batch"):
        m.update_priorities(batch, np.full(16, 2.0))
    np.testing.assert_array_equal(a.priorities(), before[0])  # a was not updated either
    np.testing.assert_array_equal(b.priorities(), after_b)
    with pytest.raises(ValueError, match="finite and >= 0"):
        m.update_priorities(m.sample(16), np.r_[np.ones(15), -1.0])
    np.testing.assert_array_equal(a.priorities(), before[0])
    with pytest.raises(SpecError, match=r"shape \(16,\)"):
        m.update_priorities(batch, np.ones(3))


def test_stale_batch_refused():
    m = MixedReplayBuffer({"d": ArrayDataset(rows()), "p": online("prioritized")}, seed=0,
                          ring_size=2)
    kept = m.sample(8)
    m.sample(8)
    m.sample(8)  # the slot of `kept` reused
    with pytest.raises(StaleBatchError):
        kept.source
    with pytest.raises(StaleBatchError):
        m.update_priorities(kept, np.ones(8))
    copied = m.sample(8, copy=True)
    m.sample(8), m.sample(8)
    assert copied.source.shape == (8,) and set(copied.source.tolist()) == {0, 1}


@pytest.mark.parametrize("kind", ["uniform", "prioritized"])
def test_layouts_give_the_same_batches(kind):
    data = rows()
    got = []
    for lay_d in LAYOUTS:
        for lay_b in LAYOUTS:
            m = MixedReplayBuffer({"d": ArrayDataset(data, layout=lay_d), "b": online(kind, lay_b)},
                                  seed=5)
            got.append([m.sample(B, copy=True) for B in (7, 16, 16)])
    for other in got[1:]:
        for x, y in zip(got[0], other):
            assert_batches_equal(dict(x), dict(y))
            for attr in ("indices", "source", "weights", "versions"):
                np.testing.assert_array_equal(getattr(x, attr), getattr(y, attr))


def packed(data):
    """``data`` as records of a packed dtype (no padding): not a buffer's record format."""
    dt = np.dtype([(k, v.dtype, v.shape[1:]) for k, v in data.items()])
    rec = np.zeros(len(data["obs"]), dt)
    for k, v in data.items():
        rec[k] = v
    return rec


@pytest.mark.parametrize("layout", LAYOUTS, ids=["aos", "soa", "groups"])
def test_row_formats_of_buffers_and_datasets(tmp_path, layout):
    data = rows()
    buf = online("uniform", layout)
    path = saved_dataset(tmp_path, layout, data)  # written from the spec's columns
    with MmapDataset.open(path) as mm:
        fmt = buf.storage.row_format()
        assert hash(fmt) == hash(mm.row_format()) and fmt == mm.row_format()
        assert fmt == ArrayDataset(data, layout=layout).row_format()
        others = [x for x in LAYOUTS if x != layout]
        assert all(fmt != online("uniform", x).storage.row_format() for x in others)
        assert all(fmt != ArrayDataset(data, layout=x).row_format() for x in others)
        assert fmt != ArrayDataset(packed(data)).row_format()
        # a converted dataset and a buffer of its spec and layout (RLPD's case): one format
        m = MixedReplayBuffer({"off": mm, "on": buf}, seed=6)
        assert m.shared_format
        b, t = m.sample(20), online("uniform", layout).sample(10)
        assert all(b[k].strides == t[k].strides for k in t)
        idx, _ = dataset_draw(6, 0, 0, N_DS, 10)
        np.testing.assert_array_equal(b.indices[:10], idx)
        assert_batches_equal({k: v[:10] for k, v in b.items()}, {k: v[idx] for k, v in data.items()})
        assert_batches_equal({k: v[10:] for k, v in b.items()},
                             {k: np.asarray(t[k]) for k in t})


def test_padded_records_of_another_dtype_take_the_columns():
    data = rows()
    rec = packed(data)
    a = MixedReplayBuffer({"d": ArrayDataset(rec), "b": online()}, seed=8)
    same = MixedReplayBuffer({"d": ArrayDataset(data, layout="aos"), "b": online()}, seed=8)
    assert not a.shared_format and same.shared_format
    for B in (5, 16):
        x, y = a.sample(B), same.sample(B)
        assert all(x[k].flags.c_contiguous for k in x)
        assert_batches_equal(dict(x), dict(y))
        np.testing.assert_array_equal(x.indices, y.indices)


@pytest.mark.parametrize("lay_d, lay_b", PAIRS, ids=PAIR_IDS)
def test_fields_every_field_gives_columns_whatever_the_format(lay_d, lay_b):
    data = rows()
    m = MixedReplayBuffer({"d": ArrayDataset(data, layout=lay_d), "b": online("prioritized", lay_b)},
                          seed=2)
    twin = MixedReplayBuffer({"d": ArrayDataset(data, layout=lay_d),
                              "b": online("prioritized", lay_b)}, seed=2)
    for _ in range(3):
        f, p = m.sample(12), twin.sample(12, fields=list(CART.names))
        assert all(p[k].flags.c_contiguous for k in p)
        assert_batches_equal(dict(f), dict(p))
        np.testing.assert_array_equal(f.weights, p.weights)
        np.testing.assert_array_equal(f.versions, p.versions)
    assert m.nbytes == m.plan_ring(12) and twin.nbytes == twin.plan_ring(12, list(CART.names))


def test_fields_projection_is_the_full_batch_restricted():
    data = rows()
    full = MixedReplayBuffer({"d": ArrayDataset(data, layout=LAYOUTS[2]), "b": online("prioritized")},
                             seed=2)
    part = MixedReplayBuffer({"d": ArrayDataset(data, layout=LAYOUTS[2]), "b": online("prioritized")},
                             seed=2)
    for _ in range(3):
        f, p = full.sample(10), part.sample(10, fields=["next_obs", "reward"])
        assert list(p) == ["reward", "next_obs"]
        assert_batches_equal({k: f[k] for k in p}, dict(p))
        np.testing.assert_array_equal(f.weights, p.weights)
        assert all(p[k].flags.c_contiguous for k in p)
    with pytest.raises(SpecError, match="nope"):
        part.sample(10, fields=["nope"])


@pytest.mark.parametrize("lay_d, lay_b", PAIRS, ids=PAIR_IDS)
def test_memory_plan_and_budget(lay_d, lay_b):
    m = MixedReplayBuffer({"d": ArrayDataset(rows(), layout=lay_d),
                           "p": online("prioritized", lay_b)}, seed=0, ring_size=3)
    assert m.nbytes_parts == {"output_rings": 0}
    m.sample(10)
    m.sample(4, fields=["obs"])
    assert m.nbytes == m.plan_ring(10) + m.plan_ring(4, ["obs"])
    plan = MixedReplayBuffer({"d": ArrayDataset(rows())}).plan_ring(10)
    small = MixedReplayBuffer({"d": ArrayDataset(rows())}, seed=0, memory_budget=plan - 1)
    with pytest.raises(tfdata.MemoryBudgetError, match="memory_budget"):
        small.sample(10)
    assert small.nbytes == 0
    exact = MixedReplayBuffer({"d": ArrayDataset(rows())}, seed=0, memory_budget=plan)
    exact.sample(10)
    assert exact.nbytes == plan


def test_refusals_change_nothing():
    data = rows()
    ds = ArrayDataset(data)
    with pytest.raises(ValueError, match=r"fractions: expected a sum of 1, got 0\.9"):
        MixedReplayBuffer({"a": ds, "b": ds}, {"a": 0.5, "b": 0.4})
    with pytest.raises(ValueError, match=r"fractions\['b'\]: expected a number in \(0, 1\]"):
        MixedReplayBuffer({"a": ds, "b": ds}, {"a": 1.0, "b": -0.0})
    with pytest.raises(ValueError, match=r"one fraction per source \['a', 'b'\]"):
        MixedReplayBuffer({"a": ds, "b": ds}, {"a": 1.0})
    with pytest.raises(ValueError, match="name 'a/b'"):
        MixedReplayBuffer({"a/b": ds})
    other = Spec({**CARTPOLE, "reward": "f8"})
    with pytest.raises(SpecError, match=r"sources 'a' and 'b' differ at field 'reward' \(float32\[\] "
                                        r"against float64\[\]\): a: \{obs: float32\[4\].*b: \{"):
        MixedReplayBuffer({"a": ds, "b": ReplayBuffer(other, 8)})
    with pytest.raises(SpecError, match=r"field 'obs' \(float32\[4\] against absent\)"):
        MixedReplayBuffer({"a": ds, "b": ReplayBuffer(Spec(ODD), 8)})
    with pytest.raises(NotImplementedError, match="transforms"):
        MixedReplayBuffer({"a": ds, "b": ReplayBuffer(CART, 8, n_step=3)})
    with pytest.raises(NotImplementedError, match="transforms="):
        MixedReplayBuffer({"a": ds, "b": ReplayBuffer(CART, 8, transforms=[tfdata.ScaleReward(2.0)])})
    with pytest.raises(TypeError, match="projection"):
        MixedReplayBuffer({"a": ds.project(["obs"])})
    buf = online(n=5)
    m = MixedReplayBuffer({"d": ds, "b": buf}, {"d": 0.9, "b": 0.1}, seed=0)
    state, bstate = m.state_dict(), buf.state_dict()["sampler"]
    with pytest.raises(ValueError, match=r"source 'b' holds 5 rows, fewer than its share of 6 rows"):
        m.sample(60)  # a share above the rows held
    with pytest.raises(ValueError, match=r"source 'b' \(fraction 0.1\) would get 0 rows.*batch_size >= 10"):
        m.sample(4)
    assert m.nbytes == 0 and m.state_dict() == state and buf.state_dict()["sampler"] == bstate
    m.sample(40)
    buf.clear()  # emptied after its ring was built: refused before any source draws
    state = m.state_dict()
    with pytest.raises(ValueError, match="source 'b' holds 0 rows"):
        m.sample(40)
    assert m.state_dict() == state


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 1000), min_size=1, max_size=5), st.integers(1, 300))
def test_split_by_largest_remainder(weights, batch_size):
    fr = [w / sum(weights) for w in weights]
    ks = split(batch_size, fr)
    assert sum(ks) == batch_size
    # integer arithmetic: quota i is batch_size * w_i / W, its floor and remainder exact
    W = sum(weights)
    floors = [batch_size * w // W for w in weights]
    assert all(f <= k <= f + 1 for k, f in zip(ks, floors))
    # the rows left went to the largest remainders, ties to the earlier source
    got = [i for i, (k, f) in enumerate(zip(ks, floors)) if k > f]
    rem = sorted(range(len(fr)), key=lambda i: (-(batch_size * weights[i] % W), i))
    assert got == sorted(rem[:batch_size - sum(floors)])


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 9), min_size=1, max_size=3), st.integers(3, 40), st.integers(0, 2**64 - 1))
def test_batches_follow_the_split(weights, batch_size, seed):
    fr = [w / sum(weights) for w in weights]
    ks = split(batch_size, fr)
    names = [f"s{i}" for i in range(len(fr))]
    data = rows()
    srcs = {n: ArrayDataset(data) for n in names}
    if 0 in ks:
        with pytest.raises(ValueError, match="would get 0 rows"):
            MixedReplayBuffer(srcs, dict(zip(names, fr)), seed=seed).sample(batch_size)
        return
    m = MixedReplayBuffer(srcs, dict(zip(names, fr)), seed=seed)
    b = m.sample(batch_size)
    np.testing.assert_array_equal(b.source, np.repeat(np.arange(len(ks)), ks))
    at = 0
    for i, k in enumerate(ks):
        idx, _ = dataset_draw(seed, i, 0, N_DS, k)
        np.testing.assert_array_equal(b.indices[at:at + k], idx)
        at += k


# -- checkpoints -------------------------------------------------------------------------------

def saved_dataset(tmp_path, layout, data):
    path = str(tmp_path / ("ds.npy" if layout == "aos" else "ds"))
    tfdata.io.save(path, data, layout)
    return path


@pytest.mark.parametrize("layout", ["aos", "soa"])
def test_checkpoint_round_trip_continues(tmp_path, layout):
    data = rows()
    ds = MmapDataset.open(saved_dataset(tmp_path, layout, data))
    m = MixedReplayBuffer({"off": ds, "on": online("prioritized", layout)}, seed=9, ring_size=3)
    for _ in range(3):
        b = m.sample(12)
        m.update_priorities(b, np.arange(1.0, 13.0))
    m.save(tmp_path / "ck")
    expect = [m.sample(12, copy=True) for _ in range(4)]
    back = MixedReplayBuffer.load(tmp_path / "ck")
    assert back.config == m.config and list(back.sources) == ["off", "on"]
    assert isinstance(back.sources["on"], PrioritizedReplayBuffer)
    for e in expect:
        g = back.sample(12)
        assert_batches_equal(dict(e), dict(g))
        for attr in ("indices", "source", "weights", "versions"):
            np.testing.assert_array_equal(getattr(e, attr), getattr(g, attr))
    assert not os.path.exists(tmp_path / "ck" / "sources" / "0")  # the dataset: by reference
    # overwrite: only a mixed checkpoint
    m.save(tmp_path / "ck", overwrite=True)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not a tfdata mixed checkpoint"):
        m.save(tmp_path / "mine", overwrite=True)
    with pytest.raises(FileExistsError):
        m.save(tmp_path / "ck")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "mine"
    assert sorted(os.listdir(tmp_path)) == sorted(["ck", "mine", os.path.basename(ds.path)])


def test_changed_dataset_refused(tmp_path):
    data = rows()
    path = saved_dataset(tmp_path, "soa", data)
    m = MixedReplayBuffer({"off": MmapDataset.open(path), "on": online()}, seed=1)
    m.save(tmp_path / "ck")
    data["reward"][0] += 1
    tfdata.io.save(path, data, "soa", overwrite=True)
    with pytest.raises(FormatError, match=r"mixed.json: datasets.off.identity: the dataset .* changed"):
        MixedReplayBuffer.load(tmp_path / "ck")


def test_array_dataset_given_again_at_load(tmp_path):
    data = rows()
    m = MixedReplayBuffer({"off": ArrayDataset(data), "on": online()}, seed=4)
    m.sample(6)
    m.save(tmp_path / "ck")
    with pytest.raises(ValueError, match=r"datasets=\{'off': dataset\}"):
        MixedReplayBuffer.load(tmp_path / "ck")
    with pytest.raises(FormatError, match=r"datasets.off: expected 200 rows"):
        MixedReplayBuffer.load(tmp_path / "ck", datasets={"off": ArrayDataset(rows(100))})
    back = MixedReplayBuffer.load(tmp_path / "ck", datasets={"off": ArrayDataset(data)})
    assert_batches_equal(dict(m.sample(6)), dict(back.sample(6)))


@pytest.mark.parametrize("edit, field", [
    (lambda d: d.update(format="x"), "format"),
    (lambda d: d["config"].update(ring_size=0), "config.ring_size"),
    (lambda d: d["config"]["sources"][0].__setitem__(0, "../x"), "config.sources.0"),
    (lambda d: d["config"]["fractions"].update(off="0.5"), "config.fractions"),
    (lambda d: d["datasets"]["off"].update(path="relative/path"), "datasets.off.path"),
    (lambda d: d["datasets"]["off"].update(rows=-1), "datasets.off.rows"),
    (lambda d: d["state"].update(seed=-1), "state.seed"),
    (lambda d: d["state"]["datasets"].update(off=2**64), "state.datasets.off"),
    (lambda d: d.update(extra=1), "(top)"),
])
def test_hostile_document_refused(tmp_path, edit, field):
    path = saved_dataset(tmp_path, "aos", rows())
    m = MixedReplayBuffer({"off": MmapDataset.open(path), "on": online()}, seed=1)
    m.save(tmp_path / "ck")
    doc_path = tmp_path / "ck" / "mixed.json"
    doc = json.loads(doc_path.read_text())
    edit(doc)
    doc_path.write_text(json.dumps(doc))
    with pytest.raises(FormatError, match=f"mixed.json: {field.replace('(', '[(]').replace(')', '[)]')}"):
        MixedReplayBuffer.load(tmp_path / "ck")


def test_state_dict_round_trip():
    data = rows()
    a = MixedReplayBuffer({"x": ArrayDataset(data), "y": ArrayDataset(data)}, seed=3)
    a.sample(9)
    state = a.state_dict()
    expect = a.sample(9, copy=True)
    b = MixedReplayBuffer.from_config(a.config, {"x": ArrayDataset(data), "y": ArrayDataset(data)})
    with pytest.raises(ValueError, match="datasets"):
        b.load_state_dict({"seed": 3, "datasets": {"x": 1}})
    b.load_state_dict(state)
    assert_batches_equal(dict(expect), dict(b.sample(9)))


@pytest.mark.parametrize("layout", ["aos", "soa"])
def test_steady_state_allocates_nothing(layout):

    m = MixedReplayBuffer({"d": ArrayDataset(rows(), layout=layout),
                           "p": online("prioritized", layout)}, seed=0)
    for _ in range(4):  # warm: compile, build this size's ring
        m.update_priorities(m.sample(64), np.ones(64))
    grown = traced_growth(lambda: m.sample(64), 300)
    # one allocated batch (64 rows of 46 bytes), or 4 bytes per sample, would exceed these bounds
    assert min(g for g, _ in grown) < 1024, grown
    assert min(p for _, p in grown) < 2048, grown


def test_two_buffers_a_short_one_refused_before_any_draws():
    a, b = online(seed=1), online("prioritized", seed=2)
    m = MixedReplayBuffer({"d": ArrayDataset(rows()), "a": a, "b": b}, seed=0)
    m.sample(30)
    b.clear()
    states = m.state_dict(), a.state_dict()["sampler"], b.state_dict()["sampler"]
    with pytest.raises(ValueError, match=r"source 'b' holds 0 rows, fewer than its share of 10"):
        m.sample(30)
    assert (m.state_dict(), a.state_dict()["sampler"], b.state_dict()["sampler"]) == states
