"""Column statistics: count, mean, sum of squared deviations, min and max of one field, per element.

A field's values reach these kernels as its storage hands them out (``Storage.column``), a
``(rows, k)`` view, ``k`` the number of elements of one row (4 for ``f4[4]``, 1 for a scalar),
made an *operand* by :func:`operand`: the view ``x`` itself, any stride (typed as a strided
array: callers take the kernels through :func:`tfdata.kernels.strided` with :data:`STRIDED`),
and ``flat``, its ``rows * k`` values as a C-contiguous 1-D array when the field is a column of
its own, else an empty array of its dtype. A pass reads ``flat`` when it holds the values
(the fast form), else ``x`` (strided rows). So each kernel compiles once per dtype, both forms
in one specialization, and gives bit-identical results for both: the order of every
floating-point operation is fixed by the code below, never by the form, the machine's vector
width or the layout.

**Lanes.** A pass over rows ``[a, b)`` spreads the values over ``L = k * r`` lanes
(:func:`lane_count`, ``L >= 32``): lane ``q * k + j`` takes element ``j`` of rows ``a + q``,
``a + q + r``, ``a + q + 2r``, ... in that order, and keeps ``sum(x - K_j)``,
``sum((x - K_j) ** 2)``, the min and the max, where the shift ``K_j`` is element ``j`` of row
``a``. The lanes are independent, so LLVM vectorises the pass over them without reordering any
sum (no fast-math: that would let the order depend on the vector width). A contiguous column is
read as ``rows * k`` consecutive values, ``GROUPS * L`` at a time (each lane's sums stay in
registers across the groups); numba's SLP vectoriser is off, so independent scalar
accumulators would stay scalar, several times slower (docs/design/columns.md, "Measured"). A
strided field is read one element at a time
(see :func:`_lane_pass_strided`). The lanes are then added per element in lane order: ``mean = K + S / n`` and
``M2 = Q - S * S / n`` (the "shifted data" form; with the shift a value of the same rows its
relative error is about ``eps * (K - mean) ** 2 / var``).

**Non-finite values.** The pass assumes finite values; if an element's sums come out NaN or
infinite, that element is computed again by a slow loop with numpy's semantics: any NaN makes
mean, M2, min and max NaN; otherwise +inf / -inf make the mean +inf, -inf (or NaN with both)
and M2 NaN, and are the max / min. Finite values whose squares overflow give M2 = inf.

**Merges.** Two sets of rows combine by Chan et al.'s formula
(``mean = ma + d * nb / n``, ``M2 = M2a + M2b + d * d * na * nb / n``, ``d = mb - ma``), with the
min and max NaN-sticky; a non-finite mean combines as a weighted mean and gives M2 NaN.

**The statistics tree** of a field (:func:`stats_ranges`, :func:`stats_dirty`): leaves are
blocks of ``block`` rows (:func:`block_rows`), node ``P + b`` holding the statistics of the
live rows of block ``b`` (those below ``live``: a block past them is empty), node ``i`` the
merge of ``2i`` and ``2i + 1``, the root at 1. Every node is always recomputed from its
children or from its rows, never adjusted by a difference, so no rounding error accumulates
and the tree after any sequence of updates equals a fresh build from the same rows, bit for
bit. Arrays: ``cnt`` int64[2P] (rows under each node), ``vals`` float64[2P, 4, k] (mean, M2, min,
max), ``dirty`` uint8[2P], ``lanes`` float64[LANE_ROWS, L] (scratch: S, Q, min, max, shift, then
room for the lanes of one element of a strided field), ``out`` float64[5, k] (mean, var, std,
min, max).

Whatever the arrays and arguments hold, no kernel reads or writes outside them: shapes are
checked at entry (a kernel returns -1 and changes nothing when they disagree) and ranges are
clamped. References: ``column_stats_naive`` (of :func:`column_scan_ranges`) and
``stats_tree_naive`` in ``tests/naive.py``.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .._config import INLINE_OPTIONS, NJIT_OPTIONS
from ._strided import strided  # noqa: F401 (the callers' way to these kernels)

#: lanes of a pass at least (a multiple of k): enough independent sums for an AVX2 / AVX-512 loop
MIN_LANES = 32
#: groups of lanes a pass adds at a time (the sums stay in registers across them)
GROUPS = 8
#: rows of the ``lanes`` scratch: S, Q, min, max, shift, then 5 rows for the lanes of one
#: element at a time (strided rows)
LANE_ROWS = 10
#: rows per chunk of :func:`column_scan_ranges` (one shift per chunk)
SCAN_CHUNK = 16384


def lane_count(k: int) -> int:
    """Lanes of a pass over rows of ``k`` elements: the smallest multiple of ``k`` >= 32."""
    return int(k) * -(-MIN_LANES // int(k))


def block_rows(k: int, itemsize: int) -> int:
    """Rows per leaf of a statistics tree over a field of ``k`` elements of ``itemsize`` bytes:
    256, or 1024 // itemsize for 1- and 2-byte elements, so that the tree takes about 1/8 of
    the field's bytes or less. Smaller leaves make a relabelled row cheaper to account for (its
    whole leaf is recomputed) and the tree larger; 256 rows of a scalar are 256 values, a small
    share of a pass."""
    return max(256, 1024 // int(itemsize))


def tree_leaves(capacity: int, block: int) -> int:
    """``P``: leaves of the tree, the power of two >= the number of blocks (at least 1)."""
    blocks = max(1, -(-int(capacity) // int(block)))
    return 1 << (blocks - 1).bit_length()


def tree_nbytes(capacity: int, k: int, itemsize: int) -> int:
    """Bytes of one field's tree and its scratch (cnt, vals, dirty, lanes, out)."""
    nodes = 2 * tree_leaves(capacity, block_rows(k, itemsize))
    return int(nodes * 8 + nodes * 4 * k * 8 + nodes + LANE_ROWS * lane_count(k) * 8 + 5 * k * 8)


