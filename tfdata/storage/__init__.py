"""Storages: where rows live. Three layouts behind one contract.

``AoSStorage`` (``layout="aos"``)
    One structured array, ``spec.aos_dtype``, one record per row.
``SoAStorage`` (``layout="soa"``)
    One C-contiguous array per field, shape ``(capacity, *field.shape)``.
``GroupStorage`` (``layout=[["obs", "action"], ["next_obs"], ...]``, column groups)
    One array per group of fields: a group of two or more fields is a record array (the
    fields at natural alignment, as :attr:`Spec.aos_dtype` lays out a row), a group of one
    field a plain column; the groups side by side, as SoA columns are.

A layout is ``"aos"``, ``"soa"`` or a grouping, normalised by :func:`resolve_layout` (against a
spec) to a tuple of tuples of field names; only this package and the kernels look inside it.

Both offer the same operations: ``capacity``, ``nbytes``, ``write_row``, ``write_rows``,
``field`` (a view of one field), ``column`` (the same values as ``(capacity, elements)``, what the
column kernels read), ``gather`` (rows by index into a given output), ``new_output``
(a preallocated output block for a batch size) and ``state_dict``/``load_state_dict``. A storage
binds its kernel module (``tfdata.kernels.aos`` or ``.soa``) when it is built; nothing downstream
branches on the layout again.

``project(names)`` gives a :class:`Projection`: the same sampling contract (``kernels``,
``kernel_store``, ``new_output``, ``gather``) over some fields only. A layout contributes where
each field's bytes are (``byte_bases`` and ``spans``); the projection, which knows no layout,
gathers them with the span kernels (:mod:`tfdata.kernels.spans`) into one C-contiguous column
per field.

Storages do no validation of row contents and no locking: :class:`tfdata.ReplayBuffer` validates
with the :class:`~tfdata.spec.Spec` and serialises writers and samplers.
"""

from __future__ import annotations

import numpy as np

from .._config import resolve_layout as _layout_name
from ..errors import SpecError
from ..spec import Spec


