"""Sampling without replacement while rows are inserted: a pool of the slots not yet drawn.

The pool is the undrawn slots of the current pass, ``pool[0:m]``, and ``inpool[s]`` says whether
slot ``s`` is among them. Drawing takes ``pool[r]`` for a uniform ``r`` in ``[0, m)`` and moves
the last entry into its place; a slot written since the last call joins the pool unless it is
in it already (its old row, not drawn yet, is gone: the new row takes its place, so an
overwritten row is never returned). When the pass runs out in the middle of a batch, the next
pass is every live slot ``[0, n)`` in slot order, except that the rows this batch already took
go last, in the order taken, out of reach of the batch's other draws: a batch never holds a row
twice, and they are still part of the new pass. When the pass runs out at the end of a batch,
the next pass (every live slot, in slot order) begins at once: a row written before the next
call joins it like any other, rather than extending the pass that ended.

No place-of-slot index: it would be a second random access per draw (each draw already misses
the cache once in ``pool`` on a large buffer, and the gather once per row). ``pool`` is uint32
(capacities are below 2**32), ``inpool`` one byte per slot: 5 bytes per slot in all.

Arrays: ``pool`` uint32[capacity], ``inpool`` uint8[capacity], ``meta`` int64[2] (``m``, passes
completed). Whatever they hold, no kernel reads or writes outside them: sizes are checked at
entry, every slot read from ``pool`` is checked before it is used (-2: the pool was corrupt; the
draws made so far stay). References: ``pool_sample_naive`` and ``pool_redraw_naive`` (a shared
region's redraw of a torn row) in ``tests/naive.py``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .._config import INLINE_OPTIONS, NJIT_OPTIONS
from ._episodes import fill_slice
from ._rng import draw_varying
from ._shared import snapshot_heads


@njit(**INLINE_OPTIONS)
def pool_draw(pool, inpool, meta, start, count, n, state, idx):
    """Add the slots written since the last call, then draw ``len(idx)`` slots without replacement
    (inlined into each layout's ``sample_pool``, which then gathers the rows; :func:`pool_sample`
    alone).

    Parameters
    ----------
    pool : uint32[capacity]
    inpool : uint8[capacity]
    meta : int64[3]
        ``[m, passes, n]``: slots in the pool; passes completed (each refill follows one); the
        live rows of the last call (set here).
    start, count : int
        Slots ``start, start + 1, ...`` (``count`` of them, modulo the capacity) were written
        since the last call; each joins the pool unless it is in it. ``count <= capacity``.
    n : int
        Live rows: slots ``[0, n)``; ``len(idx) <= n``.
    state : uint64[2]
        The counter RNG; one draw (plus rejections) per row, advanced in place.
    idx : int64[batch]
        Output: the slots drawn, in order.

    Returns
    -------
    int
        The passes this call completed (refills of the pool; at most one per ``n`` rows drawn),
        -1 with nothing changed when the arguments disagree, -2 for a corrupt pool.
    """
    cap = pool.shape[0]
    B = idx.shape[0]
    m = meta[0]
    if (inpool.shape[0] != cap or meta.shape[0] < 3 or state.shape[0] < 2 or n < 1 or n > cap
            or B > n or start < 0 or start >= cap or count < 0 or count > cap or m < 0 or m > cap):
        return -1
    for k in range(count):  # rows written since the last call join the pass
        s = start + k
        if s >= cap:
            s -= cap
        if s >= n or (inpool[s] == 0 and m >= cap):
            meta[0] = m
            return -2  # written slots are live: the caller's n and positions disagree
        if inpool[s] == 0:
            pool[m] = s
            inpool[s] = 1
            m += 1
    meta[0] = m
    meta[2] = n  # the live slots of one ring: [0, n)
    return _draws(pool, inpool, meta, meta[2:3], cap, state, idx)


@njit(**INLINE_OPTIONS)
def _end(pool, inpool, meta, held, span, state, B, m, ctr, done):
    """The end of :func:`_draws` and :func:`_redraw`: when the batch drew the pass's last row,
    the next pass begins now (every held slot, in slot order; nothing deferred), so rows
    written before the next call join it, not the pass that ended. Stores ``m`` and the
    counter; returns the passes completed."""
    if B > 0 and m == 0:
        for g in range(held.shape[0]):
            for s in range(g * span, g * span + held[g]):
                pool[m] = s
                inpool[s] = 1
                m += 1
        done += 1
        meta[1] += 1
    meta[0] = m
    state[1] = ctr
    return done


@njit(**INLINE_OPTIONS)
def _draws(pool, inpool, meta, held, span, state, idx):
    """Draw ``len(idx)`` slots without replacement from the pool ``pool[:meta[0]]``; a pass
    that runs out is refilled with the live slots: ``held[g]`` slots from ``g * span`` on, for
    each group ``g`` (one ring: ``held = [n]``; the shards of a shared region: rows each holds).
    The caller checked the arguments (``len(idx) <= sum(held)``, every live slot in the pool's
    range). Returns the passes completed, or -2 for a corrupt pool."""
    cap = pool.shape[0]
    B = idx.shape[0]
    m = meta[0]
    key = state[0]
    ctr = state[1]
    # the draws before the pass can end, in two loops: the random numbers first (they do not
    # depend on the pool), then the pool's entries, whose cache misses then overlap (faster
    # than the same draws as one loop, docs/design/without-replacement.md, "Measured"; an
    # explicit prefetch 16 entries ahead changed nothing measurable)
    first = min(B, m)
    for i in range(first):
        r, ctr = draw_varying(np.uint64(m - i), key, ctr)
        idx[i] = r
    for i in range(first):
        r = idx[i]
        s = np.int64(pool[r])
        if s >= cap or inpool[s] != 1:
            meta[0] = m
            state[1] = ctr
            return -2
        pool[r] = pool[m - 1]
        inpool[s] = 0
        m -= 1
        idx[i] = s
    done = 0
    defer = 0  # rows of this batch at the end of a pool refilled during it
    for i in range(first, B):
        if m - defer == 0:  # the pass is over: the next one is every live slot
            for j in range(i):
                inpool[idx[j]] = 2  # this batch's rows: last, in the order taken
            m = 0
            for g in range(held.shape[0]):
                for s in range(g * span, g * span + held[g]):
                    if inpool[s] != 2:
                        pool[m] = s
                        m += 1
                    inpool[s] = 1
            if m + i > cap:  # a batch row outside the live slots: the pool was corrupt
                meta[0] = 0
                state[1] = ctr
                return -2
            for j in range(i):
                pool[m] = idx[j]
                m += 1
            defer = i
            done += 1
            meta[1] += 1
        avail = m - defer
        r, ctr = draw_varying(np.uint64(avail), key, ctr)
        s = np.int64(pool[r])
        if s >= cap or inpool[s] != 1:
            meta[0] = m
            state[1] = ctr
            return -2
        a = avail - 1  # the last undrawn entry within reach
        pool[r] = pool[a]
        if a != m - 1:  # keep the deferred rows at the end: the pool's last moves to a
            pool[a] = pool[m - 1]
        inpool[s] = 0
        m -= 1
        idx[i] = s
    return _end(pool, inpool, meta, held, span, state, B, m, ctr, done)


@njit(**NJIT_OPTIONS)
def pool_sample(pool, inpool, meta, start, count, n, state, idx):
    """:func:`pool_draw` as a kernel of its own (the draws without a gather)."""
    return pool_draw(pool, inpool, meta, start, count, n, state, idx)


@njit(**INLINE_OPTIONS)
def _fold(heads, span, pool, inpool, meta, folded, scratch):
    """Add the rows published since the last call to the pool (see :func:`pool_fold_draw`);
    returns the rows held, -1 when the arrays disagree, -2 for a corrupt pool."""
    S = heads.shape[0]
    cap = pool.shape[0]
    m = meta[0]
    if (inpool.shape[0] != cap or span < 1 or S * span > cap or folded.shape[0] != S
            or scratch.shape[0] < 7 * S or meta.shape[0] < 3 or m < 0 or m > cap):
        return -1
    total = snapshot_heads(heads, span, scratch)
    for g in range(S):
        h = scratch[S + g]
        base = g * span
        lo = max(folded[g], 0)
        # a lap or more behind: each slot once, from the oldest row not added (the slot order
        # of a ring's pool_draw given the same writes)
        for r in range(lo, min(h, lo + span)):
            s = base + r % span
            if inpool[s] == 0:
                if m >= cap:
                    meta[0] = m
                    return -2
                pool[m] = s
                inpool[s] = 1
                m += 1
        folded[g] = max(folded[g], h)
    meta[0] = m
    meta[2] = total
    return total


@njit(**NJIT_OPTIONS)
def pool_fold_draw(heads, span, pool, inpool, meta, folded, scratch, state, idx):
    """The pool of a shared region (see :mod:`tfdata.shared`): read every shard's head once
    (acquire), add the rows published since the last call (shard by shard, in publication
    order; each slot written joins the pool unless it is in it; a lap or more behind, each slot
    once, from the oldest row not added, as :func:`pool_draw` adds a ring's), then draw ``len(idx)`` slots without replacement (a pass that runs out is
    refilled with every row the shards hold).

    Parameters
    ----------
    heads : uint64[shards]
        The shards' heads (rows published), strided view of the control words.
    span : int
        Slots per shard; row ``r`` of shard ``g`` is in slot ``g * span + r % span``.
    pool, inpool : uint32[capacity], uint8[capacity]
        As for :func:`pool_draw`; ``shards * span <= capacity``.
    meta : int64[3]
        ``[m, passes, rows held]`` (the last set here).
    folded : int64[shards]
        Rows of each shard added so far; advanced to the heads read here.
    scratch : int64[>= 7 * shards]
        Gets the heads snapshot (``scratch[:shards]`` rows held per shard) that
        ``torn_after_copy`` checks the copied rows against.
    state : uint64[2]
    idx : int64[batch]
        Output: the slots drawn.

    Returns
    -------
    int
        Passes completed; -1 with nothing changed when the arrays disagree; -3 when the shards
        hold fewer rows than ``batch`` (the published rows were added, nothing drawn); -2 for a
        corrupt pool.
    """
    if state.shape[0] < 2:
        return -1
    total = _fold(heads, span, pool, inpool, meta, folded, scratch)
    if total < 0:
        return total
    if idx.shape[0] > total:
        return -3
    return _draws(pool, inpool, meta, scratch[:heads.shape[0]], span, state, idx)


@njit(**NJIT_OPTIONS)
def pool_fold_redraw(heads, span, pool, inpool, meta, folded, scratch, state, idx, i):
    """Draw row ``i`` of a batch again (a row a writer touched while it was copied): add the
    rows published since, as :func:`pool_fold_draw` does, then draw one slot for ``idx[i]``
    out of reach of the batch's other rows, ``idx[j]`` for ``j != i``, so that a batch never
    holds a slot twice. Those rows may be in the pool: a pass that ended during the batch put
    them in the next one, and a writer may have published a new row in one of their slots
    since. They go last in the pool (a scan of the pool, only when some are in it: a redraw is
    rare) and stay in the pass for later batches. When the pool holds nothing else, the pass is
    over: the next is every row held, the batch's other rows last, in batch order (as
    :func:`_draws` defers the rows a batch took). A redraw that takes the pass's last row
    begins the next pass at once, as a batch does.

    Parameters
    ----------
    heads, span, pool, inpool, meta, folded, scratch, state
        As for :func:`pool_fold_draw`.
    idx : int64[batch]
        The batch's slots; ``idx[i]`` gets the slot drawn.
    i : int
        The row to draw again, ``0 <= i < batch``.

    Returns
    -------
    int
        As :func:`pool_fold_draw` (passes completed: 0 or 1).
    """
    B = idx.shape[0]
    if state.shape[0] < 2 or i < 0 or i >= B:
        return -1
    total = _fold(heads, span, pool, inpool, meta, folded, scratch)
    if total < 0:
        return total
    if B > total:
        return -3
    return _redraw(pool, inpool, meta, scratch[:heads.shape[0]], span, state, idx, i)


@njit(**INLINE_OPTIONS)
def _redraw(pool, inpool, meta, held, span, state, idx, i):
    """The draw of :func:`pool_fold_redraw` (arguments checked there, ``sum(held) >= len(idx)``).
    The batch's other rows in the pool are flagged 2 while it runs."""
    cap = pool.shape[0]
    B = idx.shape[0]
    m = meta[0]
    key = state[0]
    ctr = state[1]
    for j in range(B):
        if idx[j] < 0 or idx[j] >= cap:
            return -2
    k = 0
    for j in range(B):
        if j != i and inpool[idx[j]] == 1:
            inpool[idx[j]] = 2
            k += 1
    a = m  # pool[:a]: within reach; pool[a:m]: the batch's other rows
    r = 0
    while k and r < a:
        s = np.int64(pool[r])
        if s >= cap:
            a = -1
            break
        if inpool[s] == 2:
            a -= 1
            pool[r] = pool[a]
            pool[a] = s
        else:
            r += 1
    done = 0
    if a == 0:  # only the batch's rows are left: the next pass is every row held, them last
        for j in range(B):
            if j != i:
                inpool[idx[j]] = 2
        m = 0
        for g in range(held.shape[0]):
            for s in range(g * span, g * span + held[g]):
                if inpool[s] != 2:
                    pool[m] = s
                    inpool[s] = 1
                    m += 1
        if m + B - 1 > cap:  # a batch row outside the rows held: the pool was corrupt
            a = -1
        else:
            a = m
            for j in range(B):
                if j != i:
                    pool[m] = idx[j]
                    m += 1
            done = 1
            meta[1] += 1
    s = -1
    if a > 0:
        r, ctr = draw_varying(np.uint64(a), key, ctr)
        s = np.int64(pool[r])
        if s < cap and inpool[s] == 1:
            last = a - 1
            pool[r] = pool[last]
            if last != m - 1:  # keep the batch's rows at the end: the pool's last moves to last
                pool[last] = pool[m - 1]
            inpool[s] = 0
            m -= 1
            idx[i] = s
        else:
            s = -1
    for j in range(B):  # the batch's other rows stay in the pass
        if j != i and inpool[idx[j]] == 2:
            inpool[idx[j]] = 1
    if s < 0:
        meta[0] = 0 if a < 0 else m
        state[1] = ctr
        return -2
    return _end(pool, inpool, meta, held, span, state, B, m, ctr, done)


