"""The layout-free half of the shared-memory buffer: the writer's seqlock steps, the sampler's
draws and checks, and the FIFO consumer's merge of shards by arrival time.

Words (all uint64, in the shared region):

``seq[slot]``
    ``2*r + 1`` while row ``r`` of the slot's shard is being written into it, ``2*r + 2`` once it
    is complete, 0 if never written. A reader that sees the same even value before and after
    copying a slot copied exactly row ``r``, untorn.
``heads[s]``
    Rows shard ``s`` has published (a strided view, one word per shard); stored last, with
    release order, after the rows' sequence numbers.
``tails[s]``
    Rows of shard ``s`` the FIFO consumer has taken (written only by the consumer).
``stamps[slot]``
    ``CLOCK_MONOTONIC`` nanoseconds at which the slot's row was published (FIFO buffers only).

One writer per shard and one consumer per buffer: no word has two writers, so plain ordered
loads and stores (``_sync``) suffice, without read-modify-write atomics. The layout kernels
(``aos.sample_shared``, ``soa.sample_shared``, ``*.gather_checked``) call the inline helpers here
around their own row copy.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .._config import INLINE_OPTIONS, NJIT_OPTIONS
from ._rng import draw_one
from ._sync import fence_release, load_acquire, store_relaxed, store_release

_TWO32 = np.uint64(1 << 32)


@njit(**NJIT_OPTIONS)
def shard_begin(seq, base, cap, r0, k):
    """Mark the slots of rows ``r0 .. r0+k-1`` of one shard as being written.

    Parameters
    ----------
    seq : ndarray of uint64, shape (slots,)
    base : int
        First slot of the shard.
    cap : int
        Slots of the shard; row ``r`` lives in slot ``base + r % cap``.
    r0, k : int
        First row number and count, ``k <= cap``.
    """
    for r in range(r0, r0 + k):
        store_relaxed(seq, base + r % cap, 2 * r + 1)
    # the odd marks are visible before any byte of the rows that follow
    fence_release()


@njit(**NJIT_OPTIONS)
def shard_publish(seq, stamps, words, base, cap, r0, k, head, dropped, stamp):
    """Publish rows ``r0 .. r0+k-1`` (written since :func:`shard_begin`), then the new head.

    Parameters
    ----------
    seq : ndarray of uint64, shape (slots,)
    stamps : ndarray of uint64, shape (slots,) or (0,)
        Publication times; empty when the buffer keeps none.
    words : ndarray of uint64, shape (>= 2,)
        The shard's control words: ``words[0]`` its head, ``words[1]`` its count of dropped rows.
    base, cap, r0, k : int
        As in :func:`shard_begin`.
    head : int
        The shard's new head (rows published, counting rows a replay ring skipped).
    dropped : int
        The shard's new count of rows dropped by the FIFO ``"drop"`` policy.
    stamp : int
        ``CLOCK_MONOTONIC`` nanoseconds.
    """
    keep = stamps.shape[0] > 0
    for r in range(r0, r0 + k):
        s = base + r % cap
        if keep:
            stamps[s] = stamp
        # release: the row's bytes (and stamp) are visible before its even mark
        store_release(seq, s, 2 * r + 2)
    store_relaxed(words, 1, dropped)
    store_release(words, 0, head)


@njit(**INLINE_OPTIONS)
def snapshot_counts(heads, cap, counts):
    """``counts[s] = min(heads[s], cap)``, the rows each shard holds; returns their total."""
    total = 0
    for s in range(heads.shape[0]):
        c = min(np.int64(load_acquire(heads, s)), cap)
        counts[s] = c
        total += c
    return total


@njit(**INLINE_OPTIONS)
def draw_slot(counts, cap, total, threshold, key, ctr):
    """One uniform draw over the ``total`` rows held; returns ``(slot, next counter)``."""
    u, ctr = draw_one(np.uint64(total), threshold, key, ctr)
    s = 0
    while u >= counts[s]:
        u -= counts[s]
        s += 1
    return s * cap + u, ctr


@njit(**INLINE_OPTIONS)
def draw_and_mark(seq, counts, cap, total, key, ctr, idx, before):
    """Fill ``idx`` with uniform slots and ``before`` with their sequence numbers (acquire)."""
    nn = np.uint64(total)
    threshold = (_TWO32 - nn) % nn
    for i in range(idx.shape[0]):
        g, ctr = draw_slot(counts, cap, total, threshold, key, ctr)
        idx[i] = g
        before[i] = np.int64(load_acquire(seq, g))
    return ctr


@njit(**INLINE_OPTIONS)
def is_torn(seq, g, before):
    """Whether slot ``g`` was incomplete (odd, or never written) or rewritten since ``before``
    was read; call after an acquire fence that follows the copy."""
    return (before & 1) == 1 or before == 0 or np.int64(load_acquire(seq, g)) != before


@njit(**NJIT_OPTIONS)
def fifo_plan(heads, tails, dropped, stamps, cap, batch, partial, cursors, slots, expect, info):
    """Choose the next rows of a FIFO buffer: the oldest published rows of all shards.

    Shards are merged by publication time (``stamps``; ties go to the lower shard), each shard
    in its own order, until ``batch`` rows are chosen.

    Parameters
    ----------
    heads, tails, dropped : ndarray of uint64, shape (shards,)
        Strided views of the control words.
    stamps : ndarray of uint64, shape (slots,)
    cap, batch : int
    partial : bool
        Take fewer than ``batch`` rows when fewer are queued (else take none).
    cursors : ndarray of int64, shape (2 * shards,)
        Output: ``cursors[s]`` is shard ``s``'s tail after the chosen rows; ``cursors[shards + s]``
        its head as read here (scratch).
    slots, expect : ndarray of int64, shape (>= batch,)
        Output: the chosen slots and the sequence number each must hold (``2*r + 2``).
    info : ndarray of int64, shape (4,)
        Output: rows queued before the choice, the oldest chosen row's stamp, rows published
        by all shards, rows dropped by all shards.

    Returns
    -------
    int
        Rows chosen: ``batch``, or 0 when fewer are queued (fewer with ``partial``).
    """
    n = heads.shape[0]
    queued = 0
    published = 0
    lost = 0
    for s in range(n):
        h = np.int64(load_acquire(heads, s))
        cursors[n + s] = h
        cursors[s] = np.int64(tails[s])
        queued += h - cursors[s]
        published += h
        lost += np.int64(dropped[s])
    info[0] = queued
    info[2] = published
    info[3] = lost
    take = min(batch, queued)
    if take == 0 or (take < batch and not partial):
        return 0
    for i in range(take):
        best = -1
        best_stamp = np.uint64(0)
        for s in range(n):
            if cursors[s] < cursors[n + s]:
                st = stamps[s * cap + cursors[s] % cap]
                if best < 0 or st < best_stamp:
                    best = s
                    best_stamp = st
        if i == 0:
            info[1] = np.int64(best_stamp)
        r = cursors[best]
        slots[i] = best * cap + r % cap
        expect[i] = 2 * r + 2
        cursors[best] = r + 1
    return take


@njit(**NJIT_OPTIONS)
def fifo_commit(tails, cursors):
    """Hand the taken slots back to their writers: ``tails[s] = cursors[s]`` with release
    order, so every copy out of them is complete before a writer may reuse them."""
    for s in range(tails.shape[0]):
        store_release(tails, s, cursors[s])


@njit(**NJIT_OPTIONS)
def count_torn(seq, base, cap):
    """Slots of one shard left mid-write (odd sequence numbers), e.g. by a writer that died."""
    n = 0
    for s in range(base, base + cap):
        if (np.int64(load_acquire(seq, s)) & 1) == 1:
            n += 1
    return n
