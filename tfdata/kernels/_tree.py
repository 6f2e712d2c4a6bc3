"""Priority trees in cache-line blocks: float32 leaves, a float64 sum tree (with float32 min and
max) over blocks of 16 leaves.

Layout, for ``P`` leaves (a power of two, at least :data:`BLOCK`) and ``NB = P // BLOCK``
blocks:

* ``leaves`` : float32[P], slot ``s`` at ``leaves[s]``, 64-byte aligned by the sampler so that
  block ``b`` (slots ``[16 b, 16 b + 16)``) is one cache line.
* ``sums`` : float64[2 NB], a binary tree over the blocks: ``sums[1]`` is the root, node ``i``
  has children ``2i`` and ``2i+1``, block ``b`` is node ``NB + b`` and holds the sum of its 16
  leaves, added in float64 in slot order.
* ``mm`` : float32[2 NB, 2], the same tree with ``mm[i, 0]`` the smallest positive leaf under
  node ``i`` (``inf`` when none) and ``mm[i, 1]`` the largest leaf (0 when none). Both are
  leaves, so float32 holds them exactly.
* ``sums[0]`` is no node: it counts the rows written (:func:`tree_overwrite_max` adds one, the
  sampler adds the rows of a span), the epoch of the stale check (see :func:`tree_update`).

Why: the old layout, three float64 trees over every slot interleaved as ``(2P, 4)`` nodes,
took 64 bytes per slot (2.8x a CartPole row); this one takes 4 + 16 / 16 * 2 = 6 bytes per
slot, and at 2**20 slots all of it (6 MiB) stays in the last-level cache. A draw descends
``log2(NB)`` levels of the 8-byte sum tree (1 MiB at 2**20 slots) and then scans one cache line;
an update writes one leaf, recomputes its block from that same line and walks up ``log2(NB)``
levels. Figures in reports/prioritized.md.

Exactness. A leaf is ``float32((p + eps) ** alpha)``: the power is computed in float64 and
rounded to nearest once, when the leaf is written, and everything after that is exact on those
float32 values: the minimum (importance weights) and maximum (priority of new rows) are leaves,
and a block's sum of 16 float32 values in float64 is, in the usual case, exact too (it is
whenever the block's leaves span less than 2**29 in ratio). Parents are always recomputed from
their children, never adjusted by differences, so no rounding error accumulates: after any
sequence of updates every node holds what a fresh build from the same leaves would hold.

Bounds: a live leaf lies in ``[MIN_LEAF, MAX_LEAF]``, the normal finite float32 values
(checked by the buffer before any leaf is written, see :func:`priority_bounds`); the root, at
most ``2**32 * MAX_LEAF``, is then finite and positive. The kernels do not rely on it for memory
safety: whatever the arrays hold (NaN, inf, an all-zero tree, slots out of range, arrays of
inconsistent sizes), no kernel here reads or writes outside its arrays; the clamps below are
that last line, not the check.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .._config import INLINE_OPTIONS, NJIT_OPTIONS
from ._pow import pow32
from ._prefetch import prefetch
from ._rng import GOLDEN, mix64

_ONE = np.uint64(1)
_S11 = np.uint64(11)
_INV53 = 1.0 / 9007199254740992.0  # 2**-53

#: leaves per block: one 64-byte cache line of float32
BLOCK = 16
_SHIFT = 4

#: smallest leaf value accepted: the smallest normal float32 (a subnormal leaf would lose bits)
MIN_LEAF = float(np.finfo(np.float32).tiny)
#: largest leaf value accepted: the largest float32 (2**32 such leaves still sum to a finite float64)
MAX_LEAF = float(np.finfo(np.float32).max)
# a float64 at or above this rounds to float32 inf (the tie at max + half an ulp goes to even, inf)
_F32_INF_AT = MAX_LEAF + 2.0 ** 103
_INF32 = np.float32(np.inf)
_NAN32 = np.float32(np.nan)
_ZERO32 = np.float32(0.0)


def max_leaf(leaves: int) -> float:
    """Largest leaf value accepted in a tree of ``leaves`` slots: :data:`MAX_LEAF` whatever the
    size (kept as a function of the size for the callers that bound checkpoints with it)."""
    return MAX_LEAF


def leaves_of(capacity: int) -> int:
    """``P``, the leaves of the tree of ``capacity`` slots: the power of two >= capacity, at
    least one block."""
    return max(BLOCK, 1 << max(0, (capacity - 1).bit_length()))


def tree_nbytes(capacity: int) -> int:
    """Bytes of the arrays of a tree of ``capacity`` slots: leaves (one block of alignment slack
    included), sums and min/max."""
    p = leaves_of(capacity)
    nb = p // BLOCK
    return 4 * (p + BLOCK) + 2 * nb * 8 + 2 * nb * 8


def new_tree(capacity: int, allocator) -> tuple:
    """``(sums, mm, leaves)`` of an empty tree of ``capacity`` slots from ``allocator`` (its
    ``zeros(shape, dtype)``), ``leaves`` 64-byte aligned; returns the arrays and the raw leaf
    allocation (what ``nbytes`` counts) as ``(sums, mm, leaves, raw)``."""
    p = leaves_of(capacity)
    nb = p // BLOCK
    raw = allocator.zeros(p + BLOCK, np.float32)
    off = (-raw.ctypes.data % 64) // 4  # float32 elements to the next cache line
    leaves = raw[off:off + p]
    sums = allocator.zeros(2 * nb, np.float64)
    mm = allocator.zeros((2 * nb, 2), np.float32)
    mm[:, 0] = np.inf
    return sums, mm, leaves, raw


@njit(**INLINE_OPTIONS)
def _to32(x):
    """``x`` (float64) rounded to float32 as numpy does, with every value from the rounding
    boundary up (and +inf) giving inf and NaN giving NaN (no reliance on the conversion of an
    out-of-range value)."""
    if x >= _F32_INF_AT:
        return _INF32
    if x <= -_F32_INF_AT:
        return -_INF32
    return np.float32(x)


@njit(**INLINE_OPTIONS)
def _dims(sums, mm, leaves):
    """``(NB, P)`` usable with these arrays: the blocks all three cover (a last line against
    arrays of inconsistent sizes)."""
    nb = min(sums.shape[0], mm.shape[0]) // 2
    nb = min(nb, leaves.shape[0] >> _SHIFT)
    return nb, nb << _SHIFT


@njit(**INLINE_OPTIONS)
def _step(left, right, x, off, width):
    """One step of a descent: ``(x, off)`` after choosing between subtrees of mass ``left``
    and ``right``: right when ``x`` is past the left mass and the right one is not empty, or
    when the left one is empty (so a descent from a positive mass ends on a positive leaf,
    whatever the rounding). A select, not a branch."""
    go = (left <= 0.0) | ((x >= left) & (right > 0.0))
    return (x - left if go else x), (off + width if go else off)


@njit(**INLINE_OPTIONS)
def _block(sums, mm, leaves, nb, b):
    """Recompute node ``NB + b`` from the 16 leaves of block ``b`` (one cache line): their sum
    (in slot order, as :func:`stratified_find` adds them in a block), smallest positive and
    largest leaf."""
    base = b << _SHIFT
    s = 0.0
    lo = _INF32
    hi = _ZERO32
    for k in range(BLOCK):  # selects, not branches: the leaves come in any order
        v = leaves[base + k]
        s += np.float64(v)
        lo = v if (v > 0.0) & (v < lo) else lo
        hi = v if v > hi else hi
    _set_node(sums, mm, nb + b, s, lo, hi)


@njit(**INLINE_OPTIONS)
def _set_node(sums, mm, i, s, lo, hi):
    sums[i] = s
    mm[i, 0] = lo
    mm[i, 1] = hi


@njit(**INLINE_OPTIONS)
def _block4(sums, mm, leaves, nb, b0, b1, b2, b3):
    """:func:`_block` of blocks ``b0``..``b3`` in one loop, each summed in slot order as
    :func:`_block` sums it: one block's sum is a chain of 16 dependent additions, and four
    independent chains overlap (reports/prioritized.md, "The blocks four at a time")."""
    a0 = b0 << _SHIFT
    a1 = b1 << _SHIFT
    a2 = b2 << _SHIFT
    a3 = b3 << _SHIFT
    s0 = s1 = s2 = s3 = 0.0
    lo0 = lo1 = lo2 = lo3 = _INF32
    hi0 = hi1 = hi2 = hi3 = _ZERO32
    for k in range(BLOCK):
        v0 = leaves[a0 + k]
        v1 = leaves[a1 + k]
        v2 = leaves[a2 + k]
        v3 = leaves[a3 + k]
        s0 += np.float64(v0)
        s1 += np.float64(v1)
        s2 += np.float64(v2)
        s3 += np.float64(v3)
        lo0 = v0 if (v0 > 0.0) & (v0 < lo0) else lo0
        lo1 = v1 if (v1 > 0.0) & (v1 < lo1) else lo1
        lo2 = v2 if (v2 > 0.0) & (v2 < lo2) else lo2
        lo3 = v3 if (v3 > 0.0) & (v3 < lo3) else lo3
        hi0 = v0 if v0 > hi0 else hi0
        hi1 = v1 if v1 > hi1 else hi1
        hi2 = v2 if v2 > hi2 else hi2
        hi3 = v3 if v3 > hi3 else hi3
    _set_node(sums, mm, nb + b0, s0, lo0, hi0)
    _set_node(sums, mm, nb + b1, s1, lo1, hi1)
    _set_node(sums, mm, nb + b2, s2, lo2, hi2)
    _set_node(sums, mm, nb + b3, s3, lo3, hi3)


@njit(**INLINE_OPTIONS)
def _pull(sums, mm, i):
    left = 2 * i
    right = left + 1
    sums[i] = sums[left] + sums[right]
    a = mm[left, 0]
    b = mm[right, 0]
    mm[i, 0] = b if b < a else a
    a = mm[left, 1]
    b = mm[right, 1]
    mm[i, 1] = b if b > a else a


@njit(**INLINE_OPTIONS)
def _pull_range(sums, mm, lo, hi):
    """Recompute the ancestors of nodes ``[lo, hi]``, one level per pass."""
    lo >>= 1
    hi >>= 1
    while lo >= 1:
        for i in range(lo, hi + 1):
            _pull(sums, mm, i)
        lo >>= 1
        hi >>= 1


@njit(**INLINE_OPTIONS)
def _pull_slots(sums, mm, leaves, nb, p, slots):
    """Recompute the blocks of ``slots`` (int64[k]; those outside ``[0, P)`` skipped) and all
    their ancestors, level by level across the batch so that the cache misses of different
    paths overlap. A level with fewer nodes than ``k`` is recomputed whole (at most ``2 k``
    nodes over all such levels, instead of ``k`` per level)."""
    k = slots.shape[0]
    j = 0
    while j + 4 <= k:  # four blocks at a time when all four slots are in the tree
        s0 = slots[j]
        s1 = slots[j + 1]
        s2 = slots[j + 2]
        s3 = slots[j + 3]
        if (s0 >= 0) & (s0 < p) & (s1 >= 0) & (s1 < p) & (s2 >= 0) & (s2 < p) & (s3 >= 0) & (s3 < p):
            _block4(sums, mm, leaves, nb, s0 >> _SHIFT, s1 >> _SHIFT, s2 >> _SHIFT, s3 >> _SHIFT)
            j += 4
            continue
        for s in (s0, s1, s2, s3):
            if s >= 0 and s < p:
                _block(sums, mm, leaves, nb, s >> _SHIFT)
        j += 4
    while j < k:
        s = slots[j]
        if s >= 0 and s < p:
            _block(sums, mm, leaves, nb, s >> _SHIFT)
        j += 1
    shift = 1
    while (nb >> shift) >= 1:
        width = nb >> shift
        if width <= k:
            for i in range(width, 2 * width):
                _pull(sums, mm, i)
        else:
            for j in range(k):
                s = slots[j]
                if s >= 0 and s < p:
                    _pull(sums, mm, (nb + (s >> _SHIFT)) >> shift)
        shift += 1


@njit(**NJIT_OPTIONS)
def tree_set(sums, mm, leaves, slots, values):
    """Set the leaves of ``slots`` (int64[k]) to ``float32(values)`` (float64[k]) and update
    their ancestors.

    A slot listed twice takes its last value. A slot outside ``[0, P)`` is skipped (the caller
    checks them; this is the last line, so no write lands outside the tree).
    """
    nb, p = _dims(sums, mm, leaves)
    for j in range(slots.shape[0]):
        s = slots[j]
        if s >= 0 and s < p:
            leaves[s] = _to32(values[j])
    _pull_slots(sums, mm, leaves, nb, p, slots)


#: what :func:`tree_update` found wrong (its return value is ``4 * position + code``)
BAD_PRIORITY, BAD_SLOT, STALE = 1, 2, 3
#: laps of the ring since a sample from which its batch is stale whatever the versions say: at
#: most 253 laps, a ring's slot was written at most 254 times, so its 8-bit count cannot have
#: come back to the same value
LAPS_GUARD = 254
_EPOCH_MASK = (1 << 24) - 1


def epoch_of(sums, ring: int) -> int:
    """Laps of a ring of ``ring`` slots written so far, modulo 2**24 (from ``sums[0]``)."""
    return (int(sums[0]) // ring) & _EPOCH_MASK


@njit(**INLINE_OPTIONS)
def epoch_stamp(sums, ring):
    """``epoch_of(sums, ring) << 8`` as uint32, in a kernel: what a sample ORs into each drawn
    slot's 8-bit version. 0 when ``ring < 1`` or ``sums[0]`` is not a count (a last line: the
    value stays a uint32 whatever the array holds)."""
    c = sums[0] if sums.shape[0] > 0 else 0.0
    if not (ring >= 1 and c >= 0.0 and c < 9.0e18):
        return np.uint32(0)
    return np.uint32(((np.int64(c) // ring) & _EPOCH_MASK) << 8)


def stale_mask(version, slots, versions, laps: int) -> np.ndarray:
    """Which ``slots`` (int64) :func:`tree_update` would refuse as stale: bool array."""
    v = np.asarray(versions).astype(np.int64)
    return ((version[slots].astype(np.int64) != (v & 0xFF))
            | (((laps - (v >> 8)) & _EPOCH_MASK) >= LAPS_GUARD))


@njit(**NJIT_OPTIONS)
def tree_update(sums, mm, leaves, version, slots, priorities, versions, check, laps, n, low, high,
                eps, alpha, scratch):
    """``update_priorities`` in one call: check everything, then write the leaves.

    Parameters
    ----------
    sums, mm, leaves
        The tree (see the module docstring).
    version : ndarray of uint8, shape (capacity,)
        Writes per slot, modulo 256.
    slots : ndarray of int64, shape (k,)
    priorities : ndarray of float64, shape (k,)
    versions : ndarray of uint32, shape (k,)
        What the sample stamped (:func:`stamp`): ``epoch << 8 | version[slot]``, ``epoch`` the
        laps of the ring written before the sample (modulo 2**24); read only when ``check``.
    check : bool
        Refuse stale slots: whose version differs, or any slot once :data:`LAPS_GUARD` laps or
        more were written since the sample (then a slot may have been written 256 times, and
        its 8-bit version come back to the same value; every row of a ring was overwritten
        by then anyway).
    laps : int
        The epoch now.
    n : int
        Live rows: every slot must be in ``[0, n)``.
    low, high : float
        Accepted priorities (:func:`priority_bounds`).
    eps, alpha : float
    scratch : ndarray of float32, shape (m,)
        Where the leaves' powers are computed, ``m`` at a time (any ``m``; 0 computes them one
        at a time).

    Returns
    -------
    int
        0 when every leaf was written. Otherwise nothing was written and the value is
        ``4 * j + code``, ``j`` the first position at fault and ``code`` :data:`BAD_PRIORITY`
        (a priority outside ``[low, high]``, NaN included; checked first, over the whole batch),
        :data:`BAD_SLOT` (a slot outside ``[0, n)``, or outside the arrays) or :data:`STALE`
        (checked last).
    """
    k = slots.shape[0]
    if priorities.shape[0] < k or (check and versions.shape[0] < k):
        return BAD_SLOT + 4 * min(priorities.shape[0], versions.shape[0] if check else k)
    for j in range(k):
        v = priorities[j]
        if not (v >= low and v <= high):
            return 4 * j + BAD_PRIORITY
    nb, p = _dims(sums, mm, leaves)
    lim = min(n, p, version.shape[0])
    for j in range(k):
        s = slots[j]
        if s < 0 or s >= lim:
            return 4 * j + BAD_SLOT
    if check:
        for j in range(k):
            v = np.int64(versions[j])
            if version[slots[j]] != (v & 0xFF) or ((laps - (v >> 8)) & _EPOCH_MASK) >= LAPS_GUARD:
                return 4 * j + STALE
    _write_leaves(leaves, slots, priorities, eps, alpha, scratch, k)
    _pull_slots(sums, mm, leaves, nb, p, slots)
    return 0


@njit(**INLINE_OPTIONS)
def _write_leaves(leaves, slots, priorities, eps, alpha, scratch, k):
    """``leaves[slots[j]] = float32((priorities[j] + eps) ** alpha)`` for ``j < k``, in order
    (a slot listed twice takes its last value), the powers computed ``len(scratch)`` at a time
    by :func:`~tfdata.kernels._pow.pow32` in ``scratch`` (float32), where they vectorise; one at a
    time with ``**`` where it is not certain, or with no scratch."""
    m = scratch.shape[0]
    j0 = 0
    while j0 < k:
        c = min(m, k - j0)
        for i in range(c):
            scratch[i] = pow32(priorities[j0 + i] + eps, alpha)
        for i in range(max(c, 1)):
            v = scratch[i] if c > 0 else _NAN32
            if v != v:
                v = _to32((priorities[j0 + i] + eps) ** alpha)
            leaves[slots[j0 + i]] = v
        j0 += max(c, 1)


@njit(**NJIT_OPTIONS)
def first_bad_priority(priorities, low, high):
    """Position of the first value of ``priorities`` (float64[k]) outside ``[low, high]``, or -1.

    NaN is outside. ``low``, ``high``: from :func:`priority_bounds`, so a priority passes exactly
    when its leaf lies in ``[MIN_LEAF, MAX_LEAF]``, without computing a single power here (the
    update computes each leaf once, when it writes it).
    """
    for j in range(priorities.shape[0]):
        v = priorities[j]
        if not (v >= low and v <= high):
            return j
    return -1


@njit(**NJIT_OPTIONS)
def leaf_of(priority, eps, alpha):
    """The leaf of ``priority``, ``float32((priority + eps) ** alpha)`` (returned as float64),
    computed as the tree kernels compute it; inf when it overflows float32."""
    return np.float64(_to32((priority + eps) ** alpha))


def _bits(x: float) -> int:
    return int(np.float64(x).view(np.int64))


def _float(bits: int) -> float:
    return float(np.int64(bits).view(np.float64))


def priority_bounds(eps: float, alpha: float, leaves: int):
    """``(low, high)``: the priorities ``p`` whose leaf (as :func:`leaf_of` computes it) lies in
    ``[MIN_LEAF, MAX_LEAF]``, or None if none does.

    Found by bisection over the bit patterns of the non-negative float64s (which order as their
    bits), assuming the leaf is non-decreasing in ``p`` (``alpha >= 0``; rounding to float32
    keeps that); ``low`` is the first priority whose leaf is at least ``MIN_LEAF`` and ``high``
    the last whose leaf is at most ``MAX_LEAF``, each checked exactly. Not a kernel: about 130
    evaluations, once per buffer. ``leaves`` is unused (the bounds no longer depend on the size).
    """
    top = MAX_LEAF
    lo, hi = 0, _bits(np.finfo(np.float64).max)

    def leaf(bits):
        return leaf_of(_float(bits), eps, alpha)

    if not (leaf(lo) <= top and leaf(hi) >= MIN_LEAF):
        return None
    if leaf(lo) >= MIN_LEAF:
        low = lo
    else:  # smallest p whose leaf reaches MIN_LEAF
        a, b = lo, hi
        while a < b:
            mid = a + (b - a) // 2
            if leaf(mid) >= MIN_LEAF:
                b = mid
            else:
                a = mid + 1
        low = a
    if leaf(hi) <= top:
        high = hi
    else:  # largest p whose leaf stays at most MAX_LEAF
        a, b = lo, hi
        while a < b:
            mid = b - (b - a) // 2
            if leaf(mid) <= top:
                a = mid
            else:
                b = mid - 1
        high = a
    if low > high:
        return None
    return _float(low), _float(high)


@njit(**INLINE_OPTIONS)
def _blocks_range(sums, mm, leaves, nb, start, stop):
    """Recompute blocks ``[start, stop)`` (inside ``[0, NB)``), four at a time."""
    b = start
    while b + 4 <= stop:
        _block4(sums, mm, leaves, nb, b, b + 1, b + 2, b + 3)
        b += 4
    while b < stop:
        _block(sums, mm, leaves, nb, b)
        b += 1


@njit(**INLINE_OPTIONS)
def _fill_range(sums, mm, leaves, nb, lo, hi):
    """Recompute the blocks of slots ``[lo, hi]`` (inside ``[0, P)``) and their ancestors."""
    blo = lo >> _SHIFT
    bhi = hi >> _SHIFT
    _blocks_range(sums, mm, leaves, nb, blo, bhi + 1)
    _pull_range(sums, mm, nb + blo, nb + bhi)


@njit(**NJIT_OPTIONS)
def tree_fill(sums, mm, leaves, start, count, value):
    """Set leaves ``[start, start + count)`` (no wrap) to ``float32(value)``; update ancestors.

    The range is cut to the tree's ``[0, P)`` (a last line: the caller passes writer spans)."""
    nb, p = _dims(sums, mm, leaves)
    if start < 0:
        count += start
        start = 0
    count = min(count, p - start)
    if count <= 0:
        return
    v = _to32(value)
    for s in range(start, start + count):
        leaves[s] = v
    _fill_range(sums, mm, leaves, nb, start, start + count - 1)


