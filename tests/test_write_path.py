"""The write path's fast tiers against the generic, fully checked path.

The generated push (:mod:`tfdata.replay.fastpush`) packs values with :mod:`struct` into the
storage's bytes when it can prove the result equals numpy's assignment, and assigns with numpy
otherwise; episode numbers of rows pushed one at a time are stamped late (at a read or before
the ring laps them). Every test here compares with the generic path or with a reference built
from the history of pushed rows, on both layouts.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfdata import ReplayBuffer, Spec

from .conftest import assert_batches_equal

LAYOUTS = ["aos", "soa"]

# one field of every dtype the spec allows, scalar and shaped, in an order that leaves padding
WIDE = Spec({
    "b": "?", "i1": "i1", "u1": "u1", "i2": "i2", "u2": "u2", "i4": "i4", "u4": "u4",
    "i8": "i8", "u8": "u8", "f2": "f2", "f4": "f4", "f8": "f8", "c8": "c8",
    "v": ("f4", (3,)), "img": ("u1", (2, 2)), "h": ("f2", (2,)),
    "terminated": "?", "truncated": "?",
})

F32_MAX = float(np.finfo(np.float32).max)
EDGE_FLOATS = [0.0, -0.0, 1e-45, -1e-45, 1.5, -2.75, F32_MAX, -F32_MAX, F32_MAX * (1 + 2**-30),
               -F32_MAX * (1 + 2**-30), 1e39, -1e39, float("inf"), float("-inf"), float("nan"),
               2.0**53 + 1, 1e300, -1e300, 0.1]
EDGE_INTS = [0, 1, -1, 127, 128, 255, 256, -129, 2**31 - 1, 2**31, 2**32, 2**53, 2**53 + 1,
             -(2**53) - 1, 2**63 - 1, 2**63, 2**64 - 1, -(2**63), 2**64, 2**1023, 2**1100]
NUMPY_TYPES = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
               np.uint64, np.float16, np.float32, np.float64]


def scalar_values():
    """Values of every type a caller may pass for a scalar field."""
    as_numpy = st.tuples(st.sampled_from(NUMPY_TYPES),
                         st.sampled_from(EDGE_INTS[:12] + [0, 1]) | st.sampled_from(EDGE_FLOATS))

    def make(pair):
        t, x = pair
        with np.errstate(all="ignore"):
            try:
                return t(x)
            except (OverflowError, ValueError):
                return t(0)

    return (st.booleans() | st.sampled_from(EDGE_INTS) | st.integers(-(2**70), 2**70)
            | st.sampled_from(EDGE_FLOATS) | st.floats(allow_nan=True, allow_infinity=True)
            | as_numpy.map(make))


def full_row(rng, draw_scalar):
    row = {}
    for f in WIDE:
        if f.shape:
            row[f.name] = (rng.standard_normal(f.shape) * 100).astype(f.dtype)
        else:
            row[f.name] = draw_scalar(f)
    return row


def assert_same_state(fast, slow):
    """Same cursor, the same bytes in every field, the same episode numbers."""
    a, b = fast.state_dict(), slow.state_dict()
    assert a["writer"] == b["writer"]
    for name in a["data"]:  # the stored fields
        np.testing.assert_array_equal(a["data"][name].view(np.uint8), b["data"][name].view(np.uint8),
                                      err_msg=name)
    np.testing.assert_array_equal(a["episodes"]["episode"], b["episodes"]["episode"])
    np.testing.assert_array_equal(a["episodes"]["current"], b["episodes"]["current"])


def pushed_both_ways(layout, rows, capacity=3):
    fast = ReplayBuffer(WIDE, capacity, layout=layout, seed=0)
    slow = ReplayBuffer(WIDE, capacity, layout=layout, seed=0)
    outcomes = []
    for r in rows:
        try:
            with np.errstate(all="ignore"):
                slow._checked_push(r)
            ok = True
        except Exception as exc:  # noqa: BLE001 -- the fast path must refuse exactly as well
            ok = type(exc)
        try:
            with np.errstate(all="ignore"):
                fast.push(r)
            got = True
        except Exception as exc:  # noqa: BLE001
            got = type(exc)
        outcomes.append((ok, got))
    return fast, slow, outcomes


@pytest.mark.parametrize("layout", LAYOUTS)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_generated_push_writes_and_refuses_what_the_checked_push_does(layout, data):
    """Random rows with a scalar of any type in one field (every other field exact): the fast
    push accepts what the generic path accepts, refuses with the same error class, and leaves
    the same bytes, cursor and episode numbers, across wraps."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    rows = []
    for _ in range(data.draw(st.integers(1, 7))):
        target = data.draw(st.sampled_from([f.name for f in WIDE if not f.shape]))
        value = data.draw(scalar_values())

        def scalar(f, target=target, value=value):
            if f.name == target:
                return value
            return bool(rng.integers(2)) if f.dtype.kind == "b" else int(rng.integers(0, 100))

        rows.append(full_row(rng, scalar))
    fast, slow, outcomes = pushed_both_ways(layout, rows)
    for ok, got in outcomes:
        assert ok == got
    assert_same_state(fast, slow)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_first_tier_bytes_equal_numpy_assignment_for_edge_values(layout):
    """Every edge value into every scalar field: the bytes the push leaves are numpy's
    assignment of that value into an array of the field's dtype (when numpy accepts it)."""
    rng = np.random.default_rng(0)
    cases = ([(f.name, v) for f in WIDE if not f.shape and f.dtype.kind in "fc"
              for v in EDGE_FLOATS + EDGE_INTS + [True, np.float32(1.25), np.float64(-3.5)]]
             + [(f.name, v) for f in WIDE if not f.shape and f.dtype.kind in "iu"
                for v in EDGE_INTS + [True, False, np.int64(-5), np.uint32(7)]])
    checked = 0
    for name, v in cases:
        field = WIDE[name]
        ref = np.zeros(1, field.dtype)
        # the other fields as an env gives them, so that the row can take the first tier
        row = full_row(rng, lambda f: v if f.name == name else (False if f.dtype.kind == "b" else 0))
        fast, slow, [(ok, got)] = pushed_both_ways(layout, [row], capacity=2)
        assert ok == got, (name, v, ok, got)  # accepted or refused alike
        if ok is not True:
            assert len(fast) == 0
            continue
        with np.errstate(all="ignore"):
            ref[0] = v
        a, b = fast.storage.field(name)[0:1], slow.storage.field(name)[0:1]
        assert a.tobytes() == ref.tobytes() == b.tobytes(), (name, v, a, ref)
        checked += 1
    assert checked > 100


