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
from ._tree import is_weights, live_limit, stratified_find
from ._shared import draw_slot, draw_slots, in_windows, snapshot_heads, windows
from ._sync import fence_acquire

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
def sample_prioritized(store, n, sumt, mint, version, state, beta, idx, u, weights, versions, out):
    """Stratified proportional sample with importance weights, gathered into ``out``.

    Parameters
    ----------
    store : ndarray of uint64, shape (capacity, words)
    n : int
        Number of live rows: every slot drawn is in ``[0, n)``.
    sumt, mint : ndarray of float64, shape (2 * P,)
        Sum and min trees (see ``tfdata.kernels._tree``).
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

    Returns
    -------
    int
        0; or -1, with nothing drawn or written, when the root mass is not finite and positive
        or there are no live rows (the caller raises). Whatever the trees hold, every slot
        drawn is in ``[0, min(n, capacity))``.
    """
    limit = live_limit(sumt, n, min(version.shape[0], store.shape[0]))
    if limit == 0:
        return -1
    stratified_find(sumt, limit, state, idx, u)
    is_weights(sumt, mint, idx, beta, weights)
    for i in range(idx.shape[0]):
        versions[i] = version[idx[i]]
    copy_rows(store, idx, out)
    return 0


@njit(**NJIT_OPTIONS)
def sample_shared(store, heads, reserved, cap, scratch, state, idx, out, max_redraws):
    """Uniform sample of complete rows from a shared buffer whose writers may be writing.

    Reads every shard's head once (acquire), draws like ``sample_uniform`` over the rows the
    shards hold, copies the rows, then (after an acquire fence) reads each shard's reserve: a
    row whose slot a writer may have been writing during the copy is drawn again, alone, until
    one copies cleanly (see ``tfdata.kernels._shared``).

    Parameters
    ----------
    store : ndarray of uint64, shape (slots, words)
    heads, reserved : ndarray of uint64, shape (shards,)
        Strided views of the shards' control words.
    cap : int
        Slots per shard.
    scratch : ndarray of int64, shape (7 * shards + batch,)
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
    n = heads.shape[0]
    total = snapshot_heads(heads, cap, scratch)
    batch = idx.shape[0]
    if total < batch:
        return -2
    mark = scratch[7 * n:]
    key = state[0]
    ctr = draw_slots(scratch, cap, total, total == n * cap, key, state[1], idx)
    copy_rows(store, idx, out)
    fence_acquire()
    # judge every row against the heads read before the copy; then redraw the rejected ones
    # one at a time, each against heads read afresh (writers keep moving the window)
    m = windows(reserved, scratch, cap)
    rejected = 0
    for i in range(batch if m else 0):
        mark[i] = in_windows(scratch, n, m, idx[i])
        rejected += mark[i]
    redraws = 0
    i = 0
    while rejected:
        while mark[i] == 0:
            i += 1
        while True:
            if redraws == max_redraws:
                state[1] = ctr
                return -1
            redraws += 1
            total = snapshot_heads(heads, cap, scratch)
            nn = np.uint64(total)
            idx[i], ctr = draw_slot(scratch, cap, total, total == n * cap, (_TWO32 - nn) % nn, key, ctr)
            copy_rows(store, idx[i:i + 1], out[i:i + 1])
            fence_acquire()
            if not in_windows(scratch, n, windows(reserved, scratch, cap), idx[i]):
                mark[i] = 0
                break
        rejected -= 1
    state[1] = ctr
    return redraws
