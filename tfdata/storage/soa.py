"""Structure of arrays (``layout="soa"``): one C-contiguous array per field, shape
``(capacity, *field.shape)``."""

from __future__ import annotations

import numpy as np

from ..spec import Spec
from .base import Storage
from .output import WORD_TYPES, Output, bytes2d, readonly


class SoAStorage(Storage):
    """One C-contiguous array per field.

    Attributes
    ----------
    columns : dict of str to ndarray
        ``columns[name]`` has dtype ``spec[name].dtype`` and shape ``(capacity, *spec[name].shape)``.
    kernel_store : tuple of ndarray of uint8, each shape (capacity, field_bytes)
        Read-only byte views of the columns, in field order (what the gather kernels read).
    """

    layout = kernel_layout = "soa"
    file_suffix = ""

    def __init__(self, spec: Spec, capacity: int, backing=None, allocator=None):
        super().__init__(spec, capacity, allocator)
        self.columns = ({f.name: self.allocator.zeros((capacity,) + f.shape, f.dtype) for f in spec}
                        if backing is None else dict(backing))
        self._fields = self.columns
        self._field_list = [self.columns[name] for name in spec.names]
        self.kernel_store = tuple(readonly(bytes2d(c)) for c in self._field_list)

    @property
    def nbytes(self) -> int:
        return int(sum(c.nbytes for c in self._field_list))

    def _words(self, view, name, word, offset, records=None):
        width = self.spec[name].nbytes // word
        return bytes2d(view).view(WORD_TYPES[word]), 0, width

    def column(self, name: str) -> np.ndarray:
        self.spec[name]
        col = self.columns[name]
        return col.reshape(col.shape[0], -1)  # C-contiguous: always a view

    def append_to(self, writer, start: int, stop: int) -> None:
        writer.append({name: col[start:stop] for name, col in self.columns.items()})

    def byte_regions(self, start: int = 0, stop: int | None = None) -> list:
        return [(col[start:stop].reshape(-1).view(np.uint8), f.nbytes, [(i, 0)])
                for i, (f, col) in enumerate(zip(self.spec, self._field_list))]

    def _row_arrays(self) -> tuple:
        return tuple(self._field_list)

    def byte_bases(self) -> tuple:
        return self.kernel_store

    def spans(self) -> dict:
        return {f.name: (i, 0, f.nbytes) for i, f in enumerate(self.spec)}

    def new_output(self, batch_size: int, allocator=None) -> Output:
        a = self.allocator if allocator is None else allocator
        fields = {f.name: a.zeros((batch_size,) + f.shape, f.dtype) for f in self.spec}
        kernel_out = tuple(bytes2d(fields[name]) for name in self.spec.names)
        return Output(a.zeros(batch_size, np.int64), fields, kernel_out, None, self)
