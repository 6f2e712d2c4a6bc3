"""Draws over the shards of a replay region that never return a row a writer touched while it
was copied: the n-step windows and frame stacks of :meth:`tfdata.SharedReplayBuffer.sample`
and the slices of :meth:`~tfdata.SharedReplayBuffer.sample_sequences`, each as of the heads
read before the draw (the region's :class:`~tfdata.replay.streams.ShardStreams`), and drawn
again until it copies cleanly."""

from __future__ import annotations

import numpy as np

from ..replay.slices import draw_slices

__all__ = ["ShardDraws"]


class ShardDraws:
    """The torn-row checks and redraws of a buffer's samples: over its ``region``, its
    ``sampler``, its n-step transform ``nstep`` (or None), its ``streams`` (geometry), its
    ``rows`` (the sampler's draw over the shards) and compiled ``kernels``; ``name``: the
    buffer's, for messages. Called with the buffer's lock held."""

    def __init__(self, region, sampler, nstep, streams, rows, kernels, name: str):
        self._region = region
        self._sampler = sampler
        self._rows = rows  # the rows' draw, check and redraw (tfdata.shared.streams.ShardRows)
        self._nstep = nstep
        self._streams = streams  # the shards' geometry and torn-row checks
        self._k = kernels
        self.name = name

    def windows(self, out, arrays, ft=None) -> None:
        """Draw, then the n-step windows and the frame stacks (``ft``: the ring's FrameStack, or
        None) as of heads read before the draw (the streams' snapshot), then redraw every row
        whose window or stacks a writer may have touched while they were read (lock held).

        A writer overwrites its oldest rows first: if a window's first row was not touched
        since the snapshot, none of its later (newer) rows was. A stack reads its row, up to
        K - 1 rows back and one row forward (its next frame): the obs stack is the window's
        first row's, the next_obs stack its last row's."""
        k, t, r, st = self._k, self._nstep, self._region, self._streams
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

    def slices(self, out, arrays, batch_size: int, length: int, reject: bool) -> None:
        """Draw ``batch_size`` slices of ``length`` rows into ``out`` (the ring's slot,
        ``arrays`` its sampler's and streams' arrays) as of heads read before the draw, and
        redraw every slice a writer may have been overwriting while it was copied (lock held).
        ``reject``: policy="reject" of :meth:`tfdata.SharedReplayBuffer.sample_sequences`
        (ValueError when no start gives a slice; the refused sample consumes no randomness)."""
        st = self._streams
        # before the draw: the sampler hears the rows published, and slices end at these heads
        held = self._rows.catch_up(st.scratch)
        if held < batch_size:
            raise self._rows.too_few(batch_size, held)
        draw_slices(self._sampler, st, held, st.geo, reject, length, out, arrays[0],
                    arrays[1]["mark"])
