"""The storage contract: what every storage offers, whatever its layout.

A storage holds ``capacity`` rows of a :class:`~tfdata.spec.Spec` in one layout
(:class:`~tfdata.storage.aos.AoSStorage`, :class:`~tfdata.storage.soa.SoAStorage`,
:class:`~tfdata.storage.groups.GroupStorage`; built by :func:`~tfdata.storage.make_storage`)
and binds the kernel module of that layout when it is built (``tfdata.kernels.aos``, or
``.soa`` for SoA and groupings); nothing downstream branches on the layout again. Storages do no
validation of row contents and no locking: :class:`tfdata.ReplayBuffer` validates with the spec
and serialises writers and samplers.

Attributes
----------
spec : Spec
capacity : int
layout : {"aos", "soa"} or tuple of tuple of str
    The layout (a grouping as :func:`~tfdata.storage.resolve_layout` normalises it).
kernel_layout : {"aos", "soa"}
    The layout of the kernel module (a grouping's byte views are copied by the SoA kernels).
kernels : module
    The kernel module bound to this layout.
kernel_store : ndarray or tuple of ndarray
    The rows as the kernels read them.
allocator : tfdata.alloc.Allocator
    Where the rows and outputs come from.
nbytes : int
    Bytes of the rows (padding included).
file_suffix : str
    ``".npy"`` for a layout stored as one file, ``""`` for a directory.

Methods: those of :class:`Storage`, each documented there.

:class:`Storage` implements what the layouts share. A layout sets ``layout``,
``kernel_layout``, ``file_suffix``, ``kernel_store`` and ``_fields`` / ``_field_list`` (views
of every field, by name and in spec order), and implements ``nbytes``, ``column``, ``_words``,
``byte_bases``, ``spans``, ``byte_regions``, ``append_to``, ``_row_arrays`` (the arrays
holding the rows: what :meth:`Storage.row_format` describes) and ``new_output(batch_size,
allocator=None)`` (an :class:`Output` of ``batch_size`` rows in this layout, from
``allocator``, default the storage's), and ``kernel_rows`` and ``_kernel_view`` when its
outputs are not one array per group or field.
"""

from __future__ import annotations

import numpy as np

from ..spec import Spec
from .output import Output, output_bytes, row_format
from .projection import Projection


