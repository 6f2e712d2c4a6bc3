"""The draw of a one-process buffer: the sampler, then the transforms, over the ring of streams.

Every buffer's sample path (:mod:`tfdata.replay.sampling`) calls its draws part the same way,
under the buffer's lock: ``draw(n, out, arrays, transforms)`` fills an output ring's slot from
the ``n`` rows the gate let through, and ``slices(...)`` fills a slot of slices. This part is
the ring of streams' (one process: nothing else writes while the lock is held); a shared
buffer's is :class:`tfdata.shared.draws.ShardDraws` (rows a writer touched during the copy are
drawn again).
"""

from __future__ import annotations

from .slices import draw_slices

__all__ = ["RingDraws"]


class RingDraws:
    """The draws of a :class:`~tfdata.replay.core.ReplayCore`: its ``sampler``, ``writer`` and
    ``streams`` (:class:`~tfdata.replay.streams.RingStreams`)."""

    __slots__ = ("sampler", "writer", "streams")

    def __init__(self, sampler, writer, streams):
        self.sampler, self.writer, self.streams = sampler, writer, streams

    def refuse_slices(self) -> None:
        """Nothing: every sampler that keeps stream order draws slices here."""

    def draw(self, n: int, out, arrays: list, transforms: tuple) -> int:
        """Draw ``out``'s rows from the ``n`` held, then apply ``transforms`` (each on the rows
        the one before it returns); returns the write position (what ``update_field`` checks a
        batch's rows by)."""
        self.sampler.sample(n, out, arrays[0])
        writer = self.writer
        if transforms:
            rows, cursor = out.indices, writer.cursor
            for t, a in zip(transforms, arrays[1:]):
                rows = t.apply(out, a, rows, cursor)
        return writer.laps * writer.capacity + writer.cursor

    def slices(self, n: int, out, arrays: list, length: int, reject: bool) -> int:
        """Draw ``out``'s slices of ``length`` rows from the ``n`` held; returns the writer's
        cursor (where the transforms of slices read the streams)."""
        cursor = self.writer.cursor
        draw_slices(self.sampler, self.streams, n, self.streams.at(cursor), reject, length, out,
                    arrays[0])
        return cursor
