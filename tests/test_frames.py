"""Frame stacks stored one frame per row (``frame_stack=``): batches equal a buffer that stores
the whole ``obs`` and ``next_obs`` stacks, in every layout, across episode ends, truncations,
vector envs and ring wraps; broken streams are refused and change nothing.

Frames are synthetic and carry their ``(env, episode, step)`` in every pixel (``naive.FrameStackEnv``),
so a frame of another stream, episode or step, or an overwritten row, shows up as a difference.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tfdata
from tfdata.errors import SpecError

from . import naive

LAYOUTS = ["aos", "soa", [["action", "reward"], ["terminated", "truncated"]]]


def spec_of(k, frame=(3, 2), dtype="u1", next_obs=True):
    s = {"obs": (dtype, (k,) + tuple(frame))}
    if next_obs:
        s["next_obs"] = (dtype, (k,) + tuple(frame))
    s.update(action="i8", reward="f4", terminated="?", truncated="?")
    return s


def steps_of(env, rng, n):
    out = []
    for t in range(n):
        step = env.step(rng)
        e = step["obs"].shape[0]
        step["action"] = np.arange(e, dtype=np.int64) + 1000 * t
        step["reward"] = rng.random(e).astype(np.float32)
        out.append(step)
    return out


def pair(spec, capacity, num_envs=1, seed=3, **kw):
    """A frame-stacked buffer and the full buffer it must equal."""
    k = spec["obs"][1][0]
    padding = kw.pop("frame_padding", "reset")
    a = tfdata.ReplayBuffer(spec, capacity, num_envs=num_envs, seed=seed, frame_stack={"obs": k},
                            frame_padding=padding, **kw)
    b = tfdata.ReplayBuffer(spec, capacity, num_envs=num_envs, seed=seed, **kw)
    return a, b


def put(buf, step, num_envs):
    if num_envs == 1:
        buf.push({k: v[0] for k, v in step.items()})
    else:
        buf.extend(step)


def same(x, y, names):
    for f in names:
        assert np.array_equal(np.asarray(x[f]), np.asarray(y[f])), f


@pytest.mark.parametrize("layout", LAYOUTS, ids=["aos", "soa", "groups"])
@pytest.mark.parametrize("num_envs", [1, 3])
@pytest.mark.parametrize("padding", ["reset", "zero", "value"])
@pytest.mark.parametrize("frame", [(3, 2), (4, 4)], ids=["6B", "16B"])
def test_samples_equal_full_stacks(layout, num_envs, padding, frame):
    """(3, 2) frames take the generic push (6 bytes: not uint64 words), (4, 4) the compiled one."""
    k = 4
    pad = np.full(frame, 77, np.uint8) if padding == "value" else padding
    spec = spec_of(k, frame)
    env = naive.FrameStackEnv(num_envs, k, frame=frame, padding=pad, p_end=0.12)
    rng = np.random.default_rng(0)
    a, b = pair(spec, 8 * num_envs, num_envs, layout=layout, frame_padding=pad)
    for t, step in enumerate(steps_of(env, rng, 60)):
        put(a, step, num_envs)
        put(b, step, num_envs)
        if len(a) >= 5:
            same(a.sample(5), b.sample(5), spec)
            if t % 7 == 0:
                same(a.sample(3, fields=["next_obs", "action"]), b.sample(3, fields=["next_obs", "action"]),
                     ["next_obs", "action"])
                same(a.sample(3, fields=["obs"]), b.sample(3, fields=["obs"]), ["obs"])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(k=st.integers(2, 5), num_envs=st.integers(1, 3), held=st.integers(0, 6),
       p_end=st.sampled_from([0.0, 0.1, 0.5, 1.0]), steps=st.integers(1, 40), seed=st.integers(0, 2**16),
       chunk=st.integers(1, 5))
def test_property_every_held_row(k, num_envs, held, p_end, steps, seed, chunk):
    """Every held slot's stacks (read by index through a batch of all slots) equal the stored
    full stacks, after writes of several steps at once (extend of ``chunk`` steps)."""
    spec = spec_of(k)
    cap = (k + held) * num_envs
    env = naive.FrameStackEnv(num_envs, k, p_end=p_end)
    rng = np.random.default_rng(seed)
    a, b = pair(spec, cap, num_envs, seed=seed)
    todo = steps_of(env, rng, steps)
    for i in range(0, steps, chunk):
        part = todo[i:i + chunk]
        batch = {f: np.concatenate([s[f] for s in part]) for f in part[0]}
        a.extend(batch)
        b.extend(batch)
        n = len(a)
        x, y = a.sample(n), b.sample(n)
        same(x, y, spec)
        assert sorted(np.asarray(x.indices).tolist()) == sorted(np.asarray(y.indices).tolist())


def test_refused_writes_change_nothing():
    k = 3
    spec = spec_of(k)
    env = naive.FrameStackEnv(1, k, p_end=0.0)
    rng = np.random.default_rng(1)
    a, _ = pair(spec, 12)
    steps = steps_of(env, rng, 6)
    for s in steps[:4]:
        put(a, s, 1)
    before = a.state_dict()
    good = {f: v[0] for f, v in steps[4].items()}
    bad = dict(good, obs=good["obs"].copy())
    bad["obs"][0] ^= 1  # an older frame that is not the stream's
    with pytest.raises(SpecError, match="frames 0..1 of the stack differ"):
        a.push(bad)
    bad = dict(good, next_obs=good["next_obs"].copy())
    bad["next_obs"][0] ^= 1
    with pytest.raises(SpecError, match="shifted by one frame"):
        a.push(bad)
    bad = dict(good, obs=good["obs"].copy(), next_obs=good["next_obs"].copy())
    bad["obs"][-1] ^= 1  # the newest frame: not the previous row's next frame
    bad["next_obs"][-2] ^= 1
    with pytest.raises(SpecError, match="differs from"):
        a.push(bad)
    after = a.state_dict()
    for key in ("writer", "sampler"):
        assert before[key] == after[key]
    for f in before["data"]:
        assert np.array_equal(before["data"][f], after["data"][f])
    assert np.array_equal(before["frames"]["depth"], after["frames"]["depth"])
    assert np.array_equal(before["frames"]["prev"], after["frames"]["prev"])
    a.push(good)  # and the stream goes on


def test_first_row_must_start_an_episode():
    k = 4
    spec = spec_of(k)
    env = naive.FrameStackEnv(1, k, p_end=0.0)
    rng = np.random.default_rng(2)
    steps = steps_of(env, rng, 6)
    a, _ = pair(spec, 16)
    with pytest.raises(SpecError, match="starts an episode"):
        put(a, steps[5], 1)  # mid-episode: its older frames are not in the buffer
    assert len(a) == 0
    z, _ = pair(spec, 16, frame_padding="zero")
    with pytest.raises(SpecError, match="padding_type='zero'"):
        put(z, steps[0], 1)  # reset-padded into a zero-padded buffer


def test_kernel_checks_against_reference():
    rng = np.random.default_rng(5)
    from tfdata.kernels import frame_breaks

    for trial in range(300):
        k = int(rng.integers(2, 5))
        e = int(rng.integers(1, 3))
        env = naive.FrameStackEnv(e, k, p_end=0.3)
        hist = steps_of(env, rng, int(rng.integers(k, 3 * k)))
        cut = int(rng.integers(1, len(hist)))
        old, new = hist[:cut], hist[cut:]
        # the stored side: frames of the old rows, in a ring of capacity len(old) * e slots (no wrap)
        cap = max(len(old), k) * e
        src = np.zeros((cap, 6), np.uint8)
        prev_frames = [[] for _ in range(e)]
        prev_depth = [-1] * e
        for t, s in enumerate(old):
            for i in range(e):
                src[t * e + i] = s["obs"][i, -1].reshape(-1)
                start = prev_depth[i] < 0 if t == 0 else bool(old[t - 1]["terminated"][i] or old[t - 1]["truncated"][i])
                prev_depth[i] = 0 if start else min(prev_depth[i] + 1, k - 1)
                prev_frames[i].append(s["obs"][i, -1])
        for i in range(e):
            if old[-1]["terminated"][i] or old[-1]["truncated"][i]:
                prev_depth[i] = -1
        obs = np.concatenate([s["obs"] for s in new])
        nxt = np.concatenate([s["next_obs"] for s in new])
        term = np.concatenate([s["terminated"] for s in new])
        trunc = np.concatenate([s["truncated"] for s in new])
        # corrupt one byte somewhere, sometimes
        if rng.random() < 0.6:
            which = obs if rng.random() < 0.5 else nxt
            r, p = int(rng.integers(obs.shape[0])), int(rng.integers(k))
            which[r, p, int(rng.integers(3)), int(rng.integers(2))] ^= 1 << int(rng.integers(8))
        want = naive.frame_breaks_naive(obs, nxt, term | trunc, prev_frames, prev_depth, k, "reset", e)
        cur = np.zeros(e, np.int16)
        got = frame_breaks(obs.reshape(obs.shape[0], -1), nxt.reshape(obs.shape[0], -1), term, trunc, e,
                           len(old) * e % cap, cap, src, 0, np.array(prev_depth, np.int16), 0,
                           np.zeros(6, np.uint8), cur)
        assert got == want, trial


def test_memory_one_frame_per_row():
    k, frame = 4, (84, 84)
    spec = spec_of(k, frame)
    cap = 1000
    full = tfdata.ReplayBuffer.plan_memory(spec, cap)
    stacked = tfdata.ReplayBuffer.plan_memory(spec, cap, frame_stack=4)
    per_row = stacked["storage"] / cap
    assert 84 * 84 <= per_row <= 84 * 84 + 32
    assert full["storage"] / stacked["storage"] > 7.5
    b = tfdata.ReplayBuffer(spec, cap, frame_stack=4)
    assert b.nbytes_parts == stacked


def test_bad_options():
    spec = spec_of(4)
    with pytest.raises(SpecError, match=r"stack of 3 frames"):
        tfdata.ReplayBuffer(spec, 16, frame_stack=3)
    with pytest.raises(ValueError, match=r"\[2, 64\]"):
        tfdata.ReplayBuffer(spec, 16, frame_stack={"obs": 1})
    with pytest.raises(SpecError, match="unknown|no field"):
        tfdata.ReplayBuffer(spec, 16, frame_stack={"pixels": 4})
    with pytest.raises(SpecError, match="next field"):
        tfdata.ReplayBuffer(spec, 16, frame_stack={"next_obs": 4})
    with pytest.raises(ValueError, match="'reset', 'zero'"):
        tfdata.ReplayBuffer(spec, 16, frame_stack=4, frame_padding="edge")
    with pytest.raises(SpecError, match="frame_padding"):
        tfdata.ReplayBuffer(spec, 16, frame_stack=4, frame_padding=np.zeros((2, 2)))
    with pytest.raises(ValueError, match="fewer than a stack"):
        tfdata.ReplayBuffer(spec, 3, frame_stack=4)
    with pytest.raises(SpecError, match="episode boundaries"):
        tfdata.ReplayBuffer({"obs": ("u1", (4, 2))}, 16, frame_stack=4)
    with pytest.raises(ValueError, match="frame_stack is None"):
        tfdata.ReplayBuffer(spec, 16, frame_padding="zero")


def test_compiled_push_equals_generic_path():
    """Frames of 16 bytes take the compiled push; pushing the same stream through ``extend``
    (the generic path) gives the same state, bit for bit, and the same batches."""
    k, frame = 4, (4, 4)
    spec = spec_of(k, frame)
    env = naive.FrameStackEnv(1, k, frame=frame, p_end=0.2)
    rng = np.random.default_rng(9)
    a, _ = pair(spec, 12)
    b, _ = pair(spec, 12)
    assert "frame push" in a.push.__code__.co_filename
    for step in steps_of(env, rng, 50):
        a.push({f: v[0] for f, v in step.items()})
        b.extend(step)
        sa, sb = a.state_dict(), b.state_dict()
        for f in sa["data"]:
            assert np.array_equal(sa["data"][f], sb["data"][f]), f
        for key in ("depth", "prev"):
            assert np.array_equal(sa["frames"][key], sb["frames"][key]), key
        assert sa["frames"]["steps"] == sb["frames"]["steps"]
        for f in sa["frames"]["hist"]:
            assert np.array_equal(sa["frames"]["hist"][f], sb["frames"]["hist"][f])
        ea, eb = sa["episodes"], sb["episodes"]
        for key in ("episode", "current", "final_slots", "has_pending"):
            assert np.array_equal(ea[key], eb[key]), key
        for f in ea["finals"]:
            assert np.array_equal(ea["finals"][f], eb["finals"][f])
            assert np.array_equal(ea["pending"][f], eb["pending"][f])
        if len(a) >= 3:
            same(a.sample(3), b.sample(3), spec)


def test_compiled_push_refusals_change_nothing():
    k, frame = 3, (4, 2)
    spec = spec_of(k, frame)
    env = naive.FrameStackEnv(1, k, frame=frame, p_end=0.0)
    rng = np.random.default_rng(4)
    a, _ = pair(spec, 12)
    assert "frame push" in a.push.__code__.co_filename
    steps = steps_of(env, rng, 7)
    for s in steps[:5]:
        put(a, s, 1)
    good = {f: v[0] for f, v in steps[5].items()}
    before = a.state_dict()
    for field, index, match in [("obs", 0, "frames 0..1 of the stack differ"),
                                ("next_obs", 0, "shifted by one frame"),
                                ("obs", -1, "differs from")]:
        bad = dict(good, obs=good["obs"].copy(), next_obs=good["next_obs"].copy())
        bad[field][index] ^= 4
        if index == -1:
            bad["next_obs"][-2] ^= 4
        with pytest.raises(SpecError, match=match):
            a.push(bad)
        after = a.state_dict()
        assert before["writer"] == after["writer"]
        for f in before["data"]:
            assert np.array_equal(before["data"][f], after["data"][f])
        for key in ("depth", "prev"):
            assert np.array_equal(before["frames"][key], after["frames"][key])
        for f in before["episodes"]["pending"]:
            assert np.array_equal(before["episodes"]["pending"][f], after["episodes"]["pending"][f])
    a.push(good)


@pytest.mark.parametrize("order", [("obs", "pix"), ("pix", "obs")])
def test_two_stacks_of_different_depths(order):
    """Two stacked fields, K = 4 and K = 2, in either order: depths are capped at the larger
    K - 1 (a cap at the smaller one padded the K = 4 stacks from their third row on)."""
    shapes = {"obs": ("u1", (4, 3, 2)), "pix": ("u1", (2, 3, 2))}
    spec = {}
    for n in order:
        spec[n] = shapes[n]
        spec["next_" + n] = shapes[n]
    spec.update(terminated="?", truncated="?")
    env = naive.FrameStackEnv(1, 4, p_end=0.1)
    rng = np.random.default_rng(0)
    a = tfdata.ReplayBuffer(spec, 16, seed=1, frame_stack={"obs": 4, "pix": 2})
    b = tfdata.ReplayBuffer(spec, 16, seed=1)
    for _ in range(40):
        s = env.step(rng)
        row = {"obs": s["obs"][0], "next_obs": s["next_obs"][0], "pix": s["obs"][0][2:],
               "next_pix": s["next_obs"][0][2:], "terminated": s["terminated"][0],
               "truncated": s["truncated"][0]}
        a.push(row)
        b.push(row)
        same(a.sample(len(a)), b.sample(len(b)), spec)