@pytest.mark.parametrize("layout", LAYOUTS)
def test_refused_edge_value_into_a_full_ring_leaves_every_row(layout):
    """A full ring (the cursor on a live row): every scalar field given each edge value, pushed
    and extended. A refused value, of either sign, leaves every stored byte, the cursor and the
    episode numbers as they were; an accepted one changes the row at the cursor only."""
    rng = np.random.default_rng(3)
    cases = [(f.name, v) for f in WIDE if not f.shape and f.dtype.kind in "fc"
             for v in EDGE_FLOATS + EDGE_INTS] + \
            [(f.name, v) for f in WIDE if not f.shape and f.dtype.kind in "iu" for v in EDGE_INTS]
    refused = 0
    for call in ("push", "extend"):
        buf = ReplayBuffer(WIDE, 2, layout=layout, seed=0)
        for _ in range(3):  # wrapped: the cursor is on a live row
            buf.push(full_row(rng, lambda f: False if f.dtype.kind == "b" else 1))
        for name, v in cases:
            before = buf.state_dict()
            row = full_row(rng, lambda f: v if f.name == name else (False if f.dtype.kind == "b" else 0))
            try:
                with np.errstate(all="ignore"):
                    if call == "push":
                        buf.push(row)
                    else:
                        buf.extend({k: np.asarray([x]) if np.ndim(x) == 0 else np.asarray(x)[None]
                                    for k, x in row.items()})
            except (ValueError, TypeError, OverflowError):
                refused += 1
                assert_same_state(buf, _Frozen(before))
                continue
            after = buf.state_dict()
            cursor = before["writer"]["cursor"]
            for other in range(2):
                if other != cursor:
                    for f in before["data"]:
                        assert before["data"][f][other].tobytes() == after["data"][f][other].tobytes(), (name, v)
    assert refused > 50


