"""Writers: where the next rows go, and the write path that puts them there.

The writer contract (what :class:`tfdata.replay.core.ReplayCore` calls, under its lock; in full
in docs/design/contracts.md): ``capacity``, ``cursor``, ``size``; ``bind(spec, storage,
episodes, hooks)``; ``write(values, n, extra)`` (everything that can refuse runs before the first
byte is written); ``make_push`` / ``make_extend`` (:mod:`tfdata.replay.fastpush` over the same
hooks, or ``slow``); ``spans(n)``, ``advance(n)``, ``reset()``, ``state_dict()``,
``load_state_dict(state)``; ``position`` and ``overwritten(slots, since)``; ``nbytes``,
``planned_nbytes(capacity)``.

A hook (the sampler, a spill policy, running statistics) has ``on_write(spans, n, extra)``
(after the rows are written, before the cursor moves; the writer's ``moving`` is the slots the
write moves the cursor over), ``on_clear()`` and ``slot_hook()``: ``f(slot)``, ``on_write`` for
one row, or None (then the generated push is not used). A hook with ``wraps_only = True`` hears
only laps: the generated push and extend call its ``on_wrap()`` when a write fills the last slot,
and may write a batch that does not reach the ring's end without calling it; the generic path
still calls its ``on_write``.

:class:`RingWriter` writes rows in stream order at the cursor. :class:`FreeSlotWriter` writes
each row into the next *free* slot at or after the cursor, for a sampler that holds slots back
(``stream_order = False``: exactly-k); :func:`writer_for` picks one. The *free-slot contract*,
what it asks of its sampler: ``remaining`` (uint8 or uint16 ``(capacity,)``, 0 for a free
slot), ``awaiting`` (the slots not free), ``policy`` and ``timeout`` (what a write does when no
slot is free: ``"block"``, waiting at most ``timeout`` seconds; ``"drop"``; ``"overwrite"``),
``waits`` (the condition of the buffer's lock where blocked writes and samples short of rows
wait: :class:`~tfdata.replay.samplers.exactly_k.SlotWaits`, set by ``use_lock``), ``on_drop(n)``
(``n`` rows found no free slot and were not written). Across processes the same rule runs in
each shard's writer (:mod:`tfdata.shared.writer`), over the region's per-slot words.
"""

from __future__ import annotations

import time

import numpy as np

from ..errors import SpecError
from .episodes import steps_error
from .fastpush import Elision, make_extend, make_push
from .frames import make_push as frame_push


def _push_error(num_envs: int) -> SpecError:
    return SpecError(f"push appends one row, but this buffer interleaves num_envs={num_envs} "
                     f"streams: extend with {num_envs} rows per step")


