"""Transforms on sample (tfdata.transforms): each built-in against its reference in naive.py in
every layout, composition, projections, checkpoints and their allow-list, the GIL, memory."""

from __future__ import annotations

import os
import threading
import tracemalloc

import numpy as np
import pytest
from numba import njit

from tfdata import (Cast, ClipReward, Compiled, FormatError, Function, Normalize,
                    PrioritizedReplayBuffer, RandomShift, ReplayBuffer, ScaleReward, SpecError)

from . import naive
from .conftest import CARTPOLE, random_rows
from .test_threads_memory import _released_mid_copy

GROUPED = [["obs", "reward"], ["action", "next_obs", "terminated", "truncated"]]
LAYOUTS = ["aos", "soa", GROUPED]
IDS = ["aos", "soa", "grouped"]
IMAGES = {"obs": ("u1", (2, 9, 11)), "reward": "f4", "terminated": "?", "truncated": "?"}
IMG_GROUPED = [["obs"], ["reward", "terminated", "truncated"]]


def rows_of(spec, n, seed=0):
    return random_rows(ReplayBuffer(spec, 1).spec, n, np.random.default_rng(seed))


def held(buf, name):
    """The rows held of ``name``, in slot order (a copy)."""
    return np.array(buf.column(name))


@njit(nogil=True)
def double_reward(reward):
    for i in range(reward.shape[0]):
        reward[i] = reward[i] * 2.0


@njit(nogil=True)
def ones_into(obs, out):
    """Fills ``out`` with ones, first row first (what the GIL probe watches)."""
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            out[i, j] = 1


@njit(nogil=True)
def action_as_float(obs, action, out):
    for i in range(out.shape[0]):
        out[i] = action[i] + obs[i, 0]


@njit(nogil=True)
def triple_reward(reward):
    """Used by one test only: whether it was ever compiled says whether its machine code ran."""
    for i in range(reward.shape[0]):
        reward[i] = reward[i] * 3.0


def half_more_action(fields):
    return {"action": fields["action"] + 0.5}


def negate_obs(fields):
    return {"obs": -fields["obs"]}


def add_one_in_place(fields):
    fields["reward"] += 1


def state_of(buf):
    return [dict(s) if s is not None else None for s in buf.state_dict().get("transforms", [])]


# -- each built-in against its reference, in every layout ------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS, ids=IDS)
@pytest.mark.parametrize("eps,clip", [(1e-8, None), (1.0, 0.5)])
def test_normalize_matches_reference(layout, eps, clip):
    buf = ReplayBuffer(CARTPOLE, 64, layout=layout, seed=3, stats=["obs"],
                       transforms=[Normalize("obs", eps=eps, clip=clip)])
    for step in range(3):  # the statistics of the rows held at each sample (the ring wraps)
        buf.extend(rows_of(CARTPOLE, 40, seed=step))
        batch = buf.sample(32)
        raw = held(buf, "obs")  # slot order: a batch's indices are slots
        s = buf.stats("obs")
        assert batch["obs"].dtype == np.float32
        want = naive.normalize(np.array(buf.storage.field("obs"))[batch.indices], s.mean, s.var, eps, clip)
        assert np.array_equal(batch["obs"], want)
        # and against numpy's statistics of the rows held (not the tree's): to rounding
        npy = naive.normalize(np.array(buf.storage.field("obs"))[batch.indices], raw.mean(0), raw.var(0), eps, clip)
        np.testing.assert_allclose(batch["obs"], npy, rtol=1e-5, atol=1e-6)


