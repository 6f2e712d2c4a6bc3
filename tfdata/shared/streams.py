"""The shards of a replay region as the streams a sampler samples: each writer's shard is one
stream, its head says which rows it holds, its reserve which it is writing.

:class:`ShardStreams` is the streams part of a :class:`~tfdata.SharedReplayBuffer` (the contract
of :mod:`tfdata.replay.streams`; a :class:`~tfdata.ReplayBuffer`'s is
:class:`~tfdata.replay.streams.RingStreams`): what a single-process sampler gets from its
buffer, it gives it over the shards, so that the same sampler object runs in both:

- the rows held, read from the heads before a draw (not a writer's size);
- the writes: a single-process writer calls the sampler's write hooks as it writes; across
  processes the writers cannot, so before each draw the rows published since the previous one
  are *caught up*: the sampler hears them through its ordinary hooks, in publication order
  within each shard (shard after shard), in slot coordinates. A sampler with a one-row hook
  (``slot_hook()``) hears each row as the generated push would have called it, one at a time
  (the hook may carry a ``rows(spans)`` form doing the same for many rows in one call); one
  without hears each shard's rows as one ``on_write(spans, n, None)``, as an
  ``extend`` would have called it. Rows a writer lapped before the catch-up are skipped (they
  can no longer be drawn);
- the draw over the rows held: where a single-process sampler draws in ``[0, n)`` (``n`` rows
  held, slots ``[0, n)``), the shards' rows held are numbered shard by shard. tfdata's uniform
  draw is the streams' own kernel (``sample_shared``: the number mapped to its shard's slot,
  the copy, the check and the one-row redraws in one call); a prioritized sampler draws from
  its trees, whose leaves are 0 for slots no shard holds, with ``n`` the capacity (its bound
  on the slots drawn); any other sampler is given ``n``, the rows held, and draws its own
  slots;
- without replacement: the sampler hears laps (``wraps_only``) and places the writes by the
  writer's position, which here is each shard's head: the catch-up and the draw are one kernel
  call over the sampler's pool (:func:`tfdata.kernels._pool.pool_fold_draw`: the rows each
  shard published since the last catch-up join the pass, shard by shard, from the oldest row
  not heard, as the ring's writes join it; a pass that ends is refilled with the rows each
  shard holds), so that one writer gives the batches of a :class:`~tfdata.ReplayBuffer`;
- after the copy, the torn-row check: a row whose slot a writer may have been writing while it
  was copied is drawn again. tfdata's uniform, prioritized and without-replacement draws
  redraw that row alone (the prioritized one from the same trees: no catch-up within a
  sample, so the weights of a batch refer to one distribution; the one without replacement
  from the pass, never a slot the batch holds); any other sampler (a user's, which has no
  one-row redraw) draws the whole batch again, after a new catch-up, until no row of it is
  torn (rare: only rows at a writer's oldest end while it overwrites them).

A free-slot region (exactly-k replay: each shard's writer puts a row into the next free slot
of its shard, see :class:`tfdata.replay.writers.FreeSlotWriter`) is caught up from the shards'
logs, which name the slot of each row published (the hook's ``rows(spans)``, the spans
``replays_log_spans`` reads); its writers never write a slot the sampler holds, so there is
no torn-row check and no redraw.

Called with the buffer's lock held.
"""

from __future__ import annotations

import numpy as np

from ..errors import SharedBufferError
from ..replay.samplers import sampler_name
from ..replay.slices import draw_slices
from ..replay.streams import Streams
from ..replay.buffer import TFDATA_SAMPLERS, ReplayBuffer
from ..replay.samplers.prioritized import PrioritizedSampler
from ..replay.samplers.uniform import UniformSampler
from ..replay.samplers.without_replacement import WithoutReplacementSampler

__all__ = ["ShardStreams", "MAX_REDRAWS", "check_sampler", "sampler_classes", "unsaved_reason"]

# batches (or rows) drawn again in one sample, at most, before concluding the writers never stop
MAX_REDRAWS = 1 << 20


#: the constructor's options a sampler's config() may not name (a checkpoint keeps both in one
#: config)
_BUFFER_OPTIONS = ("capacity", "num_writers", "mode", "policy", "layout", "seed", "ring_size",
                   "name", "dir", "prioritized", "alpha", "beta", "beta_final", "beta_steps", "eps",
                   "n_step", "gamma", "next_of", "roles", "memory_budget", "stats",
                   "rate_limiter", "sampler", "replays", "timeout", "frame_stack",
                   "frame_padding", "final_frames", "transforms")


