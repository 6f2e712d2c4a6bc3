"""Projections: some fields of a storage (or of a dataset's rows): :class:`Projection`."""

from __future__ import annotations

import numpy as np

from .output import WORD_TYPES, Output, bytes2d, readonly


class Projection:
    """Some fields of a storage (or of a dataset's rows), gathered into one column per field
    (or one record block per group of fields held whole).

    Made by ``project(names)`` of a storage or of :class:`~tfdata.storage.rows.Rows`. The
    layout only says where each field's bytes are (``byte_bases``, ``spans``, and for a
    grouping its record ``blocks``); this class knows no layout. It offers the part of the
    storage contract that sampling uses, so samplers and transforms treat it as they treat a
    storage: ``kernels`` (:mod:`tfdata.kernels.spans`), ``kernel_store``, ``new_output``,
    ``gather``, ``gather_at``, ``kernel_rows``, ``output_words``.

    Parameters
    ----------
    spec : Spec
        The source's fields.
    names : sequence of str
        Fields of ``spec`` to gather (checked by the caller), in the order the outputs hold
        them; may be empty (an output with no fields: the kernels still draw the indices).
    bases : tuple of ndarray of uint8, each shape (capacity, row_bytes), C-contiguous
        The source's rows as bytes.
    spans : dict of str to (int, int, int)
        ``name: (base, offset, width)`` for every field of ``spec`` (see
        :meth:`~tfdata.storage.aos.AoSStorage.spans`).
    allocator : tfdata.alloc.Allocator
        Where outputs come from.
    dtypes : dict of str to numpy dtype, optional
        The dtype of each field as the source's full outputs hold it, when it is not the
        spec's (a dataset's records may hold, say, big-endian fields): the bytes are copied as
        they are, so the projected field must read them as the full batch does.
    blocks : dict of tuple of str to (int, numpy dtype), optional
        Record blocks: ``{group: (base, dtype)}``, base ``base`` holding records of ``dtype``
        whose fields are ``group`` (see
        :meth:`~tfdata.storage.groups.GroupStorage.record_blocks`). When every field of a group
        is projected, the group's whole record is copied as one span (offset 0,
        the record's width) into a record array of ``dtype``, whose fields are the output's
        (strided views), as the full output holds them: one copy per row instead of one per
        field. Checked against ``spans``.

    Attributes
    ----------
    names : tuple of str
    kernels : module
        :mod:`tfdata.kernels.spans`; :mod:`tfdata.kernels.aos` when the projection is one
        record block that is its base's whole row (a group of a grouping sampled alone).
    kernel_store : tuple of (ndarray of uint8, int), or ndarray of uint64
        ``(base, offset)`` of every piece the output holds (a field, or a group's records), as
        the span kernels read them (read-only views of the bases, whatever the source's memory);
        for the AoS kernels, the base as ``uint64[rows, words]``.
    bases_read : tuple of int
        The bases the projection reads, ascending (for page advice).
    """

    def __init__(self, spec, names, bases, spans, allocator, dtypes=None, blocks=None):
        from .. import kernels

        self.names = tuple(names)
        self.fields = tuple(spec[n] for n in self.names)
        self.dtypes = {f.name: f.dtype if dtypes is None else dtypes[f.name] for f in self.fields}
        self.allocator = allocator
        self.kernels = kernels.spans
        wanted = set(self.names)
        whole = {}  # name: (group, base, dtype) for the fields of a group projected whole
        for group, (b, dtype) in (blocks or {}).items():
            if wanted.issuperset(group):
                for n in group:
                    whole[n] = (tuple(group), b, dtype)
        store, pieces = [], []  # (names, dtype or None, width) of each piece, in store order
        self._where = {}  # name: (piece, byte offset in the piece's rows)
        for f in self.fields:
            blk = whole.get(f.name)
            if blk is None:
                b, offset, width = spans[f.name]
                _check_span(f.name, bases, b, offset, width, f.nbytes)
                self._where[f.name] = (len(store), 0)
                store.append((readonly(bases[b]), int(offset)))
                pieces.append(((f.name,), None, f.nbytes))
            elif self._where.get(f.name) is None:  # the group's first field: the whole record
                group, b, dtype = blk
                for n in group:  # the block must say what the spans say
                    off = dtype.fields[n][1] if n in (dtype.names or ()) else None
                    if off is None or spans[n] != (b, off, spec[n].nbytes):
                        raise ValueError(f"field {n!r}: record block (base {b}, dtype {dtype}) "
                                         f"disagrees with its span {spans[n]}")
                    self._where[n] = (len(store), int(off))
                _check_span(group[0], bases, b, 0, dtype.itemsize, dtype.itemsize)
                store.append((readonly(bases[b]), 0))
                pieces.append((group, dtype, dtype.itemsize))
        self._pieces = pieces
        self.bases_read = tuple(sorted({spans[n][0] for n in self.names}))
        # no field: one zero-width span of the first base, so that the kernels keep their types
        # (and draw exactly as for a full output)
        self.kernel_store = tuple(store) if store else ((readonly(bases[0]), 0),)
        # one record block that is its base's whole row (a group sampled alone): the AoS kernels
        # copy it, one block of words per row, as they copy an AoS buffer of those fields
        self._records = (len(pieces) == 1 and pieces[0][1] is not None and pieces[0][2] % 8 == 0
                         and store[0][0].shape[1] == pieces[0][2])
        if self._records:
            self.kernels = kernels.aos
            # of the base as given: a storage's AoS kernels read writable words
            self.kernel_store = bases[self.bases_read[0]].view(np.uint64)

    def new_output(self, batch_size: int, allocator=None) -> Output:
        """``batch_size`` rows of the projected fields: one C-contiguous array per field, and a
        record array per group projected whole (its fields strided views of it)."""
        a = self.allocator if allocator is None else allocator
        arrays, fields = [], {}
        for group, dtype, _ in self._pieces:
            if dtype is None:
                f = self.fields[self.names.index(group[0])]
                arr = fields[f.name] = a.zeros((batch_size,) + f.shape, self.dtypes[f.name])
            else:
                arr = a.zeros(batch_size, dtype)
                for n in group:
                    fields[n] = arr[n]
            arrays.append(arr)
        fields = {n: fields[n] for n in self.names}
        kernel_out = tuple(bytes2d(arr) for arr in arrays)
        if self._records:
            kernel_out = kernel_out[0].view(np.uint64)
        elif not kernel_out:
            kernel_out = (np.zeros((batch_size, 0), np.uint8),)
        return Output(a.zeros(batch_size, np.int64), fields, kernel_out, None, self)

    def gather(self, indices: np.ndarray, out: Output) -> None:
        """Copy the projected fields of rows ``indices`` (int64, each in range) into ``out``."""
        self.kernels.gather(self.kernel_store, indices, out.kernel_out)

    def gather_at(self, indices: np.ndarray, out: Output, at: int) -> None:
        """As :meth:`gather`, into rows ``[at, at + len(indices))`` of ``out``."""
        self.kernels.gather(self.kernel_store, indices, self.kernel_rows(out, at, len(indices)))

    def kernel_rows(self, out: Output, at: int, k: int):
        """Rows ``[at, at + k)`` of ``out`` as the kernels see them (views)."""
        if self._records:
            return out.kernel_out[at:at + k]
        return tuple(c[at:at + k] for c in out.kernel_out)

    def copy_range(self, start: int, m: int, out: Output) -> None:
        """Rows ``[start, start + m)`` into the first ``m`` rows of ``out`` (numpy slices, for
        consecutive rows)."""
        if self._records:
            out.kernel_out[:m] = self.kernel_store[start:start + m]
            return
        for (base, offset), dst in zip(self.kernel_store, out.kernel_out):
            dst[:m] = base[start:start + m, offset:offset + dst.shape[1]]

    def output_words(self, out: Output, name: str, word: int):
        """Field ``name`` of an output as ``(words, offset, width)`` (see
        :meth:`~tfdata.storage.base.Storage.field_words`): its own column at offset 0, or its
        group's records."""
        piece, offset = self._where[name]
        nbytes = self.fields[self.names.index(name)].nbytes
        rows = out.kernel_out if self._records else out.kernel_out[piece]
        return rows.view(WORD_TYPES[word]), offset // word, nbytes // word

    @property
    def row_nbytes(self) -> int:
        """Bytes of one projected row as gathered (the fields' widths; a whole group's record
        with its padding)."""
        return int(sum(width for _, _, width in self._pieces))


def _check_span(name, bases, b, offset, width, nbytes) -> None:
    """The span kernels copy ``width`` bytes at ``offset`` of a base's rows: checked here, once,
    so that a wrong description is an error, never a copy of other bytes."""
    base = bases[b] if isinstance(b, int) and 0 <= b < len(bases) else None
    if not (isinstance(base, np.ndarray) and base.dtype == np.uint8 and base.ndim == 2
            and base.flags.c_contiguous and width == nbytes and 0 <= offset
            and offset + width <= base.shape[1]):
        raise ValueError(f"field {name!r}: span (base {b}, offset {offset}, width "
                         f"{width}) is not within the rows of its base "
                         f"{getattr(base, 'dtype', None)}{list(getattr(base, 'shape', ()))}"
                         f" (field of {nbytes} bytes)")
