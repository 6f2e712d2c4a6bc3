"""Samplers over a shared-memory region whose shards writer processes fill (see
:mod:`tfdata.shared`): the same contract as the single-process samplers, with the rows held
read from the shards' heads and rows being written left out (drawn again after the copy)."""

from __future__ import annotations

import time

import numpy as np

from ...errors import SharedBufferError
from . import Sampler
from .exactly_k import ExactlyKSampler
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


class SharedExactlyKSampler(ExactlyKSampler):
    """Exactly-k replay over the shards of a shared region (``SharedReplayBuffer(...,
    sampler="exactly_k")``, replay mode), with no head-of-line blocking.

    Each shard's writer puts every row into the next free slot of its shard at or after its
    cursor (the rule of :class:`ExactlyKSampler`'s writer), a slot being free when the
    writer's ``taken`` count of it equals the learner's ``released`` count; it logs the slot of
    each row it publishes before the head that publishes it. Each sample first folds the rows
    published since the last one into the pool (``k`` deliveries each, slots read from the
    logs), draws and gathers as :class:`ExactlyKSampler` does, then, after the copy, releases
    the slots whose ``k``-th delivery it was. A writer waits (``"block"``) or drops
    (``"drop"``) only when no slot of its shard is free, so the learner can always fill a
    batch from the rows awaiting replay unless the writers stopped writing. The learner copies
    only slots in its pool, which no writer writes (they are not free): no torn rows, no
    redraws. ``"overwrite"`` is not supported here (a row overwritten while copied would need
    the seqlock redraws of the uniform sampler, which change who is delivered).

    A sample short of rows polls the heads (sleeping, no lock held) up to ``timeout`` seconds
    for the writers to publish, then raises TimeoutError; ``timeout=None``: ValueError at once.
    A writer that died publishes nothing more: the learner is never waiting on it for longer.

    With one writer the batches are those of a :class:`~tfdata.ReplayBuffer` with
    ``sampler="exactly_k"`` and the same seed given the same rows between the same samples
    (same slots, same pool order).

    Attributes
    ----------
    released : int
        Rows whose slots this learner has released (delivered ``k`` times and copied).
    """

    #: a writer of a shard puts rows in free slots, not in stream order
    stream_order = False
    #: why a batch cannot hold more rows than the capacity (see ``_Shards.batch_rule``)
    batch_rule = "an exactly_k batch holds distinct rows awaiting replay, never more than the capacity"

    def bind_shards(self, heads: np.ndarray, reserved: np.ndarray, cap: int) -> None:
        self.heads, self.reserved, self.cap = heads, reserved, cap
        self.shards = heads.shape[0]
        self.folded = np.zeros(self.shards, np.int64)  # log positions of each shard folded
        self.taken = self.released_words = self.log = None
        self.released = 0

    def bind_slot_words(self, taken: np.ndarray, released: np.ndarray, log: np.ndarray) -> None:
        """The region's per-slot words (uint64, one per slot each): the writers' ``taken``
        counts, the learner's ``released`` counts, the writers' publication logs."""
        self.taken, self.released_words, self.log = taken, released, log

    def fold(self) -> None:
        """The rows published since the last call join the pool (lock held)."""
        got = self._k.replays_fold_log(self.pool, self.remaining, self.meta, self.heads, self.log,
                                       self.folded, self.cap, self.replays)
        if got < 0:
            raise SharedBufferError(f"exactly_k: a shard's head or publication log names a slot "
                                    f"that was not free (replays_fold_log returned {got}; shards "
                                    f"folded up to {self.folded.tolist()})")

    def sample(self, n: int, out, arrays: dict) -> None:
        self.fold()
        batch = out.indices.shape[0]
        if self.meta[0] < batch:
            self._poll_rows(batch)
        got = out.kernels.sample_exactly_k(out.store, self.pool, self.remaining, self.meta,
                                           self.state, out.indices, out.kernel_out)
        if got < 0:
            raise RuntimeError(f"SharedExactlyKSampler: sample_exactly_k returned {got}")
        self.delivered += batch
        if got:  # after the copy: only now may a writer reuse the freed slots
            freed = self._k.replays_release(self.remaining, self.released_words, out.indices)
            if freed != got:
                raise RuntimeError(f"SharedExactlyKSampler: released {freed} slots of {got}")
            self.released += got

    def _poll_rows(self, batch: int) -> None:
        if self.timeout is None or batch > self.capacity:
            raise ValueError(self._short(batch) + ("; sample waits for rows only with a timeout"
                                                   if self.timeout is None else ""))
        deadline = time.monotonic() + self.timeout
        pause = 20e-6
        while self.meta[0] < batch:
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{self._short(batch)}; waited {self.timeout} s for the writers")
            time.sleep(pause)  # releases the GIL
            pause = min(2 * pause, 1e-3)
            self.fold()

    def sample_slices(self, n, streams, geo, reject, max_draws, out, arrays,
                      part=None) -> int:
        raise NotImplementedError("sample_sequences: sampler='exactly_k' delivers rows, not slices")

    def extra_state(self, copy: bool, size: int) -> dict:
        return {}  # the shared buffer's snapshot adds shared_state()

    def shared_state(self, cursors: list) -> dict:
        """``{"slots": int64[m], "counts": int64[m], "delivered": int, "released": int,
        "cursors": [int per shard]}`` as of the last fold (call under the lock, after
        :meth:`fold`): the pool in its order, the deliveries each slot has left."""
        m = int(self.meta[0])
        slots = self.pool[:m].astype(np.int64)
        return {"slots": slots, "counts": self.remaining[slots].astype(np.int64),
                "delivered": self.delivered, "released": self.released,
                "cursors": [int(c) for c in cursors]}

    def restore(self, slots: np.ndarray, counts: np.ndarray, heads: list, delivered: int,
                released: int) -> None:
        """The pool of a checkpoint (checked: slots distinct and held, counts in ``[1, k]``),
        every row of ``heads`` folded."""
        if self._k.replays_load(self.pool, self.remaining, self.meta, np.asarray(slots, np.int64),
                                np.asarray(counts, np.int64)) != 0:
            raise RuntimeError("SharedExactlyKSampler: a checked pool did not load")
        self.folded[:] = heads
        self.delivered, self.released = delivered, released

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
