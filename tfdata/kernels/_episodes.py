"""Episode-aware kernels: n-step windows, next-field reads and sequence slices.

They work on the *interleaved ring* of :mod:`tfdata.episodes`: with ``E`` environments and a
capacity ``C`` that is a multiple of ``E``, environment ``e``'s row of step ``t`` is in slot
``(t * E + e) % C``. The next row of the same stream is ``slot + E`` (mod ``C``), and the newest
step occupies the ``E`` slots just before the write cursor. The *age* of a slot is how many steps
are newer than it in its own stream, so a forward window from a slot may take ``age + 1`` rows
without reaching rows that are not written yet (or, after a wrap, rows that are older).

Nothing here depends on the layout: kernels read fields through 1-D views (strided for the
array-of-structs layout) and copy fields through 2-D word views ``(rows, words)`` with a word
offset, which both layouts provide. Nothing here allocates.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .._config import INLINE_OPTIONS, NJIT_OPTIONS
from ._rng import fill_indices
from ._tree import is_weight, live_limit, stratified_find



@njit(**INLINE_OPTIONS)
def _newest(cursor, num_envs, capacity):
    """First slot of the newest step; the step holds slots ``[newest, newest + num_envs)``."""
    newest = cursor - num_envs
    if newest < 0:
        newest += capacity
    return newest


@njit(**INLINE_OPTIONS)
def _age(slot, cursor, num_envs, capacity):
    """Steps newer than ``slot`` in its own stream (0 for the newest step)."""
    newest = cursor - num_envs
    if newest < 0:
        newest += capacity
    d = newest - (slot - slot % num_envs)
    if d < 0:
        d += capacity
    return d // num_envs


@njit(**NJIT_OPTIONS)
def stamp_episodes(term, trunc, skip, dst, current, episode):
    """Give rows their stream's episode number; rows ``[skip, n)`` are written from slot ``dst``.

    Parameters
    ----------
    term, trunc : ndarray of bool, shape (n,), any stride
        The rows' flags, time-major (``n`` a multiple of ``len(current)``); a row with either
        flag ends its episode.
    skip : int
        Leading rows that are not stored (an extend longer than the capacity); they still count.
    dst : int
        Slot of row ``skip``; later rows follow, wrapping at the capacity.
    current : ndarray of uint32, shape (num_envs,)
        Episode number of each stream's next row; advanced in place.
    episode : ndarray of uint32, shape (capacity,)
        Output.
    """
    num_envs = current.shape[0]
    capacity = episode.shape[0]
    slot = dst
    if num_envs == 1:  # one stream: the number stays in a register (episode may alias current)
        c = current[0]
        for r in range(term.shape[0]):
            if r >= skip:
                episode[slot] = c
                slot += 1
                if slot == capacity:
                    slot = 0
            if term[r] or trunc[r]:
                c += np.uint32(1)
        current[0] = c
        return
    e = 0  # r % num_envs, counted: a division per row was most of this kernel's time
    for r in range(term.shape[0]):
        if r >= skip:
            episode[slot] = current[e]
            slot += 1
            if slot == capacity:
                slot = 0
        if term[r] or trunc[r]:
            current[e] += np.uint32(1)
        e += 1
        if e == num_envs:
            e = 0


@njit(**INLINE_OPTIONS)
def windows(idx, cursor, num_envs, capacity, n, gamma, reward, term, trunc, acc, discount, last):
    """Discounted n-step returns of the windows that start at ``idx`` (inlined into kernels).

    A window takes rows ``t, t+1, ...`` of the start row's stream and stops after ``n`` rows, at
    the first row that is terminated or truncated (included), or at the newest row written,
    whichever comes first; ``k`` is the number of rows taken (``1 <= k <= n``).

    Parameters
    ----------
    idx : ndarray of int64, shape (B,)
        Start slots (held rows).
    cursor, num_envs, capacity : int
        Write cursor (a multiple of ``num_envs``), streams, slots.
    n : int
        Longest window.
    gamma : float
        Discount per step.
    reward : ndarray, shape (capacity,), any numeric dtype, any stride
    term, trunc : ndarray of bool, shape (capacity,), any stride
        Row fields.
    acc : ndarray of float64, shape (B,)
        Output: ``sum_{j<k} gamma**j * reward[t+j]``, accumulated in order of j.
    discount : ndarray of float32, shape (B,)
        Output: ``gamma**k``, the factor of the bootstrap value (use it with ``1 - terminated``).
    last : ndarray of int64, shape (B,)
        Output: slot of the window's last row (its next observation is the bootstrap one).
    """
    # the newest step is a slot range: no integer division per row (tens of cycles each)
    lo = _newest(cursor, num_envs, capacity)
    hi = lo + num_envs
    batch = idx.shape[0]
    for i in range(batch):
        acc[i] = 0.0
        last[i] = idx[i]
        discount[i] = -1.0  # open window
    # step by step over all windows, not window by window: the loads of different windows are
    # independent, so their cache misses overlap
    g = 1.0
    for k in range(n):
        gn = g * gamma
        for i in range(batch):
            if discount[i] >= 0.0:
                continue
            j = last[i]
            acc[i] += g * np.float64(reward[j])
            if term[j] or trunc[j] or k == n - 1 or (lo <= j and j < hi):
                discount[i] = gn
            else:
                j += num_envs
                if j >= capacity:
                    j -= capacity
                last[i] = j
        g = gn


@njit(**INLINE_OPTIONS)
def finish_windows(last, term, trunc, acc, ret, term_out, trunc_out):
    """Write the windows into a batch: the return (cast to the reward dtype) and the flags of
    each window's last row. ``ret``, ``term_out``, ``trunc_out``: shape (B,), any stride."""
    for i in range(last.shape[0]):
        j = last[i]
        ret[i] = acc[i]
        term_out[i] = term[j]
        trunc_out[i] = trunc[j]


