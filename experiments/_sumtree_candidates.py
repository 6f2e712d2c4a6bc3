"""The candidates of ``sumtree_shape.py``: sum/min/max trees of four shapes as numba kernels, the
vectorised numpy baseline, and the correctness check of all of them against a slow reference.

Not an experiment (the leading underscore keeps it out of ``tfdata list``); the question, the
timing and the analysis are in ``experiments/sumtree_shape.py``, which imports this module after
setting ``NUMBA_CACHE_DIR`` (numba reads it at import, and ``cache=True`` would otherwise write
next to this file).

Shapes (float64 priorities):

* ``binary``: implicit array, root at 1, children of i at 2i and 2i+1, leaves at P..2P-1 with P
  the next power of two >= capacity.
* ``k4``, ``k8``, ``k16``: k-ary trees stored level by level; the k children of a node are
  contiguous and every child block starts on a multiple of k elements of a 64-byte aligned array,
  so one node's children fill half a cache line (k=4), one line (k=8) or two lines (k=16). Levels
  are only as wide as needed (no padding of the leaf level to a power of k).

The kernels of each family are in ``_sumtree_binary.py`` and ``_sumtree_kary.py``; this module
holds the trees that call them, the numpy baseline and the correctness check. Kernels are
``@njit(cache=True, nogil=True)`` and allocate nothing; scratch arrays are passed in.
Their arguments, shared by every shape:

s, mn, mx : ndarray of float64
    The sum, min and max trees (one array each, same layout).
P : int
    Binary only: the leaf offset (a power of two).
off : ndarray of int64
    k-ary only: start of every level, root first (``L + 2`` entries, the last the array length).
kk : tuple of int
    k-ary only: k zeros; ``len(kk)`` is k as a compile-time constant, so every k gets its own
    specialised machine code.
R : ndarray of float64, shape (m, B)
    Uniforms in [0, 1): m batches of B stratified draws, draw b targets (b + r_b) * total / B.
IDX, PR : ndarray, shape (m, B)
    Leaf indices (int64) and their new priorities (float64), m batches of B.
out_idx, out_p : ndarray, shape (m, B)
    Sampled leaf indices and their priorities (written).
u, pos : ndarray, shape (B,)
    Scratch: remaining mass (float64) and node position (int64) of every draw.
"""

from __future__ import annotations

import math

import numpy as np
from _sumtree_binary import (bin_build, bin_sample, bin_sample_bl, bin_sample_one, bin_sample_one_bl, bin_update,
                             bin_update_fused, bin_update_fused_one, bin_update_one)
from _sumtree_kary import (kary_build, kary_sample, kary_sample_bl, kary_sample_one, kary_sample_one_bl, kary_update,
                           kary_update_fused, kary_update_fused_one, kary_update_one, noop)

SHAPES = ("binary", "k4", "k8", "k16")
ARITY = {"binary": 2, "k4": 4, "k8": 8, "k16": 16}
SAMPLE_OPS = ("sample", "sample_bl", "sample_one", "sample_one_bl")
UPDATE_OPS = ("update", "update_one", "update_fused", "update_fused_one")
FUSED_OPS = ("update_fused", "update_fused_one")
ALIGN = 64  # bytes: one cache line, where every tree array starts