#: the arguments of the kernels that take a field (``x``) typed as a strided array
STRIDED = (0,)


def operand(view: np.ndarray) -> tuple:
    """A ``(rows, k)`` view as the kernels take it: ``(x, flat)``, the view and its values as one
    C-contiguous 1-D array when it is C-contiguous (else an empty array of its dtype)."""
    if view.flags.c_contiguous:
        return view, view.reshape(-1)
    return view, np.zeros(0, view.dtype)


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
# rows per leaf at most: block * leaves stays far from int64 overflow
_MAX_BLOCK = 1 << 32
_S32 = np.uint64(32)


@njit(**NJIT_OPTIONS)
def first_bad_slot(idx, n, table):
    """Check slots for an in-place rewrite: -1 if every ``idx[i]`` (int64) is in ``[0, n)`` and
    none repeats an earlier one; else ``2 * i`` for the first out of range, ``2 * i + 1`` for the
    first repeat. ``table``: int64 scratch of a power-of-two size >= ``2 * len(idx)``, overwritten
    (a hash set with linear probing: O(len(idx)), no sort); -2 if it is not."""
    m = table.shape[0]
    if m == 0 or m & (m - 1) != 0 or m < 2 * idx.shape[0]:
        return -2
    for i in range(m):
        table[i] = -1
    mask = np.uint64(m - 1)
    for i in range(idx.shape[0]):
        v = idx[i]
        if v < 0 or v >= n:
            return 2 * i
        h = ((np.uint64(v) * _GOLDEN) >> _S32) & mask
        for _ in range(m):
            t = table[h]
            if t == -1:
                table[h] = v
                break
            if t == v:
                return 2 * i + 1
            h = (h + np.uint64(1)) & mask
    return -1


@njit(**INLINE_OPTIONS)
def _operand_ok(x, flat, k):
    """Whether rows of ``x`` have ``k`` elements and ``flat`` is empty or holds ``rows * k``
    values (then it is read in place of ``x``: the caller made it of the same values)."""
    return x.shape[1] >= k and (flat.shape[0] == 0 or flat.shape[0] == x.shape[0] * k)


@njit(**INLINE_OPTIONS)
def _update(lanes, v, l):
    d = v - lanes[4, l]
    lanes[0, l] += d
    lanes[1, l] += d * d
    lanes[2, l] = v if v < lanes[2, l] else lanes[2, l]
    lanes[3, l] = v if v > lanes[3, l] else lanes[3, l]


@njit(**INLINE_OPTIONS)
def _update_groups(w, lanes):
    """Add ``GROUPS`` consecutive groups of ``L`` values of ``w`` to the lanes: lane ``l`` takes
    ``w[l], w[L + l], ...`` in that order (what one group at a time would do), its sums held in
    registers across the groups (a quarter of the loads and stores of one group at a time)."""
    L = lanes.shape[1]
    S = lanes[0]
    Q = lanes[1]
    MN = lanes[2]
    MX = lanes[3]
    K = lanes[4]
    for l in range(L):
        kk = K[l]
        s = S[l]
        q = Q[l]
        mn = MN[l]
        mx = MX[l]
        for u in range(GROUPS):
            v = np.float64(w[u * L + l])
            d = v - kk
            s += d
            q += d * d
            mn = v if v < mn else mn
            mx = v if v > mx else mx
        S[l] = s
        Q[l] = q
        MN[l] = mn
        MX[l] = mx


