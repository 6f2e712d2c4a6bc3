"""Proportional prioritized sampling (Schaul et al. 2016): rows drawn in proportion to
``(priority + eps) ** alpha``, with importance weights, over a sum/min/max tree."""

from __future__ import annotations

import math
import numpy as np

from ..._checks import check_float, check_int
from ...errors import SpecError
from . import Sampler, StateError, config_keys, config_value, shown, state_int, state_part

#: the options of a prioritized sampler (its :meth:`PrioritizedSampler.config`)
OPTIONS = ("alpha", "beta", "beta_final", "beta_steps", "eps")
#: the keys of its state beyond the RNG position
STATE_KEYS = ("alpha", "eps", "samples", "leaves", "versions")
#: most leaves whose powers one update computes together (float32 scratch of the sampler: one
#: value per block of 16 leaves up to this, so a small tree's stays small)
POWERS = 256
_U64 = (1 << 64) - 1
_UINT32 = np.dtype(np.uint32)


def leaves32(leaves: np.ndarray) -> tuple:
    """``(leaves as float32, mask of those not in [MIN_LEAF, MAX_LEAF] once rounded)``: the
    tree stores float32 leaves, positive normal floats (so that their sum is finite and
    positive); a float64 leaf of an older checkpoint is rounded to nearest."""
    from ...kernels._tree import MAX_LEAF, MIN_LEAF

    with np.errstate(over="ignore"):
        l32 = leaves.astype(np.float32)
    return l32, ~((l32 >= MIN_LEAF) & (l32 <= MAX_LEAF))


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
        why: :mod:`tfdata.kernels._tree`.
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

    hears_writes = True
    projects = True
    name = "prioritized"
    rule = "rows are drawn with replacement, in proportion to their priorities"

    def __init__(self, alpha: float, beta: float, beta_final: float, beta_steps, eps: float,
                 seed=None):
        super().__init__(seed)
        self.alpha, self.beta_start, self.beta_final = alpha, beta, beta_final
        self.beta_steps, self.eps = beta_steps, eps
        self.samples = 0

    def facets(self) -> dict:
        return {**super().facets(), "prioritized": True}

    # -- config ------------------------------------------------------------------------------
    @classmethod
    def checked(cls, alpha, beta, beta_final, beta_steps, eps, seed) -> "PrioritizedSampler":
        """The sampler of these settings, each checked (TypeError or ValueError naming it)."""
        return cls(alpha=check_float("alpha", alpha, 0.0), beta=check_float("beta", beta, 0.0),
                   beta_final=check_float("beta_final", beta_final, 0.0),
                   beta_steps=None if beta_steps is None else check_int("beta_steps", beta_steps, 1),
                   eps=check_float("eps", eps, 0.0, low_open=True), seed=seed)

    def config(self) -> dict:
        """The settings (``beta``: the schedule's start), as a PrioritizedReplayBuffer takes
        them."""
        return {"alpha": self.alpha, "beta": self.beta_start, "beta_final": self.beta_final,
                "beta_steps": self.beta_steps, "eps": self.eps}

    @classmethod
    def from_config(cls, config, seed) -> "PrioritizedSampler":
        """``alpha``, ``beta``, ``beta_final`` floats in ``[0, 1000]``, ``eps`` a float in
        ``(0, 1e6]``, ``beta_steps`` null or an int in ``[1, 2**63 - 1]``: each present, exact
        JSON types."""
        config_keys(config, OPTIONS, "prioritized")
        kw = {k: config_value(config, k, "float", 0.0, 1000.0) for k in ("alpha", "beta", "beta_final")}
        kw["eps"] = config_value(config, "eps", "float", 0.0, 1e6, lo_open=True)
        kw["beta_steps"] = config_value(config, "beta_steps", "int", 1, (1 << 63) - 1, optional=True)
        return cls.checked(seed=seed, **kw)

    @staticmethod
    def leaves_of(capacity: int) -> int:
        from ...kernels._tree import leaves_of

        return leaves_of(capacity)

    def powers_of(self, capacity: int) -> int:
        """Length of the scratch in which an update computes its leaves' powers, a chunk at a
        time: one value per block of 16 leaves, at most :data:`POWERS`."""
        return min(POWERS, self.leaves_of(capacity) // 16)

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
        self._powers = allocator.zeros(self.powers_of(capacity), np.float32)
        self.ring = capacity  # rows per lap of the ring (a shard's, in a shared buffer)

    def plan(self, capacity: int) -> dict:
        from ...kernels._tree import tree_nbytes

        return {"trees": tree_nbytes(capacity) + 4 * self.powers_of(capacity), "bookkeeping": capacity}

    @property
    def nbytes(self) -> dict:
        return {"trees": int(self.sums.nbytes + self.mm.nbytes + self._leaves_raw.nbytes
                             + self._powers.nbytes),
                "bookkeeping": int(self.v8.nbytes)}

    @property
    def version(self) -> np.ndarray:
        """What a batch sampled now would hold as ``versions``, for every slot (uint32)."""
        return self.v8.astype(np.uint32) | np.uint32(self.epoch() << 8)

    def epoch(self) -> int:
        """Laps of the ring written so far, modulo 2**24."""
        return self._epoch_of(self.sums, self.ring)

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
    def no_mass(self, n: int):
        # unreachable while the bounds hold (every live leaf is in [MIN_LEAF, max_leaf]); the
        # kernel drew nothing and wrote nothing
        return RuntimeError(f"the priority tree's total mass is {float(self.sums[1])} over {n} "
                            "rows, not finite and positive: nothing was sampled")

    def sample(self, n: int, out, arrays: dict) -> None:
        # stratified proportional draws, IS weights, versions and rows in one kernel call
        # (the kernel stamps the epoch into the versions: no numpy call after it)
        if out.kernels.sample_prioritized(out.store, n, self.sums, self.mm, self.leaves, self.v8,
                                          self.ring, self.state, self.beta, out.indices,
                                          arrays["scratch"], arrays["weights"], arrays["versions"],
                                          out.kernel_out):
            raise self.no_mass(n)
        self.samples += 1

    def sample_slices(self, n, streams, geo, reject, max_draws, out, arrays,
                      part=None) -> int:
        # ``part``: one slice drawn again (shards); the batch's other weights stay as drawn
        mask, idx = arrays["mask"], out.indices.reshape(arrays["mask"].shape)
        u, weights, versions = arrays["scratch"], arrays["weights"], arrays["versions"]
        if part is not None:
            idx, mask, u = idx[part], mask[part], u[part]
            weights, versions = weights[part], versions[part]
        term, trunc = streams.flags
        # (the kernel stamps the epoch into the versions, as the row sample's does)
        failed = streams.kernels.slices_prioritized(
            geo, n, self.sums, self.mm, self.leaves, self.v8, self.ring, self.state, self.beta,
            streams.episode, term, trunc, reject, max_draws, idx, mask, u, weights, versions)
        if failed == -2:
            raise self.no_mass(n)
        if failed == -1 and part is None:  # a whole batch: one step of the beta schedule
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
        elif versions.dtype is not _UINT32 and versions.dtype != _UINT32:
            versions = versions.astype(np.uint32)  # e.g. uint64 from ray: epoch << 8 | count
        got = self._update(self.sums, self.mm, self.leaves, self.v8, idx, p, versions, check,
                           self._epoch_of(self.sums, self.ring), n, self.p_low, self.p_high,
                           self.eps, self.alpha, self._powers)
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

        # the same over spans of slots in one call (the shard streams' catch-up of the rows
        # writer processes published: each as a push gives it)
        from ...kernels._shared_tree import overwrite_max_spans

        on_write.rows = lambda spans, _k=overwrite_max_spans, _t=trees: _k(*_t, spans)
        return on_write

    def on_clear(self) -> None:
        self.k.tree_build(*self.trees, np.zeros(0, np.float64))

    # -- state -------------------------------------------------------------------------------------
    def extra_state(self, size: int) -> dict:
        """``{"alpha", "eps", "samples", "leaves": float64[size], "versions":
        uint64[capacity]}``: in the state's form, unchanged since the tree stored float64
        (leaves float64, exactly the float32 values stored; versions uint64); new arrays."""
        return {"alpha": self.alpha, "eps": self.eps, "samples": self.samples,
                "leaves": self.live_leaves(size), "versions": self.version.astype(np.uint64)}

    def check_state(self, state, size: int, capacity: int):
        """``alpha`` and ``eps`` this sampler's (floats), ``samples`` an int in ``[0, 2**64 -
        1]``, ``leaves`` float64 ``(size,)`` that are, rounded to float32, positive normal
        float32 values (so that their sum is finite and positive), ``versions`` uint64
        ``(capacity,)`` (their low byte is kept: writes per slot modulo 256)."""
        from ...kernels._tree import MAX_LEAF, MIN_LEAF

        rng = super().check_state(state, size, capacity)
        key = self.name
        state_part(state, STATE_KEYS, key)
        for k in ("alpha", "eps"):
            v = state[k]
            if not isinstance(v, (float, np.floating)) or v != getattr(self, k):
                raise StateError(f"{key}.{k}", f"{getattr(self, k)} (config.{k})", shown(v),
                                 message=f"state alpha/eps {shown(state['alpha'])}/"
                                 f"{shown(state['eps'])} differ from this buffer's "
                                 f"{self.alpha}/{self.eps} ({key}.{k})")
        samples = state_int(state, "samples", f"{key}.samples", 0, _U64)
        raw = state["leaves"]
        if not isinstance(raw, np.ndarray) or raw.dtype != np.float64 or raw.shape != (size,):
            raise StateError(f"{key}.leaves", f"float64[{size}] (the rows held)", shown(raw),
                             message=f"state priorities ({key}.leaves) must be float64 of shape "
                             f"({size},), got {shown(raw)}")
        leaves, bad = leaves32(raw)
        if bad.any():
            k = int(np.argmax(bad))
            want = (f"leaves that are, rounded to float32, in [{MIN_LEAF}, {MAX_LEAF}] (positive "
                    f"normal float32 values, so that their sum is finite and positive)")
            raise StateError(f"{key}.leaves", want, f"leaf {k} = {raw[k]}",
                             message=f"state priorities: leaf {k} is {raw[k]}; every leaf must "
                             f"be, rounded to float32, in [{MIN_LEAF}, {MAX_LEAF}] (positive "
                             f"normal float32 values, so that their sum is finite and positive; "
                             f"{key}.leaves)")
        versions = state["versions"]
        if (not isinstance(versions, np.ndarray) or versions.dtype != np.uint64
                or versions.shape != (capacity,)):
            raise StateError(f"{key}.versions", f"uint64[{capacity}] (one per slot)", shown(versions),
                             message=f"state versions ({key}.versions) must be uint64 of shape "
                             f"({capacity},), got {shown(versions)}")
        k = odd_epoch(versions)
        if k >= 0:
            raise StateError(f"{key}.versions", EPOCH_RULE, f"slot {k} = {int(versions[k])}, slot 0 = "
                             f"{int(versions[0])}",
                             message=f"state versions ({key}.versions): slot {k} holds "
                             f"{int(versions[k])} and slot 0 {int(versions[0])}; {EPOCH_RULE}")
        return rng, leaves, versions, samples

    def load_state(self, checked) -> None:
        rng, leaves, versions, samples = checked
        super().load_state(rng)
        self.set_trees(leaves, versions, samples)

    def set_trees(self, leaves: np.ndarray, versions: np.ndarray, samples: int) -> None:
        """The trees of checked ``leaves`` (one per slot of ``[0, len(leaves))``; 0: a slot no
        row holds), the slots' ``versions`` (see :meth:`set_versions`) and the beta schedule's
        ``samples``."""
        self.k.tree_build(*self.trees, np.asarray(leaves, np.float64))
        self.set_versions(np.asarray(versions, np.uint64))
        self.samples = samples

    def set_versions(self, versions: np.ndarray) -> None:
        """Versions of a state (uint64, as :attr:`version` gives them, or plain write counts
        from before 8-bit versions): ``v8`` from their low byte, and the epoch restarted from
        the largest one, so that batches keep being checked against the same epochs."""
        self.v8[:] = (versions & np.uint64(0xFF)).astype(np.uint8)
        laps = int((versions >> np.uint64(8)).max()) & 0xFFFFFF if versions.size else 0
        self.sums[0] = float(laps * self.ring)


#: what every slot's saved version shares (what a load can restore exactly)
EPOCH_RULE = ("versions whose bits 8 and up (the epoch, laps of the ring) are the same in every "
              "slot, as a save writes them")


def odd_epoch(versions: np.ndarray) -> int:
    """The first slot whose saved version (uint64 ``(capacity,)``) has another epoch than slot
    0's, or -1. A sampler keeps one epoch and a byte per slot, so a state whose epochs differ
    would load as another state: it is refused instead."""
    if versions.size == 0:
        return -1
    odd = (versions >> np.uint64(8)) != (versions[0] >> np.uint64(8))
    return int(np.argmax(odd)) if odd.any() else -1


def read_scalars(c, pri, config: dict) -> int:
    """The scalars of a shared buffer's ``state.prioritized`` in a checkpoint (``c``: its
    checker of JSON values): alpha and eps as configured; returns samples."""
    w = "state.prioritized."
    c.obj("state.prioritized", pri, STATE_KEYS)
    for k in ("alpha", "eps"):
        if type(pri[k]) is not float or pri[k] != config[k]:
            c.fail(w + k, f"{config[k]} (config.{k})", pri[k])
    return c.integer(w + "samples", pri["samples"], 0, _U64)
