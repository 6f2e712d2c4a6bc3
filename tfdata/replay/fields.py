"""Reading and rewriting the fields of the rows a replay buffer holds.

:class:`Fields` is the part behind ``column``, ``column_stats``, ``stats`` and
``update_field`` of :class:`~tfdata.replay.core.ReplayCore`: it reads the storage in ring order
(oldest to newest, from the writer's cursor and size), computes statistics, and relabels rows in
place under the buffer's lock, refusing what would break another part (episode flags, fields
that elision or frame stacks read); ``release_cold`` hands a spilling buffer's cold rows back to
its file.
"""

from __future__ import annotations

import numpy as np

from .._checks import bad_slot
from ..batch import Batch
from ..errors import SpecError
from .columns import Column, scan


class Fields:
    """The column operations over a buffer's parts (see the methods of the same names on
    :class:`tfdata.ReplayBuffer`).

    Parameters
    ----------
    plan : tfdata.replay.plan.Plan
        What the buffer stores.
    storage, writer, lock, episodes, stats, spill
        The buffer's parts (``episodes``, ``stats``, ``spill``: None when absent).
    """

    def __init__(self, plan, storage, writer, lock, episodes, stats, spill):
        self.plan, self.storage, self.writer, self.lock = plan, storage, writer, lock
        self.episodes, self.stats_part, self.spill = episodes, stats, spill

    def _stored_field(self, name, what: str):
        """The field ``name``, which the storage must hold (SpecError naming it otherwise)."""
        if not isinstance(name, str) or name not in self.plan.spec:
            raise SpecError(f"{what}: {self.plan.spec.unknown_message(name)}")
        if name not in self.plan.stored:
            src = self.plan.next_of.get(name)
            if src in self.plan.stacked:
                raise SpecError(f"{what}: field {name!r} is not stored: with frame_stack it is rebuilt "
                                f"from the frames of {src!r}")
            raise SpecError(f"{what}: field {name!r} is not stored: with elide_next=True it is read "
                            f"from the next row's {src!r}")
        return self.plan.stored[name]

    def column(self, name: str) -> Column:
        """Read-only views of field ``name`` over the rows held, oldest to newest; no copy.

        Returns
        -------
        Column
            ``column.segments``: one view ``(len(self), *shape)``, or two when the ring has
            wrapped and the oldest row is not in slot 0 (slots ``cursor..capacity``, then
            ``0..cursor``), none when empty; ``np.asarray(column)`` concatenates them (a copy).
            The views read the buffer's memory as it is: rows written or relabelled later
            change them (see :class:`~tfdata.replay.columns.Column`).

            A field stacked with ``frame_stack`` gives what is stored: each row's newest frame,
            shape ``(len(self), *frame)`` (``batch[name][:, -1]`` of the rows), not the stacks.

        Raises
        ------
        SpecError
            Unknown field, or a next field that is not stored (``elide_next``, or the next
            field of a stacked field).
        """
        f = self._stored_field(name, "column")
        with self.lock:
            n, c = self.writer.size, self.writer.cursor
            view = self.storage.field(name)
            if n == 0:
                segments = ()
            elif n < self.plan.capacity or c == 0:
                segments = (view[:n],)
            else:
                segments = (view[c:], view[:c])
        return Column(name, segments, f)

    def column_stats(self, name: str):
        """Statistics of field ``name`` over the rows held, computed now by one compiled pass.

        Any bool, integer or float field; O(len(self)), faster in SoA than in AoS, whose
        records are strided (measured in reports/benchmarks.md, ``ColumnScan``). For statistics
        kept up to date as rows are written, build the buffer with ``stats=[name]`` and call
        :meth:`stats`.

        Returns
        -------
        FieldStats
            ``count``, and per element (arrays of the field's shape, float64) ``mean``, ``var``
            (population), ``std``, ``min``, ``max``; see
            :class:`~tfdata.replay.columns.FieldStats`. A field stacked with ``frame_stack``:
            the statistics of its stored frames (each row's newest), of the frame's shape.

        Raises
        ------
        SpecError
            Unknown or unstored field, or one of a complex dtype.
        """
        f = self._stored_field(name, "column_stats")
        if f.dtype.kind not in "biuf":
            raise SpecError(f"column_stats: field {name!r} has dtype {f.dtype}; statistics are "
                            f"computed for bool, integer and float fields only")
        with self.lock:
            return scan(f, self.storage.column(name), self.writer.size)

    def stats(self, name: str):
        """The running statistics of field ``name`` over the rows held (``stats=`` at construction).

        Exact for the live rows: rows overwritten have left them, relabelled rows count with
        their new values. The work is done here, under the lock, not when rows are written: a
        call recomputes the blocks of rows written or relabelled since the previous call (256
        rows per block; 1024 for 1-byte fields) and the tree above them, so it costs in
        proportion to the rows written since; when nothing changed it returns the same object
        (measured in reports/benchmarks.md).

        Returns
        -------
        FieldStats
            ``count == len(self)``, and per element (arrays of the field's shape, float64)
            ``mean``, ``var`` (population, ``ddof=0``), ``std``, ``min``, ``max``, with
            :meth:`~tfdata.replay.columns.FieldStats.normalize`. Read-only.

        Raises
        ------
        SpecError
            ``name`` is not one of :attr:`stats_fields`.
        """
        if self.stats_part is None or name not in self.stats_part.trees:
            raise SpecError(f"stats: no running statistics of field {name!r} (kept for "
                            f"{list(self.plan.stats_fields)}): build the buffer with stats=[{name!r}, ...], "
                            f"or compute them once with column_stats({name!r})")
        with self.lock:
            return self.stats_part.read(name)

    def update_field(self, name: str, indices, values) -> None:
        """Rewrite field ``name`` of the rows in slots ``indices`` in place (relabelling).

        Validated as :meth:`extend` validates, all before anything is written, under the
        buffer's lock; running statistics of the field then count the new values. Sampling
        weights, priorities and write versions are not touched: the rows keep their identity.

        Parameters
        ----------
        name : str
            A stored field. Refused: the ``terminated`` / ``truncated`` fields of a buffer that
            tracks episodes (they define its episode numbers, which slices and n-step windows
            read); with ``elide_next``, an elided next field (not stored) and the field it is
            read from (``obs``: rewriting it would change the previous row's ``next_obs``);
            with ``frame_stack``, a stacked field (its frames make the next rows' stacks) and
            its next field (not stored).
        indices : Batch or array_like of int, shape (k,)
            A batch from :meth:`sample` (recommended): its rows, and the rows it sampled only,
            since a row overwritten after the sample is refused (as ``update_priorities``
            refuses a stale batch); or slots of live rows, as in ``batch.indices``, which
            relabel whatever rows those slots hold now. Either way each in ``[0, len(self))``,
            each once (a batch drawn with replacement that holds a row twice is refused as such
            indices are).
        values : array_like, shape ``(k, *spec[name].shape)``
            Cast to the field's dtype only when no data can be lost (see :class:`Spec`).

        Raises
        ------
        SpecError
            Unknown or refused field (see ``name``), indices not a 1-D integer array, values of
            the wrong shape or an unsafe cast (a ValueError).
        IndexError
            An index outside ``[0, len(self))`` (the message names it and its position).
        ValueError
            An index given twice (the message names it and both positions); a stale batch: rows
            of it were overwritten since it was sampled (the message gives how many), by the
            writer's position the batch keeps (``batch.write_position``; see
            :meth:`tfdata.replay.writers.RingWriter.overwritten`: in ring order a slot is
            overwritten once the writer has passed it, with exactly-k once its sweep wrote it);
            a batch that carries no write position (not from :meth:`sample`) or one ahead of
            this buffer's (another buffer's).
        tfdata.StaleBatchError
            ``indices`` is a batch whose ring slot was reused by a later sample (a ValueError).

        Whatever is refused, nothing has changed.
        """
        f = self._stored_field(name, "update_field")
        if self.episodes is not None and name in (self.plan.roles.get("terminated"),
                                                   self.plan.roles.get("truncated")):
            raise SpecError(f"update_field: field {name!r} is an episode flag of this buffer: episode "
                            f"numbers (slices, n-step windows, elision) are derived from it, so it "
                            f"cannot be rewritten in place")
        if name in self.plan.stacked:
            raise SpecError(f"update_field: field {name!r} is stored one frame per row with "
                            f"frame_stack: the stacks of the stream's next rows are rebuilt from "
                            f"its frames, so it cannot be rewritten in place")
        if name in self.plan.elided.values():
            nxt = [k for k, v in self.plan.next_of.items() if v == name]
            raise SpecError(f"update_field: field {name!r} cannot be rewritten with elide_next=True: "
                            f"the {nxt[0]!r} of each stream's previous row is read from it")
        since = None
        if isinstance(indices, Batch):
            indices, since = self._batch_rows(indices)
        idx = np.asarray(indices)
        if idx.ndim != 1 or (idx.size and idx.dtype.kind not in "iu"):
            raise SpecError(f"update_field: indices must be a 1-D integer array, got "
                            f"{idx.dtype}{list(idx.shape)}")
        slots = self._checked_slots(idx, self.writer.size)
        vals = f.coerce(values, (slots.shape[0],))
        if slots.size == 0:
            return
        with self.lock:
            n = self.writer.size
            if n < self.plan.capacity and int(slots.max()) >= n:  # a clear() ran since the check
                self._checked_slots(idx, n)
            if since is not None:
                self._check_fresh(slots, since)
            self.storage.field(name)[slots] = vals
            if self.stats_part is not None:
                self.stats_part.mark(name, slots)
            if self.spill is not None:
                self.spill.check_resident()

    def release_cold(self) -> None:
        """Release a spilling buffer's rows behind its hot window from this process
        (``MADV_DONTNEED``: the file keeps them, a later read faults them in again), as a
        sample does once too much of the cold part is resident; nothing without ``spill_path``."""
        if self.spill is not None:
            with self.lock:
                self.spill.release_cold()

    @staticmethod
    def _batch_rows(batch: Batch) -> tuple:
        """``(indices, write position)`` of a batch given to :meth:`update_field` (a retired
        batch raises StaleBatchError here); ValueError for one that carries no position."""
        indices, since = batch.indices, batch.write_position
        if since is None or isinstance(since, bool) or not isinstance(since, (int, np.integer)):
            raise ValueError(f"update_field: this batch carries no write position "
                             f"({since!r:.40}): it did not come from this buffer's sample() (a "
                             f"batch of sample_sequences(), of a shared buffer, or built by hand), "
                             f"so whether its rows are still held cannot be told; pass its indices "
                             f"to relabel whatever rows those slots hold now")
        return indices, int(since)

    def _check_fresh(self, slots: np.ndarray, since: int) -> None:
        """ValueError unless every row of ``slots`` is the one a batch sampled at write position
        ``since`` took (none written since; lock held)."""
        w = self.writer
        if since > w.position:
            raise ValueError(f"update_field: this batch's write position {since} is ahead of this "
                             f"buffer's ({w.position}): it was sampled from another buffer")
        stale = w.overwritten(slots, since)
        k = int(np.count_nonzero(stale))
        if k:
            shown = slots[stale][:10].tolist()
            raise ValueError(f"update_field: stale batch: {k} of its {slots.shape[0]} rows were "
                             f"overwritten since it was sampled (slots {shown}"
                             f"{', ...' if k > 10 else ''}); nothing was written (relabel its other "
                             f"rows with their indices, or sample again)")

    def _checked_slots(self, idx: np.ndarray, n: int) -> np.ndarray:
        """``idx`` (a 1-D integer array) as int64 slots, each in ``[0, n)`` and given once;
        IndexError or ValueError naming the first that is not, and its position."""
        problem, slots = bad_slot(idx, n)
        if problem is not None:
            i, kind = problem
            if kind == "range":
                raise IndexError(f"update_field: indices[{i}] = {idx[i]} is not a live row: slots "
                                 f"are in [0, {n}) (len(buffer) = {n})")
            first = int(np.flatnonzero(slots[:i] == slots[i])[0])
            raise ValueError(f"update_field: index {idx[i]} is given twice (indices[{first}] and "
                             f"indices[{i}]); each row may be rewritten once per call")
        return slots


def delegate(name: str):
    """A buffer method that calls its :class:`Fields` method ``name`` (``self._fields``), with
    that method's documentation."""
    def method(self, *args):
        return getattr(self._fields, name)(*args)

    method.__name__ = name
    method.__doc__ = getattr(Fields, name).__doc__
    return method
