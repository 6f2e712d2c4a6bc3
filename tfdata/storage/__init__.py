"""Storages: where rows live. Three layouts behind one contract (:mod:`.base`).

``AoSStorage`` (``layout="aos"``, :mod:`.aos`), ``SoAStorage`` (``layout="soa"``, :mod:`.soa`)
and ``GroupStorage`` (column groups, ``layout=[["obs", "action"], ["next_obs"], ...]``,
:mod:`.groups`). A layout is normalised by :func:`resolve_layout` (against a spec) to
``"aos"``, ``"soa"`` or a tuple of tuples of field names; only this package and the kernels look
inside it (:mod:`.layout`). ``project(names)`` gives a :class:`Projection` (:mod:`.projection`):
the sampling contract over some fields only, knowing no layout.

This module only re-exports; the file backing is :mod:`.files`, a dataset's rows :mod:`.rows`,
a shared region's :mod:`.region`.
"""

from __future__ import annotations

from .aos import AoSStorage
from .base import Storage
from .groups import GroupStorage, group_arrays, group_dtype
from .layout import (STORAGES, check_layout, file_name, isolate_layout, make_storage, output_nbytes,
                     resolve_layout, restrict_layout, storage_nbytes)
from .output import WORD_TYPES, Output, widest_word, word_size
from .projection import Projection
from .soa import SoAStorage

__all__ = ["AoSStorage", "GroupStorage", "Output", "Projection", "SoAStorage", "STORAGES", "Storage",
           "WORD_TYPES", "check_layout", "file_name", "group_arrays", "group_dtype", "isolate_layout",
           "make_storage", "output_nbytes", "resolve_layout", "restrict_layout", "storage_nbytes",
           "widest_word", "word_size"]
