"""Memory maps: read-only maps of checked dataset files (with the page advice that bounds a
long scan's resident set), and the writable shared maps of new files (:func:`create`, a
spilling buffer's :func:`map_storage`, a shared buffer's :func:`create_region`)."""

from __future__ import annotations

import mmap
import os

import numpy as np

from ..errors import FormatError
from ..spec import Spec
from .manifest import (GROUPS_FORMAT, directory_format, group_entries, group_header,
                       read_group_manifest, read_manifest, soa_entries, write_group_manifest,
                       write_manifest)
from .npy import PAGE, check_header_text, header_nbytes, npy_header, read_npy_header
from .replace import Staged, dataset_layout


class MappedFile:
    """A read-only memory map of one file, with page advice.

    Parameters
    ----------
    path : str
    offset : int
        Byte offset of the array data in the file.

    Attributes
    ----------
    nbytes : int
        Size of the file.
    """

    def __init__(self, path: str, offset: int, writable: bool = False):
        self.path = path
        self.offset = offset
        with open(path, "r+b" if writable else "rb") as f:
            self.nbytes = os.fstat(f.fileno()).st_size
            # length 0 is not mappable: an empty dataset maps nothing. A writable map is shared:
            # writes reach the page cache and the file, and released pages lose nothing.
            access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
            self._mm = mmap.mmap(f.fileno(), 0, access=access) if self.nbytes else None

    def array(self, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        """An ndarray over the mapped data (no copy); read-only unless the map is writable."""
        if self._mm is None:
            return np.empty(shape, dtype)
        count = int(np.prod(shape, dtype=object))
        return np.frombuffer(self._mm, dtype=dtype, count=count, offset=self.offset).reshape(shape)

    def at(self, offset: int, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        """An ndarray over the mapped bytes from ``offset`` of the file (no copy); the caller
        guarantees the range lies inside the file."""
        count = int(np.prod(shape, dtype=object))
        if count == 0 or self._mm is None:
            return np.zeros(shape, dtype)
        return np.frombuffer(self._mm, dtype=dtype, count=count, offset=offset).reshape(shape)

    def _advise(self, advice: int, start: int, stop: int) -> None:
        if self._mm is None:
            return
        start = max(0, start) // PAGE * PAGE  # outward to whole pages: a page dropped too
        stop = min(self.nbytes, -(-stop // PAGE) * PAGE)  # early is only read again
        if stop > start:
            self._mm.madvise(advice, start, stop - start)

    def release(self, start: int, stop: int) -> None:
        """Drop the pages of data bytes ``[start, stop)`` from this process (``MADV_DONTNEED``).

        The mapping is read-only and file-backed, so this loses nothing: a later read of those
        bytes faults the page in again from the page cache or the disk.
        """
        self._advise(mmap.MADV_DONTNEED, self.offset + start, self.offset + stop)

    def willneed(self, start: int, stop: int) -> None:
        """Ask the kernel to read data bytes ``[start, stop)`` ahead (``MADV_WILLNEED``)."""
        self._advise(mmap.MADV_WILLNEED, self.offset + start, self.offset + stop)

    def hugepages(self) -> None:
        """Advise transparent huge pages over the whole map (``MADV_HUGEPAGE``). For a file in
        shared memory the kernel honours it only where
        ``/sys/kernel/mm/transparent_hugepage/shmem_enabled`` is ``advise`` or ``always``."""
        if self._mm is not None and hasattr(mmap, "MADV_HUGEPAGE"):
            try:
                self._mm.madvise(mmap.MADV_HUGEPAGE)
            except OSError:  # a kernel without transparent huge pages
                pass

    def sequential(self) -> None:
        """Advise sequential access over the whole map (larger kernel read-ahead)."""
        if self._mm is not None:
            self._mm.madvise(mmap.MADV_SEQUENTIAL)

    def close(self) -> None:
        """Unmap, if no array still uses the map (numpy views keep it alive otherwise)."""
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:  # exported views still alive: the map lives as long as they do
                pass


class ResidentFile:
    """File-backed resident bytes of this process (``/proc/self/statm``, field 3), one small read.

    Where that file does not exist (not Linux), reports 0: pages are then never released early.
    """

    def __init__(self):
        try:
            self._fd = os.open("/proc/self/statm", os.O_RDONLY)
        except OSError:
            self._fd = None

    def file_bytes(self) -> int:
        if self._fd is None:
            return 0
        return int(os.pread(self._fd, 128, 0).split()[2]) * PAGE

    def __del__(self):
        if getattr(self, "_fd", None) is not None:
            os.close(self._fd)
            self._fd = None


def map_npy(path: str) -> tuple[np.ndarray, MappedFile]:
    """Memory-map a checked ``.npy`` file read-only; returns ``(array, mapped_file)``."""
    h = read_npy_header(path)
    mf = MappedFile(path, h.offset)
    return mf.array(h.dtype, h.shape), mf


def map_soa(path: str) -> tuple[Spec, dict, list[MappedFile]]:
    """Memory-map every field of the SoA directory ``path`` after checking each header.

    Returns ``(spec, columns, mapped_files)``; ``columns[name]`` is read-only with shape
    ``(rows, *field.shape)``.
    """
    rows, entries = read_manifest(path)
    columns, maps = {}, []
    for field, fpath in entries:
        # the manifest is this directory's version mark; field files are never links
        h = read_npy_header(fpath, allow_tail=True, follow=False)
        want = (rows,) + field.shape
        # a field file may hold more rows than the manifest: a commit that stopped between the
        # field headers and the manifest; the manifest's count is the committed one
        if (h.dtype != field.dtype or h.shape[1:] != field.shape or not h.shape
                or h.shape[0] < rows):
            raise FormatError(f"{fpath}: field {field.name!r}: manifest says {field.dtype}{list(want)}, "
                              f"file holds {h.dtype}{list(h.shape)}")
        mf = MappedFile(fpath, h.offset)
        columns[field.name] = mf.array(h.dtype, want)
        maps.append(mf)
    return Spec([f for f, _ in entries]), columns, maps


def map_groups(path: str) -> tuple[Spec, tuple, tuple, list[MappedFile]]:
    """Memory-map every group file of the grouped directory ``path`` after checking each header
    against the manifest (exactly the dtype and row shape of its group).

    Returns ``(spec, groups, blocks, mapped_files)``; ``blocks[k]`` is read-only, ``(rows,)``
    records of group ``k`` or ``(rows, *field.shape)`` for a group of one field.
    """
    rows, spec, groups, files = read_group_manifest(path)
    blocks, maps = [], []
    for g, (fpath, dtype, shape) in zip(groups, files):
        h = group_header(fpath, g, dtype, shape, rows)
        mf = MappedFile(fpath, h.offset)
        blocks.append(mf.array(dtype, (rows,) + shape))
        maps.append(mf)
    return spec, groups, tuple(blocks), maps


def map_directory(path: str) -> tuple[Spec, dict, list]:
    """Map the dataset directory ``path`` (SoA or grouped, by its manifest).

    Returns ``(spec, rows, maps)``: ``rows`` the keyword arguments of
    :class:`tfdata.storage.rows.Rows` (``columns``, or ``groups`` and ``blocks``) and ``maps``
    ``[(MappedFile, row_bytes), ...]`` in the order of the rows' byte views.
    """
    if directory_format(path) == GROUPS_FORMAT:
        spec, groups, blocks, maps = map_groups(path)
        widths = [b.dtype.itemsize * int(np.prod(b.shape[1:], dtype=np.int64)) for b in blocks]
        return spec, {"groups": groups, "blocks": blocks}, list(zip(maps, widths))
    spec, columns, maps = map_soa(path)
    return spec, {"columns": columns}, [(mf, f.nbytes) for mf, f in zip(maps, spec)]


def create_region(path: str, nbytes: int) -> MappedFile:
    """Create the file ``path`` (which must not exist) of ``nbytes`` zero bytes, with its space
    reserved, and map it writable and shared (the backing of a shared-memory buffer).

    The space is reserved up front (``posix_fallocate``): on a tmpfs such as ``/dev/shm`` a full
    file system then fails here, with an OSError naming the file and the size, rather than
    killing a process with SIGBUS when it first writes a page that cannot be had.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        if hasattr(os, "posix_fallocate"):
            try:
                os.posix_fallocate(fd, 0, nbytes)
            except OSError as exc:
                free = os.statvfs(os.path.dirname(path) or ".")
                raise OSError(exc.errno, f"{path}: cannot reserve {nbytes} bytes for a shared "
                              f"buffer ({exc.strerror}); the file system has "
                              f"{free.f_bavail * free.f_frsize} bytes free") from None
        else:  # pragma: no cover - every Linux has it
            os.ftruncate(fd, nbytes)
    finally:
        os.close(fd)
    return MappedFile(path, 0, writable=True)


def map_storage(path: str, spec, rows: int, layout) -> tuple[object, list]:
    """Create a dataset file of ``rows`` zero rows (sparse) and map it writable, shared.

    The backing of a spilling replay buffer: its storage arrays live in the file's pages.
    ``path`` must not exist (FileExistsError): a spill file is scratch storage that tfdata
    writes all over, so it never takes the place of anything.

    Returns
    -------
    data : structured ndarray of spec.aos_dtype, shape (rows,) for "aos"; for "soa" a dict of
        ndarray of shape ``(rows, *field.shape)``; for a grouping a tuple of one array per group
        (the backing :class:`tfdata.storage.GroupStorage` takes)
    maps : list of (MappedFile, row_bytes)
    """
    spec = Spec(spec)
    rows = int(rows)
    path = os.fspath(path)
    if os.path.lexists(path):
        raise FileExistsError(f"spill_path {path!r} exists; a spill file is the buffer's scratch "
                              f"storage and never replaces anything: delete it or choose a new path")
    layout, entries = _new_files(path, spec, layout)
    staged = Staged(path, layout, False)
    try:
        arrays, maps = [], []
        for fpath, dt, shape, mark in _dataset_files(staged.tmp, spec, rows, layout, entries):
            _create_npy(fpath, dt, shape, memmap=False, mark=mark)
            mf = MappedFile(fpath, header_nbytes(dt, shape[1:]), writable=True)
            arrays.append(mf.array(dt, shape))
            maps.append((mf, dt.itemsize * int(np.prod(shape[1:], dtype=np.int64))))
        if layout == "aos":
            out = arrays[0], maps
        elif layout == "soa":
            out = dict(zip(spec.names, arrays)), maps
        else:
            out = tuple(arrays), maps
        staged.publish()  # the maps follow the files: a rename keeps the inode
    except BaseException:
        staged.discard()
        raise
    return out


def create(path: str, spec, rows: int, layout: str = "aos", *, overwrite: bool = False) -> dict:
    """Create a dataset of ``rows`` zero rows and return writable memory-mapped fields.

    For filling a dataset larger than memory chunk by chunk::

        cols = tfdata.io.create("big.npy", spec, rows)
        for start in range(0, rows, chunk):
            cols["obs"][start:start + chunk] = ...
        del cols  # unmap; the data is in the file

    Parameters
    ----------
    path : str
    spec : Spec or mapping
    rows : int
    layout : {"aos", "soa"} or list of lists of str
        A grouping writes a grouped directory.
    overwrite : bool, default False
        As for :func:`~tfdata.storage.writer.save`: an existing ``path`` is replaced only if
        this is True and it is a tfdata dataset of the same layout (by a rename: readers of the
        old one keep it).

    Returns
    -------
    dict of str to numpy.memmap
        ``cols[name]`` has shape ``(rows, *field.shape)``. The file is sparse until written.
    """
    spec = Spec(spec)
    if isinstance(rows, bool) or not isinstance(rows, (int, np.integer)) or rows < 0:
        raise ValueError(f"rows must be a non-negative int, got {rows!r}")
    rows = int(rows)
    path = os.fspath(path)
    layout, entries = _new_files(path, spec, layout)
    staged = Staged(path, layout, overwrite)
    try:
        arrays = [_create_npy(fpath, dt, shape, mark=mark)
                  for fpath, dt, shape, mark in _dataset_files(staged.tmp, spec, rows, layout, entries)]
        if layout == "aos":
            cols = {name: arrays[0][name] for name in spec.names}
        elif layout == "soa":
            cols = dict(zip(spec.names, arrays))
        else:
            cols = {}
            for (g, _, _, _), block in zip(entries, arrays):
                cols.update({g[0]: block} if len(g) == 1 else {n: block[n] for n in g})
            cols = {n: cols[n] for n in spec.names}
        staged.publish()
    except BaseException:
        staged.discard()
        raise
    return cols


def _new_files(path: str, spec: Spec, layout) -> tuple:
    """``(layout, entries)`` of a new dataset at ``path``: the layout checked
    (:func:`~tfdata.storage.replace.dataset_layout`) and a directory's files
    (:func:`~tfdata.storage.manifest.soa_entries`, :func:`~tfdata.storage.manifest.group_entries`;
    None for AoS), every record dtype's header checked to be writable before a file is made."""
    layout = dataset_layout(layout, spec)
    entries = None
    if layout == "aos":
        check_header_text(spec.aos_dtype, path)
    elif layout == "soa":
        entries = soa_entries(spec)
    else:
        entries = group_entries(spec, layout)
        for _, dt, _, _ in entries:
            check_header_text(dt, path)
    return layout, entries


def _dataset_files(tmp: str, spec: Spec, rows: int, layout, entries) -> list:
    """``(path, dtype, shape, mark)`` of each data file of a new dataset staged at ``tmp`` (the
    file itself for AoS), in spec (group) order; a directory's manifest is written here."""
    if layout == "aos":
        return [(tmp, spec.aos_dtype, (rows,), True)]
    if layout == "soa":
        write_manifest(tmp, rows, entries)
        return [(os.path.join(tmp, fname), f.dtype, (rows,) + f.shape, False) for f, fname in entries]
    write_group_manifest(tmp, rows, spec, entries)
    return [(os.path.join(tmp, fname), dt, (rows,) + sh, False) for _, dt, sh, fname in entries]


def _create_npy(path: str, dtype: np.dtype, shape: tuple[int, ...], memmap: bool = True,
                mark: bool = True) -> np.ndarray | None:
    header = npy_header(dtype, shape, mark)
    nbytes = int(np.prod(shape, dtype=object)) * dtype.itemsize
    with open(path, "wb") as f:
        f.write(header)
        f.truncate(len(header) + nbytes)  # sparse: no page is written until the caller writes it
    if not memmap:
        return None
    if nbytes == 0:
        return np.zeros(shape, dtype)
    return np.memmap(path, dtype=dtype, mode="r+", offset=len(header), shape=shape)
