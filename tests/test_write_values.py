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
    elif kind in _LIST_KINDS:
        step.update(_LIST_KINDS[kind](step, rng, n))
    return step


# a scalar field's rows as a loop builds them (lists and tuples of Python or numpy scalars),
# and ints as flags (arrays of 0 and 1 as some wrappers return): what the one-step extend
# reads itself (np.asarray, the generic path's own reading, then its rules)
_LIST_KINDS = {
    "python lists": lambda s, rng, n: dict(
        action=s["action"].tolist(), reward=s["reward"].tolist(), terminated=s["terminated"].tolist(),
        truncated=tuple(s["truncated"].tolist())),
    "python int flags": lambda s, rng, n: dict(
        terminated=[int(t) for t in s["terminated"]], truncated=tuple(int(t) for t in rng.random(n) < 0.5)),
    "numpy scalar lists": lambda s, rng, n: dict(
        action=list(s["action"]), reward=[np.float32(r) for r in s["reward"]],
        terminated=list(s["terminated"]), truncated=tuple(np.bool_(t) for t in s["truncated"])),
    "mixed lists": lambda s, rng, n: dict(  # ints and floats: float64, as numpy reads them
        reward=[int(k) if k % 2 else 0.25 * k for k in range(n)],
        action=tuple(np.int32(a) for a in s["action"]), terminated=[bool(t) for t in s["terminated"]]),
    "int flag arrays": lambda s, rng, n: dict(
        terminated=s["terminated"].astype(np.int64), truncated=(rng.random(n) < 0.5).astype(np.uint8)),
    "int8 flags, list rewards": lambda s, rng, n: dict(
        terminated=s["terminated"].astype(np.int8), truncated=np.ones(n, np.uint64),
        reward=s["reward"].tolist()),
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", ["gymnasium", "exact", "int rewards", "strided", "unpickled",
                                  *_LIST_KINDS])
@pytest.mark.parametrize("n", [1, 8, 40])
def test_extend_of_each_kind_of_step_takes_the_generated_path(layout, kind, n):
    """Steps of 1 and 8 rows (converted by the generated extend) and batches of 40 (assigned
    field by field into the storage), float64 or int rewards, int64 or uint64 actions, views,
    strided columns, unpickled dtypes, lists and tuples of Python and numpy scalars, int flags:
    the generic path runs only for the batch that crosses the ring's end, and the rows equal
    the generic path's and the naive ring's."""
    _extend_twins(SPEC, 3 * n + 2, layout, n, [_step(k, n, kind) for k in range(5)])


def _extend_twins(spec, cap: int, layout: str, n: int, steps: list) -> None:
    """Extend a ring of ``cap`` rows by ``steps`` of ``n`` rows, its twin by the generic path
    and the naive ring: the generic path runs only for a step of at most 16 rows that crosses
    the ring's end (a larger batch that does goes to the writer), and the rows are the same."""
    fast = ReplayBuffer(spec, cap, layout=layout, seed=0)
    slow = ReplayBuffer(spec, cap, layout=layout, seed=0)
    model = RingModel(cap)
    seen = _watch(fast.extend)
    crossings = 0
    for step in steps:
        crossings += n <= 16 and fast._writer.cursor + n > cap
        fast.extend(step)
        slow._checked_extend(step)
        model.extend(step)
    assert seen["slow"] == crossings
    _assert_same_rows(spec, fast, slow, model)


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


def _narrow_step(k, n):
    """A step of NARROW: lists of ints at the edges of the uint8 and int32 fields, of floats
    and ints into float64, int flags as lists and as arrays of every width."""
    obs = _OBS[k:k + n, 1:4]
    edge8, edge32 = [0, 255, 7][k % 3], [-(2**31), 2**31 - 1, -5][k % 3]
    flag = [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64, np.uint64][k % 8]
    return {"obs": obs, "a8": [edge8] * n, "a32": tuple([edge32] * n),
            "r64": [1e300, 2**53, -7, 0.1][:n] + [float(k)] * max(0, n - 4),
            "terminated": [(k + j) % 2 for j in range(n)],
            "truncated": np.array([(k + j + 1) % 2 for j in range(n)], flag)}


