"""Sum-tree shape for proportional prioritized replay: binary or k-ary (k = 4, 8, 16)?

A self-contained experiment (one file, parameters at the top, cleanrl style). It answers one
design question for the upcoming prioritized replay buffer: in float64, on this machine, which
tree shape samples and updates fastest?

* ``binary``: implicit array, root at 1, children of i at 2i and 2i+1, leaves at P..2P-1 with P
  the next power of two >= capacity.
* ``k4``, ``k8``, ``k16``: k-ary trees stored level by level; the k children of a node are
  contiguous and every child block starts on a multiple of k elements of a 64-byte aligned array,
  so one node's children fill half a cache line (k=4), one line (k=8) or two lines (k=16). Levels
  are only as wide as needed (no padding of the leaf level to a power of k).
* ``numpy``: the vectorised baseline one writes without numba: ``np.cumsum`` of the leaves plus
  ``np.searchsorted`` to sample, a per-level loop over the binary tree to update. A second numpy
  sampler (``numpy_descent``) descends the binary tree one level per numpy pass instead.

Operations (all kernels are ``@njit(cache=True, nogil=True)`` and allocate nothing; scratch
arrays are passed in):

* ``sample``: stratified batch of B draws, draw i targets u_i = (i + r_i) * total / B; the whole
  batch descends level by level (every draw advances one level per pass);
* ``sample_bl``: the same descent written without a data-dependent branch (the direction is
  computed as 0/1, so the CPU cannot mispredict it, but also cannot run ahead of the loads);
* ``sample_one``, ``sample_one_bl``: the controls: each draw descends root to leaf before the
  next starts;
* ``update``: B leaves set, then parents recomputed from their children level by level up to the
  root (no incremental adds, so no drift); sum tree only;
* ``update_one``: the control: each leaf walks up to the root before the next;
* ``update_fused``: like ``update`` but one pass maintains the sum, min and max trees together;
* ``update_fused_one``: the fused update one leaf at a time (a control, but also a candidate).

A shape is judged by one replay step, sample(B) + fused update(B), in kernel, each shape with its
fastest sampler and fastest fused update (level by level or one at a time, branchy or not).

Every kernel takes a 2-D block of m batches. ``kernel`` timing runs m = M batches per call (about
1 ms) and divides: what the work costs inside a larger numba kernel (all ops). ``call`` timing
runs m = 1 and times each call from Python, numba dispatch included (sample, update, fused).

Before any timing, every candidate is checked against a slow numpy reference (searchsorted on the
cumsum of the leaves) for capacities 1, 7, 33, 1000 and 2**20, with zero leaves.

    python experiments/sumtree_shape.py --quick     # < 1 minute
    python experiments/sumtree_shape.py             # the full run, < 8 minutes
    python experiments/sumtree_shape.py --seeds 0,1,2

Writes only under ``reports/sumtree/``: ``README.md``, ``results.json``, ``sumtree_shape.png``
(and numba's kernel cache in ``reports/sumtree/.numba_cache`` unless NUMBA_CACHE_DIR is set).
"""

from __future__ import annotations

import gc
import math
import os
import sys
import time

sys.dont_write_bytecode = True  # write nothing outside reports/sumtree (no __pycache__)
from _methodology import (RunRecord, SliceTimer, block_size, fmt_sig as fmt, latency_stats,  # noqa: E402
                          machine_brief, pyplot, report_dir, run_rounds, seeds_parser, write_json)

OUT_DIR = report_dir("sumtree")
os.environ.setdefault("NUMBA_CACHE_DIR", os.path.join(OUT_DIR, ".numba_cache"))

import numpy as np  # noqa: E402
from numba import njit  # noqa: E402

# ---------------------------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------------------------
EXPERIMENT = "sumtree_shape"
SHAPES = ("binary", "k4", "k8", "k16")
ARITY = {"binary": 2, "k4": 4, "k8": 8, "k16": 16}
SAMPLE_OPS = ("sample", "sample_bl", "sample_one", "sample_one_bl")
UPDATE_OPS = ("update", "update_one", "update_fused", "update_fused_one")
FUSED_OPS = ("update_fused", "update_fused_one")
OPS = SAMPLE_OPS + UPDATE_OPS              # all timed in kernel mode
CALL_OPS = ("sample", "update", "update_fused")  # also timed per call from Python
SIZES = {"full": (2**10, 2**20, 2**22), "quick": (2**10, 2**20)}
BATCHES = (32, 256)
DEFAULT_SEEDS = {"full": (0, 1, 2, 3, 4), "quick": (0,)}
ROUNDS = {"full": 4, "quick": 2}           # each candidate's budget is split in rounds; the
BUDGET_S = {"full": 0.30, "quick": 0.05}   # order of candidates changes every round (A/B/A/B)
MIN_CALLS_PER_SLICE = 3
WARMUP_CALLS = 2                           # untimed calls at the start of every slice
BLOCK_TARGET_S = 1e-3                      # kernel mode: m batches per call so a call is ~1 ms
N_ROWS = 4096                              # pre-drawn batches (uniforms, update indices/values)
ZERO_FRAC = 0.05                           # share of zero priorities in timing data
TEST_CAPACITIES = (1, 7, 33, 1000, 2**20)
TEST_BATCHES = (1, 32, 256)
TEST_SEED = 12345
ALIGN = 64                                 # bytes; one cache line
TIE_MARGIN = 0.03                          # a shape "wins" only beyond 3% and in every seed

COLORS = {"binary": "tab:blue", "k4": "tab:orange", "k8": "tab:green", "k16": "tab:red",
          "numpy": "tab:gray", "numpy_descent": "silver"}


# ---------------------------------------------------------------------------------------------
# Binary kernels (implicit heap: root 1, children 2i / 2i+1, leaves P..2P-1)
# ---------------------------------------------------------------------------------------------
@njit(cache=True, nogil=True)
def _log2(P):
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


# ---------------------------------------------------------------------------------------------
# k-ary kernels. Level l starts at off[l] (off has L + 2 entries, off[L + 1] = array length);
# level 0 is the root (alone in a block of k slots), level L holds the leaves. The children of
# node p of level l are off[l + 1] + k*p ... + k - 1. k = len(kk) is a compile-time constant
# (kk is a tuple of k zeros), so every k gets its own fully specialised machine code.
# ---------------------------------------------------------------------------------------------
@njit(cache=True, nogil=True)
def _ksum(a, base, k):
    x = a[base]
    for j in range(1, k):
        x += a[base + j]
    return x


@njit(cache=True, nogil=True)
def kary_build(s, mn, mx, off, kk):
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