class Output:
    """A preallocated batch of ``batch_size`` rows for one storage (or projection of it).

    Attributes
    ----------
    indices : ndarray of int64, shape (batch_size,)
        Row numbers of the last gather into this output.
    fields : dict of str to ndarray
        One array per field, shape ``(batch_size, *field.shape)``. For the AoS layout these are
        strided views of one structured array; for SoA and projections each is C-contiguous.
    kernel_out : ndarray or tuple of ndarray
        The same memory as the kernels see it.
    source : storage, Projection or None
        What made this output and gathers into it (``source.gather``, ``source.kernel_rows``,
        ``source.output_words``); None for a dataset's outputs.
    kernels, store
        ``source.kernels`` and ``source.kernel_store`` (None without a source): a sampler
        calls ``out.kernels.sample_uniform(out.store, ..., out.kernel_out)``, so one sampler
        fills full and projected outputs alike.
    """

    __slots__ = ("indices", "fields", "kernel_out", "records", "source", "kernels", "store")

    def __init__(self, indices, fields, kernel_out, records=None, source=None):
        self.indices = indices
        self.fields = fields
        self.kernel_out = kernel_out
        self.records = records
        self.source = source
        self.kernels = None if source is None else source.kernels
        self.store = None if source is None else source.kernel_store

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays this output owns: the indices and the rows (padding included:
        the kernels' view of them)."""
        rows = self.kernel_out if isinstance(self.kernel_out, tuple) else (self.kernel_out,)
        return int(self.indices.nbytes + sum(a.nbytes for a in rows))


class _Storage:
    layout: str
    #: the kernel module's layout (a grouping's byte views are copied by the SoA kernels)
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

    # field index: the field as one opaque item per record, for a shaped field inside records
    # (AoS, a record group): numpy copies a strided column of fixed-size items with one inner
    # loop, where the (rows, *shape) view costs a loop per row (1000 rows of f4[4]: 1.0 us
    # against 5.3 us)
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
        offset and width (see :func:`word_size`).
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


class AoSStorage(_Storage):
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
        self._opaque = {}  # see _Storage._opaque
        for i, f in enumerate(spec):
            if f.shape:
                self._opaque[i] = np.ndarray((capacity,), np.dtype((np.void, f.nbytes)), self.data,
                                             dtype.fields[f.name][1], (dtype.itemsize,))

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

    def byte_bases(self) -> tuple:
        return (self.data.view(np.uint8).reshape(self.capacity, self.spec.aos_dtype.itemsize),)

    def spans(self) -> dict:
        fields = self.spec.aos_dtype.fields
        return {f.name: (0, int(fields[f.name][1]), f.nbytes) for f in self.spec}

    def new_output(self, batch_size: int) -> Output:
        dtype = self.spec.aos_dtype
        records = self.allocator.zeros(batch_size, dtype)
        fields = {name: records[name] for name in self.spec.names}
        words = records.view(np.uint64).reshape(batch_size, dtype.itemsize // 8)
        return Output(self.allocator.zeros(batch_size, np.int64), fields, words, records, self)


class SoAStorage(_Storage):
    """One C-contiguous array per field.

    Attributes
    ----------
    columns : dict of str to ndarray
        ``columns[name]`` has dtype ``spec[name].dtype`` and shape ``(capacity, *spec[name].shape)``.
    kernel_store : tuple of ndarray of uint8, each shape (capacity, field_bytes)
        Byte views of the columns, in field order.
    """

    layout = kernel_layout = "soa"
    file_suffix = ""

    def __init__(self, spec: Spec, capacity: int, backing=None, allocator=None):
        super().__init__(spec, capacity, allocator)
        self.columns = ({f.name: self.allocator.zeros((capacity,) + f.shape, f.dtype) for f in spec}
                        if backing is None else dict(backing))
        self._fields = self.columns
        self._field_list = [self.columns[name] for name in spec.names]
        self.kernel_store = tuple(_bytes2d(c) for c in self._field_list)

    @property
    def nbytes(self) -> int:
        return int(sum(c.nbytes for c in self._field_list))

    def _words(self, view, name, word, offset, records=None):
        width = self.spec[name].nbytes // word
        return _bytes2d(view).view(WORD_TYPES[word]), 0, width

    def column(self, name: str) -> np.ndarray:
        self.spec[name]
        col = self.columns[name]
        return col.reshape(col.shape[0], -1)  # C-contiguous: always a view

    def append_to(self, writer, start: int, stop: int) -> None:
        writer.append({name: col[start:stop] for name, col in self.columns.items()})

    def byte_regions(self, start: int = 0, stop: int | None = None) -> list:
        return [(col[start:stop].reshape(-1).view(np.uint8), f.nbytes, [(i, 0)])
                for i, (f, col) in enumerate(zip(self.spec, self._field_list))]

    def kernel_rows(self, out: Output, at: int, k: int):
        return tuple(c[at:at + k] for c in out.kernel_out)

    def byte_bases(self) -> tuple:
        return self.kernel_store

    def spans(self) -> dict:
        return {f.name: (i, 0, f.nbytes) for i, f in enumerate(self.spec)}

    def new_output(self, batch_size: int) -> Output:
        fields = {f.name: self.allocator.zeros((batch_size,) + f.shape, f.dtype) for f in self.spec}
        kernel_out = tuple(_bytes2d(fields[name]) for name in self.spec.names)
        return Output(self.allocator.zeros(batch_size, np.int64), fields, kernel_out, None, self)


class GroupStorage(_Storage):
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
        A grouping normalised by :func:`resolve_layout` for ``spec``.
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
        Byte views of the blocks, in group order.
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
        self.kernel_store = tuple(_bytes2d(b) for b in self.blocks)
        # a shaped field of a record group as one opaque item per record (see AoSStorage)
        self._opaque = {}
        for i, f in enumerate(spec):
            k, offset = self._where[f.name]
            if f.shape and len(groups[k]) > 1:
                block = self.blocks[k]
                self._opaque[i] = np.ndarray((capacity,), np.dtype((np.void, f.nbytes)), block,
                                             offset, (block.dtype.itemsize,))

    @property
    def nbytes(self) -> int:
        return int(sum(b.nbytes for b in self.blocks))

    def wipe(self) -> None:
        for b in self.kernel_store:  # padding bytes too
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
        k, offset = self._where[name]
        return self.kernel_store[k].view(WORD_TYPES[word]), offset // word, self.spec[name].nbytes // word

    def output_words(self, out: Output, name: str, word: int):
        k, offset = self._where[name]
        return out.kernel_out[k].view(WORD_TYPES[word]), offset // word, self.spec[name].nbytes // word

    def append_to(self, writer, start: int, stop: int) -> None:
        writer.append_blocks([b[start:stop] for b in self.blocks])

    def byte_regions(self, start: int = 0, stop: int | None = None) -> list:
        index = {name: i for i, name in enumerate(self.spec.names)}
        return [(kb[start:stop].reshape(-1), kb.shape[1],
                 [(index[name], self._where[name][1]) for name in g])
                for g, kb in zip(self.layout, self.kernel_store)]

    def kernel_rows(self, out: Output, at: int, k: int):
        return tuple(c[at:at + k] for c in out.kernel_out)

    def byte_bases(self) -> tuple:
        return self.kernel_store

    def spans(self) -> dict:
        return {f.name: self._where[f.name] + (f.nbytes,) for f in self.spec}

    def project(self, names) -> "Projection":
        return Projection(self.spec, names, self.byte_bases(), self.spans(), self.allocator,
                          blocks=self.record_blocks())

    def record_blocks(self) -> dict:
        """``{group: (base, dtype)}`` for every group of two or more fields: a projection that
        holds the whole group copies it as one block of that record dtype."""
        return {g: (k, b.dtype) for k, (g, b) in enumerate(zip(self.layout, self.blocks)) if len(g) > 1}

    def new_output(self, batch_size: int) -> Output:
        a = self.allocator
        blocks = [a.zeros((batch_size,) + shape, dtype) for dtype, shape in group_arrays(self.spec, self.layout)]
        fields = {}
        for g, block in zip(self.layout, blocks):
            for name in g:
                fields[name] = block if len(g) == 1 else block[name]
        fields = {name: fields[name] for name in self.spec.names}
        return Output(a.zeros(batch_size, np.int64), fields, tuple(_bytes2d(b) for b in blocks), None, self)


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
        :meth:`AoSStorage.spans`).
    allocator : tfdata.alloc.Allocator
        Where outputs come from.
    dtypes : dict of str to numpy dtype, optional
        The dtype of each field as the source's full outputs hold it, when it is not the
        spec's (a dataset's records may hold, say, big-endian fields): the bytes are copied as
        they are, so the projected field must read them as the full batch does.
    blocks : dict of tuple of str to (int, numpy dtype), optional
        Record blocks: ``{group: (base, dtype)}``, base ``base`` holding records of ``dtype``
        whose fields are ``group`` (see :meth:`GroupStorage.record_blocks`). When every field
        of a group is projected, the group's whole record is copied as one span (offset 0,
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
        the span kernels read them; for the AoS kernels, the base as ``uint64[rows, words]``.
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
                store.append((bases[b], int(offset)))
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
                store.append((bases[b], 0))
                pieces.append((group, dtype, dtype.itemsize))
        self._pieces = pieces
        self.bases_read = tuple(sorted({spans[n][0] for n in self.names}))
        # no field: one zero-width span of the first base, so that the kernels keep their types
        # (and draw exactly as for a full output)
        self.kernel_store = tuple(store) if store else ((bases[0], 0),)
        # one record block that is its base's whole row (a group sampled alone): the AoS kernels
        # copy it, one block of words per row, as they copy an AoS buffer of those fields (the
        # span kernels cost 1.07x for that: a tuple of pairs to type, an offset to add)
        self._records = (len(pieces) == 1 and pieces[0][1] is not None and pieces[0][2] % 8 == 0
                         and store[0][0].shape[1] == pieces[0][2])
        if self._records:
            self.kernels = kernels.aos
            self.kernel_store = store[0][0].view(np.uint64)

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
        kernel_out = tuple(_bytes2d(arr) for arr in arrays)
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
        :meth:`_Storage.field_words`): its own column at offset 0, or its group's records."""
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


