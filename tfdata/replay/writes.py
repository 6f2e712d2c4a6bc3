"""A replay buffer's checked writes: the path every row takes that the generated push and
extend do not (a first call, an unusual value, priorities given, a rate limiter that refuses).

:class:`Writes` validates in full (precise errors naming the field), then writes under the
buffer's lock, after the rate limiter (if any) lets the rows in, counted with the write. It
holds no reference to the buffer, so the generated functions may keep its bound methods.
"""

from __future__ import annotations


class Writes:
    """The checked write path of one buffer.

    Parameters
    ----------
    spec : Spec
    parts : Parts
        The buffer's parts: ``writer``, ``lock`` and ``limiter`` (None: no rate limiter; read
        at each write, since the buffer binds it after building the parts).
    """

    __slots__ = ("spec", "parts", "flags")

    def __init__(self, spec, parts):
        self.spec, self.parts = spec, parts
        self.flags = [i for i, f in enumerate(spec) if f.dtype.kind == "b"]

    def push(self, row, extra=None) -> None:
        """Check ``row`` (a mapping of field to value) in full, then write it."""
        self.row(self.spec.check_row(row), extra)

    def row(self, values: list, extra) -> None:
        """Write one checked row; ``extra``: what the sampler's write hook takes (priorities)."""
        p = self.parts
        lim = p.limiter
        with p.lock:
            if lim is not None:
                lim.insert_wait(1)
            p.writer.push_values(values, extra)
            if lim is not None:
                lim.inserted(1)

    def extend(self, batch) -> None:
        """Check ``batch`` (one array per field, ``n`` rows) in full, then write it."""
        n, values = self.spec.check_batch(batch)
        if n:
            self.rows(values, n, None)

    def values(self, values: list, n: int) -> None:
        """Write ``n >= 1`` rows whose fields the caller checked: shapes, and dtypes the generic
        check passes as they are (the field's own, or one numpy casts without losing a value
        class, or ints whose values fit)."""
        for i in self.flags:  # ints of 0 and 1 as bools, as Spec.check_batch gives them
            # (the episode bookkeeping's kernels read flags as bool arrays)
            if values[i].dtype.kind != "b":
                values[i] = values[i].astype(bool)
        self.rows(values, n, None)

    def rows(self, values: list, n: int, extra) -> None:
        """Write ``n >= 1`` checked rows."""
        p = self.parts
        lim = p.limiter
        if lim is not None:
            lim.check_insert(n)  # before the lock: an insert that can never proceed
        with p.lock:
            if lim is not None:
                lim.insert_wait(n)
            p.writer.write(values, n, extra)
            if lim is not None:
                lim.inserted(n)
