"""ReplayBuffer behaviour on both layouts, against the RingModel and the naive RNG."""

from __future__ import annotations

import numpy as np
import pytest

import tfdata
from tfdata import ReplayBuffer, Spec, SpecError

from . import naive
from .conftest import CARTPOLE, ODD, assert_batches_equal, random_rows, row


@pytest.mark.parametrize("capacity", [1, 7, 33])
def test_push_then_sample_matches_model(layout, spec, capacity):
    rng = np.random.default_rng(capacity)
    buf = ReplayBuffer(spec, capacity, layout=layout, seed=7)
    model = naive.RingModel(capacity)
    data = random_rows(spec, 3 * capacity + 2, rng)
    key, counter = naive.key_of(7), 0
    for i in range(3 * capacity + 2):
        r = row(data, i)
        buf.push(r)
        model.push(r)
        assert len(buf) == model.size
        bs = min(len(buf), 5)
        batch = buf.sample(bs)
        ref_idx, counter = naive.draw_indices(key, counter, model.size, bs)
        np.testing.assert_array_equal(batch.indices, ref_idx)
        assert_batches_equal(batch, model.rows(ref_idx))


@pytest.mark.parametrize("capacity", [1, 7, 33])
@pytest.mark.parametrize("chunks", [[1, 2, 3], [40], [33, 1], [0, 7, 8], [100, 5]])
def test_extend_wraps_like_single_pushes(layout, spec, capacity, chunks):
    rng = np.random.default_rng(0)
    buf = ReplayBuffer(spec, capacity, layout=layout, seed=1)
    model = naive.RingModel(capacity)
    for n in chunks:
        data = random_rows(spec, n, rng)
        buf.extend(data)
        model.extend(data)
        assert len(buf) == model.size
        assert buf.state_dict()["writer"] == {"cursor": model.cursor, "size": model.size}
    if model.size:
        idx = np.arange(model.size)
        sd = buf.state_dict()["data"]
        assert_batches_equal(sd, model.rows(idx))


def test_aos_and_soa_give_identical_batches(spec):
    rng = np.random.default_rng(5)
    bufs = [ReplayBuffer(spec, 33, layout=lay, seed=2024) for lay in ("aos", "soa")]
    for step in range(20):
        data = random_rows(spec, int(rng.integers(1, 9)), rng)
        for b in bufs:
            b.extend(data)
        bs = int(rng.integers(1, len(bufs[0]) + 1))
        a, s = (b.sample(bs) for b in bufs)
        np.testing.assert_array_equal(a.indices, s.indices)
        assert_batches_equal(a, s)
        for name in spec.names:  # the same bytes, not only equal values (NaN-safe, -0.0-safe)
            assert a[name].tobytes() == np.ascontiguousarray(s[name]).tobytes()


def test_layout_from_environment(monkeypatch):
    monkeypatch.setenv("TFDATA_LAYOUT", "soa")
    assert ReplayBuffer(CARTPOLE, 4).layout == "soa"
    assert ReplayBuffer(CARTPOLE, 4, layout="aos").layout == "aos"
    monkeypatch.setenv("TFDATA_LAYOUT", "columns")
    with pytest.raises(ValueError, match="TFDATA_LAYOUT.*columns"):
        ReplayBuffer(CARTPOLE, 4)
    monkeypatch.delenv("TFDATA_LAYOUT")
    assert ReplayBuffer(CARTPOLE, 4).layout == "aos"
    with pytest.raises(ValueError, match="layout argument.*'rows'"):
        ReplayBuffer(CARTPOLE, 4, layout="rows")