def _bytes2d(arr: np.ndarray) -> np.ndarray:
    """uint8 view ``(rows, row_bytes)`` of a C-contiguous array ``(rows, ...)``."""
    return arr.reshape(arr.shape[0], -1).view(np.uint8)


WORD_TYPES = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def word_size(*sizes: int) -> int:
    """The widest word (8, 4, 2 or 1 bytes) dividing every byte offset and width in ``sizes``."""
    for word in (8, 4, 2):
        if all(s % word == 0 for s in sizes):
            return word
    return 1


STORAGES = {"aos": AoSStorage, "soa": SoAStorage}


def resolve_layout(layout, spec: Spec):
    """The layout ``layout`` names for rows of ``spec``: ``"aos"``, ``"soa"`` or a grouping.

    ``None`` or a string goes through :func:`tfdata._config.resolve_layout` (the argument, else
    ``TFDATA_LAYOUT``, else the default; ValueError for another name). A list of groups, each a
    list of field names, is checked and normalised: every group's fields in spec order, the
    groups in the order given, and each field the grouping leaves out as a group of its own
    (after those, in spec order). The result is a tuple of tuples, which this function returns
    unchanged for the same spec (so ``layout=buffer.layout`` rebuilds the same storage).

    Raises
    ------
    ValueError
        Not ``"aos"``, ``"soa"``, None or a list; an empty list of groups; more groups than
        fields.
    SpecError
        A group that is not a list of str (a bare string included), an empty group, an
        unknown field (named), a field in two groups or twice in one (named).
    """
    if layout is None or isinstance(layout, str):
        return _layout_name(layout)
    return _groups(layout, spec)


