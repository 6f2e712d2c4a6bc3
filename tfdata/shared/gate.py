"""The gates of a shared buffer's sample path (the contract of :mod:`tfdata.replay.gates`):
:class:`ShardGate` without a rate limiter, :class:`SampleGate` with one (inserts are the sum of
the shards' heads, samples the count the learner publishes in the region's control words for
the writers, see :mod:`tfdata.replay.limiter`), and :class:`WriterWatch`, which both call
before they take the lock: the warning about writers that died."""

from __future__ import annotations

import time
import warnings

import numpy as np

from ..errors import SharedBufferError, WriterLostWarning
from ..replay.gates import Limited
from ..replay.limiter import RateLimiter
from .region import ATTACHED, ATTACHES, HEAD, PID, SAMPLES, STATE, WATCH_S

__all__ = ["SampleGate", "ShardGate", "WriterWatch", "check_limiter"]


class WriterWatch:
    """Warns once per incident about writers of ``region`` that died without closing their
    shard (at most every ``WATCH_S`` seconds; ``name``: the buffer's, for messages).

    Attributes
    ----------
    at : float
        ``time.monotonic()`` from which the next call looks again (callers compare first).
    lost : list of dict
        Every death noticed: ``shard``, ``pid``, ``published``, ``torn``.
    """

    def __init__(self, region, name: str):
        self._region, self.name = region, name
        self.at = 0.0
        self.lost: list = []
        self._reported: set = set()

    def __call__(self, stacklevel: int = 3) -> None:
        """Look (if due); ``stacklevel``: the warning's, from here."""
        now = time.monotonic()
        if now < self.at:
            return
        self.at = now + WATCH_S
        r = self._region
        for s in range(r.shards):
            w = r.words(s)
            if int(w[STATE]) != ATTACHED:
                continue
            key = (s, int(w[ATTACHES]))
            if key in self._reported or r.writer_state(s) != "dead":
                continue
            self._reported.add(key)
            torn = r.torn(s)
            info = {"shard": s, "pid": int(w[PID]), "published": int(w[HEAD]), "torn": torn}
            self.lost.append(info)
            warnings.warn(WriterLostWarning(
                f"shared buffer {self.name!r}: the writer of shard {s} (pid {info['pid']}) died "
                f"without closing it; its {info['published']} published rows stay, {torn} slot(s) "
                f"it was writing are never sampled or delivered; a new SharedWriter may take the "
                f"shard over"), stacklevel=stacklevel)


class ShardGate:
    """No rate limiter: a batch draws from the rows the shards hold (``sampler="exactly_k"``:
    waits for them, up to its timeout, in the draw); refuses every sample of a FIFO region.

    Parameters
    ----------
    region
        The buffer's region (heads, ``cap``, mode).
    lock
        The buffer's lock.
    streams : ShardStreams
        The shards' streams (their ``rule`` and ``too_few`` for messages).
    watch : WriterWatch
    name : str
        The buffer's, for messages.
    """

    limited = False

    def __init__(self, region, lock, streams, watch, name: str):
        self._region, self.lock, self._streams, self._watch, self.name = region, lock, streams, watch, name
        self.capacity = region.shards * region.cap
        self._waits, self._fifo = region.exactly_k, region.mode == "fifo"

    def refuse(self) -> None:
        """SharedBufferError for a FIFO region (its rows are drained, not sampled)."""
        if self._fifo:
            raise SharedBufferError(f"shared buffer {self.name!r} is a FIFO queue: use get_batch(), "
                                    f"or build it with mode='replay' to sample")

    def rows(self) -> int:
        """Rows the shards hold now."""
        return int(np.minimum(self._region.heads.astype(np.int64), self._region.cap).sum())

    def admit(self, batch_size: int) -> None:
        """Refuse (before its ring exists) a batch the rows held cannot give (exactly-k: that
        no rows ever can)."""
        self.refuse()
        if self._waits:
            if batch_size > self.capacity:
                raise ValueError(f"batch_size {batch_size} is larger than the capacity "
                                 f"{self.capacity}; {self._streams.rule}")
            return
        n = self.rows()
        if batch_size > n:
            raise self._streams.too_few(batch_size, n)

    def admit_slices(self, batch_size: int) -> None:
        self.refuse()

    def acquire(self, batch_size: int) -> int:
        """Look for dead writers (if due), take the lock; 0 (the draws read the heads)."""
        watch = self._watch
        if time.monotonic() >= watch.at:
            watch(4)  # the warning names the caller of sample()
        self.lock.acquire()
        return 0

    def acquire_slices(self, batch_size: int) -> int:
        """Take the lock; the rows held (the slices check them)."""
        watch = self._watch
        if time.monotonic() >= watch.at:
            watch(5)
        self.lock.acquire()
        return self.rows()

    def undo(self, batch_size: int) -> None:
        """Nothing was counted."""


