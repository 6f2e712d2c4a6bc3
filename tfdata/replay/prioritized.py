"""Proportional prioritized replay (Schaul et al. 2016): the replay core with a
:class:`~tfdata.replay.samplers.prioritized.PrioritizedSampler`."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .._checks import check_float, check_int
from ..batch import Batch
from ..errors import SpecError
from .buffer import ReplayBuffer
from .core import MAX_CAPACITY, ReplayCore
from .samplers.prioritized import PrioritizedSampler

_INT64, _FLOAT64 = np.dtype(np.int64), np.dtype(np.float64)


def batch_slots(indices) -> tuple:
    """What ``update_priorities`` accepts, as ``(slots, versions)``: a :class:`Batch` gives its
    indices (the start rows of a batch of slices) and the write versions captured when it was
    sampled; a 1-D integer array gives itself and None. Anything else raises SpecError naming
    the dtype and shape."""
    versions = None
    if isinstance(indices, Batch):
        versions = indices.versions
        indices = indices.indices
        if indices is not None and np.ndim(indices) == 2:  # slices: the start row holds the priority
            indices = indices[:, 0]
    idx = np.asarray(indices)
    if idx.ndim != 1 or (idx.size and idx.dtype.kind not in "iu"):
        raise SpecError(f"update_priorities: indices must be a 1-D integer array, got "
                        f"{idx.dtype}{list(idx.shape)}")
    return idx, versions


def update_args(sampler, indices, priorities):
    """``(slots, priorities, versions)`` of ``update_priorities(indices, priorities)`` for
    ``sampler.update`` (int64 ``(k,)``, float64 ``(k,)``, the batch's versions or None), or None
    when there is no slot. Checks the dtypes and shapes (SpecError); the values, slots and
    versions are checked by the update's one kernel call. A batch of rows as sampled, with
    float64 priorities of its shape, is taken as it is."""
    if type(indices) is Batch:
        idx = indices.indices
        if (type(idx) is np.ndarray and idx.dtype is _INT64 and idx.ndim == 1 and idx.size
                and type(priorities) is np.ndarray and priorities.dtype is _FLOAT64
                and priorities.shape == idx.shape):
            return idx, priorities, indices.versions
    idx, versions = batch_slots(indices)
    p = sampler.as_priorities(priorities, idx.shape[0], "update_priorities")
    if idx.size == 0:
        return None
    if idx.dtype != np.int64:
        idx = idx.astype(np.int64)
    return idx, p, versions


class PrioritizedReplayBuffer(ReplayBuffer):
    """A replay buffer that samples rows in proportion to ``(priority + eps) ** alpha``.

    Parameters
    ----------
    spec, capacity, layout, seed, ring_size, num_envs, n_step, gamma, next_of, elide_next, roles,
    spill_path, hot_rows, hot_bytes, allocator, memory_budget, stats
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
    *Sequences.* :meth:`sample_sequences` draws each slice's start row in proportion to its
    priority (stratified as for rows); ``batch.weights`` and ``batch.versions`` (shape
    ``(batch_size,)``) belong to the start rows, so ``update_priorities(batch, p)`` with ``p`` of
    shape ``(batch_size,)`` sets the priority of each slice's start: a slice is as likely as the
    transition it starts from, and its loss is weighted by that row's importance weight.

    *Storage of priorities* (6 bytes per slot; docs/design/prioritized.md). Each leaf ``(p +
    eps) ** alpha`` is computed in float64 and stored as float32 (rounded to nearest), with a
    float64 sum tree over blocks of 16 leaves and the float32 minimum and maximum of each
    subtree (exact: they are leaves); parents are always recomputed from their children, so
    there is no drift to correct by rebuilding. :meth:`priorities`, the
    importance weights and the maximum given to new rows all see the float32 leaves (relative
    rounding at most 2**-24). Write versions are one byte per slot (writes modulo 256);
    ``batch.versions`` (uint32) add the laps of the ring written before the sample, and a batch
    held over 254 laps or more is refused as stale whatever the counts say.

    *New rows* get the maximum priority over the rows that are live once the rows being
    overwritten are gone (1.0, before ``alpha``, in an empty buffer), unless ``push``/``extend``
    are given explicit priorities.

    *Sampling* is stratified: the total mass is cut into ``batch_size`` equal segments and one
    row is drawn in each, with replacement across segments. Each sample returns importance
    weights ``w_i = (N P(i))**-beta / max_j (N P(j))**-beta``, where ``N = len(buffer)``,
    ``P(i) = p_i**alpha / sum_k p_k**alpha`` and the max runs over **all live rows** (not only
    the batch), so ``w_i = (min_k p_k**alpha / p_i**alpha)**beta <= 1``.

    *Bounds.* Every leaf ``(p + eps) ** alpha``, rounded to float32, must lie in
    ``[MIN_LEAF, MAX_LEAF]``, the positive normal float32 values (1.2e-38 to 3.4e38): at least
    the smallest normal float32, so the total mass is positive and no leaf loses bits, and at
    most the largest float32, so the sum of all leaves is finite. A priority whose leaf falls
    outside (``alpha=60`` with priorities near 1e-7, which underflow to 0; ``1e308`` with
    ``alpha=1``, which overflows float32) is refused with a
    ValueError naming it, by :meth:`update_priorities`, :meth:`push` and :meth:`extend`, and
    nothing is changed; :attr:`priority_range` gives the accepted priorities. New rows take the
    current largest leaf (or 1.0), which is within the bounds. A state or checkpoint whose
    leaves break them is refused. Whatever the trees hold, a sample never returns a slot
    outside ``[0, len(buffer))``.
    """

    def __init__(self, spec, capacity: int, *, alpha: float = 0.6, beta: float = 0.4,
                 beta_final: float = 1.0, beta_steps: int | None = None, eps: float = 1e-6,
                 layout=None, seed: int | None = None, ring_size: int = 2,
                 **episode_options):
        sampler = self.checked_sampler(alpha, beta, beta_final, beta_steps, eps, seed)
        capacity = check_int("capacity", capacity, 1, MAX_CAPACITY)
        if "sampler" in episode_options:
            raise TypeError("PrioritizedReplayBuffer picks its own sampler; use ReplayBuffer(sampler=...)")
        # numba is imported when the first buffer is built, not by `import tfdata`
        if sampler.bounds(capacity) is None:  # refused before anything is allocated
            from ..kernels._tree import MIN_LEAF, leaf_of, max_leaf

            leaves = sampler.leaves_of(capacity)
            raise ValueError(f"alpha={sampler.alpha}, eps={sampler.eps}: no priority p gives a leaf "
                             f"(p + eps) ** alpha in [{MIN_LEAF}, {max_leaf(leaves)}] (eps ** alpha "
                             f"= {leaf_of(0.0, sampler.eps, sampler.alpha)}); use a smaller alpha or eps")
        ReplayCore.__init__(self, spec, capacity, sampler, layout=layout, ring_size=ring_size,
                            **episode_options)

    @staticmethod
    def checked_sampler(alpha, beta, beta_final, beta_steps, eps, seed) -> PrioritizedSampler:
        """The sampler of these settings, each checked (TypeError or ValueError naming it)."""
        return PrioritizedSampler.checked(alpha, beta, beta_final, beta_steps, eps, seed)

    @classmethod
    def _planned_sampler(cls, options: dict):
        kw = {k: options.pop(k) for k in ("alpha", "beta", "beta_final", "beta_steps", "eps")
              if k in options}
        defaults = dict(alpha=0.6, beta=0.4, beta_final=1.0, beta_steps=None, eps=1e-6)
        return cls.checked_sampler(**{**defaults, **kw}, seed=0)

    # -- the sampler's settings, as attributes of the buffer ----------------------------------
    @property
    def alpha(self) -> float:
        """Priority exponent (fixed at construction)."""
        return self.sampler.alpha

    @property
    def eps(self) -> float:
        return self.sampler.eps

    @property
    def beta_start(self) -> float:
        return self.sampler.beta_start

    @beta_start.setter
    def beta_start(self, value) -> None:
        self.sampler.beta_start = check_float("beta", value, 0.0)

    @property
    def beta_final(self) -> float:
        return self.sampler.beta_final

    @property
    def beta_steps(self):
        return self.sampler.beta_steps

    @property
    def beta(self) -> float:
        """The exponent the next :meth:`sample` uses."""
        return self.sampler.beta

    @property
    def priority_range(self) -> tuple:
        """``(low, high)``: the priorities this buffer accepts, those whose leaf
        ``(p + eps) ** alpha``, rounded to float32, lies in ``[MIN_LEAF, MAX_LEAF]`` (see
        *Bounds*)."""
        return self.sampler.p_low, self.sampler.p_high

    #: the sampler it has (its config names none: its settings are the config's own keys)
    SAMPLERS = {"prioritized": PrioritizedSampler}
    DEFAULT_SAMPLER = "prioritized"

    @classmethod
    def sampler_classes(cls, given=()) -> dict:
        """Its one sampler (it builds its own: samplers given to :meth:`load` do not apply)."""
        return dict(cls.SAMPLERS)

    @classmethod
    def sampler_options(cls, sampler) -> dict:
        """The settings of ``sampler``, as keywords (the seed is restored with the state)."""
        return sampler.config()

    # -- priorities -------------------------------------------------------------------------
    def priorities(self) -> np.ndarray:
        """``(priority + eps) ** alpha`` of slots ``[0, len(self))``, as stored (float32 values)
        in a new float64 array of shape ``(len(self),)``."""
        with self._lock:
            return self.sampler.live_leaves(len(self))

    def update_priorities(self, indices, priorities) -> None:
        """Set the priorities of slots ``indices`` (as in ``batch.indices``).

        Parameters
        ----------
        indices : Batch or array_like of int, shape (k,)
            A batch from :meth:`sample` or :meth:`sample_sequences` (recommended: slots
            overwritten since that sample are detected and refused; for slices, the start
            rows), or slots in ``[0, len(self))``. A slot listed twice takes its last priority.
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
        got = update_args(self.sampler, indices, priorities)
        if got is not None:
            lock = self._lock  # acquire/release: cheaper than a with block on this hot path
            lock.acquire()
            try:
                self.sampler.update(*got, len(self))
            finally:
                lock.release()

    def prepare_update(self, indices, priorities) -> tuple:
        """Every check of :meth:`update_priorities`, nothing changed: ``(slots, priorities,
        versions)`` for :meth:`apply_update`. The caller holds :attr:`lock` through both calls
        (a write between them could overwrite a slot found fresh); a caller updating several
        buffers as one prepares every update, then applies them. Raises as
        :meth:`update_priorities`."""
        idx, versions = batch_slots(indices)
        p = self.sampler.checked_priorities(priorities, idx.shape[0], "update_priorities")
        idx = idx.astype(np.int64, copy=False)
        n = len(self)
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            raise ValueError(f"update_priorities: indices must be in [0, {n}), got values in "
                             f"[{int(idx.min())}, {int(idx.max())}]")
        if versions is not None and idx.size:
            stale = idx[~self.sampler.fresh(idx, versions)]
            if stale.size:
                raise ValueError(f"update_priorities: stale batch: slots {stale.tolist()[:10]} "
                                 "were overwritten after it was sampled")
        return idx, p, versions

    def apply_update(self, prepared: tuple) -> None:
        """Apply what :meth:`prepare_update` returned (:attr:`lock` held since)."""
        idx, p, versions = prepared
        if idx.size:
            self.sampler.update(idx, p, versions, len(self))

    # -- writing ----------------------------------------------------------------------------
    def push(self, row: Mapping, priority=None) -> None:
        """Append one row (see :meth:`ReplayBuffer.push`), with the maximum priority unless
        ``priority`` (a number ``>= 0``) is given."""
        if priority is None:
            self._fast_push(row)
        else:
            values = self.spec.check_row(row)
            leaves = self.sampler.leaf_values([priority], 1, "push")
            self._writes.row(values, leaves)

    def extend(self, batch: Mapping, priorities=None) -> None:
        """Append ``n`` rows (see :meth:`ReplayBuffer.extend`), with the maximum priority unless
        ``priorities`` (shape ``(n,)``) are given."""
        n, values = self.spec.check_batch(batch)
        leaves = self.sampler.leaf_values(priorities, n, "extend")
        if n == 0:
            return
        self._writes.rows(values, n, leaves)
