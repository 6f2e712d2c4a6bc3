"""Writers: where the next rows go, and the write path that puts them there.

The writer contract (what :class:`tfdata.replay.core.ReplayCore` calls, under its lock):

``capacity``, ``cursor``, ``size``
    Slots, the slot of the next write, the number of valid rows.
``bind(spec, storage, episodes, hooks)``
    Once, when the buffer is built: the spec of the rows as pushed, the storage they go to, the episode bookkeeping (or None)
    and the parts that react to a write (the sampler, a spill policy, running statistics). A
    hook has ``on_write(spans, n, extra)`` (after the rows are written, before the cursor
    moves), ``on_clear()`` and ``slot_hook()``: a ``f(slot)`` equivalent to ``on_write`` for one
    row, or None if it has none (then the generated push is not used). A hook with
    ``wraps_only = True`` needs to hear only the laps of the ring: the generated push and
    extend never call it per row, only its ``on_wrap()`` when a write fills the last slot
    (before the cursor returns to 0), and may write a batch that does not reach the ring's end
    without calling it at all; the generic path still calls its ``on_write`` (running
    statistics count laps this way, see :mod:`tfdata.replay.columns`).
``write(values, n, extra)``
    Write ``n`` validated rows (one array per field); everything that can refuse runs before
    the first byte is written.
The gate (optional): a hook with ``admit(n)`` (the first one with it) is asked, under the lock,
before anything else of a write of ``n`` rows, how many of them may be written now at the cursor
(exactly-k replay: a slot still awaiting replay is not free). It returns ``n``, or fewer: the
write then takes the first rows only and calls the gate's ``on_drop(rest)`` once they are
written; it may wait (releasing the buffer's lock, see ``use_lock`` in
:mod:`tfdata.replay.samplers`) or raise, having changed nothing. The generated extend is not
used with a gate; the generated push only if the gate's ``slot_gate()`` gives its one-row
form, an ``f(slot)`` run before the row's first byte (it waits or raises, never drops: a gate
that may drop a row gives None); for a gate with ``place``, that form is ``f(cursor) -> slot``,
the slot the row goes to (the cursor then moves past it).
The gate may also place the writes: with ``place(n)`` (exactly-k replay), the writer asks it,
after ``admit``, where the ``n`` admitted rows go: ``(spans, moved)``, spans as ``spans(n)``
gives them (in row order; a later span may rewrite a slot of an earlier one, as single pushes
would) and ``moved`` the slots the cursor moves over (more than ``n`` when it skips slots). Rows
are then not in stream order: the buffer builds no episode bookkeeping for such a gate. A hook
that counts laps reads the writer's ``moving`` (the slots the write in progress moves the
cursor over) in ``on_write``.
``make_push(spec, lock, slow)``
    The per-spec push of :mod:`tfdata.replay.fastpush` over the same hooks, or ``slow``.
``spans(n)``, ``advance(n)``, ``reset()``, ``state_dict()``, ``load_state_dict(state)``.
``position``, ``overwritten(slots, since)``
    The write position (``laps * capacity + cursor``: never decreases; a clear or a load moves
    it two laps on) and which of ``slots`` were written at a position ``>= since``: a batch
    keeps the position it was sampled at, and ``update_field(name, batch, ...)`` refuses rows
    written since. In ring order a slot is written each time the position passes it; a gate
    that places the writes (``place``) skips slots, so it says which it wrote
    (``gate.overwritten(slots, since)``). Laps are counted by :meth:`RingWriter.advance` and, in
    the generated push and extend, by the writer's own ``on_wrap`` (always installed).

:class:`RingWriter` is the round-robin writer of every single-process buffer.
"""

from __future__ import annotations

import numpy as np

