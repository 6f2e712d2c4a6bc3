"""``sample_into`` and ``sample_into_call``: the contract through which a MixedReplayBuffer fills
a buffer's rows of its batches. The bound call draws what ``sample_into`` draws (twins with the
same seed and rows, bit for bit, every sampler kind, one process and shared), writes the window
it was bound to and nothing else, and a refused call draws nothing and leaves the lock free.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import tfdata
from tfdata import PrioritizedReplayBuffer, ReplayBuffer, SharedReplayBuffer, SharedWriter, Spec

from .conftest import CARTPOLE, random_rows

CART = Spec(CARTPOLE)
GROUPS = [["obs", "action", "reward"], ["next_obs"], ["terminated", "truncated"]]
BIG, AT, K = 24, 5, 11  # the larger output, and the window [AT, AT + K) the buffer fills


def make(kind, layout, seed=3):
    if kind == "prioritized":
        return PrioritizedReplayBuffer(CART, 64, layout=layout, seed=seed)
    if kind == "limited":
        return ReplayBuffer(CART, 64, layout=layout, seed=seed,
                            rate_limiter=tfdata.RateLimiter(4.0, 1, 1e9))
    return ReplayBuffer(CART, 64, layout=layout, seed=seed, sampler=kind)


def fill(buf, n=40, seed=1):
    data = random_rows(CART, n, np.random.default_rng(seed))
    if isinstance(buf, PrioritizedReplayBuffer):
        buf.extend(data, priorities=np.linspace(0.1, 3.0, n))
    else:
        buf.extend(data)


def window(buf):
    """A larger output of the buffer's row format, its bytes set to 0xAB, and the window of it
    the buffer's rows go to, with the sampler's arrays for it."""
    st = buf.storage
    big = st.new_output(BIG)
    for a in (big.kernel_out if isinstance(big.kernel_out, tuple) else (big.kernel_out,)):
        a.view(np.uint8)[...] = 0xAB
    big.indices[:] = -7
    win = st.window(big, AT, K)
    return big, win, buf.sampler.ring_arrays(K, None, win)


def raw(out):
    rows = out.kernel_out if isinstance(out.kernel_out, tuple) else (out.kernel_out,)
    return [a.view(np.uint8).copy() for a in rows] + [out.indices.copy()]


def lock_is_free(buf) -> bool:
    """A sample from another thread finishes (it would wait for ever on a lock left taken)."""
    t = threading.Thread(target=buf.sample, args=(2,), daemon=True)
    t.start()
    t.join(60)
    return not t.is_alive()


KINDS = ["uniform", "prioritized", "without_replacement", "limited"]


@pytest.mark.parametrize("layout", ["aos", "soa", GROUPS], ids=["aos", "soa", "groups"])
@pytest.mark.parametrize("kind", KINDS)
def test_bound_call_draws_what_sample_into_draws(kind, layout):
    a, b = make(kind, layout), make(kind, layout)
    fill(a)
    fill(b)
    big_a, win_a, arr_a = window(a)
    big_b, win_b, arr_b = window(b)
    before = raw(big_a)
    call = a.sample_into_call(win_a, arr_a)
    for step in range(4):
        assert call() is None
        b.sample_into(win_b, arr_b)
        got, want = raw(big_a), raw(big_b)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
        # the window and nothing else: rows outside it keep their bytes
        for g, old in zip(got[:-1], before[:-1]):
            g, old = g.reshape(BIG, -1), old.reshape(BIG, -1)
            np.testing.assert_array_equal(g[:AT], old[:AT])
            np.testing.assert_array_equal(g[AT + K:], old[AT + K:])
        assert (got[-1][:AT] == -7).all() and (got[-1][AT + K:] == -7).all()
        assert ((got[-1][AT:AT + K] >= 0) & (got[-1][AT:AT + K] < len(a))).all()
        for name in arr_a:
            if isinstance(arr_a[name], np.ndarray):
                np.testing.assert_array_equal(arr_a[name], arr_b[name])
        assert a.sampler.state_dict() == b.sampler.state_dict()
        if kind == "limited":  # the batch counted as sample_into counts it
            assert a.rate_limiter.state_dict() == b.rate_limiter.state_dict()
        if kind == "prioritized":  # the draws go on matching after the priorities change
            p = np.arange(1.0, K + 1) * (step + 1)
            a.update_priorities(tfdata.Batch({}, win_a.indices, weights=arr_a["weights"],
                                             versions=arr_a["versions"]), p)
            b.update_priorities(tfdata.Batch({}, win_b.indices, weights=arr_b["weights"],
                                             versions=arr_b["versions"]), p)
            np.testing.assert_array_equal(a.priorities(), b.priorities())
        fill(a, 3, 10 + step)  # the rows held change between calls
        fill(b, 3, 10 + step)


@pytest.mark.parametrize("kind", ["uniform", "prioritized", "without_replacement"])
def test_refused_call_draws_nothing_and_frees_the_lock(kind):
    buf = make(kind, "aos")
    fill(buf, K - 1)
    big, win, arrays = window(buf)
    call = buf.sample_into_call(win, arrays)
    state, before = buf.state_dict()["sampler"], raw(big)
    with pytest.raises(ValueError, match=f"{K - 1}"):
        call()  # one row more than held
    assert buf.state_dict()["sampler"] == state
    for g, w in zip(raw(big), before):
        np.testing.assert_array_equal(g, w)
    assert lock_is_free(buf)
    fill(buf, 10, 2)
    call()  # the same call, once the rows are there
    assert ((win.indices >= 0) & (win.indices < len(buf))).all()


def test_failing_draw_undoes_the_limiters_count(monkeypatch):
    """A draw that raises after the gate counted the batch: the count is undone, the lock
    released."""
    buf = make("limited", "aos")
    fill(buf, 20)
    big, win, arrays = window(buf)

    def broken(n):
        raise RuntimeError("draw failed")

    monkeypatch.setattr(buf, "_draw_call", lambda out, arr: broken)
    call = buf.sample_into_call(win, arrays)
    sampled = buf.rate_limiter.state_dict()
    with pytest.raises(RuntimeError, match="draw failed"):
        call()
    assert buf.rate_limiter.state_dict() == sampled
    assert lock_is_free(buf)


@pytest.mark.parametrize("layout", ["aos", "soa"])
def test_shared_buffer_bound_call_matches_sample_into(layout, shm_dir):
    rows = random_rows(CART, 30, np.random.default_rng(4))
    with SharedReplayBuffer(CART, 64, layout=layout, seed=5) as a, \
            SharedReplayBuffer(CART, 64, layout=layout, seed=5) as b, \
            SharedWriter(a.name, 0) as wa, SharedWriter(b.name, 0) as wb:
        wa.extend(rows)
        wb.extend(rows)
        _, win_a, arr_a = window(a)
        big_b, win_b, arr_b = window(b)
        call = a.sample_into_call(win_a, arr_a)
        for _ in range(3):
            call()
            b.sample_into(win_b, arr_b)
            np.testing.assert_array_equal(win_a.indices, win_b.indices)
            for g, w in zip(raw(win_a)[:-1], raw(win_b)[:-1]):
                np.testing.assert_array_equal(g, w)