def test_normalize_divides_by_the_root_of_var_plus_eps():
    """A constant element and eps=1: (x - mean) / sqrt(var + eps), not / (sqrt(var) + eps)."""
    buf = ReplayBuffer(CARTPOLE, 8, seed=0, stats=["obs"], transforms=[Normalize("obs", eps=1.0)])
    rows = rows_of(CARTPOLE, 8)
    rows["obs"][:, 0] = 3.0  # constant: var 0
    rows["obs"][:, 1] = np.tile([-2.0, 2.0], 4)  # mean 0, var 4
    buf.extend(rows)
    b = buf.sample(8)
    assert np.all(b["obs"][:, 0] == 0.0)
    x = rows["obs"][b.indices, 1].astype(np.float64)
    assert np.array_equal(b["obs"][:, 1], (x * (1.0 / np.sqrt(5.0))).astype(np.float32))
    assert not np.array_equal(b["obs"][:, 1], (x / 3.0).astype(np.float32))  # sqrt(var) + eps
    # FieldStats.normalize divides by the same root: equal here (see Normalize's docstring)
    assert np.array_equal(b["obs"], buf.stats("obs").normalize(rows["obs"][b.indices], eps=1.0))


@pytest.mark.parametrize("layout", LAYOUTS, ids=IDS)
def test_normalize_agrees_with_field_stats_normalize(layout):
    """The transform multiplies by 1 / sqrt(var + eps), FieldStats.normalize divides by the
    root: the float32 results are the same but within an ulp of a rounding boundary (none in
    these rows)."""
    buf = ReplayBuffer(CARTPOLE, 256, layout=layout, seed=5, stats=["obs"],
                       transforms=[Normalize("obs")])
    buf.extend(rows_of(CARTPOLE, 256, seed=11))
    b = buf.sample(256)
    x = np.array(buf.storage.field("obs"))[b.indices]
    got = buf.stats("obs").normalize(x)
    assert got.dtype == np.float32 and np.array_equal(b["obs"], got)


def test_normalize_clip_bounds_and_nan():
    buf = ReplayBuffer(CARTPOLE, 16, seed=0, stats=["obs"], transforms=[Normalize("obs", clip=1.0)])
    rows = rows_of(CARTPOLE, 16)
    rows["obs"][:, 0] = np.r_[np.full(8, -100.0), np.full(8, 100.0)]  # +-1 sd: at the bounds
    rows["obs"][:, 1] = np.r_[np.zeros(15), 1e6]  # far outside
    rows["obs"][3, 2] = np.nan  # the element's statistics are NaN: so is every output of it
    buf.extend(rows)
    b = buf.sample(16)
    o = b["obs"]
    assert np.all(np.abs(o[:, :2]) <= 1.0) and 1.0 in o[:, 1] and np.isnan(o[:, 2]).all()
    assert set(np.unique(np.abs(o[:, 0]))) <= {np.float32(1.0), np.float32(1.0 - 1e-7)} or \
        np.allclose(np.abs(o[:, 0]), 1.0, atol=1e-6)
    assert not np.isnan(o[:, [0, 1, 3]]).any()


