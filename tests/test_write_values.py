"""The values a user's loop produces, on every layout: each takes the generated write's first
tier (a push's ``struct`` pack, a one-step extend's converted bytes, a larger extend's direct
assignments), and the rows it leaves equal the generic path's and those of tests/naive.py's
ring; what the spec refuses leaves the buffer as it was, a full ring included.

Which path a call took is read from the generated function's globals: ``slow`` (the generic
path) and ``lock`` (only the push's second tier, numpy assignments, enters it with ``with``).
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from tfdata import ReplayBuffer, Spec, SpecError

from .naive import RingModel

SPEC = Spec({"obs": ("f4", (4,)), "action": "i8", "reward": "f4", "next_obs": ("f4", (4,)),
             "terminated": "?", "truncated": "?"})
# one scalar field of each kind beside the observations, for narrower and wider targets
NARROW = Spec({"obs": ("f4", (3,)), "a8": "u1", "a32": "i4", "r64": "f8", "terminated": "?",
               "truncated": "?"})
LAYOUTS = ["aos", "soa", (("obs", "action", "reward", "terminated", "truncated"), ("next_obs",))]
NARROW_LAYOUTS = ["aos", "soa", (("obs", "a8"), ("a32", "r64", "terminated", "truncated"))]

_OBS = np.random.default_rng(0).standard_normal((64, 8)).astype(np.float32)


def _views(k):
    """obs and next_obs as a vector env's step hands them: rows of a larger array."""
    return _OBS[k, :4], _OBS[k + 1, :4]


def _row_kinds(k):
    """Rows of SPEC as loops produce them: name -> row."""
    obs, nxt = _views(k)
    base = {"obs": obs, "action": k % 3, "reward": 0.5 * k, "next_obs": nxt, "terminated": k % 5 == 0,
            "truncated": False}
    gym = dict(base, action=np.int64(k % 3), reward=np.float64(0.5 * k),
               terminated=np.bool_(k % 5 == 0), truncated=np.bool_(False))
    zero_d = dict(base, action=np.array(k % 3), reward=np.array(0.25 * k),
                  terminated=np.array(k % 5 == 0), truncated=np.array(False))
    return {
        "python": base,
        "gymnasium": gym,
        "0-d arrays": zero_d,
        "0-d float32, uint8": dict(base, reward=np.array(1.5, np.float32), action=np.array(7, np.uint8)),
        "strided slices": dict(base, obs=_OBS[k, ::2], next_obs=_OBS[k + 1, 1::2]),
        "column views": dict(base, obs=_OBS[:4, k % 8], next_obs=_OBS.T[k % 8, 4:8]),
        "unpickled arrays": dict(base, obs=pickle.loads(pickle.dumps(_OBS[k:k + 1, :4]))[0]),
        "numpy ints": dict(base, action=[np.int8, np.int16, np.int32, np.uint16, np.uint32, np.uint64,
                                         np.longlong, np.ulonglong][k % 8](k)),
        "numpy floats": dict(base, reward=[np.float16, np.float32, np.float64][k % 3](k / 3)),
        "ints into float": dict(base, reward=[k, np.int64(-k), np.uint64(k), np.int8(-k), True][k % 5]),
        "ints as flags": dict(base, terminated=k % 2, truncated=np.int64(1 - k % 2)),
        "nan and infinities": dict(base, reward=[float("nan"), float("inf"), -np.inf, np.float64("nan")][k % 4]),
        "float32 edges": dict(base, reward=[3.4028234663852886e38, -3.4028234663852886e38, 1e-45,
                                            np.float64(-1e-46)][k % 4]),
    }


def _narrow_rows(k):
    obs = _OBS[k, 1:4]
    return [
        {"obs": obs, "a8": 255, "a32": -(2**31), "r64": 1e300, "terminated": 1, "truncated": np.int8(0)},
        {"obs": obs, "a8": np.int64(3), "a32": np.uint64(2**31 - 1), "r64": np.int64(2**53),
         "terminated": np.bool_(True), "truncated": 0},
        {"obs": obs, "a8": np.array(np.uint16(200)), "a32": np.array(-5, np.int64),
         "r64": np.array(np.float16(0.1)), "terminated": np.array(1), "truncated": np.array(False)},
        {"obs": obs, "a8": True, "a32": np.bool_(True), "r64": np.longlong(-7), "terminated": False,
         "truncated": np.uint8(1)},
    ]


def _watch(fn):
    """Count calls of the generic path and entries of the second tier of generated ``fn``."""
    g = fn.__globals__
    seen = {"slow": 0, "numpy": 0}
    slow = g["slow"]

    def counted(*a):
        seen["slow"] += 1
        return slow(*a)

    g["slow"] = counted
    if "lock" in g:
        lock = g["lock"]

        class Entered:
            def __enter__(self):
                seen["numpy"] += 1
                return lock.__enter__()

            def __exit__(self, *exc):
                return lock.__exit__(*exc)

        g["lock"] = Entered()
    return seen


