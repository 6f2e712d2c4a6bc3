"""Array of structures (``layout="aos"``): one structured array, ``spec.aos_dtype``, one record
per row."""

from __future__ import annotations

import numpy as np

from ..spec import Spec
from .base import Storage, opaque_items
from .output import WORD_TYPES, Output


class AoSStorage(Storage):
    """One structured array of ``capacity`` records (see :attr:`Spec.aos_dtype`).

    Attributes
    ----------
    data : ndarray of spec.aos_dtype, shape (capacity,)
    kernel_store : ndarray of uint64, shape (capacity, itemsize // 8)
        The same memory, as the kernels copy it.
    """

    layout = kernel_layout = "aos"
    file_suffix = ".npy"

    def __init__(self, spec: Spec, capacity: int, backing=None, allocator=None):
        super().__init__(spec, capacity, allocator)
        dtype = spec.aos_dtype
        # zeros: pages are mapped lazily and padding bytes are deterministic; or the caller's
        # memory (a file mapping, for a spilling buffer)
        self.data = self.allocator.zeros(capacity, dtype) if backing is None else backing
        self.kernel_store = self.data.view(np.uint64).reshape(capacity, dtype.itemsize // 8)
        self._fields = {name: self.data[name] for name in spec.names}
        self._field_list = [self._fields[name] for name in spec.names]
        self._opaque = {i: opaque_items(self.data, capacity, dtype.fields[f.name][1], f.nbytes)
                        for i, f in enumerate(spec) if f.shape}  # see Storage._opaque

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    def field_offset(self, name: str) -> int:
        self.spec[name]
        return int(self.spec.aos_dtype.fields[name][1])

    def column(self, name: str) -> np.ndarray:
        f = self.spec[name]
        k = int(np.prod(f.shape, dtype=np.int64))
        # built, not reshaped: a reshape that cannot be a view would copy silently
        return np.ndarray((self.capacity, k), f.dtype, self.data, self.field_offset(name),
                          (self.spec.aos_dtype.itemsize, f.dtype.itemsize))

    def _words(self, view, name, word, offset, records=None):
        rec = self.data if records is None else records
        dtype = WORD_TYPES[word]
        width = self.spec[name].nbytes // word
        return rec.view(dtype).reshape(rec.shape[0], -1), offset // word, width

    def append_to(self, writer, start: int, stop: int) -> None:
        writer.append_records(self.data[start:stop])

    def byte_regions(self, start: int = 0, stop: int | None = None) -> list:
        fields = self.spec.aos_dtype.fields
        raw = self.data[start:stop].view(np.uint8)
        return [(raw, self.spec.aos_dtype.itemsize,
                 [(i, int(fields[name][1])) for i, name in enumerate(self.spec.names)])]

    def kernel_rows(self, out: Output, at: int, k: int):
        """Rows ``[at, at + k)`` of ``out`` as the kernels see them (a view)."""
        return out.kernel_out[at:at + k]

    def _row_arrays(self) -> tuple:
        return (self.data,)

    def _kernel_view(self, rows: tuple):
        return rows[0].view(np.uint64)  # the record's words, as new_output's kernel_out

    def byte_bases(self) -> tuple:
        return (self.data.view(np.uint8).reshape(self.capacity, self.spec.aos_dtype.itemsize),)

    def spans(self) -> dict:
        fields = self.spec.aos_dtype.fields
        return {f.name: (0, int(fields[f.name][1]), f.nbytes) for f in self.spec}

    def new_output(self, batch_size: int, allocator=None) -> Output:
        a = self.allocator if allocator is None else allocator
        dtype = self.spec.aos_dtype
        records = a.zeros(batch_size, dtype)
        fields = {name: records[name] for name in self.spec.names}
        words = records.view(np.uint64).reshape(batch_size, dtype.itemsize // 8)
        return Output(a.zeros(batch_size, np.int64), fields, words, records, self)
