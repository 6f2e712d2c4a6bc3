"""Exactly-k replay: a pool of the slots awaiting replay and a count of deliveries left per slot.

``remaining[s]`` is how many more batches slot ``s`` is to be delivered in (0: the slot is free,
the writer may overwrite it), and ``pool[0:m]`` holds exactly the slots whose count is not 0, in
no particular order. A batch draws ``B`` distinct slots of the pool by a partial Fisher-Yates
shuffle (draw ``r`` uniform in ``[0, m - i)``, swap ``pool[r]`` with ``pool[m - 1 - i]``, which
takes that slot out of reach of the batch's later draws), then lowers the count of each slot
drawn; those whose count reaches 0 leave the pool (they are all in its last ``B`` entries,
which are compacted in order). A write sets the written slot's count to ``k`` and adds it to
the pool if it was not in it; the count it had (not 0 only under the "overwrite" policy) is
returned as replays lost.

No place-of-slot index, as in :mod:`._pool`: a slot needs one only to leave the pool out of
turn, and here a slot leaves only when it was just drawn (at the pool's end) or is rewritten
while in the pool (then it stays, with a fresh count).

Arrays: ``pool`` uint32[capacity], ``remaining`` uint8 or uint16[capacity], ``meta``
int64[1] (``m``). Whatever they hold, no kernel reads or writes outside them: sizes are checked
at entry, every slot read from ``pool`` is checked before it is used (-2: the pool was corrupt).
Reference: ``exactly_k_sample_naive`` and ``exactly_k_write_naive`` in ``tests/naive.py``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .._config import INLINE_OPTIONS, NJIT_OPTIONS
from ._rng import draw_varying
from ._sync import load_acquire, store_relaxed, store_release

# a log entry: the position published (low 32 bits) above the slot
_LOW32 = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)


@njit(**INLINE_OPTIONS)
def replays_draw(pool, remaining, meta, state, idx):
    """Draw ``len(idx)`` distinct slots of the pool, lower their counts, free those at 0
    (inlined into each layout's ``sample_exactly_k``, which then gathers; :func:`replays_sample`
    alone).

    Parameters
    ----------
    pool : uint32[capacity]
    remaining : uint8[capacity] or uint16[capacity]
    meta : int64[1]
        ``[m]``: slots awaiting replay, ``pool[0:m]``.
    state : uint64[2]
        The counter RNG; one draw (plus rejections) per row, advanced in place.
    idx : int64[batch]
        Output: the slots drawn, in order.

    Returns
    -------
    int
        Rows freed by this batch (their k-th delivery), -1 with nothing changed when the
        arguments disagree (``len(idx) > m`` among them), -2 for a corrupt pool (a slot out of
        range or with no delivery left; the draws before it are made: counts lowered, ``pool``
        reordered, ``state`` advanced, ``m`` unchanged).
    """
    cap = pool.shape[0]
    B = idx.shape[0]
    m = meta[0]
    if remaining.shape[0] != cap or meta.shape[0] < 1 or state.shape[0] < 2 or m < 0 or m > cap or B > m:
        return -1
    key = state[0]
    ctr = state[1]
    # the random numbers first (they do not depend on the pool), then the swaps, whose cache
    # misses then overlap (as in _pool.pool_draw)
    for i in range(B):
        r, ctr = draw_varying(np.uint64(m - i), key, ctr)
        idx[i] = r
    for i in range(B):
        r = idx[i]
        j = m - 1 - i
        s = np.int64(pool[r])
        if s >= cap or remaining[s] == 0:
            state[1] = ctr
            return -2
        remaining[s] -= 1  # while its cache line is here (not in a loop of its own)
        pool[r] = pool[j]
        pool[j] = s
        idx[i] = s
    w = m - B  # compact the drawn entries: those with deliveries left stay, in order
    for j in range(m - B, m):
        s = pool[j]
        if remaining[s] != 0:
            pool[w] = s
            w += 1
    meta[0] = w
    state[1] = ctr
    return m - w


@njit(**NJIT_OPTIONS)
def replays_sample(pool, remaining, meta, state, idx):
    """:func:`replays_draw` as a kernel of its own (the draws without a gather)."""
    return replays_draw(pool, remaining, meta, state, idx)


@njit(**NJIT_OPTIONS)
def replays_write(pool, remaining, meta, start, count, k):
    """Slots ``start, start + 1, ...`` (``count`` of them, modulo the capacity) were written:
    each is to be delivered ``k`` times from now; a slot not in the pool joins it at the end.

    Returns the deliveries the slots had left before (replays lost by an overwrite; 0 when
    every slot was free), or -1 with nothing changed when the arguments disagree (``count``
    above the capacity, ``k`` not in ``[1, max of remaining's dtype]``), -2 for a corrupt pool
    (``m`` would pass the capacity; the slots before stay written).
    """
    cap = pool.shape[0]
    m = meta[0]
    top = np.iinfo(remaining.dtype).max
    if (remaining.shape[0] != cap or meta.shape[0] < 1 or start < 0 or start >= cap or count < 0
            or count > cap or k < 1 or k > top or m < 0 or m > cap):
        return -1
    lost = 0
    for i in range(count):
        s = start + i
        if s >= cap:
            s -= cap
        left = remaining[s]
        if left == 0:
            if m >= cap:
                meta[0] = m
                return -2
            pool[m] = s
            m += 1
        lost += left
        remaining[s] = k
    meta[0] = m
    return lost


@njit(**NJIT_OPTIONS)
def replays_write_spans(pool, remaining, meta, spans, k):
    """:func:`replays_write` over each run ``(start, count)`` of ``spans`` (int64 ``(m, 2)``),
    in order: the rows of another process's writes, in one call. Returns the deliveries the
    slots had left before, or -1 with nothing changed when the arguments disagree (a run out of
    range, ``k`` out of range), -2 for a corrupt pool (the runs before stay written)."""
    cap = pool.shape[0]
    top = np.iinfo(remaining.dtype).max
    if (remaining.shape[0] != cap or meta.shape[0] < 1 or spans.ndim != 2 or spans.shape[1] < 2
            or k < 1 or k > top or meta[0] < 0 or meta[0] > cap):
        return -1
    for i in range(spans.shape[0]):
        if spans[i, 0] < 0 or spans[i, 0] >= cap or spans[i, 1] < 0 or spans[i, 1] > cap:
            return -1
    lost = 0
    for i in range(spans.shape[0]):
        got = replays_write(pool, remaining, meta, spans[i, 0], spans[i, 1], k)
        if got < 0:
            return got
        lost += got
    return lost


@njit(**NJIT_OPTIONS)
def replays_place(remaining, start, n, free, spans, out):
    """Where the next ``n`` rows of a write go, as ``n`` single writes would put them: each in
    the first free slot (count 0) at or after the position (wrapping), while ``free`` says a
    free slot is left; then (``"overwrite"`` only) at the position itself. The position starts
    at ``start`` (the writer's cursor) and moves past each slot taken. Reads ``remaining``
    only: the slots taken in this call are still counted free there, which is right because
    the scan never comes back to them while ``free > 0`` (the free slots left are all ahead).
    A scan passes each slot once per sweep of the ring: amortised O(1) per slot the cursor
    moves over.

    Parameters
    ----------
    remaining : uint8[capacity] or uint16[capacity]
        Deliveries left per slot (0: free).
    start : int
        The position, in ``[0, capacity)``.
    n : int
        Rows to place, ``>= 0``.
    free : int
        Free slots in ``remaining`` (``capacity - m``), in ``[0, capacity]``.
    spans : int64[R, 2]
        Output: runs ``(dst, count)`` of consecutive slots (never across the ring's end), in
        row order. At most ``R`` runs are made: the rows after them are left for a next call.
    out : int64[4]
        Output: ``[position after, free left, rows placed, slots the position moved over]``.

    Returns
    -------
    int
        Runs written to ``spans``; -1 with nothing written when the arguments disagree, -2
        when ``free`` promised a free slot that a whole sweep did not find (``out`` unchanged).
    """
    cap = remaining.shape[0]
    R = spans.shape[0]
    if (cap < 1 or start < 0 or start >= cap or n < 0 or free < 0 or free > cap or R < 1
            or spans.shape[1] < 2 or out.shape[0] < 4):
        return -1
    pos = start
    moved = 0
    r = 0
    placed = 0
    while placed < n:
        if free > 0:
            steps = 0
            while remaining[pos] != 0:
                pos += 1
                if pos == cap:
                    pos = 0
                steps += 1
                if steps >= cap:
                    return -2
            moved += steps
        if r > 0 and spans[r - 1, 0] + spans[r - 1, 1] == pos:
            spans[r - 1, 1] += 1
        elif r == R:
            break
        else:
            spans[r, 0] = pos
            spans[r, 1] = 1
            r += 1
        if free > 0:
            free -= 1
        placed += 1
        moved += 1
        pos += 1
        if pos == cap:
            pos = 0
    out[0] = pos
    out[1] = free
    out[2] = placed
    out[3] = moved
    return r


@njit(**NJIT_OPTIONS)
def replays_clear(remaining, meta):
    """Every slot free, the pool empty."""
    for s in range(remaining.shape[0]):
        remaining[s] = 0
    meta[0] = 0


@njit(**NJIT_OPTIONS)
def replays_load(pool, remaining, meta, slots, counts):
    """Set the pool to ``slots`` (int64[m], in that order) with deliveries left ``counts``
    (int64[m], each in ``[1, max of remaining's dtype]``); every other slot free. The caller
    checked both; returns 0, or ``i + 1`` for the first entry that is not right (a slot out of
    range or repeated, a count out of range: then every slot is free and the pool empty), -1
    with nothing changed when the arrays disagree."""
    cap = pool.shape[0]
    m = slots.shape[0]
    top = np.iinfo(remaining.dtype).max
    if remaining.shape[0] != cap or meta.shape[0] < 1 or m > cap or counts.shape[0] != m:
        return -1
    for s in range(cap):
        remaining[s] = 0
    for i in range(m):
        s = slots[i]
        c = counts[i]
        if s < 0 or s >= cap or remaining[s] != 0 or c < 1 or c > top:
            for t in range(cap):
                remaining[t] = 0
            meta[0] = 0
            return i + 1
        remaining[s] = c
        pool[i] = s
    meta[0] = m
    return 0


# -- exactly-k across processes (tfdata/shared.py): per-slot counters and a publication log --------
#
# ``taken[g]`` (uint64, one per slot of the region) is written only by the writer of the slot's
# shard: rows it has put in slot ``g``. ``released[g]`` is written only by the learner: rows of
# slot ``g`` it has delivered ``k`` times and copied. Slot ``g`` is free iff the two are equal.
# ``log[s * cap + p % cap]`` (written only by shard ``s``'s writer) is the slot (of the shard,
# in ``[0, cap)``, low 32 bits) of the shard's ``p``-th published row tagged with ``p``'s low 32
# bits (high 32 bits: an entry is known fresh), stored before the ``taken`` it increments and
# before the head that publishes it. Never a read-modify-write of a word another process writes.


@njit(**NJIT_OPTIONS)
def replays_claim(taken, released, base, cap, cursor, n, slots):
    """The writer of the shard of slots ``[base, base + cap)``: the first free slots (``taken ==
    released``) at or after ``cursor`` (of the shard, wrapping), at most ``n`` and at most
    ``len(slots)``, each at most once (one sweep of the shard), into ``slots`` (of the shard, in
    ``[0, cap)``), in order: where ``n`` single writes of a :class:`ReplayBuffer` put rows.

    Parameters
    ----------
    taken, released : uint64[slots of the region]
    base, cap, cursor, n : int
    slots : int64[>= 1]
        Output.

    Returns
    -------
    int
        Slots found (0: none free), -1 when the arguments disagree (nothing written).
    """
    total = taken.shape[0]
    if (released.shape[0] != total or cap < 1 or base < 0 or base + cap > total or cursor < 0
            or cursor >= cap or n < 0):
        return -1
    want = min(n, slots.shape[0])
    pos = cursor
    found = 0
    steps = 0
    while found < want and steps < cap:
        # acquire: the row's stores below come after the learner's release was seen
        if taken[base + pos] == load_acquire(released, base + pos):
            slots[found] = pos
            found += 1
        pos += 1
        if pos == cap:
            pos = 0
        steps += 1
    return found


@njit(**NJIT_OPTIONS)
def replays_log(taken, log, base, cap, head, slots):
    """The writer, after writing rows into ``slots`` (of the shard, claimed free) and before
    publishing the new head ``head + len(slots)``: the log entries of rows ``head, head + 1,
    ...`` and one more take of each slot. Returns the rows logged, -1 with nothing written when
    the arguments disagree (a slot out of the shard, more slots than the shard)."""
    total = taken.shape[0]
    n = slots.shape[0]
    if log.shape[0] != total or cap < 1 or base < 0 or base + cap > total or head < 0 or n > cap:
        return -1
    for i in range(n):
        if slots[i] < 0 or slots[i] >= cap:
            return -1
    for i in range(n):
        s = slots[i]
        p = head + i
        # the entry first: a writer that takes the shard over finds every slot whose take was
        # stored without its head in a fresh entry (replays_recover)
        store_relaxed(log, base + p % cap, ((np.uint64(p) & _LOW32) << _S32) | np.uint64(s))
        store_relaxed(taken, base + s, taken[base + s] + np.uint64(1))
    return n


@njit(**NJIT_OPTIONS)
def replays_recover(taken, released, log, base, cap, head, reserved):
    """A writer taking over the shard of slots ``[base, base + cap)`` whose last writer died
    mid-write (rows ``head .. reserved - 1`` begun, not published): each of those positions
    whose log entry is fresh (tagged with the position) names a slot that writer may have taken
    without publishing it; its take is undone (``taken = released``: the slot is free again).
    Only that shard's writer writes ``taken``, and the learner never released such a slot (it
    was never published), so nothing else moves these words. Returns the slots freed, -1 when
    the arguments disagree."""
    total = taken.shape[0]
    if (released.shape[0] != total or log.shape[0] != total or cap < 1 or base < 0
            or base + cap > total or head < 0):
        return -1
    freed = 0
    end = min(reserved, head + cap)
    for p in range(head, end):
        e = log[base + p % cap]
        if (e >> _S32) != (np.uint64(p) & _LOW32):
            continue  # not written for this position: that row took no slot
        s = np.int64(e & _LOW32)
        if s < cap and taken[base + s] != load_acquire(released, base + s):
            store_relaxed(taken, base + s, released[base + s])
            freed += 1
    return freed


@njit(**NJIT_OPTIONS)
def replays_log_spans(heads, log, published, cap, spans):
    """The learner's catch-up of a free-slot region: the slots of the rows each shard published
    since the last call (positions ``published[s]`` to ``heads[s]``, the head read once with
    acquire order), read from the shard's log, in shard then publication order, as runs
    ``(first slot, count)`` of consecutive slots of the region (what the sampler's write hook
    takes). A writer writes only free slots, and a slot is free only once its previous row was
    heard, delivered and released: the unpublished positions of a shard name distinct slots, at
    most ``cap`` of them. A head or log entry that says otherwise is a word the learner cannot
    trust (-2).

    Parameters
    ----------
    heads : uint64[shards]
    log : uint64[shards * cap]
    published : int64[shards]
        Positions heard so far, advanced over the rows written to ``spans``.
    cap : int
    spans : int64[R, 2]
        Output runs. At most ``R``: the rows after them are left for a next call.

    Returns
    -------
    int
        Runs written (``R``: call again for more); -1 with nothing changed when the arguments
        disagree; -2 for a head behind ``published`` or more than ``cap`` ahead, or a log entry
        not tagged with its position or out of the shard (the rows before it stay written,
        ``published`` says up to where).
    """
    shards = heads.shape[0]
    R = spans.shape[0]
    if (published.shape[0] != shards or cap < 1 or log.shape[0] != shards * cap or R < 1
            or spans.shape[1] < 2):
        return -1
    r = 0
    for s in range(shards):
        h = np.int64(load_acquire(heads, s))
        f = published[s]
        if h < f or h - f > cap:
            return -2 if r == 0 else r
        for p in range(f, h):
            e = log[s * cap + p % cap]
            slot = np.int64(e & _LOW32)
            if (e >> _S32) != (np.uint64(p) & _LOW32) or slot >= cap:
                published[s] = p
                return -2 if r == 0 else r
            g = s * cap + slot
            if r > 0 and spans[r - 1, 0] + spans[r - 1, 1] == g:
                spans[r - 1, 1] += 1
            elif r == R:
                published[s] = p
                return r
            else:
                spans[r, 0] = g
                spans[r, 1] = 1
                r += 1
        published[s] = h
    return r


@njit(**NJIT_OPTIONS)
def replays_release(remaining, released, idx):
    """The learner, after copying a batch (slots ``idx``, distinct, just drawn): each slot whose
    deliveries reached 0 is released (its writer may write it again). Returns the slots
    released, -1 with nothing written when the arguments disagree (a slot out of range)."""
    total = remaining.shape[0]
    if released.shape[0] != total:
        return -1
    for i in range(idx.shape[0]):
        if idx[i] < 0 or idx[i] >= total:
            return -1
    freed = 0
    for i in range(idx.shape[0]):
        g = idx[i]
        if remaining[g] == 0:
            # release: the copy's loads (earlier kernel calls) complete before the writer sees it
            store_release(released, g, released[g] + np.uint64(1))
            freed += 1
    return freed
