"""Episode-aware kernels of the interleaved ring: episode numbers, next-field reads.

They work on the ring of streams of :mod:`tfdata.kernels._streams` (``E`` environments
interleaved in ``C`` slots; the next row of a slot is ``slot + E`` mod ``C``, the newest step
the ``E`` slots before the write cursor), where the n-step windows and the sequence slices of
both kinds of streams are.

Nothing here depends on the layout: kernels read fields through 1-D views (strided for the
array-of-structs layout) and copy fields through 2-D word views ``(rows, words)`` with a word
offset, which both layouts provide. Nothing here allocates.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .._config import INLINE_OPTIONS, NJIT_OPTIONS
from ._streams import ring_fill, ring_geometry


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


#: the arguments of :func:`copy_next_elided` of any stride (the flags) and those it only reads
#: (the storage's words, the flags, the final table, pending values), for
#: :func:`tfdata.kernels.strided`: one specialization per word type for every layout
ELIDED_STRIDED = (6, 7)
ELIDED_READONLY = (4, 6, 7, 8, 9, 10)


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
    _, _, lo, hi = ring_geometry(cursor, num_envs, capacity)  # the newest step: slots [lo, hi)
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


#: refusals of :func:`elide_step` (nothing changed): a row does not continue its stream, the
#: final table has too few free entries (the generic path grows it), arguments that do not fit
ELIDE_BREAK, ELIDE_GROW, ELIDE_BAD = 0, 1, 2
#: the arguments of :func:`elide_step` of any stride (the caller's rows and flags) and those it
#: only reads, for :func:`tfdata.kernels.strided`: one specialization for every caller
ELIDE_STRIDED = (0, 1, 2, 3)
ELIDE_READONLY = (0, 1, 2, 3)


@njit(**NJIT_OPTIONS)
def elide_step(src, nxt, term, trunc, p, final_idx, finals, free, n_free, pending, has_pending,
               episode, current):
    """Whole steps of rows into an elided buffer's bookkeeping, all of it or nothing: the
    continuity check of :func:`first_discontinuity`, room in the final table, then the final
    table, the pending next values and the episode numbers (the storage writes the rows).

    The entries of the final table are recycled and taken in the order of the generic path
    (``Episodes.write``): every overwritten row's entry pushed in slot order, then one popped per
    episode-ending row in row order; the same state results.

    Parameters
    ----------
    src, nxt : ndarray of uint8, shape (n, width), any stride
        The rows' source field (``obs``) and next field (``next_obs``), as bytes; ``n`` a
        multiple of ``E = len(pending)``, time-major.
    term, trunc : ndarray of bool, shape (n,), any stride
    p : int
        The slot of the first row; rows go to ``[p, p + n)``, which must not wrap.
    final_idx : ndarray of int32, shape (capacity,)
    finals : ndarray of uint8, shape (F, width)
    free : ndarray of int32, shape (K,)
        Free final-table entries, ``free[:n_free]`` (a stack).
    n_free : int
    pending : ndarray of uint8, shape (E, width)
    has_pending : ndarray of bool, shape (E,)
    episode : ndarray of uint32, shape (capacity,)
    current : ndarray of uint32, shape (E,)

    Returns
    -------
    int
        ``< 0`` written: ``-1 - n_free`` with the free entries after the write; else a refusal
        (:data:`ELIDE_BREAK`, :data:`ELIDE_GROW`, :data:`ELIDE_BAD`), nothing changed.
    """
    n = src.shape[0]
    e = pending.shape[0]
    width = src.shape[1]
    capacity = episode.shape[0]
    k = free.shape[0]
    nf = finals.shape[0]
    if (e == 0 or n == 0 or n % e != 0 or nxt.shape[0] != n or nxt.shape[1] != width
            or pending.shape[1] != width or finals.shape[1] != width or term.shape[0] != n
            or trunc.shape[0] != n or has_pending.shape[0] != e or current.shape[0] != e
            or final_idx.shape[0] != capacity or p < 0 or p + n > capacity or n_free < 0
            or n_free > k):
        return ELIDE_BAD
    if first_discontinuity(src, nxt, term, trunc, pending, has_pending) >= 0:
        return ELIDE_BREAK
    need = 0
    freed = 0
    for r in range(n):
        if term[r] or trunc[r]:
            need += 1
        old = final_idx[p + r]
        if 0 <= old < nf:
            freed += 1
    if n_free + freed > k:
        return ELIDE_BAD
    if n_free + freed < need:
        return ELIDE_GROW
    # everything checked: write
    for r in range(n):
        old = final_idx[p + r]
        if 0 <= old < nf:
            free[n_free] = old
            n_free += 1
        final_idx[p + r] = -1
    s = 0  # r % e, counted
    for r in range(n):
        ended = term[r] or trunc[r]
        if ended:
            n_free -= 1
            f = free[n_free]
            if 0 <= f < nf:
                for w in range(width):
                    finals[f, w] = nxt[r, w]
                final_idx[p + r] = f
        episode[p + r] = current[s]
        if ended:
            current[s] += np.uint32(1)
        if r >= n - e:
            for w in range(width):
                pending[s, w] = nxt[r, w]
            has_pending[s] = not ended
        s += 1
        if s == e:
            s = 0
    return -1 - n_free


@njit(**INLINE_OPTIONS)
def fill_slice(s, b, cursor, num_envs, capacity, episode, idx, mask):
    """The ring's slice fill (:mod:`tfdata.kernels._streams`) from a cursor, for the kernels of
    other samplers (:func:`tfdata.kernels._pool.pool_slices`): slice ``b`` from start ``s``,
    rows of its stream while written and in its episode, the rest masked."""
    # the ring reads no geometry words once prepared, and no flags (its episode numbers say
    # where an episode ends): any array will do
    ring_fill(episode, ring_geometry(cursor, num_envs, capacity), s, b, episode, episode, episode,
              idx, mask)
