"""Layouts: ``"aos"``, ``"soa"`` or a grouping, normalised against a spec, and what a layout
costs and is called.

:func:`resolve_layout` normalises a layout given by a caller, :func:`check_layout` one read
from a file, :func:`restrict_layout` and :func:`isolate_layout` derive the layout of some
fields; :func:`make_storage` builds the storage of a layout, :func:`storage_nbytes` and
:func:`output_nbytes` plan its memory without building it.
"""

from __future__ import annotations

import numpy as np

from .._config import resolve_layout as _layout_name
from ..errors import SpecError
from ..spec import Spec
from .aos import AoSStorage
from .base import Storage
from .groups import GroupStorage, group_arrays, group_dtype
from .soa import SoAStorage


STORAGES = {"aos": AoSStorage, "soa": SoAStorage}


def resolve_layout(layout, spec: Spec):
    """The layout ``layout`` names for rows of ``spec``: ``"aos"``, ``"soa"`` or a grouping.

    ``None`` or a string goes through :func:`tfdata._config.resolve_layout` (the argument, else
    ``TFDATA_LAYOUT``, else the default; ValueError for another name). A list of groups, each a
    list of field names, is checked and normalised: every group's fields in spec order, the
    groups in the order given, and each field the grouping leaves out as a group of its own
    (after those, in spec order). The result is a tuple of tuples, which this function returns
    unchanged for the same spec (so ``layout=buffer.layout`` rebuilds the same storage).

    Raises
    ------
    ValueError
        Not ``"aos"``, ``"soa"``, None or a list; an empty list of groups; more groups than
        fields.
    SpecError
        A group that is not a list of str (a bare string included), an empty group, an
        unknown field (named), a field in two groups or twice in one (named).
    """
    if layout is None or isinstance(layout, str):
        return _layout_name(layout)
    return _groups(layout, spec)


def _groups(layout, spec: Spec, what: str = "layout") -> tuple:
    if not isinstance(layout, (list, tuple)):
        raise ValueError(f"{what}: expected 'aos', 'soa' or a list of groups (each a list of field "
                         f"names), got {type(layout).__name__} {str(layout)[:100]}")
    if not layout:
        raise ValueError(f"{what}: expected at least one group of fields, got an empty "
                         f"{type(layout).__name__} (layout='soa' stores every field alone)")
    if len(layout) > len(spec):  # bounded before anything is iterated: the list may come from a file
        raise ValueError(f"{what}: {len(layout)} groups for the {len(spec)} fields of the spec")
    seen = {}
    groups = []
    for k, group in enumerate(layout):
        if isinstance(group, (str, bytes)) or not isinstance(group, (list, tuple)):
            one = f"; for a group of one field write [{group!r}]" if isinstance(group, str) else ""
            raise SpecError(f"{what}: group {k}: expected a list of field names, got "
                            f"{type(group).__name__} {str(group)[:100]}{one}")
        if not group:
            raise SpecError(f"{what}: group {k} is empty; every group needs at least one field")
        if len(group) > len(spec):
            raise SpecError(f"{what}: group {k} names {len(group)} fields, the spec has {len(spec)}")
        for name in group:
            if not isinstance(name, str):
                raise SpecError(f"{what}: group {k}: field names must be str, got "
                                f"{type(name).__name__} {str(name)[:100]}")
            if name not in spec:
                raise SpecError(f"{what}: group {k}: {spec.unknown_message(name)}")
            if name in seen:
                where = "twice in group" if seen[name] == k else f"in group {seen[name]} and in group"
                raise SpecError(f"{what}: field {name!r} is {where} {k}; each field belongs to one group")
            seen[name] = k
        members = set(group)
        groups.append(tuple(n for n in spec.names if n in members))
    groups += [(n,) for n in spec.names if n not in seen]
    return tuple(groups)


def restrict_layout(layout, spec: Spec):
    """``layout`` for the fields of ``spec`` only (the stored fields of a buffer whose next
    fields are elided): a grouping loses the other fields, and the groups left empty."""
    if isinstance(layout, str):
        return layout
    return _keep(layout, lambda n: n in spec)


