"""Storages: where rows live. Two layouts behind one contract.

``AoSStorage``
    One structured array, ``spec.aos_dtype``, one record per row.
``SoAStorage``
    One C-contiguous array per field, shape ``(capacity, *field.shape)``.

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

from .._config import resolve_layout
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
        """Bytes of the arrays this output owns: the indices and the rows."""
        rows = [self.records] if self.records is not None else list(self.fields.values())
        return int(self.indices.nbytes + sum(a.nbytes for a in rows))


class _Storage:
    layout: str

    def __init__(self, spec: Spec, capacity: int, allocator=None):
        from .. import alloc, kernels  # numba is imported when the first storage is built, not at import

        self.spec = spec
        self.capacity = capacity
        self._kernels = kernels.BY_LAYOUT[self.layout]
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

    def write_rows(self, start: int, values: list, src_start: int, count: int) -> None:
        """Write ``values[f][src_start:src_start+count]`` at rows ``[start, start+count)``."""
        stop = start + count
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

    layout = "aos"
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
        # a shaped field as one opaque item per record: numpy copies a strided column of
        # fixed-size items with one inner loop, where the (rows, *shape) view costs a loop per row
        # (1000 rows of f4[4]: 1.0 us against 5.3 us)
        self._opaque = {}
        for i, f in enumerate(spec):
            if f.shape:
                self._opaque[i] = np.ndarray((capacity,), np.dtype((np.void, f.nbytes)), self.data,
                                             dtype.fields[f.name][1], (dtype.itemsize,))

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    def write_rows(self, start: int, values: list, src_start: int, count: int) -> None:
        opaque = self._opaque
        if count < 32 or not opaque:
            return super().write_rows(start, values, src_start, count)
        stop, src_stop = start + count, src_start + count
        whole = src_start == 0 and count == len(values[0])
        for i, (view, v) in enumerate(zip(self._field_list, values)):
            o = opaque.get(i)
            if o is not None and v.dtype == view.dtype and v.flags.c_contiguous:
                view = o
                v = v.reshape(v.shape[0], -1).view(o.dtype).reshape(v.shape[0])
            view[start:stop] = v if whole else v[src_start:src_stop]

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

    layout = "soa"
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


class Projection:
    """Some fields of a storage (or of a dataset's rows), gathered into one column per field.

    Made by ``project(names)`` of a storage or of :class:`~tfdata.storage.rows.Rows`. The
    layout only says where each field's bytes are (``byte_bases``, ``spans``); this class knows
    no layout. It offers the part of the storage contract that sampling uses, so samplers and
    transforms treat it as they treat a storage: ``kernels`` (:mod:`tfdata.kernels.spans`),
    ``kernel_store``, ``new_output``, ``gather``, ``gather_at``, ``kernel_rows``,
    ``output_words``.

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

    Attributes
    ----------
    names : tuple of str
    kernel_store : tuple of (ndarray of uint8, int)
        ``(base, offset)`` of every field of ``names``, as the span kernels read them.
    bases_read : tuple of int
        The bases the projection reads, ascending (for page advice).
    """

    def __init__(self, spec, names, bases, spans, allocator, dtypes=None):
        from .. import kernels

        self.names = tuple(names)
        self.fields = tuple(spec[n] for n in self.names)
        self.dtypes = {f.name: f.dtype if dtypes is None else dtypes[f.name] for f in self.fields}
        self.allocator = allocator
        self.kernels = kernels.spans
        store = []
        for f in self.fields:
            b, offset, width = spans[f.name]
            base = bases[b]
            # the span kernels copy ``width`` bytes at ``offset`` of a base's rows: checked here,
            # once, so that a wrong description is an error, never a copy of other bytes
            if not (isinstance(base, np.ndarray) and base.dtype == np.uint8 and base.ndim == 2
                    and base.flags.c_contiguous and width == f.nbytes and 0 <= offset
                    and offset + width <= base.shape[1]):
                raise ValueError(f"field {f.name!r}: span (base {b}, offset {offset}, width "
                                 f"{width}) is not within the rows of its base "
                                 f"{getattr(base, 'dtype', None)}{list(getattr(base, 'shape', ()))}"
                                 f" (field of {f.nbytes} bytes)")
            store.append((base, int(offset)))
        self.bases_read = tuple(sorted({spans[n][0] for n in self.names}))
        # no field: one zero-width span of the first base, so that the kernels keep their types
        # (and draw exactly as for a full output)
        self.kernel_store = tuple(store) if store else ((bases[0], 0),)

    def new_output(self, batch_size: int, allocator=None) -> Output:
        """``batch_size`` rows of the projected fields, one C-contiguous array per field."""
        a = self.allocator if allocator is None else allocator
        fields = {f.name: a.zeros((batch_size,) + f.shape, self.dtypes[f.name]) for f in self.fields}
        kernel_out = tuple(_bytes2d(fields[n]) for n in self.names)
        if not kernel_out:
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
        return tuple(c[at:at + k] for c in out.kernel_out)

    def copy_range(self, start: int, m: int, out: Output) -> None:
        """Rows ``[start, start + m)`` into the first ``m`` rows of ``out`` (numpy slices, for
        consecutive rows)."""
        for (base, offset), dst in zip(self.kernel_store, out.kernel_out):
            dst[:m] = base[start:start + m, offset:offset + dst.shape[1]]

    def output_words(self, out: Output, name: str, word: int):
        """Field ``name`` of an output as ``(words, offset, width)`` (see
        :meth:`_Storage.field_words`): its own column, offset 0."""
        col = _bytes2d(out.fields[name])
        return col.view(WORD_TYPES[word]), 0, col.shape[1] // word

    @property
    def row_nbytes(self) -> int:
        """Bytes of one projected row (the fields' widths)."""
        return int(sum(f.nbytes for f in self.fields))


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


def make_storage(spec: Spec, capacity: int, layout: str | None = None, backing=None,
                 allocator=None) -> _Storage:
    """Build the storage for ``layout`` (argument, else ``TFDATA_LAYOUT``, else the default).

    ``backing``: arrays to use instead of fresh memory (records for AoS, a dict of columns for
    SoA), of the exact dtypes and shapes the storage would allocate. ``allocator``: where fresh
    memory (rows and outputs) comes from (see :func:`tfdata.alloc.resolve`).
    """
    return STORAGES[resolve_layout(layout)](spec, capacity, backing, allocator)


def file_name(layout: str, stem: str) -> str:
    """The name of a dataset file of ``layout``: ``stem.npy`` (AoS) or the directory ``stem`` (SoA)."""
    return stem + STORAGES[layout].file_suffix


def storage_nbytes(spec: Spec, capacity: int, layout: str) -> int:
    """Bytes the storage of ``layout`` holds for ``capacity`` rows of ``spec`` (without building it)."""
    row = spec.aos_dtype.itemsize if layout == "aos" else spec.row_nbytes
    return int(capacity) * int(row)


def output_nbytes(spec: Spec, batch_size: int, layout: str, fields=None) -> int:
    """Bytes of one :meth:`new_output` of ``batch_size`` rows: rows plus int64 indices; with
    ``fields`` (stored fields, checked), of one output of their :class:`Projection` (columns,
    whatever the layout)."""
    if fields is not None:
        return int(batch_size) * (8 + sum(spec[n].nbytes for n in fields))
    return storage_nbytes(spec, batch_size, layout) + 8 * int(batch_size)
