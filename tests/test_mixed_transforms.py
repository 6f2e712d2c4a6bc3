"""MixedReplayBuffer(transforms=...): every transformed batch against the untransformed mixed
batch of twin sources (same seeds and rows) with the naive reference transforms of naive.py
applied, on both paths (the sources' own row format, columns) and for projections; Normalize's
statistics over a dataset source against a buffer's and numpy's; RandomShift's RNG through
state dicts and checkpoints; the allow-list of user functions at load; refusals; memory."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from numba import njit

import tfdata
from tfdata import (ArrayDataset, Cast, ClipReward, Compiled, FormatError, Function,
                    MixedReplayBuffer, Normalize, RandomShift, ReplayBuffer, ScaleReward, Spec)

from . import naive
from .conftest import CARTPOLE, assert_batches_equal, random_rows, traced_growth

CART = Spec(CARTPOLE)
IMAGES = Spec({"obs": ("u1", (2, 9, 11)), "reward": "f4", "terminated": "?", "truncated": "?"})
GROUPS = [["obs", "action", "reward"], ["next_obs"], ["terminated", "truncated"]]
IMG_GROUPS = [["obs"], ["reward", "terminated", "truncated"]]
# (dataset layout, buffer layout): one row format (records, columns, blocks), or two (columns)
PAIRS = [("aos", "aos"), ("soa", "soa"), ("groups", "groups"), ("soa", "aos")]
IDS = ["aos", "soa", "groups", "soa+aos"]
N_DS = 200


@njit(nogil=True)
def double_reward(reward):
    for i in range(reward.shape[0]):
        reward[i] = reward[i] * 2.0


def add_one_in_place(fields):
    fields["reward"] += 1


def lay(name, spec):
    return (GROUPS if spec is CART else IMG_GROUPS) if name == "groups" else name


def data_of(spec, n, seed):
    return random_rows(spec, n, np.random.default_rng(seed))


def sources(spec, lay_d, lay_b, kind=ReplayBuffer):
    """A dataset and a buffer holding rows (new objects each call: twins)."""
    buf = kind(spec, 64, layout=lay(lay_b, spec), seed=7)
    buf.extend(data_of(spec, 50, 1))
    return {"off": ArrayDataset(data_of(spec, N_DS, 0), layout=lay(lay_d, spec)), "on": buf}


def everything():
    return [Normalize("obs", clip=3.0), ScaleReward(0.5), ClipReward(-1.0, 1.0),
            Cast("action", np.float64), Compiled(double_reward, ["reward"]),
            Function(add_one_in_place, ["reward"])]


def transformed(plain, mean, var):
    """What everything() makes of the batch ``plain`` (dict of arrays), by the references."""
    want = {k: np.array(v) for k, v in plain.items()}
    want["obs"] = naive.normalize(want["obs"], mean, var, 1e-8, 3.0)
    r = naive.scale_clip(naive.scale_clip(want["reward"], 0.5), 1.0, -1.0, 1.0)
    want["reward"] = r * np.float32(2) + np.float32(1)
    want["action"] = naive.cast(want["action"], np.float64)
    return want


def assert_exact(got, want):
    assert list(got) == list(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, k
        assert np.array_equal(np.asarray(got[k]), want[k], equal_nan=True), k


# -- each batch is the plain batch with the references applied -------------------------------


@pytest.mark.parametrize("kind", [ReplayBuffer, tfdata.PrioritizedReplayBuffer])
@pytest.mark.parametrize("lay_d, lay_b", PAIRS, ids=IDS)
def test_transformed_batch_is_the_plain_batch_transformed(lay_d, lay_b, kind):
    plain = MixedReplayBuffer(sources(CART, lay_d, lay_b, kind), {"off": 0.75, "on": 0.25}, seed=3)
    m = MixedReplayBuffer(sources(CART, lay_d, lay_b, kind), {"off": 0.75, "on": 0.25}, seed=3,
                          transforms=everything(), stats_from="off")
    assert m.shared_format == (lay_d == lay_b)
    s = m.stats("obs")
    for B in (8, 13, 8):
        p, b = plain.sample(B), m.sample(B)
        for attr in ("indices", "source", "weights"):
            np.testing.assert_array_equal(getattr(b, attr), getattr(p, attr))
        assert_exact(dict(b), transformed(dict(p), s.mean, s.var))


@pytest.mark.parametrize("lay_d, lay_b", PAIRS, ids=IDS)
def test_projection_is_the_full_batch_restricted(lay_d, lay_b):
    full = MixedReplayBuffer(sources(CART, lay_d, lay_b), seed=4, transforms=everything(),
                             stats_from="off")
    part = MixedReplayBuffer(sources(CART, lay_d, lay_b), seed=4, transforms=everything(),
                             stats_from="off")
    for _ in range(2):
        a, b = full.sample(16), part.sample(16, fields=["obs", "reward"])
        assert list(b) == ["obs", "reward"] and all(b[k].flags.c_contiguous for k in b)
        assert_exact(dict(b), {k: np.asarray(a[k]) for k in b})
    # a projection without any of a transform's fields skips it: the stored values
    c = part.sample(16, fields=["next_obs"])
    assert c["next_obs"].dtype == np.float32


def test_normalize_reads_the_statistics_of_every_row_of_the_dataset():
    data = data_of(CART, N_DS, 0)
    m = MixedReplayBuffer({"off": ArrayDataset(data), "on": sources(CART, "aos", "aos")["on"]},
                          seed=0, transforms=[Normalize("obs")], stats_from="off")
    s = m.stats("obs")
    twin = ReplayBuffer(CART, N_DS, stats=["obs"])  # the same rows, the buffer's own statistics
    twin.extend(data)
    t = twin.stats("obs")
    assert s.count == N_DS
    np.testing.assert_array_equal(s.mean, t.mean)
    np.testing.assert_array_equal(s.var, t.var)
    np.testing.assert_allclose(s.mean, data["obs"].astype(np.float64).mean(0), rtol=1e-9)
    np.testing.assert_allclose(s.var, data["obs"].astype(np.float64).var(0), rtol=1e-9)
    with pytest.raises(ValueError, match="no statistics of 'reward'"):
        m.stats("reward")


@pytest.mark.parametrize("lay_d, lay_b", PAIRS, ids=IDS)
def test_random_shift_and_cast_match_the_references(lay_d, lay_b):
    ts = [RandomShift("obs", 2, seed=9), Cast("obs", np.float32, scale=1 / 255)]
    plain = MixedReplayBuffer(sources(IMAGES, lay_d, lay_b), seed=1)
    m = MixedReplayBuffer(sources(IMAGES, lay_d, lay_b), seed=1, transforms=ts)
    key, counter = naive.key_of(9), 0
    for fields in (None, ["obs"], None):  # one RNG for every ring: the counter continues
        p, b = plain.sample(12, fields=fields), m.sample(12, fields=fields)
        shifted, counter = naive.random_shift(np.asarray(p["obs"]), 2, key, counter)
        want = {k: np.asarray(p[k]) for k in p}
        want["obs"] = naive.cast(shifted, np.float32, 1 / 255)
        assert_exact(dict(b), want)
        assert m.state_dict()["transforms"] == [{"seed": 9, "counter": counter}, None]


# -- checkpoints and state --------------------------------------------------------------------


def image_sources(tmp_path, layout):
    path = str(tmp_path / ("ds.npy" if layout == "aos" else "ds"))
    tfdata.io.save(path, data_of(IMAGES, 40, 0), layout)
    buf = ReplayBuffer(IMAGES, 32, layout=layout, seed=5)
    buf.extend(data_of(IMAGES, 20, 1))
    return {"off": tfdata.MmapDataset.open(path), "on": buf}


def image_transforms():
    return [RandomShift("obs", 3, seed=2), Compiled(double_reward, ["reward"]),
            Function(add_one_in_place, ["reward"])]


@pytest.mark.parametrize("layout", ["aos", "soa"])
def test_checkpoint_round_trip_continues_the_same_batches(tmp_path, layout):
    m = MixedReplayBuffer(image_sources(tmp_path, layout), seed=8, transforms=image_transforms())
    for _ in range(3):
        m.sample(10)
    m.save(tmp_path / "ck")
    doc = json.loads((tmp_path / "ck" / "mixed.json").read_text())
    assert doc["config"]["transforms"][1]["fn"] == f"{__name__}:double_reward"
    expect = [m.sample(10, copy=True) for _ in range(3)]
    back = MixedReplayBuffer.load(tmp_path / "ck", transforms=[double_reward, add_one_in_place])
    assert back.config == m.config
    assert back.state_dict()["transforms"] == doc["state"]["transforms"]
    for e in expect:
        g = back.sample(10)
        assert_batches_equal(dict(e), dict(g))
        np.testing.assert_array_equal(e.indices, g.indices)


def test_load_resolves_user_functions_only_among_those_given(tmp_path):
    m = MixedReplayBuffer(image_sources(tmp_path, "aos"), seed=8, transforms=image_transforms())
    m.save(tmp_path / "ck")
    listing = sorted(os.listdir(tmp_path))
    with pytest.raises(FormatError, match=r"mixed.json: config.transforms\[1\].fn: the function "
                                          r"'tests.test_mixed_transforms:double_reward' is not among"):
        MixedReplayBuffer.load(tmp_path / "ck", transforms=[add_one_in_place])
    with pytest.raises(FormatError, match=r"config.transforms\[2\].fn"):
        MixedReplayBuffer.load(tmp_path / "ck", transforms=[double_reward])
    assert sorted(os.listdir(tmp_path)) == listing


@pytest.mark.parametrize("edit, field", [
    (lambda d: d["config"]["transforms"][0].update(pad=-1), r"config.transforms\[0\]"),
    (lambda d: d["config"]["transforms"][0].update(name="import_this"), r"config.transforms\[0\]"),
    (lambda d: d["config"].update(stats_from="elsewhere"), "config.stats_from"),
    (lambda d: d["config"].update(roles=["reward"]), "config.roles"),
    (lambda d: d["config"].pop("roles"), "config"),
    (lambda d: d["state"]["transforms"][0].update(counter=-1), "state.transforms"),
    (lambda d: d["state"].update(transforms=[None]), "state.transforms"),
    (lambda d: d["state"].pop("transforms"), "state"),
])
def test_hostile_transform_entries_refused(tmp_path, edit, field):
    m = MixedReplayBuffer(image_sources(tmp_path, "aos"), seed=8, transforms=image_transforms())
    m.save(tmp_path / "ck")
    doc_path = tmp_path / "ck" / "mixed.json"
    doc = json.loads(doc_path.read_text())
    edit(doc)
    doc_path.write_text(json.dumps(doc))
    with pytest.raises(FormatError, match=f"mixed.json: {field}"):
        MixedReplayBuffer.load(tmp_path / "ck", transforms=[double_reward, add_one_in_place])


def test_state_dict_round_trip_and_bad_states_change_nothing():
    kw = dict(seed=2, transforms=[RandomShift("obs", 1, seed=4)])
    a = MixedReplayBuffer(sources(IMAGES, "soa", "soa"), **kw)
    a.sample(6)
    state, on = a.state_dict(), a.sources["on"].state_dict()
    expect = a.sample(6, copy=True)
    b = MixedReplayBuffer(sources(IMAGES, "soa", "soa"), **kw)
    before = b.state_dict()
    for bad in ({**state, "transforms": [{"seed": 4, "counter": "1"}]},
                {**state, "transforms": []}, {"seed": 2, "datasets": state["datasets"]}):
        with pytest.raises(ValueError, match="transforms"):
            b.load_state_dict(bad)
        assert b.state_dict() == before
    b.load_state_dict(state)
    b.sources["on"].load_state_dict(on)  # the buffer's state: its own
    assert_batches_equal(dict(expect), dict(b.sample(6)))


def test_a_function_without_import_path_is_refused_at_save(tmp_path):
    m = MixedReplayBuffer(sources(CART, "aos", "aos"), seed=0,
                          transforms=[Function(lambda f: None)])
    m.sample(4)
    with pytest.raises(TypeError, match="no import path"):
        m.save(tmp_path / "ck")
    assert os.listdir(tmp_path) == []


# -- refusals -----------------------------------------------------------------------------------


def test_normalize_needs_a_dataset_source_to_read_statistics_from():
    src = sources(CART, "aos", "aos")
    with pytest.raises(ValueError, match=r"keeps no running statistics of its own.*stats_from="):
        MixedReplayBuffer(src, transforms=[Normalize("obs")])
    with pytest.raises(NotImplementedError, match="stats_from='on': a buffer source"):
        MixedReplayBuffer(src, transforms=[Normalize("obs")], stats_from="on")
    with pytest.raises(ValueError, match="stats_from: expected the name of a dataset source"):
        MixedReplayBuffer(src, transforms=[Normalize("obs")], stats_from="nope")
    with pytest.raises(ValueError, match="no Normalize transform"):
        MixedReplayBuffer(src, transforms=[ScaleReward(2.0)], stats_from="off")
    with pytest.raises(tfdata.SpecError, match="Cast"):
        MixedReplayBuffer(src, transforms=[Cast("nope", "f8")])
    with pytest.raises(tfdata.MemoryBudgetError, match="statistics"):
        MixedReplayBuffer(src, transforms=[Normalize("obs")], stats_from="off", memory_budget=100)
    with pytest.raises(NotImplementedError, match="transforms="):  # a source's own: refused
        MixedReplayBuffer({"b": ReplayBuffer(CART, 8, transforms=[ScaleReward(2.0)])})


def test_projection_holding_part_of_a_transforms_fields_refused_before_allocating():
    m = MixedReplayBuffer(sources(CART, "aos", "aos"), seed=0,
                          transforms=[Compiled(double_reward, ["reward"]),
                                      Function(add_one_in_place, ["reward", "obs"])])
    with pytest.raises(ValueError, match="needs the fields"):
        m.sample(4, fields=["reward"])
    assert m.nbytes_parts == {"output_rings": 0}
    assert m.state_dict()["datasets"] == {"off": 0}


# -- memory -------------------------------------------------------------------------------------


@pytest.mark.parametrize("lay_d, lay_b", PAIRS, ids=IDS)
def test_nbytes_equal_the_plan(lay_d, lay_b):
    ts = [Normalize("obs"), Cast("action", "f8"),
          Compiled(double_reward, ["reward"]), ScaleReward(3.0)]
    m = MixedReplayBuffer(sources(CART, lay_d, lay_b), seed=0, ring_size=3, transforms=ts,
                          stats_from="off")
    trees = m.nbytes_parts["trees"]
    assert trees == tfdata.replay.columns.stats_nbytes(CART, ("obs",), N_DS) > 0
    m.sample(10)
    m.sample(4, fields=["obs", "reward"])
    m.sample(4, fields=["next_obs"])
    assert m.nbytes_parts == {"output_rings": m.plan_ring(10) + m.plan_ring(4, ["obs", "reward"])
                              + m.plan_ring(4, ["next_obs"]), "trees": trees}
    plain = MixedReplayBuffer(sources(CART, lay_d, lay_b), ring_size=3)
    # the transforms' arrays: obs as float32 (16 bytes a row), action as float64 (8)
    assert m.plan_ring(10) == plain.plan_ring(10) + 3 * 10 * (16 + 8)


@pytest.mark.parametrize("layout", ["aos", "soa"])
def test_steady_state_allocates_nothing(layout):
    spec = Spec(dict(CARTPOLE, img=("u1", (2, 12, 12))))
    src = {"off": ArrayDataset(data_of(spec, N_DS, 0), layout=layout),
           "on": ReplayBuffer(spec, 500, layout=layout, seed=1)}
    src["on"].extend(data_of(spec, 100, 1))
    m = MixedReplayBuffer(src, seed=0, stats_from="off",
                          transforms=[Normalize("obs", clip=5.0), ScaleReward(0.1), ClipReward(-1, 1),
                                      RandomShift("img", 2, seed=1), Cast("img", "f4", 1 / 255),
                                      Compiled(double_reward, ["reward"])])
    for _ in range(4):
        m.sample(64)
    grown = traced_growth(lambda: m.sample(64), 200)
    # one output array of a transform (64 rows of 4 float32 at least), or 4 bytes per sample,
    # would exceed these bounds
    assert min(g for g, _ in grown) < 768, grown
    assert min(p for _, p in grown) < 1024, grown
