"""Binary sum / min / max trees over ``P`` leaves (``P`` a power of two >= capacity), float64.

Layout: ``tree[1]`` is the root, node ``i`` has children ``2i`` and ``2i+1``, leaf of slot ``s``
is ``tree[P + s]``. Three arrays share that layout: ``sumt`` (subtree mass), ``mint`` (smallest
positive leaf, ``inf`` when empty) and ``maxt`` (largest leaf, 0 when empty); they may be
strided views of one record array (the prioritized buffer interleaves them). An empty slot has
mass 0. Parents are always recomputed from their children, never adjusted by differences, so no
rounding error accumulates: after any sequence of updates each node holds exactly what a fresh
build from the same leaves would hold.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .._config import INLINE_OPTIONS, NJIT_OPTIONS
from ._rng import GOLDEN, mix64

_ONE = np.uint64(1)
_S11 = np.uint64(11)
_INV53 = 1.0 / 9007199254740992.0  # 2**-53


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

    A slot listed twice takes its last value.
    """
    p = sumt.shape[0] // 2
    for j in range(slots.shape[0]):
        i = p + slots[j]
        _set_leaf(sumt, mint, maxt, i, values[j])
        i >>= 1
        while i >= 1:
            _pull(sumt, mint, maxt, i)
            i >>= 1


@njit(**NJIT_OPTIONS)
def tree_set_priorities(sumt, mint, maxt, slots, priorities, eps, alpha):
    """As :func:`tree_set` with leaf values ``(priorities + eps) ** alpha`` (float64[k])."""
    p = sumt.shape[0] // 2
    for j in range(slots.shape[0]):
        i = p + slots[j]
        _set_leaf(sumt, mint, maxt, i, (priorities[j] + eps) ** alpha)
        i >>= 1
        while i >= 1:
            _pull(sumt, mint, maxt, i)
            i >>= 1


@njit(**NJIT_OPTIONS)
def first_bad_priority(priorities):
    """Position of the first NaN, infinite or negative value of ``priorities``, or -1."""
    for j in range(priorities.shape[0]):
        v = priorities[j]
        if not (v >= 0.0 and v < np.inf):
            return j
    return -1


@njit(**NJIT_OPTIONS)
def first_stale(version, slots, versions):
    """Position of the first ``slots[j]`` whose write count differs from ``versions[j]``, or -1."""
    for j in range(slots.shape[0]):
        if version[slots[j]] != versions[j]:
            return j
    return -1


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
    """Set leaves ``[start, start + count)`` (no wrap) to ``value``; update ancestors level by level."""
    if count <= 0:
        return
    lo = sumt.shape[0] // 2 + start
    for i in range(lo, lo + count):
        _set_leaf(sumt, mint, maxt, i, value)
    _pull_range(sumt, mint, maxt, lo, lo + count - 1)


@njit(**NJIT_OPTIONS)
def tree_overwrite_max(sumt, mint, maxt, version, slot):
    """A new row in ``slot``: evict the old one (leaf 0, ``version[slot] += 1``), then give it the
    maximum priority over the rows still live (1.0 if none): ``tree_fill`` twice in one call."""
    i = sumt.shape[0] // 2 + slot
    _set_leaf(sumt, mint, maxt, i, 0.0)
    _pull_range(sumt, mint, maxt, i, i)
    version[slot] += 1
    value = maxt[1] if maxt[1] > 0.0 else 1.0
    _set_leaf(sumt, mint, maxt, i, value)
    _pull_range(sumt, mint, maxt, i, i)


@njit(**NJIT_OPTIONS)
def tree_fill_values(sumt, mint, maxt, start, values):
    """Set leaves ``[start, start + len(values))`` (no wrap) to ``values``; update ancestors."""
    count = values.shape[0]
    if count <= 0:
        return
    lo = sumt.shape[0] // 2 + start
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
def stratified_find(sumt, state, idx, u):
    """Stratified proportional draws: ``idx[i]`` is the slot holding mass ``(i + r_i) * total / B``.

    ``u`` (float64[B]) is scratch. All B searches descend one level per pass, so the cache misses
    of different draws overlap. At each node the search goes right when its mass is past the left
    subtree and the right subtree is not empty, or when the left subtree is empty; so it always
    ends on a leaf with positive mass, whatever the rounding.
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
    for i in range(batch):
        idx[i] -= p


@njit(**INLINE_OPTIONS)
def is_weights(sumt, mint, idx, beta, weights):
    """``weights[i] = (N P(i))**-beta / max_j (N P(j))**-beta = (p_min / p_i)**beta`` (float32)."""
    p = sumt.shape[0] // 2
    pmin = mint[1]
    for i in range(idx.shape[0]):
        weights[i] = (pmin / sumt[p + idx[i]]) ** beta
