"""Dataset rows: a dataset's arrays in either layout, as the gather kernel reads them.

A dataset holds records of any record dtype (AoS: one structured array, the caller's or a
file's, padding and all) or one array per field (SoA). :class:`Rows` turns either into what the
loader needs: field views, the byte rows the gather kernel copies (an AoS record is one byte row,
so both layouts use the SoA kernel), and outputs of the same layout. :func:`arrange` makes the
rows of the layout asked for from the caller's arrays, copying only what it must.
"""

from __future__ import annotations

import numpy as np

from ..spec import Spec
from . import Output, Projection


def byte_rows(arr: np.ndarray, row_bytes: int) -> np.ndarray:
    """uint8 view ``(rows, row_bytes)`` of a C-contiguous array of ``rows`` rows (rows may be 0)."""
    return arr.reshape(-1).view(np.uint8).reshape(arr.shape[0], row_bytes)


class Rows:
    """The rows of a dataset: ``records`` (AoS) or ``columns`` (SoA), one of them given.

    Attributes
    ----------
    layout : {"aos", "soa"}
    records : structured ndarray, shape (n,), or None
    columns : dict of str to ndarray, each (n, *shape), or None
    dtype : numpy dtype or None
        The record dtype (AoS).
    n, row_nbytes : int
    fields : dict of str to ndarray
        A view of every field, ``(n, *shape)``.
    kernel_store : tuple of ndarray of uint8, each (n, bytes)
        What the gather kernel reads: one byte row per record, or one per field.
    """

    def __init__(self, spec: Spec, records=None, columns=None):
        self.spec = spec
        self.records, self.columns, self.dtype = records, columns, None
        if records is not None:
            self.layout = "aos"
            self.dtype = records.dtype
            self.n = int(records.shape[0])
            self.row_nbytes = int(records.dtype.itemsize)
            self.fields = {name: records[name] for name in spec.names}
            self.kernel_store = (byte_rows(records, self.row_nbytes),)
        else:
            self.layout = "soa"
            self.n = int(next(iter(columns.values())).shape[0])
            self.row_nbytes = int(sum(f.nbytes for f in spec))
            self.fields = columns
            self.kernel_store = tuple(byte_rows(columns[f.name], f.nbytes) for f in spec)

    def spans(self) -> dict:
        """``{name: (base, offset, width)}``: where each field's bytes are in the rows of
        :attr:`kernel_store` (see :meth:`tfdata.storage.AoSStorage.spans`)."""
        if self.records is not None:
            fields = self.dtype.fields
            return {f.name: (0, int(fields[f.name][1]), f.nbytes) for f in self.spec}
        return {f.name: (i, 0, f.nbytes) for i, f in enumerate(self.spec)}

    def project(self, names, allocator) -> Projection:
        """The fields ``names`` (checked by the caller) as a :class:`~tfdata.storage.Projection`
        over these rows; its outputs come from ``allocator``."""
        return Projection(self.spec, names, self.kernel_store, self.spans(), allocator,
                          {n: self.fields[n].dtype for n in names})

    def new_output(self, batch_size: int, allocator) -> Output:
        """An output block of ``batch_size`` rows in this layout, from ``allocator``."""
        a = allocator
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


def arrange(spec: Spec, records, columns, layout: str | None, allocator, check_copy) -> Rows:
    """The rows of ``layout`` (None: the one given) from the caller's ``records`` or ``columns``.

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
