"""Bad input raises a clear SpecError naming the field, and changes nothing."""

from __future__ import annotations

import numpy as np
import pytest

from tfdata import ReplayBuffer, SpecError

from .conftest import CARTPOLE, assert_batches_equal, random_rows


def good_row():
    return {"obs": np.zeros(4, np.float32), "action": 1, "reward": 0.5,
            "next_obs": np.ones(4, np.float32), "terminated": False, "truncated": True}


def good_batch(n=3):
    return {"obs": np.zeros((n, 4), np.float32), "action": np.arange(n), "reward": np.ones(n),
            "next_obs": np.ones((n, 4), np.float32), "terminated": np.zeros(n, bool),
            "truncated": np.ones(n, bool)}


def with_(base, **changes):
    out = dict(base)
    for k, v in changes.items():
        if v is DROP:
            del out[k]
        else:
            out[k] = v
    return out


DROP = object()

BAD_ROWS = [
    (with_(good_row(), reward=DROP), r"missing field\(s\) \['reward'\]"),
    (with_(good_row(), rewrd=0.5), r"unknown field 'rewrd'; did you mean 'reward'"),
    (with_(good_row(), reward=DROP, rewrd=0.5), r"unknown field 'rewrd'.*missing field\(s\) \['reward'\]"),
    (with_(good_row(), extra=1), r"unknown field 'extra'"),
    (with_(good_row(), obs=np.zeros(5, np.float32)), r"field 'obs': expected shape \(4,\), got shape \(5,\)"),
    (with_(good_row(), obs=np.zeros((1, 4), np.float32)), r"field 'obs': expected shape \(4,\), got shape \(1, 4\)"),
    (with_(good_row(), obs=0.0), r"field 'obs': expected shape \(4,\), got shape \(\)"),
    (with_(good_row(), action=1.5), r"field 'action': expected dtype int64, got a float"),
    (with_(good_row(), action=np.float32(2.0)), r"field 'action': expected dtype int64, got dtype float32"),
    (with_(good_row(), action=2**70), r"field 'action': value 1180591620717411303424 out of range for dtype int64"),
    (with_(good_row(), reward=2**1100), r"field 'reward': integer \d+ is too large for dtype float32"),
    (with_(good_row(), action=np.uint64(2**64 - 1)), r"field 'action': values in \[18446744073709551615, 18446744073709551615\] of dtype uint64 do not fit dtype int64"),
    (with_(good_row(), terminated=2), r"field 'terminated': expected dtype bool, got 2"),
    (with_(good_row(), terminated=0.0), r"field 'terminated': expected dtype bool, got a float"),
    (with_(good_row(), obs="abcd"), r"field 'obs': expected a numeric array of dtype float32, got str"),
    (with_(good_row(), obs=None), r"field 'obs': expected a numeric array of dtype float32, got NoneType"),
    (with_(good_row(), obs=[1, 2, "x", 4]), r"field 'obs': expected dtype float32, got non-numeric data"),
    (with_(good_row(), obs=object()), r"field 'obs': expected a numeric array"),
    (with_(good_row(), reward=1 + 2j), r"field 'reward'"),
    ([1, 2, 3], r"push expects a mapping of field name to value, got list"),
    (None, r"push expects a mapping"),
]


@pytest.mark.parametrize("bad,message", BAD_ROWS)
def test_bad_push_raises_and_changes_nothing(layout, bad, message):
    buf = ReplayBuffer(CARTPOLE, 7, layout=layout, seed=0)
    buf.extend(random_rows(buf.spec, 9, np.random.default_rng(0)))
    before = buf.state_dict()
    with pytest.raises(SpecError, match=message):
        buf.push(bad)
    after = buf.state_dict()
    assert after["writer"] == before["writer"] and after["sampler"] == before["sampler"]
    assert_batches_equal(after["data"], before["data"])


def test_int8_overflow_is_rejected(layout):
    buf = ReplayBuffer({"x": "i1", "y": ("u1", (2,))}, 4, layout=layout)
    with pytest.raises(SpecError, match=r"field 'x': value 300 out of range for dtype int8 \[-128, 127\]"):
        buf.push({"x": 300, "y": np.zeros(2, np.uint8)})
    with pytest.raises(SpecError, match=r"field 'x': values in \[-1, 200\] of dtype int64 do not fit dtype int8"):
        buf.extend({"x": np.array([-1, 200]), "y": np.zeros((2, 2), np.uint8)})
    with pytest.raises(SpecError, match=r"field 'y': values in \[-3, 3\] of dtype int64 do not fit dtype uint8"):
        buf.extend({"x": np.array([1, 2]), "y": np.array([[1, 3], [-3, 0]])})
    assert len(buf) == 0
    # in-range values of a wider integer dtype are safe and accepted
    buf.extend({"x": np.array([-128, 127]), "y": np.array([[0, 255], [1, 2]])})
    assert buf.state_dict()["data"]["x"].tolist() == [-128, 127]