@njit(**NJIT_OPTIONS)
def tree_overwrite_max(sums, mm, leaves, version, slot):
    """A new row in ``slot``: evict the old one (``version[slot] += 1``, modulo 256; one more
    row written in ``sums[0]``), then give it the maximum leaf over the rows still live (1.0 if
    none).

    The maximum without the evicted leaf is read on the way up (the rest of its block, then the
    sibling of every node on its path), so the path is written once. It is a leaf already
    accepted, so it cannot overflow the sum. A slot outside the tree or ``version`` changes
    nothing (a last line)."""
    nb, p = _dims(sums, mm, leaves)
    if slot < 0 or slot >= p or slot >= version.shape[0]:
        return
    b = slot >> _SHIFT
    base = b << _SHIFT
    m = _ZERO32
    for k in range(BLOCK):
        v = leaves[base + k]
        if base + k != slot and v > m:
            m = v
    i = nb + b
    while i > 1:
        v = mm[i ^ 1, 1]
        if v > m:
            m = v
        i >>= 1
    version[slot] += 1
    sums[0] += 1.0
    leaves[slot] = m if m > 0.0 else np.float32(1.0)
    _block(sums, mm, leaves, nb, b)
    i = (nb + b) >> 1
    while i >= 1:
        _pull(sums, mm, i)
        i >>= 1


