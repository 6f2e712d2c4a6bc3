"""Projection kernels: some fields of any layout, gathered into columns.

A projected sample (``sample(batch, fields=[...])``) copies only the named fields. Every layout
says where a field's bytes are: a *base*, a C-contiguous ``uint8[capacity, row_bytes]`` array
(the AoS record array, an SoA column, a group of fields), and a byte *offset* within its rows.
The store these kernels read is a tuple with one ``(base, offset)`` pair per field of the
projection, and the output a tuple of C-contiguous ``uint8[rows, field_bytes]`` columns, one per
field, whatever the layout. So one set of compiled kernels serves every layout: the signature
depends on the number of fields projected (one compile per count, as for SoA), not on where
their bytes are. The kernels are :mod:`._sample`'s, specialized to :func:`copy_spans`: the same
names, signatures and results (indices, RNG use, weights) as the layout modules', over fewer
bytes.

A field's row is copied by :func:`copy_span`, a :func:`._sample.span_copy` with the SoA column
widths (every width of 1 to 64 bytes and the multiples of 8 to 128 by a fixed-size copy;
anything else by ``memcpy``).
"""

from __future__ import annotations

from numba import njit

from .._config import INLINE_OPTIONS
from ._sample import span_copy, specialize

#: one field's bytes of one row, at a byte offset of the source row: the SoA column widths
copy_span = span_copy([*range(1, 65), *range(72, 129, 8)])


@njit(**INLINE_OPTIONS)
def copy_spans(src, idx, dst):
    """``dst[i, :] = base[idx[i], offset:offset + width]`` for every i, for one field.

    ``src`` is ``(base, offset)``: ``base`` a C-contiguous ``uint8[capacity, row_bytes]``,
    ``offset`` an int; ``dst`` a C-contiguous ``uint8[rows, width]``. A span that does not lie
    within the base's rows (``offset < 0`` or ``offset + width > row_bytes``) copies nothing:
    projections are checked when they are built, this is the last defence.
    """
    base, offset = src
    nbytes = dst.shape[1]
    if offset < 0 or offset + nbytes > base.shape[1]:
        return
    for i in range(idx.shape[0]):
        copy_span(dst, i, base, idx[i], offset, nbytes)


@njit(**INLINE_OPTIONS)
def span_rows(src):
    """Rows of one ``(base, offset)`` element of the store."""
    return src[0].shape[0]


@njit(**INLINE_OPTIONS)
def span_base(src):
    """The base array of one ``(base, offset)`` element of the store."""
    return src[0]


gather, sample_uniform, sample_prioritized, sample_shared, sample_pool, sample_exactly_k = specialize(
    "spans", one_field=False, copy=copy_spans, rows=span_rows, base=span_base)

__all__ = ["gather", "sample_uniform", "sample_prioritized", "sample_shared", "sample_pool",
           "sample_exactly_k"]
