"""The frame-stack kernels (tfdata/kernels/_frames.py) against their references in tests/naive.py,
on random inputs: rings wrapped at any cursor, stacks that reach frames the ring has overwritten
(``hist``), every padding mode, word widths of 1 to 8 bytes at any offset in a row, strided flags,
depths beyond ``K - 1`` and final-table entries out of range (bounded by the kernels)."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tfdata import kernels
from tfdata.kernels import RING_STACKS, frame_breaks, frames_write

from . import naive

WORDS = [np.uint8, np.uint64]  # the word types frames are copied by (storage.word_size)
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _ring(rng, num_envs: int, k: int, extra: int, full: bool):
    """``(capacity, size, cursor, steps)`` of a ring: partly filled (steps since the clear give
    the rows held) or full (wrapped at a random cursor, any number of steps beyond)."""
    cap = num_envs * (k + extra)
    held = cap // num_envs
    if full:  # the cursor is where the steps written put it
        steps = held + int(rng.integers(0, 4 * held))
        return cap, cap, steps * num_envs % cap, steps
    size = num_envs * int(rng.integers(1, held + 1))
    return cap, size, size % cap, size // num_envs


def _flags(rng, cap: int, p: float):
    """Episode flags as an AoS storage holds them (strided) or as columns."""
    rec = np.zeros((cap, 3), bool)
    rec[:, 0] = rng.random(cap) < p
    rec[:, 2] = rng.random(cap) < p / 2
    if rng.random() < 0.5:
        return rec[:, 0], rec[:, 2]
    return rec[:, 0].copy(), rec[:, 2].copy()


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), num_envs=st.integers(1, 3), k=st.integers(2, 5),
       extra=st.integers(0, 4), full=st.booleans(), mode=st.integers(0, 2),
       word=st.sampled_from(WORDS), width=st.integers(1, 3), hostile=st.booleans())
def test_frame_stacks_and_next_frame_stacks_match_the_reference(seed, num_envs, k, extra, full, mode,
                                                                  word, width, hostile):
    rng = np.random.default_rng(seed)
    cap, size, cursor, steps = _ring(rng, num_envs, k, extra, full)
    off = int(rng.integers(0, 3))
    row_words = off + width + int(rng.integers(0, 2))
    info = np.iinfo(word)
    src = rng.integers(0, info.max, (cap, row_words), dtype=word, endpoint=True)
    hist = rng.integers(0, info.max, (k - 1, num_envs, width), dtype=word, endpoint=True)
    pad = rng.integers(0, info.max, width, dtype=word, endpoint=True)
    # depths as writes give them (at most K - 1), or anything a byte holds (clamped)
    depth = rng.integers(0, 256 if hostile else k, cap).astype(np.uint8)
    rows = rng.integers(0, size, int(rng.integers(1, 9)))
    dst = np.zeros((rows.shape[0], k * width), word)
    geo = np.array([cursor, num_envs, cap], np.int64)
    RING_STACKS.stacks(geo, steps, rows, depth, src, off, hist, pad, mode, dst)
    stored = src[:, off:off + width]
    streams = [naive.ring_stream(int(x), cursor, steps, num_envs, cap) for x in rows]
    want = [naive.stack_naive(s, depth[x], k, stored, hist, pad, mode) for s, x in zip(streams, rows)]
    assert np.array_equal(dst, np.array(want).reshape(dst.shape))

    term, trunc = _flags(rng, cap, 0.3)
    nf = int(rng.integers(0, 5))
    finals = rng.integers(0, info.max, (nf, width), dtype=word, endpoint=True)
    final_idx = rng.integers(-1, nf + 2 if hostile else nf, cap).astype(np.int32)
    pending = rng.integers(0, info.max, (num_envs, width), dtype=word, endpoint=True)
    nxt = np.zeros_like(dst)
    # the flags typed as of any stride, as the buffers call the kernels
    kernels.call_strided(RING_STACKS.next_stacks, (9, 10), geo, steps, rows, depth, src, off, hist,
                         pad, mode, term, trunc, final_idx, finals, pending, nxt)
    want = [naive.next_stack_naive(s, int(x), k, depth, stored, hist, pad, mode, term, trunc,
                                   final_idx, finals, pending) for s, x in zip(streams, rows)]
    assert np.array_equal(nxt, np.array(want).reshape(nxt.shape))
    # both in one pass: the same stacks
    both = np.zeros_like(dst), np.zeros_like(dst)
    kernels.call_strided(RING_STACKS.stack_pairs, (9, 10), geo, steps, rows, depth, src, off, hist,
                         pad, mode, term, trunc, final_idx, finals, pending, *both)
    assert np.array_equal(both[0], dst) and np.array_equal(both[1], nxt)


def test_stacks_reach_into_hist_and_across_the_wrap():
    """The inputs of the property test reach every branch: frames from the ring across its
    wrap, from hist, and each padding mode (a regression guard for the test itself)."""
    rng = np.random.default_rng(0)
    reached = set()
    for _ in range(300):
        num_envs, k = int(rng.integers(1, 4)), int(rng.integers(2, 6))
        cap, size, cursor, steps = _ring(rng, num_envs, k, int(rng.integers(0, 5)), True)
        depth = rng.integers(0, k, cap)
        for x in range(cap):
            e = x % num_envs
            age = ((cursor - num_envs) - (x - e)) % cap // num_envs
            for j in range(int(depth[x]) + 1):
                if age + j >= cap // num_envs:
                    reached.add("hist")
                elif x - j * num_envs < 0:
                    reached.add("wrap")
    assert reached == {"hist", "wrap"}


@SETTINGS
@given(seed=st.integers(0, 2**32 - 1), num_envs=st.integers(1, 3), k=st.integers(2, 5),
       extra=st.integers(0, 4), full=st.booleans(), word=st.sampled_from(WORDS),
       width=st.integers(1, 3), hostile=st.booleans(), steps_written=st.integers(1, 30))
def test_frames_write_matches_the_reference(seed, num_envs, k, extra, full, word, width, hostile,
                                            steps_written):
    rng = np.random.default_rng(seed)
    cap, size, cursor, steps = _ring(rng, num_envs, k, extra, full)
    off = int(rng.integers(0, 3))
    info = np.iinfo(word)
    src = rng.integers(0, info.max, (cap, off + width + 1), dtype=word, endpoint=True)
    hist = rng.integers(0, info.max, (k - 1, num_envs, width), dtype=word, endpoint=True)
    n = steps_written * num_envs  # up to several laps of the ring in one write
    obs = rng.integers(0, info.max, (n, k * width), dtype=word, endpoint=True)
    # as a write passes them: the batch's flag arrays (strided flags compiled a specialization
    # that only this test called)
    term, trunc = (np.ascontiguousarray(f) for f in _flags(rng, n, 0.3))
    if hostile:  # bounded whatever prev holds
        prev = rng.integers(-(2**15), 2**15, num_envs).astype(np.int16)
    else:
        prev = rng.integers(-1, k, num_envs).astype(np.int16)
    depth = rng.integers(0, 256, cap).astype(np.uint8)
    want = naive.frames_write_naive(obs, term, trunc, num_envs, cursor, cap, size, steps, src, off,
                                    hist, prev, depth)
    frames_write(obs, term, trunc, num_envs, cursor, cap, size, steps, src, off, hist, prev, depth)
    for got, ref, name in zip((hist, prev, depth), want, ("hist", "prev", "depth")):
        assert np.array_equal(got, ref), name


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), num_envs=st.integers(1, 3), k=st.integers(2, 5),
       extra=st.integers(0, 3), padding=st.sampled_from(["reset", "zero", "value"]),
       old=st.integers(0, 25), new=st.integers(1, 8), corrupt=st.integers(0, 3))
def test_frame_breaks_matches_the_reference_on_wrapped_rings(seed, num_envs, k, extra, padding, old,
                                                             new, corrupt):
    """Streams of a FrameStackEnv: ``old`` steps stored in a ring that wraps (the frames at a
    random offset in rows of words), then ``new`` steps checked, one byte corrupted sometimes;
    every padding mode."""
    rng = np.random.default_rng(seed)
    pad = np.full((3, 2), 77, np.uint8) if padding == "value" else padding
    env = naive.FrameStackEnv(num_envs, k, padding=pad, p_end=0.3)
    cap = num_envs * (k + extra)
    off = int(rng.integers(0, 3))
    src = rng.integers(0, 256, (cap, off + 6 + 1), dtype=np.uint8)
    frames = [[] for _ in range(num_envs)]
    depth = [-1] * num_envs
    cursor = 0
    for s in (env.step(rng) for _ in range(old)):
        for e in range(num_envs):
            src[cursor + e, off:off + 6] = s["obs"][e, -1].reshape(-1)
            depth[e] = 0 if depth[e] < 0 else min(depth[e] + 1, k - 1)
            frames[e].append(s["obs"][e, -1])
            if s["terminated"][e] or s["truncated"][e]:
                depth[e] = -1
        cursor = (cursor + num_envs) % cap
    todo = [env.step(rng) for _ in range(new)]
    obs = np.concatenate([s["obs"] for s in todo])
    nxt = np.concatenate([s["next_obs"] for s in todo])
    term = np.concatenate([s["terminated"] for s in todo])
    trunc = np.concatenate([s["truncated"] for s in todo])
    for _ in range(corrupt):
        which = obs if rng.random() < 0.6 else nxt
        r, p = int(rng.integers(obs.shape[0])), int(rng.integers(k))
        which[r, p, int(rng.integers(3)), int(rng.integers(2))] ^= np.uint8(1 << int(rng.integers(8)))
    want = naive.frame_breaks_naive(obs, nxt, term | trunc, frames, depth, k, pad, num_envs)
    mode = {"reset": 0, "zero": 1, "value": 2}[padding]
    pad_words = np.full(6, 77, np.uint8) if padding == "value" else np.zeros(6, np.uint8)
    cur = np.zeros(num_envs, np.int16)
    got = frame_breaks(obs.reshape(obs.shape[0], -1), nxt.reshape(obs.shape[0], -1), term, trunc,
                       num_envs, cursor, cap, src, off, np.array(depth, np.int16), mode, pad_words, cur)
    assert got == want
    # without a next field (a stacked field that has none)
    want = naive.frame_breaks_naive(obs, None, term | trunc, frames, depth, k, pad, num_envs)
    got = frame_breaks(obs.reshape(obs.shape[0], -1), nxt.reshape(obs.shape[0], -1)[:0], term, trunc,
                       num_envs, cursor, cap, src, off, np.array(depth, np.int16), mode, pad_words, cur)
    assert got == want
