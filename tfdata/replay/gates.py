"""The gate around a replay buffer's sample: when a batch may be drawn, and what it counts.

A buffer has one gate, picked when it is built: :class:`OpenGate` (no rate limiter: a batch
takes the rows held, and is refused when they are too few) or :class:`LimiterGate` (a
:class:`~tfdata.replay.limiter.RateLimiter`: the sample waits, the lock released, until the
limiter and the rows allow it, and is counted). The sample path calls the same methods either
way, and so do the gates of a shared buffer (:mod:`tfdata.shared.gate`): ``admit`` before a new
output ring is allocated, ``acquire`` to take the buffer's lock for the draw (returning the
rows the draw may take; a limiter counts the batch there), and ``undo`` if the draw raised.
"""

from __future__ import annotations

from . import combinations


class OpenGate:
    """No rate limiter: a batch draws from the rows held, now.

    Parameters
    ----------
    writer
        The buffer's writer (``size``: rows held).
    sampler
        The buffer's sampler: its ``rule`` (for messages) and ``waits_for_rows`` (a sampler
        that waits for rows itself, up to its timeout, is refused only a batch larger than the
        capacity).
    lock
        The buffer's lock.
    """

    __slots__ = ("writer", "sampler", "capacity", "lock")
    limited = False

    def __init__(self, writer, sampler, lock):
        self.writer, self.sampler, self.capacity, self.lock = writer, sampler, writer.capacity, lock

    def _short(self, batch_size: int) -> bool:
        return not self.sampler.waits_for_rows or batch_size > self.capacity

    def too_few_rows(self, batch_size: int, n: int) -> str:
        """Why ``sample(batch_size)`` is refused with ``n`` rows held; the sampler says how it
        takes rows (its ``rule``), the buffer does not guess it from the sampler's type."""
        rule = self.sampler.rule
        if self.sampler.waits_for_rows:  # refused only beyond the capacity (see _short)
            return (f"batch_size {batch_size} is larger than the capacity {self.capacity}: no "
                    f"wait for writers can give a batch that many rows ({rule})")
        if n == 0:
            return f"cannot sample from an empty buffer ({rule})"
        return (f"batch_size {batch_size} is larger than the {n} rows held; {rule}, and a batch "
                f"needs batch_size <= len(buffer)")

    def admit(self, batch_size: int) -> None:
        """Refuse (ValueError) a batch the rows held cannot give, before its ring exists."""
        n = self.writer.size
        if batch_size > n and self._short(batch_size):
            raise ValueError(self.too_few_rows(batch_size, n))

    def admit_slices(self, batch_size: int) -> None:
        """Nothing more to refuse of slices (their sizes are checked against :meth:`rows`)."""

    def rows(self) -> int:
        """Rows a batch can count on without waiting: the rows held."""
        return self.writer.size

    def acquire(self, batch_size: int) -> int:
        """Take the lock; the rows held. ValueError (the lock released) when a batch cannot be
        drawn from them."""
        self.lock.acquire()
        n = self.writer.size
        if batch_size > n and self._short(batch_size):
            self.lock.release()
            raise ValueError(self.too_few_rows(batch_size, n))
        return n

    def acquire_slices(self, batch_size: int) -> int:
        """Take the lock; the rows held (the slices check them)."""
        self.lock.acquire()
        return self.writer.size

    def undo(self, batch_size: int) -> None:
        """Nothing was counted."""


class Limited:
    """What every gate with a rate limiter refuses before a ring is built, one process or
    shared: a batch no rows can ever give, or one the limiter with this sampler could wait for
    for ever. Uses ``limiter``, ``sampler`` and ``capacity``."""

    __slots__ = ()
    limited = True

    def admit_slices(self, batch_size: int) -> None:
        """Refuse a limited sample of ``batch_size`` rows that could wait for ever (before its
        ring is built): the limiter's own bound, then the sampler's with the limiter (the table
        of :mod:`tfdata.replay.combinations`)."""
        self.limiter.check_sample(batch_size)
        why = combinations.sample_refusal(self.sampler.facets(), self.limiter.params(),
                                          self.capacity, batch_size)
        if why is not None:
            raise ValueError(why)

    def admit(self, batch_size: int) -> None:
        if batch_size > self.capacity:  # rows may still come: refused only if they never can
            raise ValueError(f"batch_size {batch_size} is larger than the capacity "
                             f"{self.capacity}: no wait for rows can give a batch that many "
                             f"({self.sampler.rule})")
        self.admit_slices(batch_size)

    def rows(self) -> int:
        """Rows a batch can count on after waiting: the capacity."""
        return self.capacity


class LimiterGate(Limited):
    """A rate limiter around the sample: ``wait`` blocks (the lock released) until the limiter
    lets a batch through and ``held.size`` rows can be drawn, and counts the batch (under the
    lock, so no other side sees the count before the draw); ``undo`` takes the count back when
    the draw raised.

    Parameters
    ----------
    limiter : RateLimiter
        Bound to the buffer's ``lock``.
    writer
        The buffer's writer.
    held
        ``.size``: the rows a batch can draw (the writer, or what a sampler that holds rows
        back lets a batch draw).
    sampler
        The buffer's sampler (its facets, for the table of combinations).
    num_envs : int
        The fewest rows an insert writes.
    lock
        The buffer's lock.
    """

    __slots__ = ("limiter", "writer", "held", "sampler", "num_envs", "capacity", "lock")

    def __init__(self, limiter, writer, held, sampler, num_envs: int, lock):
        self.limiter, self.writer, self.held, self.sampler = limiter, writer, held, sampler
        self.num_envs, self.capacity, self.lock = num_envs, writer.capacity, lock

    def acquire(self, batch_size: int) -> int:
        """Take the lock, wait (released meanwhile) until the limiter lets the batch through,
        count it; the rows held."""
        lim, lock = self.limiter, self.lock
        lock.acquire()
        try:
            lim.sample_wait(batch_size, self.held, self.num_envs)
        except BaseException:
            lock.release()
            raise
        lim.sampled(batch_size)
        return self.writer.size

    acquire_slices = acquire

    def undo(self, batch_size: int) -> None:
        self.limiter.sampled(-batch_size)  # (and wakes the waiting sides to re-check)