@njit(**INLINE_OPTIONS)
def _lane_pass_flat(x, k, a, b, lanes):
    """Fill ``lanes[:5]`` (see the module docstring) from rows ``[a, b)``, ``a < b``, of a flat
    ``x``, read ``GROUPS * L`` consecutive values at a time."""
    L = lanes.shape[1]
    n = (b - a) * k  # values
    for l in range(L):
        lanes[0, l] = 0.0
        lanes[1, l] = 0.0
        lanes[2, l] = np.inf
        lanes[3, l] = -np.inf
    for j in range(k):
        lanes[4, j] = np.float64(x[a * k + j])
    for l in range(k, L):
        lanes[4, l] = lanes[4, l - k]
    span = GROUPS * L
    m = n // span
    y = x[a * k:b * k]
    for t in range(m):
        _update_groups(y[t * span:(t + 1) * span], lanes)
    for p in range(m * span, n):
        _update(lanes, np.float64(y[p]), p % L)


@njit(**INLINE_OPTIONS)
def _lane_pass_strided(x, k, a, b, lanes):
    """As :func:`_lane_pass_flat` for a 2-D ``x`` (strided rows), read one element at a time, as
    a strided 1-D view, into ``r`` lanes of its own (``lanes[5:]`` as ``(k, 5, r)``), then moved
    to lane ``q * k + j``: every lane sees the same values in the same order as in the flat
    form, and the loop over lanes stays vectorised (a copy of each row's ``k`` values first was
    twice as slow: docs/design/columns.md, "Measured")."""
    L = lanes.shape[1]
    r = L // k
    span = GROUPS * r
    m = (b - a) // span
    work = lanes[5:10].reshape(-1)
    for j in range(k):
        e = work[j * 5 * r:(j + 1) * 5 * r].reshape(5, r)
        kj = np.float64(x[a, j])
        for q in range(r):
            e[0, q] = 0.0
            e[1, q] = 0.0
            e[2, q] = np.inf
            e[3, q] = -np.inf
            e[4, q] = kj
        y = x[a:b, j]
        for t in range(m):
            _update_groups(y[t * span:(t + 1) * span], e)
        for p in range(m * span, b - a):
            _update(e, np.float64(y[p]), p % r)
        for c in range(5):
            for q in range(r):
                lanes[c, q * k + j] = e[c, q]


@njit(**INLINE_OPTIONS)
def _slow(y):
    """``(mean, M2, min, max)`` of the values of ``y`` (one element over some rows, a 1-D view)
    with numpy's semantics for NaN and infinities (the pass found a non-finite sum)."""
    nan = False
    pos = 0
    neg = 0
    fin = 0
    total = 0.0
    mn = np.inf
    mx = -np.inf
    for i in range(y.shape[0]):
        v = np.float64(y[i])
        if v != v:
            nan = True
        elif v == np.inf:
            pos += 1
        elif v == -np.inf:
            neg += 1
        else:
            fin += 1
            total += v
            mn = v if v < mn else mn
            mx = v if v > mx else mx
    if nan:
        return np.nan, np.nan, np.nan, np.nan
    if pos or neg:
        mean = np.inf if neg == 0 else (-np.inf if pos == 0 else np.nan)
        return mean, np.nan, (-np.inf if neg else mn), (np.inf if pos else mx)
    mean = total / np.float64(y.shape[0])  # finite values whose sums overflowed
    m2 = 0.0
    for i in range(y.shape[0]):
        d = np.float64(y[i]) - mean
        m2 += d * d
    return mean, m2, mn, mx


@njit(**INLINE_OPTIONS)
def _empty(cnt, vals, node, k):
    cnt[node] = 0
    for j in range(k):
        vals[node, 0, j] = 0.0
        vals[node, 1, j] = 0.0
        vals[node, 2, j] = np.inf
        vals[node, 3, j] = -np.inf