def test_sample_returns_ring_views_and_copies(layout):
    buf = ReplayBuffer(CARTPOLE, 50, layout=layout, seed=3, ring_size=2)
    buf.extend(random_rows(buf.spec, 50, np.random.default_rng(0)))
    b1 = buf.sample(8)
    kept = b1.copy()
    b2 = buf.sample(8)
    assert b2 is not b1
    assert_batches_equal(b1, kept)  # still valid after one more sample (ring of 2)
    obs1 = b1["obs"]
    b3 = buf.sample(8)
    # the ring came round: same memory, newer data; b1, still held, is retired (stale)
    assert b3 is not b1 and np.shares_memory(b3["obs"], obs1)
    assert not np.array_equal(b3.indices, kept.indices)
    with pytest.raises(tfdata.StaleBatchError):
        b1["obs"]
    with pytest.raises(TypeError):
        b3["obs"] = np.zeros((8, 4), np.float32)  # the ring's mapping is read-only
    assert dict(b3).keys() == set(buf.spec.names)
    c = buf.sample(8, copy=True)
    assert all(v.flags.c_contiguous and v.flags.owndata for v in c.values())
    assert c is not buf.sample(8)
    for name, f in zip(buf.spec.names, buf.spec):
        assert c[name].dtype == f.dtype and c[name].shape == (8,) + f.shape


def test_state_dict_round_trip_continues_sequence(layout, spec):
    rng = np.random.default_rng(11)
    a = ReplayBuffer(spec, 33, layout=layout, seed=5)
    a.extend(random_rows(spec, 20, rng))
    a.sample(4)
    state = a.state_dict()
    for other_layout in ("aos", "soa"):
        b = ReplayBuffer(spec, 33, layout=other_layout, seed=999)
        b.load_state_dict(state)
        more = random_rows(spec, 30, np.random.default_rng(3))
        a2 = ReplayBuffer(spec, 33, layout=layout, seed=0)
        a2.load_state_dict(state)
        for buf in (a2, b):
            buf.extend(more)
        for _ in range(5):
            x, y = a2.sample(6), b.sample(6)
            np.testing.assert_array_equal(x.indices, y.indices)
            assert_batches_equal(x, y)


def test_state_dict_is_a_copy(layout):
    buf = ReplayBuffer(CARTPOLE, 4, layout=layout, seed=0)
    data = random_rows(buf.spec, 4, np.random.default_rng(0))
    buf.extend(data)
    state = buf.state_dict()
    buf.extend(random_rows(buf.spec, 4, np.random.default_rng(1)))
    assert_batches_equal(state["data"], data)


def test_bad_state_changes_nothing(layout):
    buf = ReplayBuffer(CARTPOLE, 8, layout=layout, seed=0)
    buf.extend(random_rows(buf.spec, 5, np.random.default_rng(0)))
    before = buf.state_dict()
    bad_states = []
    s = buf.state_dict(); s["data"]["obs"] = s["data"]["obs"][:3]; bad_states.append(s)
    s = buf.state_dict(); s["data"]["action"] = s["data"]["action"].astype(np.int32); bad_states.append(s)
    s = buf.state_dict(); s["writer"] = {"cursor": 2, "size": 5}; bad_states.append(s)
    s = buf.state_dict(); s["capacity"] = 9; bad_states.append(s)
    s = buf.state_dict(); s["version"] = 2; bad_states.append(s)
    s = buf.state_dict(); s["spec"] = Spec({"x": "f4"}).to_dict(); bad_states.append(s)
    s = buf.state_dict(); del s["data"]["reward"]; bad_states.append(s)
    bad_states.append({"something": "else"})
    for s in bad_states:
        with pytest.raises((ValueError, TypeError)):
            buf.load_state_dict(s)
        after = buf.state_dict()
        assert after["writer"] == before["writer"] and after["sampler"] == before["sampler"]
        assert_batches_equal(after["data"], before["data"])


def test_clear(layout):
    buf = ReplayBuffer(CARTPOLE, 8, layout=layout, seed=0)
    buf.extend(random_rows(buf.spec, 8, np.random.default_rng(0)))
    buf.clear()
    assert len(buf) == 0
    with pytest.raises(ValueError, match="empty"):
        buf.sample(1)
    buf.extend(random_rows(buf.spec, 3, np.random.default_rng(0)))
    assert len(buf) == 3 and buf.sample(3).indices.max() < 3
    buf.clear(wipe=True)
    assert not buf.storage.field("obs").any()