def isolate_layout(layout, spec: Spec, names):
    """``layout`` (resolved for ``spec``) with each field of ``names`` stored alone, as a column:
    the frames of a stacked field, which the stack kernels read and no row gather copies. SoA
    stores every field alone already; AoS becomes one record group of the other fields."""
    names = [n for n in spec.names if n in set(names)]
    if not names or (isinstance(layout, str) and layout == "soa"):
        return layout
    groups = [spec.names] if isinstance(layout, str) else layout
    return _keep(groups, lambda n: n not in names) + tuple((n,) for n in names)


def _keep(groups, keep) -> tuple:
    """``groups`` with only the fields ``keep(name)`` accepts, and without the groups left empty."""
    return tuple(g for g in (tuple(n for n in group if keep(n)) for group in groups) if g)


def check_layout(layout, spec: Spec, what: str = "layout"):
    """``layout`` as read from a file (JSON: a string or lists): ``"aos"``, ``"soa"`` or a
    grouping of every field of ``spec``, exactly as :func:`resolve_layout` normalises it (each
    field once, groups in spec order within, none left out). Returns the normalised layout;
    ValueError (or SpecError) naming the problem otherwise."""
    if isinstance(layout, str):
        if layout not in ("aos", "soa"):
            raise ValueError(f"{what}: expected 'aos', 'soa' or a list of groups, got {layout[:100]!r}")
        return layout
    groups = _groups(layout, spec, what)
    if [list(g) for g in groups] != [list(g) for g in layout]:
        raise ValueError(f"{what}: the grouping {str(layout)[:200]} is not in normal form (every "
                         f"field once, each group in spec order); normalised it reads "
                         f"{[list(g) for g in groups]}")
    return groups


def make_storage(spec: Spec, capacity: int, layout=None, backing=None,
                 allocator=None) -> Storage:
    """Build the storage for ``layout`` (argument, else ``TFDATA_LAYOUT``, else the default;
    a grouping: see :func:`resolve_layout`).

    ``backing``: arrays to use instead of fresh memory (records for AoS, a dict of columns for
    SoA, a sequence of one array per group for a grouping), of the exact dtypes and shapes the
    storage would allocate. ``allocator``: where fresh memory (rows and outputs) comes from
    (see :func:`tfdata.alloc.resolve`).
    """
    layout = resolve_layout(layout, spec)
    if isinstance(layout, tuple):
        return GroupStorage(spec, capacity, layout, backing, allocator)
    return STORAGES[layout](spec, capacity, backing, allocator)


def file_name(layout, stem: str) -> str:
    """The name of a dataset file of ``layout``: ``stem.npy`` (AoS) or the directory ``stem``
    (SoA, a grouping)."""
    return stem + (GroupStorage if isinstance(layout, tuple) else STORAGES[layout]).file_suffix


def storage_nbytes(spec: Spec, capacity: int, layout) -> int:
    """Bytes the storage of ``layout`` (resolved for ``spec``) holds for ``capacity`` rows of
    ``spec`` (without building it)."""
    if isinstance(layout, str):
        row = spec.aos_dtype.itemsize if layout == "aos" else spec.row_nbytes
    else:
        row = sum(dtype.itemsize * int(np.prod(shape, dtype=np.int64)) for dtype, shape in group_arrays(spec, layout))
    return int(capacity) * int(row)


def output_nbytes(spec: Spec, batch_size: int, layout, fields=None) -> int:
    """Bytes of one :meth:`new_output` of ``batch_size`` rows: rows plus int64 indices; with
    ``fields`` (stored fields, checked), of one output of their
    :class:`~tfdata.storage.projection.Projection` (columns, and for a grouping a record block
    per group of several fields held whole)."""
    if fields is not None:
        row = sum(spec[n].nbytes for n in fields)
        if isinstance(layout, tuple):
            wanted = set(fields)
            for g in layout:
                if len(g) > 1 and wanted.issuperset(g):
                    row += group_dtype(spec, g).itemsize - sum(spec[n].nbytes for n in g)
        return int(batch_size) * (8 + row)
    return storage_nbytes(spec, batch_size, layout) + 8 * int(batch_size)