def _naive_fields(spec, model):
    """Every stored field of the naive ring, in slot order, cast as numpy assigns the values."""
    out = {}
    for f in spec:
        ref = np.zeros((model.capacity,) + f.shape, f.dtype)
        for s, row in enumerate(model.slots):
            if row is not None:
                with np.errstate(all="ignore"):
                    ref[s] = row[f.name]
        out[f.name] = ref
    return out


def _assert_same_rows(spec, fast, slow, model):
    want = _naive_fields(spec, model)
    assert fast._writer.cursor == slow._writer.cursor == model.cursor
    assert len(fast) == len(slow) == model.size
    for f in spec:
        a, b = fast.storage.field(f.name), slow.storage.field(f.name)
        assert a.tobytes() == b.tobytes() == want[f.name].tobytes(), f.name


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", list(_row_kinds(0)))
def test_push_of_each_kind_of_value_takes_the_first_tier(layout, kind):
    """Seven rows of one kind into a ring of five (it wraps): no call leaves the first tier,
    and the rows are the generic path's and the naive ring's, byte for byte."""
    fast = ReplayBuffer(SPEC, 5, layout=layout, seed=0)
    slow = ReplayBuffer(SPEC, 5, layout=layout, seed=0)
    model = RingModel(5)
    seen = _watch(fast.push)
    for k in range(7):
        row = _row_kinds(k)[kind]
        fast.push(row)
        with np.errstate(all="ignore"):
            slow._checked_push(row)
        model.push(row)
    assert seen == {"slow": 0, "numpy": 0}
    _assert_same_rows(SPEC, fast, slow, model)


@pytest.mark.parametrize("layout", NARROW_LAYOUTS)
def test_push_into_narrower_and_wider_fields_takes_the_first_tier(layout):
    """Ints at the edges of uint8 and int32 fields, from wider numpy ints; ints into a float64
    field up to 2**53; ints and numpy ints of 0 and 1 into flags; 0-d arrays of other dtypes."""
    fast = ReplayBuffer(NARROW, 3, layout=layout, seed=0)
    slow = ReplayBuffer(NARROW, 3, layout=layout, seed=0)
    model = RingModel(3)
    seen = _watch(fast.push)
    for k, row in enumerate(_narrow_rows(1) * 2):
        fast.push(row)
        slow._checked_push(row)
        model.push(row)
    assert seen == {"slow": 0, "numpy": 0}
    _assert_same_rows(NARROW, fast, slow, model)


def _refused(k):
    """Rows the spec refuses, each for one field (the rest valid), and the field it names."""
    obs, nxt = _views(k)
    base = {"obs": obs, "action": 1, "reward": 1.0, "next_obs": nxt, "terminated": False, "truncated": False}
    return [
        ("action", dict(base, action=2**63)),
        ("action", dict(base, action=np.uint64(2**63))),
        ("action", dict(base, action=1.0)),
        ("action", dict(base, action=np.array(2.5))),
        ("action", dict(base, action=np.array(5, dtype=object))),
        ("reward", dict(base, reward=np.array(0.5, dtype=object))),
        ("terminated", dict(base, terminated=2)),
        ("terminated", dict(base, terminated=np.int64(-1))),
        ("terminated", dict(base, terminated=np.array(3))),
        ("terminated", dict(base, terminated=0.0)),
        ("reward", dict(base, reward=complex(1, 1))),
        ("reward", dict(base, reward="1.0")),
        ("reward", dict(base, reward=np.array([1.0]))),
        ("obs", dict(base, obs=_OBS[k:k + 2, :2])),
        ("obs", dict(base, obs=_OBS[k, :3])),
        # one element more, the same elements with a second axis, and a 0-d array: the push
        # checks a 1-D field by ndim and length, not by its shape tuple
        ("obs", dict(base, obs=_OBS[k, :5])),
        ("obs", dict(base, obs=_OBS[k:k + 4, :1])),
        ("next_obs", dict(base, next_obs=_OBS[k + 1:k + 2, :4])),
        ("next_obs", dict(base, next_obs=np.array(1.0, np.float32))),
        ("obs", dict(base, obs=_OBS[k, :4].astype(np.complex64))),
    ]


def _full_rings(layout: str, cap: int) -> tuple:
    """A ring of ``cap`` rows that has wrapped (the cursor on a live row) filled by the fast
    push, its twin filled by the generic path, and the naive ring given the same rows."""
    fast = ReplayBuffer(SPEC, cap, layout=layout, seed=0)
    slow = ReplayBuffer(SPEC, cap, layout=layout, seed=0)
    model = RingModel(cap)
    for k in range(cap + 2):
        row = _row_kinds(k)["python"]
        fast.push(row)
        slow._checked_push(row)
        model.push(row)
    return fast, slow, model


