"""NPY files: headers read from untrusted files (parsed without pickle and checked against the
file size), and the headers tfdata writes (padded to :data:`HEADER_BYTES`, with room for any
row count). See :mod:`tfdata.storage.files` for the format."""

from __future__ import annotations

import mmap
import re
from typing import NamedTuple

import numpy as np

from ..errors import FormatError, SpecError
from ..spec import Field, Spec
from .paths import check_regular

#: Version of the files tfdata writes (the ``# tfdata X.Y`` header comment). A reader refuses
#: another major version.
FORMAT_VERSION = (1, 0)
PAGE = mmap.PAGESIZE
#: Data of every file tfdata writes starts at a multiple of this: page-aligned on 4 KiB and
#: 16 KiB page systems, so memory-mapped views are aligned.
HEADER_BYTES = max(4096, PAGE)
_MARK = re.compile(r"# tfdata (\d+)\.(\d+)")


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


def check_header_text(dtype: np.dtype, path: str) -> None:
    """Refuse (SpecError) a record dtype whose NPY header cannot be written: the format stores
    it as latin-1, so a field name outside latin-1 fails, here before any file is made."""
    try:
        _header_text(dtype, (0,)).encode("latin1")
    except UnicodeEncodeError:
        bad = [n for n in (dtype.names or ()) if not n.isascii()]
        raise SpecError(f"{path}: field name(s) {bad} cannot be stored in an NPY header (latin-1 "
                        f"only); rename them or use layout='soa' with plain names") from None


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
