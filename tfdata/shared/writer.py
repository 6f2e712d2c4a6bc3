"""A writer process's handle on one shard of a shared buffer: :class:`SharedWriter` (see
:mod:`tfdata.shared`)."""

from __future__ import annotations

import fcntl
import os
import platform
import threading
import time
import weakref
from collections.abc import Mapping

import numpy as np

from .._checks import check_int as _check_int
from ..errors import SharedBufferError
from . import frames as shared_frames
from ..replay.core import weak_method as _weak_method
from ..replay.fastpush import make_push
from ..replay.writers import RingWriter
from .region import (ATTACHED, ATTACHES, CLOSED, CURSOR, DROPPED, FINISHED, GENERATION, HEAD, HELD,
                     PID, RESERVED, SAMPLES, STATE, WATCH_S, kernels, open_region, region_path,
                     release, writer_alive)

__all__ = ["SharedWriter"]

#: Whether this machine's CPU shows other cores every store in program order (x86-64). Then the
#: seqlock's ordered stores and release fences (:mod:`tfdata.kernels._sync`) are plain stores, and
#: a one-row push announces and publishes its row with stores through memoryviews instead of two
#: compiled calls (docs/design/shared-memory.md, "What a push costs"). Elsewhere (AArch64, which
#: may reorder stores) it calls the kernels, whose stores carry the ordering.
ORDERED_STORES = platform.machine().lower() in ("x86_64", "amd64")


class _Shard:
    """What this writer knows of its shard that a one-row push changes or checks (the hooks of
    :func:`store_hooks` hold it, not the writer, so they keep no reference cycle)."""

    __slots__ = ("head", "open")

    def __init__(self, head: int):
        self.head, self.open = head, True