@njit(**NJIT_OPTIONS)
def nstep_windows(idx, cursor, num_envs, capacity, n, gamma, reward, term, trunc,
                  acc, ret, term_out, trunc_out, discount, last):
    """:func:`windows` then :func:`finish_windows`, as one kernel (after a prioritized draw)."""
    windows(idx, cursor, num_envs, capacity, n, gamma, reward, term, trunc, acc, discount, last)
    finish_windows(last, term, trunc, acc, ret, term_out, trunc_out)


@njit(**NJIT_OPTIONS)
def copy_field_rows(src, src_off, rows, skip, dst, dst_off, width):
    """``dst[i, dst_off:+width] = src[rows[i], src_off:+width]`` where ``rows[i] != skip[i]``.

    Parameters
    ----------
    src : ndarray of uintX, shape (capacity, src_words)
    rows, skip : ndarray of int64, shape (B,)
        Rows to read; a row equal to ``skip[i]`` is already in place and is not copied again.
    dst : ndarray of uintX, shape (B, dst_words)
    src_off, dst_off, width : int
        Field position and width, in words.
    """
    for i in range(rows.shape[0]):
        r = rows[i]
        if r == skip[i]:
            continue
        for w in range(width):
            dst[i, dst_off + w] = src[r, src_off + w]


@njit(**NJIT_OPTIONS)
def copy_next_elided(rows, cursor, num_envs, capacity, src, src_off, term, trunc, final_idx,
                     finals, pending, dst, dst_off, width):
    """The elided next-field of ``rows``: from the stream's next row, the final table or pending.

    Parameters
    ----------
    rows : ndarray of int64, shape (B,)
        Slots whose next value is wanted.
    src : ndarray of uintX, shape (capacity, src_words)
        Storage words; the *source* field (``obs`` for ``next_obs``) is at ``src_off``.
    term, trunc : ndarray of bool, shape (capacity,), any stride
        Row flags: a row has a final-table entry exactly when one of them is set.
    final_idx : ndarray of int32, shape (capacity,)
        Entry of the final table holding the slot's next value (episode-ending rows), else -1.
    finals : ndarray of uintX, shape (K, width)
        Final table: next values of episode-ending rows.
    pending : ndarray of uintX, shape (num_envs, width)
        Next value of each stream's newest row (not in the ring yet).
    dst : ndarray of uintX, shape (B, dst_words)
    dst_off, width : int
        In words.
    """
    lo = _newest(cursor, num_envs, capacity)
    hi = lo + num_envs
    for i in range(rows.shape[0]):
        r = rows[i]
        # only episode-ending rows have an entry: test the flags (in the row just gathered,
        # so in cache) before touching final_idx (a random read of a capacity-long array)
        f = final_idx[r] if term[r] or trunc[r] else -1
        if f >= 0:
            for w in range(width):
                dst[i, dst_off + w] = finals[f, w]
        elif lo <= r and r < hi:  # the newest step
            e = r - lo
            for w in range(width):
                dst[i, dst_off + w] = pending[e, w]
        else:
            nxt = r + num_envs
            if nxt >= capacity:
                nxt -= capacity
            for w in range(width):
                dst[i, dst_off + w] = src[nxt, src_off + w]