@njit(**NJIT_OPTIONS)
def tree_fill_values(sums, mm, leaves, start, values):
    """Set leaves ``[start, start + len(values))`` (no wrap) to ``float32(values)``; update
    ancestors. Values that would fall outside the tree's ``[0, P)`` are dropped (a last line)."""
    nb, p = _dims(sums, mm, leaves)
    count = values.shape[0]
    if start < 0 or start > p:
        return
    count = min(count, p - start)
    if count <= 0:
        return
    for k in range(count):
        leaves[start + k] = _to32(values[k])
    _fill_range(sums, mm, leaves, nb, start, start + count - 1)


@njit(**NJIT_OPTIONS)
def tree_build(sums, mm, leaves, values):
    """Leaves ``[0, len(values))`` from ``float32(values)`` (float64 or float32), every other leaf
    empty; then all parents."""
    nb, p = _dims(sums, mm, leaves)
    n = values.shape[0]
    for s in range(p):
        leaves[s] = _to32(np.float64(values[s])) if s < n else _ZERO32
    _blocks_range(sums, mm, leaves, nb, 0, nb)
    for i in range(nb - 1, 0, -1):
        _pull(sums, mm, i)


@njit(**INLINE_OPTIONS)
def live_limit(sums, leaves, n, rows):
    """Slots a prioritized draw may return: ``[0, limit)``, ``limit = min(n, rows, P)``; 0 when
    there are none or the root mass is not finite and positive (then nothing may be drawn)."""
    if sums.shape[0] < 2:
        return 0
    total = sums[1]
    if not (total > 0.0 and total < np.inf):
        return 0
    p = min(sums.shape[0] // 2, leaves.shape[0] >> _SHIFT) << _SHIFT
    return max(0, min(n, rows, p))


@njit(**INLINE_OPTIONS)
def stratified_find(sums, leaves, limit, state, idx, u):
    """Stratified proportional draws: ``idx[i]`` is the slot holding mass ``(i + r_i) * total / B``.

    ``u`` (float64[B]) is scratch. All B searches descend the block tree one level per pass, so
    the cache misses of different draws overlap; then each scans its block's cache line. At each
    node the search goes right when its mass is past the left subtree and the right subtree is
    not empty, or when the left subtree is empty; in the block it takes the first positive leaf
    whose cumulative mass passes the rest, or the last positive leaf if rounding left some over;
    so it ends on a leaf with positive mass, whatever the rounding. ``limit`` (>= 1, from
    :func:`live_limit`): a slot at or past it becomes ``limit - 1``. A consistent tree never
    needs that (slots past the live rows have mass 0); it keeps every slot inside the arrays
    whatever the tree holds.
    """
    nb = min(sums.shape[0] // 2, leaves.shape[0] >> _SHIFT)
    batch = idx.shape[0]
    seg = sums[1] / batch
    key = state[0]
    ctr = state[1]
    for i in range(batch):
        r = mix64(key + ctr * GOLDEN)
        ctr += _ONE
        u[i] = (i + np.float64(r >> _S11) * _INV53) * seg
        idx[i] = 1
    state[1] = ctr
    # branch-free steps (selects): which way a draw goes is a coin toss the branch predictor
    # loses half the time, and with no mispredictions the CPU runs ahead into the next draws'
    # loads (reports/prioritized.md, "Tried and rejected": the descent with branches). At node
    # j the 8 nodes two levels below its children, 8j..8j+7, are one cache line (64-byte
    # aligned sums) whichever way the draw goes: prefetched, that line is in cache when the
    # draw gets there, so each miss overlaps two levels of every draw's descent
    ns = sums.shape[0]
    width = nb
    while width > 1:
        for i in range(batch):
            j = idx[i]
            if 8 * j < ns:
                prefetch(sums, 8 * j)
            left = 2 * j
            u[i], idx[i] = _step(sums[left], sums[left + 1], u[i], left, 1)
        width >>= 1
    # every drawn block's cache line prefetched before the first scan, so that the misses
    # overlap (a pass of loads did that before, slower: its loads had to complete in order)
    for i in range(batch):
        prefetch(leaves, (idx[i] - nb) << _SHIFT)
    last = limit - 1
    for i in range(batch):
        # the slot: the first leaf whose cumulative mass passes x, i.e. the number of leaves
        # whose cumulative mass is at most x (that leaf is positive: its cumulative mass grew);
        # when none passes (x past the block's mass by rounding), the last positive leaf. No
        # branch, and the cumulative sum is the block's sum as _block adds it. (A descent of
        # the block's 4 levels with pairwise sums added on the fly was 1.2x slower.)
        base = (idx[i] - nb) << _SHIFT
        x = u[i]
        cum = 0.0
        cnt = 0
        lastpos = 0
        for k in range(BLOCK):
            c = np.float64(leaves[base + k])
            cum += c
            cnt += np.int64(cum <= x)
            lastpos = k if c > 0.0 else lastpos
        idx[i] = min(base + (cnt if cnt < BLOCK else lastpos), last)


@njit(**INLINE_OPTIONS)
def is_weight(mm, leaves, s, beta):
    """``(p_min / p_s) ** beta`` for slot ``s`` (float64; the caller stores it as float32)."""
    return (np.float64(mm[1, 0]) / np.float64(leaves[s])) ** beta


@njit(**INLINE_OPTIONS)
def is_weights(mm, leaves, idx, beta, weights, u):
    """``weights[i] = (N P(i))**-beta / max_j (N P(j))**-beta = (p_min / p_i)**beta`` (float32),
    for ``i`` below the length of ``idx``, ``weights`` and ``u`` (float64 scratch)."""
    pmin = np.float64(mm[1, 0])
    n = min(idx.shape[0], weights.shape[0], u.shape[0])
    for i in range(n):  # the loads apart from the powers, so that their misses overlap
        u[i] = pmin / np.float64(leaves[idx[i]])
    for i in range(n):  # one vectorised loop; NaN where pow32 is not certain
        weights[i] = pow32(u[i], beta)
    for i in range(n):
        if weights[i] != weights[i]:
            weights[i] = u[i] ** beta
