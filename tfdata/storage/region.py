"""The shared-memory backing: where a region's words and rows lie, and a storage over them.

A region (see :mod:`tfdata.shared`) is one mapped file: control words, then optional uint64
stamps, then the rows of every slot in the storage's layout, page-aligned (AoS: one record
array; SoA: one 64-byte-aligned column per field).
"""

from __future__ import annotations

from ..spec import Spec
from . import make_storage
from .files import PAGE

ALIGN = 64


def _up(n: int, align: int) -> int:
    return -(-n // align) * align


def plan(spec: Spec, layout: str, ctrl_words: int, stamps: int, slots: int) -> dict:
    """Byte offsets of every section of a region and its total size.

    Returns ``{"ctrl": (offset, words), "stamps": (offset, count), "data": offset (AoS) or
    {field: offset} (SoA), "nbytes": int}``.
    """
    out = {"ctrl": (0, ctrl_words)}
    off = _up(8 * ctrl_words, ALIGN)
    out["stamps"] = (off, stamps)
    off = _up(off + 8 * stamps, PAGE)
    if layout == "aos":
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


def storage_over(mapped, lay: dict, spec: Spec, layout: str, slots: int):
    """The storage of ``slots`` rows over a mapped region laid out by :func:`plan`."""
    if layout == "aos":
        backing = mapped.at(lay["data"], spec.aos_dtype, (slots,))
    else:
        backing = {f.name: mapped.at(lay["data"][f.name], f.dtype, (slots,) + f.shape) for f in spec}
    return make_storage(spec, slots, layout, backing=backing)
