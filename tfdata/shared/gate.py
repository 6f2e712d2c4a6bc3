"""The learner's side of a rate limiter over a region (``SharedReplayBuffer(rate_limiter=...)``):
inserts are the sum of the shards' heads, samples the count the learner publishes in the
region's control words for the writers (see :mod:`tfdata.replay.limiter`)."""

from __future__ import annotations

import time

from ..errors import SharedBufferError
from ..replay.limiter import RateLimiter
from .region import SAMPLES, WATCH_S

__all__ = ["SampleGate", "check_limiter"]


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


class SampleGate:
    """When a sample may go: the ``limiter``'s predicate over the shards' heads, and the wait
    for it (polling the heads without the buffer's ``lock``; ``name``: the buffer's, for
    messages)."""

    def __init__(self, region, lock, limiter, name: str):
        self._region = region
        self._heads, self._cap = region.heads, region.cap
        self._lock = lock
        self._limiter = limiter
        self.name = name
        self._held_known = 0  # rows known to be held (a lower bound: they never decrease)
        self._ctrl_words = memoryview(region.ctrl)

    def inserts(self) -> int:
        """Rows published by every shard since the buffer was made (a limiter's inserts)."""
        return sum(self._heads.tolist())

    def may_sample(self, batch_size: int) -> bool:
        """Whether the limiter allows a sample of ``batch_size`` rows now and so many are held."""
        heads = self._heads.tolist()
        lim = self._limiter
        i = lim.inserts = sum(heads)
        if not (i >= lim.min_size_to_sample
                and i * lim.samples_per_insert - lim.samples - batch_size >= lim.min_diff):
            return False
        if batch_size <= self._held_known:  # rows held never decrease in replay mode
            return True
        cap = self._cap
        self._held_known = sum(h if h < cap else cap for h in heads)
        return self._held_known >= batch_size

    def acquire(self, batch_size: int) -> None:
        """Return holding the lock once the limiter allows a sample of ``batch_size`` rows;
        waits (polling the heads, with sleeps that release the GIL) without the lock, so
        other learner threads go on. Raises ValueError if it never can, TimeoutError after the
        limiter's timeout, SharedBufferError when no writer is left to insert."""
        lock, lim = self._lock, self._limiter
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
        lim = self._limiter
        lim.samples += batch_size
        self._ctrl_words[SAMPLES] = lim.samples  # a memoryview: half the cost of numpy's setitem