class RingWriter:
    """Round-robin cursor over ``capacity`` slots; once full, the oldest slot is overwritten next.

    Attributes
    ----------
    cursor : int
        Slot of the next write.
    size : int
        Number of valid rows (slots ``[0, size)`` before the first wrap, all slots after).
    """

    __slots__ = ("capacity", "cursor", "size", "laps", "num_envs", "spec", "storage", "episodes",
                 "hooks", "moving", "frames", "batched", "__weakref__")

    def __init__(self, capacity: int, num_envs: int = 1):
        self.capacity = capacity
        self.num_envs = num_envs
        self.cursor = 0
        self.size = 0
        self.laps = 0  # laps of the ring written, plus two per clear or load (see position)
        self.spec = self.storage = self.episodes = self.frames = None
        self.batched = False
        self.hooks = ()
        self.moving = 0  # slots the write in progress moves the cursor over (see on_write)

    def bind(self, spec, storage, episodes=None, hooks=(), frames=None) -> None:
        """``spec``: the rows as pushed (next fields included); ``storage``: where the stored
        fields go; ``episodes``, ``frames``: the bookkeeping (or None); ``hooks``: see the
        module docstring."""
        self.spec, self.storage, self.episodes, self.hooks = spec, storage, episodes, tuple(hooks)
        self.frames = frames
        # rows that are checked against the stream and stored in part: written as arrays
        self.batched = frames is not None or (episodes is not None and episodes.elide)
        if episodes is not None:
            episodes.bind(self, storage)

    @staticmethod
    def planned_nbytes(capacity: int) -> int:
        """Bytes a writer of ``capacity`` slots keeps per slot, in all: none."""
        return 0

    @property
    def nbytes(self) -> int:
        return 0

    # -- positions ---------------------------------------------------------------------------
    def advance(self, n: int, moved: int | None = None) -> None:
        """``n`` rows were written; the cursor moves over ``moved`` slots (default ``n``)."""
        c = self.cursor + (n if moved is None else moved)
        self.laps += c // self.capacity
        self.cursor = c % self.capacity
        self.size = min(self.size + n, self.capacity)

    def lap(self) -> None:
        """The cursor crossed the ring's end (the generated push and extend, through
        :meth:`_on_wrap`)."""
        self.laps += 1

    @property
    def position(self) -> int:
        """The write position, ``laps * capacity + cursor``: it passes each slot as the cursor
        does and never decreases (a clear or a load moves it two laps on, so that every batch
        sampled before is older than a whole lap)."""
        return self.laps * self.capacity + self.cursor

    def overwritten(self, slots: np.ndarray, since: int) -> np.ndarray:
        """Which of ``slots`` (int64, each below the size) were written at a position ``>=
        since`` (a position this writer had; bool array). In ring order the position writes
        every slot it passes, so a slot was written since iff the positions ``[since,
        position)`` pass it."""
        passed = self.position - since
        if passed >= self.capacity:
            return np.ones(slots.shape, bool)
        return (slots - since) % self.capacity < passed

    def place(self, n: int):
        """``(spans, moved)`` of a write of ``n`` rows: the spans of :meth:`spans`, and the
        cursor moves over ``n`` slots."""
        return self.spans(n), n

    def spans(self, n: int) -> list[tuple[int, int, int]]:
        """Where ``n`` new rows go: ``[(dst_start, src_start, count), ...]`` (at most two spans).

        When ``n > capacity`` only the last ``capacity`` rows are written: the result is the same as
        ``n`` single pushes, whose earlier rows the later ones overwrite.
        """
        cap = self.capacity
        if n <= cap - self.cursor:  # no wrap: one span
            return [(self.cursor, 0, n)]
        skip = max(0, n - cap)
        dst = (self.cursor + skip) % cap
        left = n - skip
        first = min(left, cap - dst)
        out = [(dst, skip, first)]
        if left > first:
            out.append((0, skip + first, left - first))
        return out

    def reset(self) -> None:
        self.cursor = 0
        self.size = 0
        self.laps += 2  # every batch sampled before is now a whole lap behind: all stale
        for h in self.hooks:
            h.on_clear()

    # -- the write path ----------------------------------------------------------------------
    def push_values(self, values: list, extra=None) -> None:
        """Write one validated row (values in field order); lock held."""
        if self.num_envs > 1:
            raise _push_error(self.num_envs)
        ep = self.episodes
        if self.batched:  # elision and frame stacks check and keep rows as arrays: the batch path
            arrays = [np.asarray(v, f.dtype).reshape((1,) + f.shape) for v, f in zip(values, self.spec)]
            self.write(arrays, 1, extra)
            return
        pos = self.cursor
        self.storage.write_row(pos, values)
        if ep is not None:
            ep.stamp_one(pos, values)
        spans = [(pos, 0, 1)]
        self.moving = 1
        for h in self.hooks:
            h.on_write(spans, 1, extra)
        self.advance(1)

    def write(self, values: list, n: int, extra=None) -> None:
        """Write ``n`` validated rows (values in spec order, each ``(n, *shape)``); lock held."""
        spans, moved = self.place(n)
        ep = self.episodes
        stored = values
        if ep is not None:
            ep.catch_up(self.cursor)  # rows pushed one at a time, before this write can lap them
            if n % self.num_envs == 0 and self.frames is not None:  # (else ep.check refuses)
                values = stored = self.frames.check(values, n, self.cursor)
            ends = ep.ends(values) if ep.elide else None
            ep.check(values, n)
            ep.reserve(ends, spans)
            if self.frames is not None:  # nothing refuses after this
                self.frames.write(n, self.cursor, self.size)
            if ep.elide:
                stored = [values[i] for i in ep.stored_pos]
        elif n % self.num_envs:
            raise steps_error(self.num_envs, n)
        for dst, src, count in spans:
            self.storage.write_rows(dst, stored, src, count)
        if ep is not None:
            ep.write(values, n, ends, spans)
        self.moving = moved
        for h in self.hooks:
            h.on_write(spans, n, extra)
        self.advance(n, moved)

    def _per_row(self) -> list:
        """The hooks the generated calls run for every row (all but the ``wraps_only`` ones)."""
        return [h for h in self.hooks if not getattr(h, "wraps_only", False)]

    def _on_wrap(self, episodes_wrap):
        """One ``f()`` for the generated calls to run when a write fills the last slot: the
        writer's own lap count, the episode bookkeeping's (if given), then every ``wraps_only``
        hook's ``on_wrap``."""
        calls = [self.lap] + ([] if episodes_wrap is None else [episodes_wrap])
        calls += [h.on_wrap for h in self.hooks if getattr(h, "wraps_only", False)]
        if len(calls) <= 1:
            return calls[0] if calls else None
        calls = tuple(calls)

        def on_wrap(_calls=calls):
            for f in _calls:
                f()

        return on_wrap

    def _slot_writes(self, batched: bool = False):
        """The hooks' one-row form as one ``on_write(slot)`` (None without hooks), and whether
        the generated calls may be used at all (every hook has that form; rows written as they
        are, unless ``batched``: the frame push checks and keeps them itself)."""
        slot_hooks = [h.slot_hook() for h in self._per_row()]
        if (self.batched and not batched) or any(f is None for f in slot_hooks):
            return None, False
        if len(slot_hooks) <= 1:
            return (slot_hooks[0] if slot_hooks else None), True
        hooks = tuple(slot_hooks)

        def on_write(slot, _hooks=hooks):
            for f in _hooks:
                f(slot)

        return on_write, True

    def make_push(self, spec, lock, slow, gate=None):
        """``push(row)`` specialised to ``spec`` (see :mod:`tfdata.replay.fastpush`) where every
        hook has a per-slot form and rows are written as they are; else
        ``slow``. ``gate(1)``: called under the lock before the row's slot is read (a rate
        limiter waits and counts)."""
        if self.frames is not None:  # frame stacks: a push of their own (checks in compiled code)
            on_write, usable = self._slot_writes(batched=True)
            if not usable:
                return slow
            push = frame_push(self.frames, spec, self.storage, self.episodes, self, lock, slow,
                              on_write=on_write, on_wrap=self._on_wrap(None), gate=gate)
            return slow if push is None else push
        on_write, usable = self._slot_writes()
        if not usable or self.num_envs != 1:
            return slow
        ep = self.episodes
        on_wrap = self._on_wrap(None if ep is None else ep.wrapped)
        return make_push(spec, self.storage.field_views(), self, lock, slow,
                         on_wrap=on_wrap, on_write=on_write, regions=self.storage.byte_regions(),
                         gate=gate, place=self._one_slot(on_wrap))

    def _one_slot(self, on_wrap):
        """The generated push's ``place(cursor) -> slot`` (None: the cursor's slot)."""
        return None

    def make_extend(self, spec, lock, slow, write=None, gate=None):
        """``extend(batch)`` specialised to ``spec`` for batches of a few rows (one vector-env
        step; see :func:`tfdata.replay.fastpush.make_extend`), where every hook has a per-slot
        form and rows are written as they are; else ``slow``. ``write(values, n)`` takes larger
        batches of exact dtypes. ``gate``: ``(wait, count)``, ``wait(n)`` called under the lock
        before the slot is read, ``count(n)`` after ``n`` rows are written (a rate limiter)."""
        ep = self.episodes
        if self.frames is None and ep is not None and ep.elide:
            return self._make_elided_extend(spec, lock, slow, write, gate)
        on_write, usable = self._slot_writes()
        if not usable:
            return slow
        late = ep is not None and self.num_envs == 1  # one stream: stamped late, as a push
        return make_extend(spec, self, lock, slow, self.storage.byte_regions(),
                           max_rows=max(16, self.num_envs), num_envs=self.num_envs,
                           stamp=None if ep is None or late else (ep.stamp_rows, ep.term_i, ep.trunc_i),
                           on_write=on_write, on_wrap=self._on_wrap(ep.wrapped if late else None),
                           write=write, direct=not self._per_row() and (ep is None or late), gate=gate)

    def _make_elided_extend(self, spec, lock, slow, write, gate):
        """:meth:`make_extend` of a buffer that elides one next field (``elide_next``): the
        generated extend with the elision's bookkeeping in one compiled call."""
        ep = self.episodes
        on_write, usable = self._slot_writes(batched=True)
        if not usable or len(ep.pairs) != 1:
            return slow
        (i_next, i_src, name, _), = ep.pairs
        elide = Elision(ep, name, i_next, i_src, ep.stored_pos, ep.pending_words(name, 1))
        return make_extend(spec, self, lock, slow, self.storage.byte_regions(),
                           max_rows=max(16, self.num_envs), num_envs=self.num_envs,
                           on_write=on_write, on_wrap=self._on_wrap(None), write=write,
                           gate=gate, elide=elide)

    # -- state -------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"cursor": self.cursor, "size": self.size}

    def load_state_dict(self, state: dict) -> None:
        cursor, size = int(state["cursor"]), int(state["size"])
        if not 0 <= size <= self.capacity:
            raise ValueError(f"writer state: size must be in [0, {self.capacity}], got {size}")
        if not 0 <= cursor < self.capacity or (size < self.capacity and cursor != size):
            raise ValueError(f"writer state: cursor {cursor} is inconsistent with size {size} "
                             f"and capacity {self.capacity}")
        if size % self.num_envs:
            raise ValueError(f"writer state: size {size} is not a multiple of num_envs {self.num_envs}")
        self.cursor, self.size = cursor, size
        self.laps += 2  # new rows: every batch sampled before is stale (see position)


