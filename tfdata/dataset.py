"""Datasets: fixed collections of rows that a :class:`~tfdata.loader.DataLoader` reads in batches.

:class:`Dataset` is the contract (a length, a :class:`~tfdata.spec.Spec`, a layout, a vectorised
``gather(indices, out)`` into an output made by ``new_output``, zero-copy ``rows(start, stop)``
and page advice) with the code that :class:`ArrayDataset` (arrays in memory) and
:class:`MmapDataset` (a file, memory-mapped read-only) share. An AoS record may have any
itemsize (a file written by another program need not be padded as :attr:`Spec.aos_dtype` is).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from types import MappingProxyType

import numpy as np

from .errors import FormatError, SpecError
from .spec import Field, Spec
from .storage import Output, resolve_layout
from .storage.rows import Rows, arrange
from .storage import files as _io

PAGE = _io.PAGE


class Dataset:
    """The dataset contract, with the shared implementation over records or columns.

    Attributes
    ----------
    spec : Spec
        Field names, dtypes and per-row shapes.
    layout : {"aos", "soa"} or tuple of tuple of str
        ``"aos"``: one structured array, ``records``; ``"soa"``: one array per field,
        ``columns``; a grouping (column groups): one array per group, ``blocks``.
    row_nbytes : int
        Bytes of one row as stored (the record size for AoS, the sum of field sizes for SoA,
        of the groups' row sizes for a grouping).
    """

    spec: Spec
    layout: str
    #: the rows as one structured array (AoS datasets), else None
    records = None
    #: one array per group (grouped datasets), else None
    blocks = None
    #: what the dataset's manifest keeps beside its rows (where it came from: a Minari dataset's
    #: id, environment spec, author...), read-only; empty for data in memory and AoS files
    metadata = MappingProxyType({})

    def _bind(self, spec: Spec, records=None, columns=None, groups=None, blocks=None) -> None:
        # Subclasses call this once they hold their arrays.
        from . import kernels  # numba is imported when the first dataset is built, not at import

        self.spec = spec
        # every layout through the SoA gather kernel: an AoS record is one byte row
        self._gather = kernels.soa.gather
        self._rows = rows = Rows(spec, records, columns, groups, blocks)
        self.layout, self.records, self.columns, self.dtype = rows.layout, rows.records, rows.columns, rows.dtype
        self.blocks = rows.blocks
        self._n, self.row_nbytes = rows.n, rows.row_nbytes
        self._fields, self._kernel_store = rows.fields, rows.kernel_store

    def __len__(self) -> int:
        return self._n

    def new_output(self, batch_size: int, allocator=None) -> Output:
        """A preallocated output block of ``batch_size`` rows for :meth:`gather`: the rows plus
        int64 indices, ``batch_size * (row_nbytes + 8)`` bytes, from ``allocator`` (see
        :func:`tfdata.alloc.resolve`)."""
        from . import alloc

        a = alloc.resolve(allocator if allocator is not None else getattr(self, "_allocator", None))
        return self._rows.new_output(batch_size, a)

    def gather(self, indices: np.ndarray, out: Output) -> None:
        """Copy rows ``indices`` into the first ``len(indices)`` rows of ``out``.

        Parameters
        ----------
        indices : ndarray of int64, shape (m,)
            Row numbers in ``[0, len(self))``; checked here.
        out : Output
            Made by :meth:`new_output` with at least ``m`` rows.

        The copy runs in a numba kernel without the GIL.
        """
        indices = np.asarray(indices)
        if indices.dtype != np.int64 or indices.ndim != 1:
            raise SpecError(f"indices: expected a 1-D int64 array, got {indices.dtype}{list(indices.shape)}")
        if indices.shape[0] > out.indices.shape[0]:
            raise SpecError(f"indices: {indices.shape[0]} rows do not fit an output of {out.indices.shape[0]}")
        if indices.shape[0] and (indices.min() < 0 or indices.max() >= self._n):
            raise IndexError(f"indices: expected rows in [0, {self._n}), got [{indices.min()}, {indices.max()}]")
        self._gather(self._kernel_store, indices, out.kernel_out)

    def gather_unchecked(self, indices: np.ndarray, out: Output, at: int = 0) -> None:
        """:meth:`gather` without checks, into ``out[at:at + len(indices)]``: the loader's path,
        whose indices come from its own permutation, in range by construction."""
        kout = out.kernel_out
        if at:  # a tuple of byte views, or one array (a projection of one record block)
            kout = kout[at:] if isinstance(kout, np.ndarray) else tuple(k[at:] for k in kout)
        self._gather(self._kernel_store, indices, kout)

    def _copy_range(self, start: int, m: int, out: Output) -> None:
        # consecutive rows: one contiguous block per field (per record array for AoS), which
        # numpy copies with memcpy and without the GIL, instead of an index gather
        stop = start + m
        for src, dst in zip(self._kernel_store, out.kernel_out):
            dst[:m] = src[start:stop]

    def rows(self, start: int, stop: int) -> dict:
        """Zero-copy views of rows ``[start, stop)`` of every field, ``{name: (stop-start, *shape)}``."""
        return {name: v[start:stop] for name, v in self._fields.items()}

    def field(self, name: str) -> np.ndarray:
        """View of one field for every row, shape ``(len(self), *shape)``."""
        self.spec[name]
        return self._fields[name]

    def byte_bases(self) -> tuple:
        """The arrays holding the rows, as read-only C-contiguous ``uint8[len, row_bytes]``
        views (the record array, one per column, one per group): where :meth:`spans` point,
        as :meth:`tfdata.storage.Storage.byte_bases` for a storage."""
        return tuple(self._rows.kernel_store)

    def spans(self) -> dict:
        """Where each field's bytes are: ``{name: (base, offset, width)}`` in the rows of
        :meth:`byte_bases` (see :meth:`tfdata.storage.Storage.spans`)."""
        return self._rows.spans()

    def row_format(self) -> tuple:
        """A hashable token of how a row is held, equal to a storage's or another dataset's
        when their outputs are interchangeable (see :meth:`tfdata.storage.Storage.row_format`):
        a dataset written by :func:`tfdata.io.save` from a spec's columns has the format of a
        buffer of that spec and layout."""
        return self._rows.row_format()

    def window(self, out: Output, at: int, k: int) -> Output:
        """Rows ``[at, at + k)`` of ``out``, an output of this :meth:`row_format` (this
        dataset's :meth:`new_output`, or a storage's of the same format), as an output whose
        ``kernels`` (the SoA kernels over byte rows) and ``store`` are this dataset's: a
        sampler draws rows of this dataset into it (``out.kernels.sample_uniform(out.store,
        ...)``), writing only those rows of ``out``."""
        return self._rows.window(out, at, k)

    def project(self, fields) -> "ProjectedDataset":
        """The fields ``fields`` of this dataset, over the same memory (nothing is copied).

        Its :meth:`gather` copies only those fields' bytes (the span kernels of
        :mod:`tfdata.kernels.spans`) into one C-contiguous column per field, whatever the
        layout; its batches equal this dataset's restricted to ``fields``. What
        ``DataLoader(dataset, ..., fields=)`` reads.

        Raises
        ------
        SpecError
            An unknown field (named), a field named twice, an empty list, a non-str name.
        """
        return ProjectedDataset(self, self.spec.select(fields))

    # -- page advice: no-ops for data in memory ---------------------------------------------------
    mapped_nbytes = 0

    def willneed(self, start: int, stop: int) -> None:
        """Read rows ``[start, stop)`` ahead (memory-mapped datasets)."""

    def release(self, start: int, stop: int) -> None:
        """Drop the pages of rows ``[start, stop)`` from this process (memory-mapped datasets)."""

    def release_all(self) -> None:
        """Drop every mapped page from this process (memory-mapped datasets)."""

    def touch(self, start: int, stop: int) -> None:
        """Fault in the pages of rows ``[start, stop)`` (memory-mapped datasets)."""

    def close(self) -> None:
        """Release what the dataset holds (files, maps)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        fields = ", ".join(f"{f.name}: {f.dtype}{list(f.shape)}" for f in self.spec)
        return f"{type(self).__name__}({self._n} rows, layout={self.layout!r}, {{{fields}}})"