def _groups(layout, spec: Spec, what: str = "layout") -> tuple:
    if not isinstance(layout, (list, tuple)):
        raise ValueError(f"{what}: expected 'aos', 'soa' or a list of groups (each a list of field "
                         f"names), got {type(layout).__name__} {str(layout)[:100]}")
    if not layout:
        raise ValueError(f"{what}: expected at least one group of fields, got an empty "
                         f"{type(layout).__name__} (layout='soa' stores every field alone)")
    if len(layout) > len(spec):  # bounded before anything is iterated: the list may come from a file
        raise ValueError(f"{what}: {len(layout)} groups for the {len(spec)} fields of the spec")
    seen = {}
    groups = []
    for k, group in enumerate(layout):
        if isinstance(group, (str, bytes)) or not isinstance(group, (list, tuple)):
            one = f"; for a group of one field write [{group!r}]" if isinstance(group, str) else ""
            raise SpecError(f"{what}: group {k}: expected a list of field names, got "
                            f"{type(group).__name__} {str(group)[:100]}{one}")
        if not group:
            raise SpecError(f"{what}: group {k} is empty; every group needs at least one field")
        if len(group) > len(spec):
            raise SpecError(f"{what}: group {k} names {len(group)} fields, the spec has {len(spec)}")
        for name in group:
            if not isinstance(name, str):
                raise SpecError(f"{what}: group {k}: field names must be str, got "
                                f"{type(name).__name__} {str(name)[:100]}")
            if name not in spec:
                raise SpecError(f"{what}: group {k}: {spec.unknown_message(name)}")
            if name in seen:
                where = "twice in group" if seen[name] == k else f"in group {seen[name]} and in group"
                raise SpecError(f"{what}: field {name!r} is {where} {k}; each field belongs to one group")
            seen[name] = k
        members = set(group)
        groups.append(tuple(n for n in spec.names if n in members))
    groups += [(n,) for n in spec.names if n not in seen]
    return tuple(groups)


def restrict_layout(layout, spec: Spec):
    """``layout`` for the fields of ``spec`` only (the stored fields of a buffer whose next
    fields are elided): a grouping loses the other fields, and the groups left empty."""
    if isinstance(layout, str):
        return layout
    return tuple(g for g in (tuple(n for n in group if n in spec) for group in layout) if g)


