"""The ring writer: where the next rows go. Knows positions only, never data."""

from __future__ import annotations


class RingWriter:
    """Round-robin cursor over ``capacity`` slots; once full, the oldest slot is overwritten next.

    Attributes
    ----------
    cursor : int
        Slot of the next write.
    size : int
        Number of valid rows (slots ``[0, size)`` before the first wrap, all slots after).
    """

    __slots__ = ("capacity", "cursor", "size")

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.cursor = 0
        self.size = 0

    def advance(self, n: int) -> None:
        self.cursor = (self.cursor + n) % self.capacity
        self.size = min(self.size + n, self.capacity)

    def spans(self, n: int) -> list[tuple[int, int, int]]:
        """Where ``n`` new rows go: ``[(dst_start, src_start, count), ...]`` (at most two spans).

        When ``n > capacity`` only the last ``capacity`` rows are written: the result is the same as
        ``n`` single pushes, whose earlier rows the later ones overwrite.
        """
        cap = self.capacity
        skip = max(0, n - cap)
        dst = (self.cursor + skip) % cap
        left = n - skip
        first = min(left, cap - dst)
        out = [(dst, skip, first)]
        if left > first:
            out.append((0, skip + first, left - first))
        return out

    def reset(self) -> None:
        self.cursor = 0
        self.size = 0

    def state_dict(self) -> dict:
        return {"cursor": self.cursor, "size": self.size}

    def load_state_dict(self, state: dict) -> None:
        cursor, size = int(state["cursor"]), int(state["size"])
        if not 0 <= size <= self.capacity:
            raise ValueError(f"writer state: size must be in [0, {self.capacity}], got {size}")
        if not 0 <= cursor < self.capacity or (size < self.capacity and cursor != size):
            raise ValueError(f"writer state: cursor {cursor} is inconsistent with size {size} "
                             f"and capacity {self.capacity}")
        self.cursor, self.size = cursor, size