class _MappedPages:
    """Page advice for a dataset over mapped files: ``_maps`` is ``[(MappedFile, row_bytes),
    ...]`` (one per file read) and ``_n`` the rows."""

    _maps = ()  # no file mapped (yet)

    def willneed(self, start: int, stop: int) -> None:
        for mf, width in self._maps:
            mf.willneed(start * width, stop * width)

    def release(self, start: int, stop: int) -> None:
        for mf, width in self._maps:
            mf.release(start * width, stop * width)

    def release_all(self) -> None:
        self.release(0, self._n)

    def sequential(self) -> None:
        """Advise the kernel that the mapped files will be read front to back."""
        for mf, _ in self._maps:
            mf.sequential()

    def touch(self, start: int, stop: int) -> None:
        from .kernels import touch_pages

        for base in self._bases if self._maps else ():
            touch_pages(base[start:stop].reshape(-1), PAGE)


class ProjectedDataset(_MappedPages, Dataset):
    """Some fields of a dataset, over its memory (see :meth:`Dataset.project`).

    Attributes
    ----------
    parent : Dataset
        The dataset projected.
    names : tuple of str
        Its fields, in the parent's order.
    row_nbytes : int
        Bytes of one projected row as gathered (the fields' widths).
    mapped_nbytes : int
        Bytes of the parent's mapped files that hold these fields (0 in memory): for an AoS
        file the whole records, for an SoA directory only these columns.
    """

    def __init__(self, parent: Dataset, names: tuple):
        from . import alloc

        rows = parent._rows.project(names, alloc.resolve(getattr(parent, "_allocator", None)))
        self.parent, self.names = parent, names
        self.metadata = parent.metadata
        self.spec = parent.spec.subset(names)
        self.layout, self.dtype = parent.layout, None
        self._rows, self._n = rows, len(parent)
        self._gather, self._kernel_store = rows.kernels.gather, rows.kernel_store
        self._fields = {n: parent._fields[n] for n in names}
        self.row_nbytes = rows.row_nbytes
        # the parent's maps line up with its byte bases (one record file, or one per column):
        # page advice goes to the ones these fields are in
        maps = getattr(parent, "_maps", [])
        self._maps = [maps[b] for b in rows.bases_read] if maps else []
        self._bases = [parent._kernel_store[b] for b in rows.bases_read]
        self.mapped_nbytes = self._n * sum(width for _, width in self._maps)

    def _copy_range(self, start: int, m: int, out: Output) -> None:
        self._rows.copy_range(start, m, out)

    def byte_bases(self) -> tuple:
        raise TypeError(f"{self!r}: a projection has no byte bases of its own; use its parent's")

    def row_format(self) -> tuple:
        raise TypeError(f"{self!r}: a projection has no row format of its own; use its parent's")

    def window(self, out: Output, at: int, k: int) -> Output:
        raise TypeError(f"{self!r}: a projection gathers through its own outputs only")

    def spans(self) -> dict:
        raise TypeError(f"{self!r}: a projection has no spans of its own; use its parent's")

    def close(self) -> None:
        """Drop the references to the parent's memory (the parent's files stay open)."""
        self._fields, self._kernel_store, self._bases, self._maps = {}, (), [], []

    def __repr__(self) -> str:
        return f"{self.parent!r}.project({list(self.names)})"


