"""Samplers over a shared-memory region whose shards writer processes fill (see
:mod:`tfdata.shared`): the same contract as the single-process samplers, with the rows held
read from the shards' heads and rows being written left out (drawn again after the copy)."""

from __future__ import annotations

import numpy as np

from ...errors import SharedBufferError
from . import Sampler
from .prioritized import PrioritizedSampler
from .uniform import UniformSampler

# rows drawn again in one sample, at most, before concluding the writers never stop
MAX_REDRAWS = 1 << 20


class _Shards:
    """What both shared samplers read of the region: heads, reserves, slots per shard, and the
    episode flags their slices stop at.

    Slices (``sample_slices``) follow the region's streams
    (:class:`tfdata.replay.streams.ShardStreams`): each shard is one writer's stream.
    """

    def bind_shards(self, heads: np.ndarray, reserved: np.ndarray, cap: int) -> None:
        self.heads, self.reserved, self.cap = heads, reserved, cap
        self.shards = heads.shape[0]
        self.redraws = 0

    def heads_snapshot(self, scratch: np.ndarray) -> int:
        """Read the heads into ``scratch`` before a draw; returns rows held."""
        return self.k.read_heads(self.heads, self.cap, scratch)

    def ring_arrays(self, batch_size: int, length, out) -> dict:
        arrays = super().ring_arrays(batch_size, length, out)
        # heads snapshot (3 per shard), write windows (4 per shard), one mark per row or slice
        arrays["shard_scratch"] = self.allocator.zeros(7 * self.shards + batch_size, np.int64)
        return arrays

    def ring_nbytes(self, batch_size: int, length) -> int:
        return super().ring_nbytes(batch_size, length) + 8 * (7 * self.shards + batch_size)

    #: why a batch cannot hold more rows than the buffer (the end of the message that says so)
    batch_rule = "sampling is with replacement but needs batch_size <= len(buffer)"

    def too_few(self, batch: int, n: int | None = None) -> ValueError:
        """The error for a batch of ``batch`` rows with ``n`` held (None: read the heads)."""
        if n is None:  # rows held, from the heads as they are now (an error path only)
            n = int(np.minimum(self.heads.astype(np.int64), self.cap).sum())
        return ValueError("cannot sample from an empty buffer" if n == 0 else
                          f"batch_size {batch} is larger than the {n} rows held; {self.batch_rule}")


class SharedUniformSampler(_Shards, UniformSampler):
    """The uniform sampler with the slices of a region's shards (``sample_shard_slices``); its
    rows are drawn by :class:`tfdata.shared.streams.ShardRows` (kernel ``sample_shared``:
    draw, copy, then redraw the rows a writer may have touched during the copy)."""

    def bind(self, storage, capacity: int, num_envs: int, allocator) -> None:
        super().bind(storage, capacity, num_envs, allocator)
        from ... import kernels

        self.k = kernels


class SharedPrioritizedSampler(_Shards, PrioritizedSampler):
    """The prioritized sampler with the slices of a region's shards (``sample_shard_slices``).
    Its rows are drawn by :class:`tfdata.shared.streams.ShardRows`: each sample first lets
    the trees hear the rows published since the last, through the sampler's one-row write hook
    (each as a push gives it), then draws, copies and redraws (one proportional draw from the
    same trees) every row a writer may have touched during the copy."""

    #: the streams that catch the trees up (set by the buffer)
    streams = None

    def bind(self, storage, capacity: int, num_envs: int, allocator) -> None:
        super().bind(storage, capacity, num_envs, allocator)
        self.ring = self.cap  # a slot is written once per lap of its shard

    def heads_snapshot(self, scratch: np.ndarray) -> int:
        """Catch up the rows published since the last sample (reading the heads into
        ``scratch``); returns rows held."""
        return self.fold(scratch)

    def restore(self, leaves: np.ndarray, versions: np.ndarray, heads: list, samples: int) -> None:
        """Trees, versions and catch-up positions of a checkpoint (every held row heard)."""
        self.k.tree_build(*self.trees, np.asarray(leaves, np.float64))
        self.set_versions(np.asarray(versions, np.uint64))
        self.streams.published[:] = heads
        self.samples = samples

    def fold(self, scratch: np.ndarray) -> int:
        """Catch the trees up on the rows published since (see
        :meth:`tfdata.shared.streams.ShardRows.catch_up`); returns rows held."""
        return self.streams.catch_up(scratch)


