"""Prioritized sampling from a shared-memory buffer: the learner's priority trees over rows that
writer processes publish (see :mod:`tfdata.kernels._shared` for the sequence lock).

The learner owns the trees. Before a draw it *folds* the rows published since the last fold into
them, in publication order, exactly as a single-process buffer does at each write
(:func:`tfdata.kernels._tree.tree_overwrite_max`: evict the slot's old row, bump its version,
give the new row the live maximum); so with one writer the trees, and the samples, are those of
a :class:`tfdata.PrioritizedReplayBuffer` given the same rows. A drawn slot that a writer may
have been overwriting during the copy is found after the copy (as for uniform shared samples)
and drawn again, from the same trees (no fold within one sample: the weights of a batch all
refer to one distribution).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .._config import NJIT_OPTIONS
from ._shared import in_windows, snapshot_heads, windows
from ._sync import fence_acquire
from ._tree import epoch_stamp, is_weights, live_limit, stratified_find, tree_overwrite_max


@njit(**NJIT_OPTIONS)
def published_spans(heads, cap, scratch, published, spans):
    """Read every head once (acquire) into ``scratch`` as :func:`read_heads` does, and list the
    rows published since ``published`` as spans of slots, shard after shard, each shard's in
    publication order (rows a writer lapped since are skipped: only a shard's last ``cap`` rows
    remain); advance ``published`` to the heads read.

    Parameters
    ----------
    heads : ndarray of uint64, shape (shards,)
        The shards' heads (strided view of the control words).
    cap : int
        Slots per shard; row ``r`` of shard ``s`` is in slot ``s * cap + r % cap``.
    scratch : ndarray of int64, shape (>= 7 * shards,)
        Gets the heads snapshot (see :func:`tfdata.kernels._shared.snapshot_heads`).
    published : ndarray of int64, shape (shards,)
        Rows of each shard listed so far; advanced here.
    spans : ndarray of int64, shape (>= 2 * shards, 2)
        Output: ``[first slot, count]`` of each span (at most two per shard).

    Returns
    -------
    tuple of int
        Rows held in all shards, and the number of spans written.
    """
    total = snapshot_heads(heads, cap, scratch)
    n = heads.shape[0]
    m = 0
    for s in range(n):
        h = scratch[n + s]
        r = max(published[s], h - cap)
        while r < h:
            dst = r % cap
            count = min(h - r, cap - dst)
            spans[m, 0] = s * cap + dst
            spans[m, 1] = count
            m += 1
            r += count
        if h > published[s]:
            published[s] = h
    return total, m


@njit(**NJIT_OPTIONS)
def overwrite_max_spans(sums, mm, leaves, version, spans):
    """New rows in the slots of ``spans`` (int64 ``(m, 2)``: first slot, count), one at a time,
    in order, as that many pushes give them (:func:`tfdata.kernels._tree.tree_overwrite_max`
    for each): the one-row write hook of a prioritized sampler over many rows in one call (what
    the shard streams call for the rows writer processes published since the last sample).
    ``sums, mm, leaves`` the priority tree, ``version`` uint8 ``(capacity,)`` the writes per
    slot; a slot outside them changes nothing."""
    for j in range(spans.shape[0]):
        for slot in range(spans[j, 0], spans[j, 0] + spans[j, 1]):
            tree_overwrite_max(sums, mm, leaves, version, slot)


@njit(**NJIT_OPTIONS)
def read_heads(heads, cap, scratch):
    """Read every head once (acquire) into ``scratch`` as :func:`published_spans` does, without
    listing the writes: the heads a redrawn row is checked against; returns rows held."""
    return snapshot_heads(heads, cap, scratch)


@njit(**NJIT_OPTIONS)
def draw_prioritized(sums, mm, leaves, version, ring, state, beta, idx, u, weights, versions):
    """Stratified proportional draws into ``idx`` with IS weights and versions (as
    ``sample_prioritized`` without the copy: ``versions[i] = epoch << 8 | version[idx[i]]``, the
    epoch from ``sums[0]`` and ``ring`` as there); ``idx`` may be a one-row slice for a redraw.

    Returns 0, or -1 with nothing drawn when the root mass is not finite and positive. Every
    slot drawn is in ``[0, version.shape[0])`` whatever the trees hold.
    """
    limit = live_limit(sums, leaves, version.shape[0], version.shape[0])
    if limit == 0:
        return -1
    stratified_find(sums, leaves, limit, state, idx, u)
    is_weights(mm, leaves, idx, beta, weights, u)
    stamp = epoch_stamp(sums, ring)
    for i in range(idx.shape[0]):
        versions[i] = stamp | np.uint32(version[idx[i]])
    return 0


@njit(**NJIT_OPTIONS)
def torn_after_copy(reserved, cap, scratch, idx, mark):
    """After the rows of ``idx`` were copied: which of them a writer may have been writing since
    the heads in ``scratch`` were read (``mark[i] = 1``); returns how many."""
    fence_acquire()
    n = reserved.shape[0]
    m = windows(reserved, scratch, cap)
    torn = 0
    for i in range(idx.shape[0]):
        mark[i] = 1 if m and in_windows(scratch, n, m, idx[i]) else 0
        torn += mark[i]
    return torn
