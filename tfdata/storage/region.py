"""The shared-memory backing: where a region's words and rows lie, and a storage over them.

A region (see :mod:`tfdata.shared`) is one mapped file: control words, then optional uint64
stamps, then the rows of every slot in the storage's layout, page-aligned (AoS: one record
array; SoA: one 64-byte-aligned column per field; column groups: one 64-byte-aligned array per
group, records or a column).
"""

from __future__ import annotations

import math

import numpy as np

from ..spec import Spec
from .groups import group_arrays
from .layout import make_storage
from .npy import PAGE

ALIGN = 64


def _up(n: int, align: int) -> int:
    return -(-n // align) * align


def plan(spec: Spec, layout, ctrl_words: int, stamps: int, slots: int, slot_words: int = 0,
         extra=()) -> dict:
    """Byte offsets of every section of a region and its total size (``layout`` resolved for
    ``spec``: ``"aos"``, ``"soa"`` or a grouping).

    ``slot_words`` arrays of one uint64 word per slot follow the stamps (exactly-k replay:
    three, see :mod:`tfdata.shared`), each 64-byte aligned. ``extra``: more arrays, each
    ``(key, dtype, shape)``, after those (frame stacks: see :mod:`tfdata.shared.frames`),
    each 64-byte aligned.

    Returns ``{"ctrl": (offset, words), "stamps": (offset, count), "slot_words": [offset per
    array], "extra": {key: offset}, "data": offset (AoS), {field: offset} (SoA) or [offset per
    group] (a grouping), "nbytes": int}``.
    """
    out = {"ctrl": (0, ctrl_words)}
    off = _up(8 * ctrl_words, ALIGN)
    out["stamps"] = (off, stamps)
    off = _up(off + 8 * stamps, ALIGN)
    out["slot_words"] = []
    for _ in range(slot_words):
        out["slot_words"].append(off)
        off = _up(off + 8 * slots, ALIGN)
    out["extra"] = {}
    for key, dtype, shape in extra:
        out["extra"][key] = off
        off = _up(off + np.dtype(dtype).itemsize * math.prod(int(d) for d in shape), ALIGN)
    off = _up(off, PAGE)
    if isinstance(layout, tuple):
        blocks = []
        for dtype, shape in group_arrays(spec, layout):
            blocks.append(off)
            off = _up(off + slots * dtype.itemsize * math.prod(int(d) for d in shape), ALIGN)
        out["data"] = blocks
    elif layout == "aos":
        out["data"] = off
        off += slots * spec.aos_dtype.itemsize
    else:
        cols = {}
        for f in spec:
            cols[f.name] = off
            off = _up(off + slots * f.nbytes, ALIGN)
        out["data"] = cols
    out["nbytes"] = max(off, 8)
    return out


def storage_over(mapped, lay: dict, spec: Spec, layout, slots: int):
    """The storage of ``slots`` rows over a mapped region laid out by :func:`plan`."""
    if isinstance(layout, tuple):
        backing = [mapped.at(o, dtype, (slots,) + shape)
                   for o, (dtype, shape) in zip(lay["data"], group_arrays(spec, layout))]
    elif layout == "aos":
        backing = mapped.at(lay["data"], spec.aos_dtype, (slots,))
    else:
        backing = {f.name: mapped.at(lay["data"][f.name], f.dtype, (slots,) + f.shape) for f in spec}
    return make_storage(spec, slots, layout, backing=backing)


def map_extra(mapped, lay: dict, extra) -> dict:
    """``{key: ndarray}`` over a mapped region of the ``extra`` arrays :func:`plan` placed."""
    return {key: mapped.at(lay["extra"][key], np.dtype(dtype), tuple(shape)) for key, dtype, shape in extra}
