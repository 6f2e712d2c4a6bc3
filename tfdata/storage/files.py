"""Files: the on-disk form of each layout (the file backing of :mod:`tfdata.storage`); the only
module that knows the on-disk byte layout and the only one that maps files.

Three forms, all readable without tfdata (``numpy.load(path, mmap_mode="r")``, or any NPY reader):

AoS file
    One ``.npy`` file (NPY format 1.0; 2.0 only for dtypes whose description exceeds 64 KiB)
    holding a 1-D C-ordered structured array, one record per row.
SoA directory
    One ``.npy`` file per field, shape ``(rows, *field.shape)``, plus ``manifest.json``::

        {"format": "tfdata.soa", "version": [1, 0], "rows": 1000,
         "fields": [{"name": "obs", "dtype": "<f4", "shape": [4], "file": "obs.npy"}, ...]}

Grouped directory (column groups, ``layout=[["obs", "action"], ["next_obs"]]``)
    One ``.npy`` file per group: a group of several fields is a 1-D record array (the fields in
    spec order at natural alignment, itemsize a multiple of 8: :func:`tfdata.storage.group_dtype`),
    a group of one field its plain array ``(rows, *field.shape)``; plus ``manifest.json``
    holding the spec (field order) and the grouping::

        {"format": "tfdata.groups", "version": [1, 0], "rows": 1000,
         "fields": [{"name": "obs", "dtype": "<f4", "shape": [4]}, ...],
         "groups": [{"fields": ["obs", "action"], "file": "0-obs.npy"},
                    {"fields": ["next_obs"], "file": "1-next_obs.npy"}]}

    The grouping is in normal form (see :func:`tfdata.storage.check_layout`): every field in
    exactly one group, each group's fields in spec order; a group's file holds exactly the
    dtype that grouping gives it.

Files tfdata writes (format 1.0):

* The NPY header is padded to a multiple of :data:`HEADER_BYTES` (4 KiB, or the page size if
  larger), so the data is page-aligned, and has room for any row count, so a commit rewrites
  it in place.
* Version: in an AoS file the header dict is followed by a comment, ``# tfdata 1.0`` (numpy's
  literal parser ignores it); in a directory the manifest holds it and the files'
  headers are padded with spaces only, as the NPY specification has it, so strict readers
  (checked: npyjs in JavaScript) read them. tfdata refuses another major version.
* The header's row count (the manifest's, for a directory) is the number of **committed**
  rows. Bytes after them are rows appended but not committed: readers ignore them, and
  ``numpy.load`` does too.

Headers are parsed with numpy's own header reader (``ast.literal_eval``, never pickle) and then
checked against the file size before anything is mapped: a header that promises more bytes
than the file holds, a dtype with object or non-numeric fields, a Fortran-ordered or
non-1-D record array are refused with a :class:`~tfdata.errors.FormatError` naming the file.
A mapping never extends past the end of the file, so a hostile file cannot make a read fault.

Memory mapping goes through :class:`MappedFile`, which also gives the page advice that keeps the
resident set of a long scan bounded (``release``: ``MADV_DONTNEED`` on pages already consumed;
``willneed``: read ahead). Writing goes through :class:`Writer` (append, commit).
"""

from __future__ import annotations

__all__ = ["MANIFEST", "SOA_FORMAT", "SOA_VERSION", "GROUPS_FORMAT", "GROUPS_VERSION", "read_group_manifest", "map_groups", "map_directory", "directory_format", "dataset_layout", "FORMAT_VERSION", "PAGE", "HEADER_BYTES", "NpyHeader", "MAX_NDIM", "MAX_NBYTES", "check_regular", "check_directory", "read_npy_header", "header_nbytes", "npy_header", "MappedFile", "ResidentFile", "map_npy", "spec_of_dtype", "read_json_doc", "read_manifest", "map_soa", "chunk_rows", "save", "fsync_dir", "check_replaceable", "remove_names", "Writer", "create_region", "map_storage", "create"]

import json
import mmap
import os
import re
import stat
import tempfile
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from ..errors import FormatError, SpecError
from ..spec import Field, Spec
from .groups import group_arrays
from .layout import check_layout, resolve_layout

MANIFEST = "manifest.json"
SOA_FORMAT = "tfdata.soa"
SOA_VERSION = (1, 0)
GROUPS_FORMAT = "tfdata.groups"
GROUPS_VERSION = (1, 0)
#: Version of the files tfdata writes (the ``# tfdata X.Y`` header comment). A reader refuses
#: another major version.
FORMAT_VERSION = (1, 0)
PAGE = mmap.PAGESIZE
#: Data of every file tfdata writes starts at a multiple of this: page-aligned on 4 KiB and
#: 16 KiB page systems, so memory-mapped views are aligned.
HEADER_BYTES = max(4096, PAGE)
_MARK = re.compile(r"# tfdata (\d+)\.(\d+)")
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")