@njit(**NJIT_OPTIONS)
def _leaf(x, flat, k, a, b, lanes, cnt, vals, node):
    """Statistics of rows ``[a, b)`` (none if ``b <= a``) into ``node``: the only function that
    picks the form, ``flat`` when it holds the values, else ``x``."""
    if b <= a:
        _empty(cnt, vals, node, k)
        return
    n = b - a
    cnt[node] = n
    is_flat = flat.shape[0] > 0
    if is_flat:
        _lane_pass_flat(flat, k, a, b, lanes)
    else:
        _lane_pass_strided(x, k, a, b, lanes)
    r = lanes.shape[1] // k
    fn = np.float64(n)
    for j in range(k):
        s = 0.0
        q = 0.0
        mn = np.inf
        mx = -np.inf
        for g in range(r):
            l = g * k + j
            s += lanes[0, l]
            q += lanes[1, l]
            mn = lanes[2, l] if lanes[2, l] < mn else mn
            mx = lanes[3, l] if lanes[3, l] > mx else mx
        if math.isfinite(s) and math.isfinite(q):
            mean = lanes[4, j] + s / fn
            m2 = q - s * (s / fn)
            if m2 < 0.0:
                m2 = 0.0
        elif is_flat:
            mean, m2, mn, mx = _slow(flat[a * k + j:b * k:k])
        else:
            mean, m2, mn, mx = _slow(x[a:b, j])
        vals[node, 0, j] = mean
        vals[node, 1, j] = m2
        vals[node, 2, j] = mn
        vals[node, 3, j] = mx


@njit(**INLINE_OPTIONS)
def _merge(cnt, vals, dst, a, b, k):
    """Node ``dst`` = the merge of nodes ``a`` and ``b`` (``dst`` may be ``a``)."""
    na = cnt[a]
    nb = cnt[b]
    n = na + nb
    cnt[dst] = n
    if na == 0 or nb == 0:
        src = a if nb == 0 else b
        if src != dst:
            for c in range(4):
                for j in range(k):
                    vals[dst, c, j] = vals[src, c, j]
        return
    fa = np.float64(na)
    wb = np.float64(nb) / np.float64(n)
    wa = fa / np.float64(n)
    for j in range(k):
        ma = vals[a, 0, j]
        mb = vals[b, 0, j]
        if math.isfinite(ma) and math.isfinite(mb):
            d = mb - ma
            m2 = vals[a, 1, j] + vals[b, 1, j] + d * d * fa * wb
            mean = ma + d * wb
        else:  # inf, -inf or NaN: what numpy's mean gives; the variance is then undefined
            mean = ma * wa + mb * wb
            m2 = np.nan
        mna = vals[a, 2, j]
        mnb = vals[b, 2, j]
        mxa = vals[a, 3, j]
        mxb = vals[b, 3, j]
        vals[dst, 0, j] = mean
        vals[dst, 1, j] = m2
        vals[dst, 2, j] = mna if (mna < mnb or mna != mna) else mnb
        vals[dst, 3, j] = mxa if (mxa > mxb or mxa != mxa) else mxb


@njit(**INLINE_OPTIONS)
def _summary(cnt, vals, node, k, out):
    n = cnt[node]
    for j in range(k):
        if n == 0:
            for c in range(5):
                out[c, j] = np.nan
            continue
        var = vals[node, 1, j] / np.float64(n)
        out[0, j] = vals[node, 0, j]
        out[1, j] = var
        out[2, j] = math.sqrt(var) if var >= 0.0 else np.nan
        out[3, j] = vals[node, 2, j]
        out[4, j] = vals[node, 3, j]


@njit(**INLINE_OPTIONS)
def _leaves(x, flat, k, lanes, cnt, vals):
    """``P`` if the arrays agree with each other (a tree of ``P`` leaves over rows of ``k``
    elements), else -1."""
    L = lanes.shape[1]
    if k < 1 or L < k or L % k != 0 or lanes.shape[0] < LANE_ROWS:
        return -1
    if not _operand_ok(x, flat, k):
        return -1
    nodes = cnt.shape[0]
    P = nodes // 2
    if P < 1 or P & (P - 1) != 0 or nodes != 2 * P:
        return -1
    if vals.shape[0] < nodes or vals.shape[1] < 4 or vals.shape[2] < k:
        return -1
    return P


@njit(**NJIT_OPTIONS)
def stats_ranges(x, flat, k, live, block, lo1, hi1, lo2, hi2, lanes, cnt, vals):
    """Recompute the leaves of blocks ``[lo1, hi1)`` and ``[lo2, hi2)`` from the rows of ``x``
    below ``live``, then every ancestor of them; returns 0 (or -1 for inconsistent arrays, with
    nothing written). ``x, flat``: the field as :func:`operand` gives it, ``k`` elements per row."""
    P = _leaves(x, flat, k, lanes, cnt, vals)
    if P < 0 or block < 1 or block > _MAX_BLOCK:
        return -1
    live = max(0, min(live, x.shape[0]))
    for part in range(2):
        lo = max(lo1 if part == 0 else lo2, 0)
        hi = min(hi1 if part == 0 else hi2, P)
        if lo >= hi:
            continue
        for bl in range(lo, hi):
            a = bl * block
            _leaf(x, flat, k, a, min(a + block, live), lanes, cnt, vals, P + bl)
        lo += P
        hi += P - 1
        while lo > 1:
            lo >>= 1
            hi >>= 1
            for i in range(lo, hi + 1):
                _merge(cnt, vals, i, 2 * i, 2 * i + 1, k)
    return 0


