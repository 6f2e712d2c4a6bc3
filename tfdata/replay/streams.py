"""Streams: where a stream's rows are and which of them are valid.

A buffer's rows form streams, one environment's (or one writer's) steps in order. The n-step
windows (:class:`~tfdata.replay.transforms.NStep`) and the sequence slices
(:mod:`tfdata.replay.slices`) follow a stream from a drawn row; they ask the buffer's streams
part, never the buffer, where the next row is and which row is the newest, through its kernels
(:mod:`tfdata.kernels._streams`, one algorithm specialized per kind). Two kinds:

:class:`RingStreams`
    ``num_envs`` streams interleaved in one ring (a :class:`~tfdata.ReplayBuffer`); their
    geometry at sample time is the writer's cursor.
:class:`tfdata.shared.streams.ShardStreams`
    One stream per shard of a shared region (a :class:`~tfdata.SharedReplayBuffer`), each
    shard written by its own process; their geometry is a snapshot of the shards' heads read
    before a draw, and a row a writer may have touched while it was read is drawn again.

The streams part is also the draw of the sample path (:mod:`tfdata.replay.sampling`): it alone
knows which rows may be drawn. The contract (what the sample path, the transforms, the
samplers' ``sample_slices`` and the slice path use):

``kind``, ``kernels``
    ``"ring"`` or ``"shards"``; the kernels of that kind (``kernels.nstep``, ``.slices``,
    ``.slices_prioritized``, all with the same signature for both kinds).
``steps``
    The most rows one stream keeps (a slice longer than that can never exist).
``at(where)``
    The geometry, int64 array, that the kernels read: from the writer's cursor (ring), or the
    snapshot the buffer took before the draw (shards: ``where`` is ignored).
``episode``, ``flags``
    What the slice kernels read to end an episode: the ring, its episode numbers (uint32
    ``(capacity,)``) and empty flags; shards, no episode numbers (empty) and the ``(terminated,
    truncated)`` fields (bool ``(slots,)``, any stride). What a kind does not read is an empty
    array of a fixed type, so its kernels compile once whatever the layout.
``ring_arrays(batch_size, length, out)``, ``ring_nbytes(batch_size)``, ``batch_view``
    What it keeps per batch of an output ring (shards: one torn mark per row or slice).
``check_slices(sampler, n, reject, max_draws, out, arrays, marks)``
    After the slices in ``out`` were drawn and gathered: draw again, and gather, every slice
    a writer may have been writing while it was read (ring: nothing to do).
``draw(n, out, arrays, transforms)``
    Under the buffer's lock, fill an output ring's slot ``out`` (``arrays``: the sampler's,
    then each transform's) from the ``n`` rows the gate let through: the sampler's draw, then
    the ring's ``transforms``, each on the rows the one before returns; returns the write
    position a batch's rows are checked by (``update_field``), or None.
``draw_call(out, arrays)``
    :meth:`draw` into ``out`` with no transforms, bound once: a callable of ``n`` for a caller
    that fills the same output every time (a buffer's rows inside a mixed batch).
``slices(n, out, arrays, length, reject)``, ``refuse_slices()``
    The same for slices of ``length`` rows (returns where the transforms of slices read the
    streams); what this kind of buffer cannot slice, refused with the reason.
"""

from __future__ import annotations

import numpy as np

from .slices import draw_slices

__all__ = ["RingStreams", "Streams"]


class Streams:
    """The base of a streams part (the contract above): it shows nothing in a batch and
    transforms no slices."""

    #: not a transform of slices (no ``apply``)
    on_slices = False

    def batch_view(self, arrays: dict, fields: dict, attrs: dict) -> None:
        pass

    def project(self, names) -> "Streams":
        """Itself: its arrays are the draw's, whatever fields a batch holds."""
        return self

    def draw_call(self, out, arrays: dict):
        """:meth:`draw` into ``out`` with no transforms, as a callable of ``n`` (lock held)."""
        draw, arrays = self.draw, (arrays,)

        def call(n):
            draw(n, out, arrays, ())

        return call


class RingStreams(Streams):
    """``num_envs`` streams interleaved in a ring of ``capacity`` slots (environment ``e``'s step
    ``t`` in slot ``(t * num_envs + e) % capacity``).

    Parameters
    ----------
    num_envs, capacity : int
        ``capacity`` a multiple of ``num_envs``.
    episodes : Episodes, optional
        The episode bookkeeping (:mod:`tfdata.replay.episodes`), whose episode numbers end a
        slice; None: the buffer keeps none (no slices).
    sampler, writer
        The buffer's (what :meth:`draw` and :meth:`slices` call).
    """

    kind = "ring"

    def __init__(self, num_envs: int, capacity: int, episodes=None, sampler=None, writer=None):
        from .. import kernels  # numba is imported when the first buffer is built

        self.sampler, self.writer = sampler, writer
        self.kernels = kernels.RING
        self.num_envs, self.capacity, self.steps = num_envs, capacity, capacity // num_envs
        self.episodes = episodes
        self.flags = (np.zeros(0, bool), np.zeros(0, bool))  # not read: episode numbers say it
        # read under the buffer's lock only: one array serves every thread's samples
        self.geo = np.array([0, num_envs, capacity], np.int64)

    @property
    def has_episodes(self) -> bool:
        """Whether slices can end at episodes' ends (the buffer keeps episode numbers)."""
        return self.episodes is not None

    def at(self, where: int) -> np.ndarray:
        """``int64[3]`` ``[cursor, num_envs, capacity]`` for the writer's cursor ``where``."""
        geo = self.geo
        geo[0] = where
        return geo

    @property
    def episode(self) -> np.ndarray:
        """uint32 ``(capacity,)``: each slot's episode number in its stream (stamped up to the
        writer's cursor)."""
        return self.episodes.episode

    def ring_arrays(self, batch_size: int, length, out) -> dict:
        return {}

    def ring_nbytes(self, batch_size: int) -> int:
        return 0

    def check_slices(self, sampler, n, reject, max_draws, out, arrays, marks) -> None:
        """Nothing: no other process writes the ring."""

    def refuse_slices(self) -> None:
        """Nothing: every sampler that keeps stream order draws slices here."""

    def draw(self, n: int, out, arrays: list, transforms: tuple) -> int:
        """The sampler's draw from the ``n`` rows held, then the ``transforms``; returns the
        write position (lock held)."""
        self.sampler.sample(n, out, arrays[0])
        writer = self.writer
        if transforms:
            rows, cursor = out.indices, writer.cursor
            i = 1  # (an index, not zip over a slice: no list, no iterator per sample)
            for t in transforms:
                rows = t.apply(out, arrays[i], rows, cursor)
                i += 1
        return writer.laps * writer.capacity + writer.cursor

    def draw_call(self, out, arrays: dict):
        # the sampler's draw alone: no transforms, and the write position is not wanted
        return self.sampler.draw_call(out, arrays)

    def slices(self, n: int, out, arrays: list, length: int, reject: bool) -> int:
        """The sampler's slices of ``length`` rows from the ``n`` held; returns the writer's
        cursor (where the transforms of slices read the streams)."""
        cursor = self.writer.cursor
        draw_slices(self.sampler, self, n, self.at(cursor), reject, length, out, arrays[0])
        return cursor