@njit(**NJIT_OPTIONS)
def first_discontinuity(src, nxt, term, trunc, pending, has_pending):
    """First row whose source value does not continue its stream, or -1 (elision's insert check).

    Row ``r`` (time-major, ``E = len(pending)`` streams) must have ``src[r] == nxt[r - E]``
    bytewise unless row ``r - E`` ended an episode; the first step is compared with ``pending``
    where ``has_pending``.

    Parameters
    ----------
    src, nxt : ndarray of uint8, shape (n, field_bytes)
        The rows' source field (``obs``) and next field (``next_obs``), as bytes.
    term, trunc : ndarray of bool, shape (n,), any stride
    pending : ndarray of uint8, shape (E, field_bytes)
        Next value of each stream's newest row already stored.
    has_pending : ndarray of bool, shape (E,)
        False where that row ended an episode (or nothing is stored).
    """
    num_envs = pending.shape[0]
    width = src.shape[1]
    for r in range(src.shape[0]):
        if r < num_envs:
            if not has_pending[r]:
                continue
            for w in range(width):
                if src[r, w] != pending[r, w]:
                    return r
        else:
            p = r - num_envs
            if term[p] or trunc[p]:
                continue
            for w in range(width):
                if src[r, w] != nxt[p, w]:
                    return r
    return -1


@njit(**NJIT_OPTIONS)
def sample_slices(n_rows, cursor, num_envs, capacity, state, episode, reject, max_draws,
                  idx, mask):
    """Draw ``B`` slices of ``L`` consecutive rows of one stream within one episode.

    Parameters
    ----------
    n_rows : int
        Rows held (start slots are drawn uniformly from ``[0, n_rows)``).
    state : ndarray of uint64, shape (2,)
        Counter-based RNG state, advanced in place.
    episode : ndarray of uint32, shape (capacity,)
        Episode number of every slot within its stream (stamped at insert).
    reject : bool
        True: redraw starts until the whole slice lies in one episode and is written (checked in
        O(1): the ages and the episode numbers of the first and last rows). False: keep the first
        start; rows past the episode's end or the newest row repeat the last valid row and get
        ``mask == False``.
    max_draws : int
        With ``reject``, the most draws per slice before giving up.
    idx : ndarray of int64, shape (B, L)
        Output: slots of the slice rows.
    mask : ndarray of bool, shape (B, L)
        Output: True where the row belongs to the slice's episode.

    Returns
    -------
    int
        -1 on success, else the slice number for which ``max_draws`` draws found nothing.
    """
    # the loops of _slice_fits and _fill_slice written out here: calling them made policy
    # "reject" slower (docs/design/kernels.md, "Measured")
    length = idx.shape[1]
    span = (length - 1) * num_envs
    for b in range(idx.shape[0]):
        first = idx[b, :1]  # one draw at a time: a rejected start draws again
        fill_indices(n_rows, state, first)
        s = first[0]
        if reject:
            tries = 1
            while True:
                if _age(s, cursor, num_envs, capacity) >= length - 1:
                    end = s + span
                    end %= capacity
                    if episode[end] == episode[s]:
                        break
                if tries >= max_draws:
                    return b
                fill_indices(n_rows, state, first)
                s = first[0]
                tries += 1
        kmax = min(length, _age(s, cursor, num_envs, capacity) + 1)
        ep = episode[s]
        j = s
        last = s
        for k in range(length):
            if k < kmax and episode[j] == ep:
                idx[b, k] = j
                mask[b, k] = True
                last = j
                j += num_envs
                if j >= capacity:
                    j -= capacity
            else:
                idx[b, k] = last
                mask[b, k] = False
                kmax = 0  # every later row is masked too
    return -1


