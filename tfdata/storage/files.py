"""Files: the on-disk form of each layout (the file backing of :mod:`tfdata.storage`), readable
without tfdata (``numpy.load(path, mmap_mode="r")``, or any NPY reader). This module gathers the
public names of the modules below, which alone know the byte layout and map files
(:mod:`tfdata.io` is its public face); the format, its manifests, the commit protocol and the
checks of hostile files: docs/design/file-format.md.

AoS file
    One ``.npy`` file (NPY 1.0; 2.0 only for dtypes whose description exceeds 64 KiB) holding a
    1-D C-ordered structured array, one record per row, version comment ``# tfdata 1.0``.
SoA directory
    One ``.npy`` file per field, shape ``(rows, *field.shape)``, plus ``manifest.json``.
Grouped directory (``layout=[["obs", "action"], ["next_obs"]]``)
    One ``.npy`` file per group (records of :func:`tfdata.storage.group_dtype`, or the plain
    array of a group of one field), plus ``manifest.json`` holding the spec and the grouping
    in normal form (:func:`tfdata.storage.check_layout`).

Headers are padded to :data:`HEADER_BYTES` (data page-aligned, room for any row count); the
header's (or manifest's) row count is the number of **committed** rows.

The parts, each importing only those listed before it: :mod:`.paths` (checks before a path is
opened, flushing a rename, removing only what tfdata named), :mod:`.npy` (NPY headers),
:mod:`.manifest` (directory manifests), :mod:`.replace` (staging a new dataset and renaming it
into place), :mod:`.mapping` (memory maps: :class:`MappedFile`, :func:`create`,
:func:`map_storage`, :func:`create_region`), :mod:`.writer` (:class:`Writer`, :func:`save`).
"""

from __future__ import annotations

__all__ = ["MANIFEST", "SOA_FORMAT", "SOA_VERSION", "GROUPS_FORMAT", "GROUPS_VERSION", "read_group_manifest", "map_groups", "map_directory", "directory_format", "dataset_layout", "FORMAT_VERSION", "PAGE", "HEADER_BYTES", "NpyHeader", "MAX_NDIM", "MAX_NBYTES", "check_regular", "check_directory", "read_npy_header", "header_nbytes", "npy_header", "MappedFile", "ResidentFile", "map_npy", "spec_of_dtype", "read_json_doc", "read_manifest", "map_soa", "chunk_rows", "holds_metadata", "read_metadata", "metadata_problem", "save", "fsync_dir", "check_replaceable", "remove_names", "Writer", "create_region", "map_storage", "create"]

from .manifest import (GROUPS_FORMAT, GROUPS_VERSION, MANIFEST, SOA_FORMAT, SOA_VERSION, directory_format,
                       metadata_problem, read_group_manifest, read_json_doc, read_manifest, read_metadata)
from .mapping import (MappedFile, ResidentFile, create, create_region, map_directory, map_groups, map_npy,
                      map_soa, map_storage)
from .npy import (FORMAT_VERSION, HEADER_BYTES, MAX_NBYTES, MAX_NDIM, PAGE, NpyHeader, header_nbytes,
                  npy_header, read_npy_header, spec_of_dtype)
from .paths import check_directory, check_regular, fsync_dir, remove_names
from .replace import check_replaceable, dataset_layout
from .writer import Writer, chunk_rows, holds_metadata, save