from ..errors import SpecError
from .fastpush import make_extend, make_push
from .frames import make_push as frame_push


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
                 "hooks", "gate", "placer", "moving", "frames", "batched", "__weakref__")

    def __init__(self, capacity: int, num_envs: int = 1):
        self.capacity = capacity
        self.num_envs = num_envs
        self.cursor = 0
        self.size = 0
        self.laps = 0  # laps of the ring written, plus two per clear or load (see position)
        self.spec = self.storage = self.episodes = self.gate = self.placer = self.frames = None
        self.batched = False
        self.hooks = ()
        self.moving = 0  # slots the write in progress moves the cursor over (see on_write)

    def bind(self, spec, storage, episodes=None, hooks=(), frames=None) -> None:
        """``spec``: the rows as pushed (next fields included); ``storage``: where the stored
        fields go; ``episodes``: the bookkeeping (or None); ``hooks``: see the module docstring;
        ``frames``: the frame-stack bookkeeping (:class:`~tfdata.replay.frames.FrameStacks`),
        which checks a write's stacks and turns them into the frames stored."""
        self.spec, self.storage, self.episodes, self.hooks = spec, storage, episodes, tuple(hooks)
        self.frames = frames
        # rows that are checked against the stream and stored in part: written as arrays
        self.batched = frames is not None or (episodes is not None and episodes.elide)
        self.gate = next((h for h in self.hooks if hasattr(h, "admit")), None)
        self.placer = getattr(self.gate, "place", None)
        if episodes is not None:
            episodes.bind(self, storage)

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
        position)`` pass it; a gate that places the writes says which slots it wrote."""
        if self.placer is not None:
            return self.gate.overwritten(slots, since)
        passed = self.position - since
        if passed >= self.capacity:
            return np.ones(slots.shape, bool)
        return (slots - since) % self.capacity < passed

    def place(self, n: int):
        """``(spans, moved)`` of a write of ``n`` rows: the gate's placement, else the ring's."""
        if self.placer is not None:
            return self.placer(n)
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
            raise SpecError(f"push appends one row, but this buffer interleaves num_envs="
                            f"{self.num_envs} streams: extend with {self.num_envs} rows per step")
        ep = self.episodes
        if self.batched:  # elision and frame stacks check and keep rows as arrays: the batch path
            arrays = [np.asarray(v, f.dtype).reshape((1,) + f.shape) for v, f in zip(values, self.spec)]
            self.write(arrays, 1, extra)
            return
        if self.gate is not None and self.gate.admit(1) == 0:
            self.gate.on_drop(1)
            return
        if self.placer is None:
            pos, spans, moved = self.cursor, None, 1
        else:
            spans, moved = self.placer(1)
            pos = spans[0][0]
        self.storage.write_row(pos, values)
        if ep is not None:
            ep.stamp_one(pos, values)
        if spans is None:
            spans = [(pos, 0, 1)]
        self.moving = moved
        for h in self.hooks:
            h.on_write(spans, 1, extra)
        self.advance(1, moved)

    def write(self, values: list, n: int, extra=None) -> None:
        """Write ``n`` validated rows (values in spec order, each ``(n, *shape)``); lock held."""
        asked = n
        if self.gate is not None:
            n = self.gate.admit(n)  # may wait (lock released) or raise: nothing written yet
            if n < asked:
                values = [v[:n] for v in values]
                extra = None if extra is None else extra[:n]
                if n == 0:
                    self.gate.on_drop(asked)
                    return
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
            raise SpecError(f"this buffer interleaves num_envs={self.num_envs} streams: extend "
                            f"takes whole steps of {self.num_envs} rows each, got {n} rows")
        for dst, src, count in spans:
            self.storage.write_rows(dst, stored, src, count)
        if ep is not None:
            ep.write(values, n, ends, spans)
        self.moving = moved
        for h in self.hooks:
            h.on_write(spans, n, extra)
        self.advance(n, moved)
        if n < asked:
            self.gate.on_drop(asked - n)

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

    def _slot_writes(self):
        """The hooks' one-row form as one ``on_write(slot)`` (None without hooks), and whether
        the generated calls may be used at all (every hook has that form, no elision)."""
        ep = self.episodes
        slot_hooks = [h.slot_hook() for h in self._per_row()]
        if self.batched or any(f is None for f in slot_hooks):
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
        hook (and the sampler's gate) has a per-slot form and rows are written as they are; else
        ``slow``. ``gate(1)``: called under the lock before the row's slot is read (a rate
        limiter waits and counts)."""
        if self.frames is not None:  # frame stacks: a push of their own (checks in compiled code)
            slot_hooks = [h.slot_hook() for h in self._per_row()]
            if self.gate is not None or any(f is None for f in slot_hooks):
                return slow
            on_write = None
            if slot_hooks:
                hooks = tuple(slot_hooks)

                def on_write(slot, _hooks=hooks):
                    for f in _hooks:
                        f(slot)

            push = frame_push(self.frames, spec, self.storage, self.episodes, self, lock, slow,
                              on_write=on_write, on_wrap=self._on_wrap(None), gate=gate)
            return slow if push is None else push
        on_write, usable = self._slot_writes()
        on_begin = None if self.gate is None else self.gate.slot_gate()
        if not usable or self.num_envs != 1 or (self.gate is not None and on_begin is None):
            return slow
        ep = self.episodes
        on_wrap = self._on_wrap(None if ep is None else ep.wrapped)
        place = None
        if self.placer is not None:  # the gate's one-row form gives the slot: f(cursor) -> slot
            place, on_begin = on_begin, None
            place = _wrapping(place, on_wrap, self)
        return make_push(spec, self.storage.field_views(), self, lock, slow,
                         on_wrap=on_wrap, on_write=on_write, on_begin=on_begin,
                         regions=self.storage.byte_regions(), gate=gate, place=place)

    def make_extend(self, spec, lock, slow, write=None, gate=None):
        """``extend(batch)`` specialised to ``spec`` for batches of a few rows (one vector-env
        step; see :func:`tfdata.replay.fastpush.make_extend`), where every hook has a per-slot
        form and rows are written as they are; else ``slow``. ``write(values, n)`` takes larger
        batches of exact dtypes. ``gate``: ``(wait, count)``, ``wait(n)`` called under the lock
        before the slot is read, ``count(n)`` after ``n`` rows are written (a rate limiter)."""
        on_write, usable = self._slot_writes()
        if not usable or self.gate is not None:
            return slow
        ep = self.episodes
        late = ep is not None and self.num_envs == 1  # one stream: stamped late, as a push
        return make_extend(spec, self, lock, slow, self.storage.byte_regions(),
                           max_rows=max(16, self.num_envs), num_envs=self.num_envs,
                           stamp=None if ep is None or late else (ep.stamp_rows, ep.term_i, ep.trunc_i),
                           on_write=on_write, on_wrap=self._on_wrap(ep.wrapped if late else None),
                           write=write, store=self.storage.write_rows
                           if not self._per_row() and (ep is None or late) else None, gate=gate)

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


def _wrapping(place, on_wrap, writer):
    """``place(cursor)`` that also calls ``on_wrap()`` when the slot it gives is behind the
    writer's cursor: the sweep crossed the ring's end (the generated push calls ``on_wrap``
    only for a row written into the last slot). ``writer``: the writer itself (the generated
    push that holds this holds it too; the writer holds neither)."""

    def place_wrapping(cursor, _place=place, _on_wrap=on_wrap, _w=writer):
        p = _place(cursor)
        if p < _w.cursor:  # the cursor now: another writer may have moved it while this waited
            _on_wrap()
        return p

    return place_wrapping
