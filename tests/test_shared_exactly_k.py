"""SharedReplayBuffer(sampler="exactly_k"): writers write the next free slot of their shard
(per-slot ``taken`` / ``released`` counters), publish a log of the slots they wrote, and the
learner folds the log into its pool. No head-of-line blocking: a writer waits only when no slot
of its shard is free.

The kernels against their pure-Python references (tests/naive.py), then real writer processes
and a learner: the stall of the ring design is gone, exact counts, drop counts, a killed writer,
a closed buffer, the rate limiter, and equality with a ReplayBuffer given the same rows."""

from __future__ import annotations

import collections
import multiprocessing as mp
import os
import signal
import threading
import time

import numpy as np
import pytest

from tfdata import RateLimiter, ReplayBuffer, SharedReplayBuffer, SharedWriter
from tfdata.errors import SharedBufferError, WriterLostWarning
from tfdata.kernels import _replays

from . import naive

SPEC = {"id": "i8", "obs": ("f4", (3,)), "reward": "f4"}


def rows(ids) -> dict:
    ids = np.asarray(ids, np.int64)
    return {"id": ids, "obs": np.repeat(ids[:, None], 3, 1).astype(np.float32),
            "reward": ids.astype(np.float32)}


def one(i) -> dict:
    return {k: v[0] for k, v in rows([i]).items()}


# -- the kernels against their references ----------------------------------------------------------
def test_claim_fold_release_match_references():
    """A simulated run: writers claim free slots from their cursors, log them and publish; the
    learner folds the logs, draws, releases; every step against the references."""
    rng = np.random.default_rng(3)
    for trial in range(120):
        shards, cap, k = int(rng.integers(1, 4)), int(rng.integers(1, 9)), int(rng.integers(1, 4))
        n = shards * cap
        taken, released, log = (np.zeros(n, np.uint64) for _ in range(3))
        heads = np.zeros(shards, np.uint64)
        folded = np.zeros(shards, np.int64)
        pool, rem, meta = np.zeros(n, np.uint32), np.zeros(n, np.uint8), np.zeros(1, np.int64)
        cursors = [0] * shards
        state = np.array([naive.mix64(trial), 0], np.uint64)
        for step in range(40):
            for s in range(shards):
                want = int(rng.integers(0, cap + 2))
                out = np.full(cap + 1, -7, np.int64)
                got = _replays.replays_claim(taken, released, s * cap, cap, cursors[s], want, out)
                ref = naive.exactly_k_claim_naive(taken.tolist(), released.tolist(), s * cap,
                                                   cap, cursors[s], min(want, cap + 1))
                assert out[:got].tolist() == ref
                if got:
                    cursors[s] = (int(out[got - 1]) + 1) % cap
                    assert _replays.replays_log(taken, log, s * cap, cap, int(heads[s]), out[:got]) == got
                    heads[s] += got
            ref = naive.exactly_k_fold_log_naive(pool.tolist(), int(meta[0]), rem.tolist(),
                                                 [int(h) for h in heads], log.tolist(),
                                                 folded.tolist(), cap, k)
            got = _replays.replays_fold_log(pool, rem, meta, heads, log, folded, cap, k)
            assert got == ref[4] and got >= 0
            assert meta[0] == ref[1] and pool[:ref[1]].tolist() == ref[0][:ref[1]]
            assert rem.tolist() == ref[2] and folded.tolist() == ref[3]
            b = int(rng.integers(0, int(meta[0]) + 1))
            idx = np.empty(b, np.int64)
            assert _replays.replays_sample(pool, rem, meta, state, idx) >= 0
            want_rel, want_freed = naive.exactly_k_release_naive(rem.tolist(), released.tolist(),
                                                                  idx.tolist())
            assert _replays.replays_release(rem, released, idx) == want_freed
            assert released.tolist() == want_rel
            # the invariant: a slot is free iff it is not awaiting replay nor published unfolded
            assert ((taken == released) == (rem == 0)).all()


def test_kernels_stay_inside_their_arrays_whatever_they_hold():
    z64 = lambda n: np.zeros(n, np.uint64)  # noqa: E731
    out = np.zeros(4, np.int64)
    assert _replays.replays_claim(z64(4), z64(3), 0, 4, 0, 1, out) == -1
    assert _replays.replays_claim(z64(4), z64(4), 2, 4, 0, 1, out) == -1  # shard past the end
    assert _replays.replays_claim(z64(4), z64(4), 0, 4, 4, 1, out) == -1  # cursor out of it
    assert _replays.replays_claim(z64(4), z64(4), 0, 4, 3, 9, out) == 4
    assert out.tolist() == [3, 0, 1, 2]
    assert _replays.replays_log(z64(4), z64(4), 0, 4, 0, np.array([4])) == -1  # not of the shard
    assert _replays.replays_log(z64(4), z64(4), 0, 4, 0, np.array([-1])) == -1
    assert _replays.replays_log(z64(4), z64(3), 0, 4, 0, np.array([1])) == -1
    pool, rem, meta = np.zeros(4, np.uint32), np.zeros(4, np.uint8), np.zeros(1, np.int64)
    folded = np.zeros(2, np.int64)
    log = z64(4)
    # a head behind what was folded, or further ahead than the shard holds: untrusted
    assert _replays.replays_fold_log(pool, rem, meta, np.array([3, 0], np.uint64), log,
                                     np.array([5, 0], np.int64), 2, 1) == -2
    assert _replays.replays_fold_log(pool, rem, meta, np.array([3, 0], np.uint64), log, folded, 2, 1) == -2
    # a log entry out of the shard; then one naming a slot already in the pool
    log[:] = [1, 7, 0, 0]
    assert _replays.replays_fold_log(pool, rem, meta, np.array([2, 0], np.uint64), log, folded, 2, 1) == -2
    assert folded.tolist() == [1, 0] and meta[0] == 1 and pool[0] == 1
    log[:] = [1, 1, 0, 0]
    assert _replays.replays_fold_log(pool, rem, meta, np.array([2, 0], np.uint64), log, folded, 2, 1) == -2
    assert folded.tolist() == [1, 0] and meta[0] == 1
    assert _replays.replays_fold_log(pool, rem, meta, np.array([2, 0], np.uint64), log, folded, 3, 1) == -1
    meta[0] = 99
    assert _replays.replays_fold_log(pool, rem, meta, np.array([0, 0], np.uint64), log, folded, 2, 1) == -1
    assert _replays.replays_release(rem, z64(4), np.array([4])) == -1
    assert _replays.replays_release(rem, z64(4), np.array([-1])) == -1
    assert _replays.replays_release(rem, z64(3), np.array([0])) == -1
