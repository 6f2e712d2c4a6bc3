"""The directory of a checkpoint and the encoding of its arrays (docs/design/checkpoints.md).

What a checkpoint directory may hold (:func:`checkpoint_files`), writing one beside ``path`` and
renaming it into place, replacing only a checkpoint (:func:`begin`, :func:`finish`), the
``{"$array": "arrays/<name>.npy"}`` references of ``state.json`` (:func:`encode`) and the bounded
reads of untrusted files: ``state.json`` (:func:`read_state`), ``.npy`` arrays
(:class:`Arrays`: header first, then exactly the dtype and shape asked for) and the rows
(:func:`open_rows`). Links, FIFOs and devices are refused before anything is opened.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
import sys
import tempfile
import warnings

import numpy as np

from ..errors import FormatError
from ..storage.files import fsync_dir, read_npy_header
from .samplers import STATE_BYTES_BASE, STATE_BYTES_PER_SLOT, shown as _show

FORMAT = "tfdata.checkpoint"
VERSION = (1, 0)
#: the document of a checkpoint, and the directory of its arrays
STATE = "state.json"
ARRAYS = "arrays"
_SAFE = re.compile(r"^arrays/[A-Za-z0-9_][A-Za-z0-9_.\-]*\.npy$")
_SAFE_STEM = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,150}$")
#: Largest ``state.json`` accepted: the arrays are separate files, so a state holds the spec,
#: the config and a few scalars (about 100 bytes per field).
STATE_LIMIT = 8 << 20
_MAX_INT_DIGITS = 40


# -- files -------------------------------------------------------------------------------------


def _lstat(path: str, missing: str | None = None) -> os.stat_result:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        raise FormatError(f"{path}: missing{missing or ''}") from None


def _regular(path: str) -> os.stat_result:
    """Refuse a link, FIFO, device, socket or directory at ``path`` (FormatError), unopened."""
    st = _lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise FormatError(f"{path}: is a symbolic link; a checkpoint holds no links (tfdata never "
                          f"follows one out of a checkpoint directory)")
    if not stat.S_ISREG(st.st_mode):
        raise FormatError(f"{path}: not a regular file (a directory, FIFO, socket or device)")
    return st


def _directory(path: str) -> None:
    st = _lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise FormatError(f"{path}: is a symbolic link; a checkpoint holds no links (tfdata never "
                          f"follows one out of a checkpoint directory)")
    if not stat.S_ISDIR(st.st_mode):
        raise FormatError(f"{path}: not a directory")


def _open_regular(path: str):
    """``path`` opened for reading, refused unless a regular file: no link is followed and a FIFO
    does not block (``O_NONBLOCK``); the type is checked again on the open descriptor."""
    _regular(path)
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise FormatError(f"{path}: cannot be opened ({exc.strerror})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise FormatError(f"{path}: not a regular file")
    return os.fdopen(fd, "rb")


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > _MAX_INT_DIGITS:
        raise ValueError(f"integer of {len(text)} digits")
    return int(text)


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def read_state(spath: str) -> dict:
    """The JSON object in ``state.json``, bounded in size and nesting; FileNotFoundError if
    there is none (the directory is not a checkpoint), FormatError for anything else wrong."""
    if not os.path.lexists(spath):
        raise FileNotFoundError(f"{os.path.dirname(spath)}: not a tfdata checkpoint (no {STATE})")
    with _open_regular(spath) as f:
        data = f.read(STATE_LIMIT + 1)
    if len(data) > STATE_LIMIT:
        raise FormatError(f"{spath}: larger than {STATE_LIMIT} bytes; not a checkpoint's state")
    try:
        doc = json.loads(data, parse_int=_parse_int, parse_constant=_no_constant)
    except RecursionError:  # deeper than the parser's stack: no state of ours is
        raise FormatError(f"{spath}: JSON nested too deeply; not a checkpoint's state") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise FormatError(f"{spath}: not valid JSON ({str(exc)[:200]})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise FormatError(f"{spath}: format is not {FORMAT!r}")
    return doc


def _array_refs(doc) -> set:
    """Every ``{"$array": name}`` string in ``doc`` (an explicit stack: no recursion)."""
    refs, stack = set(), [doc]
    while stack:
        obj = stack.pop()
        if isinstance(obj, dict):
            if set(obj) == {"$array"} and isinstance(obj["$array"], str):
                refs.add(obj["$array"])
            stack.extend(obj.values())
        elif isinstance(obj, list):
            stack.extend(obj)
    return refs


def checkpoint_files(path: str) -> tuple[list, list]:
    """``(files, dirs)`` of the checkpoint directory ``path``, relative, deepest first; raises
    FormatError if ``path`` is not one or holds anything else (docs/design/checkpoints.md)."""
    _directory(path)
    doc = read_state(os.path.join(path, STATE))
    files, dirs = [STATE], []
    names = set(os.listdir(path))
    extra = names - {STATE, ARRAYS, "rows.npy", "rows"}
    if {"rows.npy", "rows"} <= names:
        extra.add("rows")
    if ARRAYS in names:
        _directory(os.path.join(path, ARRAYS))
        refs = _array_refs(doc)
        for name in os.listdir(os.path.join(path, ARRAYS)):
            rel = f"{ARRAYS}/{name}"
            if rel not in refs or not _SAFE.match(rel):
                extra.add(rel)
                continue
            _regular(os.path.join(path, rel))
            files.append(rel)
        dirs.append(ARRAYS)
    if "rows.npy" in names:
        _regular(os.path.join(path, "rows.npy"))
        files.append("rows.npy")
    elif "rows" in names:
        rows = os.path.join(path, "rows")
        _directory(rows)
        mpath = os.path.join(rows, "manifest.json")
        with _open_regular(mpath) as f:
            text = f.read(1 << 20)
        try:
            manifest = json.loads(text, parse_int=_parse_int, parse_constant=_no_constant)
            fields = manifest["fields"]
            known = {e["file"] for e in fields if isinstance(e.get("file"), str)}
            # a grouped directory names its files per group
            known |= {e["file"] for e in manifest.get("groups", ())
                      if isinstance(e, dict) and isinstance(e.get("file"), str)}
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
            raise FormatError(f"{mpath}: not a tfdata manifest") from None
        known |= {"manifest.json", "manifest.json.tmp"}
        for name in os.listdir(rows):
            if name not in known or "/" in name:
                extra.add(f"rows/{name}")
                continue
            _regular(os.path.join(rows, name))
            files.append(f"rows/{name}")
        dirs.append("rows")
    if extra:
        shown = sorted(extra)
        raise FormatError(f"{path}: holds files that are not part of a checkpoint "
                          f"({', '.join(shown[:5])}{', ...' if len(shown) > 5 else ''})")
    return files[::-1], dirs


def _listed(path: str) -> list:
    """The paths of the checkpoint ``path``, deepest first (files, directories, ``path``)."""
    files, dirs = checkpoint_files(path)
    return [os.path.join(path, r) for r in files] + [os.path.join(path, r) for r in dirs] + [path]


def check_replaceable(path: str, listed=_listed, kind: str = "tfdata checkpoint directory") -> None:
    """FileExistsError unless ``listed(path)`` accepts ``path`` as a checkpoint of ``kind``."""
    try:
        listed(path)
    except (FormatError, OSError, ValueError) as exc:
        raise FileExistsError(f"{path}: exists and is not a {kind}, so it is not replaced "
                              f"({exc})") from None


def _remove_checkpoint(path: str, listed=_listed) -> None:
    """Delete the checkpoint directory ``path`` (moved aside by :func:`publish`) path by path,
    after ``listed`` checked it holds only checkpoint files; otherwise leave it, with a warning."""
    try:
        paths = listed(path)
    except (FormatError, OSError, ValueError) as exc:
        warnings.warn(f"{path}: the replaced checkpoint was left there: it holds more than a "
                      f"checkpoint ({exc})", RuntimeWarning, stacklevel=3)
        return
    try:
        for p in paths:
            (os.rmdir if stat.S_ISDIR(os.lstat(p).st_mode) else os.unlink)(p)
    except OSError as exc:  # a file appeared meanwhile: it stays
        warnings.warn(f"{path}: the replaced checkpoint could not be removed completely ({exc})",
                      RuntimeWarning, stacklevel=3)


# -- writing -----------------------------------------------------------------------------------


def _write_npy(path: str, arr: np.ndarray) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
    with os.fdopen(fd, "wb") as f:
        # asarray, not ascontiguousarray: that makes a 0-d array (a statistic of a scalar) 1-d
        np.lib.format.write_array(f, np.asarray(arr, order="C"), allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())



def encode(obj, base: str, prefix: str, arrays: list):
    """JSON-able copy of ``obj`` with every ndarray written to ``arrays/<name>.npy``."""
    if isinstance(obj, np.ndarray):
        # the key path names the file where it is a safe file name (a field name may not be)
        stem = prefix if _SAFE_STEM.match(prefix) else f"a{len(arrays)}"
        rel = f"{ARRAYS}/{stem}.npy"
        if rel in arrays:
            rel = f"{ARRAYS}/a{len(arrays)}.npy"
        _write_npy(os.path.join(base, rel), obj)
        arrays.append(rel)
        return {"$array": rel}
    if isinstance(obj, dict):
        return {k: encode(v, base, f"{prefix}.{k}" if prefix else str(k), arrays) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [encode(v, base, f"{prefix}.{i}", arrays) for i, v in enumerate(obj)]
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


def begin(path, overwrite: bool, listed=_listed, kind: str = "tfdata checkpoint directory") -> tuple:
    """Check that ``path`` may be written (docs/design/checkpoints.md: only a checkpoint that
    ``listed`` accepts is replaced, named ``kind`` in refusals) and create this call's temporary
    directory beside it; returns ``(path, tmp, stem, parent)``."""
    path = os.fspath(path)
    path = path.rstrip(os.sep) or path
    if os.path.lexists(path):
        if not overwrite:
            raise FileExistsError(f"{path}: exists; a checkpoint replaces an existing path only "
                                  f"when asked (overwrite=True), and only a {kind}")
        check_replaceable(path, listed, kind)
    parent = os.path.dirname(os.path.abspath(path))
    stem = "." + os.path.basename(os.path.abspath(path))[:100] + "."
    tmp = tempfile.mkdtemp(prefix=stem, suffix=".tmp", dir=parent)  # exclusively this call's
    return path, tmp, stem, parent


def finish(tmp: str, path: str, stem: str, parent: str, overwrite: bool, doc: dict,
            rows_name: str) -> None:
    """Write ``state.json``, flush every file and directory, publish ``tmp`` at ``path``."""
    text = json.dumps(doc, indent=1, allow_nan=False)
    fd = os.open(os.path.join(tmp, STATE), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    for d in (os.path.join(tmp, ARRAYS), os.path.join(tmp, rows_name), tmp):
        if os.path.isdir(d):
            fsync_dir(d)
    publish(tmp, path, stem, parent, overwrite)


def publish(tmp: str, path: str, stem: str, parent: str, overwrite: bool, listed=_listed,
            kind: str = "tfdata checkpoint directory") -> None:
    """Rename the complete checkpoint ``tmp`` to ``path``, replacing only a checkpoint that
    ``listed`` accepts (the old one moved aside, then removed path by path)."""
    if not os.path.lexists(path):
        # a directory that appeared meanwhile makes this fail unless it is empty (nothing lost)
        os.rename(tmp, path)
        fsync_dir(parent)
        return
    if not overwrite:  # it appeared while this call was writing
        raise FileExistsError(f"{path}: exists; not replaced (overwrite=False)")
    check_replaceable(path, listed, kind)  # again: it may have changed while this call was writing
    aside = tempfile.mkdtemp(prefix=stem, suffix=".old", dir=parent)
    os.rename(path, aside)  # onto the empty directory just made: a name only this call knows
    try:
        os.rename(tmp, path)
    except BaseException:
        os.rename(aside, path)  # put the old checkpoint back
        raise
    fsync_dir(parent)
    _remove_checkpoint(aside, listed)


# -- loading: arrays and rows ------------------------------------------------------------------


class Arrays:
    """Reads the ``{"$array": ...}`` references of a checkpoint: the name, the file, its header
    and exactly the dtype and shape the state needs, before any data is read. ``check``: the
    :class:`~tfdata.replay.checkpoint_checker.Checker` of its ``state.json`` (its ``spath`` and
    ``fail`` name the field of a bad reference)."""

    def __init__(self, path: str, check):
        self.path = path
        self.check = check
        self.dir_checked = False

    def header(self, where: str, ref):
        """``(file path, header)`` of the array reference ``ref``, checked."""
        c = self.check
        if not isinstance(ref, dict) or set(ref) != {"$array"}:
            c.fail(where, 'an array reference {"$array": "arrays/<name>.npy"}', ref)
        rel = ref["$array"]
        if type(rel) is not str or not _SAFE.match(rel):
            raise FormatError(f"{c.spath}: {where}: array reference {_show(rel)} is not a file "
                              f"under arrays/")
        if not self.dir_checked:
            _directory(os.path.join(self.path, ARRAYS))
            self.dir_checked = True
        fpath = os.path.join(self.path, rel)
        _regular(fpath)
        h = read_npy_header(fpath)
        check_portable(fpath, h, where)
        return fpath, h

    def fail(self, ref: dict, text: str):
        """FormatError naming the array file of ``ref`` (read, so checked) and ``text``."""
        raise FormatError(f"{os.path.join(self.path, ref['$array'])}: {text}")

    def length(self, where: str, ref) -> int:
        """Rows of the 1-D array ``ref`` (from its header; nothing else is read)."""
        fpath, h = self.header(where, ref)
        if len(h.shape) != 1:
            raise FormatError(f"{fpath}: {where}: expected a 1-D array, the file holds "
                              f"{h.dtype}{list(h.shape)}")
        return h.shape[0]

    def read(self, where: str, ref, dtype, shape: tuple) -> np.ndarray:
        fpath, h = self.header(where, ref)
        dtype = np.dtype(dtype)
        if h.dtype != dtype or tuple(h.shape) != tuple(shape):
            raise FormatError(f"{fpath}: {where}: expected {dtype}{list(shape)}, the file holds "
                              f"{h.dtype}{list(h.shape)}")
        out = np.empty(shape, dtype)
        view = memoryview(out).cast("B") if out.nbytes else None
        with _open_regular(fpath) as f:
            if os.fstat(f.fileno()).st_size < h.offset + out.nbytes:
                raise FormatError(f"{fpath}: truncated")
            f.seek(h.offset)
            if view is not None and f.readinto(view) != out.nbytes:
                raise FormatError(f"{fpath}: truncated")
        return out

    def any(self, where: str, ref, limit: int) -> np.ndarray:
        """The array ``ref`` whatever its shape, of a bool or numeric dtype and at most
        ``limit`` bytes (from the header, before anything is read): what a part whose arrays
        its own check validates may hold."""
        fpath, h = self.header(where, ref)
        dt = h.dtype
        if dt.kind not in "biuf" or dt.fields is not None or dt.subdtype is not None:
            raise FormatError(f"{fpath}: {where}: expected an array of a bool or numeric dtype, "
                              f"the file holds {dt}{list(h.shape)}")
        nbytes = dt.itemsize * math.prod(h.shape)
        if nbytes > limit:
            raise FormatError(f"{fpath}: {where}: expected at most {limit} bytes (what is left of "
                              f"the {STATE_BYTES_PER_SLOT} bytes per slot, plus "
                              f"{STATE_BYTES_BASE}, a sampler's arrays may hold in all), the "
                              f"file holds {dt}{list(h.shape)}")
        return self.read(where, ref, dt, tuple(h.shape))


def _leaves(dtype: np.dtype, name: str):
    """``(name, base dtype)`` of every scalar field of ``dtype`` (a record's fields by name)."""
    if dtype.names is None:
        yield name, dtype.base
        return
    for field in dtype.names:
        yield from _leaves(dtype.fields[field][0].base, f"field {field!r}")


def check_portable(fpath: str, header, where: str) -> None:
    """Refuse (FormatError naming the file and the field) an array this machine would read
    wrongly or unaligned: a field in the other byte order, or data that does not start at a
    multiple of its alignment. tfdata writes every array in the writing machine's byte order
    (little-endian on x86-64 and aarch64) from an offset that is a multiple of 64, so a
    checkpoint moves between such machines unchanged (docs/design/checkpoints.md)."""
    leaves = list(_leaves(header.dtype, where))
    for name, base in leaves:
        if not base.isnative:
            order = "big" if base.byteorder == ">" else "little"
            raise FormatError(f"{fpath}: {name}: stored {order}-endian ({base.str}); this machine "
                              f"is {sys.byteorder}-endian and reads a checkpoint in its own byte "
                              f"order only (nothing is converted)")
    align = max((base.alignment for _, base in leaves), default=1)
    if header.offset % align:
        name, base = max(leaves, key=lambda nb: nb[1].alignment)
        raise FormatError(f"{fpath}: {name}: data starts at byte {header.offset}, not a multiple "
                          f"of {align} (the alignment of {base}); tfdata writes aligned data, so "
                          f"the file is damaged or was not written by tfdata")


def _check_rows_file(fpath: str, where: str) -> None:
    """Byte order and alignment of a rows file whose header parses (one that does not is
    reported by the open of the rows, which names what is wrong)."""
    try:
        h = read_npy_header(fpath, allow_tail=True, follow=False)
    except (FormatError, OSError):
        return
    check_portable(fpath, h, where)


def _check_files(path: str, rows_name: str) -> str:
    """Refuse links and special files at the rows dataset, in an SoA rows directory and in
    ``arrays/`` (the directories themselves included), before anything is opened."""
    adir = os.path.join(path, ARRAYS)
    if os.path.lexists(adir):
        _directory(adir)
        for name in os.listdir(adir):
            _regular(os.path.join(adir, name))
    rpath = os.path.join(path, rows_name)
    if rows_name == "rows.npy":
        _regular(rpath)
        _check_rows_file(rpath, "rows")
        return rpath
    _directory(rpath)
    for name in os.listdir(rpath):
        _regular(os.path.join(rpath, name))
    for name in os.listdir(rpath):
        if name.endswith(".npy"):
            _check_rows_file(os.path.join(rpath, name), f"rows file {name!r}")
    return rpath


def open_rows(path: str, rows_name: str) -> tuple:
    """``(rows path, MmapDataset)`` of a checkpoint's rows, files checked first (links and
    special files refused), every failure a FormatError naming the file."""
    from ..dataset import MmapDataset

    rpath = _check_files(path, rows_name)
    try:
        return rpath, MmapDataset.open(rpath)
    except FileNotFoundError as exc:  # a file the manifest names
        raise FormatError(f"{rpath}: incomplete ({exc})") from None
    except RecursionError:
        raise FormatError(f"{rpath}: manifest nested too deeply") from None
    except (ValueError, TypeError, KeyError, OverflowError) as exc:
        if isinstance(exc, FormatError):
            raise
        raise FormatError(f"{rpath}: {str(exc)[:300]}") from None
