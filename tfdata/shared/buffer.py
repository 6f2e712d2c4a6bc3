"""The learner's side of a shared-memory buffer: :class:`SharedReplayBuffer` (see
:mod:`tfdata.shared`), the replay parts over a region, with the parts of this package for what
only a region has (torn-row redraws, column reads, the FIFO learner, the limiter's gate,
checkpoints)."""

from __future__ import annotations

import os
import threading
import weakref

import numpy as np

from .. import alloc
from .._budget import check_budget, parse_bytes
from .._checks import check_int as _check_int
from ..batch import Batch
from ..errors import SharedBufferError
from ..replay import combinations
from ..replay.prioritized import PrioritizedReplayBuffer, update_args
from ..replay.samplers import Sampler, sampler_name as _sampler_name
from ..replay.samplers.prioritized import PrioritizedSampler
from ..replay.samplers.exactly_k import ExactlyKSampler, PollWaits
from ..replay.samplers.uniform import UniformSampler
from ..replay.samplers.without_replacement import WithoutReplacementSampler
from . import frames as shared_frames
from ..replay.frames import FrameStack
from ..replay.rings import Rings
from ..replay.sampling import Sampling
from ..replay.slices import Slices
from ..replay.transforms import NStep, episode_options
from ..spec import Spec
from ..transforms import Context, check_transforms
from ..storage import output_nbytes, resolve_layout
from .columns import ShardColumns
from .fifo import FifoLearner
from .gate import SampleGate, ShardGate, WriterWatch, check_limiter
from .region import (FORMAT, MODES, POLICIES, VERSION, check_shards, exactly_k_options,
                     frame_options, kernels, make_region, region_layout, region_path,
                     remove_region)
from .state import ShardCheckpoint
from .streams import ShardStreams, check_sampler, sampler_classes, unsaved_reason

__all__ = ["SharedReplayBuffer"]

#: why a shared buffer's transforms cannot read running statistics (``Normalize``)
NO_STATS = ("a SharedReplayBuffer keeps no running statistics (stats= is not supported: they "
            "hear the writes of one process's buffer)")


class _RingBudget:
    """The output rings of a shared buffer (``rings``) and the memory budget's check of a new
    one (``check_ring``, the :class:`~tfdata.replay.rings.Rings` contract): the buffer's parts'
    bytes, plus the ring's (``nstep``: the buffer's n-step transform or None)."""

    def __init__(self, buffer, nstep):
        self._buffer = weakref.ref(buffer)  # (a part must not keep the buffer alive)
        self._nstep = nstep
        self.rings = weakref.WeakSet()

    def check_ring(self, batch_size: int, length, fields, lock) -> None:
        buf = self._buffer()
        if buf.memory_budget is None:
            return
        r, rows, streams = buf._region, batch_size * (length or 1), buf._streams
        source = fields
        if r.frames is not None:  # the stored fields but the frames; the stacks come after
            source = tuple(n for n in (buf.spec.names if fields is None else fields)
                           if n in r.stored_spec and n not in r.frames.stacks)
        nbytes = buf.nbytes_parts
        nbytes["new output ring"] = buf._ring_size * (
            output_nbytes(r.stored_spec, rows, r.stored_layout, source)
            + buf.sampler.ring_nbytes(batch_size, length)
            + (0 if self._nstep is None or length else
               self._nstep.plan_ring_streams(batch_size, None, fields))
            + (streams.ring_nbytes(batch_size) if length else 0)
            + (0 if r.frames is None else
               FrameStack.plan_ring(buf.spec, r.frames.frames, rows, fields)
               + streams.ring_nbytes(batch_size))
            + sum(t.ring_nbytes(buf._tctx, rows, fields) for t in buf._transforms))
        check_budget(buf.memory_budget, nbytes, f"sampling batches of {batch_size}"
                     + (f" slices of {length} rows" if length else " rows")
                     + (f" of fields {list(fields)}" if fields is not None else ""))


