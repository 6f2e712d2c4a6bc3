"""Files: the only module that knows the on-disk byte layout and the only one that maps files.

Two forms, both readable without tfdata:

AoS file
    One ``.npy`` file (NPY format 1.0 or 2.0) holding a 1-D C-ordered structured array:
    ``numpy.load(path, mmap_mode="r")`` opens it.
SoA directory
    One ``.npy`` file per field, shape ``(rows, *field.shape)``, plus ``manifest.json``::

        {"format": "tfdata.soa", "version": [1, 0], "rows": 1000,
         "fields": [{"name": "obs", "dtype": "<f4", "shape": [4], "file": "obs.npy"}, ...]}

    A reader refuses a major version it does not know.

Headers are parsed with numpy's own header reader (``ast.literal_eval``, never pickle) and then
checked against the file size before anything is mapped: a header that promises more bytes
than the file holds, a dtype with object or non-numeric fields, a Fortran-ordered or
non-1-D record array are refused with a :class:`~tfdata.errors.FormatError` naming the file.

Memory mapping goes through :class:`MappedFile`, which also gives the page advice that keeps the
resident set of a long scan bounded (``release``: ``MADV_DONTNEED`` on pages already consumed;
``willneed``: read ahead).
"""

from __future__ import annotations

import json
import mmap
import os
import re
from collections.abc import Mapping

import numpy as np

from .errors import FormatError, SpecError
from .spec import Field, Spec

MANIFEST = "manifest.json"
SOA_FORMAT = "tfdata.soa"
SOA_VERSION = (1, 0)
PAGE = mmap.PAGESIZE
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")


# -- NPY headers ------------------------------------------------------------------------------


def read_npy_header(path: str) -> tuple[np.dtype, tuple[int, ...], int, int]:
    """Parse and check the header of the ``.npy`` file at ``path``.

    Returns
    -------
    dtype : numpy.dtype
    shape : tuple of int
    offset : int
        Byte offset of the data.
    file_size : int

    Raises
    ------
    FileNotFoundError
        No such file.
    FormatError
        Not an NPY file, an unsupported version, a header numpy cannot parse, Fortran order, an
        object dtype, or a data size different from what the file holds.
    """
    fmt = np.lib.format
    size = os.path.getsize(path)
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
        except (ValueError, SyntaxError, TypeError) as exc:
            raise FormatError(f"{path}: unreadable NPY header ({exc})") from None
        offset = f.tell()
    if fortran and len(shape) > 1:
        raise FormatError(f"{path}: Fortran-ordered arrays are not supported; save C-ordered data")
    if dtype.hasobject:
        raise FormatError(f"{path}: dtype {dtype} holds Python objects; refusing (no pickle)")
    if any((not isinstance(s, int)) or s < 0 for s in shape):
        raise FormatError(f"{path}: invalid shape {shape} in header")
    expected = int(np.prod(shape, dtype=object)) * dtype.itemsize  # Python ints: no overflow
    if offset + expected != size:
        raise FormatError(
            f"{path}: header says shape {shape} of dtype {dtype} ({expected} bytes of data from "
            f"byte {offset}), but the file has {size - offset} bytes of data"
            + (" (truncated?)" if offset + expected > size else " (trailing bytes)"))
    return dtype, tuple(shape), offset, size


