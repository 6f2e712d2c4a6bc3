"""Dataset rows: a dataset's arrays in any layout (records of any record dtype, padding and
all; one array per field; or one per group), as the gather kernel reads them: one byte row per
record, field or group, so every layout uses the SoA kernel. :class:`Rows` gives the loader field
views, byte rows and outputs of the same layout; :func:`arrange` makes the rows of the layout
asked for from the caller's arrays, copying only what it must.
"""

from __future__ import annotations

import numpy as np

from ..spec import Spec
from .groups import group_arrays
from .output import Output, output_bytes, readonly, row_format
from .projection import Projection


def byte_rows(arr: np.ndarray, row_bytes: int) -> np.ndarray:
    """uint8 view ``(rows, row_bytes)`` of a C-contiguous array of ``rows`` rows (rows may be 0)."""
    return arr.reshape(-1).view(np.uint8).reshape(arr.shape[0], row_bytes)


class Rows:
    """The rows of a dataset: ``records`` (AoS), ``columns`` (SoA), or ``groups`` with their
    ``blocks`` (a grouping), one of them given.

    Attributes
    ----------
    layout : {"aos", "soa"} or tuple of tuple of str
    records : structured ndarray, shape (n,), or None
    columns : dict of str to ndarray, each (n, *shape), or None
    blocks : tuple of ndarray, or None
        One array per group: ``(n,)`` records of the group's dtype, or ``(n, *shape)`` for a
        group of one field.
    dtype : numpy dtype or None
        The record dtype (AoS).
    n, row_nbytes : int
    fields : dict of str to ndarray
        A view of every field, ``(n, *shape)``.
    kernel_store : tuple of ndarray of uint8, each (n, bytes)
        What the gather kernel reads: one byte row per record, per field or per group,
        read-only views (a dataset's arrays, writable or mapped read-only: one type).
    """

    def __init__(self, spec: Spec, records=None, columns=None, groups=None, blocks=None):
        self.spec = spec
        self.records, self.columns, self.dtype, self.blocks = records, columns, None, None
        if groups is not None:
            self.layout = groups
            self.blocks = tuple(blocks)
            self.n = int(self.blocks[0].shape[0])
            widths = [b.dtype.itemsize * int(np.prod(b.shape[1:], dtype=np.int64)) for b in self.blocks]
            self.row_nbytes = int(sum(widths))
            self._where, fields = {}, {}
            for k, (g, b) in enumerate(zip(groups, self.blocks)):
                for name in g:
                    self._where[name] = (k, 0 if len(g) == 1 else int(b.dtype.fields[name][1]))
                    fields[name] = b if len(g) == 1 else b[name]
            self.fields = {name: fields[name] for name in spec.names}
            self.kernel_store = tuple(readonly(byte_rows(b, w)) for b, w in zip(self.blocks, widths))
        elif records is not None:
            self.layout = "aos"
            self.dtype = records.dtype
            self.n = int(records.shape[0])
            self.row_nbytes = int(records.dtype.itemsize)
            self.fields = {name: records[name] for name in spec.names}
            self.kernel_store = (readonly(byte_rows(records, self.row_nbytes)),)
        else:
            self.layout = "soa"
            self.n = int(next(iter(columns.values())).shape[0])
            self.row_nbytes = int(sum(f.nbytes for f in spec))
            self.fields = columns
            self.kernel_store = tuple(readonly(byte_rows(columns[f.name], f.nbytes)) for f in spec)

    @property
    def kernels(self):
        """The kernel module that copies these rows: :mod:`tfdata.kernels.soa`, over the byte
        rows of :attr:`kernel_store` (an AoS record is one byte row)."""
        from .. import kernels  # numba: imported when a dataset is built, not at import

        return kernels.soa

    def row_format(self) -> tuple:
        """A hashable token of how a row is held (see
        :meth:`tfdata.storage.Storage.row_format`): equal to a storage's when the records have
        the storage's record dtype (offsets and padding included), or the columns or group
        blocks its dtypes and shapes."""
        if self.blocks is not None:
            arrays = self.blocks
        elif self.records is not None:
            arrays = (self.records,)
        else:
            arrays = tuple(self.columns[n] for n in self.spec.names)
        return row_format(self.layout, self.spec.names, arrays)

    def window(self, out: Output, at: int, k: int) -> Output:
        """Rows ``[at, at + k)`` of ``out`` (an output of this :meth:`row_format`, made by a
        dataset's or a storage's ``new_output``) as an output of these rows: ``indices``
        (int64, ``(k,)``) and ``kernel_out`` (byte rows) views of ``out``'s, ``source`` these
        rows (:attr:`kernels`, :attr:`kernel_store`), ``fields`` empty (see
        :meth:`tfdata.storage.Storage.window`)."""
        return Output(out.indices[at:at + k], {}, tuple(b[at:at + k] for b in output_bytes(out)),
                      None, self)

    def spans(self) -> dict:
        """``{name: (base, offset, width)}``: where each field's bytes are in the rows of
        :attr:`kernel_store` (see :meth:`tfdata.storage.AoSStorage.spans`)."""
        if self.blocks is not None:
            return {f.name: self._where[f.name] + (f.nbytes,) for f in self.spec}
        if self.records is not None:
            fields = self.dtype.fields
            return {f.name: (0, int(fields[f.name][1]), f.nbytes) for f in self.spec}
        return {f.name: (i, 0, f.nbytes) for i, f in enumerate(self.spec)}

    def project(self, names, allocator) -> Projection:
        """The fields ``names`` (checked by the caller) as a :class:`~tfdata.storage.Projection`
        over these rows; its outputs come from ``allocator`` (a group held whole: one record
        block, as :meth:`tfdata.storage.GroupStorage.project` gives)."""
        blocks = None
        if self.blocks is not None:
            blocks = {g: (k, b.dtype) for k, (g, b) in enumerate(zip(self.layout, self.blocks)) if len(g) > 1}
        return Projection(self.spec, names, self.kernel_store, self.spans(), allocator,
                          {n: self.fields[n].dtype for n in names}, blocks)

    def new_output(self, batch_size: int, allocator) -> Output:
        """An output block of ``batch_size`` rows in this layout, from ``allocator``."""
        a = allocator
        if self.blocks is not None:
            blocks = [a.zeros((batch_size,) + b.shape[1:], b.dtype) for b in self.blocks]
            fields = {}
            for g, b in zip(self.layout, blocks):
                fields.update({g[0]: b} if len(g) == 1 else {n: b[n] for n in g})
            fields = {n: fields[n] for n in self.spec.names}
            return Output(a.zeros(batch_size, np.int64), fields,
                          tuple(byte_rows(b, k.shape[1]) for b, k in zip(blocks, self.kernel_store)))
        if self.records is not None:
            records = a.zeros(batch_size, self.dtype)
            fields = {name: records[name] for name in self.spec.names}
            return Output(a.zeros(batch_size, np.int64), fields,
                          (byte_rows(records, self.row_nbytes),), records)
        fields = {f.name: a.zeros((batch_size,) + f.shape, f.dtype) for f in self.spec}
        kernel_out = tuple(byte_rows(fields[f.name], f.nbytes) for f in self.spec)
        return Output(a.zeros(batch_size, np.int64), fields, kernel_out)