def test_vector_env_step_shape(layout):
    gym = pytest.importorskip("gymnasium")
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(3)])
    spec = Spec.from_spaces(envs.single_observation_space, envs.single_action_space)
    buf = ReplayBuffer(spec, 10, layout=layout, seed=0)
    obs, _ = envs.reset(seed=0)
    for _ in range(5):
        action = envs.action_space.sample()
        next_obs, reward, terminated, truncated, _ = envs.step(action)
        # gymnasium gives float64 rewards: accepted into the float32 field (same kind)
        buf.extend({"obs": obs, "action": action, "reward": reward, "next_obs": next_obs,
                    "terminated": terminated, "truncated": truncated})
        obs = next_obs
    assert len(buf) == 10
    envs.close()
    batch = buf.sample(4)
    assert batch["obs"].shape == (4, 4) and batch["action"].dtype == np.int64


def test_repr_and_introspection(layout):
    buf = ReplayBuffer(CARTPOLE, 1000, layout=layout, seed=0)
    assert buf.capacity == 1000 and buf.layout == layout and len(buf) == 0
    assert buf.nbytes >= 1000 * buf.spec.row_nbytes
    assert "capacity=1000" in repr(buf)
    assert buf.storage.field("obs").shape == (1000, 4)
    with pytest.raises(SpecError, match="did you mean 'obs'"):
        buf.storage.field("ob")


FAST_AND_SLOW_ROWS = [
    # exact types: the generated fast path takes these
    {"obs": np.arange(4, dtype=np.float32), "action": 2, "reward": 0.5,
     "next_obs": np.ones(4, np.float32), "terminated": False, "truncated": True},
    # numpy scalars as a policy's argmax or an env return them: also the fast path
    {"obs": np.arange(4, dtype=np.float32), "action": np.int64(1), "reward": np.float32(-1.5),
     "next_obs": np.ones(4, np.float32), "terminated": np.bool_(True), "truncated": np.bool_(False)},
    # narrower ints and wider floats: safe, fast path for scalars
    {"obs": np.arange(4, dtype=np.float32), "action": np.uint8(200), "reward": np.float64(0.1),
     "next_obs": np.ones(4, np.float32), "terminated": True, "truncated": False},
    # needs the generic path: lists, other dtypes, 0-d arrays, a non-dict mapping
    {"obs": [1, 2, 3, 4], "action": np.array(3), "reward": np.array(2.0),
     "next_obs": np.ones(4, np.float64), "terminated": 1, "truncated": np.int8(0)},
]


@pytest.mark.parametrize("i", range(len(FAST_AND_SLOW_ROWS)))
def test_fast_push_writes_what_the_checked_push_writes(layout, i):
    r = FAST_AND_SLOW_ROWS[i]
    fast = ReplayBuffer(CARTPOLE, 3, layout=layout, seed=0)
    slow = ReplayBuffer(CARTPOLE, 3, layout=layout, seed=0)
    for _ in range(4):  # wraps
        fast.push(r)
        slow._checked_push(r)
    fast.push(types_mapping(r))
    slow._checked_push(r)
    a, b = fast.state_dict(), slow.state_dict()
    assert a["writer"] == b["writer"] == {"cursor": 2, "size": 3}
    assert_batches_equal(a["data"], b["data"])
    assert a["data"]["reward"][0] == np.float32(np.asarray(r["reward"]).item())


def types_mapping(r):
    """The same row as a read-only mapping that is not a dict (takes the generic path)."""
    import types

    return types.MappingProxyType(dict(r))


def test_fast_push_is_generated_per_spec():
    buf = ReplayBuffer(CARTPOLE, 3, seed=0)
    src = buf._fast_push.__source__
    assert "row['next_obs']" in src and "return slow(row)" in src


@pytest.mark.parametrize("layout", ["aos", "soa"])
def test_refused_sample_releases_the_lock(layout):
    # sample() holds the lock through __enter__/__exit__ in try/finally: a sample refused inside
    # it (the ring exists, the rows were cleared since) leaves the lock free, and the buffer works
    buf = ReplayBuffer(CARTPOLE, 16, layout=layout, seed=3)
    buf.extend(random_rows(buf.spec, 16, np.random.default_rng(0)))
    buf.sample(4)  # builds this thread's ring of 4
    buf.clear()
    with pytest.raises(ValueError, match="empty buffer"):
        buf.sample(4)
    assert not buf._lock.locked()
    buf.extend(random_rows(buf.spec, 8, np.random.default_rng(1)))
    batch = buf.sample(4)
    assert batch.indices.shape == (4,) and (batch.indices < 8).all()
    assert not buf._lock.locked()