def _npy_header_bytes(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    import io

    buf = io.BytesIO()
    np.lib.format.write_array_header_2_0(
        buf, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape})
    header = buf.getvalue()
    # version 1.0 when the header fits in it, as numpy.save does
    if len(header) - 12 < 65536:
        buf = io.BytesIO()
        np.lib.format.write_array_header_1_0(
            buf, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape})
        header = buf.getvalue()
    return header


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

    def __init__(self, path: str, offset: int):
        self.path = path
        self.offset = offset
        with open(path, "rb") as f:
            self.nbytes = os.fstat(f.fileno()).st_size
            # length 0 is not mappable: an empty dataset maps nothing
            self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if self.nbytes else None

    def array(self, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        """A read-only ndarray over the mapped data (no copy)."""
        if self._mm is None:
            return np.empty(shape, dtype)
        count = int(np.prod(shape, dtype=object))
        return np.frombuffer(self._mm, dtype=dtype, count=count, offset=self.offset).reshape(shape)

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


def map_npy(path: str) -> tuple[np.ndarray, MappedFile]:
    """Memory-map a checked ``.npy`` file read-only; returns ``(array, mapped_file)``."""
    dtype, shape, offset, _ = read_npy_header(path)
    mf = MappedFile(path, offset)
    return mf.array(dtype, shape), mf


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


def read_manifest(path: str) -> tuple[int, list[tuple[Field, str]]]:
    """Read and check ``manifest.json`` of the SoA directory ``path``.

    Returns ``(rows, [(field, file_path), ...])`` in field order.
    """
    mpath = os.path.join(path, MANIFEST)
    if not os.path.exists(mpath):
        raise FileNotFoundError(f"{path}: not a tfdata SoA directory (no {MANIFEST})")
    try:
        with open(mpath, "rb") as f:
            doc = json.loads(f.read(1 << 20))
    except (ValueError, UnicodeDecodeError) as exc:
        raise FormatError(f"{mpath}: not valid JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != SOA_FORMAT:
        raise FormatError(f"{mpath}: format is not {SOA_FORMAT!r}")
    version = doc.get("version")
    if (not isinstance(version, list) or len(version) != 2
            or not all(isinstance(v, int) for v in version)):
        raise FormatError(f"{mpath}: version must be [major, minor], got {version!r}")
    if version[0] != SOA_VERSION[0]:
        raise FormatError(f"{mpath}: format version {version[0]}.{version[1]} is not supported "
                          f"(this tfdata reads major version {SOA_VERSION[0]})")
    rows = doc.get("rows")
    if not isinstance(rows, int) or isinstance(rows, bool) or rows < 0:
        raise FormatError(f"{mpath}: rows must be a non-negative int, got {rows!r}")
    entries = doc.get("fields")
    if not isinstance(entries, list) or not entries:
        raise FormatError(f"{mpath}: fields must be a non-empty list")
    out = []
    for e in entries:
        if not isinstance(e, dict):
            raise FormatError(f"{mpath}: each field must be an object, got {e!r}")
        name, fname = e.get("name"), e.get("file")
        if not isinstance(fname, str) or not _SAFE_NAME.match(fname) or ".." in fname:
            raise FormatError(f"{mpath}: field {name!r}: file name {fname!r} is not a plain file name")
        try:
            field = Field(name, e.get("dtype"), tuple(e.get("shape", ())))
        except (SpecError, TypeError) as exc:
            raise FormatError(f"{mpath}: {exc}") from None
        out.append((field, os.path.join(path, fname)))
    try:
        Spec([f for f, _ in out])
    except SpecError as exc:
        raise FormatError(f"{mpath}: {exc}") from None
    return rows, out


def map_soa(path: str) -> tuple[Spec, dict, list[MappedFile]]:
    """Memory-map every field of the SoA directory ``path`` after checking each header.

    Returns ``(spec, columns, mapped_files)``; ``columns[name]`` is read-only with shape
    ``(rows, *field.shape)``.
    """
    rows, entries = read_manifest(path)
    columns, maps = {}, []
    for field, fpath in entries:
        dtype, shape, offset, _ = read_npy_header(fpath)
        want = (rows,) + field.shape
        if dtype != field.dtype or shape != want:
            raise FormatError(f"{fpath}: field {field.name!r}: manifest says {field.dtype}{list(want)}, "
                              f"file holds {dtype}{list(shape)}")
        mf = MappedFile(fpath, offset)
        columns[field.name] = mf.array(dtype, shape)
        maps.append(mf)
    return Spec([f for f, _ in entries]), columns, maps


# -- writing ----------------------------------------------------------------------------------


def _columns_of(data) -> tuple[Spec, dict]:
    if isinstance(data, np.ndarray) and data.dtype.names is not None:
        spec = spec_of_dtype(data.dtype)
        return spec, {name: data[name] for name in spec.names}
    if isinstance(data, Mapping):
        cols = {k: np.asarray(v) for k, v in data.items()}
        lengths = {k: (v.shape[0] if v.ndim else None) for k, v in cols.items()}
        if len(set(lengths.values())) != 1 or None in lengths.values():
            raise SpecError(f"every field needs the same number of rows, got {lengths}")
        spec = Spec({k: (v.dtype, v.shape[1:]) for k, v in cols.items()})
        return spec, cols
    raise TypeError(f"expected a structured ndarray or a mapping of arrays, got {type(data).__name__}")


def save(path: str, data, layout: str = "aos") -> None:
    """Write ``data`` as an AoS ``.npy`` file or an SoA directory.

    Parameters
    ----------
    path : str
        File (``layout="aos"``) or directory (``"soa"``) to create; an existing one is replaced.
    data : structured ndarray of shape (rows,), or mapping of str to ndarray of shape (rows, ...)
    layout : {"aos", "soa"}

    Notes
    -----
    The AoS record is :attr:`Spec.aos_dtype` (aligned, itemsize a multiple of 8) unless ``data``
    already is a structured array, whose dtype is kept. The SoA manifest is written last and
    atomically (temporary file, then rename), so a directory with a manifest is complete.
    """
    spec, cols = _columns_of(data)
    rows = len(next(iter(cols.values())))
    if layout == "aos":
        if isinstance(data, np.ndarray) and data.dtype.names is not None:
            records = np.ascontiguousarray(data)
        else:
            records = np.empty(rows, spec.aos_dtype)
            for name in spec.names:
                records[name] = cols[name]
        np.save(path, records, allow_pickle=False)
        return
    if layout != "soa":
        raise ValueError(f"layout: expected 'aos' or 'soa', got {layout!r}")
    entries = _soa_entries(spec)
    os.makedirs(path, exist_ok=True)
    for field, fname in entries:
        np.save(os.path.join(path, fname), np.ascontiguousarray(cols[field.name], field.dtype),
                allow_pickle=False)
    _write_manifest(path, rows, entries)


def _soa_entries(spec: Spec) -> list[tuple[Field, str]]:
    entries = []
    for field in spec:
        fname = field.name + ".npy"
        if not _SAFE_NAME.match(fname):
            raise SpecError(f"field {field.name!r}: not usable as a file name (letters, digits, '_', '.', '-')")
        entries.append((field, fname))
    return entries


def _write_manifest(path: str, rows: int, entries) -> None:
    doc = {"format": SOA_FORMAT, "version": list(SOA_VERSION), "rows": rows,
           "fields": [{"name": f.name, "dtype": f.dtype.str, "shape": list(f.shape), "file": fname}
                      for f, fname in entries]}
    tmp = os.path.join(path, MANIFEST + ".tmp")
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(path, MANIFEST))


def create(path: str, spec, rows: int, layout: str = "aos") -> dict:
    """Create a dataset file of ``rows`` zero rows and return writable memory-mapped fields.

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
    layout : {"aos", "soa"}

    Returns
    -------
    dict of str to numpy.memmap
        ``cols[name]`` has shape ``(rows, *field.shape)``. The file is sparse until written.
    """
    spec = Spec(spec)
    if not isinstance(rows, (int, np.integer)) or rows < 0:
        raise ValueError(f"rows must be a non-negative int, got {rows!r}")
    rows = int(rows)
    if layout == "aos":
        records = _create_npy(path, spec.aos_dtype, (rows,))
        return {name: records[name] for name in spec.names}
    if layout != "soa":
        raise ValueError(f"layout: expected 'aos' or 'soa', got {layout!r}")
    entries = _soa_entries(spec)
    os.makedirs(path, exist_ok=True)
    cols = {f.name: _create_npy(os.path.join(path, fname), f.dtype, (rows,) + f.shape)
            for f, fname in entries}
    _write_manifest(path, rows, entries)
    return cols


def _create_npy(path: str, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    header = _npy_header_bytes(dtype, shape)
    nbytes = int(np.prod(shape, dtype=object)) * dtype.itemsize
    with open(path, "wb") as f:
        f.write(header)
        f.truncate(len(header) + nbytes)  # sparse: no page is written until the caller writes it
    if nbytes == 0:
        return np.zeros(shape, dtype)
    return np.memmap(path, dtype=dtype, mode="r+", offset=len(header), shape=shape)