def _is_column(arr: np.ndarray, f) -> bool:
    """Whether ``arr`` can be used as field ``f``'s column as it is (no copy)."""
    return arr.flags.c_contiguous and arr.dtype == f.dtype


def arrange(spec: Spec, records, columns, layout, allocator, check_copy) -> Rows:
    """The rows of ``layout`` (None: the one given; a grouping normalised for ``spec``) from the
    caller's ``records`` or ``columns``.

    Arrays that are already what the layout needs (C-contiguous, of the field's dtype) are used
    as they are; the rest is copied once. ``check_copy(parts, what)`` is called with the bytes
    of the copies before anything is allocated (it raises to refuse).
    """
    native = "aos" if records is not None else "soa"
    layout = layout or native
    if records is not None:
        n = records.shape[0]
        columns = {name: records[name] for name in spec.names}
    else:
        n = len(next(iter(columns.values())))
    if isinstance(layout, tuple):  # a grouping: groups of several fields are copied into records
        arrays = group_arrays(spec, layout)
        copy = {}
        for g, (dt, sh) in zip(layout, arrays):
            if len(g) > 1:
                copy["+".join(g)] = n * dt.itemsize
            elif not _is_column(columns[g[0]], spec[g[0]]):
                copy[g[0]] = n * spec[g[0]].nbytes
        check_copy(copy, f"ArrayDataset of {n} grouped rows")
        blocks = []
        for g, (dt, sh) in zip(layout, arrays):
            if len(g) == 1 and g[0] not in copy:
                blocks.append(columns[g[0]])
                continue
            block = allocator.zeros((n,) + sh, dt)
            for name in g:
                if len(g) == 1:
                    block[...] = columns[name]
                else:
                    block[name] = columns[name]
            blocks.append(block)
        return Rows(spec, groups=layout, blocks=blocks)
    if layout == "aos":
        if records is not None and records.flags.c_contiguous:
            return Rows(spec, records=records)
        check_copy({"copy": n * spec.aos_dtype.itemsize}, f"ArrayDataset of {n} AoS rows")
        out = allocator.zeros(n, records.dtype if records is not None else spec.aos_dtype)
        for name in spec.names:
            out[name] = columns[name]
        return Rows(spec, records=out)
    copy = {f.name: n * f.nbytes for f in spec if not _is_column(columns[f.name], f)}
    check_copy(copy, f"ArrayDataset of {n} SoA rows")
    out = {}
    for f in spec:
        col = columns[f.name]
        if f.name in copy:
            col = allocator.empty((n,) + f.shape, f.dtype)
            col[...] = columns[f.name]
        out[f.name] = col
    return Rows(spec, columns=out)