class _Frozen:
    """A state dict standing in for a buffer in :func:`assert_same_state`."""

    def __init__(self, state):
        self.state = state

    def state_dict(self):
        return self.state


def episode_reference(flags, capacity):
    """Episode number of each slot holding one of the last rows, and the next row's number,
    from the history of (terminated or truncated) flags."""
    numbers, e = [], 0
    for end in flags:
        numbers.append(e)
        e = (e + 1) % 2**32 if end else e
    slots = {}
    for k in range(max(0, len(flags) - capacity), len(flags)):
        slots[k % capacity] = numbers[k]
    return slots, e


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("capacity", [1, 5, 16])
@settings(max_examples=40, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["push", "push", "push", "extend", "read", "seq",
                                               "state", "clear"]),
                              st.integers(1, 40), st.floats(0, 1)), min_size=1, max_size=40))
def test_late_episode_stamps_equal_the_history(layout, capacity, ops):
    """Pushes (stamped late), extends (stamped at once), sequence samples and state dicts (which
    read the numbers) and clears, in any order and across many wraps: every held slot's episode
    number and the next number equal those counted from the rows pushed."""
    spec = Spec({"obs": ("f4", (2,)), "terminated": "?", "truncated": "?"})
    buf = ReplayBuffer(spec, capacity, layout=layout, seed=1)
    rng = np.random.default_rng(len(ops))
    flags = []
    for op, n, p in ops:
        if op == "push":
            for _ in range(min(n, 3 * capacity)):
                t, u = bool(rng.random() < p / 2), bool(rng.random() < p / 4)
                buf.push({"obs": rng.standard_normal(2).astype(np.float32), "terminated": t,
                          "truncated": u})
                flags.append(t or u)
        elif op == "extend":
            t, u = rng.random(n) < p / 2, rng.random(n) < p / 4
            buf.extend({"obs": rng.standard_normal((n, 2)).astype(np.float32), "terminated": t,
                        "truncated": u})
            flags.extend((t | u).tolist())
        elif op == "seq" and len(buf):
            buf.sample_sequences(1, 1)
        elif op == "state":
            s = buf.state_dict()
            slots, nxt = episode_reference(flags, capacity)
            assert int(s["episodes"]["current"][0]) == nxt
            for slot, number in slots.items():
                assert int(s["episodes"]["episode"][slot]) == number
        elif op == "clear":
            buf.clear()
            flags = []
        slots, nxt = episode_reference(flags, capacity)
        if op == "read":
            assert int(buf.episodes.current[0]) == nxt
            for slot, number in slots.items():
                assert int(buf.episodes.episode[slot]) == number, (slot, number)
    slots, nxt = episode_reference(flags, capacity)
    assert int(buf.episodes.current[0]) == nxt
    assert {s: int(buf.episodes.episode[s]) for s in slots} == slots


@pytest.mark.parametrize("layout", LAYOUTS)
def test_late_stamps_survive_save_and_load(layout, tmp_path):
    """Rows pushed one at a time and not yet stamped are stamped in the checkpoint; the loaded
    buffer continues the numbers."""
    spec = Spec({"obs": ("f4", (2,)), "terminated": "?", "truncated": "?"})
    buf = ReplayBuffer(spec, 8, layout=layout, seed=3)
    rng = np.random.default_rng(0)
    rows = [{"obs": rng.standard_normal(2).astype(np.float32), "terminated": bool(k % 3 == 2),
             "truncated": False} for k in range(11)]
    for r in rows:
        buf.push(r)
    buf.save(tmp_path / "ck")
    back = ReplayBuffer.load(tmp_path / "ck")
    for r in rows[:4]:
        buf.push(r)
        back.push(r)
    a, b = buf.state_dict(), back.state_dict()
    np.testing.assert_array_equal(a["episodes"]["episode"], b["episodes"]["episode"])
    np.testing.assert_array_equal(a["episodes"]["current"], b["episodes"]["current"])
    assert_batches_equal(dict(buf.sample_sequences(4, 2)), dict(back.sample_sequences(4, 2)))