def check_sampler(sampler, seed, mode, prioritized, n_step, frame_stack, rate_limiter) -> None:
    """Refuse what a sampler object does not combine with on a shared region (before it exists);
    returns None (the sampler by name: none)."""
    name = sampler_name(sampler)
    if seed is not None:
        raise ValueError(f"seed={seed} with a sampler object ({name!r}): the sampler holds its "
                         f"own seed; give seed= to the sampler")
    refused = [(mode == "fifo", "mode='fifo' (a FIFO delivers every row once, in order, without a sampler)"),
               (bool(prioritized), "prioritized=True (give PrioritizedSampler's settings as "
                                   "prioritized=True and alpha=..., not a sampler object)"),
               (n_step is not None, "n_step (not built for a sampler object: the windows' redraw "
                                    "needs a one-row redraw of the sampler)"),
               (frame_stack is not None, "frame_stack (not built for a sampler object, as n_step)")]
    for bad, why in refused:
        if bad:
            raise NotImplementedError(f"SharedReplayBuffer(sampler={name!r} object) with {why}")
    if not getattr(sampler, "stream_order", True) or getattr(sampler, "wraps_only", False):
        raise NotImplementedError(
            f"SharedReplayBuffer(sampler={name!r} object): a sampler that places the writes "
            f"(stream_order False) or hears only laps (wraps_only) reads a single-process "
            f"writer; use sampler='exactly_k' or 'without_replacement' by name")
    if hasattr(sampler, "storage"):
        raise ValueError(f"sampler {name!r} is bound to another buffer already")
    return None


def sampler_classes(given) -> dict:
    """``{name: class}`` of the sampler classes of the user's ``given`` to a shared buffer's
    ``load`` (an allow-list, checked as :meth:`tfdata.ReplayBuffer.sampler_classes` checks it)."""
    known = ReplayBuffer.sampler_classes(given)
    return {k: c for k, c in known.items() if k not in TFDATA_SAMPLERS}


def unsaved_reason(sampler) -> str | None:
    """Why a checkpoint could not rebuild a sampler object of a shared buffer (None: it can): it
    has no ``name``, one of tfdata's (tfdata's samplers are given by name), or options that are
    the buffer's own."""
    mine = type(sampler).__name__
    name = getattr(sampler, "name", None)
    if not isinstance(name, str) or not name:
        return (f"{mine} has no name: a sampler that is saved needs a name, config() and "
                f"from_config() (see tfdata.replay.samplers)")
    if name in TFDATA_SAMPLERS:
        return (f"a SharedReplayBuffer saves tfdata's samplers given by name, not a {mine} "
                f"object named {name!r}; give a sampler of yours a name of its own")
    clash = sorted(set(sampler.config()) & set(_BUFFER_OPTIONS))
    if clash:
        return f"{mine}.config() has the buffer's own option(s) {clash}"
    return None