@pytest.mark.parametrize("layout", LAYOUTS, ids=IDS)
def test_reward_scale_and_clip_match_reference_in_order(layout):
    rows = rows_of(CARTPOLE, 50)
    rows["reward"][:4] = [np.nan, 0.1, -0.1, 0.05]
    out = {}
    for order in ("scale_first", "clip_first"):
        ts = [ScaleReward(10.0), ClipReward(-0.5, 0.5)]
        buf = ReplayBuffer(CARTPOLE, 50, layout=layout, seed=1,
                           transforms=ts if order == "scale_first" else ts[::-1])
        buf.extend(rows)
        b = buf.sample(200 // 4)
        r = rows["reward"][b.indices]
        want = (naive.scale_clip(naive.scale_clip(r, 10.0), 1.0, -0.5, 0.5) if order == "scale_first"
                else naive.scale_clip(naive.scale_clip(r, 1.0, -0.5, 0.5), 10.0))
        assert np.array_equal(b["reward"], want, equal_nan=True)
        out[order] = b["reward"].copy()
    assert not np.array_equal(out["scale_first"], out["clip_first"], equal_nan=True)


@pytest.mark.parametrize("layout", [None, "soa", IMG_GROUPED], ids=IDS)
def test_cast_matches_reference(layout):
    buf = ReplayBuffer(IMAGES, 40, layout=layout or "aos", seed=2,
                       transforms=[Cast("obs", np.float32, scale=1 / 255), Cast("reward", "f8")])
    rows = rows_of(IMAGES, 40)
    rows["reward"][0] = np.nan
    buf.extend(rows)
    b = buf.sample(64 // 2)
    assert b["obs"].dtype == np.float32 and b["reward"].dtype == np.float64
    assert np.array_equal(b["obs"], naive.cast(rows["obs"][b.indices], np.float32, 1 / 255))
    assert np.array_equal(b["reward"], naive.cast(rows["reward"][b.indices], np.float64), equal_nan=True)


@pytest.mark.parametrize("layout", [None, "soa", IMG_GROUPED], ids=IDS)
@pytest.mark.parametrize("pad", [0, 1, 4, 12])  # 12: past the whole image (every pixel an edge)
def test_random_shift_matches_reference(layout, pad):
    buf = ReplayBuffer(IMAGES, 30, layout=layout or "aos", seed=2,
                       transforms=[RandomShift("obs", pad, seed=9)])
    rows = rows_of(IMAGES, 30)
    buf.extend(rows)
    key, counter = naive.key_of(9), 0
    for _ in range(3):  # the counter continues from batch to batch
        b = buf.sample(16)
        want, counter = naive.random_shift(rows["obs"][b.indices], pad, key, counter)
        assert np.array_equal(b["obs"], want)
        assert state_of(buf) == [{"seed": 9, "counter": counter}]


def test_random_shift_moves_images_by_at_most_pad():
    """A single bright pixel moves by the drawn offset, never more than pad, and every offset
    of [-pad, pad] occurs."""
    spec = {"img": ("u1", (8, 8))}
    buf = ReplayBuffer(spec, 4, seed=0, transforms=[RandomShift("img", 2, seed=1)])
    img = np.zeros((4, 8, 8), np.uint8)
    img[:, 4, 4] = 255
    buf.extend({"img": img})
    seen = set()
    for _ in range(20):
        for im in buf.sample(4)["img"]:
            (y,), (x,) = np.nonzero(im == 255)[0][:1], np.nonzero(im == 255)[1][:1]
            seen.add((int(y) - 4, int(x) - 4))
    assert seen == {(dy, dx) for dy in range(-2, 3) for dx in range(-2, 3)}


# -- composition, layouts, projections ---------------------------------------------------------


def everything():
    return [Normalize("obs", clip=3.0), ScaleReward(0.5), ClipReward(-1.0, 1.0),
            Cast("action", np.float64), Compiled(double_reward, ["reward"]),
            Function(add_one_in_place)]


@pytest.mark.parametrize("cls", [ReplayBuffer, PrioritizedReplayBuffer])
def test_every_layout_gives_the_same_batches(cls):
    rows = rows_of(CARTPOLE, 100)
    batches = []
    for layout in LAYOUTS:
        buf = cls(CARTPOLE, 80, layout=layout, seed=5, stats=["obs"], transforms=everything())
        buf.extend(rows)
        batches.append([dict(buf.sample(24, copy=True)) for _ in range(3)])
    for other in batches[1:]:
        for a, b in zip(batches[0], other):
            assert a.keys() == b.keys()
            assert all(np.array_equal(a[k], b[k]) for k in a)


def test_composition_applies_in_order():
    rows = rows_of(CARTPOLE, 20)
    buf = ReplayBuffer(CARTPOLE, 20, seed=0, stats=["obs"], transforms=everything())
    buf.extend(rows)
    b = buf.sample(10)
    r = naive.scale_clip(naive.scale_clip(rows["reward"][b.indices], 0.5), 1.0, -1.0, 1.0)
    assert np.array_equal(b["reward"], (r * np.float32(2)) + np.float32(1))
    assert b["action"].dtype == np.float64 and np.array_equal(b["action"], rows["action"][b.indices])


def test_projection_is_the_full_batch_restricted():
    rows = rows_of(CARTPOLE, 60)
    kw = dict(seed=4, stats=["obs"], transforms=everything())
    full, part = ReplayBuffer(CARTPOLE, 60, **kw), ReplayBuffer(CARTPOLE, 60, **kw)
    full.extend(rows)
    part.extend(rows)
    for _ in range(2):
        a, b = full.sample(16), part.sample(16, fields=["obs", "reward"])
        assert list(b) == ["obs", "reward"]
        assert all(np.array_equal(a[k], b[k]) for k in b)


def test_projection_holding_part_of_a_transforms_fields_is_refused_before_allocating():
    buf = ReplayBuffer(CARTPOLE, 20, seed=0, transforms=[Compiled(ones_into, ["obs", "reward"])])
    buf.extend(rows_of(CARTPOLE, 20))
    before = dict(buf.nbytes_parts)
    with pytest.raises(ValueError, match="needs the fields"):
        buf.sample(4, fields=["obs"])
    assert buf.nbytes_parts == before


def test_sequences_apply_the_transforms_per_step():
    buf = ReplayBuffer(CARTPOLE, 40, seed=0, transforms=[ScaleReward(3.0), Cast("action", "f8")])
    rows = rows_of(CARTPOLE, 40)
    rows["terminated"][:] = rows["truncated"][:] = False
    buf.extend(rows)
    b = buf.sample_sequences(4, 5)
    assert b["reward"].shape == (4, 5) and b["action"].dtype == np.float64
    assert np.array_equal(b["reward"], naive.scale_clip(rows["reward"][b.indices], 3.0))


# -- user functions ----------------------------------------------------------------------------


def test_function_may_return_arrays_or_modify_in_place():
    rows = rows_of(CARTPOLE, 20)
    buf = ReplayBuffer(CARTPOLE, 20, seed=0, transforms=[Function(negate_obs), Function(add_one_in_place)])
    buf.extend(rows)
    b = buf.sample(8)
    assert np.array_equal(b["obs"], -rows["obs"][b.indices])
    assert np.array_equal(b["reward"], rows["reward"][b.indices] + np.float32(1))


def test_compiled_runs_without_the_gil():
    spec = {"obs": ("u1", (4 * 84 * 84,))}
    buf = ReplayBuffer(spec, 600, seed=0, ring_size=1,
                       transforms=[Compiled(ones_into, ["obs"], outputs={"obs": np.uint8})])
    buf.extend({"obs": np.zeros((600, 4 * 84 * 84), np.uint8)})
    out = buf.sample(600)["obs"]  # ring_size=1: every sample of 600 rows writes it again
    assert _released_mid_copy(out, lambda: buf.sample(600))


def test_compiled_runs_the_numba_function_not_its_python_function():
    """The dispatcher itself is called (its machine code, which releases the GIL), not its
    Python function: the first call compiles it for the batch's types."""
    assert triple_reward.signatures == []
    rows = rows_of(CARTPOLE, 20)
    buf = ReplayBuffer(CARTPOLE, 20, seed=0, transforms=[Compiled(triple_reward, ["reward"])])
    buf.extend(rows)
    b = buf.sample(8)
    assert len(triple_reward.signatures) == 1
    assert np.array_equal(b["reward"], rows["reward"][b.indices] * np.float32(3))


def test_function_results_are_cast_as_same_kind_only():
    """A Function's returned arrays are copied in with numpy's same_kind casting: float values
    into an integer field are refused, not truncated."""
    buf = ReplayBuffer(CARTPOLE, 20, seed=0, transforms=[Function(half_more_action)])
    buf.extend(rows_of(CARTPOLE, 20))
    with pytest.raises(TypeError, match="same_kind"):
        buf.sample(4)


@pytest.mark.parametrize("both", [False, True], ids=["next_obs without stats", "both with stats"])
def test_normalize_stats_of_uses_that_fields_statistics(both):
    rows = rows_of(CARTPOLE, 30)
    rows["next_obs"] = rows["next_obs"] * 10 + 5  # statistics of their own, far from obs's
    buf = ReplayBuffer(CARTPOLE, 30, seed=6, stats=["obs", "next_obs"] if both else ["obs"],
                       transforms=[Normalize("next_obs", stats_of="obs")])
    buf.extend(rows)
    b = buf.sample(16)
    s = buf.stats("obs")
    want = naive.normalize(rows["next_obs"][b.indices], s.mean, s.var, 1e-8)
    assert np.array_equal(b["next_obs"], want)


@pytest.mark.parametrize("make,error,match", [
    (lambda: ScaleReward(float("inf")), ValueError, "finite"),
    (lambda: ScaleReward(float("nan")), ValueError, "finite"),
    (lambda: ClipReward(1.0, -1.0), ValueError, "low <= high"),
    (lambda: Normalize("obs", clip=0.0), ValueError, "clip must be > 0"),
    (lambda: Normalize("obs", clip=-1.0), ValueError, "clip must be > 0"),
    (lambda: Normalize("obs", eps=-1e-8), ValueError, "eps must be >= 0"),
    (lambda: RandomShift("obs", -1), ValueError, "pad"),
    (lambda: RandomShift("obs", 256), ValueError, "pad"),
    (lambda: Cast("obs", "i4", scale=2.0), ValueError, "scale needs dtype float32 or float64"),
    (lambda: ScaleReward(True), TypeError, "scale must be a real number"),
], ids=["scale inf", "scale nan", "low > high", "clip 0", "clip < 0", "eps < 0", "pad < 0", "pad > 255",
        "int cast with scale", "scale a bool"])
def test_a_transforms_parameters_are_checked_when_it_is_made(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_normalize_of_a_frame_stacked_field_is_refused():
    spec = {"obs": ("u1", (2, 6, 6)), "reward": "f4", "terminated": "?", "truncated": "?"}
    with pytest.raises(NotImplementedError, match="frame-stacked"):
        ReplayBuffer(spec, 16, frame_stack={"obs": 2}, stats=["obs"], transforms=[Normalize("obs")])


def test_user_functions_are_checked_at_construction():
    with pytest.raises(TypeError, match="numba function"):
        Compiled(add_one_in_place, ["reward"])
    with pytest.raises(ValueError, match="nogil"):
        Compiled(njit(nogil=False)(add_one_in_place), ["reward"])
    with pytest.raises(SpecError, match="nope"):
        ReplayBuffer(CARTPOLE, 10, transforms=[Compiled(double_reward, ["nope"])])


# -- checkpoints ---------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS, ids=IDS)
def test_checkpoint_round_trip_continues_the_same_batches(tmp_path, layout):
    spec = dict(CARTPOLE, img=("u1", (3, 6, 6)))
    rows = rows_of(spec, 70)
    ts = [RandomShift("img", 2, seed=7), Normalize("obs"), Compiled(double_reward, ["reward"]),
          Function(negate_obs)]
    grouped = [g + (["img"] if i == 0 else []) for i, g in enumerate(GROUPED)] if layout is GROUPED else layout
    buf = ReplayBuffer(spec, 64, layout=grouped, seed=1, stats=["obs"], transforms=ts)
    buf.extend(rows)
    buf.sample(8)
    buf.save(tmp_path / "ck")
    for other in ("aos", "soa"):  # and into another layout: the same batches
        loaded = ReplayBuffer.load(tmp_path / "ck", transforms=[double_reward, negate_obs], layout=other)
        assert loaded.config["transforms"] == buf.config["transforms"]
        twin = ReplayBuffer.load(tmp_path / "ck", transforms=[negate_obs, double_reward])
        for _ in range(3):
            a, b = twin.sample(8), loaded.sample(8)
            assert all(np.array_equal(a[k], b[k]) for k in a)
    twin = ReplayBuffer.load(tmp_path / "ck", transforms=[negate_obs, double_reward])
    for _ in range(3):
        a, b = buf.sample(8), twin.sample(8)  # the original continues as the loaded one
        assert all(np.array_equal(a[k], b[k]) for k in a)


def test_load_resolves_user_functions_only_among_those_given(tmp_path):
    buf = ReplayBuffer(CARTPOLE, 10, seed=0, transforms=[Compiled(double_reward, ["reward"])])
    buf.extend(rows_of(CARTPOLE, 10))
    buf.save(tmp_path / "ck")
    for given in ([], [negate_obs]):
        with pytest.raises(FormatError, match="test_sample_transforms:double_reward"):
            ReplayBuffer.load(tmp_path / "ck", transforms=given)
    assert sorted(os.listdir(tmp_path)) == ["ck"]
    ReplayBuffer.load(tmp_path / "ck", transforms=[double_reward])


def test_a_function_without_import_path_is_refused_at_save(tmp_path):
    def local(fields):
        return None

    for fn in (lambda f: None, local):
        buf = ReplayBuffer(CARTPOLE, 10, seed=0, transforms=[Function(fn)])
        with pytest.raises(TypeError, match="no import path"):
            buf.save(tmp_path / "ck")
        assert not os.listdir(tmp_path)


def test_a_bad_transform_state_is_refused_and_changes_nothing():
    buf = ReplayBuffer(IMAGES, 10, seed=0, transforms=[RandomShift("obs", seed=3)])
    buf.extend(rows_of(IMAGES, 10))
    buf.sample(4)
    state = buf.state_dict()
    for bad in ([{"seed": 3}], [{"seed": 3, "counter": -1}], [], "x", [{"seed": 3, "counter": 1}, None]):
        with pytest.raises(ValueError, match="transform"):
            buf.load_state_dict(dict(state, transforms=bad))
        assert state_of(buf) == state["transforms"]
    buf.load_state_dict(dict(state, transforms=[{"seed": 4, "counter": 10}]))
    assert state_of(buf) == [{"seed": 4, "counter": 10}]


def test_a_hostile_config_is_a_format_error(tmp_path):
    import json

    buf = ReplayBuffer(CARTPOLE, 10, seed=0, stats=["obs"], transforms=[Normalize("obs")])
    buf.extend(rows_of(CARTPOLE, 10))
    buf.save(tmp_path / "ck")
    path = tmp_path / "ck" / "state.json"
    doc = json.loads(path.read_text())
    for bad in ([{"name": "normalize"}], [{"name": "os:system"}], "x",
                [{"name": "normalize", "field": "obs", "eps": -1, "clip": None, "stats_of": "obs"}],
                [{"name": "function", "fn": "os:system", "fields": None}],
                [{"name": "normalize", "field": "obs", "eps": 1e-8, "clip": None, "stats_of": "obs",
                  "then": "os:system"}]):
        path.write_text(json.dumps(dict(doc, config=dict(doc["config"], transforms=bad))))
        with pytest.raises(FormatError, match="config.transforms"):
            ReplayBuffer.load(tmp_path / "ck")


# -- refusals, memory --------------------------------------------------------------------------


@pytest.mark.parametrize("transform,match", [
    (Normalize("obs"), "stats=\\['obs'\\]"),
    (Normalize("nope"), "nope"),
    (Cast("obs", "i2"), "safely"),
    (RandomShift("reward"), "image"),
])
def test_refused_construction_allocates_nothing(transform, match):
    import tfdata.alloc as alloc

    a = alloc.resolve("numpy")
    before = a.allocations
    with pytest.raises(SpecError, match=match):
        ReplayBuffer(CARTPOLE, 10, transforms=[transform], allocator=a)
    with pytest.raises(SpecError, match=match):
        ReplayBuffer.plan_memory(CARTPOLE, 10, transforms=[transform])
    assert a.allocations == before


@pytest.mark.parametrize("layout", LAYOUTS, ids=IDS)
def test_nbytes_equal_the_plan(layout):
    spec = dict(CARTPOLE, img=("u1", (2, 5, 5)))
    ts = [Normalize("obs"), Cast("img", "f4", 1 / 255), RandomShift("img", 1, seed=0),
          Compiled(action_as_float, ["obs", "action"], outputs={"action": "f8"}), Cast("reward", "f8")]
    lay = [g + (["img"] if i == 0 else []) for i, g in enumerate(GROUPED)] if layout is GROUPED else layout
    buf = ReplayBuffer(spec, 30, layout=lay, seed=0, stats=["obs"], transforms=ts)
    buf.extend(rows_of(spec, 30))
    buf.sample(7)
    buf.sample(5, fields=["obs", "img", "action"])
    buf.sample(5, fields=["reward"])
    buf.sample_sequences(2, 3)
    plan = ReplayBuffer.plan_memory(spec, 30, layout=lay, stats=["obs"], transforms=ts,
                                    batch_sizes=[7, (5, None, ["obs", "img", "action"]),
                                                 (5, None, ["reward"]), (2, 3)])
    assert buf.nbytes_parts == plan


def test_steady_state_sampling_allocates_nothing(layout):
    spec = dict(CARTPOLE, img=("u1", (2, 12, 12)))
    buf = ReplayBuffer(spec, 500, layout=layout, seed=0, stats=["obs"],
                       transforms=[Normalize("obs", clip=5.0), ScaleReward(0.1), ClipReward(-1, 1),
                                   RandomShift("img", 2, seed=1), Cast("img", "f4", 1 / 255),
                                   Compiled(double_reward, ["reward"])])
    rows = rows_of(spec, 100)
    for _ in range(3):
        buf.extend(rows)
    for _ in range(3):
        buf.extend(rows)
        buf.sample(256)
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        for _ in range(100):
            buf.extend(rows)
            buf.sample(256)
        current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert current - base < 1024, current - base
    assert peak - base < 4096, peak - base


def test_transforms_apply_under_the_lock_for_every_thread():
    buf = ReplayBuffer(IMAGES, 50, seed=0, transforms=[RandomShift("obs", 3, seed=2)])
    buf.extend(rows_of(IMAGES, 50))
    counts = []

    def run():
        for _ in range(20):
            buf.sample(5)
        counts.append(1)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(counts) == 3
    # every row of every batch took exactly its two draws (no draw lost to a race)
    _, counter = naive.random_shift(np.zeros((300, 1, 2, 2), np.uint8), 3, naive.key_of(2), 0)
    assert state_of(buf) == [{"seed": 2, "counter": counter}]


def test_a_hostile_transform_state_is_a_format_error(tmp_path):
    import json

    buf = ReplayBuffer(IMAGES, 10, seed=0, transforms=[RandomShift("obs", seed=3)])
    buf.extend(rows_of(IMAGES, 10))
    buf.save(tmp_path / "ck")
    path = tmp_path / "ck" / "state.json"
    doc = json.loads(path.read_text())
    states = [None, [{"seed": "x", "counter": 0}], [{"seed": 1, "counter": 2 ** 64}], [None],
              [{"seed": 1, "counter": 0}, None], {"0": {"seed": 1, "counter": 0}}]
    for bad in states:
        st = dict(doc["state"])
        if bad is None:
            del st["transforms"]
        else:
            st["transforms"] = bad
        path.write_text(json.dumps(dict(doc, state=st)))
        with pytest.raises(FormatError, match="state.transforms"):
            ReplayBuffer.load(tmp_path / "ck")