SOURCE_DTYPES = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
                 np.uint64, np.float16, np.float32, np.float64]


def batch_of(rng, n, dtypes, edge):
    """``n`` rows of WIDE with each scalar field in the dtype ``dtypes`` names for it (its own
    dtype otherwise), edge values mixed in where ``edge``."""
    out = {}
    for f in WIDE:
        if f.shape:
            out[f.name] = (rng.standard_normal((n,) + f.shape) * 100).astype(f.dtype)
            continue
        dt = np.dtype(dtypes.get(f.name, f.dtype))
        if dt.kind == "b":
            v = rng.random(n) < 0.5
        elif dt.kind in "iu":
            info = np.iinfo(dt)
            v = rng.integers(max(info.min, -300), min(info.max, 300), n, endpoint=True).astype(dt)
            if edge:
                v[rng.random(n) < 0.3] = info.max
        else:
            v = rng.standard_normal(n) * 10.0 ** rng.integers(0, 5)
            if edge:
                v[rng.random(n) < 0.3] = rng.choice([1e39, -1e39, np.inf, np.nan, F32_MAX, 1e-46])
        with np.errstate(all="ignore"):
            out[f.name] = np.asarray(v).astype(dt)
    return out


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("num_envs", [1, 2])
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_generated_extend_writes_and_refuses_what_the_checked_extend_does(layout, num_envs, data):
    """Batches of 1 to 81 rows (the generated extend converts up to 16 itself) with scalar fields in other
    dtypes (float64 rewards, int64 into narrower ints, bools into ints, edge values out of
    range): accepted or refused alike, same bytes, cursor and episode numbers, across wraps."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    cap = data.draw(st.sampled_from([2, 6, 18, 300]))
    fast = ReplayBuffer(WIDE, cap, layout=layout, seed=0, num_envs=num_envs)
    slow = ReplayBuffer(WIDE, cap, layout=layout, seed=0, num_envs=num_envs)
    scalars = [f.name for f in WIDE if not f.shape]
    for _ in range(data.draw(st.integers(1, 6))):
        n = num_envs * data.draw(st.integers(1, 40)) + data.draw(st.integers(0, 1))  # whole steps or not
        dtypes = {name: data.draw(st.sampled_from(SOURCE_DTYPES))
                  for name in data.draw(st.lists(st.sampled_from(scalars), max_size=4))}
        batch = batch_of(rng, n, dtypes, data.draw(st.booleans()))
        outcome = []
        for call in (slow._checked_extend, fast.extend):
            try:
                with np.errstate(all="ignore"):
                    call(batch)
                outcome.append(True)
            except Exception as exc:  # noqa: BLE001 -- the same refusal on both paths
                outcome.append(type(exc))
        assert outcome[0] == outcome[1], (dtypes, outcome)
    assert_same_state(fast, slow)


@pytest.mark.parametrize("layout", [*LAYOUTS, (("obs", "action", "reward"), ("next_obs",))])
@pytest.mark.parametrize("rows", [1, 2, 3, 7, 16])
def test_one_vector_env_step_takes_the_generated_extend(layout, rows):
    """CleanRL's arrays (float64 reward, int64 action, bool flags) for 1 to 16 envs are what
    the generated extend converts itself (records: packed up to PACK_ROWS rows, interleaved by
    ``scatter_fields`` beyond): the generic path is not called, and the rows are those of the
    checked path."""
    spec = Spec({"obs": ("f4", (4,)), "action": "i8", "reward": "f4", "next_obs": ("f4", (4,)),
                 "terminated": "?", "truncated": "?"})
    buf = ReplayBuffer(spec, 8 * rows, seed=0, layout=layout)
    ref = ReplayBuffer(spec, 8 * rows, seed=0, layout=layout)
    calls = []
    slow = buf.extend.__globals__["slow"]
    buf.extend.__globals__["slow"] = lambda b: calls.append(1) or slow(b)
    rng = np.random.default_rng(rows)
    for k in range(20):  # wraps: the batch that would cross the end takes the generic path
        step = {"obs": rng.standard_normal((rows, 4)).astype(np.float32),
                "action": rng.integers(0, 5, rows), "reward": rng.standard_normal(rows),
                "next_obs": rng.standard_normal((rows, 4)).astype(np.float32),
                "terminated": rng.random(rows) < 0.2, "truncated": np.full(rows, k % 3 == 0)}
        buf.extend(step)
        ref._checked_extend(step)
    assert len(calls) == 0 and len(buf) == 8 * rows
    assert_same_state(buf, ref)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("form", ["exact", "float64", "strided", "fortran", "scalar_view"])
def test_many_rows_land_as_numpy_casts_them(layout, form):
    """extend of 40 rows (the generic and the opaque-copy paths) across the ring's end: every
    stored field equals the input cast by numpy, whatever the input's dtype and memory order."""
    spec = Spec({"obs": ("f4", (3, 2)), "r": "f4", "a": "i8", "terminated": "?", "truncated": "?"})
    rng = np.random.default_rng(7)
    n, cap = 40, 64
    obs = rng.standard_normal((n, 3, 2))
    if form == "exact":
        obs = obs.astype(np.float32)
    elif form == "strided":
        obs = np.repeat(obs.astype(np.float32), 2, axis=2)[:, :, ::2]
    elif form == "fortran":
        obs = np.asfortranarray(obs.astype(np.float32))
    r = rng.standard_normal(2 * n).astype(np.float32)
    batch = {"obs": obs, "r": r[::2] if form == "scalar_view" else r[:n], "a": rng.integers(0, 9, n),
             "terminated": rng.random(n) < 0.1, "truncated": np.zeros(n, bool)}
    buf = ReplayBuffer(spec, cap, layout=layout, seed=0)
    for k in range(3):  # 120 rows: the third batch wraps
        buf.extend(batch)
    slots = (np.arange(n) + 2 * n) % cap
    for name, v in batch.items():
        want = np.asarray(v).astype(spec[name].dtype)
        np.testing.assert_array_equal(buf.storage.field(name)[slots], want, err_msg=name)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("plan", [
    [("push", 3), ("extend", 5), ("read",), ("push", 2), ("read",)],   # an extend ends at the last slot
    [("extend", 8), ("read",), ("extend", 8), ("push", 1), ("read",)],  # whole rings
    [("push", 7), ("extend", 3), ("read",)],                          # an extend wraps
    [("extend", 5), ("push", 3), ("extend", 2), ("read",)],           # a push fills the last slot
    [("extend", 20), ("read",), ("push", 9), ("read",)],              # more rows than slots
])
def test_late_stamps_at_the_ring_end(layout, plan):
    """The writes that end exactly at the last slot, wrap, or exceed the capacity: the numbers
    read afterwards are those of the history. Sizes x5: extends of 15+ rows take the generic
    write, pushes the generated one."""
    spec = Spec({"obs": ("f4", (2,)), "terminated": "?", "truncated": "?"})
    scale = 5
    cap = 8 * scale
    buf = ReplayBuffer(spec, cap, layout=layout, seed=1)
    rng = np.random.default_rng(5)
    flags = []
    for step in plan:
        if step[0] == "read":
            slots, nxt = episode_reference(flags, cap)
            assert int(buf.episodes.current[0]) == nxt
            assert {s: int(buf.episodes.episode[s]) for s in slots} == slots
            continue
        n = step[1] * scale
        t = rng.random(n) < 0.2
        rows = {"obs": rng.standard_normal((n, 2)).astype(np.float32), "terminated": t,
                "truncated": np.zeros(n, bool)}
        if step[0] == "push":
            for k in range(n):
                buf.push({"obs": rows["obs"][k], "terminated": bool(t[k]), "truncated": False})
        else:
            buf.extend(rows)
        flags.extend(t.tolist())