class SharedWithoutReplacementSampler(_Shards, Sampler):
    """Sampling without replacement over the shards (``sampler="without_replacement"``): the
    learner's pool of the undrawn slots (:mod:`tfdata.kernels._pool`), into which each sample
    first adds the rows published since the last one (read from the heads, shard by shard, in
    publication order), then the draws, the copy, and a redraw (from the pool, after adding
    what was published since) of every row a writer may have touched during the copy.

    The rule of :class:`~tfdata.replay.samplers.without_replacement.WithoutReplacementSampler`,
    with the rows published as the writes: within a pass no row is returned twice; a row
    published during a pass joins it; a row a writer overwrote before it was drawn is never
    returned (its slot's new row takes its place once published; a row torn during the copy
    has left the pool and is drawn again from it); a new pass begins when every row of the pass
    was drawn, over every row the shards then hold. With one writer, the same rows published
    between the same samples give the same batches. A batch never holds a slot twice: a pass
    that ends during a batch, in its draws or in a redraw, begins the next one with the rows
    the batch holds out of reach of its other draws (they stay in that pass), as a
    single-process batch defers the rows it took; a redraw never takes a slot of the batch
    whose new row a writer published meanwhile either.
    """

    projects = True
    state_key = "without_replacement"
    #: the name ``SharedReplayBuffer(sampler=...)`` and checkpoints give this sampler
    name = "without_replacement"
    batch_rule = ("sampling is without replacement: a batch holds distinct rows, so "
                  "batch_size <= len(buffer)")

    def bind(self, storage, capacity: int, num_envs: int, allocator) -> None:
        super().bind(storage, capacity, num_envs, allocator)
        from ... import kernels
        from ...kernels import _pool

        self.k, self._pool = kernels, _pool
        self.pool = allocator.zeros(capacity, np.uint32)
        self.inpool = allocator.zeros(capacity, np.uint8)
        self.meta = np.zeros(3, np.int64)  # [undrawn rows, passes completed, rows held]
        self.folded = allocator.zeros(self.shards, np.int64)  # rows of each shard added

    def plan(self, capacity: int) -> dict:
        return {"trees": 0, "bookkeeping": 5 * int(capacity) + 8 * getattr(self, "shards", 0)}

    @property
    def nbytes(self) -> dict:
        return {"trees": 0, "bookkeeping": int(self.pool.nbytes + self.inpool.nbytes
                                               + self.folded.nbytes)}

    @property
    def passes(self) -> int:
        """Passes completed so far."""
        return int(self.meta[1])

    @property
    def undrawn(self) -> int:
        """Rows of the current pass not drawn yet, as of the last sample."""
        return int(self.meta[0])

    def _fold_draw(self, scratch, idx, i: int = -1) -> int:
        """Add the rows published since, then draw ``idx`` (or, ``i >= 0``, draw ``idx[i]``
        again, out of reach of the batch's other rows); returns rows held."""
        if i < 0:
            got = self._pool.pool_fold_draw(self.heads, self.cap, self.pool, self.inpool,
                                            self.meta, self.folded, scratch, self.state, idx)
        else:
            got = self._pool.pool_fold_redraw(self.heads, self.cap, self.pool, self.inpool,
                                              self.meta, self.folded, scratch, self.state, idx, i)
        if got == -3:
            raise self.too_few(idx.shape[0], int(self.meta[2]))
        if got < 0:  # the arguments are this object's: a bug, not the caller's input
            kernel = "pool_fold_draw" if i < 0 else "pool_fold_redraw"
            raise RuntimeError(f"SharedWithoutReplacementSampler: {kernel} returned {got}")
        return int(self.meta[2])

    def fold(self, scratch: np.ndarray) -> int:
        """Add the rows published since the last sample (reading the heads into ``scratch``;
        a checkpoint's snapshot: every published row added); returns rows held."""
        return self._fold_draw(scratch, scratch[:0])

    def sample(self, n: int, out, arrays: dict) -> None:
        scratch, idx = arrays["shard_scratch"], out.indices
        self._fold_draw(scratch, idx)
        out.source.gather(idx, out)
        mark = scratch[7 * self.shards:]
        torn = self.k.torn_after_copy(self.reserved, self.cap, scratch, idx, mark)
        for i in range(idx.shape[0] if torn else 0):
            if mark[i]:  # rare: a row a writer overwrote while it was copied (it left the pool)
                self.redraw(i, out, arrays)

    def redraw(self, i: int, out, arrays: dict) -> None:
        """Draw row ``i`` of ``out`` again from the pool (the rows published since added
        first; never a slot the batch's other rows hold), checked against heads read afresh,
        until it copies cleanly."""
        scratch = arrays["shard_scratch"]
        one = out.indices[i:i + 1]
        mark = scratch[7 * self.shards + i:7 * self.shards + i + 1]
        mark[0] = 1
        tries = 0
        while mark[0]:
            if tries == MAX_REDRAWS:
                raise SharedBufferError(f"{MAX_REDRAWS} rows drawn were all mid-write")
            tries += 1
            self._fold_draw(scratch, out.indices, i)
            out.source.gather_at(one, out, i)
            self.k.torn_after_copy(self.reserved, self.cap, scratch, one, mark)
        self.redraws += tries

    def heads_snapshot(self, scratch: np.ndarray) -> int:
        """The first step of ``sample_sequences``: refused here, before anything changed."""
        raise NotImplementedError(
            "SharedReplayBuffer(sampler='without_replacement') draws no sequences (a slice of "
            "a shard starts at rows its writer keeps moving; see ARCHITECTURE.md): use "
            "sampler='uniform' or prioritized=True for sample_sequences")

    # -- state ---------------------------------------------------------------------------------
    def pass_state(self) -> dict:
        """``{"undrawn": int64[m], "passes": int}`` as of the last fold (call under the lock,
        after :meth:`fold`)."""
        return {"undrawn": self.pool[:int(self.meta[0])].astype(np.int64),
                "passes": int(self.meta[1])}

    def restore(self, undrawn: np.ndarray, passes: int, heads: list) -> None:
        """The pass of a checkpoint (slots already mapped to this region, each held once) with
        every row of ``heads`` added."""
        from ..._checks import check_slot_list

        undrawn = check_slot_list(undrawn, self.capacity, "state.without_replacement.undrawn")
        if self._pool.pool_load(self.pool, self.inpool, self.meta, undrawn, self.capacity) != 0:
            raise RuntimeError("SharedWithoutReplacementSampler: a checked pool did not load")
        self.meta[1] = passes
        self.folded[:] = heads