class SharedWriter:
    """One writer process's handle on one shard of a :class:`SharedReplayBuffer`.

    Parameters
    ----------
    name : str
        The buffer's ``name`` (or its ``path``).
    shard : int
        Which shard, ``0 <= shard < num_writers``. A shard has at most one live writer; the
        shard of a writer that died may be taken over.
    dir : str, optional
        As given to the buffer (default :func:`shm_dir`); not needed with a path.
    timeout : float, optional
        ``"block"`` policy (FIFO, or exactly-k replay): seconds a write waits for the learner to
        free a slot before TimeoutError; None waits for ever. With a rate limiter: seconds a
        write waits for the learner to sample (None: the limiter's own ``timeout``).

    Notes
    -----
    Every row is validated against the buffer's spec before a byte is written: a bad row raises
    :class:`~tfdata.SpecError` naming the field, the expected and the given shape or dtype, and
    the shard is unchanged. Threads of one process may share a writer (its own lock orders
    their writes).

    With ``frame_stack`` a shard is one stream: a writer that takes a shard over (or attaches
    to a loaded checkpoint) continues its stream, after its newest row (a new episode only if
    that row ended one). A shard whose last writer died in the middle of a write cannot be
    taken over (SharedBufferError: its frame bookkeeping may be half-written); its published
    rows stay sampled.
    """

    def __init__(self, name: str, shard: int, *, dir: str | None = None,
                 timeout: float | None = None):
        path = region_path(name, dir)
        region = open_region(path)
        shard = _check_int("shard", shard, 0, region.shards - 1)
        if region.closed:
            raise SharedBufferError(f"shared buffer at {path} is closed by its owner")
        self._lockfd = os.open(region.lock_path(shard), os.O_RDWR | os.O_CLOEXEC)
        deadline = time.monotonic() + 1.0
        while True:  # the learner's liveness check holds the lock for a moment
            try:
                fcntl.flock(self._lockfd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                HELD.add(self._lockfd)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(self._lockfd)
                    self._lockfd = None
                    raise SharedBufferError(
                        f"shard {shard} of {path} has a live writer (pid {int(region.words(shard)[PID])})"
                    ) from None
                time.sleep(0.001)
        self._region = region
        self.shard = shard
        self.timeout = timeout
        self._words = region.words(shard)
        self._base = shard * region.cap
        self._cap = region.cap
        # a FIFO shard: writes stay below the consumer's tail
        self._fifo = region.mode == "fifo"
        # an exactly-k replay shard: each row goes to the next free slot at or after the cursor
        self._ek = region.exactly_k
        self._drop = region.policy == "drop"
        self._shard_state = _Shard(int(self._words[HEAD]))
        self._dropped = int(self._words[DROPPED])
        # any start is right (free slots are in the words); the last writer's keeps the order
        self._cursor = int(self._words[CURSOR]) % self._cap
        if self._ek and int(self._words[RESERVED]) > self._head:
            # the last writer died mid-write: free the slots it took and never published
            kernels().replays_recover(region.taken, region.released, region.log, self._base,
                                      self._cap, self._head, int(self._words[RESERVED]))
        self._claimed = np.empty(self._cap, np.int64)
        self._k = kernels()
        # frame stacks: this writer checks its writes against its shard and keeps the frames'
        # bookkeeping in the region (see shared/frames.py)
        self._frames = None
        if region.frames is not None:
            if int(self._words[RESERVED]) > self._head:
                os.close(self._lockfd)
                HELD.discard(self._lockfd)
                raise SharedBufferError(
                    f"shard {shard} of {path}: its last writer died while writing rows "
                    f"{self._head}..{int(self._words[RESERVED]) - 1}, and with frame_stack the "
                    f"shard's frame bookkeeping (previous frames, final and pending frames) may "
                    f"be half-written: the shard cannot be continued (its published rows stay "
                    f"sampled; the other shards go on)")
            self._frames = shared_frames.ShardFrameWriter(region.frames, shard)
        self._storage = region.storage
        self.spec = region.spec
        self._words[PID] = os.getpid()
        self._words[ATTACHES] = int(self._words[ATTACHES]) + 1
        self._words[STATE] = ATTACHED
        self._finalizer = weakref.finalize(self, _detach, self._words, self._lockfd, os.getpid())
        self._lock = threading.Lock()
        self._limiter = None
        if region.limiter is not None:  # checked by open_region
            from ..replay.limiter import RateLimiter

            lim = self._limiter = RateLimiter(**region.limiter)
            # the fast check of a push reads these (no call unless it has to wait)
            self._lim_fast = (lim.samples_per_insert, lim.min_size_to_sample, lim.max_diff)
            self._ctrl_words = memoryview(region.ctrl)
        self._generation = GENERATION[0]
        # the shard as a ring of its own slots, for the per-spec push (tfdata._fastpath)
        self._ring = RingWriter(self._cap)
        self._sync_ring()
        if (self._drop and (self._fifo or self._ek)) or self._frames is not None:
            # a dropped row writes nothing, a stacked row is checked against the shard's frames
            # and stored in part: the generic path
            self._fast_push = _weak_method(self, "_checked_push")
        else:
            lo, hi = self._base, self._base + self._cap
            views = [self._storage.field(n)[lo:hi] for n in self.spec.names]
            if self._ek:  # exactly-k "block": the generated push, to the slot _place_ek finds
                hooks = dict(on_write=_weak_method(self, "_publish_ek_one"),
                             place=_weak_method(self, "_place_ek"))
            elif ORDERED_STORES and self._limiter is None:
                on_begin, on_write = store_hooks(self._shard_state, region, shard,
                                                 _weak_method(self, "_write_check"),
                                                 _weak_method(self, "_wait_for_room"))
                hooks = dict(on_begin=on_begin, on_write=on_write)
            else:
                hooks = dict(on_write=_weak_method(self, "_publish_one"),
                             on_begin=_weak_method(self, "_begin_one" if self._limiter is None
                                                   else "_begin_limited"))
            self._fast_push = make_push(self.spec, views, self._ring, self._lock,
                                        _weak_method(self, "_checked_push"),
                                        regions=self._storage.byte_regions(lo, hi), **hooks)

    @property
    def _head(self) -> int:
        return self._shard_state.head

    @_head.setter
    def _head(self, head: int) -> None:
        self._shard_state.head = head

    def _sync_ring(self) -> None:
        self._ring.cursor = self._head % self._cap
        self._ring.size = min(self._head, self._cap)

    def _begin_one(self, slot: int) -> None:
        """Before a fast push writes ``slot``: refuse if closed, wait for room, announce it."""
        if not self._finalizer.alive or self._region.closed or self._generation != GENERATION[0]:
            self._write_check()
        if self._fifo and self._head - int(self._region.tails[self.shard]) >= self._cap:
            self._wait_for_room(0, 1)
        self._k.shard_begin(self._words, self._head + 1)

    def _begin_limited(self, slot: int) -> None:
        """:meth:`_begin_one` (replay mode) after the rate limiter lets one row in."""
        region = self._region
        if not self._finalizer.alive or region.closed or self._generation != GENERATION[0]:
            self._write_check()
        spi, min_size, max_diff = self._lim_fast
        i = sum(region.heads.tolist()) + 1
        if not (i <= min_size or i * spi - self._ctrl_words[SAMPLES] <= max_diff):
            self._limit_insert(1)
        self._k.shard_begin(self._words, self._head + 1)

    @property
    def rate_limiter(self):
        """This writer's view of the buffer's rate limiter (None without one): a
        :class:`~tfdata.RateLimiter` with the buffer's parameters, the counts read at this
        writer's last extend or wait (a push that does not wait reads them without storing
        them), and this writer's insert waits in its metrics."""
        return self._limiter

    def _limit_insert(self, n: int) -> None:
        """Return when the rate limiter lets ``n`` rows in (this writer's lock held; the
        learner's and other writers' progress is read from the region's words, polling with
        sleeps that release the GIL). Raises ValueError if it never can, TimeoutError after
        the timeout, SharedBufferError if the buffer is closed or its owner has ended."""
        lim, region = self._limiter, self._region
        lim.inserts, lim.samples = sum(region.heads.tolist()), self._ctrl_words[SAMPLES]
        if lim.can_insert(n):
            return
        lim.check_insert(n)
        timeout = lim.timeout if self.timeout is None else self.timeout
        t0 = time.monotonic()
        deadline = None if timeout is None else t0 + timeout
        check_owner = t0 + WATCH_S
        pause = 20e-6
        timed_out = False
        try:
            while True:
                time.sleep(pause)  # releases the GIL
                pause = min(2 * pause, 1e-3)
                lim.inserts, lim.samples = sum(region.heads.tolist()), self._ctrl_words[SAMPLES]
                if lim.can_insert(n):
                    return
                if region.closed:
                    raise SharedBufferError(f"shared buffer {region.path} was closed by its owner "
                                            f"(a write of {n} rows was waiting for the learner to "
                                            f"sample; nothing written)")
                now = time.monotonic()
                if now >= check_owner:
                    check_owner = now + WATCH_S
                    if not writer_alive(os.path.join(region.path, "owner.lock")):
                        raise SharedBufferError(f"the owner of shared buffer {region.path} has "
                                                f"ended: no one will sample (nothing written)")
                if deadline is not None and now >= deadline:
                    timed_out = True
                    raise TimeoutError(f"shard {self.shard}: "
                                       + lim.timeout_message("insert", n, now - t0))
        finally:
            lim.record_wait("insert", time.monotonic() - t0, timed_out)

    def _publish_one(self, slot: int) -> None:
        """After a fast push wrote ``slot``: publish it."""
        head = self._head
        self._k.shard_publish(self._region.stamps, self._words, self._base, self._cap, head, 1,
                              head + 1, self._dropped, time.monotonic_ns())
        self._head = head + 1

    @property
    def published(self) -> int:
        """Rows this shard has published (by every writer it had)."""
        return self._head

    @property
    def dropped(self) -> int:
        """Rows the ``"drop"`` policy refused on this shard."""
        return self._dropped

    def push(self, row: Mapping) -> None:
        """Write one row (a mapping of field name to value). With the ``"drop"`` policy a row
        that does not fit is dropped (counted in :attr:`dropped`).

        Raises
        ------
        SpecError
            The row does not match the spec; nothing is written.
        TimeoutError
            FIFO or exactly-k ``"block"``: the learner freed no slot within ``timeout``; nothing
            is written.
        SharedBufferError
            The owner closed the buffer, or this writer was closed.
        """
        self._fast_push(row)

    def _checked_push(self, row: Mapping) -> None:
        # the generic path: full validation with precise errors, then the same writes
        values = self.spec.check_row(row)
        one = self._frames is None
        if not one:  # checked and stored as arrays: the batch path
            values = [np.asarray(v, f.dtype).reshape((1,) + f.shape) for v, f in zip(values, self.spec)]
        with self._lock:
            self._write(1, values, one)

    def extend(self, batch: Mapping) -> int:
        """Write ``n`` rows given as one array per field (leading dimension ``n``); returns the
        rows written (``n``, or fewer when the ``"drop"`` policy drops the newest ones).

        In replay mode more rows than the shard holds leave its last ``shard_capacity``. With the
        FIFO or exactly-k ``"block"`` policy rows go in as room frees up (any ``n``; exactly-k:
        each into the next free slot of the shard at or after the cursor); a TimeoutError then
        says, and its ``written`` attribute holds, how many of the first rows went in. Raises as
        :meth:`push`; a batch refused for its content writes nothing.
        """
        n, values = self.spec.check_batch(batch)
        if n == 0:
            return 0
        with self._lock:
            return self._write(n, values, False)

    def _write_check(self) -> None:
        if self._generation != GENERATION[0]:
            raise SharedBufferError(f"this writer of shard {self.shard} was made before a fork: it "
                                    f"belongs to the parent process (one writer per shard); a "
                                    f"child attaches its own SharedWriter")
        if not self._finalizer.alive:
            raise SharedBufferError(f"writer of shard {self.shard} is closed")
        if self._region.closed:
            raise SharedBufferError(f"shared buffer {self._region.path} was closed by its owner")

    def _write(self, n: int, values: list, one: bool) -> int:
        """Write ``n`` validated rows (lock held); returns the rows written."""
        self._write_check()
        if self._limiter is not None:
            self._limit_insert(n)
        region, cap = self._region, self._cap
        head = self._head
        if self._ek:
            return self._write_ek(n, values, one)
        if not self._fifo:  # a ring keeps the last cap rows, as n single pushes would
            skip = max(0, n - cap)
            fr = self._frames
            if fr is not None:  # checked against the shard (nothing changes if refused)
                values = fr.check(values, n, head)
            self._put(values, one, skip, n - skip, head + skip, head + n, self._dropped, fr)
            return n - skip
        free = cap - (head - int(region.tails[self.shard]))
        if self._drop:  # the rows that fit go in; the newest ones are dropped, and counted
            k = min(n, free)
            self._put(values, one, 0, k, head, head + k, self._dropped + n - k)
            return k
        # block: write what fits, wait for room, go on. Writing in parts is what guarantees
        # progress: a writer waits only with its shard full, so the learner can always fill a
        # batch (batch sizes are at most the capacity)
        done = 0
        while done < n:
            if free == 0:
                free = self._wait_for_room(done, n)
            k = min(free, n - done)
            self._put(values, one, done, k, self._head, self._head + k, self._dropped)
            done += k
            free -= k
        return n

    def _put(self, values: list, one: bool, src: int, k: int, r0: int, head: int, dropped: int,
             frames=None) -> None:
        """Write rows ``values[src:src+k]`` as rows ``r0..r0+k-1`` of the shard and publish
        them with the new ``head`` and ``dropped`` count (``frames``: the frame bookkeeping of
        the write it checked, kept after the reserve, before the rows)."""
        region, cap = self._region, self._cap
        if k:
            self._k.shard_begin(self._words, r0 + k)
            if frames is not None:
                frames.write()
            start = r0 % cap
            if one:
                self._storage.write_row(self._base + start, values)
            else:
                first = min(k, cap - start)
                self._storage.write_rows(self._base + start, values, src, first)
                if k > first:
                    self._storage.write_rows(self._base, values, src + first, k - first)
        self._k.shard_publish(region.stamps, self._words, self._base, cap, r0, k, head, dropped,
                              time.monotonic_ns())
        self._head, self._dropped = head, dropped
        self._sync_ring()

    def _write_ek(self, n: int, values: list, one: bool) -> int:
        """Exactly-k replay (lock held): each row into the next free slot of the shard at or
        after the cursor, the rule of :class:`~tfdata.replay.writers.FreeSlotWriter` (free:
        ``taken == released`` in the region's words, ``replays_claim``); with none free,
        ``"block"`` waits for the learner to release one, ``"drop"`` drops the rest (the
        newest rows) and counts them. Returns the rows written."""
        done = 0
        while done < n:
            got = self._claim(n - done)
            if got == 0:
                if self._drop:
                    self._publish_ek(values, one, done, 0, self._dropped + n - done)
                    return done
                got = self._wait_for_room(done, n, lambda: self._claim(n - done))
            self._publish_ek(values, one, done, got, self._dropped)
            done += got
        return n

    def _place_ek(self, cursor: int) -> int:
        """Before a generated push writes (exactly-k ``"block"``, lock held): refuse if closed,
        let the rate limiter count the row in, find the next free slot (waiting for one),
        announce the write; returns the slot (of the shard). ``cursor`` (the ring's) is not
        used: the writer's own cursor is."""
        if not self._finalizer.alive or self._region.closed or self._generation != GENERATION[0]:
            self._write_check()
        if self._limiter is not None:
            self._limit_insert(1)
        if self._claim(1) == 0:
            self._wait_for_room(0, 1, lambda: self._claim(1))
        self._k.shard_begin(self._words, self._head + 1)
        return int(self._claimed[0])

    def _publish_ek_one(self, slot: int) -> None:
        """After a generated push wrote ``slot``: log it, take it, publish it."""
        region, head = self._region, self._head
        if self._k.replays_log(region.taken, region.log, self._base, self._cap, head,
                               self._claimed[:1]) != 1:
            raise RuntimeError("SharedWriter: replays_log refused a claimed slot")
        self._k.shard_publish(region.stamps, self._words, self._base, self._cap, head, 1,
                              head + 1, self._dropped, time.monotonic_ns())
        self._head = head + 1
        self._cursor = (slot + 1) % self._cap
        self._words[CURSOR] = self._cursor

    def _claim(self, n: int) -> int:
        region = self._region
        got = self._k.replays_claim(region.taken, region.released, self._base, self._cap,
                                    self._cursor, n, self._claimed)
        if got < 0:
            raise RuntimeError(f"SharedWriter: replays_claim returned {got}")
        return got

    def _publish_ek(self, values: list, one: bool, src: int, k: int, dropped: int) -> None:
        """Write rows ``values[src:src+k]`` into the slots claimed, log them, publish."""
        region, cap, base, head = self._region, self._cap, self._base, self._head
        slots = self._claimed[:k]
        if k:
            self._k.shard_begin(self._words, head + k)
            if one:
                self._storage.write_row(base + int(slots[0]), values)
            else:
                i = 0
                while i < k:  # runs of consecutive slots, one write each
                    j = i + 1
                    while j < k and slots[j] == slots[j - 1] + 1:
                        j += 1
                    self._storage.write_rows(base + int(slots[i]), values, src + i, j - i)
                    i = j
            # the slots and their takes before the head that publishes them (shard_publish
            # stores the head with release order)
            if self._k.replays_log(region.taken, region.log, base, cap, head, slots) != k:
                raise RuntimeError("SharedWriter: replays_log refused claimed slots")
            self._cursor = (int(slots[k - 1]) + 1) % cap
            self._words[CURSOR] = self._cursor
        self._k.shard_publish(region.stamps, self._words, base, cap, head, k, head + k, dropped,
                              time.monotonic_ns())
        self._head, self._dropped = head + k, dropped

    def _wait_for_room(self, done: int, n: int, room=None) -> int:
        """Sleep until the learner frees a slot; returns the free slots (``room()``: what
        tells, by default the FIFO's tail)."""
        region = self._region
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        pause = 20e-6
        check_owner = time.monotonic() + WATCH_S
        while True:
            free = self._cap - (self._head - int(region.tails[self.shard])) if room is None else room()
            if free > 0:
                return free
            if region.closed:
                raise SharedBufferError(f"shared buffer {region.path} was closed by its owner "
                                        f"({done} of {n} rows written)")
            if time.monotonic() > check_owner:  # a learner that died takes no more rows
                check_owner = time.monotonic() + WATCH_S
                if not writer_alive(os.path.join(region.path, "owner.lock")):
                    raise SharedBufferError(f"the owner of shared buffer {region.path} has ended: "
                                            f"no one will take rows ({done} of {n} rows written)")
            if deadline is not None and time.monotonic() >= deadline:
                exc = TimeoutError(f"shard {self.shard}: the learner took no row within "
                                   f"{self.timeout} s; {done} of {n} rows written (the first {done})")
                exc.written = done
                raise exc
            time.sleep(pause)  # releases the GIL
            pause = min(2 * pause, 1e-3)

    def close(self) -> None:
        """Detach: the shard counts as finished, the lock is released (idempotent)."""
        self._shard_state.open = False
        self._finalizer()

    def __enter__(self) -> "SharedWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SharedWriter(shard={self.shard}, published={self._head}, path={self._region.path!r})"


def store_hooks(st: _Shard, region, shard: int, refuse, wait_for_room) -> tuple:
    """``(on_begin, on_write)`` of a one-row push (:func:`~tfdata.replay.fastpush.make_push`) for
    a CPU that shows stores in program order (:data:`ORDERED_STORES`): the stores of
    :func:`~tfdata.kernels._shared.shard_begin` and :func:`~tfdata.kernels._shared.shard_publish`
    for one row, in their order, as single 64-bit stores through memoryviews.

    ``on_begin`` refuses (``refuse()`` raises) when the buffer is closed, the writer closed or
    the process forked since it attached; in FIFO mode it waits while the shard is full
    (``wait_for_room(0, 1)``); then it stores the reserve (never lowered) before any byte of the
    row. ``on_write`` stores the row's publication time (when the buffer keeps them) and then the
    head. The count of dropped rows is not stored again: a one-row push never drops (the
    ``"drop"`` policy takes the generic path), so the word already holds it.
    """
    words = _words_view(region.words(shard))
    ctrl = _words_view(region.ctrl)
    stamps = _words_view(region.stamps) if region.stamps.shape[0] else None
    tails = region.tails if region.mode == "fifo" else None
    base, cap, generation, born = shard * region.cap, region.cap, GENERATION, GENERATION[0]

    def on_begin(slot: int) -> None:
        if ctrl[CLOSED] or generation[0] != born or not st.open:
            refuse()
        end = st.head + 1
        if tails is not None and end - int(tails[shard]) > cap:
            wait_for_room(0, 1)
        if words[RESERVED] < end:
            words[RESERVED] = end

    def on_write(slot: int) -> None:
        head = st.head
        if stamps is not None:
            stamps[base + head % cap] = time.monotonic_ns()
        words[HEAD] = head + 1
        st.head = head + 1

    return on_begin, on_write


def _words_view(words: np.ndarray) -> memoryview:
    """``words`` (uint64, C-contiguous) as a memoryview whose item stores are single 64-bit
    stores."""
    return memoryview(words).cast("B").cast("Q")


def _detach(words: np.ndarray, lockfd: int, pid: int) -> None:
    if os.getpid() != pid:  # a forked child must not detach its parent's writer
        return
    words[STATE] = FINISHED
    words[PID] = 0
    release(lockfd)  # releases the lock
