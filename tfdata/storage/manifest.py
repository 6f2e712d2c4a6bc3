"""Directory manifests (``manifest.json`` of SoA and grouped directories): read from untrusted
files and checked (bounded size, plain file names, a spec numpy accepts, a grouping in normal
form), and written by atomic replacement. See :mod:`tfdata.storage.files` for the format."""

from __future__ import annotations

import json
import os
import re

import numpy as np

from ..errors import FormatError, SpecError
from ..spec import Field, Spec
from .groups import group_arrays
from .layout import check_layout
from .npy import MAX_NDIM, NpyHeader, read_npy_header
from .paths import check_regular, fsync_dir

MANIFEST = "manifest.json"
SOA_FORMAT = "tfdata.soa"
SOA_VERSION = (1, 0)
GROUPS_FORMAT = "tfdata.groups"
GROUPS_VERSION = (1, 0)
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")
#: Most bytes of JSON a directory's ``"metadata"`` object may take (the whole manifest is at
#: most 1 MiB), and how deeply its values may nest.
MAX_METADATA = 256 << 10
MAX_METADATA_DEPTH = 16


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


def metadata_problem(value) -> str | None:
    """What is wrong with ``value`` as a dataset's metadata, or None: it must be a JSON object of
    plain values (str keys; None, bool, int, float, str, lists and objects of those), nested at
    most :data:`MAX_METADATA_DEPTH` deep and at most :data:`MAX_METADATA` bytes as JSON."""
    if not isinstance(value, dict):
        return f"expected a JSON object (dict), got {type(value).__name__}"
    stack = [(value, "metadata", 0)]
    while stack:  # iterative: a deep value cannot exhaust the interpreter's stack
        v, where, depth = stack.pop()
        if depth > MAX_METADATA_DEPTH:
            return f"{where}: nested deeper than {MAX_METADATA_DEPTH}"
        if isinstance(v, dict):
            for k, x in v.items():
                if not isinstance(k, str):
                    return f"{where}: key {str(k)[:50]!r} is not a str"
                stack.append((x, f"{where}.{k[:50]}", depth + 1))
        elif isinstance(v, list):
            stack.extend((x, f"{where}[{i}]", depth + 1) for i, x in enumerate(v))
        elif not (v is None or isinstance(v, (bool, int, float, str))):
            return f"{where}: {type(v).__name__} is not a plain JSON value"
    try:
        size = len(json.dumps(value))
    except (ValueError, TypeError) as exc:
        return f"not JSON ({str(exc)[:100]})"
    if size > MAX_METADATA:
        return f"{size} bytes of JSON, more than the {MAX_METADATA} a manifest keeps"
    return None


def read_metadata(path: str) -> dict:
    """The ``"metadata"`` object of the dataset directory ``path``'s manifest (``{}`` when it has
    none), checked (:func:`metadata_problem`): FormatError naming the manifest otherwise."""
    mpath = os.path.join(path, MANIFEST)
    doc = read_json_doc(mpath, "tfdata dataset directory", (SOA_FORMAT, GROUPS_FORMAT), 1 << 20)
    if "metadata" not in doc:
        return {}
    problem = metadata_problem(doc["metadata"])
    if problem is not None:
        raise FormatError(f"{mpath}: metadata: {problem}")
    return doc["metadata"]


def directory_format(path: str) -> str:
    """The format of the dataset directory ``path`` (its manifest's ``"format"``:
    :data:`SOA_FORMAT` or :data:`GROUPS_FORMAT`), read and bounded, not yet checked."""
    return read_json_doc(os.path.join(path, MANIFEST), "tfdata dataset directory",
                         (SOA_FORMAT, GROUPS_FORMAT), 1 << 20)["format"]


def directory_files(path: str) -> list[str]:
    """Paths of the data files the manifest of the dataset directory ``path`` names."""
    if directory_format(path) == GROUPS_FORMAT:
        return [f for f, _, _ in read_group_manifest(path)[3]]
    return [f for _, f in read_manifest(path)[1]]


def group_header(fpath: str, group, dtype, shape, rows: int) -> NpyHeader:
    """The header of a group's file, which must hold the manifest's dtype and row shape and at
    least ``rows`` rows (more: a commit that stopped before the manifest, see
    :func:`~tfdata.storage.mapping.map_soa`)."""
    h = read_npy_header(fpath, allow_tail=True, follow=False)
    if h.dtype != dtype or tuple(h.shape[1:]) != shape or not h.shape or h.shape[0] < rows:
        raise FormatError(f"{fpath}: group {list(group)}: manifest says {dtype}{[rows, *shape]}, "
                          f"file holds {h.dtype}{list(h.shape)}")
    return h


def soa_entries(spec: Spec) -> list[tuple[Field, str]]:
    """``(field, file_name)`` of every field's file in an SoA directory: ``<name>.npy``;
    SpecError for a field whose name is no plain file name."""
    entries = []
    for field in spec:
        fname = field.name + ".npy"
        if not _SAFE_NAME.match(fname) or ".." in fname:
            raise SpecError(f"field {field.name!r}: not usable as a file name (letters, digits, '_', '.', '-')")
        entries.append((field, fname))
    return entries


def write_manifest(path: str, rows: int, entries, metadata: dict | None = None) -> None:
    """Replace the manifest of the SoA directory ``path``: ``rows`` committed rows, the files of
    ``entries`` (:func:`soa_entries`), and ``metadata`` (checked by the caller) if given."""
    doc = {"format": SOA_FORMAT, "version": list(SOA_VERSION), "rows": rows,
           "fields": [{"name": f.name, "dtype": f.dtype.str, "shape": list(f.shape), "file": fname}
                      for f, fname in entries]}
    if metadata:
        doc["metadata"] = metadata
    _replace_json(path, doc)


def group_entries(spec: Spec, groups: tuple) -> list[tuple[tuple, np.dtype, tuple, str]]:
    """``(names, dtype, row_shape, file_name)`` of every group's file: ``<k>-<first field>.npy``
    (``<k>.npy`` if the field's name is no file name), unique by the group's index ``k``."""
    out = []
    for k, (g, (dtype, shape)) in enumerate(zip(groups, group_arrays(spec, groups))):
        fname = f"{k}-{g[0]}.npy"
        if not _SAFE_NAME.match(fname) or ".." in fname or len(fname) > 200:
            fname = f"{k}.npy"
        out.append((g, dtype, shape, fname))
    return out


def write_group_manifest(path: str, rows: int, spec: Spec, entries,
                         metadata: dict | None = None) -> None:
    """Replace the manifest of the grouped directory ``path``: ``rows`` committed rows, the
    fields of ``spec``, the groups and files of ``entries`` (:func:`group_entries`), and
    ``metadata`` (checked by the caller) if given."""
    doc = {"format": GROUPS_FORMAT, "version": list(GROUPS_VERSION), "rows": rows,
           "fields": [{"name": f.name, "dtype": f.dtype.str, "shape": list(f.shape)} for f in spec],
           "groups": [{"fields": list(g), "file": fname} for g, _, _, fname in entries]}
    if metadata:
        doc["metadata"] = metadata
    _replace_json(path, doc)


def _replace_json(path: str, doc: dict) -> None:
    tmp = os.path.join(path, MANIFEST + ".tmp")
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(path, MANIFEST))  # atomic: a reader sees the old or the new count
    fsync_dir(path)
