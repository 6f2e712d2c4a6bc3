"""Proportional prioritized sampling (Schaul et al. 2016): rows drawn in proportion to
``(priority + eps) ** alpha``, with importance weights, over a sum/min/max tree."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from ..._checks import check_int
from ...errors import SpecError
from . import Sampler


class PrioritizedSampler(Sampler):
    """Stratified proportional draws with importance weights and per-slot write versions.

    Parameters
    ----------
    alpha, beta, beta_final, beta_steps, eps
        As for :class:`tfdata.PrioritizedReplayBuffer` (checked there).
    seed : int or None

    Attributes
    ----------
    leaves : ndarray of float32, shape (P,)
        ``float32((priority + eps) ** alpha)`` of every slot (0 for an empty one), ``P`` the
        power of two ``>= capacity`` (at least 16), 64-byte aligned: blocks of 16 leaves are
        cache lines.
    sums : ndarray of float64, shape (2 * P // 16,)
        Sum tree over the blocks (root ``sums[1]``, block ``b`` at ``P // 16 + b``).
    mm : ndarray of float32, shape (2 * P // 16, 2)
        Smallest positive leaf and largest leaf under each node of that tree. The layout and
        why: :mod:`tfdata.kernels._tree` (6 bytes per slot; the float64 ``(2P, 4)`` nodes it
        replaced took 64, reports/prioritized.md).
    v8 : ndarray of uint8, shape (capacity,)
        Writes per slot, modulo 256 (1 byte per slot, not 8), so an update for a row
        overwritten since its sample is refused. A batch's ``versions`` (uint32) are
        ``epoch << 8 | v8[slot]``, ``epoch`` the laps of the ring written before the sample
        (``sums[0]`` counts the rows written): a batch is stale once a version differs, or once
        254 laps were written since its sample, when an 8-bit count could have come round
        (every row of the ring was overwritten by then anyway).
    version : ndarray of uint32, shape (capacity,)
        Property: what a batch sampled now would hold as ``versions`` for each slot.
    samples : int
        Sample calls so far: the position in the beta schedule.
    """

    name = "prioritized"

    def facets(self) -> dict:
        return {**super().facets(), "prioritized": True}


    hears_writes = True
    state_key = "prioritized"
    projects = True
    name = "prioritized"
    rule = "rows are drawn with replacement, in proportion to their priorities"

    def __init__(self, alpha: float, beta: float, beta_final: float, beta_steps, eps: float,
                 seed=None):
        super().__init__(seed)
        self.alpha, self.beta_start, self.beta_final = alpha, beta, beta_final
        self.beta_steps, self.eps = beta_steps, eps
        self.samples = 0

    @staticmethod
    def leaves_of(capacity: int) -> int:
        from ...kernels._tree import leaves_of

        return leaves_of(capacity)

    def bounds(self, capacity: int):
        """``(low, high, max_leaf)``: the accepted priorities and the largest leaf, or None
        when no priority gives a leaf in range (imports numba's kernels module)."""
        from ...kernels._tree import max_leaf, priority_bounds

        leaves = self.leaves_of(capacity)
        b = priority_bounds(self.eps, self.alpha, leaves)
        return None if b is None else (b[0], b[1], max_leaf(leaves))

    def bind(self, storage, capacity: int, num_envs: int, allocator) -> None:
        super().bind(storage, capacity, num_envs, allocator)
        from ... import kernels

        self.k = kernels
        self.p_low, self.p_high, self.max_leaf = self.bounds(capacity)
        from ...kernels._tree import epoch_of, new_tree, tree_update

        self._update, self._epoch_of = tree_update, epoch_of
        self.sums, self.mm, self.leaves, self._leaves_raw = new_tree(capacity, allocator)
        self.trees = (self.sums, self.mm, self.leaves)
        self.v8 = allocator.zeros(capacity, np.uint8)
        self.ring = capacity  # rows per lap of the ring (a shard's, in a shared buffer)

    def plan(self, capacity: int) -> dict:
        from ...kernels._tree import tree_nbytes

        return {"trees": tree_nbytes(capacity), "bookkeeping": capacity}

    @property
    def nbytes(self) -> dict:
        return {"trees": int(self.sums.nbytes + self.mm.nbytes + self._leaves_raw.nbytes),
                "bookkeeping": int(self.v8.nbytes)}

    @property
    def version(self) -> np.ndarray:
        """What a batch sampled now would hold as ``versions``, for every slot (uint32)."""
        return self.v8.astype(np.uint32) | np.uint32(self.epoch() << 8)

    def epoch(self) -> int:
        """Laps of the ring written so far, modulo 2**24."""
        return self._epoch_of(self.sums, self.ring)

    def stamp(self, versions: np.ndarray) -> None:
        """Put the epoch in the versions a kernel just wrote (``v8[slot]``)."""
        versions |= np.uint32(self._epoch_of(self.sums, self.ring) << 8)

    def fresh(self, slots: np.ndarray, versions: np.ndarray) -> np.ndarray:
        """Which ``slots`` (int64) of a batch with these ``versions`` an update would accept
        (bool array)."""
        from ...kernels._tree import stale_mask

        return ~stale_mask(self.v8, slots, versions, self.epoch())

    # -- the beta schedule --------------------------------------------------------------------
    @property
    def beta(self) -> float:
        if self.beta_steps is None:
            return self.beta_start
        frac = min(1.0, self.samples / self.beta_steps)
        return self.beta_start + (self.beta_final - self.beta_start) * frac

    # -- output rings ---------------------------------------------------------------------------
    def ring_arrays(self, batch_size: int, length, out) -> dict:
        a = self.allocator
        arrays = super().ring_arrays(batch_size, length, out)
        # importance weights, float64 scratch and versions, one per row (per slice)
        arrays.update(weights=a.zeros(batch_size, np.float32), scratch=a.zeros(batch_size, np.float64),
                      versions=a.zeros(batch_size, np.uint32))
        return arrays

    def ring_nbytes(self, batch_size: int, length) -> int:
        return super().ring_nbytes(batch_size, length) + batch_size * (4 + 8 + 4)

    def batch_view(self, arrays: dict, fields: dict, attrs: dict) -> None:
        super().batch_view(arrays, fields, attrs)
        attrs["weights"], attrs["versions"] = arrays["weights"], arrays["versions"]

    # -- drawing -----------------------------------------------------------------------------------
    def _no_mass(self, n: int):
        # unreachable while the bounds hold (every live leaf is in [MIN_LEAF, max_leaf]); the
        # kernel drew nothing and wrote nothing
        return RuntimeError(f"the priority tree's total mass is {float(self.sums[1])} over {n} "
                            "rows, not finite and positive: nothing was sampled")

    def sample(self, n: int, out, arrays: dict) -> None:
        # stratified proportional draws, IS weights, versions and rows in one kernel call
        versions = arrays["versions"]
        if out.kernels.sample_prioritized(out.store, n, self.sums, self.mm, self.leaves, self.v8,
                                          self.state, self.beta, out.indices, arrays["scratch"],
                                          arrays["weights"], versions, out.kernel_out):
            raise self._no_mass(n)
        versions |= np.uint32(self._epoch_of(self.sums, self.ring) << 8)
        self.samples += 1

    def sample_slices(self, n, cursor, episode, reject, max_draws, out, arrays) -> int:
        mask = arrays["mask"]
        failed = self.k.sample_slices_prioritized(
            n, cursor, self.num_envs, self.capacity, self.sums, self.mm, self.leaves, self.v8,
            self.state, self.beta, episode, reject, max_draws, out.indices.reshape(mask.shape), mask,
            arrays["scratch"], arrays["weights"], arrays["versions"])
        self.stamp(arrays["versions"])
        if failed == -2:
            raise self._no_mass(n)
        if failed == -1:
            self.samples += 1
        return failed

    # -- priorities ----------------------------------------------------------------------------
    def as_priorities(self, priorities, n: int, what: str) -> np.ndarray:
        """``priorities`` as float64 ``(n,)`` (SpecError naming the dtype or shape otherwise);
        their values are checked by :meth:`update` (or :meth:`checked_priorities`)."""
        if type(priorities) is not np.ndarray or priorities.dtype != np.float64:
            try:
                priorities = np.asarray(priorities, dtype=np.float64)
            except (TypeError, ValueError) as exc:
                raise SpecError(f"{what}: priorities must be numbers ({exc})") from None
        if priorities.shape != (n,):
            raise SpecError(f"{what}: expected priorities of shape ({n},), got shape "
                            f"{priorities.shape}")
        return priorities

    def priority_error(self, p: np.ndarray, k: int, what: str) -> ValueError:
        """The ValueError for priority ``p[k]``, outside :attr:`priority_range`."""
        v = float(p[k])
        if not (v >= 0.0 and math.isfinite(v)):
            return ValueError(f"{what}: priorities must be finite and >= 0, got {v} at position {k}")
        from ...kernels._tree import MIN_LEAF, leaf_of

        return ValueError(
            f"{what}: priority {v} at position {k} gives the leaf (p + eps) ** alpha = "
            f"{leaf_of(v, self.eps, self.alpha)} (alpha={self.alpha}, eps={self.eps}, rounded to "
            f"float32), outside [{MIN_LEAF}, {self.max_leaf}] (the positive normal float32 "
            f"values, in which leaves are stored); this buffer accepts priorities in "
            f"[{self.p_low}, {self.p_high}]")

    def checked_priorities(self, priorities, n: int, what: str) -> np.ndarray:
        """``priorities`` as float64 ``(n,)``, each in :attr:`priority_range`, else SpecError or
        ValueError naming the first bad one."""
        p = self.as_priorities(priorities, n, what)
        k = self.k.first_bad_priority(p, self.p_low, self.p_high)
        if k >= 0:
            raise self.priority_error(p, k, what)
        return p

    def leaf_values(self, priorities, n: int, what: str):
        """The leaves ``(p + eps) ** alpha`` of checked priorities, float64 (rounded to float32
        when written; None for None)."""
        if priorities is None:
            return None
        return (self.checked_priorities(priorities, n, what) + self.eps) ** self.alpha

    _NO_VERSIONS = np.zeros(0, np.uint32)

    def update(self, idx: np.ndarray, p: np.ndarray, versions, n: int) -> None:
        """Set the priorities ``p`` (float64 ``(k,)``, values checked here) of slots ``idx``
        (int64 ``(k,)``) of ``n`` live rows; lock held. ``versions``: the write versions the
        slots had when sampled (None: not checked). One kernel call checks everything, then
        writes (:func:`tfdata.kernels._tree.tree_update`); on a fault nothing is written and
        the ValueError names it."""
        check = versions is not None
        if not check:
            versions = self._NO_VERSIONS
        elif versions.dtype != np.uint32:
            versions = versions.astype(np.uint32)  # e.g. uint64 from ray: epoch << 8 | count
        got = self._update(self.sums, self.mm, self.leaves, self.v8, idx, p, versions, check,
                           self.epoch(), n, self.p_low, self.p_high, self.eps, self.alpha)
        if got == 0:
            return
        from ...kernels._tree import BAD_PRIORITY, BAD_SLOT

        j, code = divmod(int(got), 4)
        if code == BAD_PRIORITY:
            raise self.priority_error(p, j, "update_priorities")
        if code == BAD_SLOT:
            raise ValueError(f"update_priorities: indices must be in [0, {n}), got values in "
                             f"[{int(idx.min())}, {int(idx.max())}]")
        stale = idx[~self.fresh(idx, versions)]
        raise ValueError(f"update_priorities: stale batch: slots {stale.tolist()[:10]} "
                         "were overwritten after it was sampled")

    def live_leaves(self, size: int) -> np.ndarray:
        """The leaves of slots ``[0, size)`` as float64 (a new array)."""
        return self.leaves[:size].astype(np.float64)

    def mass(self) -> tuple:
        """``(total, smallest leaf)`` of the live rows (what a sharded sampler weighs shards by)."""
        return float(self.sums[1]), float(self.mm[1, 0])

    # -- write hooks ------------------------------------------------------------------------------
    def on_write(self, spans: list, n: int, leaves) -> None:
        (s, mm, lv), k = self.trees, self.k
        for dst, _, count in spans:  # evict first: the overwritten rows are no longer live
            k.tree_fill(s, mm, lv, dst, count, 0.0)
            self.v8[dst:dst + count] += np.uint8(1)
            s[0] += count  # rows written: the epoch of the stale check
        if leaves is None:
            value = float(mm[1, 1]) if mm[1, 1] > 0.0 else 1.0
            for dst, _, count in spans:
                k.tree_fill(s, mm, lv, dst, count, value)
        else:
            for dst, src, count in spans:
                k.tree_fill_values(s, mm, lv, dst, leaves[src:src + count])

    def slot_hook(self):
        # the generated push sets the new row's priority in the same lock, in one kernel call;
        # the arrays are bound, not the sampler, so the closure keeps no cycle
        overwrite, trees = self.k.tree_overwrite_max, self.trees + (self.v8,)

        def on_write(slot, _k=overwrite, _t=trees):
            _k(*_t, slot)

        return on_write

    def on_clear(self) -> None:
        self.k.tree_build(*self.trees, np.zeros(0, np.float64))

    # -- state -------------------------------------------------------------------------------------
    def extra_state(self, copy: bool, size: int = 0) -> dict:
        # in the state's form, unchanged since the tree stored float64: leaves float64 (exactly
        # the float32 values stored) and versions uint64; new arrays either way
        return {self.state_key: {
            "alpha": self.alpha, "eps": self.eps, "samples": self.samples,
            "leaves": self.live_leaves(size), "versions": self.version.astype(np.uint64),
        }}

    def checked_leaves(self, leaves, size: int) -> np.ndarray:
        """State leaves (float64 ``(size,)``, else None) as the float32 the tree stores, each a
        positive normal float32 once rounded (ValueError naming the first bad one)."""
        if not isinstance(leaves, np.ndarray) or leaves.dtype != np.float64 or leaves.shape != (size,):
            return None
        from ...kernels._tree import MAX_LEAF, MIN_LEAF

        with np.errstate(over="ignore"):
            l32 = leaves.astype(np.float32)
        bad = ~((l32 >= MIN_LEAF) & (l32 <= MAX_LEAF))
        if bad.any():
            k = int(np.argmax(bad))
            raise ValueError(f"state priorities: leaf {k} is {leaves[k]}; every leaf must be, "
                             f"rounded to float32, in [{MIN_LEAF}, {MAX_LEAF}] (positive normal "
                             f"float32 values, so that their sum is finite and positive)")
        return l32

    def check_state(self, state, size: int):
        rng = super().check_state(state, size)
        pri = state.get(self.state_key)
        if not isinstance(pri, Mapping):
            raise ValueError("not a PrioritizedReplayBuffer state dict (no 'prioritized' entry)")
        if pri.get("alpha") != self.alpha or pri.get("eps") != self.eps:
            raise ValueError(f"state alpha/eps {pri.get('alpha')}/{pri.get('eps')} differ from this "
                             f"buffer's {self.alpha}/{self.eps}")
        raw = pri.get("leaves")
        leaves = self.checked_leaves(raw, size)
        if leaves is None:
            raise ValueError(f"state priorities must be float64 of shape ({size},), got "
                             f"{getattr(raw, 'dtype', type(raw).__name__)}"
                             f"{list(getattr(raw, 'shape', ()))}")
        versions = pri.get("versions")
        if (not isinstance(versions, np.ndarray) or versions.dtype != np.uint64
                or versions.shape != (self.capacity,)):
            raise ValueError(f"state versions must be uint64 of shape ({self.capacity},)")
        return rng, leaves, versions, check_int("state samples", pri.get("samples"), 0)

    def load_state(self, checked) -> None:
        rng, leaves, versions, samples = checked
        super().load_state(rng)
        self.k.tree_build(*self.trees, leaves.astype(np.float64))
        self.set_versions(versions)
        self.samples = samples

    def set_versions(self, versions: np.ndarray) -> None:
        """Versions of a state (uint64, as :attr:`version` gives them, or plain write counts
        from before 8-bit versions): ``v8`` from their low byte, and the epoch restarted from
        the largest one, so that batches keep being checked against the same epochs."""
        self.v8[:] = (versions & np.uint64(0xFF)).astype(np.uint8)
        laps = int((versions >> np.uint64(8)).max()) & 0xFFFFFF if versions.size else 0
        self.sums[0] = float(laps * self.ring)