class ShardStreams(Streams):
    """The shards of a region as streams (see the module docstring): where each writer's rows
    are, which of them are valid, the catch-up of the sampler on the rows published, and the
    draws (rows, n-step windows, frame stacks, slices) that draw again what a writer touched
    while it was copied. Called with the buffer's lock held.

    Parameters
    ----------
    region
        The buffer's region: ``heads`` and ``reserved`` (uint64 ``(shards,)`` strided views of
        the shards' published and begun counters), ``cap`` slots per shard, ``mode``, and its
        frame tables (``frames``, or None).
    flags : tuple of ndarray of bool, or None
        The region's ``terminated`` and ``truncated`` fields, shape (shards * cap,): where the
        shards' episodes end (None: no slices).
    allocator
        Allocates the geometry and the per-batch marks.
    kernels
        The compiled kernels of a region (:func:`tfdata.shared.region.kernels`).
    name : str
        The buffer's, for messages.
    nstep, frames : bool
        Whether the buffer's transforms are an n-step transform, then a frame stack (either may
        be absent); the transforms after them are the sample transforms (``transforms=``),
        applied once the draw is final.
    given : bool
        The sampler is an object of the user's.

    Attributes
    ----------
    geo : ndarray of int64, shape (2 + 7 * shards,)
        The geometry the stream kernels read: ``[shards, cap]``, then :attr:`heads_snapshot`.
    heads_snapshot : ndarray of int64, shape (7 * shards,)
        The heads snapshot of :func:`tfdata.kernels.read_heads` and the write windows of the
        torn-row check, for windows, stacks and slices (a view of :attr:`geo`).
    published : ndarray of int64, shape (shards,)
        Rows of each shard the sampler has heard of (caught up to): what a checkpoint's heads
        restore.
    scratch : ndarray of int64, shape (7 * shards + batch,)
        The rows' heads snapshot and write windows, and one mark per row of the largest batch
        reserved (:meth:`reserve`).
    redraws : int
        Rows and slices drawn again because a writer may have been writing them while they
        were copied.
    sampling : str
        How the sampler is run: ``"uniform"``, ``"prioritized"``, ``"without_replacement"``
        (tfdata's draws, see the module docstring), ``"free_slots"`` (exactly-k, caught up
        from the shards' logs) or ``"any"``.
    """

    kind = "shards"

    def __init__(self, region, flags, allocator, kernels, name: str, nstep: bool = False,
                 frames: bool = False, given: bool = False):
        from .. import kernels as _kernels  # numba, once a buffer is built
        from ..kernels import _pool
        from ..kernels._shared_tree import published_spans
        from ..kernels._streams import SHARD_HEADER

        self._region, self._k, self.name = region, kernels, name
        self.kernels = _kernels.SHARDS
        self.heads, self.reserved, self.cap, self.steps = region.heads, region.reserved, region.cap, region.cap
        self.shards = self.heads.shape[0]
        self.mode = region.mode
        self.flags, self.allocator = flags, allocator
        self._nstep, self._frames, self._given = nstep, frames, given
        # the transforms (n-step, frames: the first of the list) a redrawn row is rebuilt by
        self._own = int(nstep) + int(frames)
        self.episode = np.zeros(0, np.uint32)  # the shards' episodes end at flagged rows
        self.geo = allocator.zeros(SHARD_HEADER + 7 * self.shards, np.int64)
        self.geo[:SHARD_HEADER] = (self.shards, self.cap)
        self.heads_snapshot = self.geo[SHARD_HEADER:]
        self.published = np.zeros(self.shards, np.int64)
        self._spans = np.zeros((2 * self.shards, 2), np.int64)  # the catch-up's spans of slots
        self._published_spans, self._pool = published_spans, _pool
        self.scratch = np.zeros(7 * self.shards + 1, np.int64)
        self.redraws = 0
        self._one = np.zeros(7 * self.shards + 1, np.int64)  # a one-row redraw's scratch
        self._none = np.zeros(0, np.int64)  # a draw of no row: the pool's catch-up alone
        self._hook = self._hook_rows = self._sampler = self._log = None
        self.sampling = "any"

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays this part holds in this process (the heads and reserve words are
        the region's)."""
        runs = 0 if self._log is None else self._runs.nbytes  # a free-slot region's catch-up
        return int(self.geo.nbytes + self.published.nbytes + self._spans.nbytes + self.scratch.nbytes
                   + self._one.nbytes + runs)

    def bind(self, sampler, log=None) -> None:
        """The sampler whose write hooks the catch-up calls and whose draws are checked (once,
        after it is bound); ``log``: a free-slot region's logs (uint64, one word per slot; see
        the module docstring)."""
        self._sampler = sampler
        cls = type(sampler)
        if log is not None:  # a free-slot region: no torn rows, slots from the logs
            from ..kernels._replays import replays_log_spans

            self.sampling, self._log, self._log_spans = "free_slots", log, replays_log_spans
            self._hook = sampler.slot_hook()
            self._hook_rows = self._hook.rows
            self._runs = np.zeros((1024, 2), np.int64)
            return
        if isinstance(sampler, UniformSampler) and cls.sample is UniformSampler.sample:
            self.sampling = "uniform"
        elif isinstance(sampler, PrioritizedSampler) and cls.sample is PrioritizedSampler.sample:
            self.sampling = "prioritized"
            sampler.ring = self.cap  # its epoch counts laps of a shard: a slot's writes
        elif (isinstance(sampler, WithoutReplacementSampler)
              and cls.sample is WithoutReplacementSampler.sample):
            self.sampling = "without_replacement"  # hears the heads: its catch-up is the pool's
            return
        if getattr(sampler, "hears_writes", False):
            self._hook = sampler.slot_hook()
            self._hook_rows = getattr(self._hook, "rows", None)

    def reserve(self, batch: int) -> None:
        """Room for a batch of ``batch`` rows in :attr:`scratch` (when an output ring is built,
        never while sampling)."""
        need = 7 * self.shards + batch
        if self.scratch.shape[0] < need:
            self.scratch = np.zeros(need, np.int64)

    # -- the rows held and the writes -------------------------------------------------------
    def catch_up(self, scratch: np.ndarray) -> int:
        """Read the heads into ``scratch``, then let the sampler hear the rows published since
        the last catch-up (see the module docstring); returns the rows held."""
        if self._log is not None:
            return self._catch_up_log(scratch)
        if self.sampling == "without_replacement":
            return self._pool_draw(scratch, self._none)
        held, m = self._published_spans(self.heads, self.cap, scratch, self.published, self._spans)
        if m == 0 or self._sampler is None or not getattr(self._sampler, "hears_writes", False):
            return held
        spans = self._spans[:m]
        if self._hook_rows is not None:  # the one-row hook over every span, in one call
            self._hook_rows(spans)
        elif self._hook is not None:  # as the generated push would call it, one row at a time
            hook = self._hook
            for dst, count in spans.tolist():
                for slot in range(dst, dst + count):
                    hook(slot)
        else:  # each shard's rows as an extend of them would call on_write
            cap, at = self.cap, 0
            while at < m:
                shard, n = spans[at, 0] // cap, 0
                group = []
                while at < m and spans[at, 0] // cap == shard:
                    dst, count = int(spans[at, 0]), int(spans[at, 1])
                    group.append((dst, n, count))
                    n += count
                    at += 1
                self._sampler.on_write(group, n, None)
        return held

    def _catch_up_log(self, scratch: np.ndarray) -> int:
        """The catch-up of a free-slot region: the slots published since, from the logs, heard
        through the hook's ``rows(spans)``; ``scratch`` gets the positions heard (a shard's
        ``heads`` as the checkpoint reads them); returns the rows published."""
        runs = self._runs
        while True:
            r = self._log_spans(self.heads, self._log, self.published, self.cap, runs)
            if r < 0:
                raise SharedBufferError(
                    f"a shard's head or publication log names a slot that was not free "
                    f"(replays_log_spans returned {r}; shards heard up to "
                    f"{self.published.tolist()})")
            if r and self._hook_rows(runs[:r]):
                raise SharedBufferError(f"a shard's writer published a row into a slot whose "
                                        f"row awaits replay (shards heard up to "
                                        f"{self.published.tolist()})")
            if r < runs.shape[0]:
                break
        n = self.shards
        scratch[n:2 * n] = self.published
        scratch[:n] = np.minimum(self.published, self.cap)
        return int(self.published.sum())

    def _pool_draw(self, scratch: np.ndarray, idx: np.ndarray, i: int = -1) -> int:
        """Without replacement: the rows published since join the sampler's pass, then ``idx``
        is drawn (``i >= 0``: ``idx[i]`` again, out of reach of the batch's other rows);
        returns the rows held."""
        sm, pool = self._sampler, self._pool
        if i < 0:
            got = pool.pool_fold_draw(self.heads, self.cap, sm.pool, sm.inpool, sm.meta,
                                      self.published, scratch, sm.state, idx)
        else:
            got = pool.pool_fold_redraw(self.heads, self.cap, sm.pool, sm.inpool, sm.meta,
                                        self.published, scratch, sm.state, idx, i)
        if got == -3:
            raise self.too_few(idx.shape[0], int(sm.meta[2]))
        if got < 0:  # the arrays are the sampler's and this part's: a bug, not the caller's input
            kernel = "pool_fold_draw" if i < 0 else "pool_fold_redraw"
            raise RuntimeError(f"shard streams: {kernel} returned {got}")
        return int(sm.meta[2])

    # -- drawing ------------------------------------------------------------------------------
    @property
    def rule(self) -> str:
        """How a batch takes rows, for messages: the sampler's ``rule``."""
        return getattr(self._sampler, "rule", "rows are drawn by this sampler")

    def too_few(self, batch: int, n: int | None = None) -> ValueError:
        """The error for a batch of ``batch`` rows with ``n`` held (None: read the heads)."""
        if n is None:  # rows held, from the heads as they are now (an error path only)
            n = int(np.minimum(self.heads.astype(np.int64), self.cap).sum())
        return ValueError("cannot sample from an empty buffer" if n == 0 else
                          f"batch_size {batch} is larger than the {n} rows held; {self.rule} "
                          f"(sampler {sampler_name(self._sampler)!r})")

    def draw_rows(self, out, arrays: dict) -> None:
        """Catch up, let the sampler draw and gather over the rows held, check the copy, and
        draw torn rows again (see the module docstring)."""
        sm, k, scratch, kind = self._sampler, self._k, self.scratch, self.sampling
        idx = out.indices
        if kind == "uniform":  # no catch-up: a uniform draw hears no writes
            got = out.kernels.sample_shared(out.store, self.heads, self.reserved, self.cap,
                                            scratch, sm.state, idx, out.kernel_out, MAX_REDRAWS)
            if got == -2:
                raise self.too_few(idx.shape[0])
            if got < 0:
                raise SharedBufferError(f"{MAX_REDRAWS} rows drawn were all mid-write")
            self.redraws += got
            return
        if kind == "free_slots":  # rows held are never written: no check, no redraw
            sm.sample(self.catch_up(scratch), out, arrays)
            return
        batch = idx.shape[0]
        mark = scratch[7 * self.shards:7 * self.shards + batch]
        tries = 0
        while True:
            if kind == "without_replacement":  # the catch-up and the draws in one call
                self._pool_draw(scratch, idx)
                out.source.gather(idx, out)
            else:
                held = self.catch_up(scratch)
                if held < batch and not getattr(sm, "waits_for_rows", False):
                    raise self.too_few(batch, held)
                sm.sample(sm.capacity if kind == "prioritized" else held, out, arrays)
                if kind == "any":
                    self._check_held(idx, scratch)
            if not k.torn_after_copy(self.reserved, self.cap, scratch, idx, mark):
                return
            if kind != "any":  # rare: only rows a writer overwrote while copied, one by one
                for i in range(batch):
                    if mark[i]:
                        self.redraw(i, out, arrays)
                return
            tries += 1
            self.redraws += batch
            if tries == MAX_REDRAWS:
                raise SharedBufferError(f"{MAX_REDRAWS} batches drawn by sampler "
                                        f"{sampler_name(sm)!r} all held rows being written")

    def _check_held(self, idx: np.ndarray, scratch: np.ndarray) -> None:
        """Refuse a batch of a sampler of the user's that holds a slot no shard held when the
        heads were read (its rows would not be rows of the buffer)."""
        shard, at = np.divmod(idx, self.cap)
        bad = (idx < 0) | (shard >= self.shards)
        bad[~bad] |= at[~bad] >= scratch[shard[~bad]]
        if bad.any():
            i = int(np.argmax(bad))
            raise ValueError(f"sampler {sampler_name(self._sampler)!r} drew slot {int(idx[i])}, "
                             f"which holds no row (a shard of {self.cap} slots holds its rows "
                             f"from its first slot on: shard s, row r at slot s * {self.cap} + "
                             f"r % {self.cap}; rows held per shard "
                             f"{scratch[:self.shards].tolist()[:16]})")

    def redraw(self, i: int, out, arrays: dict) -> None:
        """Draw row ``i`` of ``out`` again until it copies cleanly, against heads read afresh
        (tfdata's uniform, prioritized and without-replacement draws; the prioritized one from
        the same trees, the one without replacement from the pass)."""
        sm, k, kind = self._sampler, self._k, self.sampling
        if kind == "uniform":
            got = out.kernels.sample_shared(out.store, self.heads, self.reserved, self.cap,
                                            self._one, sm.state, out.indices[i:i + 1],
                                            out.source.kernel_rows(out, i, 1), MAX_REDRAWS)
            if got < 0:
                raise SharedBufferError(f"{MAX_REDRAWS} rows drawn were all mid-write")
            self.redraws += got + 1
            return
        if kind not in ("prioritized", "without_replacement"):
            raise NotImplementedError(f"sampler {sampler_name(sm)!r} has no one-row redraw")
        scratch = self.scratch
        one = slice(i, i + 1)
        idx = out.indices[one]
        mark = scratch[7 * self.shards + i:7 * self.shards + i + 1]
        mark[0] = 1
        tries = 0
        while mark[0]:
            if tries == MAX_REDRAWS:
                raise SharedBufferError(f"{MAX_REDRAWS} rows drawn were all mid-write")
            tries += 1
            if kind == "without_replacement":  # the rows published since join first
                self._pool_draw(scratch, out.indices, i)
            else:
                u, w, v = arrays["scratch"][one], arrays["weights"][one], arrays["versions"][one]
                k.read_heads(self.heads, self.cap, scratch)
                if k.draw_prioritized(*sm.trees, sm.v8, sm.ring, sm.state, sm.beta, idx, u, w, v):
                    raise sm.no_mass(0)
            out.source.gather_at(idx, out, i)
            k.torn_after_copy(self.reserved, self.cap, scratch, idx, mark)
        self.redraws += tries

    # -- windows, stacks and slices ----------------------------------------------------------
    @property
    def has_episodes(self) -> bool:
        """Whether slices can end at episodes' ends (the region has the flags fields)."""
        return self.flags is not None

    def at(self, where=None) -> np.ndarray:
        """The geometry as of the last :meth:`snapshot` (``where`` is not read)."""
        return self.geo

    def snapshot(self) -> int:
        """Read every head once (acquire) into the geometry; returns rows held."""
        return self._k.read_heads(self.heads, self.cap, self.heads_snapshot)

    def torn(self, rows: np.ndarray, mark: np.ndarray) -> int:
        """After the rows of ``rows`` (int64 ``(m,)``; each a window's or slice's oldest row)
        were copied: ``mark[i] = 1`` where a writer may have been writing since the snapshot
        (a writer overwrites its oldest rows first: if the first row of a window was not
        touched, none of its newer rows was); returns how many."""
        return self._k.torn_after_copy(self.reserved, self.cap, self.heads_snapshot, rows, mark)

    def redraw_torn(self, mark: np.ndarray, redo, torn, what: str) -> None:
        """For every ``i`` marked (its rows may have been written while read): read the heads
        afresh, ``redo(i)`` (draw and copy again), check again (``torn(i, mark[i:i + 1])``),
        until it copies cleanly (lock held)."""
        snap = self.heads_snapshot
        for i in range(mark.shape[0]):
            tries = 0
            while mark[i]:
                if tries == MAX_REDRAWS:
                    raise SharedBufferError(f"shared buffer {self.name!r}: {MAX_REDRAWS} {what} "
                                            f"drawn were all being written")
                tries += 1
                self._k.read_heads(self.heads, self.cap, snap)
                redo(i)
                torn(i, mark[i:i + 1])

    def ring_arrays(self, batch_size: int, length, out) -> dict:
        return {"mark": self.allocator.zeros(batch_size, np.int64)}

    def ring_nbytes(self, batch_size: int) -> int:
        return 8 * batch_size

    def check_slices(self, sampler, n, reject, max_draws, out, arrays, marks) -> None:
        """Draw again every slice of ``out`` whose first row (its oldest: if no writer touched
        it, none touched the rest) a writer may have been overwriting while it was copied."""
        mask = arrays["mask"]
        idx = out.indices.reshape(mask.shape)
        length = idx.shape[1]
        if not self.torn(idx[:, 0], marks):
            return

        def redo(b):
            self.redraws += 1
            if sampler.sample_slices(n, self, self.geo, reject, max_draws, out, arrays,
                                     slice(b, b + 1)) != -1:
                raise ValueError(f"policy='reject': no slice of {length} steps found")
            out.source.gather_at(idx[b], out, b * length)

        def torn(b, m):
            return self.torn(idx[b:b + 1, 0], m)

        self.redraw_torn(marks, redo, torn, "slices")

    # -- the draws of the sample path (the contract of tfdata.replay.streams) ----------------
    def draw(self, n: int, out, arrays: list, transforms: tuple) -> None:
        """Fill ``out`` (lock held; ``n`` is not read: the heads say what is held): the rows
        alone, or with the n-step windows and frame stacks (:meth:`windows`); then the sample
        transforms (``transforms=``, the ring's after those two), once, on the whole batch:
        every row a writer touched has been drawn again by then, so each is applied exactly
        once, to the rows returned."""
        own = self._own
        if own:
            t = transforms[0] if self._nstep else None
            self.windows(out, arrays, t, transforms[own - 1] if self._frames else None)
        else:  # caught up, drawn, checked by the shard rows
            self.draw_rows(out, arrays[0])
        if len(transforms) > own:
            rows, geo = out.indices, self.geo
            for i in range(own, len(transforms)):
                rows = transforms[i].apply(out, arrays[i + 1], rows, geo)

    def refuse_slices(self) -> None:
        """Refuse what this buffer cannot slice, saying why."""
        if self.mode == "fifo":
            raise SharedBufferError(f"shared buffer {self.name!r} is a FIFO queue: use get_batch()")
        if self.sampling == "without_replacement":
            raise NotImplementedError(
                "SharedReplayBuffer(sampler='without_replacement') draws no sequences (a slice of "
                "a shard starts at rows its writer keeps moving; see ARCHITECTURE.md): use "
                "sampler='uniform' or prioritized=True for sample_sequences")
        if self._given:
            raise NotImplementedError(f"sample_sequences of a SharedReplayBuffer with a sampler "
                                      f"object ({sampler_name(self._sampler)!r}) is not built: "
                                      f"its slices follow the shards' geometry, not the sampler's "
                                      f"sample_slices; use sampler='uniform' or prioritized=True")
        if self._frames:
            raise NotImplementedError("sample_sequences of a SharedReplayBuffer with frame_stack is "
                                      "not implemented (sample() rebuilds the stacks); use a "
                                      "ReplayBuffer(frame_stack=...) in one process for slices")

    def windows(self, out, arrays, t=None, ft=None) -> None:
        """Draw, then the n-step windows (``t``: the ring's NStep, or None) and the frame stacks
        (``ft``: the ring's FrameStack, or None) as of heads read before the draw (the streams'
        snapshot), then redraw every row whose window or stacks a writer may have touched while
        they were read (lock held).

        A writer overwrites its oldest rows first: if a window's first row was not touched
        since the snapshot, none of its later (newer) rows was. A stack reads its row, up to
        K - 1 rows back and one row forward (its next frame): the obs stack is the window's
        first row's, the next_obs stack its last row's."""
        k, r = self._k, self._region
        fa = None if ft is None else arrays[self._own]  # the frame stack's (the last of the own)
        heads = self.heads_snapshot
        # the marks of the rows drawn: the n-step transform's, or the frame transform's (which
        # then also marks the windows' last rows)
        mark = fa["mark"] if t is None else arrays[1]["mark"]
        k.read_heads(self.heads, self.cap, heads)  # before the draw: nothing reads past these rows
        self.draw_rows(out, arrays[0])
        last = out.indices if t is None else t.apply(out, arrays[1], out.indices, self.geo)
        if ft is not None:
            ft.apply(out, fa, last, self.geo)
            depth, kmax = r.frames.depth, r.frames.kmax

        def torn(i, m):
            part = slice(None) if i is None else slice(i, i + 1)
            if ft is None:
                return k.torn_after_copy(self.reserved, self.cap, heads, out.indices[part], m)
            got = k.torn_stacks(self.reserved, self.cap, heads, out.indices[part], depth, kmax, m)
            if t is not None:  # the next stacks were read at the windows' last rows
                more = fa["mark"][part]
                if k.torn_stacks(self.reserved, self.cap, heads, last[part], depth, kmax, more):
                    np.bitwise_or(m, more, out=m)
                    got = int(np.count_nonzero(m))
            return got

        if torn(None, mark):
            def redo(i):
                self.redraw(i, out, arrays[0])
                if t is not None:
                    t.apply_row(out, arrays[1], i, self.geo)
                if ft is not None:
                    ft.apply_row(out, fa, i, self.geo, last[i:i + 1])

            self.redraw_torn(mark, redo, torn, "windows" if ft is None else "stacks")

    def slices(self, n: int, out, arrays, length: int, reject: bool):
        """Draw ``out``'s slices of ``length`` rows (``arrays``: the sampler's and the
        streams' arrays; ``n`` is not read: the heads say what is held) as of heads read before
        the draw, and redraw every slice a writer may have been overwriting while it was copied
        (lock held). ``reject``: policy="reject" (ValueError when no start gives a slice; the
        refused sample consumes no randomness). Returns the geometry the slices were drawn in."""
        batch_size = out.indices.shape[0] // length
        # before the draw: the sampler hears the rows published, and slices end at these heads
        held = self.catch_up(self.heads_snapshot)
        if held < batch_size:
            raise self.too_few(batch_size, held)
        draw_slices(self._sampler, self, held, self.geo, reject, length, out, arrays[0],
                    arrays[1]["mark"])
        return self.geo
