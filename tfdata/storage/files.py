"""Files: the on-disk form of each layout (the file backing of :mod:`tfdata.storage`). The
modules below alone know the on-disk byte layout and map files; this one gathers their public
names (:mod:`tfdata.io` is its public face).

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

The parts, each importing only those listed before it:

:mod:`.paths`
    The checks before a path is opened (a regular file, no link), flushing a directory after a
    rename, removing only the files tfdata named.
:mod:`.npy`
    NPY headers: read and checked, and written.
:mod:`.manifest`
    Directory manifests (SoA and grouped): read and checked, and written.
:mod:`.replace`
    Creating and replacing dataset paths: a new dataset is staged under a temporary name and
    renamed into place.
:mod:`.mapping`
    Memory maps of checked files, and of new ones: :func:`create`, :func:`map_storage`,
    :func:`create_region`.
:mod:`.writer`
    :class:`Writer` and :func:`save`.
"""

from __future__ import annotations

__all__ = ["MANIFEST", "SOA_FORMAT", "SOA_VERSION", "GROUPS_FORMAT", "GROUPS_VERSION", "read_group_manifest", "map_groups", "map_directory", "directory_format", "dataset_layout", "FORMAT_VERSION", "PAGE", "HEADER_BYTES", "NpyHeader", "MAX_NDIM", "MAX_NBYTES", "check_regular", "check_directory", "read_npy_header", "header_nbytes", "npy_header", "MappedFile", "ResidentFile", "map_npy", "spec_of_dtype", "read_json_doc", "read_manifest", "map_soa", "chunk_rows", "save", "fsync_dir", "check_replaceable", "remove_names", "Writer", "create_region", "map_storage", "create"]

from .manifest import (GROUPS_FORMAT, GROUPS_VERSION, MANIFEST, SOA_FORMAT, SOA_VERSION, directory_format,
                       read_group_manifest, read_json_doc, read_manifest)
from .mapping import (MappedFile, ResidentFile, create, create_region, map_directory, map_groups, map_npy,
                      map_soa, map_storage)
from .npy import (FORMAT_VERSION, HEADER_BYTES, MAX_NBYTES, MAX_NDIM, PAGE, NpyHeader, header_nbytes,
                  npy_header, read_npy_header, spec_of_dtype)
from .paths import check_directory, check_regular, fsync_dir, remove_names
from .replace import check_replaceable, dataset_layout
from .writer import Writer, chunk_rows, save