class ArrayDataset(Dataset):
    """A dataset over arrays in memory.

    Parameters
    ----------
    data : structured ndarray of shape (n,), or mapping of str to ndarray of shape (n, ...)
        A structured array is AoS, a mapping of arrays SoA. Arrays that are already C-contiguous
        (and, for a mapping, of a numeric or bool dtype) are used without a copy.
    layout : {"aos", "soa"}, list of lists of str, or None
        None keeps the layout of ``data``. Asking for another layout copies once, here:
        to :attr:`Spec.aos_dtype` records, to one C-contiguous array per field, or (a grouping,
        see :class:`tfdata.ReplayBuffer`) to one record array per group of several fields.
    allocator : str or tfdata.alloc.Allocator, optional
        Where that copy (and :meth:`new_output` blocks made without an allocator) comes from;
        see :mod:`tfdata.alloc`.
    memory_budget : int or str, optional
        Bytes the copy may take; :class:`tfdata.MemoryBudgetError` before copying if it is more.

    Raises
    ------
    SpecError
        Fields of different lengths, a 0-d field, a non-numeric dtype, or a record array that is
        not 1-D.
    """

    def __init__(self, data, layout=None, *, allocator=None, memory_budget=None):
        from . import alloc
        from ._budget import check_budget, parse_bytes

        a = alloc.resolve(allocator)
        budget = None if memory_budget is None else parse_bytes("memory_budget", memory_budget)
        if isinstance(data, np.ndarray) and data.dtype.names is not None:
            if data.ndim != 1:
                raise SpecError(f"records: expected a 1-D structured array, got shape {data.shape}")
            spec = _spec_of_records(data.dtype)
            records, cols = data, None
        elif isinstance(data, Mapping):
            if not data:
                raise SpecError("data: expected at least one field")
            cols = {}
            lengths = {}
            for name, v in data.items():
                arr = np.asarray(v)
                if arr.ndim == 0:
                    raise SpecError(f"field {name!r}: expected an array of shape (rows, ...), got a scalar")
                cols[name] = arr
                lengths[name] = arr.shape[0]
            if len(set(lengths.values())) != 1:
                raise SpecError(f"every field needs the same number of rows, got {lengths}")
            spec = Spec({k: Field(k, v.dtype, v.shape[1:]) for k, v in cols.items()})
            records = None
        else:
            raise SpecError(f"data: expected a structured ndarray or a mapping of arrays, got {type(data).__name__}")
        rows = arrange(spec, records, cols, None if layout is None else resolve_layout(layout, spec), a,
                       lambda parts, what: check_budget(budget, parts, what))
        self._bind(spec, rows.records, rows.columns, rows.layout if rows.blocks is not None else None,
                   rows.blocks)
        self._allocator = a

    @property
    def nbytes(self) -> int:
        """Bytes of the rows held in memory."""
        return self._n * self.row_nbytes


