"""Struct-of-arrays kernels.

The storage is one C-contiguous array per field. Kernels see a tuple of byte views
``uint8[capacity, field_bytes]`` (one per field) and copy each field with the widest word that
divides its row width, so a float32[4] field moves as two 64-bit words, not sixteen bytes.
The tuple length is part of the compiled signature: one compile per number of fields.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .._config import INLINE_OPTIONS, NJIT_OPTIONS
from ._copy import copy_rows
from ._rng import fill_indices
from ._tree import is_weights, live_limit, stratified_find
from ._shared import draw_slot, draw_slots, in_windows, snapshot_heads, windows
from ._sync import fence_acquire

_TWO32 = np.uint64(1 << 32)


@njit(**INLINE_OPTIONS)
def _copy_field(src, idx, dst):
    width = src.shape[1]
    if width % 8 == 0:
        copy_rows(src.view(np.uint64), idx, dst.view(np.uint64))
    elif width % 4 == 0:
        copy_rows(src.view(np.uint32), idx, dst.view(np.uint32))
    elif width % 2 == 0:
        copy_rows(src.view(np.uint16), idx, dst.view(np.uint16))
    else:
        copy_rows(src, idx, dst)


@njit(**NJIT_OPTIONS)
def gather(store, idx, out):
    """Copy rows ``idx`` of every field into ``out``.

    Parameters
    ----------
    store : tuple of ndarray of uint8, each shape (capacity, field_bytes)
        Byte views of the field arrays.
    idx : ndarray of int64, shape (batch,)
        Row numbers, each in ``[0, capacity)`` (checked by the caller).
    out : tuple of ndarray of uint8, each shape (>= batch, field_bytes)
        Byte views of the destination field arrays, in the same order.
    """
    for f in range(len(store)):
        _copy_field(store[f], idx, out[f])


@njit(**NJIT_OPTIONS)
def sample_uniform(store, n, state, idx, out):
    """Draw ``len(idx)`` uniform row numbers in ``[0, n)`` into ``idx`` and gather them into ``out``.

    Parameters
    ----------
    store : tuple of ndarray of uint8, each shape (capacity, field_bytes)
    n : int
        Number of valid rows, ``1 <= n <= capacity``.
    state : ndarray of uint64, shape (2,)
        Counter-based RNG state ``[key, counter]``; advanced in place.
    idx : ndarray of int64, shape (batch,)
        Output: the sampled row numbers.
    out : tuple of ndarray of uint8, each shape (batch, field_bytes)
        Output: the sampled rows of every field.
    """
    fill_indices(n, state, idx)
    for f in range(len(store)):
        _copy_field(store[f], idx, out[f])


@njit(**NJIT_OPTIONS)
def sample_prioritized(store, n, sumt, mint, version, state, beta, idx, u, weights, versions, out):
    """Stratified proportional sample with importance weights, gathered into ``out``.

    Parameters
    ----------
    store : tuple of ndarray of uint8, each shape (capacity, field_bytes)
    n : int
    sumt, mint : ndarray of float64, shape (2 * P,)
    version : ndarray of uint64, shape (capacity,)
    state : ndarray of uint64, shape (2,)
    beta : float
    idx : ndarray of int64, shape (batch,)
    u : ndarray of float64, shape (batch,)
    weights : ndarray of float32, shape (batch,)
    versions : ndarray of uint64, shape (batch,)
    out : tuple of ndarray of uint8, each shape (batch, field_bytes)

    See ``tfdata.kernels.aos.sample_prioritized`` (the same return value); only the row copy
    differs.
    """
    rows = version.shape[0]
    for f in range(len(store)):
        rows = min(rows, store[f].shape[0])
    limit = live_limit(sumt, n, rows)
    if limit == 0:
        return -1
    stratified_find(sumt, limit, state, idx, u)
    is_weights(sumt, mint, idx, beta, weights)
    for i in range(idx.shape[0]):
        versions[i] = version[idx[i]]
    for f in range(len(store)):
        _copy_field(store[f], idx, out[f])
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
    store : tuple of ndarray of uint8, each shape (slots, field_bytes)
    heads, reserved : ndarray of uint64, shape (shards,)
        Strided views of the shards' control words.
    cap : int
        Slots per shard.
    scratch : ndarray of int64, shape (7 * shards + batch,)
    state : ndarray of uint64, shape (2,)
        Counter-based RNG state, advanced in place.
    idx : ndarray of int64, shape (batch,)
        Output: the slots sampled.
    out : tuple of ndarray of uint8, each shape (batch, field_bytes)
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
    for f in range(len(store)):
        _copy_field(store[f], idx, out[f])
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
            for f in range(len(store)):
                _copy_field(store[f], idx[i:i + 1], out[f][i:i + 1])
            fence_acquire()
            if not in_windows(scratch, n, windows(reserved, scratch, cap), idx[i]):
                mark[i] = 0
                break
        rejected -= 1
    state[1] = ctr
    return redraws