def check_limiter(limiter, mode: str, capacity: int) -> None:
    """Refuse a rate limiter a shared buffer cannot use (before the region exists)."""
    if limiter is None:
        return
    if not isinstance(limiter, RateLimiter):
        raise TypeError(f"rate_limiter must be a tfdata.RateLimiter or None, got "
                        f"{type(limiter).__name__} {limiter!r:.100}")
    if limiter.min_size_to_sample > capacity:
        raise ValueError(f"rate_limiter: min_size_to_sample must be <= capacity {capacity}, got "
                         f"{limiter.min_size_to_sample}")


class SampleGate(Limited):
    """When a sample may go: the ``limiter``'s predicate over the shards' heads, and the wait
    for it (polling the heads without the buffer's ``lock``); the batch counted and published to
    the writers. ``sampler``: the buffer's (its facets, for the table of combinations);
    ``watch``: the :class:`WriterWatch`; ``name``: the buffer's, for messages."""

    def __init__(self, region, lock, limiter, sampler, watch, name: str):
        self.limiter, self.sampler, self._watch = limiter, sampler, watch
        self.capacity = region.shards * region.cap
        self._region = region
        self._heads, self._cap = region.heads, region.cap
        self._lock = lock
        self.name = name
        self._held_known = 0  # rows known to be held (a lower bound: they never decrease)
        self._ctrl_words = memoryview(region.ctrl)

    def inserts(self) -> int:
        """Rows published by every shard since the buffer was made (a limiter's inserts)."""
        return sum(self._heads.tolist())

    def may_sample(self, batch_size: int) -> bool:
        """Whether the limiter allows a sample of ``batch_size`` rows now and so many are held."""
        heads = self._heads.tolist()
        lim = self.limiter
        i = lim.inserts = sum(heads)
        if not (i >= lim.min_size_to_sample
                and i * lim.samples_per_insert - lim.samples - batch_size >= lim.min_diff):
            return False
        if batch_size <= self._held_known:  # rows held never decrease in replay mode
            return True
        cap = self._cap
        self._held_known = sum(h if h < cap else cap for h in heads)
        return self._held_known >= batch_size

    def acquire(self, batch_size: int) -> int:
        """Return holding the lock once the limiter allows a sample of ``batch_size`` rows, the
        batch counted (see :meth:`wait`); 0 (the draws read the heads)."""
        watch = self._watch
        if time.monotonic() >= watch.at:
            watch(4)  # the warning names the caller of sample()
        self.wait(batch_size)
        self.count(batch_size)
        return 0

    def acquire_slices(self, batch_size: int) -> int:
        """As :meth:`acquire`; the rows held (the slices check them)."""
        watch = self._watch
        if time.monotonic() >= watch.at:
            watch(5)  # the warning names the caller of sample_sequences()
        self.acquire(batch_size)
        heads = self._heads.tolist()
        return sum(h if h < self._cap else self._cap for h in heads)

    def undo(self, batch_size: int) -> None:
        """Take back the count of a batch whose draw raised (lock held)."""
        self.count(-batch_size)

    def wait(self, batch_size: int) -> None:
        """Return holding the lock once the limiter allows a sample of ``batch_size`` rows;
        waits (polling the heads, with sleeps that release the GIL) without the lock, so
        other learner threads go on. Raises ValueError if it never can, TimeoutError after the
        limiter's timeout, SharedBufferError when no writer is left to insert."""
        lock, lim = self._lock, self.limiter
        lock.acquire()
        # may_sample inlined: the check of a sample that does not wait (a call less)
        i = lim.inserts = sum(self._heads.tolist())
        if (i >= lim.min_size_to_sample and batch_size <= self._held_known
                and i * lim.samples_per_insert - lim.samples - batch_size >= lim.min_diff):
            return
        if self.may_sample(batch_size):
            return
        lock.release()
        lim.check_sample(batch_size)
        t0 = time.monotonic()
        deadline = None if lim.timeout is None else t0 + lim.timeout
        check_at = t0 + WATCH_S
        pause = 20e-6
        timed_out = False
        try:
            while True:
                time.sleep(pause)  # releases the GIL
                pause = min(2 * pause, 1e-3)
                lock.acquire()
                if self.may_sample(batch_size):
                    return
                lock.release()
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    timed_out = True
                    raise TimeoutError(lim.timeout_message("sample", batch_size, now - t0))
                if now >= check_at:
                    check_at = now + WATCH_S
                    states = [self._region.writer_state(s) for s in range(self._region.shards)]
                    if all(st in ("finished", "dead") for st in states):
                        raise SharedBufferError(
                            f"shared buffer {self.name!r}: a sample of {batch_size} rows waits for "
                            f"inserts (rate limiter: inserts={lim.inserts}, samples={lim.samples}, "
                            f"samples_per_insert={lim.samples_per_insert}) but every writer is gone "
                            f"(shards {states}); nothing was sampled. A new SharedWriter may attach "
                            f"and continue a shard")
        finally:
            lim.record_wait("sample", time.monotonic() - t0, timed_out)

    def count(self, batch_size: int) -> None:
        """Count a sample of ``batch_size`` rows and publish the count to the writers (lock held)."""
        lim = self.limiter
        lim.samples += batch_size
        self._ctrl_words[SAMPLES] = lim.samples  # a memoryview: half the cost of numpy's setitem
