"""The draws part of a shared buffer (the contract of :mod:`tfdata.replay.draws`): draws over
the shards of a replay region that never return a row a writer touched while it was copied.
Rows (:class:`~tfdata.shared.streams.ShardRows`), the n-step windows and frame stacks of
:meth:`tfdata.SharedReplayBuffer.sample` and the slices of
:meth:`~tfdata.SharedReplayBuffer.sample_sequences`, each as of the heads read before the draw
(the region's :class:`~tfdata.replay.streams.ShardStreams`), and drawn again until it copies
cleanly."""

from __future__ import annotations

import numpy as np

from ..errors import SharedBufferError
from ..replay.samplers import sampler_name
from ..replay.slices import draw_slices

__all__ = ["ShardDraws"]


class ShardDraws:
    """The torn-row checks and redraws of a buffer's samples: over its ``region``, its
    ``sampler``, its ``streams`` (geometry), its ``rows`` (the sampler's draw over the shards)
    and compiled ``kernels``; ``nstep``, ``frames``: whether the buffer's transforms are an
    n-step transform, then a frame stack (either may be absent); ``given``: the sampler is an
    object of the user's; ``name``: the buffer's, for messages. Called with the buffer's lock
    held."""

    def __init__(self, region, sampler, streams, rows, kernels, name: str, nstep: bool,
                 frames: bool, given: bool):
        self._region = region
        self._sampler = sampler
        self._rows = rows  # the rows' draw, check and redraw (tfdata.shared.streams.ShardRows)
        self._streams = streams  # the shards' geometry and torn-row checks
        self._k = kernels
        self.name = name
        self._nstep, self._frames, self._given = nstep, frames, given

    def draw(self, n: int, out, arrays: list, transforms: tuple) -> None:
        """Fill ``out`` (lock held; ``n`` is not read: the heads say what is held): the rows
        alone, or with the ring's ``transforms`` (:meth:`windows`)."""
        if transforms:
            t = transforms[0] if self._nstep else None
            self.windows(out, arrays, t, transforms[-1] if self._frames else None)
        else:  # caught up, drawn, checked by the shard rows
            self._rows.sample(out, arrays[0])

    def refuse_slices(self) -> None:
        """Refuse what this buffer cannot slice, saying why."""
        if self._region.mode == "fifo":
            raise SharedBufferError(f"shared buffer {self.name!r} is a FIFO queue: use get_batch()")
        if self._rows.kind == "without_replacement":
            raise NotImplementedError(
                "SharedReplayBuffer(sampler='without_replacement') draws no sequences (a slice of "
                "a shard starts at rows its writer keeps moving; see ARCHITECTURE.md): use "
                "sampler='uniform' or prioritized=True for sample_sequences")
        if self._given:
            raise NotImplementedError(f"sample_sequences of a SharedReplayBuffer with a sampler "
                                      f"object ({sampler_name(self._sampler)!r}) is not built: "
                                      f"its slices follow the shards' geometry, not the sampler's "
                                      f"sample_slices; use sampler='uniform' or prioritized=True")
        if self._frames:
            raise NotImplementedError("sample_sequences of a SharedReplayBuffer with frame_stack is "
                                      "not implemented (sample() rebuilds the stacks); use a "
                                      "ReplayBuffer(frame_stack=...) in one process for slices")

    def windows(self, out, arrays, t=None, ft=None) -> None:
        """Draw, then the n-step windows (``t``: the ring's NStep, or None) and the frame stacks
        (``ft``: the ring's FrameStack, or None) as of heads read before the draw (the streams'
        snapshot), then redraw every row whose window or stacks a writer may have touched while
        they were read (lock held).

        A writer overwrites its oldest rows first: if a window's first row was not touched
        since the snapshot, none of its later (newer) rows was. A stack reads its row, up to
        K - 1 rows back and one row forward (its next frame): the obs stack is the window's
        first row's, the next_obs stack its last row's."""
        k, r, st = self._k, self._region, self._streams
        fa = None if ft is None else arrays[-1]
        heads = st.scratch
        # the marks of the rows drawn: the n-step transform's, or the frame transform's (which
        # then also marks the windows' last rows)
        mark = fa["mark"] if t is None else arrays[1]["mark"]
        k.read_heads(r.heads, r.cap, heads)  # before the draw: nothing reads past these rows
        self._rows.sample(out, arrays[0])
        last = out.indices if t is None else t.apply(out, arrays[1], out.indices, st.geo)
        if ft is not None:
            ft.apply(out, fa, last, st.geo)
            depth, kmax = r.frames.depth, r.frames.kmax

        def torn(i, m):
            part = slice(None) if i is None else slice(i, i + 1)
            if ft is None:
                return k.torn_after_copy(r.reserved, r.cap, heads, out.indices[part], m)
            got = k.torn_stacks(r.reserved, r.cap, heads, out.indices[part], depth, kmax, m)
            if t is not None:  # the next stacks were read at the windows' last rows
                more = fa["mark"][part]
                if k.torn_stacks(r.reserved, r.cap, heads, last[part], depth, kmax, more):
                    np.bitwise_or(m, more, out=m)
                    got = int(np.count_nonzero(m))
            return got

        if torn(None, mark):
            def redo(i):
                self._rows.redraw(i, out, arrays[0])
                if t is not None:
                    t.apply_row(out, arrays[1], i, st.geo)
                if ft is not None:
                    ft.apply_row(out, fa, i, st.geo, last[i:i + 1])

            st.redraw_torn(mark, redo, torn, "windows" if ft is None else "stacks")

    def slices(self, n: int, out, arrays, length: int, reject: bool):
        """Draw ``out``'s slices of ``length`` rows (``arrays``: the sampler's and the
        streams' arrays; ``n`` is not read: the heads say what is held) as of heads read before
        the draw, and redraw every slice a writer may have been overwriting while it was copied
        (lock held). ``reject``: policy="reject" (ValueError when no start gives a slice; the
        refused sample consumes no randomness). Returns the geometry the slices were drawn in."""
        st = self._streams
        batch_size = out.indices.shape[0] // length
        # before the draw: the sampler hears the rows published, and slices end at these heads
        held = self._rows.catch_up(st.scratch)
        if held < batch_size:
            raise self._rows.too_few(batch_size, held)
        draw_slices(self._sampler, st, held, st.geo, reject, length, out, arrays[0],
                    arrays[1]["mark"])
        return st.geo
