"""k-ary sum/min/max tree kernels (k = 4, 8, 16), candidates of ``sumtree_shape.py`` (see
``_sumtree_candidates`` for the arguments every shape shares): trees stored level by level, the k
children of a node contiguous, every child block starting on a multiple of k elements of a 64-byte
aligned array.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# ---------------------------------------------------------------------------------------------
# k-ary kernels. Level l starts at off[l] (off has L + 2 entries, off[L + 1] = array length);
# level 0 is the root (alone in a block of k slots), level L holds the leaves. The children of
# node p of level l are off[l + 1] + k*p ... + k - 1. k = len(kk) is a compile-time constant
# (kk is a tuple of k zeros), so every k gets its own fully specialised machine code.
# ---------------------------------------------------------------------------------------------
@njit(cache=True, nogil=True)
def _ksum(a, base, k):
    """Sum of the k children starting at ``base``."""
    x = a[base]
    for j in range(1, k):
        x += a[base + j]
    return x


@njit(cache=True, nogil=True)
def kary_build(s, mn, mx, off, kk):
    """Leaves already in the last level of the three arrays; fills every internal node."""
    k = len(kk)
    L = off.shape[0] - 2
    for l in range(L - 1, -1, -1):
        cb = off[l + 1]
        pb = off[l]
        for p in range((off[l + 2] - cb) // k):
            base = cb + k * p
            s[pb + p] = _ksum(s, base, k)
            lo = mn[base]
            hi = mx[base]
            for j in range(1, k):
                v = mn[base + j]
                if v < lo:
                    lo = v
                v = mx[base + j]
                if v > hi:
                    hi = v
            mn[pb + p] = lo
            mx[pb + p] = hi


@njit(cache=True, nogil=True)
def _kchoose(s, base, k, x):
    """Child of the node whose children start at ``base`` holding mass ``x``; returns (j, x - mass
    before j). Zero children are never chosen; if rounding puts x beyond the last child, the last
    non-zero child is taken and x is set to its mass (so it again takes its last non-zero child)."""
    last = 0
    for j in range(k):
        c = s[base + j]
        if c > 0.0:
            if x < c:
                return j, x
            last = j
            x -= c
    return last, s[base + last]


@njit(cache=True, nogil=True)
def kary_sample(s, off, kk, R, out_idx, out_p, u, pos):
    """Stratified sample, the whole batch descending one level per pass."""
    k = len(kk)
    L = off.shape[0] - 2
    m, B = R.shape
    for t in range(m):
        scale = s[off[0]] / B
        for b in range(B):
            u[b] = (b + R[t, b]) * scale
            pos[b] = 0
        for l in range(L):
            cb = off[l + 1]
            for b in range(B):
                q = k * pos[b]
                j, x = _kchoose(s, cb + q, k, u[b])
                u[b] = x
                pos[b] = q + j
        lb = off[L]
        for b in range(B):
            out_idx[t, b] = pos[b]
            out_p[t, b] = s[lb + pos[b]]


@njit(cache=True, nogil=True)
def kary_sample_one(s, off, kk, R, out_idx, out_p, u, pos):
    """Control: each draw descends root to leaf before the next one starts."""
    k = len(kk)
    L = off.shape[0] - 2
    m, B = R.shape
    lb = off[L]
    for t in range(m):
        scale = s[off[0]] / B
        for b in range(B):
            x = (b + R[t, b]) * scale
            i = 0
            for l in range(L):
                q = k * i
                j, x = _kchoose(s, off[l + 1] + q, k, x)
                i = q + j
            out_idx[t, b] = i
            out_p[t, b] = s[lb + i]


@njit(cache=True, nogil=True)
def _kchoose_bl(s, base, k, x):
    """Branchless ``_kchoose``: all k children are read; the chosen child is the number of
    inclusive prefix sums <= x (a zero child never ends such a run, so it is never chosen),
    capped at the last non-zero child; if x is beyond every child, x becomes +inf so that
    every lower level also takes its last non-zero child."""
    acc = 0.0
    before = 0.0
    cnt = 0
    last = 0
    for j in range(k):
        c = s[base + j]
        acc += c
        le = acc <= x
        cnt += le
        before = acc if le else before
        last = j if c > 0.0 else last
    j = cnt if cnt < last else last
    x = x - before if cnt < k else np.inf
    return j, x


@njit(cache=True, nogil=True)
def kary_sample_bl(s, off, kk, R, out_idx, out_p, u, pos):
    """``kary_sample`` choosing the child without a data-dependent branch (``_kchoose_bl``)."""
    k = len(kk)
    L = off.shape[0] - 2
    m, B = R.shape
    for t in range(m):
        scale = s[off[0]] / B
        for b in range(B):
            u[b] = (b + R[t, b]) * scale
            pos[b] = 0
        for l in range(L):
            cb = off[l + 1]
            for b in range(B):
                q = k * pos[b]
                j, x = _kchoose_bl(s, cb + q, k, u[b])
                u[b] = x
                pos[b] = q + j
        lb = off[L]
        for b in range(B):
            out_idx[t, b] = pos[b]
            out_p[t, b] = s[lb + pos[b]]


@njit(cache=True, nogil=True)
def kary_sample_one_bl(s, off, kk, R, out_idx, out_p, u, pos):
    """Branchless, one draw at a time: every level waits for the previous load."""
    k = len(kk)
    L = off.shape[0] - 2
    m, B = R.shape
    lb = off[L]
    for t in range(m):
        scale = s[off[0]] / B
        for b in range(B):
            x = (b + R[t, b]) * scale
            i = 0
            for l in range(L):
                q = k * i
                j, x = _kchoose_bl(s, off[l + 1] + q, k, x)
                i = q + j
            out_idx[t, b] = i
            out_p[t, b] = s[lb + i]


@njit(cache=True, nogil=True)
def kary_update(s, off, kk, IDX, PR, pos):
    """Set B leaves, then recompute their ancestors level by level (sum tree only)."""
    k = len(kk)
    L = off.shape[0] - 2
    m, B = IDX.shape
    lb = off[L]
    for t in range(m):
        for b in range(B):
            i = IDX[t, b]
            s[lb + i] = PR[t, b]
            pos[b] = i // k
        for l in range(L - 1, -1, -1):
            cb = off[l + 1]
            pb = off[l]
            for b in range(B):
                p = pos[b]
                s[pb + p] = _ksum(s, cb + k * p, k)
                pos[b] = p // k


@njit(cache=True, nogil=True)
def kary_update_one(s, off, kk, IDX, PR, pos):
    """Control: each leaf walks up to the root before the next one is set."""
    k = len(kk)
    L = off.shape[0] - 2
    m, B = IDX.shape
    lb = off[L]
    for t in range(m):
        for b in range(B):
            i = IDX[t, b]
            s[lb + i] = PR[t, b]
            for l in range(L - 1, -1, -1):
                i //= k
                s[off[l] + i] = _ksum(s, off[l + 1] + k * i, k)


@njit(cache=True, nogil=True)
def kary_update_fused(s, mn, mx, off, kk, IDX, PR, pos):
    """``kary_update`` maintaining the sum, min and max trees in the same pass."""
    k = len(kk)
    L = off.shape[0] - 2
    m, B = IDX.shape
    lb = off[L]
    for t in range(m):
        for b in range(B):
            i = IDX[t, b]
            p = PR[t, b]
            s[lb + i] = p
            mn[lb + i] = p
            mx[lb + i] = p
            pos[b] = i // k
        for l in range(L - 1, -1, -1):
            cb = off[l + 1]
            pb = off[l]
            for b in range(B):
                p = pos[b]
                base = cb + k * p
                x = s[base]
                lo = mn[base]
                hi = mx[base]
                for j in range(1, k):
                    x += s[base + j]
                    v = mn[base + j]
                    if v < lo:
                        lo = v
                    v = mx[base + j]
                    if v > hi:
                        hi = v
                s[pb + p] = x
                mn[pb + p] = lo
                mx[pb + p] = hi
                pos[b] = p // k


@njit(cache=True, nogil=True)
def kary_update_fused_one(s, mn, mx, off, kk, IDX, PR, pos):
    """Control: ``kary_update_fused`` one leaf at a time."""
    k = len(kk)
    L = off.shape[0] - 2
    m, B = IDX.shape
    lb = off[L]
    for t in range(m):
        for b in range(B):
            i = IDX[t, b]
            p = PR[t, b]
            s[lb + i] = p
            mn[lb + i] = p
            mx[lb + i] = p
            for l in range(L - 1, -1, -1):
                i //= k
                base = off[l + 1] + k * i
                x = s[base]
                lo = mn[base]
                hi = mx[base]
                for j in range(1, k):
                    x += s[base + j]
                    v = mn[base + j]
                    if v < lo:
                        lo = v
                    v = mx[base + j]
                    if v > hi:
                        hi = v
                s[off[l] + i] = x
                mn[off[l] + i] = lo
                mx[off[l] + i] = hi


@njit(cache=True, nogil=True)
def noop(s, off, kk, R, out_idx, out_p, u, pos):
    """Same arguments as ``kary_sample``, no work: the cost of a call from Python."""
    return
