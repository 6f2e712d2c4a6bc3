"""Proportional prioritized replay (Schaul et al. 2016) on the same storages and writer."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from .buffer import MAX_CAPACITY, Batch, ReplayBuffer, _check_int
from .errors import SpecError


def _check_float(name: str, value, low: float, *, low_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    value = float(value)
    if not math.isfinite(value) or value < low or (low_open and value == low):
        raise ValueError(f"{name} must be finite and {'>' if low_open else '>='} {low}, got {value}")
    return value


def batch_slots(indices) -> tuple:
    """What ``update_priorities`` accepts, as ``(slots, versions)``: a :class:`Batch` gives its
    indices and the write versions captured when it was sampled; a 1-D integer array gives
    itself and None. Anything else raises SpecError naming the dtype and shape."""
    versions = None
    if isinstance(indices, Batch):
        versions = indices.versions
        indices = indices.indices
    idx = np.asarray(indices)
    if idx.ndim != 1 or (idx.size and idx.dtype.kind not in "iu"):
        raise SpecError(f"update_priorities: indices must be a 1-D integer array, got "
                        f"{idx.dtype}{list(idx.shape)}")
    return idx, versions


class PrioritizedReplayBuffer(ReplayBuffer):
    """A replay buffer that samples rows in proportion to ``(priority + eps) ** alpha``.

    Parameters
    ----------
    spec, capacity, layout, seed, ring_size, num_envs, n_step, gamma, next_of, elide_next, roles,
    spill_path, hot_rows, hot_bytes, allocator, memory_budget
        As for :class:`ReplayBuffer`. With ``n_step`` the priority belongs to the window's first
        row (the sampled slot).
    alpha : float, default 0.6
        Priority exponent, fixed at construction (0 gives uniform sampling).
    beta : float, default 0.4
        Importance-sampling exponent at the first sample.
    beta_final : float, default 1.0
        Value ``beta`` reaches after ``beta_steps`` calls of :meth:`sample`.
    beta_steps : int, optional
        Length of the linear annealing, in sample calls; None keeps ``beta`` constant.
    eps : float, default 1e-6
        Added to every priority, so no row has zero probability.

    Raises
    ------
    ValueError
        No priority at all would give a leaf ``(p + eps) ** alpha`` in the accepted range (see
        *Bounds*), e.g. ``eps ** alpha`` already overflows.

    Notes
    -----
    *Storage of priorities.* Three binary trees over the slots, in float64: sums (sampling),
    minimum (weight normalisation) and maximum (priority of new rows), interleaved node by node
    in one ``(2P, 4)`` array. float64 because the
    root sums up to 2**32 leaves; parents are always recomputed from their children, so there is
    no drift to correct by rebuilding.

    *New rows* get the maximum priority over the rows that are live once the rows being
    overwritten are gone (1.0, before ``alpha``, in an empty buffer), unless ``push``/``extend``
    are given explicit priorities.

    *Sampling* is stratified: the total mass is cut into ``batch_size`` equal segments and one
    row is drawn in each, with replacement across segments. Each sample returns importance
    weights ``w_i = (N P(i))**-beta / max_j (N P(j))**-beta``, where ``N = len(buffer)``,
    ``P(i) = p_i**alpha / sum_k p_k**alpha`` and the max runs over **all live rows** (not only
    the batch), so ``w_i = (min_k p_k**alpha / p_i**alpha)**beta <= 1``.

    *Bounds.* Every leaf ``(p + eps) ** alpha`` must lie in ``[MIN_LEAF, max_leaf]``: at least
    the smallest normal float64 (2.2e-308), so the total mass is positive, and at most
    ``float64 max / (2 P)`` (``P`` the power of two ``>= capacity``), so the sum of all leaves
    is finite. A priority whose leaf falls outside (``alpha=60`` with priorities near 1e-7,
    which underflow to 0; ``1e308`` with ``alpha=1``, whose sum overflows) is refused with a
    ValueError naming it, by :meth:`update_priorities`, :meth:`push` and :meth:`extend`, and
    nothing is changed; :attr:`priority_range` gives the accepted priorities. New rows take the
    current largest leaf (or 1.0), which is within the bounds. A state or checkpoint whose
    leaves break them is refused. Whatever the trees hold, a sample never returns a slot
    outside ``[0, len(buffer))``.
    """

    _weighted = True

    def __init__(self, spec, capacity: int, *, alpha: float = 0.6, beta: float = 0.4,
                 beta_final: float = 1.0, beta_steps: int | None = None, eps: float = 1e-6,
                 layout: str | None = None, seed: int | None = None, ring_size: int = 2,
                 **episode_options):
        self.alpha = _check_float("alpha", alpha, 0.0)
        self.beta_start = _check_float("beta", beta, 0.0)
        self.beta_final = _check_float("beta_final", beta_final, 0.0)
        self.beta_steps = None if beta_steps is None else _check_int("beta_steps", beta_steps, 1)
        self.eps = _check_float("eps", eps, 0.0, low_open=True)
        leaves = 1 << max(0, (_check_int("capacity", capacity, 1, MAX_CAPACITY) - 1).bit_length())
        # numba is imported when the first buffer is built, not by `import tfdata`
        from .kernels._tree import MIN_LEAF, leaf_of, max_leaf, priority_bounds

        bounds = priority_bounds(self.eps, self.alpha, leaves)
        if bounds is None:  # refused before anything is allocated
            raise ValueError(f"alpha={self.alpha}, eps={self.eps}: no priority p gives a leaf "
                             f"(p + eps) ** alpha in [{MIN_LEAF}, {max_leaf(leaves)}] (eps ** alpha "
                             f"= {leaf_of(0.0, self.eps, self.alpha)}); use a smaller alpha or eps")
        self._max_leaf = max_leaf(leaves)
        self._p_low, self._p_high = bounds
        super().__init__(spec, capacity, layout=layout, seed=seed, ring_size=ring_size,
                         **episode_options)
        from . import kernels

        self._k = kernels
        # one 32-byte record per node, [sum, min, max, unused]: an update reads a node's
        # children and writes the node in two cache lines for all three trees, not six
        # (measured 0.88x of the step with three separate arrays at 1M rows, reports/prioritized.md)
        self._tree = self.allocator.zeros((2 * leaves, 4), np.float64)
        self._sum, self._min, self._max = self._tree[:, 0], self._tree[:, 1], self._tree[:, 2]
        self._min[:] = np.inf
        self._samples = 0  # sample calls so far: the position in the beta schedule
        # writes per slot, so an update for a row that has since been overwritten is refused
        self._version = self.allocator.zeros(self.capacity, np.uint64)
        self._psample = self._storage.kernels.sample_prioritized
        # the per-spec push, with the new row's priority set in the same lock (one kernel call;
        # the arrays are bound, not the buffer, so the closure keeps no cycle)
        overwrite, trees = kernels.tree_overwrite_max, (self._sum, self._min, self._max, self._version)

        def on_write(slot, _k=overwrite, _t=trees):
            _k(*_t, slot)

        self._fast_push = self._make_fast_push(on_write)

    # -- memory -----------------------------------------------------------------------------
    _PLAN_ONLY = ("alpha", "beta", "beta_final", "beta_steps", "eps", "seed")

    def _plan_options(self, options: dict) -> None:
        for k in self._PLAN_ONLY:  # they do not change the memory
            options.pop(k, None)
        super()._plan_options(options)

    def _planned_parts(self, batch_sizes=()) -> dict:
        parts = super()._planned_parts(batch_sizes)
        leaves = 1 << max(0, (self._capacity - 1).bit_length())
        parts["trees"] = 2 * leaves * 4 * 8  # (2P, 4) float64 nodes
        parts["bookkeeping"] += 8 * self._capacity  # slot versions
        return parts

    @property
    def nbytes_parts(self) -> dict:
        parts = super().nbytes_parts
        parts["trees"] = int(self._tree.nbytes)
        parts["bookkeeping"] += int(self._version.nbytes)
        return parts

    # -- priorities -------------------------------------------------------------------------
    @property
    def beta(self) -> float:
        """The exponent the next :meth:`sample` uses."""
        if self.beta_steps is None:
            return self.beta_start
        frac = min(1.0, self._samples / self.beta_steps)
        return self.beta_start + (self.beta_final - self.beta_start) * frac

    @property
    def priority_range(self) -> tuple:
        """``(low, high)``: the priorities this buffer accepts, those whose leaf
        ``(p + eps) ** alpha`` lies in ``[MIN_LEAF, float64 max / (2 P)]`` (see *Bounds*)."""
        return self._p_low, self._p_high

    def priorities(self) -> np.ndarray:
        """``(priority + eps) ** alpha`` of slots ``[0, len(self))`` (a copy, float64)."""
        leaves = self._sum.shape[0] // 2
        with self._lock:
            return self._sum[leaves:leaves + len(self)].copy()

    def _checked_priorities(self, priorities, n: int, what: str) -> np.ndarray:
        try:
            p = np.asarray(priorities, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise SpecError(f"{what}: priorities must be numbers ({exc})") from None
        if p.shape != (n,):
            raise SpecError(f"{what}: expected priorities of shape ({n},), got shape {p.shape}")
        k = self._k.first_bad_priority(p, self._p_low, self._p_high)
        if k >= 0:
            v = float(p[k])
            if not (v >= 0.0 and math.isfinite(v)):
                raise ValueError(f"{what}: priorities must be finite and >= 0, got {v} at position {k}")
            from .kernels._tree import MIN_LEAF, leaf_of

            raise ValueError(
                f"{what}: priority {v} at position {k} gives the leaf (p + eps) ** alpha = "
                f"{leaf_of(v, self.eps, self.alpha)} (alpha={self.alpha}, eps={self.eps}), outside "
                f"[{MIN_LEAF}, {self._max_leaf}] (positive, and small enough that the sum of all "
                f"leaves is finite); this buffer accepts priorities in [{self._p_low}, {self._p_high}]")
        return p

    def _leaf_values(self, priorities, n: int, what: str):
        if priorities is None:
            return None
        # checked against the bounds above, so these leaves are in [MIN_LEAF, max_leaf]
        return (self._checked_priorities(priorities, n, what) + self.eps) ** self.alpha

    def _on_write(self, spans, leaves) -> None:
        s, mn, mx, k = self._sum, self._min, self._max, self._k
        for dst, _, count in spans:  # evict first: the overwritten rows are no longer live
            k.tree_fill(s, mn, mx, dst, count, 0.0)
            self._version[dst:dst + count] += np.uint64(1)
        if leaves is None:
            value = mx[1] if mx[1] > 0.0 else 1.0
            for dst, _, count in spans:
                k.tree_fill(s, mn, mx, dst, count, value)
        else:
            for dst, src, count in spans:
                k.tree_fill_values(s, mn, mx, dst, leaves[src:src + count])

    def update_priorities(self, indices, priorities) -> None:
        """Set the priorities of slots ``indices`` (as in ``batch.indices``).

        Parameters
        ----------
        indices : Batch or array_like of int, shape (k,)
            A batch from :meth:`sample` (recommended: slots overwritten since that sample are
            detected and refused), or slots in ``[0, len(self))``. A slot listed twice takes its
            last priority.
        priorities : array_like of float, shape (k,)
            Finite and ``>= 0`` (typically ``abs(td_error)``); ``eps`` is added. Each must be
            in :attr:`priority_range` (see *Bounds* in the class notes).

        Raises
        ------
        ValueError, TypeError
            NaN, inf or negative priorities, priorities outside :attr:`priority_range`,
            out-of-range indices, mismatched shapes, a batch whose rows were overwritten since
            it was sampled. Nothing is changed.
        tfdata.StaleBatchError
            ``indices`` is a batch whose ring slot was reused by a later sample (a ValueError).
        """
        idx, versions = batch_slots(indices)
        p = self._checked_priorities(priorities, idx.shape[0], "update_priorities")
        if idx.size == 0:
            return
        idx = idx.astype(np.int64, copy=False)
        with self._lock:
            n = len(self)
            lo, hi = int(idx.min()), int(idx.max())
            if lo < 0 or hi >= n:
                raise ValueError(f"update_priorities: indices must be in [0, {n}), got values in "
                                 f"[{lo}, {hi}]")
            if versions is not None and self._k.first_stale(self._version, idx, versions) >= 0:
                stale = idx[self._version[idx] != versions]
                raise ValueError(f"update_priorities: stale batch: slots {stale.tolist()[:10]} "
                                 "were overwritten after it was sampled")
            self._k.tree_set_priorities(self._sum, self._min, self._max, idx, p, self.eps, self.alpha)

    # -- writing ----------------------------------------------------------------------------
    def push(self, row: Mapping, priority=None) -> None:
        """Append one row (see :meth:`ReplayBuffer.push`), with the maximum priority unless
        ``priority`` (a number ``>= 0``) is given."""
        if priority is None:
            self._fast_push(row)
        else:
            self._checked_push(row, priority)

    def _checked_push(self, row: Mapping, priority=None) -> None:
        values = self.spec.check_row(row)
        leaves = None if priority is None else self._leaf_values([priority], 1, "push")
        self._push_values(values, leaves)

    def extend(self, batch: Mapping, priorities=None) -> None:
        """Append ``n`` rows (see :meth:`ReplayBuffer.extend`), with the maximum priority unless
        ``priorities`` (shape ``(n,)``) are given."""
        n, values = self.spec.check_batch(batch)
        leaves = self._leaf_values(priorities, n, "extend")
        if n == 0:
            return
        with self._lock:
            self._write_locked(values, n, leaves)

    def sample_sequences(self, batch_size: int, length: int, **kwargs) -> Batch:
        """Not available: sequence slices are drawn uniformly, which would ignore the priorities."""
        raise NotImplementedError("prioritized sequence sampling is not implemented; use a "
                                  "ReplayBuffer for sample_sequences")

    def _on_clear(self) -> None:
        self._k.tree_build(self._sum, self._min, self._max, np.zeros(0, np.float64))

    # -- sampling ---------------------------------------------------------------------------
    def _gather(self, ring, i: int, n: int) -> None:
        # stratified proportional draws, IS weights, versions and rows in one kernel call
        slot = ring.slots[i]
        if self._psample(self._kernel_store, n, self._sum, self._min, self._version,
                         self._sampler.state, self.beta, slot.indices, ring.scratch[i],
                         ring.weights[i], ring.versions[i], slot.kernel_out):
            # unreachable while the bounds hold (every live leaf is in [MIN_LEAF, max_leaf]);
            # the kernel drew nothing and wrote nothing
            raise RuntimeError(f"the priority tree's total mass is {float(self._sum[1])} over {n} "
                               "rows, not finite and positive: nothing was sampled")
        self._samples += 1

    # -- state ------------------------------------------------------------------------------
    def _extra_state(self, copy: bool) -> dict:
        # state_dict() is ReplayBuffer's plus this: priorities and the beta schedule position
        leaves = self._sum.shape[0] // 2
        live = self._sum[leaves:leaves + self._writer.size]
        return {"prioritized": {
            "alpha": self.alpha, "eps": self.eps, "samples": self._samples,
            "leaves": live.copy() if copy else live,
            "versions": self._version.copy() if copy else self._version,
        }}

    def _config(self) -> dict:
        return {**super()._config(), "alpha": self.alpha, "beta": self.beta_start,
                "beta_final": self.beta_final, "beta_steps": self.beta_steps, "eps": self.eps}

    def _check_extra_state(self, state: Mapping, size: int):
        pri = state.get("prioritized")
        if not isinstance(pri, Mapping):
            raise ValueError("not a PrioritizedReplayBuffer state dict (no 'prioritized' entry)")
        if pri.get("alpha") != self.alpha or pri.get("eps") != self.eps:
            raise ValueError(f"state alpha/eps {pri.get('alpha')}/{pri.get('eps')} differ from this "
                             f"buffer's {self.alpha}/{self.eps}")
        leaves = pri.get("leaves")
        if not isinstance(leaves, np.ndarray) or leaves.dtype != np.float64 or leaves.shape != (size,):
            raise ValueError(f"state priorities must be float64 of shape ({size},), got "
                             f"{getattr(leaves, 'dtype', type(leaves).__name__)}"
                             f"{list(getattr(leaves, 'shape', ()))}")
        # positive, and small enough that their sum (the root the sampler divides) is finite
        bad = ~((leaves > 0.0) & (leaves <= self._max_leaf))
        if bad.any():
            k = int(np.argmax(bad))
            raise ValueError(f"state priorities: leaf {k} is {leaves[k]}; every leaf must be > 0 "
                             f"and <= {self._max_leaf} (float64 max / 2P, so that their sum is "
                             f"finite)")
        versions = pri.get("versions")
        if (not isinstance(versions, np.ndarray) or versions.dtype != np.uint64
                or versions.shape != (self.capacity,)):
            raise ValueError(f"state versions must be uint64 of shape ({self.capacity},)")
        return leaves, versions, _check_int("state samples", pri.get("samples"), 0)

    def _load_extra_state(self, extra) -> None:
        leaves, versions, samples = extra
        self._k.tree_build(self._sum, self._min, self._max, leaves)
        self._version[:] = versions
        self._samples = samples
