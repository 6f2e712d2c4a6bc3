"""Streams: where a stream's rows are and which of them are valid.

A buffer's rows form streams, one environment's (or one writer's) steps in order. The n-step
windows (:class:`~tfdata.replay.transforms.NStep`) and the sequence slices
(:mod:`tfdata.replay.slices`) follow a stream from a drawn row; they ask the buffer's streams
part, never the buffer, where the next row is and which row is the newest, through its kernels
(:mod:`tfdata.kernels._streams`, one algorithm specialized per kind). Two kinds:

:class:`RingStreams`
    ``num_envs`` streams interleaved in one ring (a :class:`~tfdata.ReplayBuffer`); their
    geometry at sample time is the writer's cursor.
:class:`ShardStreams`
    One stream per shard of a shared region (a :class:`~tfdata.SharedReplayBuffer`), each
    shard written by its own process; their geometry is a snapshot of the shards' heads read
    before a draw, and a row a writer may have touched while it was read is drawn again.

The contract (what the transforms, the samplers' ``sample_slices`` and the slice path use):

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
"""

from __future__ import annotations

import numpy as np

from ..errors import SharedBufferError

__all__ = ["RingStreams", "ShardStreams"]

# rows drawn again in one sample, at most, before concluding the writers never stop
MAX_REDRAWS = 1 << 20


class _Part:
    """What a streams part shows in a batch: nothing."""

    #: not a transform of slices (no ``apply``)
    on_slices = False

    def batch_view(self, arrays: dict, fields: dict, attrs: dict) -> None:
        pass


class RingStreams(_Part):
    """``num_envs`` streams interleaved in a ring of ``capacity`` slots (environment ``e``'s step
    ``t`` in slot ``(t * num_envs + e) % capacity``).

    Parameters
    ----------
    num_envs, capacity : int
        ``capacity`` a multiple of ``num_envs``.
    episodes : Episodes, optional
        The episode bookkeeping (:mod:`tfdata.replay.episodes`), whose episode numbers end a
        slice; None: the buffer keeps none (no slices).
    """

    kind = "ring"

    def __init__(self, num_envs: int, capacity: int, episodes=None):
        from .. import kernels  # numba is imported when the first buffer is built

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


class ShardStreams(_Part):
    """One stream per shard of a shared region: shard ``s`` holds slots ``[s * cap, (s + 1) *
    cap)``, row ``r`` of its writer in slot ``s * cap + r % cap``.

    The geometry (``geo``, int64 ``(2 + 7 * shards,)``: ``[shards, cap]``, then the heads
    snapshot of :func:`tfdata.kernels.read_heads` and the write windows of the torn-row
    check) is this part's, read and used under the buffer's lock: :meth:`snapshot` before a
    draw, the kernels during it, :meth:`torn` after the copy.

    Parameters
    ----------
    heads, reserved : ndarray of uint64, shape (shards,)
        Strided views of the shards' published and begun counters.
    cap : int
        Slots per shard.
    flags : tuple of ndarray of bool, or None
        The region's ``terminated`` and ``truncated`` fields, shape (shards * cap,).
    allocator
        Allocates the geometry and the per-batch marks.
    name : str
        The buffer's, for messages.

    Attributes
    ----------
    redraws : int
        Slices drawn again (:meth:`check_slices`).
    """

    kind = "shards"

    def __init__(self, heads: np.ndarray, reserved: np.ndarray, cap: int, flags, allocator,
                 name: str):
        from .. import kernels
        from ..kernels._streams import SHARD_HEADER

        self._k, self.kernels = kernels, kernels.SHARDS
        self.heads, self.reserved, self.cap, self.steps = heads, reserved, cap, cap
        self.shards = heads.shape[0]
        self.flags, self.name, self.allocator = flags, name, allocator
        self.episode = np.zeros(0, np.uint32)  # the shards' episodes end at flagged rows
        self.geo = allocator.zeros(SHARD_HEADER + 7 * self.shards, np.int64)
        self.geo[:SHARD_HEADER] = (self.shards, cap)
        #: the heads snapshot and write windows (the layout of :mod:`tfdata.kernels._shared`)
        self.scratch = self.geo[SHARD_HEADER:]
        #: slices drawn again because a writer may have been writing them while they were read
        self.redraws = 0

    @property
    def nbytes(self) -> int:
        return int(self.geo.nbytes)

    @property
    def has_episodes(self) -> bool:
        """Whether slices can end at episodes' ends (the region has the flags fields)."""
        return self.flags is not None

    def at(self, where=None) -> np.ndarray:
        """The geometry as of the last :meth:`snapshot` (``where`` is not read)."""
        return self.geo

    def snapshot(self) -> int:
        """Read every head once (acquire) into the geometry; returns rows held."""
        return self._k.read_heads(self.heads, self.cap, self.scratch)

    def torn(self, rows: np.ndarray, mark: np.ndarray) -> int:
        """After the rows of ``rows`` (int64 ``(m,)``; each a window's or slice's oldest row)
        were copied: ``mark[i] = 1`` where a writer may have been writing since the snapshot
        (a writer overwrites its oldest rows first: if the first row of a window was not
        touched, none of its newer rows was); returns how many."""
        return self._k.torn_after_copy(self.reserved, self.cap, self.scratch, rows, mark)

    def redraw_torn(self, mark: np.ndarray, redo, torn, what: str) -> None:
        """For every ``i`` marked (its rows may have been written while read): read the heads
        afresh, ``redo(i)`` (draw and copy again), check again (``torn(i, mark[i:i + 1])``),
        until it copies cleanly (lock held)."""
        scratch = self.scratch
        for i in range(mark.shape[0]):
            tries = 0
            while mark[i]:
                if tries == MAX_REDRAWS:
                    raise SharedBufferError(f"shared buffer {self.name!r}: {MAX_REDRAWS} {what} "
                                            f"drawn were all being written")
                tries += 1
                self._k.read_heads(self.heads, self.cap, scratch)
                redo(i)
                torn(i, mark[i:i + 1])

    def ring_arrays(self, batch_size: int, length, out) -> dict:
        return {"mark": self.allocator.zeros(batch_size, np.int64)}

    def ring_nbytes(self, batch_size: int) -> int:
        return 8 * batch_size

    def check_slices(self, sampler, n, reject, max_draws, out, arrays, marks) -> None:
        """Draw again every slice of ``out`` whose first row (its oldest: if no writer touched
        it, none touched the rest) a writer may have been overwriting while it was copied."""
        mask = arrays["mask"]
        idx = out.indices.reshape(mask.shape)
        length = idx.shape[1]
        if not self.torn(idx[:, 0], marks):
            return

        def redo(b):
            self.redraws += 1
            if sampler.sample_slices(n, self, self.geo, reject, max_draws, out, arrays,
                                     slice(b, b + 1)) != -1:
                raise ValueError(f"policy='reject': no slice of {length} steps found")
            out.source.gather_at(idx[b], out, b * length)

        def torn(b, m):
            return self.torn(idx[b:b + 1, 0], m)

        self.redraw_torn(marks, redo, torn, "slices")