@pytest.mark.parametrize("layout", ["aos", (("img", "a"), ("r",))])
def test_one_step_extend_of_wide_records_equals_the_checked_path(layout):
    """Image-like fields (wider than ``_records.WIDE`` bytes: copied by memcpy) among narrow
    ones, 2 to 16 rows a call, across the ring's end."""
    spec = Spec({"img": ("u1", (3, 40)), "a": "i8", "r": "f4", "terminated": "?", "truncated": "?"})
    buf = ReplayBuffer(spec, 50, seed=0, layout=layout)
    ref = ReplayBuffer(spec, 50, seed=0, layout=layout)
    rng = np.random.default_rng(5)
    for k in range(30):
        n = int(rng.integers(2, 17))
        step = {"img": rng.integers(0, 256, (n, 3, 40), dtype=np.uint8), "a": rng.integers(-9, 9, n),
                "r": rng.standard_normal(n), "terminated": rng.random(n) < 0.2,
                "truncated": np.zeros(n, bool)}
        buf.extend(step)
        ref._checked_extend(step)
    assert_same_state(buf, ref)


def test_scatter_fields_matches_reference_and_refuses_bad_arguments():
    """The records kernel of the one-step extend against its reference: random spans (gaps,
    any order, zero-width fields); arguments that disagree return -1 with nothing written.
    Sources are bytes, as the extend passes them, and 2 to 4 fields: each other type or count
    would compile a specialization of the kernel that only this test calls."""
    from tfdata.kernels._records import scatter_fields

    from .naive import scatter_fields_naive

    rng = np.random.default_rng(11)
    for trial in range(300):
        stride = int(rng.integers(1, 40 if trial % 2 else 300))  # fields of WIDE bytes and more: memcpy
        rows = int(rng.integers(1, 12))
        m = int(rng.integers(2, 5))
        spans = np.array([(o, int(rng.integers(0, stride - o + 1)))
                          for o in rng.integers(0, stride, m)], np.int64)
        n = int(rng.integers(1, rows + 1))
        p = int(rng.integers(0, rows - n + 1))
        if trial % 7 == 0:  # something that disagrees
            which = trial % 5
            if which == 0:
                p = rows - n + 1
            elif which == 1:
                spans[0, 1] = stride - spans[0, 0] + 1
            elif which == 2:
                n = 0
            elif which == 3:
                spans[-1, 0] = -1
        srcs = tuple(rng.integers(0, 256, max(0, n) * max(0, int(w)), dtype=np.uint8).tobytes()
                     for _, w in spans)
        if trial % 7 == 0 and trial % 5 == 4:
            srcs = srcs[:-1] + (srcs[-1] + b"x",)  # one byte too many
        got = rng.integers(0, 256, (rows, stride), dtype=np.uint8)
        want = got.copy()
        before = got.copy()
        r_got = scatter_fields(got, p, n, srcs, spans)
        r_want = scatter_fields_naive(want, p, n, srcs, spans)
        assert r_got == r_want, (trial, spans, p, n)
        np.testing.assert_array_equal(got, want)
        if r_got == -1:
            np.testing.assert_array_equal(got, before)
    assert scatter_fields(np.zeros((4, 8), np.uint8), 0, 1, (b"ab", b"c"), np.zeros((2, 1), np.int64)) == -1