# ---------------------------------------------------------------------------------------------
# Trees: allocation and build (outside timing)
# ---------------------------------------------------------------------------------------------
def aligned_full(n: int, value: float) -> np.ndarray:
    """A float64 array of ``n`` elements set to ``value``, its first element starting a cache line.

    Alignment makes a k-ary node's children share as few cache lines as possible (see the module
    docstring); numpy only guarantees 16 bytes.

    Parameters
    ----------
    n : int
    value : float

    Returns
    -------
    numpy.ndarray
        A view into a slightly larger allocation.
    """
    buf = np.empty(n + ALIGN // 8, dtype=np.float64)
    start = (-buf.ctypes.data % ALIGN) // 8
    a = buf[start:start + n]
    a[:] = value
    return a


def kary_offsets(n: int, k: int) -> np.ndarray:
    """Start of every level of a k-ary tree over ``n`` leaves.

    Parameters
    ----------
    n : int
        Number of leaves.
    k : int
        Arity.

    Returns
    -------
    numpy.ndarray
        int64, ``L + 2`` entries: level l (0 = the root, in a block of k slots; L = the leaves)
        starts at ``off[l]``, ``off[L + 1]`` is the array length. A level holds k slots per node
        of the level above, so every child block starts on a multiple of k.
    """
    counts = [n]  # nodes per level, leaves first
    while counts[-1] > 1:
        counts.append(-(-counts[-1] // k))
    counts.reverse()
    sizes = [k] + [k * counts[l - 1] for l in range(1, len(counts))]
    off = np.zeros(len(sizes) + 1, dtype=np.int64)
    off[1:] = np.cumsum(sizes)
    return off


class Tree:
    """Sum, min and max trees of one shape over the same leaves, built outside any timing.

    Parameters
    ----------
    shape : str
        One of :data:`SHAPES`.
    leaves : numpy.ndarray
        float64 priorities, at least one of them positive.

    Attributes
    ----------
    s, mn, mx : numpy.ndarray
        The sum, min and max trees, each 64-byte aligned.
    depth : int
        Levels below the root.
    """

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
        """The leaf level of the sum tree (a view)."""
        return self.s[self.lb:self.lb + self.n]

    def copy(self) -> "Tree":
        """An independent copy (fresh aligned arrays), e.g. to apply an update to."""
        t = object.__new__(Tree)
        t.__dict__.update(self.__dict__)
        t.s, t.mn, t.mx = (aligned_full(a.size, 0.0) for a in (self.s, self.mn, self.mx))
        t.s[:], t.mn[:], t.mx[:] = self.s, self.mn, self.mx
        return t

    @property
    def total(self) -> float:
        """The root of the sum tree."""
        return float(self.s[1] if self.shape == "binary" else self.s[self.off[0]])

    @property
    def nbytes(self) -> int:  # one of the three trees
        return self.s.nbytes

    @staticmethod
    def footprint(n: int, shape: str) -> dict:
        """``bytes`` of one tree and ``depth`` (levels below the root) for ``n`` leaves."""
        if shape == "binary":
            P = 1 << max(0, math.ceil(math.log2(n)))
            return {"bytes": 2 * P * 8, "depth": int(math.log2(P))}
        off = kary_offsets(n, ARITY[shape])
        return {"bytes": int(off[-1]) * 8, "depth": len(off) - 2}

    # argument tuples for the kernels (m batches per call given by the 2-D slices)
    def sample_fn(self, op):
        """The sample kernel ``op`` (one of :data:`SAMPLE_OPS`) of this shape."""
        if self.shape == "binary":
            return {"sample": bin_sample, "sample_one": bin_sample_one,
                    "sample_bl": bin_sample_bl, "sample_one_bl": bin_sample_one_bl}[op]
        return {"sample": kary_sample, "sample_one": kary_sample_one,
                "sample_bl": kary_sample_bl, "sample_one_bl": kary_sample_one_bl}[op]

    def sample_args(self, R, OI, OP, u, pos):
        """The sample kernel's arguments: this tree, then the batch arrays given."""
        head = (self.s, self.P) if self.shape == "binary" else (self.s, self.off, self.kk)
        return head + (R, OI, OP, u, pos)

    def update_fn(self, op):
        """The update kernel ``op`` (one of :data:`UPDATE_OPS`) of this shape."""
        if self.shape == "binary":
            return {"update": bin_update, "update_one": bin_update_one,
                    "update_fused": bin_update_fused, "update_fused_one": bin_update_fused_one}[op]
        return {"update": kary_update, "update_one": kary_update_one,
                "update_fused": kary_update_fused, "update_fused_one": kary_update_fused_one}[op]

    def update_args(self, op, IDX, PR, pos):
        """The update kernel's arguments: the trees ``op`` maintains, then the batch arrays."""
        trees = (self.s, self.mn, self.mx) if op.startswith("update_fused") else (self.s,)
        geo = (self.P,) if self.shape == "binary" else (self.off, self.kk)
        return trees + geo + (IDX, PR, pos)


class NumpyTree:
    """The vectorised numpy baseline over the binary heap layout (what one writes without numba).

    Parameters
    ----------
    leaves : numpy.ndarray
        float64 priorities.
    max_batch : int
        Largest batch to be sampled (the draw offsets 0..B-1 are made once, not per call).
    """

    def __init__(self, leaves: np.ndarray, max_batch: int):
        t = Tree("binary", leaves)
        self.s, self.mn, self.mx, self.P, self.n, self.depth = t.s, t.mn, t.mx, t.P, t.n, t.depth
        self.ar = np.arange(max_batch, dtype=np.float64)

    @property
    def leaves(self):
        """The leaf level (a view)."""
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
        """Set leaves ``idx`` to ``p``, then one numpy pass per level over their ancestors."""
        s = self.s
        i = idx + self.P
        s[i] = p
        for _ in range(self.depth):
            i >>= 1
            s[i] = s[2 * i] + s[2 * i + 1]

    def update_fused(self, idx, p):
        """``update`` maintaining the sum, min and max trees in the same passes."""
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
    """The slow reference's state: the leaves, their cumsum and the last non-zero leaf.

    Parameters
    ----------
    leaves : numpy.ndarray

    Returns
    -------
    tuple
        ``(leaves, cumsum, last)``; ``last`` is -1 when every leaf is zero.
    """
    return leaves, np.cumsum(leaves), int(np.flatnonzero(leaves)[-1]) if leaves.any() else -1


def reference_sample(ref: tuple, total: float, r: np.ndarray) -> tuple:
    """The reference draw: searchsorted on the cumsum, targets computed exactly as the kernels do.

    Parameters
    ----------
    ref : tuple
        From :func:`make_ref`.
    total : float
        The tree's total (its root), so the targets match the kernels' bit for bit.
    r : numpy.ndarray
        B uniforms.

    Returns
    -------
    tuple
        ``(idx, u, cumsum)``: reference indices (overshoot clamped to the last non-zero leaf),
        the targets and the cumsum.
    """
    leaves, cs, last = ref
    B = r.shape[0]
    u = (np.arange(B, dtype=np.float64) + r) * (total / B)
    idx = np.searchsorted(cs, u, side="right")
    idx[idx >= len(leaves)] = last
    return idx, u, cs


def make_test_leaves(kind: str, cap: int, rng) -> np.ndarray:
    """Leaves for the correctness check.

    Parameters
    ----------
    kind : {"integer", "real", "one_hot"}
        Integers 0-10 with 30% zeros (every sum exact); reals spanning 6 decades with 30% zeros;
        a single 1e-300 leaf among zeros. The first and last leaves are zero (except one_hot).
    cap : int
        Number of leaves.
    rng : numpy.random.Generator

    Returns
    -------
    numpy.ndarray
        float64, at least one leaf positive.
    """
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
    """Assert one batch of draws against the reference.

    Parameters
    ----------
    name : str
        The candidate, for the assertion messages.
    got_idx, got_p : numpy.ndarray
        Its sampled indices and priorities.
    ref_state : tuple
        From :func:`make_ref` over the same leaves.
    total : float
        The candidate tree's total.
    r : numpy.ndarray
        The uniforms used.
    exact : bool
        Every sum is exact: the draws must equal the reference's. Otherwise a draw may differ
        only when its target lies within 1e-9 x total of the chosen leaf's edges (the tree's
        partial sums round differently from the cumsum).
    stats : dict
        ``draws`` and ``boundary_mismatches`` are incremented.

    Raises
    ------
    AssertionError
        On an index out of range, a zero-priority leaf, a wrong priority or a wrong draw.
    """
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


def check_all(capacities, batches, seed: int) -> dict:
    """Check every kernel of every shape and the numpy baseline against the slow reference.

    For each capacity, three leaf sets (:func:`make_test_leaves`) and each batch size: four rows
    of uniforms (one all 0, one all 1 - 2^-53, so u reaches or rounds past the total), every
    sampler (level-by-level draws must equal one-at-a-time draws of the same arithmetic, binary
    branchless must equal binary branchy), then three batches of updates with duplicates and
    zeros: the leaves must follow last-write-wins and the trees be bit-identical to a fresh build
    (no drift); the updated trees are sampled and checked again. Also compiles (or loads) every
    kernel.

    Parameters
    ----------
    capacities, batches : sequence of int
    seed : int

    Returns
    -------
    dict
        ``draws``, ``boundary_mismatches``, ``update_checks`` and ``cases`` counted.

    Raises
    ------
    AssertionError
        At the first candidate that disagrees with the reference.
    """
    stats = {"draws": 0, "boundary_mismatches": 0, "update_checks": 0, "cases": 0}
    for cap in capacities:
        for ki, kind in enumerate(("integer", "real", "one_hot")):
            if kind == "one_hot" and cap == 1:
                continue
            rng = np.random.default_rng([seed, cap, ki])
            leaves0 = make_test_leaves(kind, cap, rng)
            exact = kind != "real"
            ref0 = make_ref(leaves0)
            built = {shape: Tree(shape, leaves0) for shape in SHAPES}
            for shape, tree in built.items():
                root = 1 if shape == "binary" else 0
                assert tree.total > 0.0
                assert tree.mn[root] == leaves0.min() and tree.mx[root] == leaves0.max()
            for B in batches:
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
                nt = NumpyTree(leaves0, max(batches))
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
                    nt = NumpyTree(leaves0, max(batches))
                    for t in range(3):
                        getattr(nt, op)(IDX[t], PR[t])
                    assert np.array_equal(nt.s, fresh.s), f"numpy.{op}: sum tree"
                    if op == "update_fused":
                        assert np.array_equal(nt.mn, fresh.mn) and np.array_equal(nt.mx, fresh.mx)
                    stats["update_checks"] += 1
                stats["cases"] += 1
    return stats