class Storage:
    """What the layouts share of the storage contract (see the module docstring)."""

    layout: str
    kernel_layout: str

    def __init__(self, spec: Spec, capacity: int, allocator=None):
        from .. import alloc, kernels  # numba is imported when the first storage is built, not at import

        self.spec = spec
        self.capacity = capacity
        self._kernels = kernels.BY_LAYOUT[self.kernel_layout]
        self.allocator = alloc.resolve(allocator)

    # the kernel-facing view of the data; see subclasses
    kernel_store = None
    # the rows as one record array (AoS only)
    data = None

    @property
    def kernels(self):
        """The kernel module bound to this layout."""
        return self._kernels

    def gather(self, indices: np.ndarray, out: Output) -> None:
        """Copy rows ``indices`` (int64, each in ``[0, capacity)``) into ``out``; no checks."""
        self._kernels.gather(self.kernel_store, indices, out.kernel_out)

    def gather_at(self, indices: np.ndarray, out: Output, at: int) -> None:
        """Copy rows ``indices`` into rows ``[at, at + len(indices))`` of ``out``; no checks.
        (Slices ``out``'s kernel view: for rare paths, such as a redrawn row.)"""
        self._kernels.gather(self.kernel_store, indices, self.kernel_rows(out, at, len(indices)))

    def kernel_rows(self, out: Output, at: int, k: int):
        """Rows ``[at, at + k)`` of ``out`` as the kernels see them (views; one per array of
        the output, as SoA and groupings hold them)."""
        return tuple(c[at:at + k] for c in out.kernel_out)

    def row_format(self) -> tuple:
        """A hashable token of how a row is held (layout, fields, the arrays' dtypes with their
        offsets and padding, their row shapes; :func:`~tfdata.storage.output.row_format`):
        storages and datasets of equal formats fill each other's outputs (:meth:`window`)."""
        return row_format(self.layout, self.spec.names, self._row_arrays())

    def _row_arrays(self) -> tuple:
        raise NotImplementedError

    @property
    def row_nbytes(self) -> int:
        """Bytes of one row as stored and as :meth:`new_output` holds it (padding included)."""
        return self.nbytes // self.capacity

    def window(self, out: Output, at: int, k: int) -> Output:
        """Rows ``[at, at + k)`` of ``out`` as an output this storage's kernels fill.

        ``out`` is an output of this storage's :meth:`row_format`, made by :meth:`new_output`
        of this storage, of another storage or of a dataset (``Dataset.new_output``) of the same
        format. The window's ``indices`` (int64, ``(k,)``) and ``kernel_out`` are views of
        ``out``'s rows, its ``source`` this storage (its kernels and ``kernel_store``), its
        ``fields`` empty (the fields are ``out``'s): a sampler draws into it as into an output
        of its own, and writes only those rows."""
        rows = tuple(b[at:at + k] for b in output_bytes(out))
        return Output(out.indices[at:at + k], {}, self._kernel_view(rows), None, self)

    def _kernel_view(self, rows: tuple):
        # byte rows, as the SoA kernels read a column or a group
        return rows

    def byte_bases(self) -> tuple:
        """The arrays holding the rows, as C-contiguous ``uint8[capacity, row_bytes]`` views
        (the record array for AoS, one per column for SoA): where :meth:`spans` point."""
        raise NotImplementedError

    def spans(self) -> dict:
        """Where each field's bytes are: ``{name: (base, offset, width)}``, the field's
        ``width`` bytes at byte ``offset`` of every row of ``byte_bases()[base]``."""
        raise NotImplementedError

    def project(self, names) -> "Projection":
        """The fields ``names`` (stored fields, checked by the caller; may be empty) as a
        :class:`Projection` over this storage's memory."""
        return Projection(self.spec, names, self.byte_bases(), self.spans(), self.allocator)

    def field(self, name: str) -> np.ndarray:
        """View of one field for all ``capacity`` rows, shape ``(capacity, *field.shape)``."""
        self.spec[name]  # raises SpecError naming the field if unknown
        return self._fields[name]

    def column(self, name: str) -> np.ndarray:
        """Field ``name`` of every slot as a 2-D view ``(capacity, k)``, ``k`` the number of
        elements of one row (the product of the field's shape): C-contiguous for a column of its
        own, strided rows (each row's ``k`` values contiguous) for a field inside records. What
        the column kernels (:mod:`tfdata.kernels._columns`) read; never a copy."""
        raise NotImplementedError

    def field_views(self) -> list:
        """Views of every field in spec order, each ``(capacity, *field.shape)``."""
        return list(self._field_list)

    def byte_regions(self, start: int = 0, stop: int | None = None) -> list:
        """Where the bytes of slots ``[start, stop)`` are, for writers that pack rows themselves
        (:mod:`tfdata.replay.fastpush`).

        Returns
        -------
        list of (raw, stride, members)
            ``raw``: a writable C-contiguous uint8 view of ``(stop - start) * stride`` bytes;
            ``members``: ``[(field_index, offset), ...]``: field ``i`` (spec order) of the
            ``k``-th slot starts at byte ``k * stride + offset`` of ``raw``.
        """
        raise NotImplementedError

    def state_dict(self, n_rows: int, copy: bool = True) -> dict:
        """The first ``n_rows`` physical rows of every field (layout-neutral): copies, or views
        (``copy=False``, valid while nothing writes to the storage)."""
        if not copy:
            return {name: self._fields[name][:n_rows] for name in self.spec.names}
        return {name: np.array(self._fields[name][:n_rows]) for name in self.spec.names}

    def load_state_dict(self, data: dict, n_rows: int, release=None, records=None) -> None:
        """Write rows ``[0, n_rows)`` from ``data`` (as made by :meth:`state_dict`); checked by caller.

        Copies about 16 MiB of rows at a time and calls ``release(start, stop)`` after each
        chunk, so a memory-mapped source never has more than a chunk resident. ``records``: the
        same rows as one structured array; an AoS storage of that exact dtype copies whole
        records instead of field by field.
        """
        step = max(1, (16 << 20) // max(1, self.spec.row_nbytes))
        whole = (records is not None and self.data is not None
                 and records.dtype == self.data.dtype and records.shape[0] >= n_rows)
        for start in range(0, n_rows, step):
            stop = min(n_rows, start + step)
            if whole:
                self.data[start:stop] = records[start:stop]
            else:
                for name in self.spec.names:
                    self._fields[name][start:stop] = data[name][start:stop]
            if release is not None:
                release(start, stop)

    def append_to(self, writer, start: int, stop: int) -> None:
        """Append rows ``[start, stop)`` to a :class:`tfdata.io.Writer` of this layout (records
        as they are for AoS, one slice per column for SoA: no per-row work)."""
        raise NotImplementedError

    def write_row(self, pos: int, values: list) -> None:
        """Write one validated row (values in field order) at ``pos``."""
        for view, v in zip(self._field_list, values):
            view[pos] = v

    # field index: the field as one opaque item per record (see opaque_items), for a shaped
    # field inside records (AoS, a record group): numpy copies a strided column of fixed-size
    # items with one inner loop, where the (rows, *shape) view costs a loop per row
    _opaque: dict = {}

    def write_rows(self, start: int, values: list, src_start: int, count: int) -> None:
        """Write ``values[f][src_start:src_start+count]`` at rows ``[start, start+count)``."""
        stop = start + count
        opaque = self._opaque
        if count >= 32 and opaque:
            src_stop = src_start + count
            whole = src_start == 0 and count == len(values[0])
            for i, (view, v) in enumerate(zip(self._field_list, values)):
                o = opaque.get(i)
                if o is not None and v.dtype == view.dtype and v.flags.c_contiguous:
                    view = o
                    v = v.reshape(v.shape[0], -1).view(o.dtype).reshape(v.shape[0])
                view[start:stop] = v if whole else v[src_start:src_stop]
            return
        if src_start == 0 and count == len(values[0]):  # the common case: no slicing of the input
            for view, v in zip(self._field_list, values):
                view[start:stop] = v
            return
        src_stop = src_start + count
        for view, v in zip(self._field_list, values):
            view[start:stop] = v[src_start:src_stop]

    def wipe(self) -> None:
        """Overwrite every row with zeros."""
        for view in self._field_list:
            view[...] = 0

    def field_offset(self, name: str) -> int:
        """Byte offset of field ``name`` within the 2-D array :meth:`field_words` returns."""
        return 0

    def field_words(self, name: str, word: int):
        """Field ``name`` of every row as ``(words, offset, width)`` for the episode kernels.

        ``words`` is a C-contiguous ``uint{8*word}`` array ``(capacity, row_words)`` holding the
        field at word ``offset``, ``width`` words wide. ``word`` must divide the field's byte
        offset and width (see :func:`~tfdata.storage.output.word_size`).
        """
        return self._words(self._fields[name], name, word, self.field_offset(name))

    def copy_range(self, start: int, m: int, out: Output) -> None:
        """Rows ``[start, start + m)`` into the first ``m`` rows of ``out`` (numpy slices, for
        consecutive rows)."""
        for (base, offset), dst in zip(self.kernel_store, out.kernel_out):
            dst[:m] = base[start:start + m, offset:offset + dst.shape[1]]

    def output_words(self, out: Output, name: str, word: int):
        """As :meth:`field_words`, for the rows of an output made by :meth:`new_output`."""
        return self._words(out.fields[name], name, word, self.field_offset(name), out.records)


def opaque_items(records: np.ndarray, capacity: int, offset: int, nbytes: int) -> np.ndarray:
    """The ``nbytes`` bytes at ``offset`` of every record of ``records`` (a record array, shape
    ``(capacity,)``) as one opaque item per record: a view of dtype ``void{nbytes}``, shape
    ``(capacity,)``, strided by the record size (see ``Storage._opaque``)."""
    return np.ndarray((capacity,), np.dtype((np.void, nbytes)), records, offset, (records.dtype.itemsize,))