@njit(**NJIT_OPTIONS)
def pool_slices(pool, inpool, meta, start, count, n, state, cursor, num_envs, episode, idx, mask):
    """Slices whose starts are drawn without replacement: the ``B`` starts as :func:`pool_draw`
    draws ``B`` rows (the slots written since the last call join the pass first; no start
    twice in a pass, nor in a batch), each slice then filled as the ring's ``slices``
    (:mod:`tfdata.kernels._streams`) fill one with policy ``"mask"``: rows of the start's
    stream while they are written and in its episode, the rest repeating the last valid row
    with ``mask`` False.

    Parameters
    ----------
    pool, inpool, meta, start, count, n, state
        As for :func:`pool_draw` (``capacity = len(pool)``).
    cursor, num_envs : int
        The writer's cursor and streams (``capacity % num_envs == 0``).
    episode : uint32[capacity]
        Episode number of every slot within its stream.
    idx : int64[B, L]
        Output: slots of the slice rows (column 0: the starts).
    mask : bool[B, L]
        Output.

    Returns
    -------
    int
        As :func:`pool_draw`; -1 with nothing changed also when the shapes disagree.
    """
    cap = pool.shape[0]
    if (episode.shape[0] != cap or mask.shape[0] != idx.shape[0] or mask.shape[1] != idx.shape[1]
            or idx.shape[1] < 1 or num_envs < 1 or cap % num_envs or cursor < 0 or cursor >= cap):
        return -1
    got = pool_draw(pool, inpool, meta, start, count, n, state, idx[:, 0])
    if got < 0:
        return got
    for b in range(idx.shape[0]):
        fill_slice(idx[b, 0], b, cursor, num_envs, cap, episode, idx, mask)
    return got


@njit(**NJIT_OPTIONS)
def pool_clear(pool, inpool, meta):
    """An empty pool: no slot in it, nothing drawn yet."""
    for s in range(inpool.shape[0]):
        inpool[s] = 0
    meta[0] = 0


@njit(**NJIT_OPTIONS)
def pool_load(pool, inpool, meta, undrawn, n):
    """Set the pool to the slots ``undrawn`` (int64[m], in that order); the caller checked that
    each is a live slot (``< n``) given once. Returns 0; ``i + 1`` for the first entry that is
    not (the pool is then empty); -1 with nothing changed when the arrays disagree."""
    cap = pool.shape[0]
    m = undrawn.shape[0]
    if inpool.shape[0] != cap or meta.shape[0] < 2 or m > cap or n < 0 or n > cap:
        return -1
    for s in range(cap):
        inpool[s] = 0
    for i in range(m):
        s = undrawn[i]
        if s < 0 or s >= n or inpool[s] != 0:
            for t in range(cap):
                inpool[t] = 0
            meta[0] = 0
            return i + 1
        inpool[s] = 1
        pool[i] = s
    meta[0] = m
    return 0
