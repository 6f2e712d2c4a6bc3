"""Columns of a replay region: a field's views over the rows each shard holds, and statistics
of a field by compiled passes that leave out the rows writers overwrote meanwhile."""

from __future__ import annotations

import numpy as np

from ..errors import SharedBufferError, SpecError
from ..replay import columns  # its names looked up at the call (tests patch scan_ranges)

__all__ = ["ShardColumns"]


class ShardColumns:
    """What :meth:`tfdata.SharedReplayBuffer.column` and
    :meth:`~tfdata.SharedReplayBuffer.column_stats` do, over the shards' rows as the writers
    leave them (``name``: the buffer's, for messages)."""

    def __init__(self, region, name: str):
        self._region = region
        self.name = name

    def field(self, name, what: str):
        """The stored field ``name`` (``what``: the caller, for messages); refuses a FIFO region,
        an unknown field and one rebuilt from frames (SpecError naming it)."""
        if self._region.mode == "fifo":
            raise SharedBufferError(f"shared buffer {self.name!r} is a FIFO queue: its rows are "
                                    f"in flight, not columns to read")
        if not isinstance(name, str) or name not in self._region.spec:
            raise SpecError(f"{what}: {self._region.spec.unknown_message(name)}")
        stored = self._region.stored_spec
        if name not in stored:
            src = self._region.frames.frames["next"]
            raise SpecError(f"{what}: field {name!r} is not stored: with frame_stack it is rebuilt "
                            f"from the frames of {[k for k, v in src.items() if v == name][0]!r}")
        return stored[name]

    def slot_ranges(self, los: list, heads: list) -> np.ndarray:
        """int64[m, 2]: the slots of rows ``[los[s], heads[s])`` of every shard, in slot order,
        adjacent ranges joined (a shard whose ring is all live is one range)."""
        cap = self._region.cap
        out = []
        for s, (lo, h) in enumerate(zip(los, heads)):
            if h <= lo:
                continue
            a = lo % cap
            b = a + (h - lo)
            base = s * cap
            parts = [(a, b)] if b <= cap else [(0, b - cap), (a, cap)]
            for x, y in parts:
                if out and out[-1][1] == base + x:
                    out[-1][1] = base + y
                else:
                    out.append([base + x, base + y])
        return np.array(out, np.int64).reshape(-1, 2)

    def column(self, name: str):
        """As :meth:`tfdata.SharedReplayBuffer.column`."""
        f = self.field(name, "column")
        r = self._region
        heads = [int(h) for h in r.heads]
        view = r.storage.field(name)
        ranges = []
        for s, h in enumerate(heads):
            held = min(h, r.cap)
            if held == 0:
                continue
            a = (h - held) % r.cap
            base = s * r.cap
            if a + held <= r.cap:
                ranges.append((base + a, base + a + held))
            else:
                ranges += [(base + a, base + r.cap), (base, base + a + held - r.cap)]
        return columns.Column(name, tuple(view[a:b] for a, b in ranges), f)

    def column_stats(self, name: str):
        """As :meth:`tfdata.SharedReplayBuffer.column_stats`."""
        f = self.field(name, "column_stats")
        if f.dtype.kind not in "biuf":
            raise SpecError(f"column_stats: field {name!r} has dtype {f.dtype}; statistics are "
                            f"computed for bool, integer and float fields only")
        r = self._region
        view = r.storage.column(name)
        skip = [0] * r.shards
        for _ in range(16):
            heads = [int(h) for h in r.heads]  # published: read before the rows (x86 keeps the order)
            begun = [int(b) for b in r.reserved]
            # row i's slot is reused by row i + cap: being overwritten once reserved > i + cap
            los = [min(h, max(h - min(h, r.cap), b - r.cap + sk))
                   for h, b, sk in zip(heads, begun, skip)]
            got = columns.scan_ranges(f, view, self.slot_ranges(los, heads))
            now = [int(b) for b in r.reserved]  # read after the pass it judges
            if all(b - r.cap <= lo for lo, b in zip(los, now)) and (got.count or not any(heads)):
                return got  # (no row counted of rows held: writers lapped them all; try again)
            # the next pass leaves out twice as many of the oldest rows as were begun during this one
            skip = [2 * (b - b0) for b, b0 in zip(now, begun)]
        raise SharedBufferError(f"column_stats({name!r}): writers overwrote the rows of shared "
                                f"buffer {self.name!r} faster than 16 passes could read them")
