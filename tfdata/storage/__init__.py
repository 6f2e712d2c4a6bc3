"""Storages: where rows live. Three layouts behind one contract.

``AoSStorage`` (``layout="aos"``, :mod:`.aos`)
    One structured array, ``spec.aos_dtype``, one record per row.
``SoAStorage`` (``layout="soa"``, :mod:`.soa`)
    One C-contiguous array per field, shape ``(capacity, *field.shape)``.
``GroupStorage`` (``layout=[["obs", "action"], ["next_obs"], ...]``, column groups, :mod:`.groups`)
    One array per group of fields: a group of two or more fields is a record array (the
    fields at natural alignment, as :attr:`Spec.aos_dtype` lays out a row), a group of one
    field a plain column; the groups side by side, as SoA columns are.

A layout is ``"aos"``, ``"soa"`` or a grouping, normalised by :func:`resolve_layout` (against a
spec) to a tuple of tuples of field names; only this package and the kernels look inside it
(:mod:`.layout`: resolving, checking and planning layouts, :func:`make_storage`).

Every storage offers the same operations, the contract of :mod:`.base`: ``capacity``,
``nbytes``, ``write_row``, ``write_rows``, ``field`` (a view of one field), ``column`` (the same
values as ``(capacity, elements)``, what the column kernels read), ``gather`` (rows by index
into a given output), ``new_output`` (a preallocated :class:`Output`, :mod:`.output`, for a
batch size) and ``state_dict``/``load_state_dict``. A storage binds its kernel module
(``tfdata.kernels.aos`` or ``.soa``) when it is built; nothing downstream branches on the layout
again.

``project(names)`` gives a :class:`Projection` (:mod:`.projection`): the same sampling contract
(``kernels``, ``kernel_store``, ``new_output``, ``gather``) over some fields only. A layout
contributes where each field's bytes are (``byte_bases`` and ``spans``); the projection, which
knows no layout, gathers them with the span kernels (:mod:`tfdata.kernels.spans`) into one
C-contiguous column per field.

Storages do no validation of row contents and no locking: :class:`tfdata.ReplayBuffer` validates
with the :class:`~tfdata.spec.Spec` and serialises writers and samplers.

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
