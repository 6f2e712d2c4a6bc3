"""Exactly-k replay: every row is delivered in exactly ``k`` batches, then its slot is free.

The sampler keeps the pool of the rows awaiting replay, draws batches from it, counts each
row's deliveries and releases a slot after its ``k``-th delivery was copied. Where rows are
written is the writer's: a :class:`~tfdata.replay.writers.FreeSlotWriter` puts each into the
next free slot at or after its cursor, asking this sampler which slots are free (the free-slot
contract: ``remaining``, ``awaiting``, ``policy``, ``timeout``, ``waits``, ``on_drop``)."""

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


class SlotWaits:
    """Where a buffer's blocked writes wait for free slots and its samples for rows: one
    condition of the buffer's lock (waiting releases it and the GIL).

    Attributes
    ----------
    cond : threading.Condition
    wanted : list of int
        The rows each waiting write needs (its free-slot writer appends and removes them).
    samplers : int
        Samples waiting for rows.
    """

    #: what a sample that waited in vain waited for (the end of its TimeoutError)
    waited_for = ""

    def __init__(self, lock):
        self.cond = threading.Condition(lock)
        self.wanted = []
        self.samplers = 0

    @property
    def writers(self) -> int:
        """Writes waiting for free slots."""
        return len(self.wanted)

    def stuck(self, free: int) -> bool:
        """A write waits and none of the waiting writes can go on with ``free`` slots: slots
        are freed only by samples (a write woken but not yet running is not stuck)."""
        return bool(self.wanted) and min(self.wanted) > free

    def wait(self, deadline) -> bool:
        """Wait until notified or ``deadline`` (``time.monotonic()``; None: no limit); False
        once it has passed."""
        if deadline is None:
            self.cond.wait()
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        self.cond.wait(left)
        return True

    def wake(self) -> None:
        self.cond.notify_all()


class PollWaits(SlotWaits):
    """The waits of a sampler whose writers are other processes (a
    :class:`~tfdata.SharedReplayBuffer`): no write waits here, and a sample short of rows
    sleeps (briefly, then longer, the GIL released, no lock held by the writers) and then
    catches up on the rows published meanwhile (``catch_up()``)."""

    waited_for = " for the writers"

    def __init__(self, catch_up):
        self.wanted = []
        self.samplers = 0
        self._catch_up = catch_up
        self._deadline, self._pause = None, 20e-6

    def wait(self, deadline) -> bool:
        if deadline is not self._deadline:  # a new wait: sleep briefly first
            self._deadline, self._pause = deadline, 20e-6
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(self._pause)
        self._pause = min(2 * self._pause, 1e-3)
        self._catch_up()
        return True

    def wake(self) -> None:
        pass