def _spec_of_records(dtype: np.dtype) -> Spec:
    fields = []
    for name in dtype.names:
        sub = dtype.fields[name][0]
        fields.append(Field(name, sub.base, sub.shape))  # SpecError names a non-numeric field
    return Spec(fields)


class MmapDataset(_MappedPages, Dataset):
    """A dataset over a file, memory-mapped read-only: rows are read from the page cache on demand.

    Open one with :meth:`open`. The data is never loaded as a whole: only the pages a batch
    touches are read, and a :class:`~tfdata.loader.DataLoader` releases pages it has consumed
    (``release``), so a file far larger than memory can be streamed with a bounded resident set.

    Attributes
    ----------
    path : str
    mapped_nbytes : int
        Bytes of data mapped (the file sizes minus headers).
    metadata : mapping
        The ``"metadata"`` object of a directory's manifest (``tfdata.io.Writer(...,
        metadata=)``, :func:`tfdata.datasets.from_minari`), read-only (nested objects too, lists
        as tuples); empty for an AoS file or a manifest without one.
    """

    @classmethod
    def open(cls, path) -> "MmapDataset":
        """Open an AoS ``.npy`` file, an SoA directory or a grouped directory written by
        :func:`tfdata.io.save` (or numpy).

        Raises
        ------
        FileNotFoundError
            ``path`` does not exist.
        tfdata.errors.FormatError
            A header that disagrees with the file size, an unknown manifest version, a non-numeric
            or object field, a record array that is not 1-D: the message names the file.
        """
        path = os.fspath(path)
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path}: no such dataset file or directory")
        self = cls.__new__(cls)
        self.path = path
        if os.path.isdir(path):
            metadata = _io.read_metadata(path)  # checked before anything is mapped
            spec, rows, self._maps = _io.map_directory(path)
            self._bind(spec, **rows)
            self.metadata = _frozen(metadata)
        else:
            records, mf = _io.map_npy(path)
            if records.dtype.names is None or records.ndim != 1:
                mf.close()
                raise FormatError(f"{path}: expected a 1-D structured array (one record per row), "
                                      f"got {records.dtype}{list(records.shape)}; "
                                      "use a directory of per-field .npy files for columns")
            spec = _io.spec_of_dtype(records.dtype, path)
            self._maps = [(mf, records.dtype.itemsize)]
            self._bind(spec, records=records)
        self.mapped_nbytes = self._n * self.row_nbytes
        return self

    def __init__(self, *args, **kwargs):
        raise TypeError("use MmapDataset.open(path)")

    @property
    def _bases(self):  # what touch faults in: every byte view of the file(s)
        return self._kernel_store

    def close(self) -> None:
        """Unmap the file(s) once no batch view still uses them."""
        maps, self._maps = getattr(self, "_maps", []), []
        self._fields = {}
        self._kernel_store = ()
        self.records = self.columns = self.blocks = None
        for mf, _ in maps:
            mf.close()