@pytest.mark.parametrize("layout", LAYOUTS)
def test_refused_values_leave_a_full_ring_as_it_was(layout):
    """A full ring with the cursor on a live row: each refused value, pushed or extended (one
    row, and 40 rows), raises SpecError naming the field and leaves every byte, the cursor and
    the size as they were; the row that follows then lands as the generic path's."""
    buf, ref, model = _full_rings(layout, 5)
    before = {f.name: buf.storage.field(f.name).tobytes() for f in SPEC}
    for name, row in _refused(3):
        for call in ("push", "step", "batch"):
            if call == "push":
                arg = row
            else:
                n = 1 if call == "step" else 40
                arg = {k: np.stack([np.asarray(v)] * n) for k, v in row.items()}
            with pytest.raises(SpecError, match=name):
                getattr(buf, "push" if call == "push" else "extend")(arg)
            assert buf._writer.cursor == 2 and len(buf) == 5
            assert {f.name: buf.storage.field(f.name).tobytes() for f in SPEC} == before, (name, call)
    row = _row_kinds(9)["gymnasium"]
    buf.push(row)
    ref._checked_push(row)
    model.push(row)
    _assert_same_rows(SPEC, buf, ref, model)


def _step(k, n, kind):
    """One vector-env step of ``n`` rows as gymnasium's vector envs hand it, or variants."""
    rng = np.random.default_rng(k)
    obs = _OBS[k % 32:k % 32 + n + 1, :4] if n < 32 else rng.standard_normal((n + 1, 4)).astype(np.float32)
    step = {"obs": obs[:n], "action": rng.integers(0, 3, n), "reward": rng.standard_normal(n),
            "next_obs": obs[1:], "terminated": rng.random(n) < 0.2, "truncated": np.zeros(n, bool)}
    if kind == "exact":
        step.update(action=step["action"].astype(np.int64), reward=step["reward"].astype(np.float32))
    elif kind == "int rewards":
        step.update(reward=rng.integers(-5, 5, n), action=rng.integers(0, 3, n).astype(np.uint64))
    elif kind == "strided":
        wide = rng.standard_normal((n, 8)).astype(np.float32)
        step.update(obs=wide[:, ::2], reward=rng.standard_normal(2 * n)[::2],
                    action=rng.integers(0, 3, (n, 2))[:, 1])
    elif kind == "unpickled":
        step = pickle.loads(pickle.dumps(step))
    return step


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", ["gymnasium", "exact", "int rewards", "strided", "unpickled"])
@pytest.mark.parametrize("n", [1, 8, 40])
def test_extend_of_each_kind_of_step_takes_the_generated_path(layout, kind, n):
    """Steps of 1 and 8 rows (converted by the generated extend) and batches of 40 (assigned
    field by field into the storage), float64 or int rewards, int64 or uint64 actions, views,
    strided columns, unpickled dtypes: the generic path runs only for the batch that crosses
    the ring's end, and the rows equal the generic path's and the naive ring's."""
    cap = 3 * n + 2
    fast = ReplayBuffer(SPEC, cap, layout=layout, seed=0)
    slow = ReplayBuffer(SPEC, cap, layout=layout, seed=0)
    model = RingModel(cap)
    seen = _watch(fast.extend)
    crossings = 0
    for k in range(5):
        step = _step(k, n, kind)
        crossings += n <= 16 and fast._writer.cursor + n > cap  # a larger batch: the writer's
        fast.extend(step)
        slow._checked_extend(step)
        model.extend(step)
    assert seen["slow"] == crossings
    _assert_same_rows(SPEC, fast, slow, model)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_floats_beyond_float32_land_as_numpy_casts_them_in_a_full_ring(layout):
    """Finite floats beyond float32's range, of both signs (numpy stores an infinity, struct
    would refuse after zeroing the record): never the first tier; in a full ring each lands at
    the cursor as the generic path and the naive ring have it, and no other row changes."""
    fast, slow, model = _full_rings(layout, 4)
    seen = _watch(fast.push)
    values = [1e39, -1e39, 1e300, -1e300, np.float64(-1e39), np.float64(3.5e38), -3.4028236e38]
    for k, v in enumerate(values):
        row = dict(_row_kinds(k)["gymnasium"], reward=v)
        with np.errstate(all="ignore"):
            fast.push(row)
            slow._checked_push(row)
        model.push(row)
    assert seen["slow"] == 0 and seen["numpy"] == len(values)
    _assert_same_rows(SPEC, fast, slow, model)
