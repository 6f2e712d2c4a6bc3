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

from .._config import INLINE_OPTIONS, NJIT_OPTIONS
from ._shared import draw_slot, in_windows, snapshot_heads, windows
from ._sync import fence_acquire
from ._tree import is_weight, is_weights, live_limit, stratified_find, tree_overwrite_max

_TWO32 = np.uint64(1 << 32)


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


@njit(**NJIT_OPTIONS)
def shard_nstep(idx, scratch, shards, cap, n, gamma, reward, term, trunc, acc, ret, term_out,
                trunc_out, discount, last):
    """n-step windows over the shards of a shared region: each shard is one stream.

    As :func:`tfdata.kernels._episodes.nstep_windows` with the geometry of shards: the row after
    slot ``j`` of shard ``s = j // cap`` is ``j + 1`` within ``[s * cap, (s + 1) * cap)``
    (wrapping), and a window stops at the shard's newest row as of the heads in ``scratch``
    (read by :func:`read_heads` before the rows were drawn), at an episode end, or after ``n``
    rows. Every slot read stays in its shard, whatever the heads hold.

    Parameters
    ----------
    idx : ndarray of int64, shape (B,)
        Start slots.
    scratch : ndarray of int64, shape (>= 3 * shards,)
        ``scratch[shards + s]``: shard ``s``'s head as read.
    shards, cap, n : int
        Shards, slots per shard, longest window.
    gamma : float
    reward : ndarray, shape (slots,), any numeric dtype, any stride
    term, trunc : ndarray of bool, shape (slots,), any stride
    acc : ndarray of float64, shape (B,)
        Scratch: the discounted sums.
    ret, term_out, trunc_out : ndarray, shape (B,), any stride
        Output: the return (cast to the reward dtype) and the last row's flags.
    discount : ndarray of float32, shape (B,)
        Output: ``gamma ** k`` for the ``k`` rows taken.
    last : ndarray of int64, shape (B,)
        Output: slot of each window's last row.
    """
    batch = idx.shape[0]
    for i in range(batch):
        acc[i] = 0.0
        last[i] = idx[i]
        discount[i] = -1.0  # open window
    g = 1.0
    for k in range(n):
        gn = g * gamma
        for i in range(batch):
            if discount[i] >= 0.0:
                continue
            j = last[i]
            acc[i] += g * np.float64(reward[j])
            s = j // cap
            base = s * cap
            h = scratch[shards + s] if s < shards and shards + s < scratch.shape[0] else 0
            newest = base + (h - 1) % cap
            if term[j] or trunc[j] or k == n - 1 or j == newest:
                discount[i] = gn
            else:
                j += 1
                if j == base + cap:
                    j = base
                last[i] = j
        g = gn
    for i in range(batch):
        j = last[i]
        ret[i] = acc[i]
        term_out[i] = term[j]
        trunc_out[i] = trunc[j]


@njit(**INLINE_OPTIONS)
def _shard_age(j, scratch, shards, cap):
    """Rows newer than slot ``j`` in its shard, as of the heads in ``scratch`` (-1: none held)."""
    s = j // cap
    base = s * cap
    h = scratch[shards + s] if s < shards and shards + s < scratch.shape[0] else 0
    if h <= 0:
        return -1
    return (base + (h - 1) % cap - j) % cap