@njit(**INLINE_OPTIONS)
def _slice_fits(s, length, cursor, num_envs, capacity, episode):
    """Whether the ``length`` rows of ``s``'s stream from ``s`` on are written and in ``s``'s
    episode (O(1): the age of ``s`` and the episode numbers of the first and last rows)."""
    if _age(s, cursor, num_envs, capacity) < length - 1:
        return False
    end = (s + (length - 1) * num_envs) % capacity
    return episode[end] == episode[s]


@njit(**INLINE_OPTIONS)
def _fill_slice(s, b, cursor, num_envs, capacity, episode, idx, mask):
    """Slice ``b`` from start ``s``: rows of its stream while they are written and in its
    episode; the rest repeat the last valid row, masked False."""
    length = idx.shape[1]
    kmax = min(length, _age(s, cursor, num_envs, capacity) + 1)
    ep = episode[s]
    j = s
    last = s
    for k in range(length):
        if k < kmax and episode[j] == ep:
            idx[b, k] = j
            mask[b, k] = True
            last = j
            j += num_envs
            if j >= capacity:
                j -= capacity
        else:
            idx[b, k] = last
            mask[b, k] = False
            kmax = 0  # every later row is masked too


#: the slice fill, for the kernels of other samplers (tfdata.kernels._pool.pool_slices)
fill_slice = _fill_slice


@njit(**NJIT_OPTIONS)
def sample_slices_prioritized(n_rows, cursor, num_envs, capacity, sums, mm, leaves, version, state,
                              beta, episode, reject, max_draws, idx, mask, u, weights, versions):
    """:func:`sample_slices` with starts drawn in proportion to their priority.

    Starts are drawn as :func:`tfdata.kernels.aos.sample_prioritized` draws rows: stratified,
    one per ``1/B`` of the total mass. With ``reject`` a start whose slice does not fit is
    replaced by a fresh proportional draw over the whole mass, up to ``max_draws`` draws.
    ``weights[b] = (p_min / p_start) ** beta`` and ``versions[b] = version[start]``, the start
    row being the one whose priority drew the slice.

    Parameters
    ----------
    n_rows, cursor, num_envs, capacity, episode, reject, max_draws, idx, mask
        As for :func:`sample_slices`.
    sums, mm, leaves
        The priority tree (see :mod:`tfdata.kernels._tree`).
    version : ndarray of uint8, shape (capacity,)
    state : ndarray of uint64, shape (2,)
    beta : float
    u : ndarray of float64, shape (B,)
        Scratch.
    weights : ndarray of float32, shape (B,)
    versions : ndarray of uint32, shape (B,)
        Output: ``version[start]`` (the caller adds its epoch).

    Returns
    -------
    int
        -1 on success; ``b`` when ``max_draws`` draws found no start for slice ``b``; -2, with
        nothing drawn, when the root mass is not finite and positive or no row is live.
    """
    limit = live_limit(sums, leaves, n_rows, min(version.shape[0], episode.shape[0], capacity))
    if limit == 0:
        return -2
    length = idx.shape[1]
    starts = idx[:, 0]
    stratified_find(sums, leaves, limit, state, starts, u)
    for b in range(idx.shape[0]):
        s = idx[b, 0]
        one = idx[b, :1]  # a redraw lands where slice b starts anyway
        if reject:
            tries = 1
            while not _slice_fits(s, length, cursor, num_envs, capacity, episode):
                if tries >= max_draws:
                    return b
                stratified_find(sums, leaves, limit, state, one, u[:1])
                s = one[0]
                tries += 1
        _fill_slice(s, b, cursor, num_envs, capacity, episode, idx, mask)
    for b in range(idx.shape[0]):
        s = idx[b, 0]
        weights[b] = is_weight(mm, leaves, s, beta)
        versions[b] = version[s]
    return -1