def test_elide_step_matches_reference_and_refuses_with_nothing_changed():
    """The elided extend's kernel against its reference: streams of 1 to 3 environments whose
    rows mostly continue (bytes from a two-symbol alphabet), ends of episodes, final tables
    short of entries, and arguments that disagree (a slot past the end, a count of free
    entries out of range, entries out of the table). Called through the one entry point the
    buffers use (no other specialization)."""
    from tfdata.kernels import ELIDE_READONLY, ELIDE_STRIDED, call_strided, elide_step

    from .naive import elide_step_naive

    rng = np.random.default_rng(21)
    codes = set()
    for trial in range(600):
        e = int(rng.integers(1, 4))
        n = e * int(rng.integers(1, 4))
        width = int(rng.integers(1, 6))
        cap = e * int(rng.integers(1, 6)) + (0 if trial % 5 else int(rng.integers(0, 3)))
        k = int(rng.integers(0, 6))
        nf = int(rng.integers(0, 6))
        src = rng.integers(0, 2, (n, width), dtype=np.uint8)
        nxt = rng.integers(0, 2, (n, width), dtype=np.uint8)
        pending = rng.integers(0, 2, (e, width), dtype=np.uint8)
        term, trunc = rng.random(n) < 0.3, rng.random(n) < 0.1
        for r in range(n):  # mostly continuous
            if rng.random() < 0.85:
                src[r] = pending[r] if r < e else nxt[r - e]
        has_pending = rng.random(e) < 0.7
        final_idx = rng.integers(-2, nf + 2, cap).astype(np.int32)
        finals = rng.integers(0, 256, (nf, width), dtype=np.uint8)
        free = rng.integers(-1, nf + 1, k).astype(np.int32)
        n_free = int(rng.integers(-1, k + 2)) if trial % 9 == 0 else int(rng.integers(0, k + 1))
        episode = rng.integers(0, 2**32, cap, dtype=np.uint32)
        current = rng.integers(2**32 - 2, 2**32, e, dtype=np.uint32)  # wraps at 2**32
        p = int(rng.integers(-1, cap + 1)) if trial % 11 == 0 else int(rng.integers(0, max(1, cap - n + 1)))
        if trial % 3 == 0:  # strided rows and flags, as a caller's slices give them
            src = np.repeat(src, 2, axis=0)[::2]
            term = np.repeat(term, 2)[::2]
        args = [src, nxt, term, trunc, p, final_idx, finals, free, n_free, pending, has_pending,
                episode, current]
        want_code, want = elide_step_naive(*args)
        got_code = call_strided(elide_step, ELIDE_STRIDED, *args, readonly=ELIDE_READONLY)
        codes.add(max(got_code, -1))
        assert got_code == want_code, trial
        got = dict(final_idx=final_idx, finals=finals, free=free, pending=pending,
                   has_pending=has_pending, episode=episode, current=current)
        for name, arr in got.items():
            np.testing.assert_array_equal(arr, want[name], err_msg=f"trial {trial}: {name}")
    assert codes == {-1, 0, 1, 2}  # accepted, broken stream, no room, bad arguments: all seen