@njit(**NJIT_OPTIONS)
def stats_dirty(x, flat, k, live, block, dirty, lanes, cnt, vals):
    """Recompute the leaves whose flag ``dirty[P + b]`` is set and every ancestor of one, and
    clear the flags; returns the leaves recomputed (-1 for inconsistent arrays)."""
    P = _leaves(x, flat, k, lanes, cnt, vals)
    if P < 0 or block < 1 or block > _MAX_BLOCK or dirty.shape[0] < 2 * P:
        return -1
    live = max(0, min(live, x.shape[0]))
    done = 0
    for bl in range(P):
        if dirty[P + bl]:
            a = bl * block
            _leaf(x, flat, k, a, min(a + block, live), lanes, cnt, vals, P + bl)
            dirty[P + bl] = 0
            dirty[(P + bl) >> 1] = 1
            done += 1
    for i in range(P - 1, 0, -1):  # children (larger numbers) before their parent
        if dirty[i]:
            _merge(cnt, vals, i, 2 * i, 2 * i + 1, k)
            dirty[i] = 0
            dirty[i >> 1] = 1
    dirty[0] = 0
    return done


@njit(**NJIT_OPTIONS)
def stats_clear(cnt, vals, dirty):
    """Every node empty, no flag set."""
    k = vals.shape[2]
    for i in range(min(cnt.shape[0], vals.shape[0])):
        _empty(cnt, vals, i, k)
    dirty[:] = 0


@njit(**NJIT_OPTIONS)
def stats_summary(cnt, vals, out):
    """``out[:, j]`` = mean, var (population: M2 / n), std, min, max of element ``j`` at the root
    (all NaN when it holds no row); returns the row count (-1 for inconsistent arrays)."""
    k = vals.shape[2]
    if cnt.shape[0] < 2 or vals.shape[0] < 2 or out.shape[0] < 5 or out.shape[1] < k:
        return -1
    _summary(cnt, vals, 1, k, out)
    return cnt[1]


@njit(**INLINE_OPTIONS)
def _scan_args_ok(x, flat, k, chunk, lanes, cnt, vals, out):
    L = lanes.shape[1]
    return not (k < 1 or L < k or L % k != 0 or lanes.shape[0] < LANE_ROWS or cnt.shape[0] < 2
                or vals.shape[0] < 2 or vals.shape[1] < 4 or vals.shape[2] < k or out.shape[0] < 5
                or out.shape[1] < k or chunk < 1 or not _operand_ok(x, flat, k))


@njit(**INLINE_OPTIONS)
def _scan_add(x, flat, k, a, b, chunk, lanes, cnt, vals):
    """Merge rows ``[a, b)`` into node 0, ``chunk`` rows at a time (each a lane pass into node 1)."""
    for s in range(a, b, chunk):
        # np.int64: a bare 1 would type as a literal, a second specialization of _leaf
        _leaf(x, flat, k, s, min(s + chunk, b), lanes, cnt, vals, np.int64(1))
        _merge(cnt, vals, 0, 0, 1, k)


@njit(**NJIT_OPTIONS)
def column_scan_ranges(x, flat, k, ranges, chunk, lanes, cnt, vals, out):
    """Statistics of the rows of ``x`` in the ranges ``ranges[i, 0] <= row < ranges[i, 1]``
    (int64[m, 2], in that order; each clamped to the rows of ``x``, an empty one skipped) into
    ``out`` (as :func:`stats_summary`): each range ``chunk`` rows at a time, each chunk a lane
    pass, merged in order. ``cnt`` int64[2] and ``vals`` float64[2, 4, k] are scratch. A whole
    column is the ranges ``[[0, n]]``. Returns the rows counted (-1 for inconsistent arrays)."""
    if not _scan_args_ok(x, flat, k, chunk, lanes, cnt, vals, out) or ranges.shape[1] < 2:
        return -1
    rows = x.shape[0]
    _empty(cnt, vals, 0, k)
    total = 0
    for i in range(ranges.shape[0]):
        a = max(0, min(ranges[i, 0], rows))
        b = max(a, min(ranges[i, 1], rows))
        _scan_add(x, flat, k, a, b, chunk, lanes, cnt, vals)
        total += b - a
    _summary(cnt, vals, 0, k, out)
    return total
