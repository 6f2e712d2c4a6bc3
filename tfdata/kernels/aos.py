"""Array-of-structs kernels.

The storage is one structured array whose itemsize is a multiple of 8 bytes, seen here as
``uint64[capacity, words]``: a row is copied as whole 64-bit words. One compiled kernel serves
every schema (the row width is a runtime value), so a new schema never triggers a compile.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .._config import NJIT_OPTIONS
from ._copy import copy_rows
from ._rng import fill_indices
from ._tree import is_weights, stratified_find
from ._shared import draw_and_mark, draw_slot, is_torn, snapshot_counts
from ._sync import fence_acquire, load_acquire

_TWO32 = np.uint64(1 << 32)


@njit(**NJIT_OPTIONS)
def gather(store, idx, out):
    """Copy rows ``store[idx]`` into ``out``.

    Parameters
    ----------
    store : ndarray of uint64, shape (capacity, words)
        The record array viewed as 64-bit words.
    idx : ndarray of int64, shape (batch,)
        Row numbers, each in ``[0, capacity)`` (checked by the caller).
    out : ndarray of uint64, shape (>= batch, words)
        Destination rows.
    """
    copy_rows(store, idx, out)


@njit(**NJIT_OPTIONS)
def sample_uniform(store, n, state, idx, out):
    """Draw ``len(idx)`` uniform row numbers in ``[0, n)`` into ``idx`` and gather them into ``out``.

    Parameters
    ----------
    store : ndarray of uint64, shape (capacity, words)
    n : int
        Number of valid rows, ``1 <= n <= capacity``.
    state : ndarray of uint64, shape (2,)
        Counter-based RNG state ``[key, counter]``; advanced in place.
    idx : ndarray of int64, shape (batch,)
        Output: the sampled row numbers.
    out : ndarray of uint64, shape (batch, words)
        Output: the sampled rows.
    """
    fill_indices(n, state, idx)
    copy_rows(store, idx, out)


@njit(**NJIT_OPTIONS)
def sample_prioritized(store, sumt, mint, version, state, beta, idx, u, weights, versions, out):
    """Stratified proportional sample with importance weights, gathered into ``out``.

    Parameters
    ----------
    store : ndarray of uint64, shape (capacity, words)
    sumt, mint : ndarray of float64, shape (2 * P,)
        Sum and min trees (see ``tfdata.kernels._tree``); the root mass must be positive.
    version : ndarray of uint64, shape (capacity,)
        Write count of every slot.
    state : ndarray of uint64, shape (2,)
        Counter-based RNG state, advanced in place (one word per draw).
    beta : float
        Importance-sampling exponent.
    idx : ndarray of int64, shape (batch,)
        Output: sampled slots.
    u : ndarray of float64, shape (batch,)
        Scratch.
    weights : ndarray of float32, shape (batch,)
        Output: ``(p_min / p_i) ** beta``, so the largest possible weight is 1.
    versions : ndarray of uint64, shape (batch,)
        Output: ``version[idx]``, to detect stale priority updates.
    out : ndarray of uint64, shape (batch, words)
        Output: the sampled rows.
    """
    stratified_find(sumt, state, idx, u)
    is_weights(sumt, mint, idx, beta, weights)
    for i in range(idx.shape[0]):
        versions[i] = version[idx[i]]
    copy_rows(store, idx, out)


@njit(**NJIT_OPTIONS)
def sample_shared(store, seq, heads, cap, scratch, state, idx, out, max_redraws):
    """Uniform sample of fully written rows from a shared buffer whose writers may be writing.

    Draws like ``sample_uniform`` over the rows the shards hold (their heads read once, with
    acquire order), copies the rows, then re-reads each slot's sequence number: a row that was
    incomplete or rewritten during the copy is drawn again, alone, until it copies cleanly.

    Parameters
    ----------
    store : ndarray of uint64, shape (slots, words)
    seq : ndarray of uint64, shape (slots,)
    heads : ndarray of uint64, shape (shards,)
    cap : int
        Slots per shard.
    scratch : ndarray of int64, shape (shards + batch,)
    state : ndarray of uint64, shape (2,)
        Counter-based RNG state, advanced in place.
    idx : ndarray of int64, shape (batch,)
        Output: the slots sampled.
    out : ndarray of uint64, shape (batch, words)
        Output: the rows.
    max_redraws : int
        Redraws allowed before giving up.

    Returns
    -------
    int
        Redraws made (>= 0); -1 if ``max_redraws`` ran out; -2 if the shards hold fewer rows
        than ``batch`` (nothing drawn).
    """
    counts = scratch[:heads.shape[0]]
    before = scratch[heads.shape[0]:]
    total = snapshot_counts(heads, cap, counts)
    batch = idx.shape[0]
    if total < batch:
        return -2
    key = state[0]
    ctr = draw_and_mark(seq, counts, cap, total, key, state[1], idx, before)
    copy_rows(store, idx, out)
    fence_acquire()
    nn = np.uint64(total)
    threshold = (_TWO32 - nn) % nn
    redraws = 0
    for i in range(batch):
        while is_torn(seq, idx[i], before[i]):
            if redraws == max_redraws:
                state[1] = ctr
                return -1
            redraws += 1
            g, ctr = draw_slot(counts, cap, total, threshold, key, ctr)
            idx[i] = g
            before[i] = np.int64(load_acquire(seq, g))
            copy_rows(store, idx[i:i + 1], out[i:i + 1])
            fence_acquire()
    state[1] = ctr
    return redraws


@njit(**NJIT_OPTIONS)
def gather_checked(store, seq, slots, expect, k, out):
    """Copy the rows at ``slots`` into ``out`` and check each held exactly the expected row.

    Parameters
    ----------
    store : ndarray of uint64, shape (slots, words)
    seq : ndarray of uint64, shape (slots,)
    slots, expect : ndarray of int64, shape (>= k,)
        Slots to copy and the sequence number each must hold before and after the copy.
    k : int
        Rows to copy.
    out : ndarray of uint64, shape (batch, words)

    Returns
    -------
    int
        -1 when every row checked, else the position of the first that did not.
    """
    for i in range(k):
        if np.int64(load_acquire(seq, slots[i])) != expect[i]:
            return i
    copy_rows(store, slots[:k], out)
    fence_acquire()
    for i in range(k):
        if np.int64(load_acquire(seq, slots[i])) != expect[i]:
            return i
    return -1
