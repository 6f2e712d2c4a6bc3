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
from ._tree import is_weights, live_limit, stratified_find, tree_overwrite_max


@njit(**NJIT_OPTIONS)
def fold_published(heads, cap, sums, mm, leaves, version, folded, scratch):
    """Give the rows published since the last fold their leaves; read every head once.

    Parameters
    ----------
    heads : ndarray of uint64, shape (shards,)
        The shards' heads (strided view of the control words).
    cap : int
        Slots per shard; row ``r`` of shard ``s`` is in slot ``s * cap + r % cap``.
    sums, mm, leaves : ndarray of float64, shape (2 * NB,); of float32, shape (2 * NB, 2); of float32, shape (P,)
        The priority tree (see :mod:`tfdata.kernels._tree`), ``P >= shards * cap``.
    version : ndarray of uint8, shape (shards * cap,)
        Writes per slot, modulo 256 (``sums[0]`` counts the rows folded).
    folded : ndarray of int64, shape (shards,)
        Rows of each shard folded so far; advanced to the heads read here.
    scratch : ndarray of int64, shape (>= 7 * shards,)
        Gets the heads snapshot :func:`tfdata.kernels._shared.windows` later checks against.

    Returns
    -------
    int
        Rows held in all shards (``sum(min(head, cap))``).
    """
    total = snapshot_heads(heads, cap, scratch)
    n = heads.shape[0]
    for s in range(n):
        h = scratch[n + s]
        start = max(folded[s], h - cap)  # a lap or more behind: only the last cap rows remain
        for r in range(start, h):
            tree_overwrite_max(sums, mm, leaves, version, s * cap + r % cap)
        folded[s] = max(folded[s], h)
    return total


@njit(**NJIT_OPTIONS)
def read_heads(heads, cap, scratch):
    """Read every head once (acquire) into ``scratch`` as :func:`fold_published` does, without
    folding: the heads a redrawn row is checked against; returns rows held."""
    return snapshot_heads(heads, cap, scratch)


@njit(**NJIT_OPTIONS)
def draw_prioritized(sums, mm, leaves, version, state, beta, idx, u, weights, versions):
    """Stratified proportional draws into ``idx`` with IS weights and versions (as
    ``sample_prioritized`` without the copy); ``idx`` may be a one-row slice for a redraw.

    Returns 0, or -1 with nothing drawn when the root mass is not finite and positive. Every
    slot drawn is in ``[0, version.shape[0])`` whatever the trees hold.
    """
    limit = live_limit(sums, leaves, version.shape[0], version.shape[0])
    if limit == 0:
        return -1
    stratified_find(sums, leaves, limit, state, idx, u)
    is_weights(mm, leaves, idx, beta, weights)
    for i in range(idx.shape[0]):
        versions[i] = version[idx[i]]
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