def isolate_layout(layout, spec: Spec, names):
    """``layout`` (resolved for ``spec``) with each field of ``names`` stored alone, as a column:
    the frames of a stacked field, which the stack kernels read and no row gather copies. SoA
    stores every field alone already; AoS becomes one record group of the other fields."""
    names = [n for n in spec.names if n in set(names)]
    if not names or (isinstance(layout, str) and layout == "soa"):
        return layout
    groups = [spec.names] if isinstance(layout, str) else layout
    rest = tuple(g for g in (tuple(n for n in group if n not in names) for group in groups) if g)
    return rest + tuple((n,) for n in names)


def check_layout(layout, spec: Spec, what: str = "layout"):
    """``layout`` as read from a file (JSON: a string or lists): ``"aos"``, ``"soa"`` or a
    grouping of every field of ``spec``, exactly as :func:`resolve_layout` normalises it (each
    field once, groups in spec order within, none left out). Returns the normalised layout;
    ValueError (or SpecError) naming the problem otherwise."""
    if isinstance(layout, str):
        if layout not in ("aos", "soa"):
            raise ValueError(f"{what}: expected 'aos', 'soa' or a list of groups, got {layout[:100]!r}")
        return layout
    groups = _groups(layout, spec, what)
    if [list(g) for g in groups] != [list(g) for g in layout]:
        raise ValueError(f"{what}: the grouping {str(layout)[:200]} is not in normal form (every "
                         f"field once, each group in spec order); normalised it reads "
                         f"{[list(g) for g in groups]}")
    return groups


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


def _row_bytes(spec: Spec, layout) -> int:
    if isinstance(layout, str):
        return spec.aos_dtype.itemsize if layout == "aos" else spec.row_nbytes
    return sum(dtype.itemsize * int(np.prod(shape, dtype=np.int64)) for dtype, shape in group_arrays(spec, layout))


def make_storage(spec: Spec, capacity: int, layout=None, backing=None,
                 allocator=None) -> _Storage:
    """Build the storage for ``layout`` (argument, else ``TFDATA_LAYOUT``, else the default;
    a grouping: see :func:`resolve_layout`).

    ``backing``: arrays to use instead of fresh memory (records for AoS, a dict of columns for
    SoA, a sequence of one array per group for a grouping), of the exact dtypes and shapes the
    storage would allocate. ``allocator``: where fresh memory (rows and outputs) comes from
    (see :func:`tfdata.alloc.resolve`).
    """
    layout = resolve_layout(layout, spec)
    if isinstance(layout, tuple):
        return GroupStorage(spec, capacity, layout, backing, allocator)
    return STORAGES[layout](spec, capacity, backing, allocator)


def file_name(layout, stem: str) -> str:
    """The name of a dataset file of ``layout``: ``stem.npy`` (AoS) or the directory ``stem``
    (SoA, a grouping)."""
    return stem + (GroupStorage if isinstance(layout, tuple) else STORAGES[layout]).file_suffix


def storage_nbytes(spec: Spec, capacity: int, layout) -> int:
    """Bytes the storage of ``layout`` (resolved for ``spec``) holds for ``capacity`` rows of
    ``spec`` (without building it)."""
    return int(capacity) * int(_row_bytes(spec, layout))


def output_nbytes(spec: Spec, batch_size: int, layout, fields=None) -> int:
    """Bytes of one :meth:`new_output` of ``batch_size`` rows: rows plus int64 indices; with
    ``fields`` (stored fields, checked), of one output of their :class:`Projection` (columns,
    and for a grouping a record block per group of several fields held whole)."""
    if fields is not None:
        row = sum(spec[n].nbytes for n in fields)
        if isinstance(layout, tuple):
            wanted = set(fields)
            for g in layout:
                if len(g) > 1 and wanted.issuperset(g):
                    row += group_dtype(spec, g).itemsize - sum(spec[n].nbytes for n in g)
        return int(batch_size) * (8 + row)
    return storage_nbytes(spec, batch_size, layout) + 8 * int(batch_size)