def elided_buffers(layout, num_envs, cap):
    spec = Spec({"obs": ("f4", (3,)), "action": "i8", "reward": "f4", "next_obs": ("f4", (3,)),
                 "terminated": "?", "truncated": "?"})
    return [ReplayBuffer(spec, cap, layout=layout, seed=3, num_envs=num_envs, elide_next=True)
            for _ in range(2)]


def assert_same_elided_state(fast, slow):
    """:func:`assert_same_state` and the elision's bookkeeping, entry for entry."""
    assert_same_state(fast, slow)
    assert set(fast.state_dict()["data"]) == {"obs", "action", "reward", "terminated", "truncated"}
    a, b = fast.state_dict()["episodes"], slow.state_dict()["episodes"]
    for key in ("final_slots", "has_pending"):
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    for key in ("finals", "pending"):
        np.testing.assert_array_equal(a[key]["next_obs"], b[key]["next_obs"], err_msg=key)
    ea, eb = fast._episodes, slow._episodes  # the same entries taken: the same table and stack
    np.testing.assert_array_equal(ea.final_idx, eb.final_idx)
    assert ea.n_free == eb.n_free
    np.testing.assert_array_equal(ea.free[:ea.n_free], eb.free[:eb.n_free])
    np.testing.assert_array_equal(ea.finals["next_obs"], eb.finals["next_obs"])


