"""Exactly-k replay: every row is delivered in exactly ``k`` batches, then its slot is free."""

from __future__ import annotations

import math
import threading
import time
import weakref

import numpy as np

from . import Sampler, StateError, checked_slots, config_keys, config_value, state_int, state_part

#: what a write does when the slot at the writer's cursor (the oldest row) is not free yet
POLICIES = ("block", "drop", "overwrite")
#: the largest ``replays``: the count of deliveries left is a uint16 per slot
MAX_REPLAYS = (1 << 16) - 1
#: a slot's last write is kept as the writer's lap modulo this (uint32)
_LAPS = 1 << 32
#: the options of ``sampler="exactly_k"`` (its :meth:`ExactlyKSampler.config`)
OPTIONS = ("replays", "policy", "timeout")
#: the largest ``timeout`` a checkpoint may carry (seconds; about 31 years)
MAX_TIMEOUT = 1e9
#: the counters of the state, ints in ``[0, 2**63 - 1]``
COUNTERS = ("delivered", "dropped", "lost_replays")


def replays_problem(owed: int, delivered: int, dropped: int, lost: int, size: int,
                    capacity: int, replays: int) -> tuple | None:
    """Why exactly-k counters cannot go with ``owed`` (the sum of the deliveries the rows
    awaiting replay have left) and ``size`` rows held, as ``(field, expected)``, or None.

    Every row written is owed ``replays`` deliveries, each of which is then made (``delivered``
    counts a batch's rows), lost to ``"overwrite"`` (``lost_replays``) or still owed: so
    ``delivered + lost_replays + owed = replays * W`` for the ``W`` rows written since the last
    clear (which sets every counter to 0), and ``W >= size``. Until the buffer has filled, every
    write went to a slot never written (the cursor equals the size), so ``W == size``, and
    nothing was overwritten or dropped (both need every slot awaiting replay)."""
    total = delivered + lost + owed
    k = replays
    if total % k:
        return "delivered", (f"delivered + lost_replays + the deliveries left ({lost} + {owed}) "
                             f"a multiple of replays = {k}: each row written is owed {k} deliveries")
    if total < size * k:
        each = f"{k} deliver{'y' if k == 1 else 'ies'}"
        return "delivered", (f"at least {size * k - lost - owed}: the {size} rows held were written, "
                             f"{each} owed each (delivered + lost_replays + the deliveries left >= "
                             f"{size * k})")
    if size < capacity:
        if lost:
            return "lost_replays", (f"0: the buffer has not filled since it was cleared ({size} of "
                                    f"{capacity} rows), so no row awaiting replay was overwritten")
        if dropped:
            return "dropped", (f"0: the buffer has not filled since it was cleared ({size} of "
                               f"{capacity} rows), so no write found every slot awaiting replay")
        if total != size * k:
            each = f"{k} deliver{'y' if k == 1 else 'ies'}"
            return "delivered", (f"{size * k - owed} ({size} rows held, {each} each, less the "
                                 f"{owed} left): until the buffer fills, exactly the rows held "
                                 f"were written")
    return None