# ---------------------------------------------------------------------------------------------
# Trees: allocation and build (outside timing)
# ---------------------------------------------------------------------------------------------
def aligned_full(n: int, value: float) -> np.ndarray:
    """float64 array of n elements whose first element starts a 64-byte cache line."""
    buf = np.empty(n + ALIGN // 8, dtype=np.float64)
    start = (-buf.ctypes.data % ALIGN) // 8
    a = buf[start:start + n]
    a[:] = value
    return a


def kary_offsets(n: int, k: int) -> np.ndarray:
    counts = [n]  # nodes per level, leaves first
    while counts[-1] > 1:
        counts.append(-(-counts[-1] // k))
    counts.reverse()
    sizes = [k] + [k * counts[l - 1] for l in range(1, len(counts))]
    off = np.zeros(len(sizes) + 1, dtype=np.int64)
    off[1:] = np.cumsum(sizes)
    return off


class Tree:
    """Sum, min and max trees of one shape over the same leaves."""

    def __init__(self, shape: str, leaves: np.ndarray):
        n = len(leaves)
        self.shape, self.n, self.k = shape, n, ARITY[shape]
        if shape == "binary":
            P = 1
            while P < n:
                P *= 2
            self.P, self.depth, size, lb = P, int(math.log2(P)), 2 * P, P
        else:
            self.off = kary_offsets(n, self.k)
            self.kk = (0,) * self.k
            self.depth = len(self.off) - 2
            size, lb = int(self.off[-1]), int(self.off[-2])
        self.s, self.mn, self.mx = aligned_full(size, 0.0), aligned_full(size, np.inf), \
            aligned_full(size, 0.0)
        for a in (self.s, self.mn, self.mx):
            a[lb:lb + n] = leaves
        self.lb = lb
        if shape == "binary":
            bin_build(self.s, self.mn, self.mx, self.P)
        else:
            kary_build(self.s, self.mn, self.mx, self.off, self.kk)

    @property
    def leaves(self) -> np.ndarray:
        return self.s[self.lb:self.lb + self.n]

    def copy(self) -> "Tree":
        t = object.__new__(Tree)
        t.__dict__.update(self.__dict__)
        t.s, t.mn, t.mx = (aligned_full(a.size, 0.0) for a in (self.s, self.mn, self.mx))
        t.s[:], t.mn[:], t.mx[:] = self.s, self.mn, self.mx
        return t

    @property
    def total(self) -> float:
        return float(self.s[1] if self.shape == "binary" else self.s[self.off[0]])

    @property
    def nbytes(self) -> int:  # one of the three trees
        return self.s.nbytes

    # argument tuples for the kernels (m batches per call given by the 2-D slices)
    def sample_fn(self, op):
        if self.shape == "binary":
            return {"sample": bin_sample, "sample_one": bin_sample_one,
                    "sample_bl": bin_sample_bl, "sample_one_bl": bin_sample_one_bl}[op]
        return {"sample": kary_sample, "sample_one": kary_sample_one,
                "sample_bl": kary_sample_bl, "sample_one_bl": kary_sample_one_bl}[op]

    def sample_args(self, R, OI, OP, u, pos):
        head = (self.s, self.P) if self.shape == "binary" else (self.s, self.off, self.kk)
        return head + (R, OI, OP, u, pos)

    def update_fn(self, op):
        if self.shape == "binary":
            return {"update": bin_update, "update_one": bin_update_one,
                    "update_fused": bin_update_fused, "update_fused_one": bin_update_fused_one}[op]
        return {"update": kary_update, "update_one": kary_update_one,
                "update_fused": kary_update_fused, "update_fused_one": kary_update_fused_one}[op]

    def update_args(self, op, IDX, PR, pos):
        trees = (self.s, self.mn, self.mx) if op.startswith("update_fused") else (self.s,)
        geo = (self.P,) if self.shape == "binary" else (self.off, self.kk)
        return trees + geo + (IDX, PR, pos)


class NumpyTree:
    """The vectorised numpy baseline over the binary heap layout."""

    def __init__(self, leaves: np.ndarray):
        t = Tree("binary", leaves)
        self.s, self.mn, self.mx, self.P, self.n, self.depth = t.s, t.mn, t.mx, t.P, t.n, t.depth
        self.ar = np.arange(max(max(BATCHES), max(TEST_BATCHES)), dtype=np.float64)

    @property
    def leaves(self):
        return self.s[self.P:self.P + self.n]

    def sample(self, r):
        """cumsum of the leaves (they change between samples) + searchsorted."""
        leaves = self.s[self.P:self.P + self.n]
        c = np.cumsum(leaves)
        B = r.shape[0]
        u = (self.ar[:B] + r) * (c[-1] / B)
        idx = np.searchsorted(c, u, side="right")
        if idx[-1] >= self.n:  # u is non-decreasing: only the last draws can overshoot
            idx[idx >= self.n] = np.flatnonzero(leaves)[-1]
        return idx, leaves[idx]

    def sample_descent(self, r):
        """Descend the binary tree, one numpy pass per level for the whole batch."""
        s = self.s
        B = r.shape[0]
        u = (self.ar[:B] + r) * (s[1] / B)
        i = np.ones(B, dtype=np.int64)
        for _ in range(self.depth):
            c = 2 * i
            left = s[c]
            go_left = (u < left) | (s[c + 1] <= 0.0)
            u = np.where(go_left, u, u - left)
            i = np.where(go_left, c, c + 1)
        return i - self.P, s[i]

    def update(self, idx, p):
        s = self.s
        i = idx + self.P
        s[i] = p
        for _ in range(self.depth):
            i >>= 1
            s[i] = s[2 * i] + s[2 * i + 1]

    def update_fused(self, idx, p):
        s, mn, mx = self.s, self.mn, self.mx
        i = idx + self.P
        s[i] = p
        mn[i] = p
        mx[i] = p
        for _ in range(self.depth):
            i >>= 1
            c = 2 * i
            s[i] = s[c] + s[c + 1]
            mn[i] = np.minimum(mn[c], mn[c + 1])
            mx[i] = np.maximum(mx[c], mx[c + 1])


# ---------------------------------------------------------------------------------------------
# Correctness: every candidate against a slow numpy reference, before any timing
# ---------------------------------------------------------------------------------------------
def make_ref(leaves: np.ndarray) -> tuple:
    """The slow reference's state: the leaves, their cumsum and the last non-zero leaf."""
    return leaves, np.cumsum(leaves), int(np.flatnonzero(leaves)[-1]) if leaves.any() else -1


def reference_sample(ref: tuple, total: float, r: np.ndarray) -> tuple:
    """searchsorted on the cumsum; targets computed exactly as the kernels do."""
    leaves, cs, last = ref
    B = r.shape[0]
    u = (np.arange(B, dtype=np.float64) + r) * (total / B)
    idx = np.searchsorted(cs, u, side="right")
    idx[idx >= len(leaves)] = last
    return idx, u, cs


def make_test_leaves(kind: str, cap: int, rng) -> np.ndarray:
    if cap == 1:
        return np.array([3.0 if kind == "integer" else 0.7])
    if kind == "integer":  # exact arithmetic: every sum and every subtraction is exact
        x = rng.integers(0, 11, cap).astype(np.float64)
        x[rng.random(cap) < 0.3] = 0.0
    elif kind == "real":
        x = rng.random(cap) ** 3 * 10.0 ** rng.uniform(-3, 3, cap)
        x[rng.random(cap) < 0.3] = 0.0
    else:  # one_hot: a single tiny non-zero leaf
        x = np.zeros(cap)
        x[rng.integers(0, cap)] = 1e-300
        return x
    x[0] = 0.0
    x[-1] = 0.0
    if x.sum() == 0.0:
        x[cap // 2] = 1.0
    return x


def check_sample(name, got_idx, got_p, ref_state, total, r, exact: bool, stats: dict) -> None:
    leaves = ref_state[0]
    ref, u, cs = reference_sample(ref_state, total, r)
    n = len(leaves)
    assert np.all((got_idx >= 0) & (got_idx < n)), f"{name}: index out of range"
    assert np.all(leaves[got_idx] > 0.0), f"{name}: drew a zero-priority leaf"
    assert np.array_equal(got_p, leaves[got_idx]), f"{name}: wrong priority returned"
    stats["draws"] += len(r)
    if exact:
        assert np.array_equal(got_idx, ref), f"{name}: differs from the reference (exact case)"
        return
    bad = got_idx != ref
    if bad.any():  # float rounding: allowed only when u lies at the edge of the chosen leaf
        tol = 1e-9 * total
        hi = cs[got_idx[bad]]
        lo = hi - leaves[got_idx[bad]]
        ub = u[bad]
        assert np.all((ub >= lo - tol) & (ub <= hi + tol)), f"{name}: far from the reference"
        stats["boundary_mismatches"] += int(bad.sum())


def check_all() -> dict:
    stats = {"draws": 0, "boundary_mismatches": 0, "update_checks": 0, "cases": 0}
    for cap in TEST_CAPACITIES:
        for ki, kind in enumerate(("integer", "real", "one_hot")):
            if kind == "one_hot" and cap == 1:
                continue
            rng = np.random.default_rng([TEST_SEED, cap, ki])
            leaves0 = make_test_leaves(kind, cap, rng)
            exact = kind != "real"
            ref0 = make_ref(leaves0)
            built = {shape: Tree(shape, leaves0) for shape in SHAPES}
            for shape, tree in built.items():
                root = 1 if shape == "binary" else 0
                assert tree.total > 0.0
                assert tree.mn[root] == leaves0.min() and tree.mx[root] == leaves0.max()
            for B in TEST_BATCHES:
                R = rng.random((4, B))
                R[0] = 0.0                            # u_0 = 0
                R[1] = np.nextafter(1.0, 0.0)         # u_{B-1} at (or rounding past) the total
                IDX = rng.integers(0, cap, (3, B))    # duplicates included
                if kind == "integer":
                    PR = rng.integers(0, 11, (3, B)).astype(np.float64)
                else:
                    PR = rng.random((3, B)) * 2.0
                PR[rng.random((3, B)) < 0.25] = 0.0
                ref_leaves = leaves0.copy()
                for t in range(3):
                    for b in range(B):
                        ref_leaves[IDX[t, b]] = PR[t, b]
                ref1 = make_ref(ref_leaves)
                OI = np.zeros((4, B), dtype=np.int64)
                OP = np.zeros((4, B))
                u = np.zeros(B)
                pos = np.zeros(B, dtype=np.int64)
                binary_draws = None
                for shape in SHAPES:
                    tree = built[shape]
                    draws = {}
                    for op in SAMPLE_OPS:
                        tree.sample_fn(op)(*tree.sample_args(R, OI, OP, u, pos))
                        for t in range(4):
                            check_sample(f"{shape}.{op} cap={cap} {kind} B={B}", OI[t], OP[t],
                                         ref0, tree.total, R[t], exact, stats)
                        draws[op] = OI.copy()
                    for a, b in (("sample", "sample_one"), ("sample_bl", "sample_one_bl")):
                        assert np.array_equal(draws[a], draws[b]), \
                            f"{shape}: {a} and {b} (same arithmetic) differ"
                    if shape == "binary":
                        assert np.array_equal(draws["sample"], draws["sample_bl"])
                        binary_draws = draws["sample"]
                    fresh = Tree(shape, ref_leaves)
                    for op in UPDATE_OPS:
                        tr = tree.copy()
                        tr.update_fn(op)(*tr.update_args(op, IDX, PR, pos))
                        assert np.array_equal(tr.leaves, ref_leaves), f"{shape}.{op}: leaves"
                        assert np.array_equal(tr.s, fresh.s), \
                            f"{shape}.{op} cap={cap} {kind}: sum tree differs from a rebuild"
                        if op in FUSED_OPS:
                            assert np.array_equal(tr.mn, fresh.mn), f"{shape}.{op}: min tree"
                            assert np.array_equal(tr.mx, fresh.mx), f"{shape}.{op}: max tree"
                        stats["update_checks"] += 1
                    if fresh.total > 0.0:  # sample the updated tree too
                        for op in ("sample", "sample_bl"):
                            fresh.sample_fn(op)(*fresh.sample_args(R, OI, OP, u, pos))
                            for t in range(4):
                                check_sample(f"{shape}.update+{op}", OI[t], OP[t], ref1,
                                             fresh.total, R[t], exact, stats)
                # numpy baseline
                nt = NumpyTree(leaves0)
                for t in range(4):
                    i1, p1 = nt.sample(R[t])
                    check_sample(f"numpy cap={cap} {kind}", i1, p1, ref0, nt.s[1], R[t], exact,
                                 stats)
                    i2, p2 = nt.sample_descent(R[t])
                    check_sample(f"numpy_descent cap={cap} {kind}", i2, p2, ref0, nt.s[1],
                                 R[t], exact, stats)
                    assert np.array_equal(i2, binary_draws[t]), "numpy_descent != binary kernel"
                fresh = Tree("binary", ref_leaves)
                for op in ("update", "update_fused"):
                    nt = NumpyTree(leaves0)
                    for t in range(3):
                        getattr(nt, op)(IDX[t], PR[t])
                    assert np.array_equal(nt.s, fresh.s), f"numpy.{op}: sum tree"
                    if op == "update_fused":
                        assert np.array_equal(nt.mn, fresh.mn) and np.array_equal(nt.mx, fresh.mx)
                    stats["update_checks"] += 1
                stats["cases"] += 1
    return stats


# ---------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------
class Candidate(SliceTimer):
    """One (implementation, op, mode) in one (seed, size, batch): callables and their samples."""

    def __init__(self, impl, op, mode, fn, arglist, per_call):
        super().__init__(fn, arglist, per_call,  # per_call: batches per call
                         warmup=WARMUP_CALLS, min_calls=MIN_CALLS_PER_SLICE)
        self.impl, self.op, self.mode = impl, op, mode


def make_candidates(trees, ntree, R, OI, OP, IDX, PR, u, pos) -> list[Candidate]:
    cands = []
    for shape, tree in trees.items():
        for op in OPS:
            if op.startswith("sample"):
                fn = tree.sample_fn(op)

                def mk(s, m, tree=tree):
                    return tree.sample_args(R[s:s + m], OI[s:s + m], OP[s:s + m], u, pos)
            else:
                fn = tree.update_fn(op)

                def mk(s, m, tree=tree, op=op):
                    return tree.update_args(op, IDX[s:s + m], PR[s:s + m], pos)
            if op in CALL_OPS:
                cands.append(Candidate(shape, op, "call", fn, [mk(s, 1) for s in range(N_ROWS)],
                                       1))
            M = block_size(fn, mk, BLOCK_TARGET_S, N_ROWS)
            cands.append(Candidate(shape, op, "kernel", fn,
                                   [mk(s, M) for s in range(0, N_ROWS, M)], M))
    cands.append(Candidate("numpy", "sample", "call", ntree.sample,
                           [(R[s],) for s in range(N_ROWS)], 1))
    cands.append(Candidate("numpy_descent", "sample", "call", ntree.sample_descent,
                           [(R[s],) for s in range(N_ROWS)], 1))
    for op in ("update", "update_fused"):
        cands.append(Candidate("numpy", op, "call", getattr(ntree, op),
                               [(IDX[s], PR[s]) for s in range(N_ROWS)], 1))
    t = trees["k8"]
    cands.append(Candidate("floor", "noop", "call", noop,
                           [(t.s, t.off, t.kk, R[s:s + 1], OI[s:s + 1], OP[s:s + 1], u, pos)
                            for s in range(N_ROWS)], 1))
    return cands


def stats_of(times_ns: list[float]) -> dict:
    s = latency_stats(times_ns)
    return {"count": s["n"], **{k: s[k] for k in ("median_us", "p99_us", "mean_us", "min_us")}}


def run_seed(seed: int, mode: str, log) -> list[dict]:
    rows = []
    for n in SIZES[mode]:
        rng = np.random.default_rng([seed, n])
        leaves = rng.random(n)
        leaves[rng.random(n) < ZERO_FRAC] = 0.0
        t0 = time.perf_counter()
        trees = {shape: Tree(shape, leaves) for shape in SHAPES}
        ntree = NumpyTree(leaves)
        build_s = time.perf_counter() - t0
        for B in BATCHES:
            rng = np.random.default_rng([seed, n, B])
            R = rng.random((N_ROWS, B))
            IDX = rng.integers(0, n, (N_ROWS, B))
            PR = rng.random((N_ROWS, B))
            PR[rng.random((N_ROWS, B)) < ZERO_FRAC] = 0.0
            OI = np.zeros((N_ROWS, B), dtype=np.int64)
            OP = np.zeros((N_ROWS, B))
            u = np.zeros(B)
            pos = np.zeros(B, dtype=np.int64)
            load0 = os.getloadavg()
            cands = make_candidates(trees, ntree, R, OI, OP, IDX, PR, u, pos)
            run_rounds(cands, ROUNDS[mode], int(BUDGET_S[mode] / ROUNDS[mode] * 1e9),
                       lambda rnd: rnd * 7 + seed * 3)
            for c in cands:
                rows.append({"seed": seed, "n": n, "batch": B, "impl": c.impl, "op": c.op,
                             "mode": c.mode, "batches_per_call": c.per_call,
                             **stats_of(c.times_ns)})
            log(f"  seed {seed}  n=2^{int(math.log2(n))}  B={B}: {len(cands)} candidates, "
                f"load {load0[0]:.2f} -> {os.getloadavg()[0]:.2f}, build {build_s:.2f} s")
        del trees, ntree
        gc.collect()
    return rows


def software_brief(run: dict) -> dict:
    """This report's software keys, from the environment the run recorded."""
    sw = run["environment"]["software"]
    return {"python": sw["python"], "numpy": sw["numpy"], "numba": sw["numba"],
            "llvmlite": sw["llvmlite"], "git_commit": sw["git"]["commit"],
            "git_dirty_tracked_files": sw["git"]["dirty"],
            "numba_env": [k for k in sw["env_vars_set"] if k.startswith("NUMBA_")]}


# ---------------------------------------------------------------------------------------------
# Aggregation
# ---------------------------------------------------------------------------------------------
def numpy_op(op: str) -> str:
    if op.startswith("sample"):
        return "sample"
    return "update_fused" if op.startswith("update_fused") else "update"


def aggregate(rows: list[dict], seeds) -> dict:
    """Per (n, batch, impl, op, mode): median over seeds of the per-seed medians and p99s, plus
    per-seed ratios (same seed, same data, interleaved in time) against binary and numpy."""
    idx = {(r["seed"], r["n"], r["batch"], r["impl"], r["op"], r["mode"]): r for r in rows}
    keys = sorted({(r["n"], r["batch"], r["impl"], r["op"], r["mode"]) for r in rows}, key=str)
    out = {}
    for (n, B, impl, op, mode) in keys:
        per = [idx[(s, n, B, impl, op, mode)] for s in seeds]
        e = {"n": n, "batch": B, "impl": impl, "op": op, "mode": mode,
             "median_us": float(np.median([p["median_us"] for p in per])),
             "p99_us": float(np.median([p["p99_us"] for p in per])),
             "median_us_per_seed": [p["median_us"] for p in per],
             "p99_us_per_seed": [p["p99_us"] for p in per],
             "samples_per_seed": [p["count"] for p in per],
             "batches_per_call": [p["batches_per_call"] for p in per]}
        if impl in SHAPES:
            rb = [p["median_us"] / idx[(s, n, B, "binary", op, mode)]["median_us"]
                  for s, p in zip(seeds, per)]
            e["vs_binary"] = float(np.median(rb))
            e["vs_binary_per_seed"] = rb
            # numpy speedup = numpy's time per call / this time (numpy has one mode: call)
            rn = [idx[(s, n, B, "numpy", numpy_op(op), "call")]["median_us"] / p["median_us"]
                  for s, p in zip(seeds, per)]
            e["numpy_speedup"] = float(np.median(rn))
        out[f"{n}|{B}|{impl}|{op}|{mode}"] = e
    return out


def get(agg, n, B, impl, op, mode="kernel", field="median_us"):
    e = agg.get(f"{n}|{B}|{impl}|{op}|{mode}")
    return None if e is None else e.get(field)


def best_op(agg, n, B, shape, ops) -> str:
    """The shape's fastest implementation among ``ops`` (in-kernel medians)."""
    return min(ops, key=lambda op: get(agg, n, B, shape, op))


def step_cost(agg, n, B, shape, seed_i=None):
    """One prioritized-replay step in kernel: the shape's fastest sampler (of the four) plus its
    fastest fused update (of the two), median µs (or one seed's medians of the same two)."""
    ops = (best_op(agg, n, B, shape, SAMPLE_OPS), best_op(agg, n, B, shape, FUSED_OPS))
    es = [agg[f"{n}|{B}|{shape}|{op}|kernel"] for op in ops]
    if seed_i is None:
        return sum(e["median_us"] for e in es)
    return sum(e["median_us_per_seed"][seed_i] for e in es)


def verdicts(agg, sizes, seeds) -> dict:
    """Per (n, batch): which shape has the cheapest step, and is it a clear win?"""
    out = {}
    for n in sizes:
        for B in BATCHES:
            costs = {s: step_cost(agg, n, B, s) for s in SHAPES}
            best = min(costs, key=costs.get)
            runner = min((s for s in SHAPES if s != best), key=costs.get)
            clear = all(step_cost(agg, n, B, best, i) * (1 + TIE_MARGIN)
                        < step_cost(agg, n, B, runner, i) for i in range(len(seeds)))
            out[f"{n}|{B}"] = {"n": n, "batch": B, "step_us": costs, "best": best,
                               "sampler": {s: best_op(agg, n, B, s, SAMPLE_OPS) for s in SHAPES},
                               "updater": {s: best_op(agg, n, B, s, FUSED_OPS) for s in SHAPES},
                               "runner_up": runner, "clear": clear,
                               "best_vs_binary": costs[best] / costs["binary"],
                               "runner_vs_best": costs[runner] / costs[best]}
    return out


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------
def size_label(n):
    return f"2^{int(math.log2(n))}" if n > 1 else "1"


def plot(agg, sizes, run_name, path) -> None:
    from matplotlib.lines import Line2D

    plt = pyplot()

    fig, axes = plt.subplots(2, 3, figsize=(16, 9.2))
    x = list(range(len(sizes)))  # evenly spaced categories (2^20 and 2^22 would collide)
    ls = {BATCHES[0]: "--", BATCHES[-1]: "-"}

    def setup(ax, title, log):
        ax.set_xticks(x)
        ax.set_xticklabels([f"{size_label(n)} leaves" for n in sizes])
        ax.grid(True, which="both", alpha=0.3)
        ax.set_title(title, fontsize=10)
        if log:
            ax.set_yscale("log")
        else:
            ax.axhline(1.0, color="black", lw=0.8)

    # (0, 0): absolute cost of one step, numpy and call floor for scale
    ax = axes[0][0]
    for B in BATCHES:
        for shape in SHAPES:
            ax.plot(x, [step_cost(agg, n, B, shape) for n in sizes], ls[B], marker="o",
                    color=COLORS[shape], lw=1.8)
        ax.plot(x, [get(agg, n, B, "numpy", "sample", "call")
                    + get(agg, n, B, "numpy", "update_fused", "call") for n in sizes], ls[B],
                marker="s", color=COLORS["numpy"], lw=1.2)
    ax.plot(x, [get(agg, n, BATCHES[-1], "floor", "noop", "call") for n in sizes], ":",
            color="black", lw=1)
    setup(ax, "one replay step: sample + fused update (best implementation\nper shape), "
          "median µs in kernel (numpy: per call)",
          True)
    ax.set_ylabel("µs (log scale)")
    # (0, 1): the same relative to binary
    ax = axes[0][1]
    for B in BATCHES:
        for shape in SHAPES:
            ax.plot(x, [step_cost(agg, n, B, shape) / step_cost(agg, n, B, "binary")
                        for n in sizes], ls[B], marker="o", color=COLORS[shape], lw=1.8)
    setup(ax, "one replay step, time / binary's time\n(< 1: faster than binary)", False)
    panels = [(axes[0][2], ("sample",), "sample, level by level, branchy"),
              (axes[1][0], ("sample_bl",), "sample, level by level, branchless"),
              (axes[1][1], ("update",), "update, sum tree only"),
              (axes[1][2], ("update_fused",), "update, sum + min + max fused")]
    for ax, (op,), title in panels:
        ref_op = "sample" if op.startswith("sample") else op
        for B in BATCHES:
            for shape in SHAPES:
                ax.plot(x, [get(agg, n, B, shape, op) / get(agg, n, B, "binary", ref_op)
                            for n in sizes], ls[B], marker="o", color=COLORS[shape], lw=1.8)
        setup(ax, f"{title}\nin-kernel time / binary's"
              + (" branchy sample" if op == "sample_bl" else "") + " time", False)
    for ax in axes[0][1], axes[0][2], axes[1][0]:
        ax.set_ylabel("ratio") if ax is axes[1][0] else None
    h = [Line2D([], [], color=COLORS[s], lw=2, marker="o", label=s) for s in SHAPES]
    h += [Line2D([], [], color=COLORS["numpy"], marker="s", label="numpy baseline"),
          Line2D([], [], color="gray", lw=1.8, ls="-", label=f"batch {BATCHES[-1]}"),
          Line2D([], [], color="gray", lw=1.8, ls="--", label=f"batch {BATCHES[0]}"),
          Line2D([], [], color="black", ls=":", lw=1, label="numba no-op call from Python")]
    fig.legend(handles=h, loc="lower center", ncol=8, fontsize=9.5, frameon=False)
    fig.suptitle(f"Sum-tree shape, float64: median time per batch (medians over seeds)   "
                 f"[{run_name}]", fontsize=11)
    fig.tight_layout(rect=(0, 0.04, 1, 0.97))
    fig.savefig(path, dpi=100)
    plt.close(fig)


def cache_bytes(machine, level) -> int | None:
    for c in machine["caches_cpu0_sysfs"]:
        if c.get("level") == str(level) and c.get("type") in ("Unified", "Data"):
            sz = c.get("size", "")
            if sz.endswith("K"):
                return int(sz[:-1]) * 1024
            if sz.endswith("M"):
                return int(sz[:-1]) << 20
    return None


def mib(x):
    return f"{x / 2**20:.1f} MiB" if x >= 2**20 else f"{x / 1024:.0f} KiB"


SHORT = {"sample": "lvl", "sample_bl": "lvl-bl", "sample_one": "one", "sample_one_bl": "one-bl",
         "update_fused": "lvl", "update_fused_one": "one"}
OP_TITLES = {
    "sample": "sample: stratified, whole batch descends level by level, branchy",
    "sample_bl": "sample_bl: the same, branchless (direction computed as 0/1)",
    "sample_one": "sample_one: one draw root-to-leaf at a time, branchy (control)",
    "sample_one_bl": "sample_one_bl: one draw at a time, branchless (control)",
    "update": "update: set B leaves, recompute parents level by level (sum tree only)",
    "update_one": "update_one: each leaf walks to the root before the next (control)",
    "update_fused": "update_fused: sum, min and max trees in one pass, level by level",
    "update_fused_one": "update_fused_one: the same, one leaf at a time (control)",
}


def write_report(res: dict, path: str) -> None:
    agg, meth, sizes = res["summary"], res["methodology"], res["sizes"]
    seeds = meth["seeds"]
    ver = res["verdicts"]
    machine, sw = meth["machine"], meth["software"]
    L = []
    w = L.append
    w("# Sum-tree shape for prioritized replay: binary or k-ary?\n")
    w(f"> Produced by the **{meth['mode']}** run `{meth['run_name']}` "
      f"({len(seeds)} seed{'s' * (len(seeds) > 1)}, {meth['wall_s']:.0f} s wall clock, started "
      f"{meth['started_utc']}). Every number below comes from that run (`results.json`); rerunning "
      f"overwrites this directory. The text of this file is generated by the script.\n")

    w("## Answer\n")
    w(res["conclusion"] + "\n")
    hn = 2**20 if 2**20 in sizes else sizes[-1]
    fl = get(agg, hn, 256, "floor", "noop", "call")
    w(f"### Headline: {size_label(hn)} leaves, batch 256\n")
    w(f"Median µs per batch of 256. *In kernel* = the work alone (M batches per call, time / M), "
      f"what it costs inside a larger numba kernel; *per call* = one call from Python, numba "
      f"dispatch included (a no-op call with the same arguments: {fmt(fl)} µs). [x] = time / "
      f"binary's time in the same column (median of per-seed ratios; < 1 is faster than "
      f"binary).\n")
    w("| shape | sample in kernel (branchy) | sample in kernel (branchless) | sample per call "
      "(branchy) | update in kernel | update per call | fused update in kernel | fused update "
      "per call |")
    w("|---|---:|---:|---:|---:|---:|---:|---:|")

    def cell(impl, op, mode="kernel", ratio=True):
        v = get(agg, hn, 256, impl, op, mode)
        if v is None:
            return "-"
        r = get(agg, hn, 256, impl, op, mode, "vs_binary")
        return fmt(v) + (f" [{r:.2f}]" if ratio and r is not None else "")

    for shape in SHAPES:
        w(f"| {shape} | {cell(shape, 'sample')} | {cell(shape, 'sample_bl')} | "
          f"{cell(shape, 'sample', 'call')} | {cell(shape, 'update')} | "
          f"{cell(shape, 'update', 'call')} | {cell(shape, 'update_fused')} | "
          f"{cell(shape, 'update_fused', 'call')} |")
    w(f"| numpy | | | {cell('numpy', 'sample', 'call')} (cumsum + searchsorted) | | "
      f"{cell('numpy', 'update', 'call')} | | {cell('numpy', 'update_fused', 'call')} |")
    w(f"| numpy, per-level descent | | | {cell('numpy_descent', 'sample', 'call')} | | | | |\n")

    w("### The criterion: one replay step\n")
    w("In-kernel median µs of one prioritized-replay step = the shape's fastest sampler + its "
      "fastest fused sum/min/max update, same batch; in brackets which ones (`lvl` = batch level "
      "by level, `one` = one draw / one leaf at a time, `bl` = branchless). Each shape is judged "
      "by its best implementation here:\n")
    w("| leaves | batch | " + " | ".join(SHAPES) + " | fastest | fastest / binary | "
      "runner-up / fastest | clear? |")
    w("|---|---:|" + "---:|" * len(SHAPES) + "---|---:|---:|---|")
    for n in sizes:
        for B in BATCHES:
            v = ver[f"{n}|{B}"]
            cells = [f"{fmt(v['step_us'][s])} ({SHORT[v['sampler'][s]]} + "
                     f"{SHORT[v['updater'][s]]})" for s in SHAPES]
            w(f"| {size_label(n)} | {B} | " + " | ".join(cells)
              + f" | **{v['best']}** | {v['best_vs_binary']:.2f} | {v['runner_vs_best']:.2f} "
              f"({v['runner_up']}) | {'yes' if v['clear'] else 'no'} |")
    w(f"\n*clear* = the fastest shape's step is more than {TIE_MARGIN:.0%} cheaper than the "
      f"runner-up's in every seed.\n")

    w("## All results\n")
    w("In kernel: median µs per batch (median over seeds of per-seed medians) [time / binary's "
      "time]; numpy column: numpy's per-call median for the same operation. Per call: median / "
      "p99 µs and (x) = numpy's per-call time / this one (how many times faster than numpy).\n")
    for op in OPS:
        w(f"### {OP_TITLES[op]}\n")
        w("| leaves | batch | " + " | ".join(SHAPES) + " | numpy (per call) |")
        w("|---|---:|" + "---:|" * (len(SHAPES) + 1))
        for n in sizes:
            for B in BATCHES:
                cells = [f"{fmt(get(agg, n, B, s, op))} "
                         f"[{get(agg, n, B, s, op, field='vs_binary'):.2f}]" for s in SHAPES]
                w(f"| {size_label(n)} | {B} | " + " | ".join(cells) +
                  f" | {fmt(get(agg, n, B, 'numpy', numpy_op(op), 'call'))} |")
        if op in CALL_OPS:
            w("\nPer call from Python: median / p99 µs [median / binary's median] (x faster "
              "than numpy):\n")
            w("| leaves | batch | " + " | ".join(SHAPES) + " |")
            w("|---|---:|" + "---:|" * len(SHAPES))
            for n in sizes:
                for B in BATCHES:
                    cells = [f"{fmt(get(agg, n, B, s, op, 'call'))} / "
                             f"{fmt(get(agg, n, B, s, op, 'call', 'p99_us'))} "
                             f"[{get(agg, n, B, s, op, 'call', 'vs_binary'):.2f}] "
                             f"({get(agg, n, B, s, op, 'call', 'numpy_speedup'):.1f}x)"
                             for s in SHAPES]
                    w(f"| {size_label(n)} | {B} | " + " | ".join(cells) + " |")
        w("")

    w("### numpy baselines and the call floor, per call (median / p99 µs)\n")
    w("| leaves | batch | numpy sample (cumsum + searchsorted) | numpy per-level descent | "
      "numpy update (per-level loop) | numpy fused update | numba no-op call |")
    w("|---|---:|---:|---:|---:|---:|---:|")
    pairs = (("numpy", "sample"), ("numpy_descent", "sample"), ("numpy", "update"),
             ("numpy", "update_fused"), ("floor", "noop"))
    for n in sizes:
        for B in BATCHES:
            w(f"| {size_label(n)} | {B} | " + " | ".join(
                f"{fmt(get(agg, n, B, i, o, 'call'))} / {fmt(get(agg, n, B, i, o, 'call', 'p99_us'))}"
                for i, o in pairs) + " |")
    w("")

    w("### Batch level by level vs one at a time; fused vs sum only (in kernel)\n")
    w("Time ratios of medians: one-at-a-time / level-by-level (> 1: level by level is faster), "
      "fused / sum-only update.\n")
    w("| leaves | batch | shape | sample branchy: one / level | sample branchless: one / level "
      "| update: one / level | fused update: one / level | fused / sum only (level) |")
    w("|---|---:|---|---:|---:|---:|---:|---:|")
    for n in sizes:
        for B in BATCHES:
            for s in SHAPES:
                r1 = get(agg, n, B, s, "sample_one") / get(agg, n, B, s, "sample")
                r2 = get(agg, n, B, s, "sample_one_bl") / get(agg, n, B, s, "sample_bl")
                r3 = get(agg, n, B, s, "update_one") / get(agg, n, B, s, "update")
                r4 = get(agg, n, B, s, "update_fused_one") / get(agg, n, B, s, "update_fused")
                r5 = get(agg, n, B, s, "update_fused") / get(agg, n, B, s, "update")
                w(f"| {size_label(n)} | {B} | {s} | {r1:.2f} | {r2:.2f} | {r3:.2f} | {r4:.2f} "
                  f"| {r5:.2f} |")
    w("")
    w("![sumtree_shape.png](sumtree_shape.png)\n")

    w("## Method\n")
    l1, l2, l3 = cache_bytes(machine, 1), cache_bytes(machine, 2), cache_bytes(machine, 3)
    ls = machine["lscpu"]
    w(f"* **Machine.** {machine['cpu_model']}, {machine['logical_cpus']} logical CPUs, "
      f"{ls.get('Thread(s) per core', '?')} thread per core, virtual machine (hypervisor "
      f"{ls.get('Hypervisor vendor', 'none reported')}). Caches (sysfs, cpu0): L1d "
      f"{mib(l1) if l1 else '?'}, L2 {mib(l2) if l2 else '?'} per core, L3 "
      f"{mib(l3) if l3 else '?'} shared; lscpu totals: L1d {ls.get('L1d cache')}, L2 "
      f"{ls.get('L2 cache')}, L3 {ls.get('L3 cache')}; /proc/cpuinfo cache size "
      f"{machine['cpuinfo_cache_size']}; 64-byte lines. {machine['os']} {machine['kernel']}, "
      f"{machine['mem_total_bytes'] / 2**30:.1f} GiB RAM.")
    w(f"* **Software.** Python {sw['python']}, numpy {sw['numpy']}, numba {sw['numba']} "
      f"(llvmlite {sw['llvmlite']}); repository commit `{(sw['git_commit'] or '?')[:12]}`"
      f"{' (other files of the checkout had uncommitted changes)' if sw['git_dirty_tracked_files'] else ''}. "
      f"Kernels are `@njit(cache=True, nogil=True)`, default numba options (no fastmath).")
    la0, la1 = meth["loadavg_start"], meth["loadavg_end"]
    w(f"* **Load.** Load average (1 / 5 / 15 min) {la0[0]:.2f} / {la0[1]:.2f} / {la0[2]:.2f} at "
      f"the start, {la1[0]:.2f} / {la1[1]:.2f} / {la1[2]:.2f} at the end (the run itself keeps "
      f"one of the 2 cores busy); values before every (seed, size, batch) block are in "
      f"`results.json`. The machine is shared and noisy, hence medians, interleaving and "
      f"per-seed ratios.")
    w(f"* **Seeds and repetitions.** Seeds {', '.join(map(str, seeds))}. Each seed draws its own "
      f"leaves (uniform in [0, 1), {ZERO_FRAC:.0%} zeros), uniforms r_i and update indices "
      f"(uniform over the leaves, duplicates possible) and values ({ZERO_FRAC:.0%} zeros): "
      f"{N_ROWS} pre-drawn batches used in turn, identical for all shapes. Each candidate is "
      f"timed for {BUDGET_S[meth['mode']]} s per seed, split in {ROUNDS[meth['mode']]} rounds; in "
      f"each round all {meth['candidates_per_config']} candidates of a (seed, size, batch) run "
      f"one after another in a rotated order, reversed every other round (A B C ... then ... C B "
      f"A), so drift of the machine hits all of them. {WARMUP_CALLS} untimed calls start every "
      f"slice; the garbage collector is off while timing. Sample counts per candidate are in "
      f"`results.json` (`samples_per_seed`).")
    w(f"* **Two timings.** *In kernel*: each call processes M consecutive batches (M a power of "
      f"two, chosen once so a call takes about {BLOCK_TARGET_S * 1e3:.0f} ms) and call time / M "
      f"is one sample; its p99 is therefore a p99 of M-batch means. This is what the tree costs "
      f"inside a larger numba kernel (tfdata samples and gathers in one kernel). *Per call*: "
      f"each call processes one batch and is timed alone with `time.perf_counter_ns`, Python to "
      f"numba dispatch included; done for sample (branchy), update and fused update. numpy is "
      f"timed per call only.")
    w("* **Statistics.** Per seed: median and p99 of the samples. Tables: the median over seeds "
      "of those. Ratios: per seed (same data, same rounds), then the median over seeds.")
    w("* **Updates.** Leaves set in batch order (last write wins for duplicates), then every "
      "ancestor is recomputed from its children (level by level for the whole batch; duplicated "
      "parents are recomputed redundantly, harmless). The sum-only update leaves the min/max "
      "trees stale during timing, which does not change any cost.")
    w("* **Not measured.** Drawing the uniforms (pre-drawn), IS weights, gathering rows, "
      "interleaving sum/min/max in one array (the fused update here touches three separate "
      "arrays), software prefetch. The numpy baseline recomputes the cumsum on every sample "
      "because priorities change between samples in prioritized replay.")
    w("")
    w("Tree layouts (bytes of one tree; the fused update touches three) and levels below the "
      "root:\n")
    w("| leaves | " + " | ".join(SHAPES) + " |")
    w("|---|" + "---|" * len(SHAPES))
    for n in sizes:
        fp = res["footprint"][str(n)]
        w(f"| {size_label(n)} | " + " | ".join(
            f"{mib(fp[s]['bytes'])}, {fp[s]['depth']} levels" for s in SHAPES) + " |")
    w("")
    if l2 and l3:
        w(f"2^10 leaves are cache resident for every shape (16 KiB or less per tree). At 2^20 a "
          f"tree (9-16 MiB) is far beyond L2 ({mib(l2)}) but within the shared L3 ({mib(l3)}); "
          f"the three trees of the fused update (27-48 MiB) are not. At 2^22 (37-64 MiB per "
          f"tree) everything is beyond L3. L3 is also shared with whatever else runs on the "
          f"host.\n")
    w("## Correctness (asserted before timing)\n")
    c = res["correctness"]
    w(f"Every kernel (4 shapes x {', '.join(OPS)}) and the numpy samplers and updates were checked "
      f"against a slow reference (`np.searchsorted(np.cumsum(leaves), u, side='right')`, "
      f"overshoot clamped to the last non-zero leaf) for capacities "
      f"{', '.join(map(str, TEST_CAPACITIES))} and batches {', '.join(map(str, TEST_BATCHES))}, "
      f"with three leaf sets per capacity: integers 0-10 with 30% zeros and zero first and last "
      f"leaves (all sums and subtractions exact, so every draw must equal the reference "
      f"exactly); reals spanning 6 decades with 30% zeros; a single 1e-300 leaf among zeros "
      f"(also exact). Uniform rows include r = 0 (u = 0) and r = 1 - 2^-53 (u at or rounding "
      f"past the total). Asserted: no draw on a zero-priority leaf, index in range, returned "
      f"priority = the leaf, level-by-level draws = one-at-a-time draws of the same arithmetic, "
      f"binary branchless = binary branchy, and after three batches of updates (duplicates, "
      f"zero values) the leaves follow last-write-wins and the sum, min and max trees are "
      f"bit-identical to a fresh build of the final leaves (so no drift); then the updated trees "
      f"are sampled and checked again. {c['cases']} (capacity, leaf set, batch) cases, "
      f"{c['draws']:,} draws and {c['update_checks']} updates checked in {c['seconds']:.1f} s. "
      f"{c['boundary_mismatches']} real-valued draws differ from the reference; the check allows "
      f"that only within 1e-9 x total of the chosen leaf's edges (the tree's partial sums round "
      f"differently from the cumsum).\n")
    w("## Reproduce\n")
    w("```sh\n.venv/bin/python experiments/sumtree_shape.py --quick   # < 1 min\n"
      ".venv/bin/python experiments/sumtree_shape.py           # full run, < 8 min\n"
      ".venv/bin/python experiments/sumtree_shape.py --seeds 0,1,2\n```\n")
    w("Files: `README.md` (this, generated), `results.json` (every per-seed number, the "
      "methodology, the correctness summary, the verdicts), `sumtree_shape.png`. numba's "
      "kernel cache goes to `reports/sumtree/.numba_cache/` unless `NUMBA_CACHE_DIR` is set.\n")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(L))


def conclusion(agg, ver, sizes, seeds) -> str:
    big = [n for n in sizes if n >= 2**20]
    small = [n for n in sizes if n < 2**20]
    cfg = [(n, B) for n in big for B in BATCHES] or [(n, B) for n in sizes for B in BATCHES]
    cfg_all = [(n, B) for n in sizes for B in BATCHES]

    def gmean(shape, configs, fn=None):
        fn = fn or (lambda n, B, sh: ver[f"{n}|{B}"]["step_us"][sh])
        return math.exp(np.mean([math.log(fn(n, B, shape)) for n, B in configs]))

    def beats(a, b, n, B):  # a cheaper than b by more than the margin in every seed
        return all(step_cost(agg, n, B, a, i) * (1 + TIE_MARGIN) < step_cost(agg, n, B, b, i)
                   for i in range(len(seeds)))

    def vs_bin(shape, configs):
        v = [ver[f"{n}|{B}"]["step_us"][shape] / ver[f"{n}|{B}"]["step_us"]["binary"]
             for n, B in configs]
        return f"{min(v):.2f}-{max(v):.2f}x" if len(v) > 1 else f"{v[0]:.2f}x"

    gm = {s: gmean(s, cfg) for s in SHAPES}
    best = min(gm, key=gm.get)
    tied = [s for s in SHAPES if gm[s] <= gm[best] * (1 + TIE_MARGIN)]
    gm_all = {s: gmean(s, cfg_all) for s in SHAPES}
    pick = min(tied, key=gm_all.get) if len(tied) > 1 else best

    def name(s):
        return "binary tree" if s == "binary" else f"{ARITY[s]}-ary tree ({s})"

    where = f"{' and '.join(size_label(n) for n in big)} leaves, batch {' and '.join(map(str, BATCHES))}"
    first = (f"**Use the {name(pick)}.** The criterion is the in-kernel cost of one "
             f"prioritized-replay step, sample(B) + fused sum/min/max update(B), each shape with "
             f"its fastest of the four samplers and two fused updates, beyond L2 ({where}). "
             f"There one step of the {pick} tree costs {vs_bin(pick, cfg)} of the binary tree's "
             f"(geometric mean {gm[pick] / gm['binary']:.2f}x, using its "
             + " / ".join(sorted({f"{SHORT[ver[f'{n}|{B}']['sampler'][pick]]} sampler + "
                                  f"{SHORT[ver[f'{n}|{B}']['updater'][pick]]} fused update"
                                  for n, B in cfg}))
             + " there); "
             + ", ".join(f"{s} costs {vs_bin(s, cfg)}" for s in SHAPES
                         if s not in ("binary", pick)) + ".")
    parts = [first]
    if len(tied) > 1:
        others = [s for s in tied if s != pick]
        n_clear = {o: sum(beats(pick, o, n, B) or beats(o, pick, n, B) for n, B in cfg)
                   for o in others}
        parts.append(
            f"**{pick} vs {', '.join(others)} is a tie beyond L2:** geometric means within "
            f"{TIE_MARGIN:.0%} ("
            + ", ".join(f"{o} / {pick} = {gm[o] / gm[pick]:.2f}" for o in others)
            + "), and one is cheaper than the other by more than the margin in every seed in "
            + ", ".join(f"{n_clear[o]} of the {len(cfg)} configurations ({pick} vs {o})"
                        for o in others)
            + ". The tie-break is the cache-resident case"
            + (f": at {', '.join(size_label(n) for n in small)} leaves a step costs "
               + ", ".join(f"{s} {vs_bin(s, [(n, B) for n in small for B in BATCHES])}"
                           for s in tied)
               + " of binary's" if small else "")
            + f", so over all sizes {pick} is cheaper (geometric mean over all "
            f"{len(cfg_all)} configurations: "
            + ", ".join(f"{s} {gm_all[s] / gm_all['binary']:.2f}x" for s in SHAPES)
            + " of binary).")
    # which shape wins which operation
    samp = {s: gmean(s, cfg, lambda n, B, sh: get(agg, n, B, sh, best_op(agg, n, B, sh,
                                                                          SAMPLE_OPS)))
            for s in SHAPES}
    upd = {s: gmean(s, cfg, lambda n, B, sh: get(agg, n, B, sh, best_op(agg, n, B, sh,
                                                                         FUSED_OPS)))
           for s in SHAPES}
    parts.append(
        "**Per operation** (beyond L2, geometric mean of each shape's best implementation, "
        "relative to binary): sample "
        + ", ".join(f"{s} {samp[s] / samp['binary']:.2f}" for s in SHAPES)
        + "; fused update " + ", ".join(f"{s} {upd[s] / upd['binary']:.2f}" for s in SHAPES)
        + ". Fewer levels help the update most (every level costs a miss in each of the three "
          "trees); the sample gains less because a wider node means more work per level to "
          "find the child (an interpretation of these numbers, not measured directly).")
    if small:
        fl = get(agg, small[0], 32, "floor", "noop", "call")
        sp = [ver[f"{n}|{B}"] for n in small for B in BATCHES]
        bb = [v for v in sp if v["best"] == "binary"]
        parts.append(
            f"**Where it does not matter:** at {', '.join(size_label(n) for n in small)} leaves "
            f"(cache resident) a whole step costs "
            + " and ".join(
                f"{fmt(min(v['step_us'].values()))}-{fmt(max(v['step_us'].values()))} µs at "
                f"batch {v['batch']}" for v in sp)
            + f" depending on the shape, against {fmt(fl)} µs for merely calling a numba kernel "
            f"from Python"
            + (f"; binary is the fastest there ({len(bb)} of {len(sp)} configurations) and the "
               f"{pick} tree costs {vs_bin(pick, [(n, B) for n in small for B in BATCHES])} of "
               f"binary's; in absolute terms that is "
               + " and ".join(f"{v['step_us'][pick] - v['step_us']['binary']:.2f} µs per step at "
                              f"batch {v['batch']}" for v in sp)
               if bb and pick != "binary" else "")
            + ".")

    def rng_of(vals):
        return f"{min(vals):.2f}-{max(vals):.2f}x"

    cfgs = [(n, B, s) for n in big for B in BATCHES for s in SHAPES]
    if cfgs:
        def ratios(slow, fast, shapes=SHAPES):
            return [get(agg, n, B, sh, slow) / get(agg, n, B, sh, fast)
                    for n in big for B in BATCHES for sh in shapes]

        def summary(vals):
            faster = sum(v > 1 + TIE_MARGIN for v in vals)
            slower = sum(v < 1 - TIE_MARGIN for v in vals)
            return (f"{rng_of(vals)}; level by level faster in {faster}, slower in {slower} of "
                    f"{len(vals)}")

        parts.append(
            f"**Level by level vs one at a time** (beyond L2, every shape and batch; one-at-a-time "
            f"time / level-by-level time, 'faster'/'slower' beyond {TIE_MARGIN:.0%}): branchy "
            f"sample {summary(ratios('sample_one', 'sample'))}; branchless sample "
            f"{summary(ratios('sample_one_bl', 'sample_bl'))}; binary branchless alone "
            f"{rng_of(ratios('sample_one_bl', 'sample_bl', ('binary',)))}; sum update "
            f"{summary(ratios('update_one', 'update'))}; fused update "
            f"{summary(ratios('update_fused_one', 'update_fused'))}. An interpretation (not "
            f"measured directly): a branchless one-draw-at-a-time descent must wait for each "
            f"load before it knows the next address, so interleaving draws level by level pays "
            f"off most there; a branchy descent lets the CPU speculate down the predicted child, "
            f"which already overlaps some misses; an update's addresses (the ancestors) are known "
            f"in advance, so walking one leaf up at a time does not serialise its loads.")
        r_f = ratios("update_fused", "update")
        parts.append(
            f"**Fused min/max** costs {rng_of(r_f)} a sum-only update beyond L2 (level by "
            f"level; the three trees are three separate arrays, so about three times the cache "
            f"lines are touched). Separate min/max passes were not timed.")
    if 2**20 in sizes:
        n, B = 2**20, BATCHES[-1]
        np_step = get(agg, n, B, "numpy", "sample", "call") + \
            get(agg, n, B, "numpy", "update_fused", "call")
        pk_step = get(agg, n, B, pick, "sample", "call") + \
            get(agg, n, B, pick, "update_fused", "call")
        parts.append(
            f"**Against numpy** (per call from Python, 2^20 leaves, batch {B}): numpy's "
            f"cumsum + searchsorted sample costs {fmt(get(agg, n, B, 'numpy', 'sample', 'call'))} "
            f"µs (O(N) per sample), its per-level tree descent "
            f"{fmt(get(agg, n, B, 'numpy_descent', 'sample', 'call'))} µs, its per-level fused "
            f"update {fmt(get(agg, n, B, 'numpy', 'update_fused', 'call'))} µs; a numpy step "
            f"(cumsum sample + fused update) is {np_step / pk_step:.0f}x the {pick} step "
            f"called from Python ({fmt(pk_step)} µs).")
    return "\n\n".join(parts)


# ---------------------------------------------------------------------------------------------
def main() -> None:
    args = seeds_parser(__doc__, "< 1 minute demo run", "comma-separated seeds",
                        raw=False).parse_args()
    mode = "quick" if args.quick else "full"
    seeds = tuple(int(s) for s in args.seeds.split(",")) if args.seeds else DEFAULT_SEEDS[mode]
    command = (f"python experiments/sumtree_shape.py{' --quick' if args.quick else ''}"
               + (f" --seeds {args.seeds}" if args.seeds else ""))
    rec = RunRecord(EXPERIMENT, mode=mode, seeds=list(seeds), command=command)
    run_name = rec.run_name
    t_start = time.perf_counter()
    load_start = os.getloadavg()
    os.makedirs(OUT_DIR, exist_ok=True)

    def log(msg):
        print(f"[{time.perf_counter() - t_start:6.1f} s] {msg}", flush=True)

    log(f"{run_name}: load average {load_start[0]:.2f} {load_start[1]:.2f} {load_start[2]:.2f}")
    t0 = time.perf_counter()
    correctness = check_all()  # also compiles / loads every kernel
    correctness["seconds"] = time.perf_counter() - t0
    log(f"correctness OK: {correctness}")

    rows = []
    loads = []
    for seed in seeds:
        loads.append({"seed": seed, "loadavg": list(os.getloadavg())})
        rows += run_seed(seed, mode, log)
    sizes = list(SIZES[mode])
    agg = aggregate(rows, seeds)
    ver = verdicts(agg, sizes, seeds)
    footprint = {}
    for n in sizes:
        footprint[str(n)] = {}
        for s in SHAPES:
            if s == "binary":
                P = 1 << max(0, math.ceil(math.log2(n)))
                footprint[str(n)][s] = {"bytes": 2 * P * 8, "depth": int(math.log2(P))}
            else:
                off = kary_offsets(n, ARITY[s])
                footprint[str(n)][s] = {"bytes": int(off[-1]) * 8, "depth": len(off) - 2}
    run = rec.finish()
    # the shared methodology (tfdata's reports index and SCHEMA.md), plus this report's own keys
    meth = {**run, "wall_s": run["wall_clock_s"], "loadavg_start": run["load_average_start"],
            "loadavg_end": run["load_average_end"], "loadavg_per_seed_start": loads,
            "parameters": {"sizes": sizes, "batches": list(BATCHES), "rounds": ROUNDS[mode],
                           "budget_s_per_candidate_per_seed": BUDGET_S[mode],
                           "block_target_s": BLOCK_TARGET_S, "warmup_calls": WARMUP_CALLS,
                           "min_calls_per_slice": MIN_CALLS_PER_SLICE, "n_rows": N_ROWS,
                           "zero_frac": ZERO_FRAC, "test_capacities": list(TEST_CAPACITIES),
                           "test_batches": list(TEST_BATCHES), "align_bytes": ALIGN,
                           "tie_margin": TIE_MARGIN},
            "candidates_per_config": len(SHAPES) * (len(OPS) + len(CALL_OPS)) + 5,
            "machine": machine_brief(), "software": software_brief(run)}
    res = {"methodology": meth, "sizes": sizes, "correctness": correctness,
           "footprint": footprint, "verdicts": ver, "summary": agg, "per_seed": rows}
    res["conclusion"] = conclusion(agg, ver, sizes, seeds)
    # wall time is recorded before the report/plot are written (they take ~1-2 s)
    write_json(os.path.join(OUT_DIR, "results.json"), res)
    res["schema_version"] = 1
    plot(agg, sizes, run_name, os.path.join(OUT_DIR, "sumtree_shape.png"))
    write_report(res, os.path.join(OUT_DIR, "README.md"))
    log(f"done in {time.perf_counter() - t_start:.0f} s; wrote README.md, results.json, "
        f"sumtree_shape.png under reports/sumtree/")
    print(res["conclusion"])


if __name__ == "__main__":
    main()
