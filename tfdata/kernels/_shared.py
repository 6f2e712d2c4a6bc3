"""The layout-free half of the shared-memory buffer: the writer's two steps around its rows,
the sampler's draws and in-flight check, and the FIFO consumer's merge of shards.

Words (all uint64, in the shared region); each has exactly one writer process:

``words[HEAD]`` of a shard (``heads[s]`` in the strided view)
    Rows the shard's writer has published: stored last, with release order, after the rows.
``words[RESERVED]`` (``reserved[s]``)
    Rows the writer has begun: stored, then a release fence, before the first byte of a write.
    Rows ``heads[s] .. reserved[s] - 1`` are being written; their slots are not to be trusted.
    Together with the head this is a sequence lock over the range of slots being written.
``words[DROPPED]``
    Rows the FIFO ``"drop"`` policy refused.
``tails[s]``
    Rows of shard ``s`` the FIFO consumer has taken (written only by the consumer).
``stamps[slot]``
    ``CLOCK_MONOTONIC`` nanoseconds at which the slot's row was published (FIFO buffers only).

A reader reads a head (acquire), copies rows, issues an acquire fence and reads the reserve: a
row whose slot lies outside the range ``[head, reserve)`` (modulo the shard's capacity) was not
written during the copy. This costs no memory access per row beyond the copy itself.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .._config import INLINE_OPTIONS, NJIT_OPTIONS
from ._rng import draw_one
from ._sync import fence_release, load_acquire, store_relaxed, store_release

_TWO32 = np.uint64(1 << 32)
#: positions in a shard's control words (tfdata/shared.py lays them out the same way)
HEAD, DROPPED, RESERVED = 0, 1, 2


@njit(**NJIT_OPTIONS)
def shard_begin(words, end):
    """Announce that rows up to ``end - 1`` of a shard are about to be written.

    Parameters
    ----------
    words : ndarray of uint64, shape (>= 3,)
        The shard's control words.
    end : int
        One past the last row about to be written.
    """
    # never lower it: a writer that took over a dead writer's shard must keep the slots that
    # writer left half-written out of reach until it has rewritten them
    if np.int64(words[RESERVED]) < end:
        store_relaxed(words, RESERVED, end)
    # the reserve is visible before any byte of the rows; loads before (a FIFO writer's read
    # of the tail) complete before those bytes are stored
    fence_release()


@njit(**NJIT_OPTIONS)
def shard_publish(stamps, words, base, cap, r0, k, head, dropped, stamp):
    """Publish rows ``r0 .. r0+k-1`` (written since :func:`shard_begin`) and the new head.

    Parameters
    ----------
    stamps : ndarray of uint64, shape (slots,) or (0,)
        Publication times; empty when the buffer keeps none.
    words : ndarray of uint64, shape (>= 3,)
        The shard's control words.
    base, cap : int
        First slot and number of slots of the shard; row ``r`` lives in slot ``base + r % cap``.
    r0, k : int
        First row written and number of rows.
    head : int
        The shard's new head (rows published, counting rows a replay ring skipped).
    dropped : int
        The shard's new count of rows dropped by the FIFO ``"drop"`` policy.
    stamp : int
        ``CLOCK_MONOTONIC`` nanoseconds.
    """
    if stamps.shape[0] > 0:
        for r in range(r0, r0 + k):
            stamps[base + r % cap] = stamp
    store_relaxed(words, DROPPED, dropped)
    # release: the rows (and stamps) are visible before the head that publishes them
    store_release(words, HEAD, head)


@njit(**INLINE_OPTIONS)
def snapshot_heads(heads, cap, scratch):
    """Read every head once (acquire). ``scratch[:S]`` gets the rows each shard holds,
    ``scratch[S:2S]`` the heads, ``scratch[2S:3S]`` the heads modulo ``cap`` (the slots where
    writes start); returns the rows held in all."""
    n = heads.shape[0]
    total = 0
    for s in range(n):
        h = np.int64(load_acquire(heads, s))
        c = min(h, cap)
        scratch[s] = c
        scratch[n + s] = h
        scratch[2 * n + s] = h % cap
        total += c
    return total


@njit(**INLINE_OPTIONS)
def draw_slot(scratch, cap, total, full, threshold, key, ctr):
    """One uniform draw over the ``total`` rows held; returns ``(slot, next counter)``.

    Held rows are numbered shard by shard; when every shard is full the number is the slot.
    """
    u, ctr = draw_one(np.uint64(total), threshold, key, ctr)
    if full:
        return u, ctr
    s = 0
    while u >= scratch[s]:
        u -= scratch[s]
        s += 1
    return s * cap + u, ctr


@njit(**INLINE_OPTIONS)
def draw_slots(scratch, cap, total, full, key, ctr, idx):
    """Fill ``idx`` with uniform slots; returns the counter."""
    nn = np.uint64(total)
    threshold = (_TWO32 - nn) % nn
    for i in range(idx.shape[0]):
        idx[i], ctr = draw_slot(scratch, cap, total, full, threshold, key, ctr)
    return ctr


@njit(**INLINE_OPTIONS)
def windows(reserved, scratch, cap):
    """The slots that may have been written since the heads were read, as at most two
    intervals per shard in ``scratch[3S:7S]`` (``lo, hi`` pairs); returns how many. A shard's
    are the slots of rows ``head .. reserved - 1``. Call after an acquire fence that follows
    the copy."""
    n = reserved.shape[0]
    at = 3 * n
    m = 0
    for s in range(n):
        span = np.int64(load_acquire(reserved, s)) - scratch[n + s]
        if span <= 0:
            continue
        lo = s * cap
        top = lo + cap
        start = lo + scratch[2 * n + s]
        end = start + min(span, cap)
        scratch[at + 2 * m] = start
        scratch[at + 2 * m + 1] = min(end, top)
        m += 1
        if end > top:  # the range wraps to the shard's first slots
            scratch[at + 2 * m] = lo
            scratch[at + 2 * m + 1] = lo + (end - top)
            m += 1
    return m


@njit(**INLINE_OPTIONS)
def in_windows(scratch, n, m, slot):
    """Whether ``slot`` lies in one of the ``m`` intervals :func:`windows` found."""
    at = 3 * n
    for j in range(m):
        if scratch[at + 2 * j] <= slot < scratch[at + 2 * j + 1]:
            return True
    return False


@njit(**NJIT_OPTIONS)
def fifo_plan(heads, tails, dropped, stamps, cap, batch, partial, cursors, slots, info):
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
    slots : ndarray of int64, shape (>= batch,)
        Output: the chosen slots.
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
        cursors[best] = r + 1
    return take


@njit(**NJIT_OPTIONS)
def fifo_commit(tails, cursors):
    """Hand the taken slots back to their writers: ``tails[s] = cursors[s]`` with release
    order, so every copy out of them is complete before a writer may reuse them."""
    for s in range(tails.shape[0]):
        store_release(tails, s, cursors[s])