def _frozen(value):
    """A read-only copy of a JSON value: objects as mapping proxies, lists as tuples."""
    if isinstance(value, dict):
        return MappingProxyType({k: _frozen(v) for k, v in value.items()})
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    return value


def thawed(value):
    """A plain, writable copy of a JSON value :attr:`MmapDataset.metadata` holds (dicts and
    lists), as :func:`json.dumps` and :class:`tfdata.io.Writer` take it."""
    if isinstance(value, Mapping):
        return {k: thawed(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [thawed(v) for v in value]
    return value


def convert(src: str, dst: str, layout: str, chunk_bytes: int = 16 << 20, *,
            overwrite: bool = False) -> None:
    """Copy the dataset at ``src`` to ``dst`` in ``layout``, streaming, in bounded memory.

    ``dst`` must be a new path, or (``overwrite=True``) a tfdata dataset of that layout; it may
    not be ``src`` itself, inside it or contain it (ValueError, before anything is written). The
    copy appears at ``dst`` only once complete.

    Reads ``chunk_bytes`` of rows at a time from the memory-mapped source, appends them to a
    :class:`tfdata.io.Writer`, and releases the source pages it has read, so memory stays around two
    chunks whatever the size of the dataset. Converts between AoS files, SoA directories and
    grouped directories (``layout`` a list of groups of field names), or copies a plain numpy
    file into tfdata's format. The source's metadata goes with it when the destination is a
    directory (an AoS file keeps none).
    """
    src, dst = os.fspath(src), os.fspath(dst)
    rs, rd = os.path.realpath(src), os.path.realpath(dst)
    if (rs == rd or rd.startswith(rs + os.sep) or rs.startswith(rd + os.sep)
            or (os.path.exists(dst) and os.path.exists(src) and os.path.samefile(src, dst))):
        raise ValueError(f"convert: destination {dst!r} is the source {src!r} (or inside it, or "
                         f"holds it); converting a dataset onto itself would destroy it: write "
                         f"to a new path")
    with MmapDataset.open(src) as ds:
        step = _io.chunk_rows(ds.row_nbytes, chunk_bytes)
        keep = ds.metadata and _io.holds_metadata(_io.dataset_layout(layout, ds.spec))
        with _io.Writer(dst, ds.spec, layout, overwrite=overwrite, _publish_at_close=True,
                        metadata=thawed(ds.metadata) if keep else None) as w:
            for start in range(0, len(ds), step):
                stop = min(start + step, len(ds))
                w.append(ds.rows(start, stop))
                ds.release(start, stop)
