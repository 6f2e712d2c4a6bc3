"""Column groups (``layout=[["obs", "action"], ["next_obs"], ...]``): :class:`GroupStorage`."""

from __future__ import annotations

import numpy as np

from ..spec import Spec
from .base import Storage, opaque_items
from .output import WORD_TYPES, Output, bytes2d, readonly
from .projection import Projection


class GroupStorage(Storage):
    """Column groups: one array per group of fields, the groups side by side.

    A group of two or more fields is a record array of :func:`group_dtype` (the fields in spec
    order at natural alignment, itemsize rounded up to a multiple of 8, as
    :attr:`Spec.aos_dtype` lays out a whole row): sampling it copies one block per row, as AoS
    does. A group of one field is a plain C-contiguous column, as in SoA (no padding): scanning
    that field reads nothing else. The kernels are the SoA kernels (:mod:`tfdata.kernels.soa`)
    over one byte view per group.

    Parameters
    ----------
    spec : Spec
    capacity : int
    groups : tuple of tuple of str
        A grouping normalised by :func:`~tfdata.storage.layout.resolve_layout` for ``spec``.
    backing : sequence of ndarray, optional
        One array per group, of exactly the dtype and shape this class would allocate.

    Attributes
    ----------
    layout : tuple of tuple of str
        ``groups``.
    blocks : tuple of ndarray
        Per group: records of :func:`group_dtype`, shape ``(capacity,)``, or the one field's
        column, ``(capacity, *field.shape)``.
    kernel_store : tuple of ndarray of uint8, each shape (capacity, group_bytes)
        Read-only byte views of the blocks, in group order (what the gather kernels read).
    """

    kernel_layout = "soa"
    file_suffix = ""

    def __init__(self, spec: Spec, capacity: int, groups: tuple, backing=None, allocator=None):
        self.layout = groups
        super().__init__(spec, capacity, allocator)
        a = self.allocator
        self.blocks = (tuple(a.zeros((capacity,) + shape, dtype) for dtype, shape in group_arrays(spec, groups))
                       if backing is None else tuple(backing))
        self._where = {}  # name: (group, byte offset in the group's row)
        self._fields = {}
        for k, (g, block) in enumerate(zip(groups, self.blocks)):
            for name in g:
                if len(g) == 1:
                    self._where[name] = (k, 0)
                    self._fields[name] = block
                else:
                    self._where[name] = (k, int(block.dtype.fields[name][1]))
                    self._fields[name] = block[name]
        self._field_list = [self._fields[name] for name in spec.names]
        self._bytes = tuple(bytes2d(b) for b in self.blocks)
        self.kernel_store = tuple(readonly(b) for b in self._bytes)
        # a shaped field of a record group as one opaque item per record (see AoSStorage)
        self._opaque = {}
        for i, f in enumerate(spec):
            k, offset = self._where[f.name]
            if f.shape and len(groups[k]) > 1:
                self._opaque[i] = opaque_items(self.blocks[k], capacity, offset, f.nbytes)

    @property
    def nbytes(self) -> int:
        return int(sum(b.nbytes for b in self.blocks))

    def wipe(self) -> None:
        for b in self._bytes:  # padding bytes too
            b[...] = 0

    def field_offset(self, name: str) -> int:
        self.spec[name]
        return self._where[name][1]

    def column(self, name: str) -> np.ndarray:
        f = self.spec[name]
        k, offset = self._where[name]
        block = self.blocks[k]
        n = int(np.prod(f.shape, dtype=np.int64))
        if len(self.layout[k]) == 1:  # a column of its own: C-contiguous, as in SoA
            return block.reshape(block.shape[0], -1)
        # built, not reshaped: a reshape that cannot be a view would copy silently
        return np.ndarray((self.capacity, n), f.dtype, block, offset,
                          (block.dtype.itemsize, f.dtype.itemsize))

    def field_words(self, name: str, word: int):
        return self._block_words(self._bytes, name, word)

    def output_words(self, out: Output, name: str, word: int):
        return self._block_words(out.kernel_out, name, word)

    def _block_words(self, rows: tuple, name: str, word: int):
        """Field ``name`` in ``rows`` (one byte view per group: the storage's or an output's)."""
        k, offset = self._where[name]
        return rows[k].view(WORD_TYPES[word]), offset // word, self.spec[name].nbytes // word

    def append_to(self, writer, start: int, stop: int) -> None:
        writer.append_blocks([b[start:stop] for b in self.blocks])

    def byte_regions(self, start: int = 0, stop: int | None = None) -> list:
        index = {name: i for i, name in enumerate(self.spec.names)}
        return [(kb[start:stop].reshape(-1), kb.shape[1],
                 [(index[name], self._where[name][1]) for name in g])
                for g, kb in zip(self.layout, self._bytes)]

    def _row_arrays(self) -> tuple:
        return self.blocks

    def byte_bases(self) -> tuple:
        return self._bytes

    def spans(self) -> dict:
        return {f.name: self._where[f.name] + (f.nbytes,) for f in self.spec}

    def project(self, names) -> "Projection":
        return Projection(self.spec, names, self.byte_bases(), self.spans(), self.allocator,
                          blocks=self.record_blocks())

    def record_blocks(self) -> dict:
        """``{group: (base, dtype)}`` for every group of two or more fields: a projection that
        holds the whole group copies it as one block of that record dtype."""
        return {g: (k, b.dtype) for k, (g, b) in enumerate(zip(self.layout, self.blocks)) if len(g) > 1}

    def new_output(self, batch_size: int, allocator=None) -> Output:
        a = self.allocator if allocator is None else allocator
        blocks = [a.zeros((batch_size,) + shape, dtype) for dtype, shape in group_arrays(self.spec, self.layout)]
        fields = {}
        for g, block in zip(self.layout, blocks):
            for name in g:
                fields[name] = block if len(g) == 1 else block[name]
        fields = {name: fields[name] for name in self.spec.names}
        return Output(a.zeros(batch_size, np.int64), fields, tuple(bytes2d(b) for b in blocks), None, self)


def group_dtype(spec: Spec, group) -> np.dtype:
    """The record dtype of a group of two or more fields: the fields in spec order at their
    natural alignment, itemsize rounded up to a multiple of 8 (:attr:`Spec.aos_dtype` of the
    group's fields)."""
    return spec.subset(group).aos_dtype


def group_arrays(spec: Spec, groups) -> list:
    """``[(dtype, row_shape), ...]`` of each group's array: the record dtype and ``()`` for a
    group of several fields, the field's dtype and shape for a group of one."""
    out = []
    for g in groups:
        if len(g) == 1:
            f = spec[g[0]]
            out.append((f.dtype, f.shape))
        else:
            out.append((group_dtype(spec, g), ()))
    return out