#: a slot's last write is kept as the writer's lap modulo this (uint32)
_LAPS = 1 << 32


class FreeSlotWriter(RingWriter):
    """A writer that puts each row into the next free slot at or after its cursor (wrapping),
    skipping the slots its sampler holds back (the free-slot contract, see the module
    docstring), and moves the cursor past the last slot written: a write of ``n`` rows lands
    where ``n`` pushes would. Rows are not in stream order: no episode numbers, no frame stacks.
    The sweep skips slots, so passing a slot is not writing it: the writer keeps each slot's
    last write (the lap, uint32) for :meth:`overwritten`. A push takes the generated push with
    :meth:`_one_slot` placing the row (``"drop"``: the generic path); an extend the generic path.

    Parameters
    ----------
    capacity, num_envs : int
    slots
        The sampler, bound (see the free-slot contract).
    allocator
        Where the per-slot lap words come from.
    """

    __slots__ = ("slots", "wrote", "_k", "_runs", "_placed", "policy")

    def __init__(self, capacity: int, num_envs: int, slots, allocator):
        super().__init__(capacity, num_envs)
        from ..kernels import _replays  # numba is imported when the first buffer is built

        self.slots, self.policy, self._k = slots, slots.policy, _replays
        # the lap of the writer's position at each slot's last write, modulo 2**32 (its
        # position: lap * capacity + slot), which says which rows of a batch were overwritten
        # since it was sampled
        self.wrote = allocator.zeros(capacity, np.uint32)
        # replays_place's outputs: runs of slots (a write of more runs takes several calls)
        self._runs = np.zeros((64, 2), np.int64)
        self._placed = np.zeros(4, np.int64)

    @staticmethod
    def planned_nbytes(capacity: int) -> int:
        return 4 * int(capacity)

    @property
    def nbytes(self) -> int:
        return int(self.wrote.nbytes)

    def bind(self, spec, storage, episodes=None, hooks=(), frames=None) -> None:
        if episodes is not None or frames is not None:  # (the plan refuses both)
            raise ValueError("a free-slot writer keeps rows off stream order: no episodes or frames")
        super().bind(spec, storage, None, hooks, None)

    # -- where the rows go (lock held) -------------------------------------------------------
    @property
    def free(self) -> int:
        """Free slots: where a write may go without overwriting."""
        return self.capacity - self.slots.awaiting

    def admit(self, n: int) -> int:
        """How many of the next ``n`` rows may be written now: ``n`` (``"overwrite"``: always;
        ``"block"``: once ``n`` slots are free, waiting with the lock released), or for
        ``"drop"`` as many as there are free slots (whole steps of ``num_envs``). ``"block"``
        raises TimeoutError after ``timeout`` seconds, ValueError at once for ``n`` above the
        capacity; nothing is changed by a refusal."""
        if self.policy == "overwrite":
            return n
        cap = self.capacity
        if self.policy == "drop":
            ok = min(n, self.free)
            return ok - ok % self.num_envs
        if n > cap:
            raise ValueError(f"exactly_k, policy='block': a write of {n} rows can never fit a "
                             f"buffer of capacity {cap}; write at most {cap} rows at a time")
        if self.free >= n:
            return n
        waits, timeout = self.slots.waits, self.slots.timeout
        if waits is None:
            raise RuntimeError("FreeSlotWriter: the sampler has no waits (use_lock was not "
                               "called); a blocked write cannot wait")
        deadline = None if timeout is None else time.monotonic() + timeout
        waits.wanted.append(n)
        if waits.samplers:  # a sample waiting for rows would wait for this writer: wake it
            waits.wake()  # (it then raises instead of waiting out its timeout)
        try:
            while True:
                if not waits.wait(deadline):
                    raise TimeoutError(
                        f"exactly_k, policy='block': a write of {n} rows waited {timeout} s "
                        f"for {n} free slots ({self.free} free: {self.slots.awaiting} of {cap} "
                        f"rows await replay); nothing was written")
                if self.free >= n:  # other threads ran while the lock was released
                    return n
        finally:
            waits.wanted.remove(n)

    def place(self, n: int):
        """Where the ``n`` admitted rows go: ``(spans, moved)``, spans as :meth:`spans` gives
        them, in row order, and the slots the cursor moves over. Each row goes to the next free
        slot at or after the cursor, skipping the slots held back; with no free slot left
        (``"overwrite"`` only), to the slot at the cursor, whose row is lost."""
        cur = self.cursor
        remaining = self.slots.remaining
        if n == 1 and remaining[cur] == 0:  # the common case, without a kernel call
            return [(cur, 0, 1)], 1
        spans = []
        free, src, moved = self.free, 0, 0
        runs, out = self._runs, self._placed
        while src < n:
            r = self._k.replays_place(remaining, cur, n - src, free, runs, out)
            if r < 0:  # the arguments come from this object: a bug, not the caller's input
                raise RuntimeError(f"FreeSlotWriter: replays_place returned {r}")
            for i in range(r):
                dst, count = int(runs[i, 0]), int(runs[i, 1])
                spans.append((dst, src, count))
                src += count
            cur, free, moved = int(out[0]), int(out[1]), moved + int(out[3])
        return spans, moved

    def _stamp(self, spans) -> None:
        """Keep the lap of each slot of ``spans`` (before the cursor moves)."""
        cap = self.capacity
        at = self.laps * cap + self.cursor  # the spans follow the sweep, in order
        for dst, _src, count in spans:
            at += (dst - at) % cap  # the first position at or after the sweep's at slot dst
            self.wrote[dst:dst + count] = (at - dst) // cap % _LAPS
            at += count

    def overwritten(self, slots: np.ndarray, since: int) -> np.ndarray:
        """Which of ``slots`` (int64, held) were written at a position ``>= since``: those whose
        last write's lap is past ``since``'s, or the same lap at or after its slot.

        Laps are kept modulo 2**32: a batch older than ``2**32 - 1`` laps counts as stale
        whole, and a row held back through about ``2**32`` laps of the sweep may be taken for a
        new one (refused, never the other way round)."""
        lap0, at0 = divmod(since, self.capacity)
        laps = self.laps - lap0
        if laps >= _LAPS - 1:
            return np.ones(slots.shape, bool)
        d = (self.wrote[slots].astype(np.int64) - lap0) % _LAPS  # laps after the batch's
        return ((d > 0) & (d <= laps)) | ((d == 0) & (slots >= at0))

    # -- the write path (lock held) ----------------------------------------------------------
    def push_values(self, values: list, extra=None) -> None:
        if self.num_envs > 1:
            raise _push_error(self.num_envs)
        if self.admit(1) == 0:
            self.slots.on_drop(1)
            return
        spans, moved = self.place(1)
        self.storage.write_row(spans[0][0], values)
        self._written(spans, 1, moved, extra)

    def write(self, values: list, n: int, extra=None) -> None:
        asked = n
        n = self.admit(n)  # may wait (lock released) or raise: nothing written yet
        if n < asked:
            values = [v[:n] for v in values]
            extra = None if extra is None else extra[:n]
            if n == 0:
                self.slots.on_drop(asked)
                return
        spans, moved = self.place(n)
        if n % self.num_envs:
            raise steps_error(self.num_envs, n)
        for dst, src, count in spans:
            self.storage.write_rows(dst, values, src, count)
        self._written(spans, n, moved, extra)
        if n < asked:
            self.slots.on_drop(asked - n)

    def _written(self, spans, n: int, moved: int, extra) -> None:
        self._stamp(spans)
        self.moving = moved
        for h in self.hooks:
            h.on_write(spans, n, extra)
        self.advance(n, moved)

    def _one_slot(self, on_wrap):
        """``place(cursor) -> slot`` for the generated push (None with ``"drop"``: a dropped
        row is the generic path's to skip): the slot the row goes to (waiting for one with
        ``"block"``), with the lap it is written in kept, and ``on_wrap()`` called when the
        slot is behind the cursor (the sweep crossed the ring's end; the generated push calls
        ``on_wrap`` itself only for a row written into the last slot)."""
        remaining, wrote = memoryview(self.slots.remaining), memoryview(self.wrote)
        w = self  # the generated push that holds this holds the writer too; the writer neither

        def place_one(cursor):
            if remaining[cursor] == 0:  # the common case: no call
                p = cursor
            else:
                p = w._place_held(cursor)
                if p < w.cursor:  # the cursor now: another writer may have moved it meanwhile
                    on_wrap()
            wrote[p] = w.laps & 0xFFFFFFFF
            return p

        return place_one

    def _place_held(self, cursor: int) -> int:
        """The slot one row goes to when the cursor's slot is held back."""
        if self.slots.awaiting == self.capacity:  # no free slot
            if self.policy == "overwrite":
                return cursor  # the row at the cursor is lost (the sampler's hook counts it)
            self.admit(1)  # waits (lock released) or raises; other writers may have moved on
        r = self._k.replays_place(self.slots.remaining, self.cursor, 1, self.free, self._runs,
                                  self._placed)
        if r != 1:
            raise RuntimeError(f"FreeSlotWriter: replays_place returned {r}")
        return int(self._runs[0, 0])

    def make_push(self, spec, lock, slow, gate=None):
        if self.policy == "drop":  # a dropped row writes nothing: the generic path
            return slow
        return super().make_push(spec, lock, slow, gate)

    def make_extend(self, spec, lock, slow, write=None, gate=None):
        return slow  # one kernel call places the rows: the generic path

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        # (two laps on): the rows loaded were written after any batch sampled before the load,
        # before any sampled after it
        self.wrote[:] = (self.laps - 1) % _LAPS


def writer_for(sampler) -> type:
    """The writer class a buffer with ``sampler`` writes with: a :class:`FreeSlotWriter` for a
    sampler that holds slots back (``stream_order`` False), else a :class:`RingWriter`."""
    return RingWriter if getattr(sampler, "stream_order", True) else FreeSlotWriter


def make_writer(sampler, capacity: int, num_envs: int, allocator):
    """The writer of a buffer of ``capacity`` slots with ``sampler`` (bound), unbound."""
    if writer_for(sampler) is FreeSlotWriter:
        return FreeSlotWriter(capacity, num_envs, sampler, allocator)
    return RingWriter(capacity, num_envs)