# -- NPY headers ------------------------------------------------------------------------------


class NpyHeader(NamedTuple):
    """What :func:`read_npy_header` found."""

    dtype: np.dtype
    shape: tuple
    offset: int  # byte offset of the data
    file_size: int
    version: tuple | None  # tfdata format version, None for a file tfdata did not write


#: Most dimensions a header may give an array (numpy's own limit is 64; a row of a dataset has
#: a handful). Larger counts are a hostile header, refused with the file's name.
MAX_NDIM = 32
#: Largest element count times itemsize a header may declare (numpy's own limit).
MAX_NBYTES = (1 << 63) - 1


def check_regular(path: str, *, follow: bool = True, what: str = "file") -> os.stat_result:
    """Refuse (FormatError) anything at ``path`` that is not a regular file, before opening it.

    ``follow=False``: a symbolic link is refused too (files inside a dataset or checkpoint
    directory: a link could make tfdata read, or write, a file elsewhere). A FIFO, socket or
    device is refused without being opened (opening a FIFO blocks until a writer appears).
    FileNotFoundError if nothing is there.
    """
    st = os.stat(path) if follow else os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise FormatError(f"{path}: is a symbolic link; tfdata does not follow links inside a "
                          f"dataset or checkpoint directory")
    if not stat.S_ISREG(st.st_mode):
        raise FormatError(f"{path}: not a regular {what} (a directory, FIFO, socket or device)")
    return st


def check_directory(path: str, *, follow: bool = True) -> None:
    """Refuse (FormatError) anything at ``path`` that is not a directory (``follow=False``: or is a
    symbolic link to one)."""
    st = os.stat(path) if follow else os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise FormatError(f"{path}: is a symbolic link; tfdata does not follow links inside a "
                          f"dataset or checkpoint directory")
    if not stat.S_ISDIR(st.st_mode):
        raise FormatError(f"{path}: not a directory")


def read_npy_header(path: str, allow_tail: bool = False, *, follow: bool = True) -> NpyHeader:
    """Parse and check the header of the ``.npy`` file at ``path``.

    A file tfdata wrote carries its format version in a comment inside the header
    (``# tfdata 1.0``; numpy ignores it) and may hold bytes past the committed rows: rows
    appended but not committed, which a reader must not see. Any other file must hold exactly
    the bytes its header promises.

    Raises
    ------
    FileNotFoundError
        No such file.
    FormatError
        Not an NPY file, an unsupported NPY or tfdata format version, a header numpy cannot
        parse, Fortran order, an object dtype, fewer data bytes than the header promises, or
        (for a file tfdata did not write) more.
    """
    fmt = np.lib.format
    size = check_regular(path, follow=follow).st_size
    with open(path, "rb") as f:
        try:
            version = fmt.read_magic(f)
        except ValueError as exc:
            raise FormatError(f"{path}: not an NPY file ({exc})") from None
        if version not in ((1, 0), (2, 0)):
            raise FormatError(f"{path}: NPY version {version[0]}.{version[1]} is not supported (1.0, 2.0)")
        read = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
        try:
            # numpy parses the header dict with ast.literal_eval: no code runs, no pickle
            shape, fortran, dtype = read(f, max_header_size=1 << 20)
        except Exception as exc:  # noqa: BLE001 - any parse failure of a hostile header
            raise FormatError(f"{path}: unreadable NPY header ({type(exc).__name__}: {exc})") from None
        offset = f.tell()
        f.seek(8)
        hlen = int.from_bytes(f.read(2 if version == (1, 0) else 4), "little")
        text = f.read(hlen).decode("latin1")
    mark = _MARK.search(text)
    tf_version = (int(mark.group(1)), int(mark.group(2))) if mark else None
    if tf_version is not None and tf_version[0] != FORMAT_VERSION[0]:
        raise FormatError(f"{path}: tfdata format {tf_version[0]}.{tf_version[1]} is not supported "
                          f"(this tfdata reads {FORMAT_VERSION[0]}.x)")
    if fortran and len(shape) > 1:
        raise FormatError(f"{path}: Fortran-ordered arrays are not supported; save C-ordered data")
    if dtype.hasobject:
        raise FormatError(f"{path}: dtype {dtype} holds Python objects; refusing (no pickle)")
    if (not isinstance(shape, tuple) or len(shape) > MAX_NDIM
            or any((not isinstance(s, int)) or isinstance(s, bool) or s < 0 for s in shape)):
        raise FormatError(f"{path}: invalid shape {str(shape)[:200]} in header (at most {MAX_NDIM} "
                          f"non-negative integer dimensions)")
    nonzero = 1
    for s in shape:  # numpy refuses any shape whose non-zero dimensions overflow, even with a 0
        nonzero *= max(s, 1)
    if nonzero * max(dtype.itemsize, 1) > MAX_NBYTES:
        raise FormatError(f"{path}: shape {shape} of dtype {dtype} is larger than any array can be")
    expected = int(np.prod(shape, dtype=object)) * dtype.itemsize  # Python ints: no overflow
    if offset + expected > size or (offset + expected < size and tf_version is None and not allow_tail):
        raise FormatError(
            f"{path}: header says shape {shape} of dtype {dtype} ({expected} bytes of data from "
            f"byte {offset}), but the file has {size - offset} bytes of data"
            + (" (truncated?)" if offset + expected > size else " (trailing bytes)"))
    return NpyHeader(dtype, tuple(shape), offset, size, tf_version)