@pytest.mark.parametrize("layout", NARROW_LAYOUTS)
@pytest.mark.parametrize("n", [1, 3, 16])
def test_extend_of_lists_and_int_flags_into_narrower_fields_takes_the_generated_path(layout, n):
    """Lists of ints that fit uint8 and int32 by value (checked as the generic path checks
    them), floats and ints into float64, int flags of every width: no call leaves the
    generated extend but the one that crosses the ring's end, and the rows are the generic
    path's and the naive ring's."""
    _extend_twins(NARROW, 2 * n + 1, layout, n, [_narrow_step(k, n) for k in range(8)])


def _state(buf) -> dict:
    """Everything a write may change: the writer, the stored bytes, the episode bookkeeping."""
    out = {}

    def walk(prefix, d):
        for k, v in d.items():
            if isinstance(v, dict):
                walk(f"{prefix}{k}.", v)
            else:
                out[prefix + k] = v.tobytes() if isinstance(v, np.ndarray) else v

    walk("", buf.state_dict())
    out.pop("sampler.counter", None)
    return out


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("num_envs,elide", [(2, False), (1, True), (3, True)])
def test_lists_and_int_flags_of_several_streams_and_elided_buffers(layout, num_envs, elide):
    """Several streams (episode numbers stamped from the flags at each write) and a buffer
    that elides next_obs (its compiled step reads the flags): steps whose scalar fields are
    lists, tuples and int flags take the generated extend (the generic path only where an
    elided buffer's final table grows), and leave the generic path's state, entry for entry,
    and that of the same steps with bool flags."""
    cap = 5 * num_envs
    fast, slow, bools = (ReplayBuffer(SPEC, cap, layout=layout, seed=0, num_envs=num_envs,
                                      elide_next=elide) for _ in range(3))
    seen = _watch(fast.extend)
    rng = np.random.default_rng(num_envs)
    obs = _OBS[:num_envs, :4].copy()
    kinds = list(_LIST_KINDS)
    for t in range(24):
        nxt = rng.standard_normal((num_envs, 4)).astype(np.float32)
        step = dict(_step(t, num_envs, "gymnasium"), obs=obs, next_obs=nxt)
        step.update(_LIST_KINDS[kinds[t % len(kinds)]](step, rng, num_envs))
        fast.extend(step)
        slow._checked_extend(step)
        # the generic path once read int flags as they came: its kernels then raised mid-write
        bools._checked_extend(dict(step, terminated=np.asarray(step["terminated"], bool),
                                   truncated=np.asarray(step["truncated"], bool)))
        ends = np.asarray(step["terminated"], bool) | np.asarray(step["truncated"], bool)
        obs = np.where(ends[:, None], rng.standard_normal((num_envs, 4)), nxt).astype(np.float32)
    # steps of num_envs rows fill the ring exactly: none crosses its end; an elided buffer's
    # final table grows a few times (the generic path's work)
    assert seen["slow"] == 0 if not elide else seen["slow"] <= 3
    assert _state(fast) == _state(slow) == _state(bools)
    if elide:  # every stored row is read back with its elided next_obs
        b = len(slow)
        got, want = dict(fast.sample(b)), dict(slow.sample(b))
        for k in want:
            assert got[k].tobytes() == want[k].tobytes(), k


