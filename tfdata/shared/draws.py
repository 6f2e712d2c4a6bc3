"""Draws over the shards of a replay region that never return a row a writer touched while it
was copied: the n-step windows and frame stacks of :meth:`tfdata.SharedReplayBuffer.sample`
and the slices of :meth:`~tfdata.SharedReplayBuffer.sample_sequences`, each as of the heads
read before the draw, and drawn again until it copies cleanly."""

from __future__ import annotations

from ..errors import SharedBufferError
from ..replay.core import MAX_DRAWS as _MAX_DRAWS
from .streams import MAX_REDRAWS as _MAX_REDRAWS

__all__ = ["ShardDraws"]


class ShardDraws:
    """The torn-row checks and redraws of a buffer's samples: over its ``region``, its
    ``sampler``, its n-step transform ``nstep`` (or None) and compiled ``kernels``; ``name``:
    the buffer's, for messages. Called with the buffer's lock held."""

    def __init__(self, region, sampler, nstep, kernels, name: str, streams):
        self._region = region
        self._sampler = sampler
        self._streams = streams  # the rows' draw, check and redraw
        self._nstep = nstep
        self._k = kernels
        self.name = name

    def windows(self, out, arrays, ft=None) -> None:
        """Draw, then the n-step windows and the frame stacks (``ft``: the ring's
        ShardFrameStack, or None) as of heads read before the draw, then redraw every row whose
        window or stacks a writer may have touched while they were read (lock held).

        A writer overwrites its oldest rows first: if a window's first row was not touched
        since the snapshot, none of its later (newer) rows was. A stack reads its row, up to
        K - 1 rows back and one row forward (its next frame): the obs stack is the window's
        first row's, the next_obs stack its last row's."""
        k, t, r = self._k, self._nstep, self._region
        fa = None if ft is None else arrays[-1]
        heads = (fa if t is None else arrays[1])["heads"]
        mark = heads[7 * r.shards:]
        k.read_heads(r.heads, r.cap, heads)  # before the draw: nothing reads past these rows
        self._streams.sample(out, arrays[0])
        last = out.indices if t is None else t.apply(out, arrays[1], out.indices, heads)
        if ft is not None:
            ft.apply(out, fa, last, heads)

        def torn(heads, i, m):
            part = slice(None) if i is None else slice(i, i + 1)
            if ft is None:
                return k.torn_after_copy(r.reserved, r.cap, heads, out.indices[part], m)
            return ft.torn(r.reserved, heads, out.indices[part], m,
                           None if t is None else last[part], fa["mark2"][part])

        if torn(heads, None, mark):
            def redo(i):
                self._streams.redraw(i, out, arrays[0])
                if t is not None:
                    t.apply_row(out, arrays[1], i, heads)
                if ft is not None:
                    ft.apply_row(out, fa, i, heads, last[i:i + 1])

            self.redraw_torn(mark, heads, redo, torn, "windows" if ft is None else "stacks")

    def redraw_torn(self, mark, heads, redo, torn, what: str) -> None:
        """For every ``i`` marked (its rows may have been written while read): read the heads
        afresh into ``heads``, ``redo(i)`` (draw and copy again), check again
        (``torn(heads, i, mark[i:i + 1])``), until it copies cleanly (lock held)."""
        k, r = self._k, self._region
        for i in range(mark.shape[0]):
            tries = 0
            while mark[i]:
                if tries == _MAX_REDRAWS:
                    raise SharedBufferError(f"shared buffer {self.name!r}: {_MAX_REDRAWS} {what} "
                                            f"drawn were all being written")
                tries += 1
                k.read_heads(r.heads, r.cap, heads)
                redo(i)
                torn(heads, i, mark[i:i + 1])

    def slices(self, out, arrays, batch_size: int, length: int, reject: bool) -> None:
        """Draw ``batch_size`` slices of ``length`` rows into ``out`` (the ring's slot, its
        sampler ``arrays``) as of heads read before the draw, and redraw every slice a writer
        may have been overwriting while it was copied (lock held). ``reject``: policy="reject"
        of :meth:`tfdata.SharedReplayBuffer.sample_sequences` (ValueError when no start gives a
        slice; the refused sample consumes no randomness)."""
        k, r, sm = self._k, self._region, self._sampler
        scratch, mask = arrays["shard_scratch"], arrays["mask"]
        idx = out.indices.reshape(mask.shape)
        counter = int(sm.state[1])
        held = sm.heads_snapshot(scratch)  # before the draw: slices end at these heads
        if held < batch_size:
            raise sm.too_few(batch_size, held)
        failed = sm.sample_shard_slices(scratch, reject, _MAX_DRAWS, idx, mask, arrays)
        if failed != -1:
            sm.state[1] = counter  # a refused sample consumes no randomness
            raise ValueError(f"policy='reject': {_MAX_DRAWS} random starts found no slice of "
                             f"{length} steps within one episode; episodes held are shorter "
                             f"than that (use policy='mask')")
        out.source.gather(out.indices, out)
        # a slice's first row is its oldest: if no writer touched it, none touched the rest
        marks = scratch[7 * r.shards:7 * r.shards + batch_size]
        if k.torn_after_copy(r.reserved, r.cap, scratch, idx[:, 0], marks):
            def redo(b):
                sm.redraws += 1
                one = slice(b, b + 1)
                if sm.sample_shard_slices(scratch, reject, _MAX_DRAWS, idx[one], mask[one],
                                          arrays, one) != -1:
                    raise ValueError(f"policy='reject': no slice of {length} steps found")
                out.source.gather_at(idx[b], out, b * length)

            def torn(heads, b, m):
                return k.torn_after_copy(r.reserved, r.cap, heads, idx[b:b + 1, 0], m)

            self.redraw_torn(marks, scratch, redo, torn, "slices")
