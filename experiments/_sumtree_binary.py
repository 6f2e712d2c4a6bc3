"""Binary sum/min/max tree kernels, a candidate of ``sumtree_shape.py`` (see ``_sumtree_candidates``
for the arguments every shape shares): an implicit array, root at 1, children of i at 2i and 2i+1,
leaves at P..2P-1 with P the next power of two >= capacity.
"""

from __future__ import annotations

from numba import njit

# ---------------------------------------------------------------------------------------------
# Binary kernels (implicit heap: root 1, children 2i / 2i+1, leaves P..2P-1)
# ---------------------------------------------------------------------------------------------
@njit(cache=True, nogil=True)
def _log2(P):
    """Depth of a binary tree with P leaves (P a power of two)."""
    d = 0
    while (1 << d) < P:
        d += 1
    return d


@njit(cache=True, nogil=True)
def bin_build(s, mn, mx, P):
    """Leaves already in [P, 2P) of the three arrays; fills every internal node."""
    for i in range(P - 1, 0, -1):
        a = s[2 * i]
        b = s[2 * i + 1]
        s[i] = a + b
        a = mn[2 * i]
        b = mn[2 * i + 1]
        mn[i] = a if a < b else b
        a = mx[2 * i]
        b = mx[2 * i + 1]
        mx[i] = a if a > b else b


@njit(cache=True, nogil=True)
def bin_sample(s, P, R, out_idx, out_p, u, pos):
    """Stratified sample, the whole batch descending one level per pass."""
    depth = _log2(P)
    m, B = R.shape
    for t in range(m):
        scale = s[1] / B
        for b in range(B):
            u[b] = (b + R[t, b]) * scale
            pos[b] = 1
        for _ in range(depth):
            for b in range(B):
                c = 2 * pos[b]
                left = s[c]
                x = u[b]
                # x >= 0, so x < left implies left > 0; a zero right subtree is never entered
                if x < left or s[c + 1] <= 0.0:
                    pos[b] = c
                else:
                    u[b] = x - left
                    pos[b] = c + 1
        for b in range(B):
            out_idx[t, b] = pos[b] - P
            out_p[t, b] = s[pos[b]]


@njit(cache=True, nogil=True)
def bin_sample_one(s, P, R, out_idx, out_p, u, pos):
    """Control: each draw descends root to leaf before the next one starts."""
    depth = _log2(P)
    m, B = R.shape
    for t in range(m):
        scale = s[1] / B
        for b in range(B):
            x = (b + R[t, b]) * scale
            i = 1
            for _ in range(depth):
                c = 2 * i
                left = s[c]
                if x < left or s[c + 1] <= 0.0:
                    i = c
                else:
                    x -= left
                    i = c + 1
            out_idx[t, b] = i - P
            out_p[t, b] = s[i]


@njit(cache=True, nogil=True)
def bin_sample_bl(s, P, R, out_idx, out_p, u, pos):
    """``bin_sample`` without a data-dependent branch: the direction is computed as 0/1."""
    depth = _log2(P)
    m, B = R.shape
    for t in range(m):
        scale = s[1] / B
        for b in range(B):
            u[b] = (b + R[t, b]) * scale
            pos[b] = 1
        for _ in range(depth):
            for b in range(B):
                c = 2 * pos[b]
                left = s[c]
                x = u[b]
                g = (x >= left) & (s[c + 1] > 0.0)  # 1 = go right
                u[b] = x - left * g
                pos[b] = c + g
        for b in range(B):
            out_idx[t, b] = pos[b] - P
            out_p[t, b] = s[pos[b]]


@njit(cache=True, nogil=True)
def bin_sample_one_bl(s, P, R, out_idx, out_p, u, pos):
    """Branchless, one draw at a time: every level waits for the previous load."""
    depth = _log2(P)
    m, B = R.shape
    for t in range(m):
        scale = s[1] / B
        for b in range(B):
            x = (b + R[t, b]) * scale
            i = 1
            for _ in range(depth):
                c = 2 * i
                left = s[c]
                g = (x >= left) & (s[c + 1] > 0.0)
                x = x - left * g
                i = c + g
            out_idx[t, b] = i - P
            out_p[t, b] = s[i]


@njit(cache=True, nogil=True)
def bin_update(s, P, IDX, PR, pos):
    """Set B leaves, then recompute their ancestors level by level (sum tree only)."""
    depth = _log2(P)
    m, B = IDX.shape
    for t in range(m):
        for b in range(B):
            i = IDX[t, b] + P
            s[i] = PR[t, b]
            pos[b] = i >> 1
        for _ in range(depth):
            for b in range(B):
                i = pos[b]
                s[i] = s[2 * i] + s[2 * i + 1]
                pos[b] = i >> 1


@njit(cache=True, nogil=True)
def bin_update_one(s, P, IDX, PR, pos):
    """Control: each leaf walks up to the root before the next one is set."""
    m, B = IDX.shape
    for t in range(m):
        for b in range(B):
            i = IDX[t, b] + P
            s[i] = PR[t, b]
            i >>= 1
            while i >= 1:
                s[i] = s[2 * i] + s[2 * i + 1]
                i >>= 1


@njit(cache=True, nogil=True)
def bin_update_fused(s, mn, mx, P, IDX, PR, pos):
    """``bin_update`` maintaining the sum, min and max trees in the same pass."""
    depth = _log2(P)
    m, B = IDX.shape
    for t in range(m):
        for b in range(B):
            i = IDX[t, b] + P
            p = PR[t, b]
            s[i] = p
            mn[i] = p
            mx[i] = p
            pos[b] = i >> 1
        for _ in range(depth):
            for b in range(B):
                i = pos[b]
                c = 2 * i
                s[i] = s[c] + s[c + 1]
                a = mn[c]
                d = mn[c + 1]
                mn[i] = a if a < d else d
                a = mx[c]
                d = mx[c + 1]
                mx[i] = a if a > d else d
                pos[b] = i >> 1


@njit(cache=True, nogil=True)
def bin_update_fused_one(s, mn, mx, P, IDX, PR, pos):
    """Control: ``bin_update_fused`` one leaf at a time (each walks up to the root)."""
    m, B = IDX.shape
    for t in range(m):
        for b in range(B):
            i = IDX[t, b] + P
            p = PR[t, b]
            s[i] = p
            mn[i] = p
            mx[i] = p
            i >>= 1
            while i >= 1:
                c = 2 * i
                s[i] = s[c] + s[c + 1]
                a = mn[c]
                d = mn[c + 1]
                mn[i] = a if a < d else d
                a = mx[c]
                d = mx[c + 1]
                mx[i] = a if a > d else d
                i >>= 1