def _refused_steps(n):
    """Steps of ``n`` rows the spec refuses, each for one field (the rest valid lists and
    flags the generated extend takes), the field or word the error names first."""
    obs = _OBS[:n, :4]
    base = {"obs": obs, "action": [1] * n, "reward": [0.5] * n, "next_obs": _OBS[1:n + 1, :4],
            "terminated": [0] * n, "truncated": np.zeros(n, np.int64)}
    bad = [
        ("terminated", dict(terminated=[2] + [0] * (n - 1))),
        ("terminated", dict(terminated=[0] * (n - 1) + [-1])),
        ("terminated", dict(terminated=np.array([0] * (n - 1) + [2]))),
        ("terminated", dict(terminated=np.array([256] + [0] * (n - 1), np.int64))),
        ("terminated", dict(terminated=np.array([0] * (n - 1) + [-1], np.int8))),
        ("truncated", dict(truncated=np.array([1] * (n - 1) + [255], np.uint8))),
        ("truncated", dict(truncated=[0.0] * n)),
        ("truncated", dict(truncated=np.ones(n, np.float32))),
        ("action", dict(action=[1.0] + [0] * (n - 1))),
        ("action", dict(action=[0] * (n - 1) + [2**63])),
        ("action", dict(action=[0] * (n - 1) + [2**64])),
        ("action", dict(action=[[0]] * n)),
        ("action", dict(action=["1"] * n)),
        ("reward", dict(reward=[1.0] * (n - 1) + [[2.0, 3.0]])),
        ("reward", dict(reward=[1.0] * (n + 1))),
        ("reward", dict(reward="ab")),
        ("reward", dict(reward=[1 + 1j] * n)),
        ("reward", dict(reward=[None] * n)),
        ("reward", dict(reward=())),
    ]
    if n > 1:
        bad.append(("reward", dict(reward=[0.5] * (n - 1))))
    return [(name, dict(base, **change)) for name, change in bad]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("n", [1, 4])
def test_refused_lists_and_flags_raise_the_generic_error_and_leave_a_full_ring(layout, n):
    """A full ring with the cursor on a live row: each refused step (a flag other than 0 and 1,
    in a list or an int array of any width; float flags; a float or an int out of range in a
    list of ints; a ragged, nested, too long or too short list; strings, complex, None; a
    string for a list) raises the generic path's SpecError, word for word, and leaves every
    byte, the cursor and the size as they were; the step that follows lands as the generic
    path's."""
    buf, ref, model = _full_rings(layout, 7)
    before = _state(buf)
    for name, step in _refused_steps(n):
        with pytest.raises(SpecError, match=name) as generic:
            ref._checked_extend(step)
        with pytest.raises(SpecError) as got:
            buf.extend(step)
        assert str(got.value) == str(generic.value)
        assert _state(buf) == before, (name, str(got.value))
    step = dict(_step(3, n, "python lists"), obs=_OBS[:n, :4], next_obs=_OBS[1:n + 1, :4])
    seen = _watch(buf.extend)
    buf.extend(step)
    ref._checked_extend(step)
    model.extend(step)
    assert seen["slow"] == 0
    _assert_same_rows(SPEC, buf, ref, model)


@pytest.mark.parametrize("layout", NARROW_LAYOUTS)
@pytest.mark.parametrize("n", [1, 3])
def test_refused_lists_of_ints_out_of_a_narrow_range_leave_a_full_ring(layout, n):
    """Lists and tuples of ints one beyond a uint8 or int32 field's range (numpy reads them
    as int64: the range rule), int flags beyond 0 and 1 into a full ring of NARROW: the generic
    path's SpecError word for word, nothing changed."""
    buf, ref = (ReplayBuffer(NARROW, 5, layout=layout, seed=0) for _ in range(2))
    for row in _narrow_rows(2) * 2:
        buf.push(row)
        ref._checked_push(row)
    before = _state(buf)
    assert buf._writer.cursor == 3 and len(buf) == 5
    for name, value in [("a8", [256]), ("a8", [-1]), ("a8", (0, 255, 2**40)), ("a32", [2**31]),
                        ("a32", (-(2**31) - 1,)), ("a32", [np.int64(2**31)]), ("a8", [np.uint16(256)]),
                        ("terminated", [3]), ("truncated", (np.int8(-1),))]:
        step = dict(_narrow_step(0, n), **{name: type(value)((list(value) * n)[-n:])})
        with pytest.raises(SpecError, match=name) as generic:
            ref._checked_extend(step)
        with pytest.raises(SpecError) as got:
            buf.extend(step)
        assert str(got.value) == str(generic.value)
        assert _state(buf) == before, (name, value)
