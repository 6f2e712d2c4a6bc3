"""Binary sum / min / max trees over ``P`` leaves (``P`` a power of two >= capacity), float64.

Layout: ``tree[1]`` is the root, node ``i`` has children ``2i`` and ``2i+1``, leaf of slot ``s``
is ``tree[P + s]``. Three arrays share that layout: ``sumt`` (subtree mass), ``mint`` (smallest
positive leaf, ``inf`` when empty) and ``maxt`` (largest leaf, 0 when empty); they may be
strided views of one record array (the prioritized buffer interleaves them). An empty slot has
mass 0. Parents are always recomputed from their children, never adjusted by differences, so no
rounding error accumulates: after any sequence of updates each node holds exactly what a fresh
build from the same leaves would hold.

Bounds: a live leaf lies in ``[MIN_LEAF, max_leaf(P)]`` (checked by the buffer before any leaf
is written, see :func:`priority_bounds`), so the root is finite and positive. The kernels do
not rely on it for memory safety: whatever the arrays hold (NaN, inf, an all-zero tree, slots
out of range), no kernel here reads or writes outside its arrays; the slot clamps below are
that last line, not the check.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .._config import INLINE_OPTIONS, NJIT_OPTIONS
from ._rng import GOLDEN, mix64

_ONE = np.uint64(1)
_S11 = np.uint64(11)
_INV53 = 1.0 / 9007199254740992.0  # 2**-53

#: smallest leaf value accepted: the smallest normal float64. Not the smallest subnormal: a
#: margin against a ``pow`` that is not exactly monotone near underflow (``priority_bounds``).
MIN_LEAF = float(np.finfo(np.float64).tiny)


def max_leaf(leaves: int) -> float:
    """Largest leaf value accepted in a tree of ``leaves`` (P) leaves: float64 max / (2 P).

    The sum of all P leaves is then at most half the largest float64, so every node is finite
    whatever the order of the additions (each node covers 2**k leaves, and ``2**k * max / 2P``
    is exact, so rounding to nearest cannot pass it); the factor 2 is a margin for a ``pow``
    that is not exactly monotone (``priority_bounds``).
    """
    return float(np.finfo(np.float64).max) / (2.0 * leaves)


@njit(**INLINE_OPTIONS)
def _pull(sumt, mint, maxt, i):
    left = 2 * i
    right = left + 1
    sumt[i] = sumt[left] + sumt[right]
    mint[i] = min(mint[left], mint[right])
    maxt[i] = max(maxt[left], maxt[right])


@njit(**INLINE_OPTIONS)
def _set_leaf(sumt, mint, maxt, i, v):
    sumt[i] = v
    mint[i] = v if v > 0.0 else np.inf
    maxt[i] = v


@njit(**NJIT_OPTIONS)
def tree_set(sumt, mint, maxt, slots, values):
    """Set the leaves of ``slots`` (int64[k]) to ``values`` (float64[k]) and update their ancestors.

    A slot listed twice takes its last value. A slot outside ``[0, P)`` is skipped (the caller
    checks them; this is the last line, so no write lands outside the tree).
    """
    p = sumt.shape[0] // 2
    for j in range(slots.shape[0]):
        s = slots[j]
        if s < 0 or s >= p:
            continue
        i = p + s
        _set_leaf(sumt, mint, maxt, i, values[j])
        i >>= 1
        while i >= 1:
            _pull(sumt, mint, maxt, i)
            i >>= 1


@njit(**NJIT_OPTIONS)
def tree_set_priorities(sumt, mint, maxt, slots, priorities, eps, alpha):
    """As :func:`tree_set` with leaf values ``(priorities + eps) ** alpha`` (float64[k]).

    The priorities must have passed :func:`first_bad_priority` with this buffer's bounds.
    """
    p = sumt.shape[0] // 2
    for j in range(slots.shape[0]):
        s = slots[j]
        if s < 0 or s >= p:
            continue
        i = p + s
        _set_leaf(sumt, mint, maxt, i, (priorities[j] + eps) ** alpha)
        i >>= 1
        while i >= 1:
            _pull(sumt, mint, maxt, i)
            i >>= 1


@njit(**NJIT_OPTIONS)
def first_bad_priority(priorities, low, high):
    """Position of the first value of ``priorities`` (float64[k]) outside ``[low, high]``, or -1.

    NaN is outside. ``low``, ``high``: from :func:`priority_bounds`, so a priority passes exactly
    when its leaf ``(p + eps) ** alpha`` lies in ``[MIN_LEAF, max_leaf(P)]``, without computing
    a single power here (the update computes each leaf once, when it writes it).
    """
    for j in range(priorities.shape[0]):
        v = priorities[j]
        if not (v >= low and v <= high):
            return j
    return -1


@njit(**NJIT_OPTIONS)
def leaf_of(priority, eps, alpha):
    """``(priority + eps) ** alpha``, computed as the tree kernels compute it."""
    return (priority + eps) ** alpha


@njit(**NJIT_OPTIONS)
def first_stale(version, slots, versions):
    """Position of the first ``slots[j]`` whose write count differs from ``versions[j]``, or -1.

    A slot outside ``version`` counts as stale (the caller checks the range first)."""
    for j in range(slots.shape[0]):
        s = slots[j]
        if s < 0 or s >= version.shape[0] or version[s] != versions[j]:
            return j
    return -1


def _bits(x: float) -> int:
    return int(np.float64(x).view(np.int64))


def _float(bits: int) -> float:
    return float(np.int64(bits).view(np.float64))


def priority_bounds(eps: float, alpha: float, leaves: int):
    """``(low, high)``: the priorities ``p`` whose leaf ``(p + eps) ** alpha`` (as
    :func:`leaf_of` computes it) lies in ``[MIN_LEAF, max_leaf(leaves)]``, or None if none does.

    Found by bisection over the bit patterns of the non-negative float64s (which order as their
    bits), assuming the leaf is non-decreasing in ``p`` (``alpha >= 0``); ``low`` is the first
    priority whose leaf is at least ``MIN_LEAF`` and ``high`` the last whose leaf is at most
    ``max_leaf``, each checked exactly. Not a kernel: about 130 evaluations, once per buffer.
    """
    top = max_leaf(leaves)
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
    else:  # largest p whose leaf stays at most max_leaf
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
def _pull_range(sumt, mint, maxt, lo, hi):
    """Recompute the ancestors of leaves ``[lo, hi]`` (tree indices), one level per pass."""
    lo >>= 1
    hi >>= 1
    while lo >= 1:
        for i in range(lo, hi + 1):
            _pull(sumt, mint, maxt, i)
        lo >>= 1
        hi >>= 1


@njit(**NJIT_OPTIONS)
def tree_fill(sumt, mint, maxt, start, count, value):
    """Set leaves ``[start, start + count)`` (no wrap) to ``value``; update ancestors level by level.

    The range is cut to the tree's ``[0, P)`` (a last line: the caller passes writer spans)."""
    p = sumt.shape[0] // 2
    if start < 0:
        count += start
        start = 0
    count = min(count, p - start)
    if count <= 0:
        return
    lo = p + start
    for i in range(lo, lo + count):
        _set_leaf(sumt, mint, maxt, i, value)
    _pull_range(sumt, mint, maxt, lo, lo + count - 1)