@pytest.mark.parametrize("layout", [*LAYOUTS, (("obs", "action"), ("reward", "terminated", "truncated"))])
@pytest.mark.parametrize("num_envs", [1, 3])
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_generated_elided_extend_writes_and_refuses_what_the_checked_extend_does(layout, num_envs, data):
    """``elide_next=True``: vector-env steps (continuous streams, episode ends that outgrow the
    final table, resets that break a stream, float64 observations, several steps at once,
    the ring's end) written by the generated extend and by the checked extend: accepted or
    refused alike, the same bytes, episode numbers, final table, pending values and batches."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    cap = num_envs * data.draw(st.sampled_from([2, 3, 7, 40]))
    fast, slow = elided_buffers(layout, num_envs, cap)
    e = num_envs
    obs = rng.integers(0, 3, (e, 3)).astype(np.float32)
    for _ in range(data.draw(st.integers(1, 60))):
        steps = 1 if rng.random() < 0.8 else int(rng.integers(2, 4))
        n = e * steps
        nxt = rng.integers(0, 3, (n, 3)).astype(np.float32)
        o = np.concatenate([obs, nxt[:-e]])
        term, trunc = rng.random(n) < 0.25, rng.random(n) < 0.05
        for r in range(e, n):  # an ended stream starts again anywhere
            if term[r - e] or trunc[r - e]:
                o[r] = rng.integers(0, 3, 3)
        if rng.random() < 0.1:
            o[int(rng.integers(0, n))] += 7  # a reset that breaks a stream: refused
        batch = {"obs": o, "action": rng.integers(0, 4, n), "reward": rng.standard_normal(n),
                 "next_obs": nxt, "terminated": term, "truncated": trunc}
        if rng.random() < 0.1:
            batch["obs"] = o.astype(np.float64)  # converted by the checked path
        outcome = []
        for call in (slow._checked_extend, fast.extend):
            try:
                call(batch)
                outcome.append(True)
            except Exception as exc:  # noqa: BLE001 -- the same refusal on both paths
                outcome.append(type(exc))
        assert outcome[0] == outcome[1], outcome
        if outcome[0] is True:
            obs = np.where((term | trunc)[-e:, None], rng.integers(0, 3, (e, 3)), nxt[-e:]).astype(np.float32)
    assert_same_elided_state(fast, slow)
    if len(slow):
        b = min(8, len(slow))
        assert_batches_equal(dict(fast.sample(b)), dict(slow.sample(b)))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("num_envs", [1, 4])
def test_one_elided_step_takes_the_generated_extend(layout, num_envs):
    """A vector env's steps into an ``elide_next`` buffer, with episode ends: the generic path
    runs only for the step that reaches the ring's end and when the final table grows."""
    fast, slow = elided_buffers(layout, num_envs, 16 * num_envs)
    calls = []
    generic = fast.extend.__globals__["slow"]
    fast.extend.__globals__["slow"] = lambda b: calls.append(1) or generic(b)
    rng = np.random.default_rng(num_envs)
    obs = rng.standard_normal((num_envs, 3)).astype(np.float32)
    steps = 40
    for t in range(steps):
        nxt = rng.standard_normal((num_envs, 3)).astype(np.float32)
        end = np.full(num_envs, t % 5 == 4)
        batch = {"obs": obs, "action": rng.integers(0, 4, num_envs),
                 "reward": rng.standard_normal(num_envs), "next_obs": nxt, "terminated": end,
                 "truncated": np.zeros(num_envs, bool)}
        fast.extend(batch)
        slow._checked_extend(batch)
        obs = np.where(end[:, None], rng.standard_normal((num_envs, 3)), nxt).astype(np.float32)
    assert 2 <= len(calls) <= 6  # 2 laps of 16 steps; the table grows at most a few times
    assert_same_elided_state(fast, slow)
