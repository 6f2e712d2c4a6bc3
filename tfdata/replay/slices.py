"""Slices of consecutive rows: ``sample_sequences`` of a replay buffer.

:func:`draw_slices` is the draw of every buffer's slices, over its streams
(:mod:`tfdata.replay.streams`): the sampler draws the starts (``sample_slices``: a slice stays
within one stream and one episode), the rows are gathered, and the streams draw again what a
writer touched meanwhile (shards). :class:`Slices` is every buffer's ``sample_sequences``
around it: the checks, the gate, this thread's output ring of the batch's shape, the streams part
(one process or shards) and the transforms that act on slices.
"""

from __future__ import annotations

from .._checks import check_int
from ..batch import UNHELD, getrefcount, retire
from ..errors import SpecError
from .samplers import sampler_name

# policy="reject": draws per slice before concluding no slice exists
MAX_DRAWS = 10_000


def draw_slices(sampler, streams, n: int, geo, reject: bool, length: int, out, arrays: dict,
                marks=None) -> None:
    """Draw ``out``'s slices of ``length`` rows (lock held): starts by ``sampler`` over the
    ``n`` rows held, the streams' geometry ``geo``; gather them; then the streams' check of
    rows a writer touched (``marks``: their per-slice scratch, shards only).

    Raises ValueError for ``reject`` when ``MAX_DRAWS`` random starts found no slice; the
    refused sample consumes no randomness.
    """
    state = sampler.state
    counter = int(state[1])
    failed = sampler.sample_slices(n, streams, geo, reject, MAX_DRAWS, out, arrays)
    if failed != -1:
        state[1] = counter  # a refused sample consumes no randomness
        raise ValueError(f"policy='reject': {MAX_DRAWS} random starts found no slice of "
                         f"{length} steps within one episode; episodes held are shorter "
                         f"than that (use policy='mask')")
    out.source.gather(out.indices, out)
    if marks is not None:  # streams other processes write
        streams.check_slices(sampler, n, reject, MAX_DRAWS, out, arrays, marks)


class Slices:
    """The sequence sampling of one buffer (``sample_sequences``), one process or shared.

    Parameters
    ----------
    sampler, streams, lock
        The buffer's parts (``streams``: the draw of the slices, and what a buffer refuses of
        them; ``streams.has_episodes`` False: no slices).
    gate
        When a batch may be drawn, and what it counts (:mod:`tfdata.replay.gates`).
    rings : Rings
        This thread's output rings.
    capacity, num_envs : int
    """

    def __init__(self, sampler, streams, lock, gate, rings, capacity: int, num_envs: int):
        self.sampler, self.streams, self.lock = sampler, streams, lock
        self.gate, self.rings, self.capacity, self.num_envs = gate, rings, capacity, num_envs

    def sample(self, batch_size, length, policy, copy, fields):
        """``sample_sequences(batch_size, length, policy=, copy=, fields=)``."""
        if not getattr(self.sampler, "stream_order", True):  # before the episodes' absence, which it causes
            raise NotImplementedError(
                f"sample_sequences: sampler={sampler_name(self.sampler)!r} "
                f"writes rows off stream order and delivers rows, not slices; use sample()")
        self.streams.refuse_slices()
        if not self.streams.has_episodes:
            raise SpecError("sample_sequences needs episode boundaries: the spec must have bool "
                            "fields 'terminated' and 'truncated' (or name them with roles=)")
        if policy not in ("mask", "reject"):
            raise ValueError(f"policy must be 'mask' or 'reject', got {policy!r}")
        batch_size = check_int("batch_size", batch_size, 1)
        length = check_int("length", length, 1)
        reject = policy == "reject"
        names = None if fields is None else self.rings.fields(fields)
        gate = self.gate
        # check, then allocate: a refused call builds no ring (with a limiter rows may still
        # come: refused now only what no rows can make possible)
        self.check(batch_size, length, reject and not gate.limited, gate.rows())
        gate.admit_slices(batch_size)
        key = ("seq", batch_size, length) if names is None else ("seq", batch_size, length, names)
        try:
            ring = self.rings.local.rings[key]
        except (AttributeError, KeyError):
            ring = self.rings.new(batch_size, length, names)
        n = gate.acquire_slices(batch_size)  # returns holding the lock
        try:
            i = ring.next
            out, arrays = ring.slots[i], ring.arrays[i]
            self.check(batch_size, length, reject, n)  # a clear() may have run since
            where = self.streams.slices(n, out, arrays, length, reject)
            ring.next = (i + 1) % len(ring.slots)
            for t, a in zip(ring.transforms, arrays[1:]):
                if t.on_slices:
                    t.apply(out, a, out.indices, where)
        except BaseException:
            gate.undo(batch_size)  # nothing was drawn
            raise
        finally:
            self.lock.release()
        batch = ring.batches[i]
        if getrefcount(batch) > UNHELD:  # see sample()
            batch = ring.batches[i] = retire(batch)
        return batch.copy() if copy else batch

    def check(self, batch_size: int, length: int, reject: bool, n: int) -> None:
        """Refuse slice sizes the rows ``n`` held cannot back (before anything is allocated)."""
        if n == 0:
            raise ValueError("cannot sample from an empty buffer")
        if batch_size > n:
            raise ValueError(f"batch_size {batch_size} is larger than the {n} rows held; slices "
                             f"start at rows the sampler draws ({self.sampler.rule}), and a "
                             f"batch needs batch_size <= len(buffer)")
        steps = self.streams.steps
        if length > steps:
            raise ValueError(f"length {length} is longer than any slice can be: the buffer keeps "
                             f"at most {steps} steps per stream (capacity {self.capacity}, "
                             f"num_envs {self.num_envs})")
        steps = n // self.num_envs
        if reject and length > steps:
            raise ValueError(f"no slice of length {length} exists: the buffer holds {steps} "
                             f"steps per stream")
