"""Writing datasets: :class:`Writer` (append, commit, reopen), :func:`save`. Every new dataset is
staged under a temporary name and renamed into place (:mod:`tfdata.storage.replace`)."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping

import numpy as np

from ..errors import FormatError, SpecError
from ..spec import Spec
from .manifest import (GROUPS_FORMAT, MANIFEST, directory_files, directory_format, group_entries,
                       group_header, metadata_problem, read_group_manifest, read_manifest,
                       read_metadata, soa_entries, write_group_manifest, write_manifest)
from .npy import check_header_text, header_nbytes, npy_header, read_npy_header, spec_of_dtype
from .replace import Staged, dataset_layout


def _columns_of(data) -> tuple[Spec, dict, np.dtype | None]:
    if isinstance(data, np.ndarray) and data.dtype.names is not None:
        if data.ndim != 1:
            raise SpecError(f"records: expected a 1-D structured array, got shape {data.shape}")
        spec = spec_of_dtype(data.dtype)
        return spec, {name: data[name] for name in spec.names}, data.dtype
    if isinstance(data, Mapping):
        cols = {k: np.asarray(v) for k, v in data.items()}
        lengths = {k: (v.shape[0] if v.ndim else None) for k, v in cols.items()}
        if len(set(lengths.values())) != 1 or None in lengths.values():
            raise SpecError(f"every field needs the same number of rows, got {lengths}")
        spec = Spec({k: (v.dtype, v.shape[1:]) for k, v in cols.items()})
        return spec, cols, None
    raise TypeError(f"expected a structured ndarray or a mapping of arrays, got {type(data).__name__}")


def holds_metadata(layout) -> bool:
    """Whether a dataset of ``layout`` (resolved) keeps metadata: directories do, in their
    manifest; an AoS file has only its NPY header, which numpy reads up to 10000 bytes."""
    return layout != "aos"


def chunk_rows(row_nbytes: int, chunk_bytes: int = 16 << 20) -> int:
    """Rows of ``row_nbytes`` bytes in a chunk of about ``chunk_bytes`` (at least one): how many
    rows a copy into or out of a file moves at a time."""
    return max(1, chunk_bytes // max(1, row_nbytes))


def save(path: str, data, layout: str = "aos", *, overwrite: bool = False) -> None:
    """Write ``data`` as an AoS ``.npy`` file or an SoA directory.

    Parameters
    ----------
    path : str
        File (``layout="aos"``) or directory (``"soa"``, a grouping).
    data : structured ndarray of shape (rows,), or mapping of str to ndarray of shape (rows, ...)
    layout : {"aos", "soa"} or list of lists of str
        A grouping (see :func:`tfdata.storage.resolve_layout`) writes a grouped directory.
    overwrite : bool, default False
        As for :class:`Writer`; the dataset is renamed into place only when complete, so a
        failure leaves ``path`` as it was.

    Notes
    -----
    The AoS record is :attr:`Spec.aos_dtype` (aligned, itemsize a multiple of 8) unless ``data``
    already is a structured array, whose dtype is kept. Rows go through a :class:`Writer` in
    chunks of about 16 MiB, so saving needs no second copy of ``data``.
    """
    spec, cols, dtype = _columns_of(data)
    rows = len(next(iter(cols.values())))
    with Writer(path, spec, layout, dtype=dtype if layout == "aos" else None, overwrite=overwrite,
                _publish_at_close=True) as w:
        step = chunk_rows(spec.row_nbytes)
        for start in range(0, rows, step):
            if dtype is not None and layout == "aos":  # records as they are: no per-field copy
                w.append_records(data[start:start + step])
            else:
                w.append({k: v[start:start + step] for k, v in cols.items()})


def _not_appendable(path: str) -> FormatError:
    """The refusal to append to a file whose header cannot grow in place (not tfdata's)."""
    return FormatError(f"{path}: not written by tfdata (its header cannot grow in place); "
                       "copy it with tfdata.io.convert to append")


def _lock_free(path: str) -> bool:
    """Whether no :class:`Writer` holds the dataset at ``path`` (its first file's ``flock``)."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no locks
        return True
    first = path
    if os.path.isdir(path):
        try:
            first = directory_files(path)[0]
        except (FormatError, OSError, IndexError):
            return True
    try:
        fd = os.open(first, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def _pwrite_all(fd: int, data, offset: int) -> None:
    view = memoryview(data).cast("B")
    while view.nbytes:
        n = os.pwrite(fd, view, offset)
        view = view[n:]
        offset += n


class _Part:
    """One data file a writer appends to: the AoS file, or one field file of an SoA directory."""

    def __init__(self, path: str, dtype: np.dtype, row_shape: tuple, rows: int, create: bool, mark: bool):
        self.path = path
        self.mark = mark
        self.dtype = dtype
        self.row_shape = tuple(row_shape)
        self.row_nbytes = int(dtype.itemsize * int(np.prod(self.row_shape, dtype=np.int64)))
        self.offset = header_nbytes(dtype, self.row_shape)
        # create: the path is a file this writer made (empty) or a new name in a directory it
        # made; an existing dataset is opened without truncation and never followed as a link
        flags = os.O_RDWR | (os.O_CREAT if create else getattr(os, "O_NOFOLLOW", 0))
        self.fd = os.open(path, flags, 0o644)
        if not create and not stat.S_ISREG(os.fstat(self.fd).st_mode):
            os.close(self.fd)
            self.fd = None
            raise FormatError(f"{path}: not a regular file")
        if create:
            _pwrite_all(self.fd, npy_header(dtype, (rows,) + self.row_shape, mark), 0)

    def write(self, row: int, data: np.ndarray) -> None:
        _pwrite_all(self.fd, np.ascontiguousarray(data), self.offset + row * self.row_nbytes)

    def sync(self) -> None:
        os.fdatasync(self.fd)

    def set_rows(self, rows: int) -> None:
        _pwrite_all(self.fd, npy_header(self.dtype, (rows,) + self.row_shape, self.mark), 0)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class Writer:
    """Append rows to a dataset file and commit them; readers see exactly the committed rows.

    Parameters
    ----------
    path : str
        The AoS ``.npy`` file or the SoA (grouped) directory to create. To append to an existing
        dataset use :meth:`open`.
    spec : Spec or mapping
        The fields of a row.
    layout : {"aos", "soa"} or list of lists of str
        A grouping (see :func:`tfdata.storage.resolve_layout`) writes a grouped directory.
    dtype : numpy.dtype, optional
        AoS only: the record dtype (default :attr:`Spec.aos_dtype`).
    overwrite : bool, default False
        An existing ``path`` is refused (FileExistsError) unless this is True and it is a tfdata
        dataset of the same layout that no other writer holds. The new, empty dataset is built
        under a temporary name and renamed into place, so a reader that has the old one open
        keeps reading the old data.

    Notes
    -----
    Protocol of :meth:`commit`: the appended data is written past the committed rows and
    flushed to disk (``fdatasync``) first; then the row count in each file's header is
    rewritten in place (one write of the header, which never changes length), flushed; for a
    directory the manifest, which holds the count readers trust, is replaced last
    (write, fsync, atomic rename). A process killed at any point leaves a dataset whose readers
    see the rows of the last completed commit, intact, and which :meth:`open` can append to.
    The uncommitted tail is overwritten by the next append. (A power failure additionally relies
    on the filesystem ordering the header write after the flushed data, which ext4 and xfs do
    for an ``fdatasync`` that returned.)

    One writer per dataset: the writer holds an exclusive ``flock`` on its first file and a
    second writer gets an error. Readers need no lock.
    """

    def __init__(self, path: str, spec, layout="aos", *, dtype: np.dtype | None = None,
                 overwrite: bool = False, metadata: dict | None = None, _append: bool = False,
                 _rows: int = 0, _publish_at_close: bool = False):
        self.path = os.fspath(path)
        self._parts = None
        self._staged = None
        self.spec = Spec(spec)
        layout = dataset_layout(layout, self.spec)
        self.layout = layout
        self.rows = _rows  # committed
        self.pending = 0
        create = not _append
        # everything that can refuse runs before a file is made
        self._files = None  # a directory's files: (name, dtype, row_shape, spec indices, records)
        if metadata is not None:
            if not holds_metadata(layout):
                raise ValueError(f"{self.path}: metadata: an AoS file has no manifest to keep it "
                                 f"in; write a directory (layout='soa' or a grouping)")
            problem = metadata_problem(metadata)
            if problem is not None:
                raise ValueError(f"{self.path}: metadata: {problem}")
        self.metadata = metadata
        if layout == "aos":
            self.dtype = np.dtype(dtype) if dtype is not None else self.spec.aos_dtype
            if self.dtype.names is None or spec_of_dtype(self.dtype) != self.spec:
                raise SpecError(f"dtype {self.dtype} does not hold the fields of {self.spec}")
            check_header_text(self.dtype, self.path)
        elif layout == "soa":
            self._entries = soa_entries(self.spec)
            self._files = [(fname, f.dtype, f.shape, [i], False)
                           for i, (f, fname) in enumerate(self._entries)]
        else:
            self._entries = group_entries(self.spec, layout)
            index = {n: i for i, n in enumerate(self.spec.names)}
            self._files = [(fname, dt, sh, [index[n] for n in g], len(g) > 1)
                           for g, dt, sh, fname in self._entries]
            for _, dt, _, _, records in self._files:
                if records:
                    check_header_text(dt, self.path)
        if create:
            self._staged = Staged(self.path, layout, overwrite)
            if os.path.lexists(self.path) and not _lock_free(self.path):
                self._staged.discard()
                raise RuntimeError(f"{self.path}: another writer has it open; not replaced")
        self._dir = self._staged.tmp if create and self._files is not None else self.path
        try:
            if layout == "aos":
                where = self._staged.tmp if create else self.path
                self._parts = [_Part(where, self.dtype, (), self.rows, create, True)]
            else:
                self._parts = [_Part(os.path.join(self._dir, fname), dt, sh, self.rows, create, False)
                               for fname, dt, sh, _, _ in self._files]
                if create:
                    self._write_manifest(0)
            try:
                import fcntl

                fcntl.flock(self._parts[0].fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except ImportError:  # not POSIX: no lock
                pass
            except OSError:
                raise RuntimeError(f"{self.path}: another writer has it open") from None
            if create and not _publish_at_close:  # readers see the new, empty dataset now
                self._publish()
        except BaseException:
            self._close_parts()
            if self._staged is not None:
                self._staged.discard()
            raise

    def _check_open(self) -> None:
        if self._parts is None:
            raise ValueError(f"{self.path}: writer is closed")

    def _publish(self) -> None:
        self._staged.publish()
        self._staged = None
        self._dir = self.path
        if self._files is None:
            self._parts[0].path = self.path
        else:
            for part, (fname, _, _, _, _) in zip(self._parts, self._files):
                part.path = os.path.join(self.path, fname)

    def _write_manifest(self, rows: int) -> None:
        if self.layout == "soa":
            write_manifest(self._dir, rows, self._entries, self.metadata)
        else:
            write_group_manifest(self._dir, rows, self.spec, self._entries, self.metadata)

    @classmethod
    def open(cls, path: str) -> "Writer":
        """Open a dataset tfdata wrote for appending after its committed rows."""
        path = os.fspath(path)
        if os.path.isdir(path) and directory_format(path) == GROUPS_FORMAT:
            rows, spec, groups, files = read_group_manifest(path)
            for g, (fpath, dt, sh) in zip(groups, files):
                h = group_header(fpath, g, dt, sh, rows)
                if h.offset != header_nbytes(dt, sh):
                    raise _not_appendable(fpath)
            try:
                return cls(path, spec, groups, metadata=read_metadata(path) or None, _append=True,
                           _rows=rows)
            except SpecError as exc:
                raise FormatError(f"{os.path.join(path, MANIFEST)}: {exc}") from None
        if os.path.isdir(path):
            rows, entries = read_manifest(path)
            for field, fpath in entries:
                h = read_npy_header(fpath, allow_tail=True, follow=False)
                if h.offset != header_nbytes(field.dtype, field.shape):
                    raise _not_appendable(fpath)
            try:
                return cls(path, Spec([f for f, _ in entries]), "soa",
                           metadata=read_metadata(path) or None, _append=True, _rows=rows)
            except SpecError as exc:  # a field name the manifest allows but no file name can be
                raise FormatError(f"{os.path.join(path, MANIFEST)}: {exc}") from None
        if os.path.islink(path):  # appending writes in place: through a link it would write elsewhere
            raise FormatError(f"{path}: is a symbolic link; open the file it points to "
                              f"({os.path.realpath(path)}) to append")
        h = read_npy_header(path)
        if h.version is None:
            raise _not_appendable(path)
        if h.dtype.names is None or len(h.shape) != 1:
            raise FormatError(f"{path}: expected a 1-D structured array, got {h.dtype}{list(h.shape)}")
        if h.offset != header_nbytes(h.dtype):
            raise FormatError(f"{path}: header of {h.offset} bytes, expected {header_nbytes(h.dtype)}")
        return cls(path, spec_of_dtype(h.dtype, path), "aos", dtype=h.dtype, _append=True, _rows=h.shape[0])

    def append(self, batch) -> int:
        """Write ``n`` rows after the last appended ones (not yet visible to readers).

        Parameters
        ----------
        batch : mapping of str to array of shape ``(n, *field.shape)``
            Validated by the spec first: a rejected batch writes nothing.

        Returns
        -------
        int
            ``n``.
        """
        self._check_open()
        n, values = self.spec.check_batch(batch)
        if n == 0:
            return 0
        row = self.rows + self.pending
        if self._files is None:
            records = np.empty(n, self.dtype)
            for name, v in zip(self.spec.names, values):
                records[name] = v
            self._parts[0].write(row, records)
        else:
            names = self.spec.names
            for part, (_, dt, _, fields, records) in zip(self._parts, self._files):
                if records:  # a group of several fields: its records, padding zeroed
                    block = np.zeros(n, dt)
                    for i in fields:
                        block[names[i]] = values[i]
                    part.write(row, block)
                else:
                    part.write(row, values[fields[0]])
        self.pending += n  # only once every byte is written: a failed write commits nothing
        return n

    def append_blocks(self, blocks) -> int:
        """Grouped directories only: append one array per group, each of exactly its file's
        dtype and row shape and the same number of rows, as is (a storage's group blocks:
        :meth:`tfdata.storage.GroupStorage.append_to`)."""
        self._check_open()
        if not isinstance(self.layout, tuple):
            raise ValueError(f"{self.path}: append_blocks needs a grouped directory; use append")
        blocks = list(blocks)
        if len(blocks) != len(self._files):
            raise SpecError(f"blocks: expected {len(self._files)} arrays (one per group), got {len(blocks)}")
        n = blocks[0].shape[0] if blocks and isinstance(blocks[0], np.ndarray) and blocks[0].ndim else -1
        for b, (fname, dt, sh, _, _) in zip(blocks, self._files):
            if not isinstance(b, np.ndarray) or b.dtype != dt or b.shape != (n,) + tuple(sh):
                got = f"{b.dtype}{list(b.shape)}" if isinstance(b, np.ndarray) else type(b).__name__
                raise SpecError(f"blocks: {fname}: expected {dt}{[max(n, 0), *sh]}, got {got}")
        if n:
            row = self.rows + self.pending
            for part, b in zip(self._parts, blocks):
                part.write(row, b)
            self.pending += n
        return n

    def append_records(self, records: np.ndarray) -> int:
        """AoS only: append a 1-D structured array of exactly this file's record dtype, as is
        (no per-field copy: a contiguous block is written straight from its memory)."""
        self._check_open()
        if self.layout != "aos":
            raise ValueError(f"{self.path}: append_records needs an AoS file; use append")
        if not isinstance(records, np.ndarray) or records.dtype != self.dtype or records.ndim != 1:
            got = f"{records.dtype}{list(records.shape)}" if isinstance(records, np.ndarray) else type(records).__name__
            raise SpecError(f"records: expected a 1-D array of dtype {self.dtype}, got {got}")
        n = records.shape[0]
        if n:
            self._parts[0].write(self.rows + self.pending, records)
            self.pending += n
        return n

    def commit(self) -> int:
        """Make every appended row visible to readers (see the class notes); returns the row count."""
        self._check_open()
        if self.pending == 0:
            return self.rows
        rows = self.rows + self.pending
        for part in self._parts:
            part.sync()
        for part in self._parts:
            part.set_rows(rows)
            part.sync()
        if self._files is not None:
            self._write_manifest(rows)
        self.rows, self.pending = rows, 0
        return rows

    def _close_parts(self) -> None:
        for part in self._parts or ():
            part.close()
        self._parts = None

    def close(self, commit: bool = True) -> None:
        """Commit (unless ``commit=False``) and close the files."""
        if self._parts is None:
            return
        try:
            if commit:
                self.commit()
                if self._staged is not None:  # save / convert: the whole dataset appears at once
                    self._publish()
        finally:
            self._close_parts()
            if self._staged is not None:  # not published: nothing of it stays
                self._staged.discard()
                self._staged = None

    def __enter__(self) -> "Writer":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(commit=exc_type is None)  # an exception inside the block commits nothing more

    def __del__(self):
        try:
            self._close_parts()  # no commit from a finalizer: only what was committed counts
            if getattr(self, "_staged", None) is not None:
                self._staged.discard()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