BAD_BATCHES = [
    (with_(good_batch(), reward=np.ones(4)), r"leading dimensions differ: field 'obs' has 3 rows, field 'reward' has 4 rows"),
    (with_(good_batch(), obs=np.zeros((3, 5), np.float32)), r"field 'obs': expected shape \(3, 4\), got shape \(3, 5\)"),
    (with_(good_batch(), obs=np.zeros(4, np.float32)), r"field 'obs': extend expects shape \(n, 4\)"),
    (with_(good_batch(), action=np.arange(3) + 0.5), r"field 'action': expected dtype int64, got dtype float64"),
    (with_(good_batch(), terminated=np.array([0, 1, 2])), r"field 'terminated': expected dtype bool"),
    (with_(good_batch(), truncated=DROP), r"missing field\(s\) \['truncated'\]"),
    (with_(good_batch(), truncatd=np.ones(3, bool)), r"unknown field 'truncatd'; did you mean 'truncated'"),
    (with_(good_batch(), reward="xyz"), r"field 'reward': expected a numeric array of dtype float32, got str"),
    (with_(good_batch(), reward=None), r"field 'reward': expected a numeric array"),
    (with_(good_batch(), action=np.array([1, 2, 3], dtype=object)), r"field 'action': expected dtype int64, got non-numeric data of dtype object"),
    ("not a mapping", r"extend expects a mapping"),
]


@pytest.mark.parametrize("bad,message", BAD_BATCHES)
def test_bad_extend_raises_and_changes_nothing(layout, bad, message):
    buf = ReplayBuffer(CARTPOLE, 7, layout=layout, seed=0)
    buf.extend(random_rows(buf.spec, 5, np.random.default_rng(0)))
    before = buf.state_dict()
    with pytest.raises(SpecError, match=message):
        buf.extend(bad)
    after = buf.state_dict()
    assert after["writer"] == before["writer"]
    assert_batches_equal(after["data"], before["data"])


def test_safe_casts_are_accepted(layout):
    buf = ReplayBuffer(CARTPOLE, 4, layout=layout, seed=0)
    buf.push({"obs": [1, 2, 3, 4], "action": np.int32(3), "reward": np.float64(0.25),
              "next_obs": np.arange(4, dtype=np.int16), "terminated": 1, "truncated": np.bool_(False)})
    buf.push({"obs": (0.5, 0.5, 0.5, 0.5), "action": True, "reward": 2, "next_obs": np.zeros(4),
              "terminated": np.int8(0), "truncated": False})
    d = buf.state_dict()["data"]
    assert d["obs"].tolist() == [[1, 2, 3, 4], [0.5] * 4]
    assert d["action"].tolist() == [3, 1] and d["terminated"].tolist() == [True, False]


@pytest.mark.parametrize("capacity,error", [(0, ValueError), (-1, ValueError), (2**32, ValueError),
                                            (1.5, TypeError), ("10", TypeError), (True, TypeError),
                                            (None, TypeError)])
def test_bad_capacity(capacity, error):
    with pytest.raises(error, match="capacity"):
        ReplayBuffer(CARTPOLE, capacity)


def test_bad_batch_size(layout):
    buf = ReplayBuffer(CARTPOLE, 8, layout=layout, seed=0)
    with pytest.raises(ValueError, match="empty buffer"):
        buf.sample(1)
    buf.extend(random_rows(buf.spec, 4, np.random.default_rng(0)))
    buf.sample(2)
    buf.sample(1)
    state = buf.state_dict()
    for bad, error in [(0, ValueError), (-3, ValueError), (2.0, TypeError), (None, TypeError),
                       (True, TypeError), ("2", TypeError)]:
        with pytest.raises(error, match="batch_size"):
            buf.sample(bad)
    with pytest.raises(ValueError, match="batch_size 5 is larger than the 4 rows held"):
        buf.sample(5)
    assert buf.state_dict()["sampler"] == state["sampler"]  # no random words consumed


@pytest.mark.parametrize("fields,message", [
    ({}, "at least one field"),
    ({"x": "O"}, r"field 'x': dtype must be bool or numeric"),
    ({"x": "U4"}, r"field 'x': dtype must be bool or numeric"),
    ({"x": ("f4", (0,))}, r"field 'x': every dimension must be >= 1"),
    ({"x": ("f4", (-2, 3))}, r"field 'x': every dimension must be >= 1"),
    ({"x": ("f4", "abc")}, r"field 'x': shape must be a tuple of ints"),
    ({"x": "not-a-dtype"}, r"field 'x': 'not-a-dtype' is not a numpy dtype"),
    ({"x": [("a", "f4")]}, r"field 'x'"),
])
def test_bad_spec(fields, message):
    with pytest.raises(SpecError, match=message):
        ReplayBuffer(fields, 4)
