from __future__ import annotations

import numpy as np
import pytest

from tfdata import Field, ReplayBuffer, Spec, SpecError

from .conftest import CARTPOLE, ODD


def test_from_dict_forms():
    s = Spec({"a": "f4", "b": ("i8", (2, 3)), "c": ("u1", 5), "d": Field("d", "?", ())})
    assert s.names == ("a", "b", "c", "d")
    assert s["b"].shape == (2, 3) and s["c"].shape == (5,) and s["d"].dtype == np.bool_
    assert s.row_nbytes == 4 + 48 + 5 + 1
    assert Spec.from_dict(s.to_dict()) == s
    assert Spec(s) == s and hash(Spec(s)) == hash(s)


@pytest.mark.parametrize("fields", [CARTPOLE, ODD, {"x": "u1"}, {"big": ("f8", (3, 3)), "b": "?"}])
def test_aos_dtype_is_aligned_and_word_padded(fields):
    s = Spec(fields)
    dt = s.aos_dtype
    assert dt.itemsize % 8 == 0 and dt.isalignedstruct
    assert dt.names == s.names
    for f in s:
        sub, offset = dt.fields[f.name][:2]
        assert offset % f.dtype.alignment == 0
        assert sub.base == f.dtype and sub.shape == f.shape
    # no more padding than alignment needs, plus the round-up to 8 bytes
    assert dt.itemsize < s.row_nbytes + 8 * len(s)


def test_cartpole_row_is_48_bytes():
    assert Spec(CARTPOLE).aos_dtype.itemsize == 48
    assert Spec(CARTPOLE).row_nbytes == 46


def test_non_native_byte_order_is_normalised():
    s = Spec({"x": ">f4"})
    assert s["x"].dtype == np.dtype("<f4") or s["x"].dtype.isnative


def test_from_example():
    s = Spec.from_example({"obs": np.zeros((3, 2), np.float32), "action": 1, "reward": 0.5,
                           "done": True, "info": {"level": np.int16(3)}})
    assert s["obs"].dtype == np.float32 and s["obs"].shape == (3, 2)
    assert s["action"].dtype == np.int64 and s["reward"].dtype == np.float64
    assert s["done"].dtype == np.bool_ and s["info.level"].dtype == np.int16
    with pytest.raises(SpecError, match="from_example expects a mapping"):
        Spec.from_example([1, 2])
    with pytest.raises(SpecError, match="field 'x'"):
        Spec.from_example({"x": "text"})


def test_nested_rows_are_flattened(layout):
    buf = ReplayBuffer({"obs.pos": ("f4", (2,)), "obs.vel": "f4", "action": "i8"}, 4, layout=layout, seed=0)
    buf.push({"obs": {"pos": np.ones(2, np.float32), "vel": 2.0}, "action": 1})
    buf.push({"obs.pos": np.zeros(2, np.float32), "obs.vel": 3.0, "action": 2})
    buf.extend({"obs": {"pos": np.ones((2, 2), np.float32), "vel": np.ones(2, np.float32)},
                "action": np.array([3, 4])})
    assert len(buf) == 4
    assert buf.state_dict()["data"]["obs.vel"].tolist() == [2, 3, 1, 1]
    with pytest.raises(SpecError, match="missing field.*obs.vel"):
        buf.push({"obs": {"pos": np.ones(2, np.float32)}, "action": 1})


def test_from_gymnasium_spaces():
    gym = pytest.importorskip("gymnasium")
    from gymnasium import spaces

    obs = spaces.Dict({"image": spaces.Box(0, 255, (3, 8, 8), np.uint8),
                       "pos": spaces.Box(-1, 1, (2,), np.float32)})
    act = spaces.MultiDiscrete([3, 4])
    s = Spec.from_spaces(obs, act)
    assert s.names == ("obs.image", "obs.pos", "action", "reward", "next_obs.image", "next_obs.pos",
                       "terminated", "truncated")
    assert s["obs.image"].dtype == np.uint8 and s["obs.image"].shape == (3, 8, 8)
    assert s["action"].dtype == np.int64 and s["action"].shape == (2,)
    assert s["reward"].dtype == np.float32 and s["terminated"].dtype == np.bool_
    s2 = Spec.from_spaces(spaces.Box(-1, 1, (4,), np.float32), spaces.Discrete(2), next_obs=False)
    assert s2.names == ("obs", "action", "reward", "terminated", "truncated")
    assert s2["action"].shape == () and s2["action"].dtype == np.int64
    s3 = Spec.from_spaces(spaces.MultiBinary(5), spaces.Discrete(3))
    assert s3["obs"].dtype == np.int8 and s3["obs"].shape == (5,)
    env = gym.make("CartPole-v1")
    s4 = Spec.from_spaces(env.observation_space, env.action_space)
    assert s4["obs"].shape == (4,) and s4.aos_dtype.itemsize == 48
    with pytest.raises(SpecError, match="unsupported gymnasium space Text"):
        Spec.from_spaces(spaces.Text(5), spaces.Discrete(2))


def test_spec_errors():
    with pytest.raises(SpecError, match="duplicate field names"):
        Spec([Field("a", "f4"), Field("a", "i8")])
    with pytest.raises(SpecError, match="field names must be non-empty strings"):
        Spec({"": "f4"})
    with pytest.raises(SpecError, match="unknown field 'obz'; did you mean 'obs'"):
        Spec(CARTPOLE)["obz"]
    with pytest.raises(SpecError, match="Field object is named 'b'"):
        Spec({"a": Field("b", "f4")})
    with pytest.raises(SpecError, match="not a spec dictionary"):
        Spec.from_dict({"nope": 1})