@njit(**NJIT_OPTIONS)
def tree_overwrite_max(sumt, mint, maxt, version, slot):
    """A new row in ``slot``: evict the old one (leaf 0, ``version[slot] += 1``), then give it the
    maximum priority over the rows still live (1.0 if none): ``tree_fill`` twice in one call.

    The maximum is a leaf already accepted (at most ``max_leaf``), so it cannot overflow the
    sum. A slot outside the tree or ``version`` changes nothing (a last line)."""
    p = sumt.shape[0] // 2
    if slot < 0 or slot >= p or slot >= version.shape[0]:
        return
    i = p + slot
    _set_leaf(sumt, mint, maxt, i, 0.0)
    _pull_range(sumt, mint, maxt, i, i)
    version[slot] += 1
    value = maxt[1] if maxt[1] > 0.0 else 1.0
    _set_leaf(sumt, mint, maxt, i, value)
    _pull_range(sumt, mint, maxt, i, i)


@njit(**NJIT_OPTIONS)
def tree_fill_values(sumt, mint, maxt, start, values):
    """Set leaves ``[start, start + len(values))`` (no wrap) to ``values``; update ancestors.

    Values that would fall outside the tree's ``[0, P)`` are dropped (a last line)."""
    p = sumt.shape[0] // 2
    count = values.shape[0]
    if start < 0 or start > p:
        return
    count = min(count, p - start)
    if count <= 0:
        return
    lo = p + start
    for k in range(count):
        _set_leaf(sumt, mint, maxt, lo + k, values[k])
    _pull_range(sumt, mint, maxt, lo, lo + count - 1)