class ExactlyKSampler(Sampler):
    """Each row is delivered in exactly ``replays`` batches, in a random order from the seed.

    The rows awaiting replay (written, delivered fewer than ``k`` times) form a pool; a batch
    draws ``batch_size`` distinct rows of it uniformly (a batch never holds a row twice), and a
    row leaves the pool after its ``k``-th delivery: its slot is then *free*. The buffer's
    writer (:class:`~tfdata.replay.writers.FreeSlotWriter`) puts each row into the next free
    slot at or after its cursor (wrapping), skipping the rows awaiting replay. So writers wait
    only when every slot awaits replay, and then the pool holds ``capacity >= batch_size``
    rows: a sample can always go on. Rows are therefore not in stream order: the buffer keeps no episode numbers,
    refuses ``n_step`` and ``elide_next``, and ``column()`` gives the rows in slot order from
    the cursor. When no slot is free, ``policy`` says:

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

    Over the shards of a :class:`~tfdata.SharedReplayBuffer` the same object runs through
    :class:`tfdata.shared.streams.ShardStreams`: the rows writer processes published reach the
    pool through the write hooks before each draw, a sample short of rows polls
    (:class:`PollWaits`), and the slots freed are released into the region's words after the
    copy (:meth:`release_into`), where each shard's writer process finds them free.

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
    released : int
        Slots released into a shared region's words (:meth:`release_into`; 0 in one process).

    Cost: the pool (uint32) and the deliveries left (uint8 for ``k <= 255``, else uint16) per
    slot: 5 or 6 bytes (``nbytes_parts["bookkeeping"]``, with the writer's 4); docs/design/exactly-k.md.
    """

    projects = True
    hears_writes = True
    stream_order = False  # slots are freed out of order: a free-slot writer
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
        self.delivered = self.dropped = self.lost_replays = self.released = 0
        self.waits = None  # SlotWaits (use_lock), or PollWaits over shards
        self._released = None  # a shared region's released words (release_into)

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
        self.meta = np.zeros(1, np.int64)  # [rows awaiting replay]

    def use_lock(self, lock) -> None:
        """The buffer's lock: blocked writes and samples short of rows wait on a condition of
        it (:class:`SlotWaits`, releasing it)."""
        self.waits = SlotWaits(lock)

    def release_into(self, released: np.ndarray) -> None:
        """A shared region's ``released`` words (uint64, one per slot): after each copy, each
        slot whose ``k``-th delivery it was gets one more release (release order), which tells
        its shard's writer process the slot is free (:attr:`released` counts them)."""
        self._released = released

    def plan(self, capacity: int) -> dict:
        return {"trees": 0, "bookkeeping": (4 + self.dtype.itemsize) * int(capacity)}

    @property
    def nbytes(self) -> dict:
        return {"trees": 0, "bookkeeping": int(self.pool.nbytes + self.remaining.nbytes)}

    @property
    def awaiting(self) -> int:
        """Rows awaiting replay (delivered fewer than ``replays`` times): slots not free."""
        return int(self.meta[0])

    @property
    def free(self) -> int:
        """Free slots (not awaiting replay): where a write may go without overwriting."""
        return self.capacity - int(self.meta[0])

    def drawable(self, n: int) -> int:
        """The rows awaiting replay: a batch holds distinct ones."""
        return int(self.meta[0])

    def counts(self) -> np.ndarray:
        """Deliveries left per slot (a copy, int64[capacity]; 0: free)."""
        return self.remaining.astype(np.int64)

    # -- the write hooks (lock held) -----------------------------------------------------------
    def on_drop(self, n: int) -> None:
        """``n`` rows found no free slot and were not written (``"drop"``)."""
        self.dropped += n

    def on_write(self, spans, n: int, extra) -> None:
        lost = 0
        written = 0
        for dst, _src, count in spans:
            got = self._k.replays_write(self.pool, self.remaining, self.meta, dst, count, self.replays)
            if got < 0:  # the arguments come from the writer: a bug, not the caller's input
                raise RuntimeError(f"ExactlyKSampler: replays_write returned {got}")
            lost += got
            written += count
        # rows of an extend longer than the ring that its own later rows overwrote
        self.lost_replays += lost + (n - written) * self.replays
        if self.waits.samplers:
            self.waits.wake()

    def slot_hook(self):
        """``on_write`` for one row, in Python (a kernel call costs more than these few reads);
        its ``rows(spans)`` adds the slots of ``spans`` (int64 ``(m, 2)``: first slot, count)
        in one kernel call and returns the deliveries they had left (a shared region's
        catch-up: rows written by other processes)."""
        # memoryviews of the arrays (the kernels' arrays, shared): reading or assigning one item
        # of a memoryview costs half of numpy's scalar indexing
        pool, remaining, meta = memoryview(self.pool), memoryview(self.remaining), memoryview(self.meta)
        k, cap = self.replays, self.capacity
        me = weakref.ref(self)  # the writer holds this hook: no cycle through the sampler

        def on_write(slot):
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
            waits = me().waits
            if waits.samplers:
                waits.wake()

        def rows(spans):
            s = me()
            got = s._k.replays_write_spans(s.pool, s.remaining, s.meta, spans, s.replays)
            if got < 0:  # the spans come from the streams, checked: a bug
                raise RuntimeError(f"ExactlyKSampler: replays_write_spans returned {got}")
            s.lost_replays += got
            return got

        on_write.rows = rows
        return on_write

    def on_clear(self) -> None:
        self._k.replays_clear(self.remaining, self.meta)
        self.delivered = self.dropped = self.lost_replays = 0
        if self.waits is not None and self.waits.writers:
            self.waits.wake()

    # -- drawing (lock held) -------------------------------------------------------------------
    def _short(self, batch: int) -> str:
        return (f"exactly_k: a batch of {batch} distinct rows, but {self.awaiting} rows await "
                f"replay ({self.replays} deliveries each; {self.delivered} delivered so far, "
                f"{0 if self.waits is None else self.waits.writers} writer(s) waiting for a free "
                f"slot)")

    def sample(self, n: int, out, arrays: dict) -> None:
        batch = out.indices.shape[0]
        if self.meta[0] < batch:
            self._await_rows(batch)
        got = out.kernels.sample_exactly_k(out.store, self.pool, self.remaining, self.meta,
                                           self.state, out.indices, out.kernel_out)
        if got < 0:  # the arguments come from this object: a bug, not the caller's input
            raise RuntimeError(f"ExactlyKSampler: sample_exactly_k returned {got}")
        self.delivered += batch
        if got:
            if self._released is not None:  # after the copy: only now may a writer reuse them
                freed = self._k.replays_release(self.remaining, self._released, out.indices)
                if freed != got:
                    raise RuntimeError(f"ExactlyKSampler: released {freed} slots of {got}")
                self.released += got
            if self.waits.wanted:  # a write waits for free slots
                self.waits.wake()

    def _await_rows(self, batch: int) -> None:
        """Wait for writers until ``batch`` rows await replay; ValueError at once when no wait
        is allowed (``timeout=None``) or would deadlock (a writer waits for this sample),
        TimeoutError when the wait ran out."""
        waits = self.waits
        if self.timeout is None or waits is None or waits.stuck(self.free) or batch > self.capacity:
            raise ValueError(self._short(batch) + ("; sample waits for rows only with a timeout"
                                                   if self.timeout is None else ""))
        deadline = time.monotonic() + self.timeout
        waits.samplers += 1
        try:
            while self.meta[0] < batch:
                if waits.stuck(self.free):
                    raise ValueError(self._short(batch))
                if not waits.wait(deadline):
                    raise TimeoutError(f"{self._short(batch)}; waited {self.timeout} s"
                                       f"{waits.waited_for}")
        finally:
            waits.samplers -= 1

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
        self.load_pool(slots, counts)
        self.delivered, self.dropped, self.lost_replays = counters
        if self.waits is not None and self.waits.writers:
            self.waits.wake()

    def load_pool(self, slots: np.ndarray, counts: np.ndarray) -> None:
        """The pool ``slots`` (int64, checked: held, distinct) in that order, with deliveries
        left ``counts`` (int64, each in ``[1, replays]``); every other slot free."""
        if self._k.replays_load(self.pool, self.remaining, self.meta, np.asarray(slots, np.int64),
                                np.asarray(counts, np.int64)) != 0:
            raise RuntimeError("ExactlyKSampler: a checked pool did not load")