def _header_text(dtype: np.dtype, shape: tuple, mark: bool = True) -> str:
    descr = np.lib.format.dtype_to_descr(dtype)
    shape = tuple(int(x) for x in shape)
    text = "{'descr': %r, 'fortran_order': False, 'shape': %r, }" % (descr, shape)
    return text + (" # tfdata %d.%d" % FORMAT_VERSION if mark else "")


def header_nbytes(dtype: np.dtype, row_shape: tuple = ()) -> int:
    """Bytes of the header tfdata writes for this dtype: a multiple of :data:`HEADER_BYTES`,
    with room for any row count, so the header is rewritten in place on every commit."""
    longest = len(_header_text(dtype, (2**63 - 1,) + tuple(row_shape), True)) + 1 + 12
    return -(-longest // HEADER_BYTES) * HEADER_BYTES


def npy_header(dtype: np.dtype, shape: tuple, mark: bool = True) -> bytes:
    """The header tfdata writes: NPY 1.0 (2.0 for huge dtypes) padded so data starts page-aligned.

    ``mark``: append the ``# tfdata X.Y`` version comment (AoS files). The field files of an SoA
    directory go without it (the manifest carries the version), so their headers are padded
    with spaces only, as the NPY specification writes them, for strict readers.
    """
    total = header_nbytes(dtype, shape[1:])
    text = _header_text(dtype, shape, mark)
    if total - 10 <= 0xFFFF:
        prefix, hlen = b"\x93NUMPY\x01\x00", total - 10
        return prefix + hlen.to_bytes(2, "little") + (text.ljust(hlen - 1) + "\n").encode("latin1")
    hlen = total - 12
    return b"\x93NUMPY\x02\x00" + hlen.to_bytes(4, "little") + (text.ljust(hlen - 1) + "\n").encode("latin1")


def _check_header_text(dtype: np.dtype, path: str) -> None:
    """Refuse (SpecError) a record dtype whose NPY header cannot be written: the format stores
    it as latin-1, so a field name outside latin-1 fails, here before any file is made."""
    try:
        _header_text(dtype, (0,)).encode("latin1")
    except UnicodeEncodeError:
        bad = [n for n in (dtype.names or ()) if not n.isascii()]
        raise SpecError(f"{path}: field name(s) {bad} cannot be stored in an NPY header (latin-1 "
                        f"only); rename them or use layout='soa' with plain names") from None


# -- memory maps ------------------------------------------------------------------------------


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


def spec_of_dtype(dtype: np.dtype, path: str = "") -> Spec:
    """The :class:`Spec` of a structured dtype (field order kept; padding ignored)."""
    if dtype.names is None:
        raise FormatError(f"{path}: expected a structured dtype, got {dtype}")
    fields = []
    for name in dtype.names:
        sub = dtype.fields[name][0]
        try:
            fields.append(Field(name, sub.base, sub.shape))
        except SpecError as exc:
            raise FormatError(f"{path}: {exc}") from None
    return Spec(fields)


# -- SoA directories --------------------------------------------------------------------------


def read_json_doc(path: str, what: str, fmt, limit: int) -> dict:
    """Read the JSON object at ``path`` (at most ``limit`` bytes) whose ``"format"`` is ``fmt``
    (a string, or a tuple of those accepted).

    FileNotFoundError names ``what`` the missing file makes the directory not; anything else
    wrong is a FormatError naming the file.
    """
    if not os.path.lexists(path):
        raise FileNotFoundError(f"{os.path.dirname(path)}: not a {what} (no {os.path.basename(path)})")
    check_regular(path, follow=False)  # inside a directory: no link, no FIFO
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
        if len(data) > limit:
            raise FormatError(f"{path}: larger than {limit} bytes; not a {what}'s description")
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        if isinstance(exc, FormatError):
            raise
        raise FormatError(f"{path}: not valid JSON ({str(exc)[:200]})") from None
    except RecursionError:  # nesting deeper than the parser's stack: no document of ours is
        raise FormatError(f"{path}: JSON nested too deeply") from None
    formats = fmt if isinstance(fmt, tuple) else (fmt,)
    if not isinstance(doc, dict) or doc.get("format") not in formats:
        raise FormatError(f"{path}: format is not {' or '.join(map(repr, formats))}")
    return doc


def read_manifest(path: str) -> tuple[int, list[tuple[Field, str]]]:
    """Read and check ``manifest.json`` of the SoA directory ``path``.

    Returns ``(rows, [(field, file_path), ...])`` in field order.
    """
    mpath = os.path.join(path, MANIFEST)
    doc = read_json_doc(mpath, "tfdata SoA directory", SOA_FORMAT, 1 << 20)
    rows, entries = _manifest_head(mpath, doc, SOA_VERSION)
    out = []
    for e in entries:
        name, fname = e.get("name"), e.get("file")
        if not isinstance(fname, str) or not _SAFE_NAME.match(fname) or ".." in fname:
            raise FormatError(f"{mpath}: field {name!r}: file name {fname!r} is not a plain file name")
        out.append((_manifest_field(mpath, e), os.path.join(path, fname)))
    _manifest_spec(mpath, [f for f, _ in out])
    return rows, out


def _manifest_head(mpath: str, doc: dict, supported: tuple) -> tuple[int, list]:
    """``(rows, field entries)`` of a directory's manifest, its version checked."""
    version = doc.get("version")
    if (not isinstance(version, list) or len(version) != 2
            or not all(isinstance(v, int) for v in version)):
        raise FormatError(f"{mpath}: version must be [major, minor], got {version!r}")
    if version[0] != supported[0]:
        raise FormatError(f"{mpath}: format version {version[0]}.{version[1]} is not supported "
                          f"(this tfdata reads major version {supported[0]})")
    rows = doc.get("rows")
    if not isinstance(rows, int) or isinstance(rows, bool) or rows < 0:
        raise FormatError(f"{mpath}: rows must be a non-negative int, got {rows!r}")
    entries = doc.get("fields")
    if not isinstance(entries, list) or not entries:
        raise FormatError(f"{mpath}: fields must be a non-empty list")
    for e in entries:
        if not isinstance(e, dict):
            raise FormatError(f"{mpath}: each field must be an object, got {str(e)[:100]}")
    return rows, entries


def _manifest_field(mpath: str, e: dict) -> Field:
    """The field a manifest entry ``{"name", "dtype", "shape"}`` describes, checked."""
    name = e.get("name")
    shape = e.get("shape", ())
    if (not isinstance(shape, list) or len(shape) > MAX_NDIM
            or not all(type(d) is int and 0 <= d < (1 << 62) for d in shape)
            or not isinstance(e.get("dtype"), str) or len(e.get("dtype")) > 64):
        raise FormatError(f"{mpath}: field {str(name)[:100]!r}: dtype must be a short string and "
                          f"shape a list of at most {MAX_NDIM} non-negative ints, got "
                          f"{str(e.get('dtype'))[:100]!r}, {str(shape)[:100]}")
    try:
        return Field(name, e.get("dtype"), tuple(shape))
    except (SpecError, TypeError, ValueError, OverflowError) as exc:
        raise FormatError(f"{mpath}: {str(exc)[:300]}") from None


def _manifest_spec(mpath: str, fields: list) -> Spec:
    try:
        return Spec(fields)
    except (SpecError, ValueError, TypeError, OverflowError) as exc:  # numpy's own limits too
        raise FormatError(f"{mpath}: {str(exc)[:300]}") from None


def read_group_manifest(path: str) -> tuple:
    """Read and check ``manifest.json`` of the grouped directory ``path``.

    Returns ``(rows, spec, groups, [(file_path, dtype, row_shape), ...])``: the groups in
    normal form (:func:`tfdata.storage.check_layout`), and per group its file and the dtype and
    row shape that file must hold (:func:`tfdata.storage.group_arrays`).
    """
    mpath = os.path.join(path, MANIFEST)
    doc = read_json_doc(mpath, "tfdata grouped directory", GROUPS_FORMAT, 1 << 20)
    rows, entries = _manifest_head(mpath, doc, GROUPS_VERSION)
    spec = _manifest_spec(mpath, [_manifest_field(mpath, e) for e in entries])
    listed = doc.get("groups")
    if not isinstance(listed, list) or not all(isinstance(g, dict) for g in listed):
        raise FormatError(f"{mpath}: groups must be a list of objects, got {str(listed)[:100]}")
    try:
        groups = check_layout([g.get("fields") for g in listed], spec, "groups")
    except ValueError as exc:  # SpecError too
        raise FormatError(f"{mpath}: {str(exc)[:300]}") from None
    files = []
    for k, g in enumerate(listed):
        fname = g.get("file")
        if not isinstance(fname, str) or not _SAFE_NAME.match(fname) or ".." in fname or fname == MANIFEST:
            raise FormatError(f"{mpath}: group {k}: file name {str(fname)[:100]!r} is not a plain file name")
        files.append(fname)
    if len(set(files)) != len(files):
        raise FormatError(f"{mpath}: two groups name the same file")
    arrays = group_arrays(spec, groups)
    return rows, spec, groups, [(os.path.join(path, f), d, sh) for f, (d, sh) in zip(files, arrays)]


def directory_format(path: str) -> str:
    """The format of the dataset directory ``path`` (its manifest's ``"format"``:
    :data:`SOA_FORMAT` or :data:`GROUPS_FORMAT`), read and bounded, not yet checked."""
    return read_json_doc(os.path.join(path, MANIFEST), "tfdata dataset directory",
                         (SOA_FORMAT, GROUPS_FORMAT), 1 << 20)["format"]


def _directory_files(path: str) -> list[str]:
    """Paths of the data files the manifest of the dataset directory ``path`` names."""
    if directory_format(path) == GROUPS_FORMAT:
        return [f for f, _, _ in read_group_manifest(path)[3]]
    return [f for _, f in read_manifest(path)[1]]


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
        h = _group_header(fpath, g, dtype, shape, rows)
        mf = MappedFile(fpath, h.offset)
        blocks.append(mf.array(dtype, (rows,) + shape))
        maps.append(mf)
    return spec, groups, tuple(blocks), maps


def _group_header(fpath: str, group, dtype, shape, rows: int) -> NpyHeader:
    """The header of a group's file, which must hold the manifest's dtype and row shape and at
    least ``rows`` rows (more: a commit that stopped before the manifest, see :func:`map_soa`)."""
    h = read_npy_header(fpath, allow_tail=True, follow=False)
    if h.dtype != dtype or tuple(h.shape[1:]) != shape or not h.shape or h.shape[0] < rows:
        raise FormatError(f"{fpath}: group {list(group)}: manifest says {dtype}{[rows, *shape]}, "
                          f"file holds {h.dtype}{list(h.shape)}")
    return h


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


# -- writing ----------------------------------------------------------------------------------


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


def chunk_rows(row_nbytes: int, chunk_bytes: int = 16 << 20) -> int:
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
        An existing ``path`` is refused (FileExistsError) unless this is True and it is a tfdata
        dataset of the same layout. The new dataset is written under a temporary name beside
        ``path`` and renamed into place when complete: a failure leaves ``path`` as it was, and
        a reader that has the old file mapped keeps reading the old data.

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


def _soa_entries(spec: Spec) -> list[tuple[Field, str]]:
    entries = []
    for field in spec:
        fname = field.name + ".npy"
        if not _SAFE_NAME.match(fname) or ".." in fname:
            raise SpecError(f"field {field.name!r}: not usable as a file name (letters, digits, '_', '.', '-')")
        entries.append((field, fname))
    return entries


def fsync_dir(path: str) -> None:
    """Flush a directory's entries (a rename into it), where the file system allows it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems refuse fsync on directories
        pass
    finally:
        os.close(fd)


def _write_manifest(path: str, rows: int, entries) -> None:
    doc = {"format": SOA_FORMAT, "version": list(SOA_VERSION), "rows": rows,
           "fields": [{"name": f.name, "dtype": f.dtype.str, "shape": list(f.shape), "file": fname}
                      for f, fname in entries]}
    _replace_json(path, doc)


def _group_entries(spec: Spec, groups: tuple) -> list[tuple[tuple, np.dtype, tuple, str]]:
    """``(names, dtype, row_shape, file_name)`` of every group's file: ``<k>-<first field>.npy``
    (``<k>.npy`` if the field's name is no file name), unique by the group's index ``k``."""
    out = []
    for k, (g, (dtype, shape)) in enumerate(zip(groups, group_arrays(spec, groups))):
        fname = f"{k}-{g[0]}.npy"
        if not _SAFE_NAME.match(fname) or ".." in fname or len(fname) > 200:
            fname = f"{k}.npy"
        out.append((g, dtype, shape, fname))
    return out


def _write_group_manifest(path: str, rows: int, spec: Spec, entries) -> None:
    doc = {"format": GROUPS_FORMAT, "version": list(GROUPS_VERSION), "rows": rows,
           "fields": [{"name": f.name, "dtype": f.dtype.str, "shape": list(f.shape)} for f in spec],
           "groups": [{"fields": list(g), "file": fname} for g, _, _, fname in entries]}
    _replace_json(path, doc)


def _replace_json(path: str, doc: dict) -> None:
    tmp = os.path.join(path, MANIFEST + ".tmp")
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(path, MANIFEST))  # atomic: a reader sees the old or the new count
    fsync_dir(path)


# -- creating and replacing paths ---------------------------------------------------------------
#
# The rule (ARCHITECTURE.md, "Nothing is lost"): no call deletes or truncates a path it did not
# create, unless the path is a tfdata artifact of the same kind and the caller asked to
# overwrite it. Everything is written under a temporary name this call creates exclusively beside
# the target, then renamed into place; a process that has the old file mapped keeps its inode, so
# replacing a dataset never takes the pages from under a reader (truncating it did: SIGBUS).


def dataset_layout(layout, spec: Spec):
    """The layout of a dataset file: ``"aos"``, ``"soa"`` or a grouping normalised for ``spec``
    (:func:`tfdata.storage.resolve_layout`; no default here: ValueError for None)."""
    if layout is None or (isinstance(layout, str) and layout not in ("aos", "soa")):
        raise ValueError(f"layout: expected 'aos', 'soa' or a list of groups (lists of field "
                         f"names), got {str(layout)[:100]!r}")
    return resolve_layout(layout, spec)


def _kind(layout) -> str:
    return layout.upper() if isinstance(layout, str) else "grouped"


def check_replaceable(path: str, layout, overwrite: bool) -> bool:
    """Whether ``path`` exists, refusing (FileExistsError) what may not be replaced.

    An existing path may be replaced only with ``overwrite=True`` and only if it is a dataset of
    the same kind: for ``"aos"`` a regular file (not a link) with a readable NPY header of a 1-D
    structured array; for ``"soa"`` (a grouping) a directory (not a link) with a valid SoA
    (grouped, of any grouping) manifest that holds nothing but the manifest and the files it
    names.
    """
    if not os.path.lexists(path):
        return False
    if not overwrite:
        raise FileExistsError(f"{path}: exists; tfdata replaces a path only when asked "
                              f"(overwrite=True), and only a tfdata dataset of the same layout")
    try:
        if layout == "aos":
            h = read_npy_header(path, allow_tail=True, follow=False)
            if h.dtype.names is None or len(h.shape) != 1:
                raise FormatError(f"{path}: holds {h.dtype}{list(h.shape)}, not a 1-D record array")
        else:
            check_directory(path, follow=False)
            files = ([f for _, f in read_manifest(path)[1]] if layout == "soa"
                     else [f for f, _, _ in read_group_manifest(path)[3]])
            known = {MANIFEST, MANIFEST + ".tmp"} | {os.path.basename(f) for f in files}
            extra = sorted(set(os.listdir(path)) - known)
            if extra:
                raise FormatError(f"{path}: holds files that are not part of the dataset "
                                  f"({', '.join(extra[:5])}{', ...' if len(extra) > 5 else ''})")
            for f in files:
                if os.path.lexists(f):
                    check_regular(f, follow=False)
    except (FormatError, OSError) as exc:
        raise FileExistsError(f"{path}: exists and is not a tfdata {_kind(layout)} dataset, so "
                              f"it is not replaced ({exc})") from None
    return True


def _remove_dataset_dir(path: str) -> None:
    """Delete a dataset directory this module checked (``check_replaceable``) and moved aside:
    its manifest and the files it names, then the directory if nothing else is left."""
    try:
        names = [os.path.basename(f) for f in _directory_files(path)]
    except (FormatError, OSError):
        names = []
    remove_names(path, names + [MANIFEST, MANIFEST + ".tmp"])


def remove_names(path: str, names) -> None:
    """Delete the files ``names`` of the directory ``path``, then the directory if that left it
    empty. Never anything else: how tfdata removes what it made (a dataset moved aside, a
    shared region), so a file of the user's in the same directory survives."""
    for name in names:
        try:
            os.unlink(os.path.join(path, name))
        except OSError:
            pass
    try:
        os.rmdir(path)
    except OSError:
        pass


class _Staged:
    """A new dataset written under a temporary name beside ``path`` (made exclusively by this
    object: ``mkstemp`` / ``mkdtemp``, a dot name), then renamed into place by :meth:`publish`.
    :meth:`discard` removes the temporary name and nothing else."""

    def __init__(self, path: str, layout, overwrite: bool, what: str = "dataset"):
        self.path = path
        self.layout = layout
        self.overwrite = overwrite
        check_replaceable(path, layout, overwrite)
        parent = os.path.dirname(os.path.abspath(path))
        self.parent = parent
        prefix = "." + os.path.basename(os.path.abspath(path))[:100] + "."
        if layout != "aos":  # a directory
            self.tmp = tempfile.mkdtemp(prefix=prefix, suffix=".tmp", dir=parent)
        else:
            fd, self.tmp = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=parent)
            os.close(fd)

    def publish(self) -> None:
        """Rename the new dataset into place (replacing the old one only as checked)."""
        if self.tmp is None:
            return
        path, tmp = self.path, self.tmp
        if check_replaceable(path, self.layout, self.overwrite):  # again: it may have appeared
            if self.layout == "aos":
                os.replace(tmp, path)
            else:  # a directory cannot replace a non-empty one: move the old one aside first
                aside = tempfile.mkdtemp(prefix="." + os.path.basename(os.path.abspath(path))[:100]
                                         + ".", suffix=".old", dir=self.parent)
                os.rename(path, aside)  # onto the empty directory just made
                os.rename(tmp, path)
                _remove_dataset_dir(aside)
        else:
            os.rename(tmp, path)
        self.tmp = None
        fsync_dir(self.parent)

    def discard(self) -> None:
        """Remove the temporary name (a file, or a directory and the files written into it)."""
        tmp, self.tmp = self.tmp, None
        if tmp is None:
            return
        try:
            if self.layout != "aos":
                for name in os.listdir(tmp):  # only this object's writers wrote here
                    os.unlink(os.path.join(tmp, name))
                os.rmdir(tmp)
            else:
                os.unlink(tmp)
        except OSError:
            pass


def _lock_free(path: str) -> bool:
    """Whether no :class:`Writer` holds the dataset at ``path`` (its first file's ``flock``)."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no locks
        return True
    first = path
    if os.path.isdir(path):
        try:
            first = _directory_files(path)[0]
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
                 overwrite: bool = False, _append: bool = False, _rows: int = 0,
                 _publish_at_close: bool = False):
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
        if layout == "aos":
            self.dtype = np.dtype(dtype) if dtype is not None else self.spec.aos_dtype
            if self.dtype.names is None or spec_of_dtype(self.dtype) != self.spec:
                raise SpecError(f"dtype {self.dtype} does not hold the fields of {self.spec}")
            _check_header_text(self.dtype, self.path)
        elif layout == "soa":
            self._entries = _soa_entries(self.spec)
            self._files = [(fname, f.dtype, f.shape, [i], False)
                           for i, (f, fname) in enumerate(self._entries)]
        else:
            self._entries = _group_entries(self.spec, layout)
            index = {n: i for i, n in enumerate(self.spec.names)}
            self._files = [(fname, dt, sh, [index[n] for n in g], len(g) > 1)
                           for g, dt, sh, fname in self._entries]
            for _, dt, _, _, records in self._files:
                if records:
                    _check_header_text(dt, self.path)
        if create:
            self._staged = _Staged(self.path, layout, overwrite)
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
            _write_manifest(self._dir, rows, self._entries)
        else:
            _write_group_manifest(self._dir, rows, self.spec, self._entries)

    @classmethod
    def open(cls, path: str) -> "Writer":
        """Open a dataset tfdata wrote for appending after its committed rows."""
        path = os.fspath(path)
        if os.path.isdir(path) and directory_format(path) == GROUPS_FORMAT:
            rows, spec, groups, files = read_group_manifest(path)
            for g, (fpath, dt, sh) in zip(groups, files):
                h = _group_header(fpath, g, dt, sh, rows)
                if h.offset != header_nbytes(dt, sh):
                    raise FormatError(f"{fpath}: not written by tfdata (its header cannot grow in place); "
                                      "copy it with tfdata.io.convert to append")
            try:
                return cls(path, spec, groups, _append=True, _rows=rows)
            except SpecError as exc:
                raise FormatError(f"{os.path.join(path, MANIFEST)}: {exc}") from None
        if os.path.isdir(path):
            rows, entries = read_manifest(path)
            for field, fpath in entries:
                h = read_npy_header(fpath, allow_tail=True, follow=False)
                if h.offset != header_nbytes(field.dtype, field.shape):
                    raise FormatError(f"{fpath}: not written by tfdata (its header cannot grow in place); "
                                      "copy it with tfdata.io.convert to append")
            try:
                return cls(path, Spec([f for f, _ in entries]), "soa", _append=True, _rows=rows)
            except SpecError as exc:  # a field name the manifest allows but no file name can be
                raise FormatError(f"{os.path.join(path, MANIFEST)}: {exc}") from None
        if os.path.islink(path):  # appending writes in place: through a link it would write elsewhere
            raise FormatError(f"{path}: is a symbolic link; open the file it points to "
                              f"({os.path.realpath(path)}) to append")
        h = read_npy_header(path)
        if h.version is None:
            raise FormatError(f"{path}: not written by tfdata (its header cannot grow in place); "
                              "copy it with tfdata.io.convert to append")
        if h.dtype.names is None or len(h.shape) != 1:
            raise FormatError(f"{path}: expected a 1-D structured array, got {h.dtype}{list(h.shape)}")
        if h.offset != header_nbytes(h.dtype):
            raise FormatError(f"{path}: header of {h.offset} bytes, expected {header_nbytes(h.dtype)}")
        return cls(path, spec_of_dtype(h.dtype, path), "aos", dtype=h.dtype, _append=True, _rows=h.shape[0])

    def append(self, batch) -> int:
        """Write ``n`` rows after the last appended ones (not yet visible to readers).

        Parameters
        ----------
        batch : mapping of str to array of shape (n, *field.shape)
            Validated by the spec first: a rejected batch writes nothing.

        Returns
        -------
        int
            ``n``.
        """
        if self._parts is None:
            raise ValueError(f"{self.path}: writer is closed")
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
        if self._parts is None:
            raise ValueError(f"{self.path}: writer is closed")
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
        if self._parts is None:
            raise ValueError(f"{self.path}: writer is closed")
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
        if self._parts is None:
            raise ValueError(f"{self.path}: writer is closed")
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
        ndarray of shape (rows, *field.shape); for a grouping a tuple of one array per group
        (the backing :class:`tfdata.storage.GroupStorage` takes)
    maps : list of (MappedFile, row_bytes)
    """
    spec = Spec(spec)
    rows = int(rows)
    path = os.fspath(path)
    if os.path.lexists(path):
        raise FileExistsError(f"spill_path {path!r} exists; a spill file is the buffer's scratch "
                              f"storage and never replaces anything: delete it or choose a new path")
    layout = dataset_layout(layout, spec)
    if layout == "aos":
        _check_header_text(spec.aos_dtype, path)
    elif layout == "soa":
        entries = _soa_entries(spec)
    else:
        entries = _group_entries(spec, layout)
        for _, dt, _, _ in entries:
            _check_header_text(dt, path)
    staged = _Staged(path, layout, False)
    try:
        if layout == "aos":
            _create_npy(staged.tmp, spec.aos_dtype, (rows,), memmap=False)
            mf = MappedFile(staged.tmp, header_nbytes(spec.aos_dtype), writable=True)
            out = mf.array(spec.aos_dtype, (rows,)), [(mf, spec.aos_dtype.itemsize)]
        elif layout != "soa":
            blocks, maps = [], []
            for _, dt, sh, fname in entries:
                fpath = os.path.join(staged.tmp, fname)
                _create_npy(fpath, dt, (rows,) + sh, memmap=False, mark=False)
                mf = MappedFile(fpath, header_nbytes(dt, sh), writable=True)
                blocks.append(mf.array(dt, (rows,) + sh))
                maps.append((mf, dt.itemsize * int(np.prod(sh, dtype=np.int64))))
            _write_group_manifest(staged.tmp, rows, spec, entries)
            out = tuple(blocks), maps
        else:
            cols, maps = {}, []
            for f, fname in entries:
                fpath = os.path.join(staged.tmp, fname)
                _create_npy(fpath, f.dtype, (rows,) + f.shape, memmap=False, mark=False)
                mf = MappedFile(fpath, header_nbytes(f.dtype, f.shape), writable=True)
                cols[f.name] = mf.array(f.dtype, (rows,) + f.shape)
                maps.append((mf, f.nbytes))
            _write_manifest(staged.tmp, rows, entries)
            out = cols, maps
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
        As for :func:`save`: an existing ``path`` is replaced only if this is True and it is a
        tfdata dataset of the same layout (by a rename: readers of the old one keep it).

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
    layout = dataset_layout(layout, spec)
    if layout == "aos":
        _check_header_text(spec.aos_dtype, path)
    elif layout == "soa":
        entries = _soa_entries(spec)
    else:
        entries = _group_entries(spec, layout)
        for _, dt, _, _ in entries:
            _check_header_text(dt, path)
    staged = _Staged(path, layout, overwrite)
    try:
        if layout == "aos":
            records = _create_npy(staged.tmp, spec.aos_dtype, (rows,))
            cols = {name: records[name] for name in spec.names}
        elif layout != "soa":
            cols = {}
            for g, dt, sh, fname in entries:
                block = _create_npy(os.path.join(staged.tmp, fname), dt, (rows,) + sh, mark=False)
                cols.update({g[0]: block} if len(g) == 1 else {n: block[n] for n in g})
            cols = {n: cols[n] for n in spec.names}
            _write_group_manifest(staged.tmp, rows, spec, entries)
        else:
            cols = {f.name: _create_npy(os.path.join(staged.tmp, fname), f.dtype, (rows,) + f.shape,
                                        mark=False) for f, fname in entries}
            _write_manifest(staged.tmp, rows, entries)
        staged.publish()
    except BaseException:
        staged.discard()
        raise
    return cols


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