@njit(**NJIT_OPTIONS)
def tree_build(sumt, mint, maxt, values):
    """Leaves ``[0, len(values))`` from ``values`` (float64), every other leaf empty; then all parents."""
    p = sumt.shape[0] // 2
    n = values.shape[0]
    for s in range(p):
        _set_leaf(sumt, mint, maxt, p + s, values[s] if s < n else 0.0)
    for i in range(p - 1, 0, -1):
        _pull(sumt, mint, maxt, i)


@njit(**INLINE_OPTIONS)
def live_limit(sumt, n, rows):
    """Slots a prioritized draw may return: ``[0, limit)``, ``limit = min(n, rows, P)``; 0 when
    there are none or the root mass is not finite and positive (then nothing may be drawn)."""
    total = sumt[1]
    if not (total > 0.0 and total < np.inf):
        return 0
    return max(0, min(n, rows, sumt.shape[0] // 2))


@njit(**INLINE_OPTIONS)
def stratified_find(sumt, limit, state, idx, u):
    """Stratified proportional draws: ``idx[i]`` is the slot holding mass ``(i + r_i) * total / B``.

    ``u`` (float64[B]) is scratch. All B searches descend one level per pass, so the cache misses
    of different draws overlap. At each node the search goes right when its mass is past the left
    subtree and the right subtree is not empty, or when the left subtree is empty; so it always
    ends on a leaf with positive mass, whatever the rounding. ``limit`` (>= 1, from
    :func:`live_limit`): a slot at or past it becomes ``limit - 1``. A consistent tree never
    needs that (slots past the live rows have mass 0); it keeps every slot inside the arrays
    whatever the tree holds.
    """
    p = sumt.shape[0] // 2
    batch = idx.shape[0]
    seg = sumt[1] / batch
    key = state[0]
    ctr = state[1]
    for i in range(batch):
        r = mix64(key + ctr * GOLDEN)
        ctr += _ONE
        u[i] = (i + np.float64(r >> _S11) * _INV53) * seg
        idx[i] = 1
    state[1] = ctr
    width = p
    while width > 1:
        for i in range(batch):
            left = 2 * idx[i]
            sl = sumt[left]
            if sl <= 0.0 or (u[i] >= sl and sumt[left + 1] > 0.0):
                u[i] -= sl
                idx[i] = left + 1
            else:
                idx[i] = left
        width >>= 1
    last = limit - 1
    for i in range(batch):
        idx[i] = min(idx[i] - p, last)


@njit(**INLINE_OPTIONS)
def is_weights(sumt, mint, idx, beta, weights):
    """``weights[i] = (N P(i))**-beta / max_j (N P(j))**-beta = (p_min / p_i)**beta`` (float32)."""
    p = sumt.shape[0] // 2
    pmin = mint[1]
    for i in range(idx.shape[0]):
        weights[i] = (pmin / sumt[p + idx[i]]) ** beta