class ExactlyKSampler(Sampler):
    """Each row is delivered in exactly ``replays`` batches, in a random order from the seed.

    The rows awaiting replay (written, delivered fewer than ``k`` times) form a pool; a batch
    draws ``batch_size`` distinct rows of it uniformly (a batch never holds a row twice), and a
    row leaves the pool after its ``k``-th delivery: its slot is then *free*. A write puts each
    row into the next free slot at or after the writer's cursor (wrapping), skipping the rows
    awaiting replay, and the cursor moves past the last slot written (:meth:`place`; a write of
    ``n`` rows lands where ``n`` pushes would). So writers wait only when every slot awaits
    replay, and then the pool holds ``capacity >= batch_size`` rows: a sample can always go on
    (the ring of the first version waited for the *oldest* row, which random delivery can
    leave pending while fewer rows than a batch await: a stall). Rows are therefore not in
    stream order: the buffer keeps no episode numbers, refuses ``n_step`` and ``elide_next``,
    and ``column()`` gives the rows in slot order from the cursor. When no slot is free,
    ``policy`` says:

    ``"block"``
        The write waits until it has a free slot for each of its rows (the buffer's lock
        released, so a sampling thread frees rows and wakes it), at most ``timeout`` seconds
        (None: as long as it takes), then raises TimeoutError having written and changed
        nothing. A write of more rows than the capacity can never fit (ValueError at once). One
        thread that writes and samples must sample when no slot is free: with ``timeout=None``
        its write would wait for ever; give a ``timeout`` or pick ``"drop"`` / ``"overwrite"``.
    ``"drop"``
        The rows that find no free slot (the last of the write) are not written; :attr:`dropped`
        counts them. With ``num_envs > 1``, whole steps (a step's rows may land in slots that
        are not adjacent).
    ``"overwrite"``
        Free slots first; once none is left, the row at the cursor is overwritten (the oldest
        by the cursor's sweep) and :attr:`lost_replays` counts the deliveries it had left (a
        row of a long ``extend`` may so overwrite an earlier row of the same write).

    ``sample(B)`` when fewer than ``B`` rows await replay: with ``timeout=None``, or when
    writers wait for free slots and none can go on (it waits for this very sample: a deadlock
    otherwise; possible only when a write of ``n`` rows and ``B`` exceed the capacity), ValueError
    at once, naming the counts; so a single-threaded loop never hangs. With a
    ``timeout``, the sample waits (lock released) up to ``timeout`` seconds for writer threads,
    then raises TimeoutError; it does so from the first call on, before any row exists too, for
    any ``B`` up to the capacity (``waits_for_rows``: the buffer then does not refuse a batch
    larger than the rows held). Nothing is drawn or changed by a refused sample.

    Same seed and the same interleaving of writes and samples: the same batches on every
    layout. :meth:`state_dict` and checkpoints keep the pool, the counts and the counters, so a
    restored buffer continues exactly. ``clear()`` frees every slot and sets the counters to 0
    (as it sets a without-replacement sampler's ``passes``); ``update_field`` changes no count
    (a relabelled row keeps its deliveries). Sequences (``sample_slices``) are refused
    (NotImplementedError): a slice's rows would be delivered a number of times no one chose.

    Parameters
    ----------
    seed : int or None
        See :class:`~tfdata.replay.samplers.Sampler`.
    replays : int, default 1
        ``k``, in ``[1, 65535]``. 1 is exact-once FIFO in random order.
    policy : {"block", "drop", "overwrite"}, default "block"
    timeout : float or None
        Seconds a blocked write (and a sample short of rows) may wait; positive and finite.

    Attributes
    ----------
    delivered : int
        Rows delivered in batches (``B`` per sample).
    dropped : int
        Rows not written by ``"drop"``.
    lost_replays : int
        Deliveries lost by ``"overwrite"``.

    ``update_field(name, batch, values)`` refuses a batch whose rows were overwritten since it
    was sampled: the writer's sweep skips rows awaiting replay, so passing a slot is not
    writing it, and the sampler keeps each slot's last write (the writer's lap, uint32; see
    :meth:`overwritten`).

    Cost: the pool (uint32), the deliveries left (uint8 for ``k <= 255``, else uint16) and the
    lap of the last write (uint32) per slot: 9 or 10 bytes per slot
    (``nbytes_parts["bookkeeping"]``). A push takes the generated
    push with :meth:`slot_gate` placing the row (``"block"``, ``"overwrite"``; ``"drop"``: the
    generic path): 1.2 us to a free slot, 2.0 us past rows awaiting replay (a kernel call), 0.7 us
    uniform (AoS, 1M CartPole rows, by hand; keeping the lap of each write added about 0.1 us,
    1.31 to 1.40 us at 1M rows, by hand). An extend takes the generic path, one kernel call
    placing the rows and one per span adding the written slots. A sample draws, lowers the
    counts and gathers in one kernel call.
    """

    projects = True
    hears_writes = True
    #: rows are written where a slot is free, not in stream order (no episodes, n-step, elision)
    stream_order = False
    #: the name ``ReplayBuffer(sampler=...)`` and checkpoints give this sampler
    name = "exactly_k"

    def __init__(self, seed: int | None = None, replays: int = 1, policy: str = "block",
                 timeout: float | None = None):
        super().__init__(seed)
        if isinstance(replays, bool) or not isinstance(replays, (int, np.integer)) \
                or not 1 <= replays <= MAX_REPLAYS:
            raise ValueError(f"replays must be an int in [1, {MAX_REPLAYS}], got {replays!r}")
        if not isinstance(policy, str) or policy not in POLICIES:
            raise ValueError(f"policy must be one of {list(POLICIES)}, got {policy!r}")
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float, np.integer, np.floating)) \
                    or not (0 < float(timeout) < math.inf):
                raise ValueError(f"timeout must be None or a positive finite number of seconds, "
                                 f"got {timeout!r}")
            timeout = float(timeout)
        self.replays, self.policy, self.timeout = int(replays), policy, timeout
        self.dtype = np.dtype(np.uint8 if self.replays <= 255 else np.uint16)
        self.delivered = self.dropped = self.lost_replays = 0
        self.writer = None
        self.cond = None
        self.writers_waiting = 0  # threads in admit(), waiting for free slots
        self._wanted = []  # the rows each of them writes
        self.samplers_waiting = 0  # threads in sample(), waiting for rows

    @property
    def rule(self) -> str:
        """How a batch takes rows (for messages)."""
        return (f"rows are drawn without replacement from those awaiting replay (a batch holds "
                f"distinct rows; each row is delivered in exactly {self.replays} "
                f"batch{'' if self.replays == 1 else 'es'})")

    @property
    def waits_for_rows(self) -> bool:
        """Whether a sample short of rows waits for writer threads: with a ``timeout``."""
        return self.timeout is not None

    def config(self) -> dict:
        """The constructor's options (what a checkpoint's config records)."""
        return {"replays": self.replays, "policy": self.policy, "timeout": self.timeout}

    @classmethod
    def from_config(cls, config, seed) -> "ExactlyKSampler":
        """``replays`` an int in ``[1, 65535]``, ``policy`` one of :data:`POLICIES`, ``timeout``
        null or a float in ``(0, 1e9]``: each present, exact JSON types."""
        config_keys(config, OPTIONS, "exactly_k")
        return cls(seed, replays=config_value(config, "replays", "int", 1, MAX_REPLAYS),
                   policy=config_value(config, "policy", "choice", options=POLICIES),
                   timeout=config_value(config, "timeout", "float", 0.0, MAX_TIMEOUT,
                                        lo_open=True, optional=True))

    def facets(self) -> dict:
        return {**super().facets(), "replays": self.replays, "policy": self.policy}

    # -- construction and memory ---------------------------------------------------------------
    def bind(self, storage, capacity: int, num_envs: int, allocator) -> None:
        super().bind(storage, capacity, num_envs, allocator)
        from ...kernels import _replays  # numba is imported when the first buffer is built

        self._k = _replays
        self.pool = allocator.zeros(capacity, np.uint32)
        self.remaining = allocator.zeros(capacity, self.dtype)
        # the lap of the writer's position at each slot's last write, modulo 2**32 (its
        # position: lap * capacity + slot), which says which rows of a batch were overwritten
        # since it was sampled: the writer's sweep skips slots awaiting replay, so passing a
        # slot is not writing it
        self.wrote = allocator.zeros(capacity, np.uint32)
        self.meta = np.zeros(1, np.int64)  # [rows awaiting replay]
        # replays_place's outputs: runs of slots (a write of more runs takes several calls)
        self._runs = np.zeros((64, 2), np.int64)
        self._placed = np.zeros(4, np.int64)

    def watch(self, writer) -> None:
        """The writer whose ``cursor`` the gate checks (a proxy: the writer holds this hook)."""
        self.writer = weakref.proxy(writer)
        self._writer_ref = weakref.ref(writer)  # (for the one-row hook, held by the push only)

    def use_lock(self, lock) -> None:
        """The buffer's lock: blocked writes and samples short of rows wait on a condition of
        it (releasing it)."""
        self.cond = threading.Condition(lock)

    def plan(self, capacity: int) -> dict:
        return {"trees": 0, "bookkeeping": (8 + self.dtype.itemsize) * int(capacity)}

    @property
    def nbytes(self) -> dict:
        return {"trees": 0, "bookkeeping": int(self.pool.nbytes + self.remaining.nbytes
                                                + self.wrote.nbytes)}

    def overwritten(self, slots: np.ndarray, since: int) -> np.ndarray:
        """Which of ``slots`` (int64, held) were written at a writer position ``>= since`` (bool
        array; the writer's ``overwritten`` asks this gate, whose sweep skips slots): those
        whose last write's lap is past ``since``'s, or the same lap at or after its slot.

        Laps are kept modulo 2**32 (4 bytes per slot): a batch older than ``2**32 - 1`` laps
        counts as stale whole, and a row that awaited replay through about ``2**32`` laps of
        the sweep may be taken for a new one (refused, never the other way round)."""
        lap0, at0 = divmod(since, self.capacity)
        laps = self.writer.laps - lap0
        if laps >= _LAPS - 1:
            return np.ones(slots.shape, bool)
        d = (self.wrote[slots].astype(np.int64) - lap0) % _LAPS  # laps after the batch's
        return ((d > 0) & (d <= laps)) | ((d == 0) & (slots >= at0))

    @property
    def awaiting(self) -> int:
        """Rows awaiting replay (delivered fewer than ``replays`` times)."""
        return int(self.meta[0])

    def drawable(self, n: int) -> int:
        """The rows awaiting replay: a batch holds distinct ones."""
        return int(self.meta[0])

    def counts(self) -> np.ndarray:
        """Deliveries left per slot (a copy, int64[capacity]; 0: free)."""
        return self.remaining.astype(np.int64)

    # -- the gate and the write hooks (lock held) ----------------------------------------------
    def _deadline(self):
        return None if self.timeout is None else time.monotonic() + self.timeout

    def _wait(self, deadline) -> bool:
        """Wait on the condition until notified or ``deadline``; False once it has passed."""
        if deadline is None:
            self.cond.wait()
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        self.cond.wait(left)
        return True

    @property
    def free(self) -> int:
        """Free slots (not awaiting replay): where a write may go without overwriting."""
        return self.capacity - int(self.meta[0])

    def admit(self, n: int) -> int:
        """How many of the next ``n`` rows may be written now (the writer's gate, lock held):
        ``n`` (``"overwrite"``: always; ``"block"``: once ``n`` slots are free, waiting here with
        the lock released), or for ``"drop"`` as many as there are free slots (whole steps of
        ``num_envs``). ``"block"`` raises TimeoutError after ``timeout`` seconds, ValueError at
        once for ``n`` above the capacity; nothing is changed by a refusal."""
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
        if self.cond is None:
            raise RuntimeError("ExactlyKSampler: use_lock was not called; a blocked write cannot wait")
        deadline = self._deadline()
        self.writers_waiting += 1
        self._wanted.append(n)
        if self.samplers_waiting:  # a sample waiting for rows would wait for this writer: wake it
            self.cond.notify_all()  # (it then raises instead of waiting out its timeout)
        try:
            while True:
                if not self._wait(deadline):
                    raise TimeoutError(
                        f"exactly_k, policy='block': a write of {n} rows waited {self.timeout} s "
                        f"for {n} free slots ({self.free} free: {self.awaiting} of {cap} rows "
                        f"await replay); nothing was written")
                if self.free >= n:  # other threads ran while the lock was released
                    return n
        finally:
            self.writers_waiting -= 1
            self._wanted.remove(n)

    def _stuck(self) -> bool:
        """A writer waits and none of the waiting writers can go on now: rows are freed only
        by samples (a writer woken but not yet running is not stuck: it will write)."""
        return bool(self._wanted) and min(self._wanted) > self.free

    def place(self, n: int):
        """Where the ``n`` rows the gate admitted go (lock held): ``(spans, moved)``, the
        writer's ``[(dst_start, src_start, count), ...]`` in row order and the slots its cursor
        moves over. Each row goes to the next free slot at or after the cursor (wrapping),
        skipping the rows awaiting replay; with no free slot left (``"overwrite"`` only), to
        the slot at the cursor, whose row is lost. A row of a write may overwrite an earlier
        row of the same write (an ``extend`` of more rows than there are free slots plus
        slots awaiting replay ahead): as ``n`` single pushes would."""
        cur = self.writer.cursor
        if n == 1 and self.remaining[cur] == 0:  # the common case, without a kernel call
            return [(cur, 0, 1)], 1
        spans = []
        free, src, moved = self.free, 0, 0
        runs, out = self._runs, self._placed
        while src < n:
            r = self._k.replays_place(self.remaining, cur, n - src, free, runs, out)
            if r < 0:  # the arguments come from this object: a bug, not the caller's input
                raise RuntimeError(f"ExactlyKSampler: replays_place returned {r}")
            for i in range(r):
                dst, count = int(runs[i, 0]), int(runs[i, 1])
                spans.append((dst, src, count))
                src += count
            cur, free, moved = int(out[0]), int(out[1]), moved + int(out[3])
        return spans, moved

    def on_drop(self, n: int) -> None:
        """``n`` rows the gate refused were not written (``"drop"``)."""
        self.dropped += n

    def on_write(self, spans, n: int, extra) -> None:
        lost = 0
        written = 0
        # the writer's position before the write; the spans follow its sweep, in order
        cap, w = self.capacity, self.writer
        at = w.laps * cap + w.cursor
        for dst, _src, count in spans:
            at += (dst - at) % cap  # the first position at or after the sweep's at slot dst
            self.wrote[dst:dst + count] = (at - dst) // cap % _LAPS
            at += count
        for dst, _src, count in spans:
            got = self._k.replays_write(self.pool, self.remaining, self.meta, dst, count, self.replays)
            if got < 0:  # the arguments come from the writer: a bug, not the caller's input
                raise RuntimeError(f"ExactlyKSampler: replays_write returned {got}")
            lost += got
            written += count
        # rows of an extend longer than the ring that its own later rows overwrote
        self.lost_replays += lost + (n - written) * self.replays
        if self.samplers_waiting:
            self.cond.notify_all()

    def slot_gate(self):
        """The one-row form of :meth:`admit` and :meth:`place` for the generated push:
        ``f(cursor) -> slot``, the slot the row goes to (waiting for one with ``"block"``);
        None for ``"drop"`` (a dropped row is the generic path's to skip)."""
        if self.policy == "drop":
            return None
        remaining, me = self.remaining, weakref.ref(self)  # the writer holds this: no cycle

        def place_one(cursor):
            if remaining[cursor] == 0:  # the common case: no call
                return cursor
            s = me()
            if s.meta[0] == s.capacity:  # no free slot
                if s.policy == "overwrite":
                    return cursor  # the row at the cursor is lost (on_write counts it)
                s.admit(1)  # waits (lock released) or raises; other writers may have moved on
            return s._place_from(s.writer.cursor)

        return place_one

    def _place_from(self, cursor: int) -> int:
        """The slot one row goes to from ``cursor``."""
        r = self._k.replays_place(self.remaining, cursor, 1, self.free, self._runs, self._placed)
        if r != 1:
            raise RuntimeError(f"ExactlyKSampler: replays_place returned {r}")
        return int(self._runs[0, 0])

    def slot_hook(self):
        """``on_write`` for one row, in Python (a kernel call costs more than these few reads)."""
        # memoryviews of the arrays (the kernels' arrays, shared): reading or assigning one item
        # of a memoryview costs half of numpy's scalar indexing
        pool, remaining, meta = memoryview(self.pool), memoryview(self.remaining), memoryview(self.meta)
        k, cap = self.replays, self.capacity
        # the writer itself, not its proxy: this closure is held by the generated push (which
        # holds the writer anyway), never by the writer
        wrote, w = memoryview(self.wrote), self._writer_ref()
        me = weakref.ref(self)  # the writer holds this hook: no cycle through the sampler

        def on_write(slot):
            # the generated push's place already counted the lap of a sweep past the ring's
            # end (writers._wrapping), so the writer's laps are the row's
            wrote[slot] = w.laps & 0xFFFFFFFF
            left = remaining[slot]
            if left:
                me().lost_replays += left  # only "overwrite" with no free slot writes over one
            else:
                m = meta[0]
                if m >= cap:
                    raise RuntimeError("ExactlyKSampler: the pool is full but a slot was free")
                pool[m] = slot
                meta[0] = m + 1
            remaining[slot] = k
            s = me()
            if s.samplers_waiting:
                s.cond.notify_all()

        return on_write

    def on_clear(self) -> None:
        self._k.replays_clear(self.remaining, self.meta)
        self.delivered = self.dropped = self.lost_replays = 0
        if self.cond is not None and self.writers_waiting:
            self.cond.notify_all()

    # -- drawing (lock held) -------------------------------------------------------------------
    def _short(self, batch: int) -> str:
        return (f"exactly_k: a batch of {batch} distinct rows, but {self.awaiting} rows await "
                f"replay ({self.replays} deliveries each; {self.delivered} delivered so far, "
                f"{self.writers_waiting} writer(s) waiting for a free slot)")

    def sample(self, n: int, out, arrays: dict) -> None:
        batch = out.indices.shape[0]
        if self.meta[0] < batch:
            self._await_rows(batch)
        got = out.kernels.sample_exactly_k(out.store, self.pool, self.remaining, self.meta,
                                           self.state, out.indices, out.kernel_out)
        if got < 0:  # the arguments come from this object: a bug, not the caller's input
            raise RuntimeError(f"ExactlyKSampler: sample_exactly_k returned {got}")
        self.delivered += batch
        if got and self.writers_waiting:
            self.cond.notify_all()

    def _await_rows(self, batch: int) -> None:
        """Wait for writer threads until ``batch`` rows await replay; ValueError at once when
        no wait is allowed (``timeout=None``) or would deadlock (a writer waits for this
        sample), TimeoutError when the wait ran out."""
        if self.timeout is None or self._stuck() or self.cond is None or batch > self.capacity:
            raise ValueError(self._short(batch) + ("; sample waits for rows only with a timeout"
                                                   if self.timeout is None else ""))
        deadline = self._deadline()
        self.samplers_waiting += 1
        try:
            while self.meta[0] < batch:
                if self._stuck():
                    raise ValueError(self._short(batch))
                if not self._wait(deadline):
                    raise TimeoutError(f"{self._short(batch)}; waited {self.timeout} s")
        finally:
            self.samplers_waiting -= 1

    def sample_slices(self, n, streams, geo, reject, max_draws, out, arrays,
                      part=None) -> int:
        raise NotImplementedError("sample_sequences: sampler='exactly_k' delivers rows, not "
                                  "slices (a slice's rows would be delivered a number of times "
                                  "no one chose); use sample()")

    # -- state ---------------------------------------------------------------------------------
    def extra_state(self, size: int) -> dict:
        """``{"slots": int64[m], "counts": int64[m], "delivered": int, "dropped": int,
        "lost_replays": int}``: the slots awaiting replay in the pool's order and the
        deliveries each has left."""
        m = int(self.meta[0])
        slots = self.pool[:m].astype(np.int64)
        return {"slots": slots, "counts": self.remaining[slots].astype(np.int64),
                "delivered": self.delivered, "dropped": self.dropped,
                "lost_replays": self.lost_replays}

    def check_state(self, state, size: int, capacity: int):
        """``slots``: slots of rows held, each once; ``counts``: an int per slot in ``[1,
        replays]``; the counters ints in ``[0, 2**63 - 1]``, against the counts and the rows
        held (:func:`replays_problem`: every delivery owed to the rows written since the last
        clear is made, lost or still owed)."""
        rng = super().check_state(state, size, capacity)
        key = self.name
        state_part(state, ("slots", "counts") + COUNTERS, key)
        counters = [state_int(state, k, f"{key}.{k}", 0, (1 << 63) - 1) for k in COUNTERS]
        slots = checked_slots(state["slots"], size, f"{key}.slots")
        counts = state["counts"]
        if (not isinstance(counts, np.ndarray) or counts.shape != slots.shape
                or (counts.size and counts.dtype.kind not in "iu")):
            raise StateError(f"{key}.counts", f"int64[{slots.shape[0]}] (one per slot)",
                             f"{getattr(counts, 'dtype', type(counts).__name__)}"
                             f"{list(getattr(counts, 'shape', ()))}")
        if counts.size:
            bad = np.flatnonzero((counts < 1) | (counts > self.replays))
            if bad.size:
                i = int(bad[0])
                raise StateError(f"{key}.counts[{i}]", f"an int in [1, {self.replays}] (the "
                                 f"deliveries left: config.replays at most)", int(counts[i]))
        counts = np.ascontiguousarray(counts, np.int64)
        delivered, dropped, lost = counters
        problem = replays_problem(int(counts.sum()), delivered, dropped, lost, size, capacity,
                                  self.replays)
        if problem is not None:
            field, want = problem
            raise StateError(f"{key}.{field}", want, state[field])
        return rng, slots, counts, counters

    def load_state(self, checked) -> None:
        rng, slots, counts, counters = checked
        super().load_state(rng)
        if self._k.replays_load(self.pool, self.remaining, self.meta, slots, counts) != 0:
            raise RuntimeError("ExactlyKSampler: a checked pool did not load")
        # (the writer loaded first, two laps on): the rows loaded were written after any batch
        # sampled before the load, before any sampled after it
        self.wrote[:] = (self.writer.laps - 1) % _LAPS
        self.delivered, self.dropped, self.lost_replays = counters
        if self.cond is not None and self.writers_waiting:
            self.cond.notify_all()