class SharedReplayBuffer(Sampling):
    """A buffer in shared memory that writer processes fill and this process samples or drains.

    Built from the replay parts: the region is the storage's backing
    (:mod:`tfdata.storage.region`), and its shards are the streams a sampler samples
    (:class:`tfdata.shared.streams.ShardStreams`: the rows held read from the writers' heads,
    the writes published since the last sample caught up through the sampler's write hooks,
    rows torn during the copy drawn again), so the samplers of a
    :class:`~tfdata.ReplayBuffer` (uniform, prioritized, or one of the user's) fill the same
    :class:`~tfdata.batch.OutputRing` batches. :meth:`sample` and :meth:`sample_sequences` are
    the replay side's (:class:`~tfdata.replay.sampling.Sampling`) over those parts: rows (and
    windows, stacks, slices) a writer may have been writing while they were copied are drawn
    again, so none is ever returned; with no writer writing, the same seed and rows give the
    same batches on both layouts and, with one writer, those of a ``ReplayBuffer`` given the
    same rows. ``batch.indices`` are slots of the region (shard ``slot // shard_capacity``);
    slices are of one writer's stream (its shard) within one episode.

    Parameters
    ----------
    spec : Spec or mapping
        The row schema.
    capacity : int
        Slots in all, a multiple of ``num_writers``; each writer owns ``capacity // num_writers``
        consecutive slots (its shard). In ``"fifo"`` mode this is the queue's capacity.
    num_writers : int, default 1
        Writer processes (shards). Each attaches with ``SharedWriter(buffer.name, shard)``.
    mode : {"replay", "fifo"}, default "replay"
        ``"replay"``: shards are rings (the oldest row is overwritten) and :meth:`sample` draws
        uniformly from every complete row. ``"fifo"``: shards are queues and :meth:`get_batch`
        delivers every row exactly once, in arrival order.
    policy : {"block", "drop"}, optional
        FIFO, or ``sampler="exactly_k"`` (default ``"block"``): when a writer's shard is full
        (of rows not yet delivered, or with exactly-k, when no slot of the shard is free: every
        one holds a row not yet delivered ``replays`` times; rows are written into any free
        slot, so a writer never waits behind one row) it waits for the learner
        (``"block"``), or writes the rows that fit and drops the rest, counted in the metrics
        (``"drop"``). ``"overwrite"`` is not implemented across processes.
    sampler : {"uniform", "without_replacement", "exactly_k"}, optional
        Replay mode: uniform (None, the default); ``"without_replacement"``: every row once per
        pass, the rows the writers publish during a pass joining it, as
        :class:`~tfdata.ReplayBuffer`'s sampler of that name, run over the shards by
        :class:`~tfdata.shared.streams.ShardStreams` (the learner owns the pool, 5 bytes per slot;
        not with ``prioritized=True``, nor for :meth:`sample_sequences`); or exactly-k replay,
        each row delivered in exactly ``replays`` batches (the
        :class:`~tfdata.replay.samplers.exactly_k.ExactlyKSampler` of a
        :class:`~tfdata.ReplayBuffer`, each shard's writer process placing rows in free slots;
        ``buf.sampler.delivered``, ``released``; ``writers()[s]["dropped"]``; ``len(buf)``: rows
        awaiting replay). The region holds 24 more bytes per slot. Checkpoints keep the pool.
        Not with ``prioritized``, ``n_step`` or :meth:`sample_sequences`.
        Or a :class:`~tfdata.replay.samplers.Sampler` object, a user's too, run as
        :mod:`tfdata.shared.streams` says (its seed its own: no ``seed=``); saved by its
        ``name`` and ``config()``, loaded with ``load(path, samplers=[TheClass])``. Not with
        ``prioritized``, ``n_step``, ``frame_stack``, ``mode="fifo"`` or
        :meth:`sample_sequences` (not built).
    replays : int, optional
        ``sampler="exactly_k"`` only (default 1), in ``[1, 65535]``.
    timeout : float, optional
        ``sampler="exactly_k"`` only: seconds a :meth:`sample` short of rows awaiting replay
        polls for the writers before TimeoutError (None: ValueError at once). A blocked
        writer's own wait is :class:`SharedWriter`'s ``timeout``.
    layout : {"aos", "soa"} or list of lists of str, optional
        As for :class:`~tfdata.ReplayBuffer` (a grouping: column groups); samples do not
        depend on it.
    seed : int, optional
        Seed of the sampling generator (None draws one).
    ring_size : int, default 2
        Preallocated output batches per batch size (see :class:`~tfdata.Batch`).
    name : str, optional
        The name writers attach by; default a fresh unique one.
    dir : str, optional
        Directory of the region; default :func:`shm_dir` (``/dev/shm``). Use a tmpfs large
        enough for the buffer (a container's ``/dev/shm`` may be only 64 MiB), or a disk
        directory (then the page cache holds the rows).
    prioritized : bool, default False
        Replay mode only: sample in proportion to priorities, as a
        :class:`~tfdata.PrioritizedReplayBuffer` does, with :meth:`update_priorities`,
        :meth:`priorities`, ``batch.weights`` and ``batch.versions``. The learner owns the
        priority trees (in this process); writers never see them. Each :meth:`sample` first
        folds the rows published since the last one into the trees, in publication order,
        giving each what a push gives it in a single-process buffer (its slot's old row evicted,
        the live maximum priority), so with one writer the batches are those of a
        ``PrioritizedReplayBuffer`` given the same rows one push at a time, as long as a shard
        publishes at most ``shard_capacity`` rows between two samples. Rows a writer laps
        before the next sample are never folded (they can no longer be sampled): a fold does at
        most ``capacity`` tree updates, however far the writers ran ahead.
    alpha, beta, beta_final, beta_steps, eps
        As for :class:`~tfdata.PrioritizedReplayBuffer` (``prioritized=True`` only).
    n_step, gamma, next_of, roles
        Replay mode only: n-step transitions as :class:`~tfdata.ReplayBuffer` samples them, each
        writer's shard being one stream (a window never leaves its shard, and stops at an
        episode end or at the shard's newest published row). ``batch.discounts`` is
        ``gamma ** k``. A window a writer may have been overwriting while it was read is drawn
        again, like a torn row. With one writer the batches are those of a ``ReplayBuffer``
        (or ``PrioritizedReplayBuffer``) with the same rows and ``n_step``.
    memory_budget : int or str, optional
        Bytes this buffer may hold in all (:attr:`nbytes_parts`: the region, the trees, the
        output rings); checked before the region is created and before a new output ring is
        allocated (:class:`~tfdata.MemoryBudgetError`, nothing changed).
    rate_limiter : tfdata.RateLimiter, optional
        Replay mode only (ValueError with ``mode="fifo"``): keep rows sampled per row
        published near its ``samples_per_insert``. :meth:`sample` and :meth:`sample_sequences`
        wait (polling, the GIL released, without this buffer's lock) while sampling would run
        ahead, and for ``batch_size`` rows; ``SharedWriter.push``/``extend`` wait while
        inserting would run ahead (up to the writer's ``timeout``, else the limiter's). Inserts
        are the rows every shard published (its head), samples the count this learner
        publishes in the region's control words; writers read the parameters from
        ``region.json``. Writers check and write without a lock between processes, so with
        ``W`` writers the insert bound may be overshot by one write of each other writer. A
        sample waiting while every writer has finished or died raises SharedBufferError;
        closing the buffer makes waiting writers raise SharedBufferError. The counts are in
        checkpoints. See :mod:`tfdata.replay.limiter`.
    frame_stack, frame_padding
        As for :class:`~tfdata.ReplayBuffer` (replay mode, uniform or prioritized, with or
        without ``n_step``): a stacked observation (``obs: (K, *frame)``, ``next_obs`` of the
        same shape) is stored one frame per row, and the stacks are rebuilt at sample time from
        the writer's shard, exactly as pushed. Each writer's writes are checked against its own
        shard (a stream must start at an episode's first row and stay continuous: SpecError,
        nothing written). The depths, the frames of overwritten rows, the final and pending
        frames live in the region (see :mod:`tfdata.shared.frames`); a row whose stack a
        writer touched while it was read is drawn again, like a torn row. Not with
        ``mode="fifo"``, ``sampler="without_replacement"`` or ``"exactly_k"``, nor for
        :meth:`sample_sequences` (NotImplementedError or ValueError naming the combination).
    final_frames : int, optional
        With ``frame_stack``: entries per shard of the table of final frames (the next frame
        of rows that end an episode), at most the shard capacity; default
        ``shard_capacity // 64 + 2``. A region cannot grow: a write whose episode end would
        need an entry that a held row still uses (more than ``final_frames`` episodes ending
        within ``shard_capacity`` rows of a shard) is refused with SharedBufferError, nothing
        written.
    transforms : list, optional
        Replay mode: transforms applied to every batch, as :class:`~tfdata.ReplayBuffer`'s
        ``transforms=`` (:mod:`tfdata.transforms`): after the draw is final (every row, window
        or stack a writer touched drawn again), on the whole batch, once, after the n-step
        returns and frame stacks; per step of :meth:`sample_sequences` slices. ``RandomShift``'s
        counter is in checkpoints. Not ``Normalize`` (NotImplementedError: a shared buffer
        keeps no running statistics, see ``stats``), nor with ``mode="fifo"``.
    stats : None
        Not supported (NotImplementedError): running statistics hear the writes of one
        process's buffer; so is :meth:`update_field`. :meth:`column` and :meth:`column_stats`
        read the shards' rows as the writers leave them.

    Notes
    -----
    Options that do not combine are refused before the region exists, with a message naming
    both (the table :data:`tfdata.replay.combinations.RULES`): ``mode="fifo"`` with priorities,
    ``sampler=``, ``n_step``, ``frame_stack`` or a rate limiter; ``sampler="exactly_k"`` with
    priorities, ``n_step``, ``frame_stack``, ``policy="overwrite"`` (not built) or a limiter
    whose ``samples_per_insert`` is not ``replays``; ``frame_stack`` with
    ``sampler="without_replacement"`` (not built); ``stats``.

    The owner (this object, in the process that built it) removes the region when it is
    closed or collected; writers still attached then fail their next write with
    :class:`~tfdata.SharedBufferError`. Learner threads may share the object: sampling and
    draining hold a lock of this process (never one shared with the writers).
    """

    def __init__(self, spec, capacity: int, *, num_writers: int = 1, mode: str = "replay",
                 policy: str | None = None, layout=None, seed: int | None = None,
                 ring_size: int = 2, name: str | None = None, dir: str | None = None,
                 prioritized: bool = False, alpha: float = 0.6, beta: float = 0.4,
                 beta_final: float = 1.0, beta_steps: int | None = None, eps: float = 1e-6,
                 n_step: int | None = None, gamma: float = 0.99, next_of="auto", roles=None,
                 memory_budget=None, stats=None, rate_limiter=None, sampler=None,
                 replays: int | None = None, timeout: float | None = None, frame_stack=None,
                 frame_padding="reset", final_frames: int | None = None, transforms=None):
        spec = spec if isinstance(spec, Spec) else Spec(spec)
        shards, cap = check_shards(capacity, num_writers)
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        given = sampler if isinstance(sampler, Sampler) else None  # any sampler (a user's too)
        if given is not None:
            sampler = check_sampler(given, seed, mode, prioritized, n_step, frame_stack, rate_limiter)
        exactly_k = exactly_k_options(sampler, policy, replays, timeout)
        check_limiter(rate_limiter, mode, shards * cap)
        sampler_name = _sampler_name(given) if given is not None else "uniform" if sampler is None else sampler
        combinations.check(combinations.facets(
            "SharedReplayBuffer", sampler=sampler_name, stream_order=not exactly_k,
            policy=(policy or "block") if exactly_k else None,
            replays=(1 if replays is None else replays) if exactly_k else None,
            rate_limiter=None if rate_limiter is None else rate_limiter.params(),
            n_step=n_step, frame_stack=frame_stack is not None, stats=stats is not None,
            fifo=mode == "fifo", prioritized=bool(prioritized),
            transforms=bool(transforms) and not isinstance(transforms, str)))
        if exactly_k:
            policy = "block" if policy is None else policy
        elif mode == "fifo":
            policy = "block" if policy is None else policy
            if policy not in POLICIES:
                raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        elif policy is not None:
            raise ValueError(f"policy applies to mode='fifo' only (a replay ring overwrites its "
                             f"oldest rows), got policy={policy!r}")
        layout = resolve_layout(layout, spec)
        if rate_limiter is not None:  # refused if another buffer holds it (bound once built)
            rate_limiter.check_free(self)
        self._ring_size = _check_int("ring_size", ring_size, 1)
        # everything that can refuse runs before the region exists
        episodes = episode_options(spec, n_step, gamma, next_of, False, roles)
        frames = frame_options(spec, frame_stack, frame_padding, final_frames, next_of, roles, cap)
        # the sample transforms, checked against the spec (the stacks' shapes) and the roles
        self._tctx = Context(spec, episodes["roles"], (), () if frames is None else
                             tuple(frames[0]["stacks"]), allocator=alloc.resolve(None),
                             no_stats=NO_STATS)
        self._transforms = check_transforms(transforms, self._tctx)
        if given is not None:
            sampler = given
        elif prioritized:
            sampler = PrioritizedReplayBuffer.checked_sampler(alpha, beta, beta_final, beta_steps, eps, seed)
            if sampler.bounds(shards * cap) is None:
                raise ValueError(f"alpha={sampler.alpha}, eps={sampler.eps}: no priority gives a "
                                 f"leaf (p + eps) ** alpha in range; use a smaller alpha or eps")
        elif exactly_k:  # the single-process sampler: its writes are the shards' (see below)
            sampler = ExactlyKSampler(seed, 1 if replays is None else replays, policy, timeout)
        elif sampler_name == "without_replacement":
            sampler = WithoutReplacementSampler(seed)
        else:
            sampler = UniformSampler(seed)
        self.memory_budget = None if memory_budget is None else parse_bytes("memory_budget", memory_budget)
        if self.memory_budget is not None:
            planned = sampler.plan(shards * cap)
            check_budget(self.memory_budget, {"shared_region": region_layout(spec, layout, shards, cap, mode == "fifo",
                                                                             exactly_k, frames and frames[:2])["nbytes"],
                                              "trees": planned["trees"], "bookkeeping": planned["bookkeeping"]},
                         f"SharedReplayBuffer of capacity {shards * cap}")
        self._k = kernels()
        if name is None:
            name = f"{os.getpid()}-{os.urandom(6).hex()}"
        path = region_path(name, dir)
        if os.path.exists(path):
            raise FileExistsError(f"a shared buffer named {name!r} exists already ({path})")
        lay = region_layout(spec, layout, shards, cap, mode == "fifo", exactly_k, frames and frames[:2])
        doc = {"format": FORMAT, "version": VERSION, "spec": spec.to_dict(), "layout": layout,
               "mode": mode, "policy": policy, "num_writers": shards, "shard_capacity": cap,
               "nbytes": lay["nbytes"], "owner_pid": os.getpid()}
        if rate_limiter is not None:  # what the writers read (absent: no limiter)
            doc["rate_limiter"] = rate_limiter.params()
        if exactly_k:  # what the writers need to know: write free slots only, and the policy
            doc.update(sampler="exactly_k", replays=sampler.replays)
        if frames is not None:  # what the writers check their writes against
            doc["frames"] = shared_frames.describe(*frames)
        region, owner_fd = make_region(path, doc)
        self.name = name
        self.path = path
        self._region = region
        self._owner = os.getpid()
        # removes the region when this object is collected or the interpreter exits, in the
        # owner only (a forked child inherits the object but must not remove the region)
        self._finalizer = weakref.finalize(self, remove_region, path, self._region.ctrl, self._owner,
                                           owner_fd)
        st = self._region.storage
        # the sampler part, over the region's storage and shard words (as a ReplayBuffer's over
        # its storage): the same contract, output rings and batches
        sampler.bind(st, shards * cap, 1, alloc.resolve(None))
        self.sampler = sampler
        self._given = given is not None
        self.n_step, self.gamma = episodes["n_step"], episodes["gamma"]
        flags = None
        if episodes["has_flags"]:
            flags = (st.field(episodes["roles"]["terminated"]), st.field(episodes["roles"]["truncated"]))
        fr = self._region.frames
        # the shards as streams: the rows held, the writes caught up, the draws, and the
        # torn-row check and redraw of rows, n-step windows, stacks and slices
        streams = self._streams = ShardStreams(region, flags, alloc.resolve(None), self._k, name,
                                               self.n_step is not None, fr is not None, self._given)
        if exactly_k:
            # the writer processes place the rows in free slots (their logs say where); a
            # sample short of rows polls them; slots freed are released into the region's words
            streams.bind(sampler, log=self._region.log)
            sampler.release_into(self._region.released)
            ref = weakref.ref(streams)  # (the sampler must not keep the streams alive)
            sampler.waits = PollWaits(lambda: ref().catch_up(ref().scratch))
        else:
            streams.bind(sampler)
        transforms = []  # as a ReplayBuffer's: n-step, then frame stacks
        if self.n_step is not None:
            transforms.append(NStep(st, spec, episodes["roles"], episodes["next_of"], self.n_step,
                                    self.gamma, streams, alloc.resolve(None)))
        # frame stacks: the transform of a ReplayBuffer over the shard streams, rebuilt from the
        # region's tables after the draw, as of heads read before it (see shared/frames.py)
        if fr is not None:
            transforms.append(FrameStack(fr.spec, fr, fr, flags, streams, alloc.resolve(None)))
        # the user's, last: run by the streams once the draw is final (after every redraw)
        self._transform_parts = [t.bind(self._tctx) for t in self._transforms]
        transforms.extend(self._transform_parts)
        self._lock = threading.Lock()
        self._watch = WriterWatch(region, name)
        # the parts of the one sample path (tfdata.replay.sampling), over the region: the output
        # rings, the gate (the watch for dead writers, a limiter's wait and count, a FIFO
        # region's refusal), the streams' draws, the slices
        self._budget = _RingBudget(self, transforms[0] if self.n_step is not None else None)
        self._ringset = Rings(spec, region.stored_spec, () if fr is None else tuple(fr.stacks),
                              self._ring_size, st, sampler, transforms, self._lock, self._budget,
                              slice_parts=[streams, *self._transform_parts],
                              reserve=streams.reserve)
        self._local = self._ringset.local
        self._limiter = None
        self._gate = ShardGate(region, self._lock, streams, self._watch, name)
        if rate_limiter is not None:
            rate_limiter.bind(self._lock, self, shards * cap)
            rate_limiter.reset()
            self._limiter = rate_limiter
            self._gate = SampleGate(region, self._lock, rate_limiter, sampler, self._watch, name)
        self._draw = streams.draw
        self._draw_call = streams.draw_call
        self._slices = Slices(sampler, streams, self._lock, self._gate, self._ringset,
                              shards * cap, 1)
        # the column reads, the FIFO learner (its calls refuse a replay region), the checkpoints
        self._columns = ShardColumns(region, name)
        self._queue = FifoLearner(region, self._lock, self._ring_size, self._k, name, self._watch)
        self._checkpoint = ShardCheckpoint(region, sampler, self._lock, self._k, self._limiter, name,
                                           self._ring_size, bool(prioritized), episodes,
                                           streams, self._given, self._transform_parts)

    @property
    def rate_limiter(self):
        """The :class:`~tfdata.RateLimiter` given as ``rate_limiter=`` (None without one), its
        ``inserts`` read now from the shards' heads. Its metrics are the learner's (sample
        waits); each writer's insert waits are in its :attr:`SharedWriter.rate_limiter`."""
        lim = self._limiter
        if lim is not None:
            lim.inserts = self._gate.inserts()
        return lim

    # -- introspection ----------------------------------------------------------------------
    @property
    def spec(self) -> Spec:
        return self._region.spec

    @property
    def layout(self) -> str:
        return self._region.layout

    @property
    def mode(self) -> str:
        return self._region.mode

    @property
    def policy(self) -> str | None:
        return self._region.policy

    @property
    def num_writers(self) -> int:
        return self._region.shards

    @property
    def capacity(self) -> int:
        return self._region.shards * self._region.cap

    @property
    def shard_capacity(self) -> int:
        return self._region.cap

    @property
    def nbytes(self) -> int:
        """Bytes of the shared region (rows, FIFO stamps, exactly-k slot words, control words)."""
        return self._region.nbytes

    @property
    def nbytes_parts(self) -> dict:
        """Bytes this buffer holds, by part: ``shared_region`` (:attr:`nbytes`), ``trees`` and
        ``bookkeeping`` (a prioritized buffer's trees, slot versions and fold positions, the
        streams' heads snapshot and the shard rows' scratch, in this process) and
        ``output_rings`` (every thread's preallocated batches)."""
        s = self.sampler.nbytes
        return {"shared_region": int(self._region.nbytes), "trees": int(s["trees"]),
                "bookkeeping": int(s["bookkeeping"]) + self._streams.nbytes,
                "output_rings": int(sum(r.nbytes for r in list(self._budget.rings)))}

    @property
    def redraws(self) -> int:
        """Rows drawn again because a writer may have been writing them during the copy."""
        return self._streams.redraws

    @property
    def storage(self):
        """The storage over the shared rows (``AoSStorage`` or ``SoAStorage``), all shards."""
        return self._region.storage

    def __len__(self) -> int:
        """Rows held (replay; exactly-k: rows published and not yet delivered ``replays``
        times) or queued (fifo) right now."""
        heads = self._region.heads.astype(np.int64)
        if self._region.exactly_k:  # rows awaiting replay, folded or not
            return int(heads.sum()) - self.sampler.released
        if self.mode == "fifo":
            return self._queue.queued()
        return int(np.minimum(heads, self._region.cap).sum())

    def __repr__(self) -> str:
        return (f"SharedReplayBuffer(name={self.name!r}, mode={self.mode!r}, len={len(self)}, "
                f"capacity={self.capacity}, num_writers={self.num_writers}, layout={self.layout!r})")

    def writers(self) -> list[dict]:
        """The state of every shard, one dict each.

        Keys: ``shard``; ``state``, one of ``"waiting"`` (no writer attached yet),
        ``"attached"``, ``"finished"`` (closed its shard) and ``"dead"`` (its process ended
        without closing it); ``pid`` (of the last writer, 0 if none); ``published`` (rows it
        has published, including rows a replay ring has since overwritten); ``dropped`` (rows
        the ``"drop"`` policy refused); ``queued`` (FIFO rows not yet delivered); ``torn``
        (slots left mid-write: never sampled or delivered).
        """
        return self._region.writers(self.mode == "fifo")

    @property
    def lost_writers(self) -> list[dict]:
        """Every writer death noticed so far: ``shard``, ``pid``, ``published``, ``torn``."""
        self._watch.at = 0.0
        self._watch()
        return list(self._watch.lost)

    # -- checkpoints (replay mode; tfdata.replay.checkpoint, with the part CHECKPOINT) -------
    #: this class's checkpoint part, the samplers it builds from a name (a checkpoint of it may
    #: name them), and the one it has when its config names none
    CHECKPOINT = ShardCheckpoint
    SAMPLERS = {"uniform": UniformSampler, "without_replacement": WithoutReplacementSampler,
                "exactly_k": ExactlyKSampler}
    DEFAULT_SAMPLER = "uniform"

    @classmethod
    def sampler_classes(cls, given=()) -> dict:
        """``{name: class}`` of the samplers a checkpoint of this class may name: tfdata's
        (:data:`SAMPLERS`) and the classes of the user's ``given`` to :meth:`load` (see
        :func:`tfdata.shared.streams.sampler_classes`)."""
        return {**cls.SAMPLERS, **sampler_classes(given)}

    @property
    def config(self) -> dict:
        """The constructor's keyword arguments that rebuild this buffer (what a checkpoint keeps)."""
        return self._checkpoint.config()

    @property
    def transforms(self) -> tuple:
        """The transforms every sample applies, in order (``transforms=``)."""
        return self._transforms

    @property
    def transform_parts(self) -> tuple:
        """The bound parts of :attr:`transforms` (what a state's ``transforms`` entry is
        checked by)."""
        return tuple(self._transform_parts)

    def snapshot(self):
        """A context manager: the state as of the shards' heads, this buffer's lock held (see
        :meth:`tfdata.shared.state.ShardCheckpoint.snapshot`)."""
        return self._checkpoint.snapshot()

    def settle(self, state: dict) -> None:
        """The state of a :meth:`snapshot` as a checkpoint writes it, once its rows are copied
        (see :meth:`tfdata.shared.state.ShardCheckpoint.finish`)."""
        self._checkpoint.finish(state)

    def save(self, path, *, overwrite: bool = False) -> None:
        """Write a checkpoint directory (replay mode): the rows each shard held when the save
        began, the sampler's state (and priorities), the configuration. Writers may keep
        writing: rows a writer overwrote while they were copied (a shard's oldest) are left out
        of the checkpoint. File rules as :meth:`tfdata.ReplayBuffer.save` (nothing but a
        checkpoint is replaced, and only with ``overwrite=True``)."""
        from ..replay.checkpoint import save

        save(self, path, overwrite=overwrite)

    @classmethod
    def load(cls, path, *, name: str | None = None, dir: str | None = None, memory_budget=None,
             layout=None, samplers=(), transforms=()):
        """A new buffer (a new region, named ``name``) holding a checkpoint written by
        :meth:`save`; writers attach to it as to any buffer and continue each shard after its
        saved rows. The checkpoint is validated before the region is created
        (:class:`~tfdata.FormatError` naming the file and the field). A shard whose oldest rows
        were left out at the save holds its rows from its first slot on; otherwise every row
        keeps its slot, and sampling continues where the saved buffer was. ``layout``: the new
        region's layout, if not the one saved (the samples are the same). ``samplers``: sampler
        classes of yours a checkpoint may name (an allow-list, by their ``name``, as for
        :meth:`tfdata.ReplayBuffer.load`): rebuilt by their ``from_config``, their state checked
        by their ``check_state`` before the region is created. ``transforms``: the functions
        of yours a checkpoint's ``Compiled`` and ``Function`` transforms may name (an
        allow-list, as for :meth:`tfdata.ReplayBuffer.load`)."""
        from ..replay.checkpoint import load

        return load(path, {cls.__name__: cls}, cls, samplers, name=name, dir=dir,
                    memory_budget=memory_budget, layout=layout, transforms=transforms)

    def unsaved_reason(self) -> str | None:
        """Why a checkpoint could not rebuild this buffer's transforms or sampler (None: it
        can; see :func:`tfdata.shared.streams.unsaved_reason`)."""
        for t in self._transforms:  # a user function without an import path
            reason = t.unsaved_reason()
            if reason is not None:
                return reason
        return unsaved_reason(self.sampler) if self._given else None

    def restore(self, ds, plan: dict) -> None:
        """Fill this new buffer (no writer attached yet) from a checked checkpoint (see
        :meth:`tfdata.shared.state.ShardCheckpoint.restore`)."""
        self._checkpoint.restore(ds, plan)

    # -- priorities (prioritized=True) -------------------------------------------------------
    def _prioritized(self, what: str) -> PrioritizedSampler:
        if not isinstance(self.sampler, PrioritizedSampler):
            raise SharedBufferError(f"shared buffer {self.name!r}: {what} needs prioritized=True")
        return self.sampler

    @property
    def beta(self) -> float:
        """The importance-sampling exponent the next :meth:`sample` uses (prioritized)."""
        return self._prioritized("beta").beta

    @property
    def priority_range(self) -> tuple:
        """The priorities :meth:`update_priorities` accepts (see
        :attr:`tfdata.PrioritizedReplayBuffer.priority_range`)."""
        s = self._prioritized("priority_range")
        return s.p_low, s.p_high

    def priorities(self) -> np.ndarray:
        """``(priority + eps) ** alpha`` of every slot (float64, a copy; 0 for slots whose row
        was never sampled since it was published: rows are folded into the trees by a sample)."""
        s = self._prioritized("priorities")
        with self._lock:
            return s.live_leaves(self.capacity).copy()

    # -- columns ----------------------------------------------------------------------------
    def column(self, name: str):
        """Read-only views of field ``name`` over the rows each shard holds: shard by shard,
        oldest to newest (one view per shard, two where its ring has wrapped); no copy.

        The views read the region as it is: writers keep writing into it, so a row a writer
        overwrites while a view is read changes under it (copy what must be kept,
        ``np.array(column)``, and see :meth:`column_stats` for statistics that leave such rows
        out).

        Returns
        -------
        tfdata.replay.columns.Column
            As :meth:`tfdata.ReplayBuffer.column`; ``np.asarray(column)`` concatenates the
            segments (a copy), ``(len(self), *spec[name].shape)`` of ``spec[name].dtype``.

        Raises
        ------
        SpecError
            Unknown field. SharedBufferError: a FIFO buffer.
        """
        return self._columns.column(name)

    def column_stats(self, name: str):
        """Statistics of field ``name`` over the rows the shards hold, by one compiled pass
        over them (in slot order), while writers keep writing.

        The rows counted are those published when the pass began that no writer began to
        overwrite before it ended: if a writer reached a shard's oldest rows during the pass,
        the pass is repeated over the rows then held minus twice as many of the oldest as the
        writer wrote during it (at most 16 passes); ``count`` says how many rows were counted. With no writer writing, every row held is counted,
        and with one shard the statistics are bit for bit those of
        :meth:`tfdata.ReplayBuffer.column_stats` over the same rows in the same slots.

        Returns
        -------
        tfdata.replay.columns.FieldStats
            ``count``, and per element (arrays of the field's shape, float64) ``mean``, ``var``
            (population), ``std``, ``min``, ``max``.

        Raises
        ------
        SpecError
            Unknown field, or one of a dtype other than bool, integer or float.
        SharedBufferError
            A FIFO buffer, or writers that overwrote the rows faster than 16 passes could read
            them (no pass kept a row).
        """
        return self._columns.column_stats(name)

    def update_field(self, name, indices, values) -> None:
        """Not available: rows of a shared buffer are written by writer processes under their
        sequence locks, which an in-place rewrite from the learner would bypass. Raises
        NotImplementedError."""
        raise NotImplementedError("SharedReplayBuffer.update_field: rows are written only by the "
                                  "writer processes (under their sequence locks); relabel rows "
                                  "in a ReplayBuffer")

    def update_priorities(self, indices, priorities) -> None:
        """Set the priorities of sampled slots, as :meth:`tfdata.PrioritizedReplayBuffer.update_priorities`.

        The learner owns the priorities; writers never see them. A slot overwritten by its
        writer since the sample (detected through ``batch.versions`` once the new row has been
        folded in by a sample) is refused like a single-process buffer refuses it; a row
        published but not yet folded takes the live maximum when it is, as at a write.
        """
        s = self._prioritized("update_priorities")
        got = update_args(s, indices, priorities)
        if got is not None:
            lock = self._lock  # acquire/release: cheaper than a with block on this hot path
            lock.acquire()
            try:
                s.update(*got, self.capacity)
            finally:
                lock.release()

    # -- FIFO ------------------------------------------------------------------------------
    def get_batch(self, batch_size: int, *, timeout: float | None = None, partial: bool = False,
                  copy: bool = False) -> Batch:
        """The next ``batch_size`` rows in arrival order, each delivered exactly once.

        Waits (sleeping, so the GIL is free) until enough rows are queued. Shards are merged by
        the time each row was published; each shard's rows keep their order.

        Parameters
        ----------
        batch_size : int
        timeout : float, optional
            Seconds to wait; None waits for ever.
        partial : bool, default False
            Return fewer rows (at least one) rather than raise when the timeout ends, or at
            once when every writer has finished or died and fewer rows remain.
        copy : bool
            As :meth:`sample`.

        Returns
        -------
        Batch
            Fields of shape ``(k, ...)`` with ``k == batch_size`` (or ``1 <= k < batch_size``
            with ``partial``); ``batch.indices`` int64 ``(k,)`` the slots; ``batch.metrics`` a
            dict: ``rows``, ``queued`` (rows left after this batch), ``oldest_age_s`` (time since
            the oldest row of the batch was published), ``ingest_rows_per_s`` (rows published
            by all writers per second since the previous batch), ``dropped`` (rows dropped so
            far, ``"drop"`` policy), ``dropped_since`` (since the previous batch), ``wait_s``.

        Raises
        ------
        TimeoutError
            No full batch within ``timeout`` (and ``partial`` is False, or nothing is queued).
            Nothing is consumed.
        """
        return self._queue.get_batch(batch_size, timeout=timeout, partial=partial, copy=copy)

    def batches(self, batch_size: int, *, timeout: float | None = None, copy: bool = False):
        """Iterate over FIFO batches of ``batch_size`` rows until every writer has finished (or
        died) and the queue is empty; only the last batch may be shorter.

        ``timeout``: seconds without a batch before TimeoutError (None: wait for ever, e.g. for
        shards whose writer has not attached yet).
        """
        # a generator: its frame keeps this buffer (so its region) alive while it is iterated
        yield from self._queue.batches(batch_size, timeout=timeout, copy=copy)

    # -- life ------------------------------------------------------------------------------
    def close(self) -> None:
        """Tell the writers the buffer is closed and remove the region (owner only; idempotent).

        Arrays already handed out stay valid (the mapping lives as long as they do)."""
        self._finalizer()

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def __enter__(self) -> "SharedReplayBuffer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
