"""The prefetch thread of a :class:`~tfdata.loader.DataLoader` epoch and what it shares with the
consumer: one lock-free published counter, a ring of ready batches, and the handshakes by which
each side sleeps and wakes the other (see docs/design/loader.md)."""

from __future__ import annotations

import threading
import time

import numpy as np


class Failure:
    __slots__ = ("exc",)

    def __init__(self, exc: BaseException):
        self.exc = exc


#: the consumer wants the thread to run ahead when it spent at least this long outside ``next()``
#: before each of its last two requests: a shorter step leaves the thread nothing to overlap, and a thread
#: working beside a consumer that only asks for batches costs it GIL handoffs (a small shuffled
#: batch gathered in the consumer's thread costs about a thread wake-up: docs/design/loader.md)
WANT_STEP_NS = 10_000
#: how long the thread spins (without the GIL) for a slot to come back before it sleeps
SPIN_NS = 50_000
_pc = time.perf_counter_ns
_SPIN_READS = []


def spin_reads() -> int:
    """Reads of the spin kernel in about ``SPIN_NS`` on this machine, measured once per process."""
    if not _SPIN_READS:
        from .kernels._loader import wait_change

        probe = np.zeros(1, np.int64)
        wait_change(probe, 0, 0, 16)  # compiled or loaded from the cache
        n = 1 << 15
        t0 = _pc()
        wait_change(probe, 0, 0, n)
        per_read = max(_pc() - t0, 1) / n
        _SPIN_READS.append(max(1024, int(SPIN_NS / per_read)))
    return _SPIN_READS[0]


class Ahead:
    """What the consumer and the prefetch thread share for one epoch (no reference to the iterator;
    the protocol: docs/design/loader.md, "Ring and prefetch").

    Batch ``j`` goes to ring slot ``j % slots``: its producer writes ``out[slot]`` then
    ``ready[slot] = j``. ``nxt`` is the next batch to prepare (in order, under ``mutex``; filled
    outside it). ``state[0]`` is the first batch the thread may not prepare yet, published by the
    consumer with one store per ``next()``. ``sleeping`` (the thread waits on ``wake``) and
    ``waiting`` (the consumer waits on ``done``) are set under ``mutex`` by the side that waits
    and cleared, with one matching ``release``, by the side that wakes it; once ``asleep`` only
    the consumer can wake the thread, so the consumer prepares and fills batches without ``mutex``.
    """

    __slots__ = ("plan", "slots", "batches", "mutex", "wake", "done", "state", "nxt", "out", "ready",
                 "want", "sleeping", "asleep", "waiting", "stop", "failed", "exited")

    def __init__(self, plan, slots: int, batches: int):
        self.plan = plan
        self.slots = slots
        self.batches = batches
        self.mutex = threading.Lock()
        self.wake = threading.Lock()
        self.wake.acquire()
        self.done = threading.Lock()
        self.done.acquire()
        # [0]: first batch the thread may not prepare; [1]: the last batch published
        self.state = np.array([slots, -1], np.int64)
        self.nxt = 0
        self.out = [None] * slots
        self.ready = [-1] * slots
        self.want = False
        # no thread yet: as for a sleeping one, only the consumer can start it
        self.sleeping = self.asleep = True
        self.waiting = self.stop = self.failed = self.exited = False

    def publish(self, j: int, batch) -> None:
        slot = j % self.slots
        self.out[slot] = batch
        self.ready[slot] = j
        self.state[1] = j
        if self.waiting:
            with self.mutex:
                if self.waiting:
                    self.waiting = False
                    self.done.release()

    def wake_thread(self) -> None:
        with self.mutex:
            if self.sleeping:
                self.sleeping = self.asleep = False
                self.wake.release()


def run_ahead(ctl: Ahead) -> None:
    """The prefetch thread: prepare and fill batches while there are free slots and the consumer
    wants it, spin for a slot, then sleep until the consumer wakes it."""
    from .kernels._loader import wait_change

    plan, state, mutex = ctl.plan, ctl.state, ctl.mutex
    spins = spin_reads()
    try:
        while True:
            work = None
            with mutex:
                if ctl.stop or ctl.failed or ctl.nxt >= ctl.batches:
                    return
                j = ctl.nxt
                if ctl.want and j < state[0]:
                    ctl.nxt = j + 1
                    try:
                        work = plan.prepare(j)
                    except BaseException as exc:  # noqa: BLE001 - raised by the consumer at batch j
                        ctl.failed = True
                        ctl.publish(j, Failure(exc))
                        return
            if work is not None:
                try:
                    batch = plan.fill(work, ahead=True)
                except BaseException as exc:  # noqa: BLE001
                    ctl.failed = True
                    batch = Failure(exc)
                ctl.publish(j, batch)
                continue
            if ctl.want:  # the ring is full: spin for a slot, without the GIL, before sleeping
                # one kernel call for the whole budget: every return to Python takes the GIL,
                # which the consumer may be waiting for at the end of its step
                limit = int(state[0])
                if wait_change(state, 0, limit, spins) != limit:
                    continue
            with mutex:
                if ctl.stop:
                    return
                ctl.sleeping = True
                # read after ``sleeping`` is set: a consumer that moved on before it saw the flag
                # has already published what this check reads
                if ctl.want and ctl.nxt < state[0]:
                    ctl.sleeping = False
                    continue
                ctl.asleep = True
            ctl.wake.acquire()
    finally:
        ctl.exited = True