@njit(**INLINE_OPTIONS)
def _shard_slice_fits(j, length, scratch, shards, cap, term, trunc):
    """Whether the ``length`` rows of ``j``'s shard from ``j`` on are held and in one episode
    (no row but the last ends one)."""
    if _shard_age(j, scratch, shards, cap) < length - 1:
        return False
    base = (j // cap) * cap
    for k in range(length - 1):
        if term[j] or trunc[j]:
            return False
        j += 1
        if j == base + cap:
            j = base
    return True


@njit(**INLINE_OPTIONS)
def _shard_fill_slice(s, b, scratch, shards, cap, term, trunc, idx, mask):
    """Slice ``b`` from slot ``s``: its shard's rows while held (as of the heads) and in the
    start's episode; the rest repeat the last valid row, masked False."""
    length = idx.shape[1]
    kmax = min(length, _shard_age(s, scratch, shards, cap) + 1)
    base = (s // cap) * cap
    j = s
    last = s
    ended = False
    for k in range(length):
        if k < kmax and not ended:
            idx[b, k] = j
            mask[b, k] = True
            last = j
            ended = term[j] or trunc[j]
            j += 1
            if j == base + cap:
                j = base
        else:
            idx[b, k] = last
            mask[b, k] = False
            kmax = 0


@njit(**NJIT_OPTIONS)
def shard_slices(scratch, shards, cap, state, term, trunc, reject, max_draws, idx, mask):
    """Slices of ``L`` rows of one writer's stream within one episode, starts uniform over the
    rows the shards held at the heads snapshot in ``scratch`` (:func:`read_heads`).

    As :func:`tfdata.kernels._episodes.sample_slices` with the geometry of shards; a row is the
    last of its episode when it is terminated or truncated. With one shard the starts are
    drawn exactly as a single-process buffer draws them (the same words of the generator).

    Parameters
    ----------
    scratch : ndarray of int64, shape (>= 3 * shards,)
    shards, cap : int
    state : ndarray of uint64, shape (2,)
    term, trunc : ndarray of bool, shape (shards * cap,), any stride
    reject : bool
        Redraw a start until its whole slice is held and in one episode, at most ``max_draws``.
    idx : ndarray of int64, shape (B, L)
    mask : ndarray of bool, shape (B, L)

    Returns
    -------
    int
        -1 on success, ``b`` when no start was found for slice ``b``, -2 when no row is held.
    """
    total = 0
    for s in range(shards):
        total += scratch[s]
    if total == 0:
        return -2
    nn = np.uint64(total)
    threshold = (_TWO32 - nn) % nn
    full = total == shards * cap
    length = idx.shape[1]
    key = state[0]
    for b in range(idx.shape[0]):
        j, ctr = draw_slot(scratch, cap, total, full, threshold, key, state[1])
        state[1] = ctr
        if reject:
            tries = 1
            while not _shard_slice_fits(j, length, scratch, shards, cap, term, trunc):
                if tries >= max_draws:
                    return b
                j, ctr = draw_slot(scratch, cap, total, full, threshold, key, state[1])
                state[1] = ctr
                tries += 1
        _shard_fill_slice(j, b, scratch, shards, cap, term, trunc, idx, mask)
    return -1


@njit(**NJIT_OPTIONS)
def shard_slices_prioritized(scratch, shards, cap, sums, mm, leaves, version, state, beta, term,
                             trunc, reject, max_draws, idx, mask, u, weights, versions):
    """:func:`shard_slices` with starts drawn in proportion to their priority, as
    :func:`tfdata.kernels._episodes.sample_slices_prioritized` draws them (stratified; a rejected
    start replaced by one proportional draw over the whole mass); weights and versions of the
    start rows. Returns as :func:`shard_slices`."""
    limit = live_limit(sums, leaves, version.shape[0], version.shape[0])
    if limit == 0:
        return -2
    length = idx.shape[1]
    stratified_find(sums, leaves, limit, state, idx[:, 0], u)
    for b in range(idx.shape[0]):
        j = idx[b, 0]
        one = idx[b, :1]
        if reject:
            tries = 1
            while not _shard_slice_fits(j, length, scratch, shards, cap, term, trunc):
                if tries >= max_draws:
                    return b
                stratified_find(sums, leaves, limit, state, one, u[:1])
                j = one[0]
                tries += 1
        _shard_fill_slice(j, b, scratch, shards, cap, term, trunc, idx, mask)
    for b in range(idx.shape[0]):
        j = idx[b, 0]
        weights[b] = is_weight(mm, leaves, j, beta)
        versions[b] = version[j]
    return -1
